"""Recording on the emulated cluster: ``record`` builds a ``Cluster`` (tests/cluster/net.py),
launches tests/cluster/program.py as every rank, sets each phase's link rates before it starts,
and converts each phase's capture. Used by tests/cluster/test_ground_truths.py and
benchmarks/bench_cluster.py."""

from __future__ import annotations

import json
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from chakra_hooks.convert import convert_paths

from .net import Cluster

PROGRAM = Path(__file__).resolve().parent / "program.py"
RUN_TIMEOUT_S = 420


@dataclass
class Phase:
    """One recording: the program's phase (program.py) and the links it runs on."""

    name: str
    sizes: list[int]
    rank_mbit: float
    uplink_mbit: float | None = None
    mode: str = "dp"
    forward_ms: float = 5.0
    backward_ms: float = 10.0
    scale: dict[int, float] = field(default_factory=dict)
    host_bytes: int = 0
    steps: int = 6
    window: tuple[int, int] = (2, 6)  # four steps: a collective stalled once weighs a quarter

    def program(self) -> dict:
        return {"name": self.name, "mode": self.mode, "sizes": self.sizes,
                "forward_ms": self.forward_ms, "backward_ms": self.backward_ms,
                "scale": {str(k): v for k, v in self.scale.items()},
                "host_bytes": self.host_bytes, "steps": self.steps, "window": list(self.window)}


def record(root: Path, ranks: int, phases: list[Phase], per_host: int | None = None,
           convert: bool = True) -> dict[str, Path]:
    """Every phase recorded in one launch of ``ranks`` ranks (hosts of ``per_host``), each
    converted (the full target) into ``root/<name>_et``; returns name -> that folder (or the
    capture, with ``convert=False``)."""
    root.mkdir(parents=True, exist_ok=True)
    control = root / "control"
    control.mkdir(exist_ok=True)
    plan = root / "plan.json"
    plan.write_text(json.dumps({"out": str(root), "control": str(control),
                                "per_host": per_host or ranks,
                                "phases": [p.program() for p in phases]}))
    first = phases[0]
    with Cluster(ranks, first.rank_mbit, per_host, first.uplink_mbit) as cluster:
        procs = [cluster.launch(r, [sys.executable, str(PROGRAM), str(plan)], {},
                                root / f"rank{r}.log") for r in range(ranks)]
        try:
            _drive(cluster, procs, phases, control, root)
            (root / "tcp.json").write_text(json.dumps(cluster.tcp_counters()))
        finally:
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGKILL)
                    p.wait()
    found = {}
    for phase in phases:
        capture = root / phase.name
        if not (capture / "manifest.json").exists():
            raise RuntimeError(f"{capture}: no capture ({_tails(root, ranks)})")
        if convert:
            out = root / f"{phase.name}_et"
            convert_paths([capture], out, progress=False, warn=lambda _: None, overwrite=True)
            found[phase.name] = out
        else:
            found[phase.name] = capture
    return found


def _drive(cluster: Cluster, procs: list, phases: list[Phase], control: Path,
           root: Path) -> None:
    deadline = time.monotonic() + RUN_TIMEOUT_S
    for phase in phases:
        while not (control / f"{phase.name}.ready").exists():
            _check(procs, deadline, root)
            time.sleep(0.02)
        if phase.rank_mbit != cluster.rank_mbit:
            cluster.set_rank_rate(phase.rank_mbit)
        if phase.uplink_mbit is not None and phase.uplink_mbit != cluster.uplink_mbit:
            cluster.set_uplink_rate(phase.uplink_mbit)
        (control / f"{phase.name}.go").touch()
    while any(p.poll() is None for p in procs):
        _check(procs, deadline, root)
        time.sleep(0.05)
    failed = [i for i, p in enumerate(procs) if p.returncode]
    if failed:
        raise RuntimeError(f"ranks {failed} failed: {_tails(root, len(procs))}")


def _check(procs: list, deadline: float, root: Path) -> None:
    if any(p.poll() not in (None, 0) for p in procs):
        raise RuntimeError(f"a rank failed: {_tails(root, len(procs))}")
    if time.monotonic() > deadline:
        raise TimeoutError(f"the ranks ran over {RUN_TIMEOUT_S} s: {_tails(root, len(procs))}")


def _tails(root: Path, ranks: int) -> str:
    parts = []
    for r in range(ranks):
        log = root / f"rank{r}.log"
        text = log.read_text(errors="replace").strip().splitlines()[-3:] if log.exists() else []
        parts.append(f"rank {r}: " + " | ".join(text))
    return "; ".join(parts)
