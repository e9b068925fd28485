"""`convert` on bad input: one line naming the file, exit 1, nothing in the output folder, also
when the bad rank is converted in a worker process."""

from __future__ import annotations

import pickle
import shutil
import subprocess
import sys
from pathlib import Path

from chakra_hooks.errors import TraceFormatError


def test_trace_format_error_survives_pickling() -> None:
    error = pickle.loads(pickle.dumps(TraceFormatError("a.json", "event 3", "a number")))
    assert str(error) == "a.json: event 3: a number" and error.where == "event 3"


def test_truncated_rank_in_a_parallel_run_leaves_nothing(corpus: Path, tmp_path: Path) -> None:
    source = corpus / "pytorch" / "v100_dlrm_8rank"
    run = tmp_path / "run"
    run.mkdir()
    for rank in (0, 1):
        shutil.copy(source / f"dlrm_eg_{rank}.json.gz", run)
        kineto = next(source.glob(f"worker{rank}_step_12.*.pt.trace.json.gz"))
        data = kineto.read_bytes()
        (run / kineto.name).write_bytes(data if rank == 0 else data[:20000])  # rank 1 cut short
    out = tmp_path / "out"
    result = subprocess.run([sys.executable, "-m", "chakra_hooks", "convert", str(run), "-o", str(out), "-j", "2"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and "worker1_step_12" in errors[0] and "truncated" in errors[0]
    assert "Traceback" not in result.stderr
    assert not out.exists() or not any(out.iterdir())
