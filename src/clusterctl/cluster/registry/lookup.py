"""What this machine knows of an image in a registry, without contacting the registry.

- :func:`pinned_reference`: the ``HOST[:PORT]/[NS/]NAME@sha256:...`` of a local image that
  this machine's Docker engine pushed to a registry (the engine records it in the image's
  ``RepoDigests`` after a push), what ``export --registry`` and a Slurm launch name so a
  cluster runs exactly that image;
- :func:`has_credentials`: whether this machine's Docker config (``docker login``) holds
  credentials for a registry, so that a Kubernetes manifest names an ``imagePullSecrets``
  entry.  It reads which registries have credentials, never a credential.

The engine is the usual one (:func:`clusterctl.cluster.engine.client`: ``DOCKER_HOST``...);
the Docker config is ``$DOCKER_CONFIG/config.json``, else ``~/.docker/config.json``, as the
Docker CLI reads it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from clusterctl.cluster.registry.reference import DIGEST, Registry, pinned
from clusterctl.core.errors import UserError
from clusterctl.core.imageref import check_image
from clusterctl.core.text import shown

if TYPE_CHECKING:
    from docker import DockerClient


def push_command(image: str, registry: Registry) -> str:
    """The command that pushes ``image`` to ``registry`` (for messages)."""
    return f"clusterctl push {image} --registry {registry}"


def pinned_reference(image: str, registry: Registry, client: DockerClient | None = None) -> str:
    """``repository@sha256:...`` of ``image`` (a local ``REPO[:TAG]``) in ``registry``, from
    the engine's record of its push.  UserError (exit 2) naming the image, the registry and
    the push command when the engine holds no such image or never pushed it there; an
    unreachable engine is an EnvironmentProblem (exit 2) saying how to reach one.

    ``image`` may already be pinned there (``HOST[:PORT]/[NS/]NAME@sha256:...``): it is
    returned as it is, the engine is not asked.  Anything not an image reference
    (:func:`clusterctl.core.imageref.check_image`) is refused before the engine is asked."""
    check_image(image, "image")
    repo, at, digest = image.partition("@")
    if at:
        want = registry.repository(repo)
        if repo == want and DIGEST.match(digest):
            return image
        raise UserError(f"image {shown(image)} is pinned by digest but not in the registry {registry} "
                        f"(its repository there would be {want}); valid: a local image "
                        f"(REPO:TAG) pushed with `{push_command('REPO:TAG', registry)}`, or "
                        f"{want}@sha256:<digest>.")
    if client is None:
        from clusterctl.cluster import engine
        client = engine.client()
    from docker.errors import DockerException, ImageNotFound

    try:
        attrs = client.images.get(image).attrs
    except ImageNotFound:
        raise UserError(f"image {shown(image)} is not in this machine's Docker engine, so it cannot "
                        f"have been pushed to the registry {registry}; valid: build or pull it, "
                        f"then `{push_command(image, registry)}`. Nothing was written.") from None
    except DockerException as e:
        raise UserError(f"the Docker engine could not say what image {shown(image)} is "
                        f"({e.__class__.__name__}: {shown(str(e), 200)}); nothing was written.") from None
    ref = pinned(attrs.get("RepoDigests") or [], registry, image)
    if ref is None:
        raise UserError(f"image {shown(image)} has not been pushed to the registry {registry} (this "
                        f"machine's Docker engine records no digest of it in "
                        f"{registry.repository(image)}); push it first: "
                        f"`{push_command(image, registry)}`. Nothing was written.")
    return ref


def docker_config_path(env: Mapping[str, str] | None = None) -> Path:
    """Where the Docker CLI keeps ``docker login``'s record: ``$DOCKER_CONFIG/config.json``,
    else ``~/.docker/config.json``."""
    env = os.environ if env is None else env
    base = env.get("DOCKER_CONFIG")
    return Path(base) / "config.json" if base else Path.home() / ".docker" / "config.json"


def _server(key: str) -> str:
    """An ``auths`` / ``credHelpers`` key as ``HOST[:PORT]`` (the CLI also writes
    ``https://HOST/v1/`` and such)."""
    key = key.strip().lower()
    key = key.split("://", 1)[1] if "://" in key else key
    return key.split("/", 1)[0]


def has_credentials(registry: Registry, env: Mapping[str, str] | None = None) -> bool:
    """Whether this machine's Docker config has credentials for ``registry``: an ``auths``
    entry for its address (``docker login`` writes one, empty when a credential store keeps
    the secret) or a ``credHelpers`` entry for it.  Nothing of a credential is read out.
    A config that is not JSON is a UserError naming the file; no file: False."""
    path = docker_config_path(env)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return False
    except OSError as e:
        raise UserError(f"{path}: cannot be read ({e.strerror}); valid: a readable Docker config "
                        "(`docker login` writes it), or set DOCKER_CONFIG to its directory.") from None
    try:
        config = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError as e:
        raise UserError(f"{path}: line {e.lineno}: not JSON ({e.msg}); valid: the Docker config "
                        "`docker login` writes.") from None
    if not isinstance(config, dict):
        raise UserError(f"{path}: not a JSON object; valid: the Docker config `docker login` writes.")
    want = registry.address.lower()
    for section in ("auths", "credHelpers"):
        entries = config.get(section)
        if isinstance(entries, dict) and any(_server(k) == want for k in entries):
            return True
    return False


__all__ = ["docker_config_path", "has_credentials", "pinned_reference", "push_command"]
