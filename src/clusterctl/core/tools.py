"""The programs this machine must have: a missing one is an EnvironmentProblem naming its package.

Used by every layer that runs a host tool (debootstrap for the base image,
dockerd for an engine, ip/tc/sshd for the sandbox), so it lives in core/.
"""

from __future__ import annotations

import shutil

from clusterctl.core.errors import EnvironmentProblem


def require_binaries(*names: str, packages: str) -> None:
    """EnvironmentProblem (exit 2) naming the missing programs and the Debian packages with them."""
    missing = [n for n in names if shutil.which(n) is None]
    if missing:
        raise EnvironmentProblem(
            f"{', '.join(missing)} not found on this machine; install the Debian packages "
            f"{packages} (apt-get install -y {packages})."
        )
