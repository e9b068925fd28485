"""A traced gloo job exits like an untraced one.

The profiler's ``prepare_trace`` imports ``torch.distributed.nn.functional``, whose wrappers
capture the live default process group as a default argument; the group then outlives
``destroy_process_group`` with its gloo threads, and an exit that races one of them aborts.
The collector gives those defaults back (collectors/torch/capture.py, unpin_default_group),
whoever imported the module: the profiler or the program.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

JOB = Path(__file__).with_name("gloo_exit_job.py")
GLOO_THREADS = ("pt_gloo_runloop", "gloo_tcp_loop")


def _run(tmp_path: Path, mode: str, amplify: bool = False, nn_import: bool = False
         ) -> tuple[int, list[str]]:
    args = [sys.executable, str(JOB), str(tmp_path / "capture"), mode] + (
        ["amplify"] if amplify else []) + (["nn-import"] if nn_import else [])
    run = subprocess.run(args, capture_output=True, text=True, timeout=300)
    # Each rank's report, found in the text rather than by line: Kineto writes its USDT lines
    # to the same stdout without a newline, so two reports can share a line.
    lines = [f"rank {rank} threads after destroy: {names.strip()}" for rank, names in
             re.findall(r"rank (\d+) threads after destroy: ((?:(?!rank \d)[a-z0-9_ ])+)",
                        run.stdout)]
    return run.returncode, lines


def test_the_default_group_and_its_gloo_threads_end_with_destroy(tmp_path):
    code, plain = _run(tmp_path, "plain")
    assert code == 0 and len(plain) == 2
    assert not any(t in line for line in plain for t in GLOO_THREADS)
    code, traced = _run(tmp_path, "traced")
    assert code == 0 and len(traced) == 2, traced
    # No gloo thread survives the group (they did: the group was pinned); what remains beside
    # the untraced job's threads is the profiler's own (one Kineto thread, as any
    # torch.profiler run leaves, holding no Python object).
    assert not any(t in line for line in traced for t in GLOO_THREADS), traced
    for p, t in zip(sorted(plain), sorted(traced)):
        assert len(t.split()) - len(p.split()) <= 1, (p, t)
    assert (tmp_path / "capture" / "manifest.json").exists()


@pytest.mark.extended  # repeats: the thread check above is the deterministic one
@pytest.mark.parametrize("run", range(6))
def test_traced_jobs_exit_0(tmp_path, run):
    """Repeated, every other run with a 1 s switch interval (the race's amplifier): an abort
    was seen in 2-9 of 20 runs before (machine- and load-dependent; 0 of 12 here on one
    day): the thread check above is the deterministic one."""
    code, lines = _run(tmp_path, "traced", amplify=run % 2 == 1)
    assert code == 0 and len(lines) == 2


def test_a_programs_own_import_of_torch_distributed_nn_is_unpinned_too(tmp_path):
    """The program imports torch.distributed.nn after init_process_group: untraced, the
    default group and its gloo threads outlive destroy_process_group (torch's own defect);
    traced, the collector gave the defaults back (it did only for the profiler's import, and
    a traced job aborted at exit in 10 of 20 amplified runs against 3 of 20 untraced;
    benchmarks/exit_aborts.py counts both)."""
    code, plain = _run(tmp_path / "plain", "plain", nn_import=True)
    assert code == 0 and len(plain) == 2
    assert all(any(t in line for t in GLOO_THREADS) for line in plain), plain
    code, traced = _run(tmp_path / "traced", "traced", nn_import=True)
    assert code == 0 and len(traced) == 2, traced
    assert not any(t in line for line in traced for t in GLOO_THREADS), traced
