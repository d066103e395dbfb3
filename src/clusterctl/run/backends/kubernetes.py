"""The Kubernetes backend: renders only.  ``clusterctl export`` writes the job as a Kubeflow
PyTorchJob or TrainJob manifest (:mod:`clusterctl.run.export`, pure); the cluster's own
operator starts, follows and stops it, so every other operation is refused here."""

from __future__ import annotations

from clusterctl.run import export
from clusterctl.run.backends.base import RendersOnly
from clusterctl.run.jobs import Job


class KubernetesBackend(RendersOnly):
    name = "kubernetes"

    def render(self, job: Job, **settings) -> export.Manifest:
        """The job as a manifest (:func:`clusterctl.run.export.build_manifest`'s keywords)."""
        return export.build_manifest(job, **settings)

    def recovery(self, job: Job, kind: str = "pytorchjob", nnodes: int = 1,
                 runtime: str = export.DEFAULT_RUNTIME):
        """(restartPolicy, backoffLimit, notes): the job's recovery keys as the training
        operator takes them."""
        return export.recovery_settings(job, kind, nnodes, runtime)
