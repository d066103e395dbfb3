"""Registry addresses and the references of images in them (pure), and the inventory's
``registry:`` key as a user writes it."""

from __future__ import annotations

import pytest

from clusterctl.cluster.inventory import load_inventory
from clusterctl.cluster.registry.reference import (
    Registry,
    digest_of,
    parse_registry,
    pinned,
    split_tag,
)
from clusterctl.core.errors import UserError

D1, D2 = "sha256:" + "a" * 64, "sha256:" + "b" * 64


@pytest.mark.parametrize("text, want, address", [
    ("registry.example", Registry("registry.example"), "registry.example"),
    ("10.213.50.1:5000", Registry("10.213.50.1", 5000), "10.213.50.1:5000"),
    ("Reg.Example:443/team/ml", Registry("reg.example", 443, "team/ml"), "reg.example:443"),
    ("localhost:5000/", Registry("localhost", 5000), "localhost:5000"),
])
def test_a_registry_is_host_port_and_namespace(text, want, address):
    got = parse_registry(text)
    assert got == want and got.address == address


@pytest.mark.parametrize("text, why", [
    ("https://reg.example", "has a scheme"),
    ("reg.example:70000", "port 70000 is out of range"),
    ("reg.example/Team", "is not a registry address"),
    ("reg.example//x", "is not a registry address"),
    ("reg example", "is not a registry address"),
    ("reg.example:5000/x:tag", "is not a registry address"),
    ("", "is empty"),
])
def test_what_is_not_a_registry_says_why(text, why):
    with pytest.raises(ValueError, match=why):
        parse_registry(text)


def test_an_image_goes_to_the_namespace_under_its_last_name_part():
    r = parse_registry("10.0.0.5:5000/team")
    assert r.repository("clusterctl/cpu:2.13.0") == "10.0.0.5:5000/team/cpu"
    assert r.tagged("clusterctl/cpu:2.13.0") == "10.0.0.5:5000/team/cpu:2.13.0"
    assert r.tagged("myimage") == "10.0.0.5:5000/team/myimage:latest"
    assert r.by_digest("clusterctl/cpu:2.13.0", D1) == f"10.0.0.5:5000/team/cpu@{D1}"
    assert parse_registry("reg.example").tagged("a/b/c:1") == "reg.example/c:1"
    with pytest.raises(ValueError):
        r.by_digest("x", "sha256:short")
    # a registry port's colon is no tag
    assert split_tag("host:5000/x") == ("host:5000/x", None)
    assert split_tag("host:5000/x:v1") == ("host:5000/x", "v1")


def test_pinned_picks_this_registrys_digest_among_an_images_repo_digests():
    r = parse_registry("10.0.0.5:5000/team")
    digests = [f"other.example/cpu@{D2}", f"10.0.0.5:5000/team/cpu@{D1}", f"10.0.0.5:5000/cpu@{D2}"]
    assert pinned(digests, r, "clusterctl/cpu:2.13.0") == f"10.0.0.5:5000/team/cpu@{D1}"
    assert pinned(digests[:1], r, "clusterctl/cpu:2.13.0") is None
    assert pinned([], r, "clusterctl/cpu") is None
    assert digest_of(f"10.0.0.5:5000/team/cpu@{D1}") == D1 and digest_of("cpu:1") is None


def test_the_inventory_takes_a_registry_and_names_the_line_of_a_bad_one(tmp_path):
    path = tmp_path / "inv.yaml"
    path.write_text("registry: 10.0.0.5:5000/team\nnodes:\n  - {name: a, host: 10.0.0.2}\n")
    assert load_inventory(path).registry == Registry("10.0.0.5", 5000, "team")
    path.write_text("nodes:\n  - {name: a, host: 10.0.0.2}\nregistry: http://10.0.0.5:5000\n")
    with pytest.raises(UserError) as e:
        load_inventory(path)
    assert "inv.yaml:3: registry: 'http://10.0.0.5:5000' has a scheme" in e.value.message
    assert "valid: a registry address, HOST[:PORT][/NAMESPACE]" in e.value.message
    path.write_text("registry: [a]\nnodes:\n  - {name: a, host: 10.0.0.2}\n")
    with pytest.raises(UserError, match=r"inv.yaml:1: registry: .* is not text"):
        load_inventory(path)
    path.write_text("nodes:\n  - {name: a, host: 10.0.0.2}\n")
    assert load_inventory(path).registry is None
