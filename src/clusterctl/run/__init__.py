"""The job side: job specs, the launch plan, launch, supervision, logs and run records.

Data flows jobs -> plan -> launch -> supervise -> logs / records:

* ``jobs``: a job YAML (or a shipped job) -> :class:`Job`, checked;
* ``plan``: pure; job + inventory + node facts -> one ``NodePlan`` per node
  (``check_inputs`` before any node is contacted, ``make_plan`` once per launch);
* ``launch``: the whole ``clusterctl launch`` without the CLI (facts, preflight,
  push, start all or nothing, follow), returns a ``RunResult``;
* ``supervise``: follows a run's containers, fail-fast, teardown, ``stop_run``; the
  hang timeout's silence and every line's collective errors (``suspicious``, pure);
* ``watchdog``: a hung run's stacks, dumped with py-spy in every container, saved and
  compared (``stacks``, pure: which ranks are not with the majority);
* ``logs``: one merged, prefixed stream of every node's output, live or from runs/;
* ``records``: ``runs/<run-id>/run.json`` and what it implies about the nodes.
* ``export``: pure; a job as a Kubeflow PyTorchJob / TrainJob manifest (no cluster).

run/ imports core/, cluster/ (transport, preflight, distribute, containers,
sshconfig) and image/targets; nothing below cli/ imports run/.
"""
