"""The same job on Slurm: an sbatch script from the job spec, one container per node.

* ``options``: pure; ``--partition --nnodes --time --container`` checked into
  :class:`~clusterctl.run.slurm.options.SlurmOptions` (bad input: UserError, exit 2);
* ``script``: pure; job + options (+ inventory) -> the sbatch script text
  (:func:`~clusterctl.run.slurm.script.render_script`), with the environment contract
  taken from Slurm's own variables at run time and secrets passed by name only.

Contract::

    check_options(partition=, nnodes=, time=, container=, inventory=) -> SlurmOptions
    render_script(job, options, *, run_id, run_dir, image=, overrides=, host_env=) -> SlurmScript

Layering: run/slurm imports core/, cluster/inventory and run/plan, run/jobs; only cli/
imports it.
"""
