"""DDP as it ran: record examples/ddp_overlap.py with two extra-parameter sizes, convert, and
print what was kept, each run's prediction of the other, and (with ``--astra BIN``) ASTRA-sim.

    python benchmarks/bench_ddp.py [--mode ddp] [--mb 4 32] [--astra BIN]

Per run and rank: host ops and collectives lost (tests/conservation.py, reading the ETs with
mlc-chakra), Kineto's top-level op time kept, and the host ops' time (the premise: it should
not change with the communication volume); then ``whatif --comm-from`` both ways against the
other run's measured span, and ASTRA-sim (analytical, congestion unaware, through
../shared/tools/astra-run) on the ``--target astra-sim`` output with its fitted network.
Figures: docs/model-time.md ("Overlapped communication").
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

from conftest import _read_with_reference  # noqa: E402 (tests/conftest.py: mlc-chakra's reader)
from conservation import conservation  # noqa: E402

from chakra_hooks.convert import convert_paths  # noqa: E402
from chakra_hooks.converter import etio, whatif  # noqa: E402
from chakra_hooks.converter import peers as run_peers  # noqa: E402
from chakra_hooks.converter import run_model  # noqa: E402
from chakra_hooks.converter.stats import rank_stats  # noqa: E402

ASTRA_RUN = REPO.parent / "shared" / "tools" / "astra-run"


def record(root: Path, mode: str, mb: float) -> Path:
    capture = root / f"{mode}{mb:g}"
    subprocess.run([sys.executable, str(REPO / "examples" / "ddp_overlap.py"), str(capture),
                    "--mode", mode, "--extra-mb", str(mb)], capture_output=True, check=True)
    return capture


def compute_ms(out: Path) -> list[float]:
    """Per rank, the time of its host ops (not gaps, not communication): what the experiment
    assumes the two runs share."""
    return [sum(n.duration_micros for n in etio.read_et(et).nodes
                if n.name != "host_gap" and n.type not in (5, 6, 7)) / 1e3
            for et in sorted(out.glob("*.et"))]


def span_ms(out: Path) -> float:
    return max(rank_stats(str(et), etio.read_et(et).nodes).span_us for et in out.glob("*.et")) / 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mode", default="ddp")
    ap.add_argument("--mb", type=float, nargs=2, default=[4.0, 32.0])
    ap.add_argument("--astra", help="ASTRA-sim analytical (congestion-unaware) binary")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        outs = {}
        for mb in args.mb:
            capture = record(root, args.mode, mb)
            out = outs[mb] = root / f"et{mb:g}"
            convert_paths([capture], out, progress=False, warn=lambda _: None)
            for rank in (0, 1):
                _, nodes = _read_with_reference(out / f"chakra.{rank}.et")
                c = conservation(capture / f"kineto.rank{rank}.pt.trace.json", nodes)
                print(f"{args.mode} {mb:g} MB rank {rank}: time kept {c.time_kept:.2%}, "
                      f"collectives {c.et_collectives}/{c.kineto_collectives}, "
                      f"problems {c.problems() or 'none'}")
            print(f"{args.mode} {mb:g} MB: measured span {span_ms(out):.1f} ms, host ops per "
                  f"rank {', '.join(f'{c:.1f}' for c in compute_ms(out))} ms")
            if args.astra and ASTRA_RUN.exists():
                astra = root / f"astra{mb:g}"
                convert_paths([capture], astra, target="astra-sim", progress=False,
                              warn=lambda _: None)
                env = dict(os.environ, ASTRA_BIN=args.astra,
                           NETWORK_CONFIG=str(astra / "astra_network.yml"),
                           SYSTEM_CONFIG=str(astra / "astra_system.json"))
                run = subprocess.run([str(ASTRA_RUN), str(astra / "chakra"), "2"], env=env,
                                     capture_output=True, text=True)
                found = re.search(r"RESULT: (\w+).*\(([\d.]+) ms\)", run.stdout)
                print(f"{args.mode} {mb:g} MB: ASTRA-sim "
                      f"{found.group(2) + ' ms, ' + found.group(1) if found else 'failed'}")
        a, b = args.mb
        runs = {mb: run_model.read_run(sorted(outs[mb].glob("*.et"))) for mb in (a, b)}
        for src, dst in ((a, b), (b, a)):  # as `whatif --comm-from`: the ranks together
            ranks, groups, world = runs[src]
            theirs = runs[dst]
            run = whatif.replay_run(ranks, peers=run_peers.analyse(ranks, groups, world),
                                    comm_from=whatif.run_comm_times(
                                        theirs[0], run_peers.analyse(*theirs)))
            predicted = run.predicted_us / 1e3
            print(f"{src:g} MB with {dst:g} MB's collectives: predicted {predicted:.1f} ms, "
                  f"measured {span_ms(outs[dst]):.1f} ms ({predicted / span_ms(outs[dst]):.2f})")

if __name__ == "__main__":
    main()
