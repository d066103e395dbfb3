"""`clusterctl sandbox up|down|status`: a local cluster of emulated nodes (see clusterctl.cluster.sandbox)."""

from __future__ import annotations

import typer

from clusterctl.cluster import sandbox
from clusterctl.core.console import out, print_table

group = typer.Typer(
    help="A local sandbox cluster: network namespaces with their own sshd and Docker daemon (root).",
    no_args_is_help=True,
)

# CLUSTERCTL_SANDBOX_NAME / _SUBNET: a second sandbox beside the default one (a test
# running the docs' commands as written, a second user) without changing the commands.
_NAME = typer.Option(sandbox.DEFAULT_NAME, "--name", metavar="NAME", envvar="CLUSTERCTL_SANDBOX_NAME",
                     help="Sandbox name: 1-8 of a-z0-9, a letter first.")


@group.command("up")
def up(
    # no -n: elsewhere -n is the inventory file, here --nodes is a count
    nodes: int = typer.Option(..., "--nodes", metavar="N", help="Number of emulated nodes."),
    name: str = _NAME,
    subnet: str = typer.Option(sandbox.DEFAULT_SUBNET, "--subnet", metavar="CIDR",
                               envvar="CLUSTERCTL_SANDBOX_SUBNET",
                               help="Private IPv4 network; this machine is .1, nodes .11, .12, ..."),
    bandwidth: str = typer.Option(None, "--bandwidth", metavar="RATE",
                                  help="Shape each node's link and this machine's uplink with tc tbf, "
                                       "e.g. 200mbit (omitted: unshaped)."),
    slots: int = typer.Option(2, "--slots", metavar="N",
                              help="Processes per node, written to the inventory."),
    inventory: str = typer.Option(sandbox.DEFAULT_INVENTORY, "--inventory", metavar="PATH",
                                  help="Where to write the sandbox inventory."),
    slurm: bool = typer.Option(False, "--slurm",
                               help="Also run a Slurm cluster: munged and slurmctld here, a slurmd "
                                    "in each node (Debian packages slurm-wlm and munge)."),
    registry: bool = typer.Option(False, "--registry",
                                  help="Also run an image registry on this machine's sandbox address "
                                       "(.1), over TLS from a CA of the sandbox that every node's "
                                       "Docker engine and this machine's trust (Debian package "
                                       "docker-registry)."),
    registry_auth: bool = typer.Option(False, "--registry-auth",
                                       help="The registry asks for a login: user clusterctl, a random "
                                            "password kept in a 0600 file of the sandbox (implies "
                                            "--registry)."),
    registry_port: int = typer.Option(sandbox.REGISTRY_DEFAULT_PORT, "--registry-port", metavar="PORT",
                                      help="The registry's TCP port."),
    runtime: str = typer.Option("docker", "--runtime", metavar="RUNTIME",
                                help="The nodes' container runtime in the inventory: docker, or "
                                     "podman (each node its own storage: root's, or with --user that user's rootless one; Debian packages "
                                     "podman, runc and catatonit). Each node runs its own dockerd "
                                     "either way."),
    user: str = typer.Option(sandbox.SSH_USER, "--user", metavar="NAME",
                             help="The nodes' login user: root, or an account of this machine "
                                  "(with --runtime podman), whose own rootless Podman each node "
                                  "then runs (Debian packages uidmap and fuse-overlayfs; a "
                                  "range in /etc/subuid and /etc/subgid)."),
) -> None:
    """Create (or complete) a sandbox of N nodes and write its inventory (idempotent)."""
    sb = sandbox.up(nodes, name=name, subnet=subnet, bandwidth=bandwidth, slots=slots,
                    inventory_path=inventory, with_slurm=slurm, with_registry=registry,
                    registry_auth=registry_auth, registry_port=registry_port, runtime=runtime,
                    user=user)
    _print_status(sandbox.status(sb.name))
    out.print(f"inventory: {sb.inventory_path}")
    out.print(f"try: clusterctl check --nodes {sb.inventory_path}")
    if sb.slurm_conf:
        out.print(f"Slurm: partition {sandbox.SLURM_PARTITION} (the default), nodes "
                  f"{','.join(n.name for n in sb.nodes)}; for sinfo, srun, sbatch:")
        out.print(f"export SLURM_CONF={sb.slurm_conf}")
    if sb.registry:
        out.print(f"registry: {sb.registry} (TLS; its CA {sb.registry_ca} is trusted by every "
                  "node's Docker engine and this machine's)")
        out.print(f"try: docker tag IMAGE {sb.registry}/NAME:TAG && docker push {sb.registry}/NAME:TAG")
        login = sandbox.registry_login_command(sb)
        if login:
            out.print(f"log in first (user {sandbox.REGISTRY_USER}; the password stays in its file): "
                      f"{login}")


@group.command("down")
def down(name: str = _NAME) -> None:
    """Remove the sandbox: daemons, namespaces, links, firewall rule, state, images, inventory."""
    removed = sandbox.down(name)
    out.print(f'sandbox "{name}" removed' if removed else f'no sandbox named "{name}" was found')


@group.command("status")
def status(name: str = typer.Option(None, "--name", metavar="NAME",
                                     help="Only this sandbox (default: all).")) -> None:
    """List sandboxes and, per node, its netns, address, sshd, dockerd and image count; Slurm and
    the registry when the sandbox has them."""
    found = sandbox.status(name)
    if not found:
        out.print("no sandbox exists" if name is None else f'no sandbox named "{name}" exists')
        raise typer.Exit(1 if name else 0)
    _print_status(found)


def _yes(flag: bool) -> str:
    return "up" if flag else "down"


def _print_status(found: list[sandbox.SandboxStatus]) -> None:
    for st in found:
        title = (f"sandbox {st.name}: {st.subnet}" if st.subnet
                 else f"sandbox {st.name}: leftovers of a crash (run `clusterctl sandbox down --name {st.name}`)")
        rows = [(n.name, n.netns if n.netns_exists else f"{n.netns} (missing)", n.address,
                 _yes(n.sshd_up), _yes(n.dockerd_up), "-" if n.images is None else n.images)
                for n in st.nodes]
        if st.slurm_conf:
            rows = [(*row, n.slurm_state) for row, n in zip(rows, st.nodes, strict=True)]
            title += (f"; Slurm {'running' if st.slurm_running else 'NOT running'} "
                      f"(SLURM_CONF={st.slurm_conf})")
        if st.registry:
            title += (f"; registry {st.registry} {'running' if st.registry_running else 'NOT running'}"
                      f" (TLS{', login as ' + sandbox.REGISTRY_USER if st.registry_auth else ''})")
        print_table(title, ["node", "netns", "address", "sshd", "dockerd", "images",
                            *(["slurm"] if st.slurm_conf else [])], rows)


def register(app: typer.Typer) -> None:
    app.add_typer(group, name="sandbox")
