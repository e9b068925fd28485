"""`convert --executor ray` on a real local Ray (two CPUs), against the process pool."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed here (pip install 'chakra-hooks[ray]')")

from chakra_hooks.convert import convert_paths  # noqa: E402
from chakra_hooks.common.errors import TraceFormatError  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from tile_dlrm import tile_dlrm  # noqa: E402

DLRM = "pytorch/v100_dlrm_8rank"


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray for the module (starting one takes ~8 s here); convert joins it."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.mark.parametrize("target", ["full", "astra-sim"])
def test_same_bytes_as_the_process_pool(corpus, tmp_path, local_ray, target):
    pool = convert_paths([corpus / DLRM], tmp_path / "pool", target=target, workers=2,
                         progress=False, warn=lambda _: None)
    on_ray = convert_paths([corpus / DLRM], tmp_path / "ray", target=target, executor="ray",
                           progress=False, warn=lambda _: None)
    assert [r.rank for r in on_ray.ranks] == list(range(8))
    assert _files(tmp_path / "ray") == _files(tmp_path / "pool")
    assert [r.summary for r in on_ray.ranks] == [r.summary for r in pool.ranks]


def test_sixteen_tiled_ranks(corpus, tmp_path, local_ray):
    run = tile_dlrm(corpus, tmp_path / "run16", 16)
    result = convert_paths([run], tmp_path / "out", target="astra-sim", executor="ray",
                           progress=False, warn=lambda _: None)
    assert [r.rank for r in result.ranks] == list(range(16))
    assert len(list((tmp_path / "out").glob("chakra.*.et"))) == 16


def _ray_task_pids() -> list[int]:
    """Processes of Ray workers running one of our tasks (Ray titles them ``ray::_call``)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if cmdline.startswith(b"ray::_call"):
                pids.append(int(entry))
    return pids


def test_a_worker_killed_mid_run_is_retried_and_the_output_is_whole(corpus, tmp_path, local_ray):
    run = tile_dlrm(corpus, tmp_path / "run16", 16)
    expected = convert_paths([run], tmp_path / "pool", workers=2, progress=False, warn=lambda _: None)
    killed: list[int] = []

    def kill_one() -> None:
        deadline = time.monotonic() + 60
        while not killed and time.monotonic() < deadline:
            for pid in _ray_task_pids():
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
                break
            time.sleep(0.005)

    killer = threading.Thread(target=kill_one)
    killer.start()
    result = convert_paths([run], tmp_path / "ray", executor="ray", progress=False, warn=lambda _: None)
    killer.join()
    assert killed, "no Ray task was caught running"
    assert [r.rank for r in result.ranks] == [r.rank for r in expected.ranks]
    assert _files(tmp_path / "ray") == _files(tmp_path / "pool")


def test_bad_input_on_one_rank_fails_the_run_in_one_line(corpus, tmp_path, local_ray):
    run = tile_dlrm(corpus, tmp_path / "run4", 4)
    bad = run / "worker2_step_12.pt.trace.json.gz"
    bad.write_bytes(bad.read_bytes()[:20000])  # rank 2 cut short
    out = tmp_path / "out"
    with pytest.raises(TraceFormatError, match="worker2_step_12") as failed:
        convert_paths([run], out, executor="ray", progress=False, warn=lambda _: None)
    assert "\n" not in str(failed.value)
    assert not out.exists()  # nothing written, not even the folder


def test_file_urls_on_ray(corpus, tmp_path, local_ray):
    pytest.importorskip("fsspec", reason="fsspec is not installed here")
    run = tile_dlrm(corpus, tmp_path / "run4", 4)
    convert_paths([run], tmp_path / "pool", workers=2, progress=False, warn=lambda _: None)
    convert_paths([f"file://{run}"], f"file://{tmp_path / 'ray'}", executor="ray", progress=False,
                  warn=lambda _: None)
    assert _files(tmp_path / "ray") == _files(tmp_path / "pool")
