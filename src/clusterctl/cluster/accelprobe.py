"""The accelerator probe of preflight: what a GPU or MLU node's own tools say, judged here.

The node runs one script (``scripts/accel-probe.sh``, a section of preflight's node
script, so no extra SSH channel): the raw output of ``nvidia-smi -q -x``, ``nvidia-smi
--query-compute-apps``, the kernel log's Xid lines, the NVIDIA Container Toolkit's
commands, ``nvidia-ctk cdi list``, the CDI specs under /etc/cdi and /var/run/cdi,
``dcgmi health -c`` (where installed), the /dev/cambricon_* files and ``cnmon info``.  A
node with none of these tools prints nothing and gets no finding.  Everything below the
script is pure: a parser per tool and :func:`judge`, which turns the parsed output into
problems (the node cannot run the job: no toolkit for a CUDA target, a driver older than
the image's CUDA needs, uncorrectable ECC errors, a pending page retirement or row remap,
a hardware Xid, DCGM's Failure) and warnings (GPUs busy with other processes, a program's
Xid, DCGM's Warning, retired pages).  What the vendors' codes and versions mean is data in
the accelerator table (``core/data/accelerators.yaml``: ``min_driver``,
``compat_driver``, ``hardware_errors``, ``cdi_kind``).

Contract:
    SCRIPT                                 the probe's text (``sh -c SCRIPT sh TOKEN``)
    parse_parts(token, text)               {part: (exit status, output)}
    parse_smi_xml(text) -> SmiReport       driver, CUDA, and per GPU ECC/retirement/remap/processes
    parse_compute_apps(text)               [ComputeApp] from ``--query-compute-apps`` CSV
    parse_cdi_list(text)                   CDI device names (``nvidia.com/gpu=0``)
    parse_cdi_specs(text)                  [CdiSpec] from the concatenated spec files
    parse_xids(text)                       [Xid] from kernel log lines
    parse_dcgmi_health(text)               DcgmHealth from ``dcgmi health -c``'s table
    parse_cnmon_info(text)                 [MluCard] from ``cnmon info``
    judge(parts, *, runtime, toolkit_version, wants) -> Findings
    processes_findings(accelerator, processes, *, wants, source) -> Findings
                                           a node's ranks against its GPUs/MLUs
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

from clusterctl.core import accelerators
from clusterctl.core.accelerators import version_key
from clusterctl.core.scripts import script_text
from clusterctl.core.text import digits

SCRIPT = script_text("clusterctl.cluster", "accel-probe.sh")

#: the runtimes that take GPUs by CDI names only (no --gpus): a node's runtime by name
CDI_RUNTIMES = frozenset({"podman"})

_MAX_XML = 8 * 1024 * 1024


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    name: str
    bus_id: str
    ecc_uncorrected: int | None = None     # volatile (since the driver loaded)
    retired_pages: int | None = None       # double-bit retirements
    retirement_pending: bool = False
    remap_pending: bool = False
    remap_failure: bool = False
    processes: tuple[tuple[int, str], ...] = ()   # (pid, name)


@dataclass(frozen=True)
class SmiReport:
    driver: str | None
    cuda: str | None
    gpus: tuple[Gpu, ...]


@dataclass(frozen=True)
class ComputeApp:
    gpu_uuid: str
    pid: int
    name: str
    memory: str


@dataclass(frozen=True)
class CdiSpec:
    path: str
    kind: str | None
    devices: tuple[str, ...]
    libraries: tuple[str, ...]      # driver library versions the spec mounts (libcuda.so.X)


@dataclass(frozen=True)
class Xid:
    bus: str
    code: int
    text: str


@dataclass(frozen=True)
class DcgmHealth:
    overall: str | None
    gpus: dict[int, tuple[str, tuple[str, ...]]]   # gpu id -> (status, messages)


@dataclass(frozen=True)
class MluCard:
    index: int
    product: str | None
    driver: str | None
    uncorrected: int | None


@dataclass
class Findings:
    kind: str | None = None          # cuda, mlu or None (no accelerator tool on the node)
    count: int = 0                   # GPUs / MLUs the tool reports
    facts: dict = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------- parsers

def parse_parts(token: str, text: str) -> dict[str, tuple[int, str]]:
    """The probe's parts: ``TOKEN part NAME`` ... ``TOKEN rc NAME STATUS`` -> {NAME: (STATUS, text)}."""
    t = re.escape(token)
    pattern = re.compile(rf"^{t} part (\w+)\n(.*?)\n{t} rc \1 (-?\d+)(?=\n|\Z)", re.S | re.M)
    return {m.group(1): (int(m.group(3)), m.group(2).strip("\n")) for m in pattern.finditer(text)}


def _int(text: str | None) -> int | None:
    text = (text or "").strip()
    return int(text) if digits(text) else None


def _sum(values) -> int | None:
    found = [v for v in values if v is not None]
    return sum(found) if found else None


def parse_smi_xml(text: str) -> SmiReport:
    """``nvidia-smi -q -x``: both ECC layouts (sram/dram since driver 510, single_bit/double_bit
    before).  ValueError when it is not such a document."""
    if len(text) > _MAX_XML or "<!ENTITY" in text:
        raise ValueError("not nvidia-smi's XML (too large or declares entities)")
    body = re.sub(r"<!DOCTYPE[^>]*>", "", text, count=1)
    try:
        root = ET.fromstring(body.strip())
    except ET.ParseError as e:
        raise ValueError(f"not XML ({e})") from None
    if root.tag != "nvidia_smi_log":
        raise ValueError(f"root element {root.tag!r}, not nvidia_smi_log")
    gpus = []
    for i, g in enumerate(root.findall("gpu")):
        vol = g.find("ecc_errors/volatile")
        unc = None
        if vol is not None:
            unc = _sum(_int(vol.findtext(k)) for k in ("sram_uncorrectable", "dram_uncorrectable"))
            if unc is None:
                unc = _int(vol.findtext("double_bit/total"))
        pending = (g.findtext("retired_pages/pending_retirement") or "").strip() == "Yes" \
            or (g.findtext("retired_pages/pending_blacklist") or "").strip() == "Yes"
        procs = tuple((_int(p.findtext("pid")) or 0, (p.findtext("process_name") or "?").strip())
                      for p in g.findall("processes/process_info"))
        minor = _int(g.findtext("minor_number"))
        gpus.append(Gpu(
            index=minor if minor is not None else i,
            uuid=(g.findtext("uuid") or "").strip(), name=(g.findtext("product_name") or "").strip(),
            bus_id=g.get("id", ""), ecc_uncorrected=unc,
            retired_pages=_int(g.findtext("retired_pages/double_bit_retirement/retired_count")),
            retirement_pending=pending,
            remap_pending=(g.findtext("remapped_rows/remapped_row_pending") or "").strip() == "Yes",
            remap_failure=(g.findtext("remapped_rows/remapped_row_failure") or "").strip() == "Yes",
            processes=procs))
    return SmiReport(driver=(root.findtext("driver_version") or "").strip() or None,
                     cuda=(root.findtext("cuda_version") or "").strip() or None, gpus=tuple(gpus))


def parse_compute_apps(text: str) -> list[ComputeApp]:
    """``--query-compute-apps=gpu_uuid,pid,process_name,used_memory --format=csv,noheader``."""
    apps = []
    for line in text.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) >= 4 and fields[0].startswith("GPU-") and digits(fields[1]):
            apps.append(ComputeApp(fields[0], int(fields[1]), ",".join(fields[2:-1]), fields[-1]))
    return apps


_CDI_NAME = re.compile(r"[a-z0-9][a-z0-9.-]*\.[a-z]+/[a-z0-9_.-]+=[A-Za-z0-9_.:-]+")


def parse_cdi_list(text: str) -> list[str]:
    """``nvidia-ctk cdi list``: the device names it found (its log lines skipped)."""
    return [line.strip() for line in text.splitlines() if _CDI_NAME.fullmatch(line.strip())]


def parse_cdi_specs(text: str) -> list[CdiSpec]:
    """The probe's ``== PATH`` + file text blocks: each spec's kind, device names and the
    driver library versions it mounts.  Read by pattern, never loaded (anyone may have
    written those files)."""
    specs = []
    for block in re.split(r"^== ", text, flags=re.M)[1:]:
        path, _, body = block.partition("\n")
        kind = re.search(r'^\s*"?kind"?\s*:\s*"?([^"\s,]+)', body, re.M)
        names = re.findall(r'^\s*-?\s*"?name"?\s*:\s*"?([^"\s,]+)"?', body, re.M)
        libs = re.findall(r"libcuda\.so\.(\d+(?:\.\d+)+)", body)
        specs.append(CdiSpec(path.strip(), kind.group(1) if kind else None, tuple(names),
                             tuple(dict.fromkeys(libs))))
    return specs


_XID = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9A-Fa-f:.]+)\): (\d+),\s*(.*)")


def parse_xids(text: str) -> list[Xid]:
    """Kernel log lines ``NVRM: Xid (PCI:0000:07:00): 79, pid=..., name=..., message``."""
    return [Xid(m.group(1), int(m.group(2)), m.group(3).strip())
            for m in map(_XID.search, text.splitlines()) if m]


def parse_dcgmi_health(text: str) -> DcgmHealth:
    """``dcgmi health -c``'s table: overall health, then per GPU its status and messages
    (a message's continuation rows joined)."""
    overall = None
    gpus: dict[int, tuple[str, list[str]]] = {}
    current = None
    for line in text.splitlines():
        if not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2:
            continue
        left, right = cells[0], cells[1]
        m = re.match(r"Overall Health:\s*(\w+)", right)
        if m:
            overall = m.group(1)
            continue
        g = re.match(r"GPU ID:\s*(\d+)", left)
        if g:
            current = int(g.group(1))
            gpus[current] = (right, [])
            continue
        if current is not None and not left and right:
            messages = gpus[current][1]
            if re.match(r"[A-Za-z][\w /-]*:\s*(Warning|Failure|Pass)\b", right) or not messages:
                messages.append(right)
            else:
                messages[-1] += " " + right
    return DcgmHealth(overall, {k: (s, tuple(ms)) for k, (s, ms) in gpus.items()})


def parse_cnmon_info(text: str) -> list[MluCard]:
    """``cnmon info``: per ``Card N`` its product, driver and uncorrected ECC errors."""
    cards = []
    index, values = None, {}

    def close():
        if index is not None:
            cards.append(MluCard(index, values.get("product name"), values.get("driver"),
                                 _int(values.get("uncorrected error") or values.get("uncorrect error"))))

    for line in text.splitlines():
        m = re.match(r"\s*Card\s*(?:No\.)?\s*(\d+)\s*\Z", line)
        if m:
            close()
            index, values = int(m.group(1)), {}
            continue
        key, sep, value = line.partition(":")
        if sep and index is not None:
            values.setdefault(key.strip().lower(), value.strip())
    close()
    return cards


# --------------------------------------------------------------------------- judging

def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def _driver_findings(found: Findings, device: accelerators.Device, driver: str | None,
                     toolkit_version: str | None) -> None:
    if not (driver and toolkit_version):
        return
    full, compat = device.driver_needed(toolkit_version)
    have = version_key(driver)
    tk = device.toolkit or "the toolkit"
    if full and have >= version_key(full):
        return
    if compat and have < version_key(compat) or (not compat and full):
        need = full or compat
        found.problems.append(
            f"driver {driver} is older than {tk} {toolkit_version} (the image's) needs: {need}"
            + (f" ({compat} with minor version compatibility)" if compat and full and compat != full else "")
            + "; upgrade the node's driver or use an image built for an older " + tk)
    elif full:
        found.warnings.append(
            f"driver {driver} runs {tk} {toolkit_version} only by minor version compatibility "
            f"(full support from {full}): code that needs PTX JIT may fail")


def _cuda(parts: dict[str, tuple[int, str]], device: accelerators.Device, *, runtime: str,
          toolkit_version: str | None, wants: bool) -> Findings:
    found = Findings(kind="cuda")
    rc, xml = parts["smi_xml"]
    if rc != 0:
        found.problems.append(f"nvidia-smi exited {rc}: {_last_line(xml)} (is the NVIDIA driver loaded?)")
        return found
    try:
        report = parse_smi_xml(xml)
    except ValueError as e:
        found.problems.append(f"nvidia-smi -q -x: cannot read its output: {e}")
        return found
    found.count = len(report.gpus)
    found.facts = {"driver": report.driver, "cuda": report.cuda, "gpus": found.count,
                   "models": sorted({g.name for g in report.gpus})}
    if not report.gpus:
        found.problems.append("nvidia-smi lists no GPU")
    _driver_findings(found, device, report.driver, toolkit_version)

    # the container toolkit: --gpus needs its hook; a CDI runtime needs a spec
    tools = [line.rsplit("/", 1)[-1] for line in parts.get("toolkit", (0, ""))[1].splitlines() if line]
    hook = any(t in tools for t in ("nvidia-container-runtime-hook", "nvidia-container-toolkit"))
    listed: list[str] = []
    if "cdi_list" in parts:
        rc, text = parts["cdi_list"]
        if rc != 0:
            found.problems.append(f"`nvidia-ctk cdi list` exited {rc}: {_last_line(text)} (a CDI spec "
                                  "is broken: regenerate it with `nvidia-ctk cdi generate --output="
                                  "/etc/cdi/nvidia.yaml`)")
        listed = parse_cdi_list(text)
    specs = [s for s in parse_cdi_specs(parts.get("cdi_specs", (0, ""))[1])
             if s.kind == device.cdi_kind]
    if not listed:
        listed = [f"{s.kind}={n}" for s in specs for n in s.devices]
    kind = device.cdi_kind or ""
    cdi_names = {n.split("=", 1)[1] for n in listed if n.startswith(kind + "=")}
    found.facts["cdi"] = sorted(cdi_names)
    found.facts["toolkit"] = sorted(set(tools))
    level = found.problems if wants else found.warnings
    if runtime in CDI_RUNTIMES:
        if not cdi_names:
            level.append(f"no CDI spec names {kind} devices: {runtime} gives GPUs to containers only by "
                         f"CDI name (--device={kind}=all); run `nvidia-ctk cdi generate --output="
                         "/etc/cdi/nvidia.yaml` (NVIDIA Container Toolkit)")
    elif not hook and not cdi_names:
        level.append("no NVIDIA Container Toolkit (nvidia-container-runtime-hook not on the PATH) and "
                     f"no CDI spec: `{runtime} run --gpus` fails with 'could not select device driver'; "
                     f"install nvidia-container-toolkit, then `nvidia-ctk runtime configure "
                     f"--runtime={runtime}` and restart the daemon")
    if cdi_names:
        missing = [g for g in report.gpus if g.uuid and g.uuid not in cdi_names and str(g.index) not in cdi_names]
        stale = sorted(n for n in cdi_names if n.startswith("GPU-") and n not in {g.uuid for g in report.gpus})
        if missing or stale:
            level.append("the CDI spec is stale: " + "; ".join(
                ([f"it lacks GPU {', '.join(str(g.index) for g in missing)}"] if missing else [])
                + ([f"it names {', '.join(stale)}, which nvidia-smi does not list"] if stale else []))
                + " (regenerate: `nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml`)")
    for spec in specs:
        old = [v for v in spec.libraries if report.driver and v != report.driver]
        if old:
            level.append(f"the CDI spec {spec.path} mounts driver {', '.join(old)} libraries but the "
                         f"driver is {report.driver} (generated before a driver upgrade: containers "
                         "fail to start); regenerate it with `nvidia-ctk cdi generate --output="
                         f"{spec.path}`")

    # health the driver reports
    for g in report.gpus:
        who = f"GPU {g.index} ({g.bus_id})"
        if g.ecc_uncorrected:
            found.problems.append(f"{who}: {g.ecc_uncorrected} uncorrectable ECC error"
                                  f"{'s' if g.ecc_uncorrected > 1 else ''} since the driver loaded "
                                  "(drain the node; reset the GPU or replace it)")
        if g.retirement_pending:
            found.problems.append(f"{who}: a retired memory page is pending: reset the GPU (or reboot) "
                                  "before running on it")
        if g.remap_failure:
            found.problems.append(f"{who}: row remapping failed: the GPU needs replacing")
        elif g.remap_pending:
            found.problems.append(f"{who}: a row remap is pending: reset the GPU (or reboot) before "
                                  "running on it")
        if g.retired_pages:
            found.warnings.append(f"{who}: {g.retired_pages} memory page{'s' if g.retired_pages > 1 else ''} "
                                  "retired after double-bit errors")
    by_uuid = {g.uuid: g for g in report.gpus}
    apps = parse_compute_apps(parts.get("smi_apps", (0, ""))[1])
    busy: dict[int, list[str]] = {}
    for a in apps:
        g = by_uuid.get(a.gpu_uuid)
        busy.setdefault(g.index if g else -1, []).append(f"{a.name} (pid {a.pid}, {a.memory})")
    for g in report.gpus:       # the XML's own process list, where the CSV had none
        if g.index not in busy and g.processes:
            busy[g.index] = [f"{name} (pid {pid})" for pid, name in g.processes]
    found.facts["busy"] = sorted(i for i in busy if i >= 0)
    for index, who in sorted(busy.items()):
        found.warnings.append(f"GPU {index if index >= 0 else '?'} is busy: {', '.join(who)} "
                              "(another job? a run there shares its memory)")
    by_bus = {g.bus_id.lower()[-12:-2]: g for g in report.gpus}   # 0000:07:00 of 00000000:07:00.0
    for x in parse_xids(parts.get("xid", (0, ""))[1]):
        g = by_bus.get(x.bus.lower()[-10:])
        who = f"GPU {g.index} ({x.bus})" if g else f"GPU at {x.bus}"
        meaning = device.hardware_errors.get(x.code)
        if meaning:
            found.problems.append(f"{who}: Xid {x.code} ({meaning}) in the kernel log: {x.text}")
        else:
            found.warnings.append(f"{who}: Xid {x.code} in the kernel log (a program's fault): {x.text}")
    if "dcgm" in parts:
        rc, text = parts["dcgm"]
        health = parse_dcgmi_health(text)
        if rc != 0 and health.overall is None:
            found.warnings.append(f"`dcgmi health -c` exited {rc}: {_last_line(text)} (health watches "
                                  "set? `dcgmi health -s a`)")
        for gid, (status, messages) in sorted(health.gpus.items()):
            if status.lower() in ("healthy", "pass"):
                continue
            target = found.problems if status.lower() == "failure" else found.warnings
            target.append(f"GPU {gid}: DCGM health {status}: " + "; ".join(messages or ("no detail",)))
    return found


def _mlu(parts: dict[str, tuple[int, str]], device: accelerators.Device) -> Findings:
    found = Findings(kind="mlu")
    files = parts.get("mlu_devices", (0, ""))[1].split()
    cards_files = [f for f in files if re.fullmatch(r"/dev/cambricon_dev\d+", f)]
    found.facts = {"device_files": files}
    if "cnmon_info" not in parts:
        found.warnings.append("no cnmon on the PATH: the MLUs' driver version and health are not read "
                              "(install Cambricon's driver package)")
        found.count = len(cards_files)
        return found
    rc, text = parts["cnmon_info"]
    if rc != 0:
        found.problems.append(f"cnmon info exited {rc}: {_last_line(text)} (is the Cambricon driver loaded?)")
        return found
    cards = parse_cnmon_info(text)
    found.count = len(cards)
    found.facts.update(mlus=len(cards), driver=next((c.driver for c in cards if c.driver), None),
                       models=sorted({c.product for c in cards if c.product}))
    if not cards:
        found.problems.append("cnmon info lists no MLU")
    if cards and len(cards_files) != len(cards):
        found.warnings.append(f"cnmon lists {len(cards)} MLUs but the node has {len(cards_files)} "
                              "/dev/cambricon_dev* files")
    if cards and "/dev/cambricon_ctl" not in files:
        found.problems.append("/dev/cambricon_ctl is missing: containers cannot reach the MLUs")
    for c in cards:
        if c.uncorrected:
            found.problems.append(f"MLU {c.index}: {c.uncorrected} uncorrected ECC error"
                                  f"{'s' if c.uncorrected > 1 else ''} (cnmon): drain the node")
    return found


def judge(parts: dict[str, tuple[int, str]], *, runtime: str = "docker",
          toolkit_version: str | None = None, wants: str | None = None,
          table: accelerators.Accelerators | None = None) -> Findings:
    """The findings of one node's probe parts.  ``runtime``: the node's container runtime's
    name (how it takes GPUs); ``toolkit_version``: the image's CUDA (None: not compared);
    ``wants``: the device kind the job computes on (``cuda``): what it cannot do without
    (no toolkit, no CDI spec) is a problem, otherwise a warning.  Health is always judged."""
    table = table or accelerators.load()
    if wants in ("cuda", "mlu") and not parts.get("smi_xml" if wants == "cuda" else "mlu_devices"):
        tool = "nvidia-smi" if wants == "cuda" else "cnmon or /dev/cambricon_*"
        device = table.devices.get(wants)
        return Findings(problems=[f"no {tool} on the node: its {device.description if device else wants} "
                                  "driver is not installed, and the job computes on them"])
    if "smi_xml" in parts and "cuda" in table.devices:
        found = _cuda(parts, table.devices["cuda"], runtime=runtime,
                      toolkit_version=toolkit_version, wants=wants == "cuda")
        if "mlu_devices" not in parts:
            return found
        mlu = _mlu(parts, table.devices["mlu"])
        found.problems += mlu.problems
        found.warnings += mlu.warnings
        return found
    if "mlu_devices" in parts and "mlu" in table.devices:
        return _mlu(parts, table.devices["mlu"])
    return Findings()


def processes_findings(accelerator: dict | None, processes: int, *, wants: str | None,
                       source: str, table: accelerators.Accelerators | None = None) -> Findings:
    """A node's process count against its devices (pure).  ``accelerator``: what the probe
    found there (:attr:`clusterctl.cluster.preflight.NodeCheck.accelerator`: kind, count);
    ``processes``: the ranks the node starts; ``wants``: the device kind they compute on
    (nothing is judged for another kind, or where the node's tool reported no count);
    ``source``: where the number comes from, in the message ("the job starts",
    "`slots:` gives").  Each rank takes the device of its LOCAL_RANK: more processes than
    devices is a problem (two ranks share a device, or a rank asks for one past the last);
    fewer is a warning (devices left idle)."""
    found = Findings()
    if not accelerator or wants is None or accelerator.get("kind") != wants:
        return found
    count = accelerator.get("count") or 0
    if count < 1 or processes == count:
        return found
    device = (table or accelerators.load()).devices.get(wants)
    unit = (device.unit if device else None) or "device"
    have = f"{count} {unit}{'s' if count != 1 else ''}"
    if processes > count:
        says = device.shared_device_error if device and device.shared_device_error else \
            "two ranks share one device"
        found.problems.append(
            f"{source} {processes} processes here but the node has {have}: each rank takes the "
            f"{unit} of its LOCAL_RANK, so {says} (or a rank asks for a {unit} past the last); "
            f"set the node's `slots: {count}` (a job with nproc_per_node: slots) or NPROC_PER_NODE={count}")
    else:
        idle = count - processes
        found.warnings.append(
            f"{source} {processes} process{'es' if processes != 1 else ''} here but the node has "
            f"{have}: {idle} stay{'s' if idle == 1 else ''} idle (set `slots: {count}` with "
            "nproc_per_node: slots to use them all)")
    return found
