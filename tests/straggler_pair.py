"""Ground truth for a straggler what-if: examples/straggler.py recorded with the last rank doing
SLOW times the compute and with SLOW = 1, converted, and the premise checked (the two runs
differ in rank 1's compute only). Used by
benchmarks/bench_straggler.py."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from chakra_hooks.convert import convert_paths
from chakra_hooks.converter import peers as run_peers
from chakra_hooks.converter import run_model
from chakra_hooks.converter import whatif

REPO = Path(__file__).resolve().parents[1]
PREMISE = 0.05  # rank 0's compute, and rank 1's over SLOW, agree between the runs this well
TRANSFER_PREMISE = 0.15  # and the collectives' transfers (both ranks) this well


@dataclass
class Run:
    capture: Path
    out: Path
    ranks: list
    peers: run_peers.Peers

    def transfer_ms(self) -> float:
        """The matched collectives' transfers, both ranks (converter/peers.py)."""
        return sum(self.peers.transfer_us.values()) / 1e3

    def compute_ms(self) -> list[float]:
        """Per rank, its compute nodes' time added up (not gaps, not communication)."""
        return [whatif.compute_us(r) / 1e3 for r in self.ranks]


def record(root: Path, slows: tuple[int, ...]) -> list[Run]:
    """One launch of examples/straggler.py recording a run per value of SLOW, one after the
    other in the same processes, each converted."""
    subprocess.run([sys.executable, str(REPO / "examples" / "straggler.py"), str(root),
                    "--slow", *map(str, slows)], capture_output=True, timeout=600)
    runs = []
    for index, slow in enumerate(slows):
        capture = root / f"{index}-slow{slow}"
        assert (capture / "manifest.json").exists(), f"no capture for --slow {slow}"
        out = root / f"{index}-slow{slow}_et"
        convert_paths([capture], out, progress=False, warn=lambda _: None)
        ranks, groups, world = run_model.read_run(sorted(out.glob("*.et")))
        runs.append(Run(capture, out, ranks, run_peers.analyse(ranks, groups, world)))
    return runs


def mismatch(slow_run: Run, even_run: Run, slow: int) -> float:
    """How far the pair is from differing in rank 1's compute only (0: not at all), in units
    of the premise's tolerance."""
    (a0, a1), (b0, b1) = slow_run.compute_ms(), even_run.compute_ms()
    moved = abs(slow_run.transfer_ms() / even_run.transfer_ms() - 1)
    return max(abs(a0 / b0 - 1) / PREMISE, abs(a1 / (slow * b1) - 1) / PREMISE,
               moved / TRANSFER_PREMISE)


def premise(slow_run: Run, even_run: Run, slow: int) -> str | None:
    """Why the pair is not the same program but for rank 1's compute, or None: rank 0's
    compute, rank 1's over SLOW and the collectives' transfers (gloo's, on the same cores,
    vary by up to 30 % between recordings) must agree."""
    (a0, a1), (b0, b1) = slow_run.compute_ms(), even_run.compute_ms()
    if abs(a0 / b0 - 1) > PREMISE:
        return f"rank 0's compute {a0:.1f} ms against {b0:.1f} ms"
    if abs(a1 / (slow * b1) - 1) > PREMISE:
        return f"rank 1's compute {a1:.1f} ms against {slow} x {b1:.1f} ms"
    ta, tb = slow_run.transfer_ms(), even_run.transfer_ms()
    if abs(ta / tb - 1) > TRANSFER_PREMISE:
        return f"transfers {ta:.1f} ms against {tb:.1f} ms"
    return None


def record_pair(root: Path, slow: int = 3, attempts: int = 3) -> tuple[Run, Run, list[str]]:
    """A pair whose premise holds: each launch records SLOW, 1, SLOW, 1, SLOW, 1 (seconds apart,
    in the same processes: this shared machine's speed drifts by 10-50 % between launches, and
    by 10-25 % within one) and the neighbouring pair closest to the premise is taken; up to
    ``attempts`` launches. Also the reasons of the pairs given up on. The last pair is returned
    either way (check ``premise``)."""
    given_up = []
    for attempt in range(attempts):
        runs = record(root / f"attempt{attempt}", (slow, 1) * 3)
        pairs = [(runs[i], runs[i + 1]) if i % 2 == 0 else (runs[i + 1], runs[i])
                 for i in range(len(runs) - 1)]
        best = min(pairs, key=lambda p: mismatch(*p, slow))
        why = premise(*best, slow)
        if why is None:
            return best[0], best[1], given_up
        given_up.append(why)
    return best[0], best[1], given_up


def predict(source: Run, target: Run, factor: float) -> tuple[float, float]:
    """``source``'s ETs with rank 1's compute times ``factor``: (run, rank 0) predicted over
    ``target``'s measured (run span, rank 0's span)."""
    run = whatif.replay_run(source.ranks, whatif.Change(compute=factor), {1}, source.peers)
    measured = whatif.replay_run(target.ranks, peers=target.peers)
    return (run.predicted_us / measured.span_us,
            run.ranks[0].predicted_us / measured.ranks[0].span_us)
