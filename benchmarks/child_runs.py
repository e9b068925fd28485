"""Measuring each mode of a benchmark in a fresh process: the parent runs the script again as
a child with ``--child MODE`` and reads back one result line (frameworks print on stdout too:
vLLM its profiler table, so the result is marked)."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile

RESULT = "bench-result: "


def emit(result: dict) -> None:
    """In the child: hand the result to the parent."""
    print(RESULT + json.dumps(result), flush=True)


def run_child(script: str, mode: str, *args: str, env: dict | None = None) -> dict:
    """In the parent: ``script --child MODE --folder TMP ARGS...`` in a fresh process."""
    with tempfile.TemporaryDirectory() as folder:
        done = subprocess.run([sys.executable, script, "--child", mode, "--folder", folder, *args],
                              env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SystemExit(f"{mode}: failed:\n{done.stderr[-2000:]}")
        return json.loads(done.stdout.split(RESULT, 1)[1].splitlines()[0])
