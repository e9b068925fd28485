"""``scale`` on the corpus DLRM run (8 ranks, ~1,500 nodes each, --target astra-sim): made
into 8 x K ranks, the time and peak memory ``scale`` takes per size, the replayed span, and with
``--astra BIN`` ASTRA-sim on the scaled run (../shared/tools/astra-run: its finish, and how many
nodes each NPU executed, where its debug log holds them all).

    python benchmarks/bench_scale.py [--ranks 16 128 1024] [--astra BIN] [--astra-up-to 128]
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
CORPUS = REPO.parent / "shared" / "corpus"
ASTRA_RUN = REPO.parent / "shared" / "tools" / "astra-run"


def scale_once(source: Path, out: Path, ranks: int) -> tuple[float, float, float]:
    """(seconds, peak MB, predicted span ms) of one ``scale`` in a child process of its own
    (peak memory is the child's alone)."""
    code = ("import sys, time, resource; from pathlib import Path; "
            "from chakra_hooks.converter.scale import scale_run; t = time.perf_counter(); "
            f"done = scale_run(Path({str(source)!r}), Path({str(out)!r}), dp={ranks // 8}); "
            "print(time.perf_counter() - t, "
            "resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, done.predicted_us / 1e3)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    seconds, peak, span = (float(v) for v in run.stdout.split())
    return seconds, peak, span


def astra(out: Path, ranks: int, binary: str) -> str:
    env = dict(os.environ, ASTRA_BIN=binary, NETWORK_CONFIG=str(out / "astra_network.yml"),
               SYSTEM_CONFIG=str(out / "astra_system.json"), TIMEOUT="3000")
    run = subprocess.run([str(ASTRA_RUN), str(out / "chakra"), str(ranks)], env=env,
                         capture_output=True, text=True)
    found = re.search(r"max_finish_cycles=(\d+)", run.stdout)
    executed = re.findall(r"executed (>= )?(\d+) of (\d+) nodes", run.stdout)
    every = all(not lower and done == total for lower, done, total in executed)
    counted = "every node on every NPU" if executed and every else (
        "node counts a lower bound (its debug log rotated)" if executed else "no counts")
    wall = re.search(r"wall time: ([\d.]+)s", run.stdout)
    return (f"{int(found.group(1)) / 1e6:,.3f} ms, {counted}, {wall.group(1) if wall else '?'} s"
            if found else f"failed ({run.returncode})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="*", default=[16, 128, 1024])
    parser.add_argument("--astra", help="ASTRA-sim's analytical congestion-unaware binary")
    parser.add_argument("--astra-up-to", type=int, default=128,
                        help="run ASTRA-sim on sizes up to this many ranks")
    args = parser.parse_args()
    from chakra_hooks.convert import convert_paths
    from chakra_hooks.converter import etio

    work = Path(tempfile.mkdtemp(prefix="bench_scale_"))
    source = work / "dlrm"
    convert_paths([CORPUS / "pytorch" / "v100_dlrm_8rank"], source, target="astra-sim",
                  progress=False, warn=lambda _: None)
    recorded = sum(len(etio.read_et(p).nodes) for p in source.glob("chakra.*.et"))
    print(f"{'ranks':>6} {'nodes':>10} {'scale s':>8} {'peak MB':>8} {'replayed ms':>12}"
          + ("  ASTRA-sim" if args.astra else ""))
    for ranks in args.ranks:
        out = work / f"x{ranks}"
        seconds, peak, span = scale_once(source, out, ranks)
        nodes = recorded * ranks // 8  # (copies of the 8 recorded ranks)
        line = f"{ranks:>6} {nodes:>10,} {seconds:>8.1f} {peak:>8.0f} {span:>12.3f}"
        if args.astra and ranks <= args.astra_up_to:
            line += "  " + astra(out, ranks, args.astra)
        print(line, flush=True)


if __name__ == "__main__":
    main()
