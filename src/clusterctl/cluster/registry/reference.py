"""Registry references: where an image lives so that a cluster can pull it (pure).

A registry is written ``HOST[:PORT][/NAMESPACE]`` (``registry.example:5000/team``), as
``push --registry`` and the inventory's ``registry:`` take it.  An image pushed there is
``HOST[:PORT]/[NAMESPACE/]NAME:TAG``, with NAME the local repository's last path part
(``clusterctl/cpu:2.13.0`` -> ``registry.example:5000/team/cpu:2.13.0``), and a machine
that must run exactly that image names it by digest: ``...NAME@sha256:<64 hex>``, which
:func:`pinned` finds among an image's ``RepoDigests`` (what a Docker engine records when
it pushes or pulls by a registry's reference).

Nothing here touches a machine; :mod:`clusterctl.cluster.registry.push` and ``pull`` do.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from clusterctl.core.errors import UserError
from clusterctl.core.text import shown

#: ``HOST[:PORT][/NAMESPACE]``: a DNS name or IPv4 address, a port, lower-case path parts
#: (the distribution spec's path component grammar).
_HOST = r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*"
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REGISTRY = re.compile(rf"^(?P<host>{_HOST})(?::(?P<port>\d{{1,5}}))?"
                       rf"(?P<ns>(?:/{_COMPONENT})*)\Z")
DIGEST = re.compile(r"^sha256:[0-9a-f]{64}\Z")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}\Z")
REGISTRY_HELP = "HOST[:PORT][/NAMESPACE], e.g. registry.example:5000 or 10.0.0.5:5000/team"


@dataclass(frozen=True)
class Registry:
    """A registry and the namespace images go to in it."""

    host: str
    port: int | None = None
    namespace: str = ""  # "" or "a/b", no slashes at either end

    @property
    def address(self) -> str:
        """``HOST[:PORT]``: what ``docker login`` and ``certs.d`` name."""
        return f"{self.host}:{self.port}" if self.port else self.host

    def __str__(self) -> str:
        return self.address + (f"/{self.namespace}" if self.namespace else "")

    def repository(self, image: str) -> str:
        """Where ``image`` (a local ``REPO[:TAG]``) goes here, without its tag:
        ``HOST[:PORT]/[NAMESPACE/]NAME``, NAME the repository's last part."""
        name = split_tag(image)[0].rsplit("/", 1)[-1]
        return "/".join(p for p in (self.address, self.namespace, name) if p)

    def tagged(self, image: str) -> str:
        """``repository(image):TAG`` (TAG: the image's, else ``latest``)."""
        return f"{self.repository(image)}:{split_tag(image)[1] or 'latest'}"

    def by_digest(self, image: str, digest: str) -> str:
        """``repository(image)@DIGEST``: what a node pulls and an export names."""
        if not DIGEST.match(digest):
            raise ValueError(f"{shown(digest)} is not a sha256 digest")
        return f"{self.repository(image)}@{digest}"


def parse_registry(text: str) -> Registry:
    """``HOST[:PORT][/NAMESPACE]`` -> :class:`Registry`; ValueError saying what is wrong
    (a scheme, a tag, a port out of range, upper-case or empty path parts...).  Pure."""
    if not isinstance(text, str) or not text:
        raise ValueError("is empty")
    if "://" in text:
        raise ValueError(f"{shown(text)} has a scheme: write the address alone (TLS is always used "
                         "unless the host is 127.0.0.0/8)")
    m = _REGISTRY.match(text.rstrip("/"))
    if m is None:
        raise ValueError(f"{shown(text)} is not a registry address"
                         + (" (credentials never go in it: `docker login HOST` keeps them)"
                            if "@" in text else ""))
    port = int(m.group("port")) if m.group("port") else None
    if port is not None and not 1 <= port <= 65535:
        raise ValueError(f"{shown(text)}: port {port} is out of range (1-65535)")
    return Registry(m.group("host").lower(), port, m.group("ns").strip("/"))


def registry_option(text: str | None, option: str = "--registry") -> Registry | None:
    """A command line's registry option (None: not given); UserError naming the option and
    what is valid when it is not a registry address.  Pure."""
    if text is None:
        return None
    try:
        return parse_registry(text)
    except ValueError as e:
        raise UserError(f"{option}: {e}; valid: {REGISTRY_HELP}.") from None


def split_tag(image: str) -> tuple[str, str | None]:
    """``REPO[:TAG]`` -> (REPO, TAG or None); a port's colon (``host:5000/x``) is no tag.  Pure."""
    repo, _, tag = image.rpartition(":")
    if repo and "/" not in tag and _TAG.match(tag):
        return repo, tag
    return image, None


def pinned(repo_digests: list[str] | tuple[str, ...], registry: Registry, image: str) -> str | None:
    """The reference ``repository@sha256:...`` of ``image`` in ``registry`` among an image's
    ``RepoDigests`` (the engine's record of what it pushed or pulled), or None: not pushed
    there.  Pure."""
    want = registry.repository(image)
    for ref in repo_digests:
        repo, sep, digest = ref.partition("@")
        if sep and repo == want and DIGEST.match(digest):
            return ref
    return None


def digest_of(reference: str) -> str | None:
    """The ``sha256:...`` of a ``repo@sha256:...`` reference (None: not by digest).  Pure."""
    _, sep, digest = reference.partition("@")
    return digest if sep and DIGEST.match(digest) else None
