"""This machine's engine pushes an image to a registry and reads back its digest.

``push(image, registry)`` tags the local image as ``registry.tagged(image)``, pushes it
(the engine reads the credentials for that registry from the usual Docker config: ``docker
login``; the SDK sends them in the ``X-Registry-Auth`` header, never on a command line),
takes the manifest digest the registry reported, asks the registry for that tag again and
refuses a different answer.  Every failure is a :class:`~clusterctl.core.errors.UserError`
naming the registry and saying what would fix it (exit 2); a tag this push added to the
local engine is removed again when the push fails, so nothing half-pushed stays tagged.

:func:`classify` (pure) turns the engine's error text into that message.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from clusterctl.cluster.registry.reference import DIGEST, Registry, split_tag
from clusterctl.core.errors import UserError

if TYPE_CHECKING:
    from docker import DockerClient


@dataclass(frozen=True)
class Pushed:
    """An image in a registry."""

    image: str        # the local image as given
    image_id: str     # its local ID (sha256 of its config: the same on every engine that pulls it)
    tagged: str       # HOST[:PORT]/[NS/]NAME:TAG
    reference: str    # HOST[:PORT]/[NS/]NAME@sha256:... (what nodes pull, exports name)
    digest: str       # sha256:... of the manifest
    seconds: float


def classify(registry: str, text: str, *, where: str = "this machine's Docker engine") -> str:
    """What a registry failure means and what fixes it, from the engine's error ``text``.
    ``where``: who met it ("this machine's Docker engine", "node2").  Pure."""
    low = text.lower()
    detail = " ".join(text.split())[:300]
    if "x509" in low or "certificate" in low:
        return (f"the registry {registry}'s TLS certificate is not trusted by {where} ({detail}); "
                f"valid: a certificate signed by a CA the engine trusts, e.g. the CA in "
                f"/etc/docker/certs.d/{registry}/ca.crt on every machine that pushes or pulls")
    if "http response to https client" in low:
        return (f"the registry {registry} answers plain HTTP, but {where} requires TLS (Docker "
                f"uses TLS for any registry outside 127.0.0.0/8 unless it is listed in the "
                f"engine's insecure-registries); valid: a registry serving HTTPS")
    if any(w in low for w in ("unauthorized", "authentication required", "denied", "no basic auth")):
        return (f"the registry {registry} refused {where}'s credentials ({detail}); valid: log in "
                f"first with `docker login {registry}` (clusterctl uses the credentials of "
                f"that Docker config and never asks for them)")
    if any(w in low for w in ("connection refused", "no route to host", "i/o timeout",
                              "no such host", "network is unreachable", "timeout",
                              "server misbehaving", "connection reset")):
        return (f"cannot reach the registry {registry} from {where} ({detail}); valid: a "
                f"registry address that machine can connect to")
    return f"the registry {registry} failed for {where}: {detail}"


def _client():
    from clusterctl.cluster import engine
    return engine.client()


def push(image: str, registry: Registry, *, client: DockerClient | None = None) -> Pushed:
    """Push the local ``image`` to ``registry``; :class:`Pushed` (see the module docstring)."""
    from docker.errors import APIError, ImageNotFound

    client = client or _client()
    t0 = time.monotonic()
    try:
        local = client.images.get(image)
    except ImageNotFound:
        raise UserError(f"image {image!r} is not in this machine's Docker engine; valid: a local "
                        "image (`docker images`), e.g. one `clusterctl build` made.") from None
    tagged = registry.tagged(image)
    repo, tag = split_tag(tagged)
    added = tagged not in (local.tags or [])
    if added:
        local.tag(repo, tag)
    try:
        digest = _push_stream(client, repo, tag, str(registry))
        served = _served_digest(client, tagged, str(registry))
        if served != digest:
            raise UserError(f"the registry {registry} serves {served} for {tagged} right after this "
                            f"machine pushed {digest} (someone pushed the same tag at once?); "
                            "nothing was launched: push again.")
    except APIError as e:
        _untag(client, tagged, added)
        raise UserError(classify(str(registry), str(e.explanation or e))) from None
    except BaseException:
        _untag(client, tagged, added)
        raise
    return Pushed(image, local.id, tagged, registry.by_digest(image, digest), digest,
                  time.monotonic() - t0)


def _push_stream(client: DockerClient, repo: str, tag: str, registry: str) -> str:
    """The manifest digest the engine reports at the end of the push; UserError on its error."""
    digest = None
    for line in client.api.push(repo, tag=tag, stream=True, decode=True):
        if line.get("error") or line.get("errorDetail"):
            text = line.get("error") or line["errorDetail"].get("message", "")
            raise UserError(classify(registry, text))
        aux = line.get("aux") or {}
        if DIGEST.match(str(aux.get("Digest", ""))):
            digest = aux["Digest"]
    if digest is None:
        raise UserError(f"the registry {registry}: the push of {repo}:{tag} ended without a digest; "
                        "nothing was launched.")
    return digest


def _served_digest(client: DockerClient, tagged: str, registry: str) -> str:
    """The digest the registry serves for ``tagged`` now (the engine asks it)."""
    from docker.errors import APIError
    try:
        return client.api.inspect_distribution(tagged)["Descriptor"]["digest"]
    except APIError as e:
        raise UserError(classify(registry, str(e.explanation or e))) from None


def _untag(client: DockerClient, tagged: str, added: bool) -> None:
    if not added:
        return
    try:
        client.images.remove(tagged, noprune=True)
    except Exception:  # noqa: BLE001 - best effort: the push's own error is what matters
        pass


def credentials(registry: Registry) -> dict | None:
    """This machine's Docker config credentials for ``registry`` as a node's config.json
    needs them (``{"auths": {ADDRESS: {...}}}``), or None when it has none.  They only
    ever travel on a node command's stdin (:mod:`clusterctl.cluster.registry.pull`)."""
    import base64

    from docker import auth
    try:
        found = auth.load_config().resolve_authconfig(registry.address)
    except Exception:  # noqa: BLE001 - a broken credential helper: the pull says what it meets
        return None
    if not found:
        return None
    entry: dict[str, str] = {}
    lower = {k.lower(): v for k, v in found.items()}
    if lower.get("identitytoken"):
        entry["identitytoken"] = lower["identitytoken"]
    if lower.get("username") and lower.get("password") is not None:
        entry["auth"] = base64.b64encode(f"{lower['username']}:{lower['password']}".encode()).decode()
    return {"auths": {registry.address: entry}} if entry else None
