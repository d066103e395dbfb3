"""A run's own code: the user's project directory made ready on this machine, before any node.

``launch --workdir DIR`` (job key ``workdir``) runs the user's project on every node without a
Dockerfile.  This module does the head's half, touching no node:

1. :func:`prepare` takes the snapshot (:mod:`clusterctl.code.snapshot`: what ships, refused
   with exit 2 when it cannot), saves it into the head's code store
   (:mod:`clusterctl.code.store`) and reads the git commit and whether the tree is dirty;
2. when the job has requirements, builds (or finds cached) the image with their layer over
   the job's image (:mod:`clusterctl.image.deps`): a package that cannot be installed fails
   here, before any node is touched;
3. :func:`rerun` gives the same for a recorded run, from the store: exactly the code it ran;
4. :func:`code_image`: for the engines that pull images instead of receiving trees (Slurm
   with ``--scheduler slurm``, Kubernetes through ``export``), the tree as a thin layer at
   ``/workspace`` over the run's image (:mod:`clusterctl.image.codeimage`).

The nodes' half (:func:`clusterctl.code.sync.sync`) and the mount (:class:`clusterctl.run.plan.
CodeMount`) are the launch's.  :func:`code_record` is what run.json keeps.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from clusterctl.code import gitinfo, snapshot, store
from clusterctl.code.ignore import LeftOut
from clusterctl.run import records
from clusterctl.run.jobs import CODE_MOUNT, Job


@dataclass(frozen=True)
class Workspace:
    """A run's code, ready to ship: the stored tree, where it came from, and the image it runs
    on when the project has requirements (None: the job's own image)."""

    tree: store.StoredTree
    workdir: Path | None
    git: gitinfo.GitState
    requirements: Path | None = None
    requirements_digest: str | None = None
    image: str | None = None
    left_out: tuple[LeftOut, ...] = ()   # credential-like files the snapshot did not take


def prepare(job: Job, base_image: str, *, limit_bytes: int | None = None,
            log: Callable[[str], None] | None = None) -> Workspace:
    """Snapshot ``job.workdir``, store it, and build its requirements layer over
    ``base_image`` (the job's image); UserError (exit 2) for anything that cannot ship."""
    limit = limit_bytes or job.max_workdir_size or snapshot.DEFAULT_LIMIT_BYTES
    snap = snapshot.take(job.workdir, limit_bytes=limit)
    tree = store.save(snap)
    git = gitinfo.git_state(job.workdir)
    image = req_digest = None
    if job.requirements is not None:
        from clusterctl.cluster import engine  # the engine: only for a project with requirements
        from clusterctl.image import deps
        built = deps.requirements_image(base_image, job.requirements, client=engine.client(), log=log)
        image, req_digest = built.ref, built.requirements_digest
    return Workspace(tree, job.workdir, git, job.requirements, req_digest, image, snap.left_out)


def rerun(code: records.CodeRecord) -> Workspace:
    """The recorded run's code from this machine's store, and the image it ran on."""
    tree = store.load(code.digest)   # the image, when any, is looked up by the launch (exit 2 when gone)
    git = gitinfo.GitState(code.git_commit, code.git_dirty, None)
    return Workspace(tree, Path(code.workdir) if code.workdir else None, git,
                     Path(code.requirements) if code.requirements else None,
                     code.requirements_digest, code.image)


def describe(ws: Workspace) -> str:
    """``412 files, 1.3 MiB, sha256:3f2a9c1d04be (git 1c2d3e4, dirty)`` for a launch's output."""
    what = (f"{ws.tree.file_count} files, {snapshot.show_size(ws.tree.total_bytes)}, "
            f"sha256:{ws.tree.short}")
    if ws.git.commit:
        what += f" (git {ws.git.commit[:7]}{', dirty' if ws.git.dirty else ''})"
    if ws.image:
        what += f"; requirements layer {ws.image}"
    if n := len(ws.left_out):
        what += (f"; {n} credential-like file{'s' if n != 1 else ''} left out (--dry-run names "
                 f"{'them' if n != 1 else 'it'})")
    return what


def code_record(ws: Workspace, sent: Mapping[str, int] | None = None) -> records.CodeRecord:
    """What run.json keeps of the run's code."""
    return records.CodeRecord(
        digest=ws.tree.digest, files=ws.tree.file_count, bytes=ws.tree.total_bytes,
        workdir=str(ws.workdir or ""), git_commit=ws.git.commit, git_dirty=ws.git.dirty,
        requirements=str(ws.requirements) if ws.requirements else None,
        requirements_digest=ws.requirements_digest, image=ws.image, sent=dict(sent or {}))


def code_image(ws: Workspace, base_image: str, *, log: Callable[[str], None] | None = None) -> str:
    """The image holding the workspace's tree at /workspace over ``base_image`` (its
    requirements layer when it has one): ``clusterctl-code/<base>:<digest 12>``, built on
    this machine's engine only when it has no such image yet."""
    from clusterctl.cluster import engine
    from clusterctl.image import codeimage
    with tempfile.NamedTemporaryFile(prefix="clusterctl-tree-", suffix=".tar") as tar:
        snapshot.write_tar(tar, ws.tree)
        tar.flush()
        return codeimage.code_image(ws.image or base_image, tar.name, ws.tree.digest,
                                    workdir=CODE_MOUNT, client=engine.client(), log=log)
