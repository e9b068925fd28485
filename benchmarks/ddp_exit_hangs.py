"""How often a traced 2-rank gloo DDP job never exits, against the same job untraced.

    python benchmarks/ddp_exit_hangs.py [--runs 100] [--timeout 90] [--one-core]

Runs tests/collectors/ddp_exit_job.py ``--runs`` times untraced and as many traced,
alternated; a run still alive after ``--timeout`` seconds is a hang (its processes' native
stacks are saved with gdb where it is installed, then it is killed). Prints the hangs of each
and the one-sided Fisher exact p of "traced hangs more often". ``--one-core``: both ranks on
one core (taskset), which widens the race (a gloo worker descheduled between finishing a work
and dropping it).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from exit_aborts import fisher_greater  # noqa: E402

JOB = Path(__file__).resolve().parents[1] / "tests" / "collectors" / "ddp_exit_job.py"


def _stacks(pid: int, where: Path) -> None:
    gdb = shutil.which("gdb")
    if gdb is None:
        return
    children = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    for p in [pid, *map(int, children.split())]:
        done = subprocess.run([gdb, "-p", str(p), "-batch", "-ex", "thread apply all bt 30"],
                              capture_output=True, text=True, timeout=120)
        (where / f"stacks_{p}.txt").write_text(done.stdout)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--timeout", type=float, default=90.0)
    ap.add_argument("--keep", type=Path, help="a folder for the hung runs' stacks")
    ap.add_argument("--one-core", action="store_true")
    args = ap.parse_args()
    hangs = {"plain": 0, "traced": 0}
    failed = {"plain": 0, "traced": 0}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            for mode in ("plain", "traced"):
                pin = ["taskset", "-c", "0"] if args.one_core else []
                run = subprocess.Popen([*pin, sys.executable, str(JOB), f"{tmp}/{mode}{i}", mode],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                       start_new_session=True)
                try:
                    failed[mode] += run.wait(timeout=args.timeout) != 0
                except subprocess.TimeoutExpired:
                    hangs[mode] += 1
                    if args.keep:
                        where = args.keep / f"{mode}{i}"
                        where.mkdir(parents=True, exist_ok=True)
                        _stacks(run.pid, where)
                    os.killpg(run.pid, signal.SIGKILL)
                    run.wait()
                shutil.rmtree(f"{tmp}/{mode}{i}", ignore_errors=True)
            print(f"after {i + 1} run(s) each: hangs untraced {hangs['plain']}, traced "
                  f"{hangs['traced']}", flush=True)
    n = args.runs
    print(f"hangs over {n} runs each: untraced {hangs['plain']}, traced {hangs['traced']} "
          f"(failed otherwise: untraced {failed['plain']}, traced {failed['traced']}); "
          f"one-sided Fisher p (traced worse) "
          f"{fisher_greater(hangs['traced'], n, hangs['plain'], n):.3f}")


if __name__ == "__main__":
    main()
