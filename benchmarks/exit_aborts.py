"""How often a 2-rank gloo job aborts at exit, traced against untraced.

    python benchmarks/exit_aborts.py [--runs 40] [--nn-import]

Runs tests/collectors/gloo_exit_job.py ``--runs`` times plain and as many traced, alternated,
each with a 1 s thread switch interval (the race's amplifier); ``--nn-import``: the program
imports ``torch.distributed.nn`` after ``init_process_group`` (which pins the default group
whether traced or not). Prints the aborts of each and the one-sided Fisher exact p of "traced
aborts more often".
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from math import comb
from pathlib import Path

JOB = Path(__file__).resolve().parents[1] / "tests" / "collectors" / "gloo_exit_job.py"


def fisher_greater(a: int, n1: int, b: int, n2: int) -> float:
    """P(traced aborts >= a | a + b aborts in all), hypergeometric (one-sided Fisher)."""
    total = a + b
    denom = comb(n1 + n2, total)
    return sum(comb(n1, k) * comb(n2, total - k) for k in range(a, min(n1, total) + 1)) / denom


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--nn-import", action="store_true")
    args = ap.parse_args()
    extra = ["amplify"] + (["nn-import"] if args.nn_import else [])
    aborts = {"plain": 0, "traced": 0}
    codes: dict[str, list[int]] = {"plain": [], "traced": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            for mode in ("plain", "traced"):
                run = subprocess.run([sys.executable, str(JOB), f"{tmp}/{mode}{i}", mode, *extra],
                                     capture_output=True, text=True, timeout=600)
                codes[mode].append(run.returncode)
                aborts[mode] += run.returncode != 0
    n = args.runs
    print(f"aborts over {n} runs each ({' '.join(extra)}): untraced {aborts['plain']}, "
          f"traced {aborts['traced']}; exit codes untraced {sorted(set(codes['plain']))}, "
          f"traced {sorted(set(codes['traced']))}; one-sided Fisher p (traced worse) "
          f"{fisher_greater(aborts['traced'], n, aborts['plain'], n):.3f}")


if __name__ == "__main__":
    main()
