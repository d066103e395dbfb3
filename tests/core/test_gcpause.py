"""core.gcpause: the cyclic collector is paused inside the block and its state comes back,
also when the block raises and when the caller had disabled it; load_inventory uses it."""

import gc

import pytest

from clusterctl.cluster.inventory import load_inventory
from clusterctl.core.errors import UserError
from clusterctl.core.gcpause import paused_gc


@pytest.fixture(autouse=True)
def _restore_gc():
    was = gc.isenabled()
    yield
    (gc.enable if was else gc.disable)()


def test_paused_inside_and_enabled_after():
    gc.enable()
    with paused_gc():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_enabled_again_when_the_block_raises():
    gc.enable()
    with pytest.raises(ValueError), paused_gc():
        raise ValueError("bad input")
    assert gc.isenabled()


def test_a_caller_that_disabled_it_keeps_it_disabled():
    gc.disable()
    with paused_gc():
        pass
    assert not gc.isenabled()


def test_load_inventory_pauses_it_and_restores_it_on_good_and_bad_input(tmp_path, monkeypatch):
    from clusterctl.cluster.inventory import yaml as inventory_yaml
    seen = []
    real = inventory_yaml.read_yaml
    monkeypatch.setattr("clusterctl.cluster.inventory.read_yaml",
                        lambda path, text: (seen.append(gc.isenabled()), real(path, text))[1])
    gc.enable()
    good = tmp_path / "inv.yaml"
    good.write_text("nodes:\n  - {name: a, host: 10.0.0.1}\n  - {name: b, host: 10.0.0.2}\n")
    assert [n.name for n in load_inventory(good)] == ["a", "b"]
    bad = tmp_path / "bad.yaml"
    bad.write_text("nodes:\n  - {name: a, host: 10.0.0.1}\n  - {name: a, host: 10.0.0.1}\n")
    with pytest.raises(UserError, match="bad.yaml:3"):
        load_inventory(bad)
    assert seen == [False, False]
    assert gc.isenabled()
