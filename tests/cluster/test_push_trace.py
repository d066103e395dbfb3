"""The push benchmark's reading of a relay push's trace (pure: a recorded trace in, one line out)."""

from __future__ import annotations

from benchmarks.push import where_time_went

#: an 8-node cold relay push's trace, cut to the marks that bound its phases (recorded on the
#: sandbox with CLUSTERCTL_PUSH_TRACE; nodes 2-7 left out)
TRACE = """\
# push clusterctl-bench/push:files strategy=relay compress=False
   0.096 node1 plan-start
   1.097 node8 plan-end
   0.346 node1 plan-end
   1.108 head compression decided: False
   2.057 head all-started
   3.637 head all-ready
   3.637 node1 head-send-start
  26.584 node1 head-send-end
  26.996 node1 last-byte
  29.570 node8 last-byte
  29.572 node7 hop1-end rc=0
  30.044 node8 confirmed rc=0
  30.049 head relay-end
"""


def test_each_phase_is_the_time_from_the_last_node_of_the_one_before():
    assert where_time_went(TRACE) == ("where: plan 1.10  start 0.96  hops up 1.58  "
                                      "head sends 22.95  to chain end 2.99  load+results 0.48")


def test_a_star_push_or_one_cut_short_gives_no_line():
    star = "# push x strategy=star compress=False\n   0.1 node1 plan-start\n   0.5 node1 plan-end\n"
    assert where_time_went(star) == ""
    assert where_time_went(TRACE.split("  26.584")[0]) == ""
