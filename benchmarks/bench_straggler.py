"""Ranks that wait for each other: a straggler recorded twice (examples/straggler.py, the last
rank doing SLOW x the compute, then 1x), and what the converted run says about it.

    python benchmarks/bench_straggler.py [--slow 3] [--astra BIN]

Prints, per recording: each rank's compute (the premise: rank 0's the same in both, rank 1's
SLOW x), peer wait and transfer per rank from our ETs and from ../shared/tools/peer-wait.py on
the raw Kineto files, the straggler and slowdown S that ``stats`` names, and the ASTRA-sim
network ``convert --target astra-sim`` fits (it should not depend on the straggler); then
``whatif --ranks 1 --compute`` from each recording against the other's measured run and rank 0
spans. With ``--astra BIN``, ASTRA-sim on each recording's astra-sim output too.
Figures: docs/model-time.md ("Ranks that wait for each other").
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from straggler_pair import premise, predict, record_pair  # noqa: E402

from chakra_hooks.convert import convert_paths  # noqa: E402
from chakra_hooks.converter import whatif  # noqa: E402

TOOLS = REPO.parent / "shared" / "tools"


def checker(capture: Path) -> list[float]:
    files = [str(capture / f"kineto.rank{r}.pt.trace.json") for r in (0, 1)]
    text = subprocess.run([sys.executable, str(TOOLS / "peer-wait.py"), *files],
                          capture_output=True, text=True).stdout
    return [float(m) for m in re.findall(r"peer wait ([\d.]+) us", text)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--slow", type=int, default=3)
    ap.add_argument("--astra", help="ASTRA-sim analytical (congestion-unaware) binary")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        slow, even, given_up = record_pair(Path(tmp), args.slow)
        for why in given_up:
            print(f"recorded again: premise failed ({why})")
        print(f"premise: {premise(slow, even, args.slow) or 'holds'}")
        for name, run in ((f"SLOW={args.slow}", slow), ("SLOW=1", even)):
            per_rank = run.peers.by_rank()
            waits = [sum(per_rank[rank].wait_us.values()) for rank in (0, 1)]
            moves = [sum(per_rank[rank].transfer_us.values()) for rank in (0, 1)]
            late = whatif.straggler(run.ranks, run.peers)
            print(f"{name}: compute per rank {', '.join(f'{c:.1f}' for c in run.compute_ms())} ms; "
                  f"peer wait {', '.join(f'{w / 1e3:.1f}' for w in waits)} ms (peer-wait.py "
                  f"{', '.join(f'{w / 1e3:.1f}' for w in checker(run.capture))}), transfer "
                  f"{', '.join(f'{t / 1e3:.1f}' for t in moves)} ms; straggler rank {late.rank}, "
                  f"S = {late.slowdown:.3f}")
            astra = run.out.with_name(run.out.name + "_astra")
            convert_paths([run.capture], astra, target="astra-sim", progress=False,
                          warn=lambda _: None)
            network = (astra / "astra_network.yml").read_text()
            bandwidth = re.search(r"bandwidth: \[ ([\d.e+-]+) \]", network).group(1)
            line = f"{name}: ASTRA-sim network fitted at {float(bandwidth):.4g} GB/s"
            if args.astra:
                sim = subprocess.run([str(TOOLS / "astra-run"), str(astra / "chakra"), "2"],
                                     capture_output=True, text=True, env=dict(
                                         os.environ, ASTRA_BIN=args.astra,
                                         NETWORK_CONFIG=str(astra / "astra_network.yml"),
                                         SYSTEM_CONFIG=str(astra / "astra_system.json")))
                found = re.search(r"\(([\d.]+) ms\)", sim.stdout)
                span = whatif.replay_run(run.ranks, peers=run.peers).span_us / 1e3
                line += (f"; simulated {found.group(1)} ms for {span:.1f} measured"
                         if found else "; ASTRA-sim failed")
            print(line)
        for source, target, factor, label in ((slow, even, 1 / args.slow, f"SLOW={args.slow} -> 1"),
                                              (even, slow, float(args.slow), f"SLOW=1 -> {args.slow}")):
            run, rank0 = predict(source, target, factor)
            print(f"whatif --ranks 1 --compute {factor:.4g}x, {label}: run {run:.3f}, "
                  f"rank 0 {rank0:.3f} (predicted / measured)")


if __name__ == "__main__":
    main()
