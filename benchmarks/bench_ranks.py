"""Benchmark: `convert` of many corpus-sized ranks on 1, 2, ... workers.

    python benchmarks/bench_ranks.py [--ranks 16] [--workers 1 2 3] [--repeat 3]
                                     [--pair resnet|dlrm] [--workdir DIR]

Inputs: ``--ranks`` copies of one real rank of the corpus, each under its own rank number (the
ET's file name; the Kineto trace's file name and ``distributedInfo``): ``resnet`` is the
``a100_resnet_nccl`` pair (18 MB of JSON a rank), ``dlrm`` the 8 DLRM ranks (1.6 MB a rank,
benchmarks/tile_dlrm.py). Each configuration runs ``chakra-hooks convert -j N`` (the command
beside this Python, as a user types it; ``python -m chakra_hooks`` where there is none) in a
fresh process, the worker counts alternated ``--repeat`` times (the machine's speed drifts);
reported: best and median wall seconds, and the speedup over one worker, best against best and
median against median.
"""

from __future__ import annotations

import argparse
import gzip
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

from tile_dlrm import tile_dlrm

REPO = Path(__file__).resolve().parent.parent
CORPUS = REPO.parent / "shared" / "corpus"
RESNET = Path("pytorch") / "a100_resnet_nccl"


def tile_resnet_ranks(corpus: Path, folder: Path, ranks: int) -> Path:
    """``ranks`` copies of the ResNet pair, rank r as ``resnet_eg_<r>.json.gz`` (ET) and
    ``worker<r>.pt.trace.json.gz`` (Kineto, its ``distributedInfo`` saying rank r)."""
    folder.mkdir(parents=True)
    source = corpus / RESNET
    et = (source / "host_et.json.gz").read_bytes()
    kineto = orjson.loads(gzip.decompress((source / "kineto.json.gz").read_bytes()))
    for rank in range(ranks):
        (folder / f"resnet_eg_{rank}.json.gz").write_bytes(et)
        kineto["distributedInfo"] = dict(kineto.get("distributedInfo") or {}, rank=rank, world_size=ranks)
        (folder / f"worker{rank}.pt.trace.json.gz").write_bytes(
            gzip.compress(orjson.dumps(kineto), compresslevel=1))
    return folder


def raw_mb(folder: Path) -> float:
    total = 0
    for path in folder.iterdir():
        with open(path, "rb") as handle:  # a gzip member's ISIZE: its raw size (mod 4 GiB)
            handle.seek(-4, 2)
            total += int.from_bytes(handle.read(4), "little")
    return total / 1e6


def run(inputs: Path, out: Path, workers: int) -> float:
    script = Path(sys.executable).with_name("chakra-hooks")
    command = [str(script)] if script.is_file() else [sys.executable, "-m", "chakra_hooks"]
    start = time.perf_counter()
    done = subprocess.run([*command, "convert", str(inputs), "-o", str(out), "--overwrite", "-j",
                           str(workers)], capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"convert -j {workers} failed: {done.stderr[-400:]}")
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=16)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--pair", choices=("resnet", "dlrm"), default="resnet")
    ap.add_argument("--workdir", type=Path, default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        folder = Path(tmp) / "ranks"
        (tile_resnet_ranks if args.pair == "resnet" else tile_dlrm)(CORPUS, folder, args.ranks)
        mb = raw_mb(folder)
        times: dict[int, list[float]] = {w: [] for w in args.workers}
        for _ in range(args.repeat):
            for workers in args.workers:
                times[workers].append(run(folder, Path(tmp) / "out", workers))
        print(f"{args.ranks} {args.pair} ranks, {mb:.0f} MB of JSON in all, {args.repeat} runs per "
              "worker count, alternated")
        print(f"{'workers':>7}  {'best s':>7}  {'median s':>8}  {'speedup best / median':>22}  runs")
        one_best, one_median = min(times[args.workers[0]]), statistics.median(times[args.workers[0]])
        for workers, runs in times.items():
            best, median = min(runs), statistics.median(runs)
            print(f"{workers:>7}  {best:7.2f}  {median:8.2f}  {one_best / best:10.2f}x / {one_median / median:.2f}x  "
                  f"{' '.join(f'{t:.2f}' for t in runs)}")


if __name__ == "__main__":
    main()
