"""Shared pytest set-up.

Fixtures that stand up real parts live in tests/fixtures/, one module per part:
engine.py (the local Docker engine, the debootstrapped base image), images.py
(the `cpu` target image), sshd.py (a real sshd on loopback), sandbox.py (a
3-node sandbox cluster of network namespaces), slurm.py (another 3-node sandbox
running a real Slurm cluster). They are session-scoped and
clean up after themselves, also on failure. workdir.py gives a test its own
working directory (in_tmp). tiers.py marks a test docker or sandbox from the fixtures
it uses, and gives `pytest --fast` (make test-fast: the tier without either). prefetch.py
builds the base, cpu and ipex images in the background from the session's start, and runs
the modules that need no engine first, meanwhile. parallel.py keeps pytest-xdist's
workers apart (`make test-fast` runs two): a sandbox name each, modules as units of work.
"""

import pytest

pytest.register_assert_rewrite("tests.fixtures.parallel")   # a plugin below, imported first here
from tests.fixtures import parallel  # noqa: E402

parallel.isolate_worker()   # before the fixtures read the sandbox names (pytest-xdist's workers)

pytest_plugins = [
    "tests.fixtures.parallel",
    "tests.fixtures.prefetch",   # first: engine.py and images.py import it
    "tests.fixtures.engine",
    "tests.fixtures.images",
    "tests.fixtures.registry",
    "tests.fixtures.sshd",
    "tests.fixtures.sandbox",
    "tests.fixtures.slurm",
    "tests.fixtures.workdir",
    "tests.fixtures.two_uids",
    "tests.fixtures.tiers",
]
