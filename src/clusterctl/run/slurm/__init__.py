"""The same job on Slurm: an sbatch script from the job spec, one container per node.

* ``options``: pure; ``--partition --nnodes --time --container`` checked into
  :class:`~clusterctl.run.slurm.options.SlurmOptions` (bad input: UserError, exit 2);
* ``script``: pure; job + options (+ inventory) -> the sbatch script text
  (:func:`~clusterctl.run.slurm.script.render_script`), with the environment contract
  taken from Slurm's own variables at run time and secrets passed by name only;
* ``submit``: touches machines; push (docker mode, an inventory), ``sbatch --parsable``,
  follow the job's labelled output into ``node[rank]| text`` and runs/<id>/, exit code
  from the tasks' own records (first failure by time), ``scancel`` on Ctrl-C/SIGTERM.

Contract::

    check_options(partition=, nnodes=, time=, container=, inventory=) -> SlurmOptions
    render_script(job, options, *, run_id, run_dir, image=, overrides=, host_env=) -> SlurmScript
    submit(job, options, *, inventory=, image=, overrides=, run_id=, ...) -> SlurmResult

Layering: run/slurm imports core/, cluster/ (inventory, transport, containers) and run/
(plan, jobs, records, logs, supervise, launch); only cli/ imports it.
"""
