"""Host lists and folded output (clusterctl.core.hostlist, clusterctl.core.gather): tables of
input -> expected."""

from __future__ import annotations

import pytest

from clusterctl.core.errors import UserError
from clusterctl.core.gather import fold_outputs
from clusterctl.core.hostlist import expand, fold

FOLDS = [
    (["node1"], "node1"),
    (["node1", "node2", "node3", "node5"], "node[1-3,5]"),
    (["node5", "node3", "node1", "node2"], "node[1-3,5]"),            # sorted
    (["node1", "node1", "node2"], "node[1-2]"),                       # each once
    (["n01", "n02", "n10"], "n[01-02,10]"),                           # width kept
    (["rack1-n1", "rack1-n2", "rack2-n1"], "rack1-n[1-2],rack2-n1"),  # the last number folds
    (["a1-ib", "a2-ib"], "a[1-2]-ib"),                                # a suffix kept
    (["login", "node1", "node2"], "login,node[1-2]"),                 # no digits: as it is
    ([], ""),
]


@pytest.mark.parametrize("names, folded", FOLDS)
def test_fold(names, folded):
    assert fold(names) == folded


@pytest.mark.parametrize("names, folded", [f for f in FOLDS if f[0]])
def test_expand_is_fold_undone(names, folded):
    assert sorted(expand(folded)) == sorted(set(names))


@pytest.mark.parametrize("text", ["node[1-", "node[3-1]", "node[a-b]"])
def test_expand_names_a_text_that_is_no_host_list(text):
    with pytest.raises(UserError, match="is not a host list"):
        expand(text)


GROUPS = [
    # every node the same: one group
    ({"n1": ("exit 0", "a\n"), "n2": ("exit 0", "a\n"), "n3": ("exit 0", "a\n")},
     [("n[1-3]", "exit 0", "a\n")]),
    # the odd one out after the largest group, whatever the order given
    ({"n1": ("exit 0", "b\n"), "n2": ("exit 0", "a\n"), "n3": ("exit 0", "a\n")},
     [("n[2-3]", "exit 0", "a\n"), ("n1", "exit 0", "b\n")]),
    # same output, another status: two groups
    ({"n1": ("exit 0", "x"), "n2": ("exit 3", "x"), "n3": ("exit 0", "x")},
     [("n[1,3]", "exit 0", "x"), ("n2", "exit 3", "x")]),
    # groups of one: in the order of their node
    ({"n3": ("timeout", ""), "n1": ("exit 0", "a"), "n2": ("unreachable: no route", "")},
     [("n3", "timeout", ""), ("n1", "exit 0", "a"), ("n2", "unreachable: no route", "")]),
    ({}, []),
]


@pytest.mark.parametrize("results, groups", GROUPS)
def test_fold_outputs(results, groups):
    assert [(g.folded, g.status, g.output) for g in fold_outputs(results)] == groups
