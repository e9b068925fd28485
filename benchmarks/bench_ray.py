"""Benchmark: `convert` of many ranks on one process, the local process pool, and Ray.

    python benchmarks/bench_ray.py [--ranks 64] [--memory-ranks 16 64 256] [--workdir DIR]

Inputs: the corpus's 8 DLRM ranks tiled to N ranks (benchmarks/tile_dlrm.py).
Each configuration runs in a fresh process (`python -m chakra_hooks convert ...`), timed from
outside; the driver's peak memory is that process's high-water mark (getrusage of the
children, one wrapper process per run, so one run cannot inflate the next). Ray's workers run
in processes of Ray's own, so the driver's figure is what the driver holds: it must not grow
with the number of ranks (it handles job descriptions and small results only). Ray here is a
local one started for the run (its start-up is in its wall time and given apart).

Per-task overhead: Ray's wall time, less its start-up, minus the pool's, per rank (both on
the same 2 cores). The projection for 1,024 ranks of 1 GB on N nodes of 32 cores: waves of
tasks, each a rank's conversion at ``--mb-per-s`` per core (default 69: the compiled build
on 593 MB ranks, docs/performance.md; these small DLRM ranks are dominated by start-up) plus the
measured overhead per task, plus one start-up.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from tile_dlrm import tile_dlrm

REPO = Path(__file__).resolve().parent.parent

CORPUS = REPO.parent / "shared" / "corpus"
WRAPPER = """
import json, resource, subprocess, sys, time
start = time.perf_counter()
done = subprocess.run(sys.argv[1:], capture_output=True, text=True)
wall = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
print(json.dumps({"rc": done.returncode, "wall": wall, "peak_mb": peak, "err": done.stderr[-400:]}))
"""


def _run(inputs: Path, out: Path, *options: str) -> dict:
    command = [sys.executable, "-m", "chakra_hooks", "convert", str(inputs), "-o", str(out),
               "--overwrite", *options]
    done = subprocess.run([sys.executable, "-c", WRAPPER, *command], capture_output=True, text=True)
    result = json.loads(done.stdout)
    if result["rc"] != 0:
        raise SystemExit(f"convert failed: {result['err']}")
    return result


def _input_mb(folder: Path) -> float:
    total = 0
    for path in folder.iterdir():
        with open(path, "rb") as handle:  # raw size of each gzip file (ISIZE)
            handle.seek(-4, 2)
            total += int.from_bytes(handle.read(4), "little")
    return total / 1e6


def _ray_start_seconds() -> float:
    code = ("import ray, time; t = time.perf_counter(); ray.init(num_cpus=2, include_dashboard=False, "
            "log_to_driver=False); print(time.perf_counter() - t); ray.shutdown()")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    return float(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--memory-ranks", type=int, nargs="*", default=[16, 64, 256])
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--mb-per-s", type=float, default=69.0, help="per core, for the projection")
    args = ap.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench-ray-"))
    runs = {}
    for n in sorted({args.ranks, *args.memory_ranks}):
        folder = work / f"dlrm{n}"
        if not folder.exists():
            tile_dlrm(CORPUS, folder, n)
        runs[n] = folder

    n = args.ranks
    mb = _input_mb(runs[n])
    start_up = _ray_start_seconds()
    print(f"{n} ranks, {mb:.1f} MB of raw input; Ray local start-up {start_up:.1f} s")
    print(f"{'executor':<22} {'wall s':>8} {'MB/s':>7} {'driver peak MB':>15}")
    timings = {}
    for label, options in (("one process (-j 1)", ("-j", "1")), ("process pool (-j 2)", ("-j", "2")),
                           ("ray (local, 2 CPUs)", ("--executor", "ray"))):
        r = _run(runs[n], work / "out", *options)
        timings[label] = r["wall"]
        print(f"{label:<22} {r['wall']:>8.2f} {mb / r['wall']:>7.1f} {r['peak_mb']:>15.0f}")
    overhead = max(0.0, timings["ray (local, 2 CPUs)"] - start_up - timings["process pool (-j 2)"]) / n
    print(f"Ray's overhead over the pool: {overhead * 1e3:.0f} ms per task (after its start-up); "
          f"per rank, one process: {timings['one process (-j 1)'] / n * 1e3:.0f} ms")

    print(f"\n{'ranks':>6} {'driver peak MB, ray':>20} {'wall s':>8}")
    for count in args.memory_ranks:
        r = _run(runs[count], work / "out", "--executor", "ray")
        print(f"{count:>6} {r['peak_mb']:>20.0f} {r['wall']:>8.2f}")

    per_rank = 1000 / args.mb_per_s + overhead  # seconds for one 1 GB rank on one core
    print(f"\nprojection, 1,024 ranks x 1 GB at {args.mb_per_s:.0f} MB/s per core "
          f"(+{overhead * 1e3:.0f} ms per task, +{start_up:.0f} s start-up), 32 cores per node:")
    for nodes in (1, 8, 32, 128):
        waves = -(-1024 // (32 * nodes))
        print(f"  {nodes:>4} nodes: {(waves * per_rank + start_up) / 60:7.1f} min "
              f"({waves} wave(s) of {per_rank:.1f} s)")


if __name__ == "__main__":
    main()
