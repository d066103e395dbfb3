"""Podman nodes, fast tier: the inventory's ``runtime:`` key (per node, in ``defaults``,
refused with file, line and the valid names), and the same operations asked of docker and
of Podman: every row of test_runtime's docker table gives Podman's argv, the same as
docker's with ``podman`` first except where Podman answers differently (named below, each
with the reason); the node scripts and the launch/follow/stop/pull/preflight commands carry
the node's runtime.  The sandbox tests run them on real Podman nodes
(tests/cluster/test_podman_sandbox.py)."""

from __future__ import annotations

import re
import textwrap

import pytest

from clusterctl.cluster import containers, preflight
from clusterctl.cluster.inventory import InventoryError, load_inventory
from clusterctl.cluster.registry import pull
from clusterctl.cluster.runtime import PodmanRuntime, node_runtime, runtime_for
from clusterctl.run import launch, treefollow
from tests.cluster.test_runtime import DOCKER_ARGV, IMAGE_ID, INFO

PODMAN = runtime_for("podman")

# operation, args -> Podman's argv where it is not docker's with `podman` first
DIFFERENT = {
    # Podman prints an image's Id as bare hex: the format asks for docker's sha256: form
    ("image_inspect", "{{.Id}}"): lambda images: ["podman", "image", "inspect", "--format",
                                                  "sha256:{{.Id}}", *images],
    # `podman stats {{json .}}` has its own keys: the format gives docker's
    ("stats",): lambda c: ["podman", "stats", "--no-stream", "--no-trunc", "--format",
                           '{"ID":"{{.ID}}","Name":"{{.Name}}","CPUPerc":"{{.CPUPerc}}",'
                           '"MemUsage":"{{.MemUsage}}"}', *c],
    # no daemon: `podman info` answers only where Podman can open its storage
    ("version",): lambda: ["podman", "info", "--format", "{{.Version.Version}}"],
}


def _podman_expected(operation, args, kwargs, docker_argv):
    if operation == "image_inspect" and kwargs["format"] == "{{.Id}}":
        return DIFFERENT[("image_inspect", "{{.Id}}")](*args)
    if (operation,) in DIFFERENT:
        return DIFFERENT[(operation,)](*args)
    if operation == "info":
        fmt = args[0].replace(".DockerRootDir", ".Store.GraphRoot").replace(
            "{{.InitBinary}}", "/usr/libexec/podman/catatonit")
        return ["podman", "info", "--format", fmt]
    return ["podman", *docker_argv[1:]]


@pytest.mark.parametrize("operation,args,kwargs,docker_argv", DOCKER_ARGV,
                         ids=[f"{i}-{row[0]}" for i, row in enumerate(DOCKER_ARGV)])
def test_podman_runs_the_same_operation_as_docker(operation, args, kwargs, docker_argv):
    assert docker_argv[0] == "docker"
    got = getattr(PODMAN, operation)(*args, **kwargs)
    assert got == _podman_expected(operation, args, kwargs, docker_argv)


def test_podman_info_asks_for_the_graph_root_and_the_init_binary():
    assert PODMAN.info(INFO) == ["podman", "info", "--format",
                                 "{{println .Store.GraphRoot}}/usr/libexec/podman/catatonit"]


def test_a_missing_image_in_either_runtimes_words():
    podman_says = f"Error: inspecting object: {IMAGE_ID}: image not known"
    docker_says = f"Error: No such image: {IMAGE_ID}"
    assert PODMAN.is_missing_image(podman_says) and PODMAN.is_missing_image(docker_says)
    assert runtime_for("docker").is_missing_image(docker_says)
    assert not runtime_for("docker").is_missing_image(podman_says)
    assert not PODMAN.is_missing_image("Error: permission denied")


def test_podman_takes_gpus_by_cdi_names_and_docker_by_flag():
    assert PODMAN.gpu_options(["--gpus", "2"], "nvidia.com/gpu") == [
        "--device=nvidia.com/gpu=0", "--device=nvidia.com/gpu=1"]
    assert runtime_for("docker").gpu_options(["--gpus", "2"], "nvidia.com/gpu") == ["--gpus", "2"]


# --------------------------------------------------------------------------- the node scripts


@pytest.mark.parametrize("name", ["docker", "podman"])
def test_every_node_command_calls_the_nodes_runtime(name):
    rt = runtime_for(name)
    scripts = [
        containers._stop_argv("r1", "tok", 3, rt)[2],
        containers.StopChannel("c1").argv_for(rt)[2],
        rt.script(containers._INSPECT_REMOVE),
        pull.pull_argv("reg:5000/x:1", True, rt)[2],
        *(c.argv[2] for c in treefollow.follow_commands("n1", "c1", remove=True, runtime=rt)),
        preflight._engine_script(rt),
    ]
    for text in scripts[:-1]:
        assert text.startswith(f"RT={name}\n")
        assert _calls(text) == set(), text   # every call is "$RT" ...
    assert f"sec version {name} " in scripts[-1] and _calls(scripts[-1]) == {name}
    # the start script calls the run argv's own first word (the node's runtime) to inspect
    assert '"$1" inspect' in launch._START_SCRIPT and "docker" not in launch._START_SCRIPT


def _calls(text: str) -> set[str]:
    """The runtimes a script calls by name (comments left out)."""
    code = "\n".join(ln for ln in text.splitlines() if not ln.lstrip().startswith("#"))
    return set(re.findall(r"(?:^|[\s;|&(){}])(docker|podman) (?:ps|inspect|logs|wait|rm|stop|load|"
                          r"tag|pull|image|info|version)\b", code))


def test_a_script_without_the_heads_prefix_defaults_to_docker():
    from clusterctl.core.scripts import script_text
    for name in ("containers-stop-run.sh", "node-plan.sh", "relay-node.sh", "pull-image.sh"):
        text = script_text("clusterctl.cluster", name)
        assert ': "${RT:=docker}"' in text and _calls(text) == set(), name


# --------------------------------------------------------------------------- the inventory


def _inventory(tmp_path, text):
    p = tmp_path / "inv.yaml"
    p.write_text(textwrap.dedent(text))
    return p


def test_runtime_per_node_and_in_defaults(tmp_path):
    inv = load_inventory(_inventory(tmp_path, """\
        defaults:
          runtime: podman
        nodes:
          - {name: a, host: 10.0.0.1}
          - {name: b, host: 10.0.0.2, runtime: docker}
          - {name: c, host: 10.0.0.3}
        """))
    assert [(n.name, n.runtime) for n in inv.nodes] == [("a", "podman"), ("b", "docker"), ("c", "podman")]
    assert [type(node_runtime(n)).__name__ for n in inv.nodes] == [
        "PodmanRuntime", "DockerRuntime", "PodmanRuntime"]
    plain = load_inventory(_inventory(tmp_path, "nodes: [{name: a, host: 10.0.0.1}]\n"))
    assert plain.nodes[0].runtime is None and node_runtime(plain.nodes[0]).name == "docker"
    assert isinstance(node_runtime(inv.nodes[0]), PodmanRuntime)


@pytest.mark.parametrize("value,line,shown", [
    ("podmn", 4, '"podmn" is not a known container runtime (did you mean "podman"?)'),
    ("3", 4, "3 is not a container runtime's name")])
def test_an_unknown_runtime_is_refused_naming_file_line_and_the_valid_ones(tmp_path, value, line, shown):
    path = _inventory(tmp_path, f"""\
        nodes:
          - name: a
            host: 10.0.0.1
            runtime: {value}
        """)
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    msg = info.value.message
    assert info.value.exit_code == 2
    assert f"{path}:{line}" in msg and "nodes[0].runtime" in msg, msg
    assert shown in msg and "valid: docker or podman" in msg, msg


@pytest.mark.parametrize("options,podman_gets", [
    (["--ipc=host", "--shm-size=1g", "--init"], ["--ipc=host", "--init"]),
    (["--ipc", "host", "--shm-size", "8g"], ["--ipc", "host"]),
    (["--shm-size=1g"], ["--shm-size=1g"]),                 # no host IPC: Podman takes it
])
def test_podman_leaves_out_shm_size_beside_host_ipc_which_docker_ignores(options, podman_gets):
    assert runtime_for("docker").run("img", ["x"], options=options) == ["docker", "run", *options, "img", "x"]
    assert PODMAN.run("img", ["x"], options=options) == ["podman", "run", *podman_gets, "img", "x"]


# --------------------------------------------------------------------------- the sandbox's Podman


def test_each_podman_sandbox_node_has_its_own_storage_named_by_its_sshd():
    from clusterctl.cluster.sandbox import model, processes, sshd
    from clusterctl.cluster.sandbox.inventory_file import inventory_text

    sb = model.Sandbox(name="pq", subnet="10.9.9.0/24", node_count=2, runtime="podman")
    confs = [processes.podman_confs(n) for n in sb.nodes]
    for node, (conf, storage) in zip(sb.nodes, confs, strict=True):
        assert f'graphroot = "{node.podman_root}"' in storage
        assert f'runroot = "{node.dir / "podman-run"}"' in storage
        assert f'tmp_dir = "{node.dir / "podman-tmp"}"' in conf and 'runtime = "runc"' in conf
        assert f"CONTAINERS_CONF={node.podman_conf}" in sshd._sshd_config(sb, node)
        assert f"CONTAINERS_STORAGE_CONF={node.podman_storage_conf}" in sshd._sshd_config(sb, node)
    assert confs[0][1] != confs[1][1] and confs[0][0] != confs[1][0]   # nothing shared
    assert yaml_defaults(inventory_text(sb))["runtime"] == "podman"
    docker_sb = model.Sandbox(name="pq", subnet="10.9.9.0/24", node_count=2)
    assert "CONTAINERS_CONF" not in sshd._sshd_config(docker_sb, docker_sb.nodes[0])
    assert "runtime" not in yaml_defaults(inventory_text(docker_sb))


def yaml_defaults(text: str) -> dict:
    import yaml
    return yaml.safe_load(text)["defaults"]


def test_a_rootless_sandbox_gives_its_login_user_a_podman_and_a_home_of_each_nodes_own():
    """``sandbox up --user NAME``: NAME's sshd environment (a Match block, which replaces
    root's SetEnv for that user) names the node's rootless confs and a runtime dir of the
    node's own; the storage is NAME's (rootless_storage_path, fuse-overlayfs); root keeps its
    own environment without Podman's; the inventory logs in as NAME."""
    from clusterctl.cluster.sandbox import model, processes, sshd
    from clusterctl.cluster.sandbox.inventory_file import inventory_text

    sb = model.Sandbox(name="pq", subnet="10.9.9.0/24", node_count=2, runtime="podman", user="alice")
    for node in sb.nodes:
        conf, storage = processes.podman_confs(node, rootless=True)
        assert f'rootless_storage_path = "{node.podman_root}"' in storage
        assert f'mount_program = "{processes.FUSE_OVERLAYFS}"' in storage
        assert f'runroot = "{node.user_dir / "podman-run"}"' in storage
        assert f'tmp_dir = "{node.user_dir / "podman-tmp"}"' in conf
        config = sshd._sshd_config(sb, node)
        root_part, alice_part = config.split("Match User alice\n")
        assert "CONTAINERS_CONF" not in root_part and f"HOME={node.home}" in root_part
        assert f"CONTAINERS_CONF={node.podman_conf}" in alice_part
        assert f"XDG_RUNTIME_DIR={node.user_dir / 'run'}" in alice_part
        assert f"HOME={node.user_dir / 'home'}" in alice_part
    assert "rootless_storage_path" not in processes.podman_confs(sb.nodes[0])[1]   # rootful: none
    import yaml
    inv = yaml.safe_load(inventory_text(sb))
    assert inv["defaults"]["user"] == "alice" and {n["user"] for n in inv["nodes"]} == {"alice"}
    assert all(n["code_dir"].startswith(str(sb.dir)) and "/user/" in n["code_dir"] for n in inv["nodes"])


@pytest.mark.parametrize(("argv", "says"), [
    (["--user", "no-such-account-here", "--runtime", "podman"], "no such account on this machine"),
    (["--user", "nobody"], "needs --runtime podman"),
    (["--user", "nobody", "--runtime", "podman", "--slurm"], "--slurm runs its tasks as root"),
])
def test_sandbox_up_refuses_a_login_user_it_cannot_use(argv, says, tmp_path):
    """Refused before anything starts, exit 2, naming the option and what would do."""
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "clusterctl", "sandbox", "up", "--nodes", "1", "--name", "zzrl",
                        "--inventory", str(tmp_path / "i.yaml"), *argv],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and says in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "i.yaml").exists()


def test_a_locked_account_and_missing_subordinate_ids_are_found(tmp_path):
    import pwd

    from clusterctl.cluster.sandbox import lifecycle
    shadow = tmp_path / "shadow"
    shadow.write_text("root:*:1:0:99999:7:::\nalice:!:1:0:99999:7:::\nbob:*:1:0:99999:7:::\n")
    assert lifecycle._locked_account("alice", shadow) and not lifecycle._locked_account("bob", shadow)
    assert not lifecycle._locked_account("carol", tmp_path / "missing")
    sub = tmp_path / "subuid"
    sub.write_text("alice:100000:65536\n1002:200000:65536\n")
    fake = lambda name, uid: pwd.struct_passwd((name, "x", uid, uid, "", "/", "/bin/sh"))  # noqa: E731
    assert lifecycle._has_subordinate_ids(sub, fake("alice", 1001))
    assert lifecycle._has_subordinate_ids(sub, fake("dave", 1002))     # by uid
    assert not lifecycle._has_subordinate_ids(sub, fake("bob", 1003))


def test_ensure_fuse_gives_dev_fuse_udevs_mode_and_names_a_missing_one(tmp_path):
    """A machine whose /dev was not made by udev may have /dev/fuse 0600 (seen on a CI
    machine: every rootless container start failed 'fuse: failed to open /dev/fuse')."""
    from clusterctl.cluster.sandbox.lifecycle import ensure_fuse
    from clusterctl.core.errors import EnvironmentProblem

    dev = tmp_path / "fuse"
    dev.write_text("")
    dev.chmod(0o600)
    assert ensure_fuse(dev) == f"{dev} was mode 0600; made 0666, as udev makes it"
    assert dev.stat().st_mode & 0o777 == 0o666
    assert ensure_fuse(dev) is None
    with pytest.raises(EnvironmentProblem, match=r"none is missing: rootless Podman.s fuse-overlayfs needs .*\(modprobe fuse"):
        ensure_fuse(tmp_path / "none")
