"""The run tools on a thousand ranks: ``stats``, ``whatif`` and ``timeline`` on the corpus DLRM
run tiled to N ranks (benchmarks/tile_dlrm.py, ~1,450 nodes a rank), each command in a fresh
process as a user types it; wall seconds and peak memory (the command's process and the
workers it reads the run with, the largest of them), and the timeline file's size.

    python benchmarks/bench_run_tools.py [--ranks 8 128 1024] [--workdir DIR]

4,096 ranks (6 M nodes) take about 3 minutes to tile and convert, and the tools a few minutes
more: ``--ranks 4096`` when wanted.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tile_dlrm import tile_dlrm

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO.parent / "shared" / "corpus"
COMMANDS = {
    "stats": ["stats", "--json"],
    "whatif --comm 0.5x": ["whatif", "--json", "--comm", "0.5x"],
    "timeline --comm 0.5x": ["timeline", "-o", "{out}", "--comm", "0.5x"],
}
# Runs one command and prints its wall time and the peak RSS of its process tree's largest
# process (RUSAGE_CHILDREN: the largest of the children waited for, and theirs).
MEASURE = ("import resource, subprocess, sys, time; t = time.perf_counter(); "
           "run = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, "
           "stderr=subprocess.PIPE, text=True); "
           "print(run.returncode, time.perf_counter() - t, "
           "resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, "
           "run.stderr.strip().splitlines()[-1:] if run.returncode else '')")


def measure(args: list[str]) -> tuple[float, float]:
    run = subprocess.run([sys.executable, "-c", MEASURE, sys.executable, "-m", "chakra_hooks",
                          *args], capture_output=True, text=True, check=True)
    code, seconds, peak, *error = run.stdout.split(maxsplit=3)
    if code != "0":
        raise SystemExit(f"{' '.join(args)} failed: {' '.join(error)}")
    return float(seconds), float(peak)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="*", default=[8, 128, 1024])
    parser.add_argument("--workdir", help="keep the tiled runs here (default: a temporary one)")
    args = parser.parse_args()
    from chakra_hooks.convert import convert_paths
    from chakra_hooks.converter import etio

    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench_run_tools_"))
    print(f"{'ranks':>6} {'nodes':>10}  " + "  ".join(f"{name:>26}" for name in COMMANDS)
          + "  timeline file")
    for ranks in args.ranks:
        run = work / f"run{ranks}"
        if not run.exists():
            started = time.perf_counter()
            convert_paths([tile_dlrm(CORPUS, work / f"in{ranks}", ranks)], run, progress=False,
                          warn=lambda _: None)
            print(f"  (tiled and converted {ranks} ranks in {time.perf_counter() - started:.0f} s)",
                  flush=True)
        # (rank r a copy of rank r % 8: the first 8 ranks' nodes, times the copies)
        nodes = sum(len(etio.read_et(run / f"chakra.{r}.et").nodes) for r in range(8)) * ranks // 8
        cells = []
        drawn = work / f"timeline{ranks}.json.gz"
        for command in COMMANDS.values():
            seconds, peak = measure([part.replace("{out}", str(drawn)) for part in command]
                                    + [str(run)])
            cells.append(f"{seconds:8.1f} s {peak:8,.0f} MB")
        size = drawn.stat().st_size / 2**20 if drawn.exists() else 0.0
        print(f"{ranks:>6} {nodes:>10,}  " + "  ".join(f"{cell:>26}" for cell in cells)
              + f"  {size:,.1f} MB", flush=True)


if __name__ == "__main__":
    main()
