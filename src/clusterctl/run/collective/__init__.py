"""The collective health check: is every node's link fast enough for training?

``model`` (pure): the pairwise rounds, nccl-tests' bus-bandwidth formula, parsing the
probe's output, the verdict.  ``check``: runs the probe in the job's image on every
node (the launch plan's rank environment, one container per node) and returns the
measurements and the verdict.  ``incontainer/probe.py`` is the script that runs inside
the containers; clusterctl never imports it.
"""
