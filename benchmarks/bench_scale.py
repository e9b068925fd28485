"""``scale`` on the corpus DLRM run (8 ranks, ~1,500 nodes each, --target astra-sim): made
into 8 x K ranks, the time and peak memory ``scale`` takes per size, the replayed span, and with
``--astra BIN`` ASTRA-sim on the scaled run (../shared/tools/astra-run: its finish, and how many
nodes each NPU executed). The simulator's debug log, where astra-run counts executed nodes,
rotates through 11 files of 10 MB and drops the oldest; from a few hundred ranks on it holds
only the last ~110 MB, so every log file is hard-linked aside while the simulator runs and the
nodes are counted over all of them.

    python benchmarks/bench_scale.py [--ranks 16 128 1024] [--astra BIN] [--astra-up-to 128]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import threading
from collections import Counter
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


def _keep_logs(log: Path, kept: Path, stop: threading.Event) -> None:
    """Hard-link every file that appears in ``log`` into ``kept`` (one name per inode) until
    ``stop``: a rotated-out file loses its name in ``log``, not its content."""
    kept.mkdir(parents=True, exist_ok=True)
    seen: set[int] = set()
    while True:
        finished = stop.wait(0.5)
        for path in log.glob("log*.log") if log.is_dir() else ():
            try:
                inode = path.stat().st_ino
                if inode not in seen:
                    os.link(path, kept / f"{inode}.log")
                    seen.add(inode)
            except FileNotFoundError:  # renamed between the listing and the link: next pass
                pass
        if finished:
            return


def executed_per_npu(kept: Path) -> Counter:
    """How many nodes each NPU executed: the callback lines over every kept debug log."""
    found: Counter = Counter()
    callback = re.compile(rb"callback,sys->id=(\d+),")
    for path in kept.glob("*.log"):
        with path.open("rb") as log:
            for line in log:
                hit = callback.search(line)
                if hit:
                    found[int(hit.group(1))] += 1
    return found


def astra(out: Path, ranks: int, binary: str) -> str:
    from chakra_hooks.converter import etio

    work = Path(tempfile.mkdtemp(prefix=f"astra_{ranks}_"))
    env = dict(os.environ, ASTRA_BIN=binary, NETWORK_CONFIG=str(out / "astra_network.yml"),
               SYSTEM_CONFIG=str(out / "astra_system.json"), TIMEOUT="3000", WORKDIR=str(work))
    stop = threading.Event()
    keeper = threading.Thread(target=_keep_logs, args=(work / "log", work / "kept", stop))
    keeper.start()
    try:
        run = subprocess.run([str(ASTRA_RUN), str(out / "chakra"), str(ranks)], env=env,
                             capture_output=True, text=True)
    finally:
        stop.set()
        keeper.join()
    found = re.search(r"max_finish_cycles=(\d+)", run.stdout)
    finished = len(re.findall(r"NPU \d+: finished", run.stdout))
    executed = executed_per_npu(work / "kept")
    short = [npu for npu in range(ranks)
             if executed[npu] != len(etio.read_et(out / f"chakra.{npu}.et").nodes)]
    counted = (f"every node on every NPU ({finished} finished)" if not short and executed
               else f"NPUs short of their nodes: {short[:8]}")
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
