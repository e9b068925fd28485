"""The local pool's workers skip Python's teardown at exit (chakra_hooks/executors.py):
what they wrote must still reach the parent's output."""

from __future__ import annotations

import subprocess
import sys

JOB = """
from functools import partial
from chakra_hooks.executors import LocalExecutor

if __name__ == "__main__":
    runner = LocalExecutor(2, progress_shown=False)
    # no newline: held in the worker's buffer (its stdout is a pipe) until it is flushed
    results = runner.map(partial(print, end=""), [("first-worker-text",), ("second-worker-text",)])
    runner.close()
    print("|parent:", results)
"""


def test_what_workers_wrote_reaches_the_output(tmp_path) -> None:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert "first-worker-text" in done.stdout and "second-worker-text" in done.stdout
    assert "|parent: [None, None]" in done.stdout
