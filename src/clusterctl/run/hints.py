"""Known causes of a failure that a rank printed above its last lines (pure).

A failed run's report shows the first failure's last lines (:func:`clusterctl.run.supervise.
summary_lines`).  For a torchrun job those are torchrun's own report ("exitcode: -6
(SIGABRT)"), and the line that says why sits above it.  Some such lines have one known
cause and one fix; :class:`FirstHints` keeps each node's first line that matches a pattern
of :data:`HINTS` (one table, plain substrings: every output line passes here), for the
supervisor (runs over SSH) and the Slurm follower alike, and the report adds the hint under
the failure.
"""

from __future__ import annotations

from dataclasses import dataclass

#: (what a line contains, the cause and fix; the troubleshooting page's section for it)
HINTS: tuple[tuple[str, str], ...] = (
    ("terminate called without an active exception",
     "a C++ thread was destroyed while still running, which aborts the process (SIGABRT, "
     "exit -6). After the script's last line with the gloo backend, this is torch's own "
     "exit after destroy_process_group(): end the script with sys.stdout.flush() and "
     "os._exit(0) (troubleshooting: \"A finished run fails with SIGABRT at exit\")"),
    # IPEX 2.x's words when ipex.optimize(..., dtype=torch.bfloat16) meets a CPU without them
    ("BF16 weight prepack needs the cpu support",
     "IPEX's bf16 training needs a CPU with AVX-512 (avx512bw, avx512vl, avx512dq) or "
     "AVX-NE-CONVERT, and this node's has neither (an AVX2-only CPU). Run on nodes whose "
     "/proc/cpuinfo flags list them, or train in float32: ipex.optimize(model, optimizer) "
     "without dtype=torch.bfloat16 and no bf16 autocast; for ddp-smoke-ipex, launch ddp-smoke "
     "(troubleshooting: \"IPEX's bf16 training stops on a CPU without AVX-512\")"),
    # NCCL's words (2.28.9 on an H200, torch 2.11) when two ranks of a node use one GPU
    ("Duplicate GPU detected",
     "two ranks of this node use the same GPU: the script does not select the GPU of its "
     "LOCAL_RANK (torch.cuda.set_device(int(os.environ['LOCAL_RANK'])) before "
     "init_process_group), or CUDA_VISIBLE_DEVICES leaves fewer GPUs than the node's "
     "processes (launch already refuses more processes than nvidia-smi lists) "
     "(troubleshooting: \"NCCL stops with Duplicate GPU detected\")"),
)


@dataclass(frozen=True)
class Hint:
    """A line of a node's output with a known cause."""

    node: str
    rank: int
    line: str
    advice: str


def match(text: str) -> str | None:
    """The advice for an output line that shows a known cause, else None."""
    for needle, advice in HINTS:
        if needle in text:
            return advice
    return None


class FirstHints:
    """Each node's first output line with a known cause, as lines go by (one substring
    test per pattern and line).  The supervisor (SSH runs) and the Slurm follower keep
    theirs here, so both reports name the same cause."""

    def __init__(self) -> None:
        self.found: dict[str, Hint] = {}

    def see(self, node: str, rank: int, text: str) -> None:
        if node not in self.found:
            advice = match(text)
            if advice is not None:
                self.found[node] = Hint(node, rank, text, advice)


def hint_lines(hint: Hint | None, shown: list[str]) -> list[str]:
    """What the failure report adds for ``hint`` (none when absent, or when the report's
    last lines, ``shown``, already hold its line: the reader has it in front of them)."""
    if hint is None:
        return []
    where = "" if hint.line in shown else ", above the lines shown"
    return [f"hint: {hint.node}[{hint.rank}] printed \"{hint.line.strip()[:200]}\"{where}: {hint.advice}"]
