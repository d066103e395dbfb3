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
) -> None:
    """Create (or complete) a sandbox of N nodes and write its inventory (idempotent)."""
    sb = sandbox.up(nodes, name=name, subnet=subnet, bandwidth=bandwidth, slots=slots,
                    inventory_path=inventory, with_slurm=slurm)
    _print_status(sandbox.status(sb.name))
    out.print(f"inventory: {sb.inventory_path}")
    out.print(f"try: clusterctl check --nodes {sb.inventory_path}")
    if sb.slurm_conf:
        out.print(f"Slurm: partition {sandbox.SLURM_PARTITION} (the default), nodes "
                  f"{','.join(n.name for n in sb.nodes)}; for sinfo, srun, sbatch:")
        out.print(f"export SLURM_CONF={sb.slurm_conf}")


@group.command("down")
def down(name: str = _NAME) -> None:
    """Remove the sandbox: daemons, namespaces, links, firewall rule, state, images, inventory."""
    removed = sandbox.down(name)
    out.print(f'sandbox "{name}" removed' if removed else f'no sandbox named "{name}" was found')


@group.command("status")
def status(name: str = typer.Option(None, "--name", metavar="NAME",
                                     help="Only this sandbox (default: all).")) -> None:
    """List sandboxes and, per node, its netns, address, sshd, dockerd and image count."""
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
        print_table(title, ["node", "netns", "address", "sshd", "dockerd", "images",
                            *(["slurm"] if st.slurm_conf else [])], rows)


def register(app: typer.Typer) -> None:
    app.add_typer(group, name="sandbox")
