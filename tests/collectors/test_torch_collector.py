"""The PyTorch collector on real torch (CPU): window, linking ids, failures, repeat use."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import chakra_hooks.collectors.torch as ct  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


def _names(capture: Path, rank: int = 0) -> tuple[set[str], set[str]]:
    """Op / annotation names in the host ET and in the Kineto trace of one rank."""
    et = {n["name"] for n in _load(capture / f"host_et.rank{rank}.json")["nodes"]}
    kineto = {e.get("name", "") for e in
              _load(capture / f"kineto.rank{rank}.pt.trace.json")["traceEvents"]
              if e.get("cat") in ("cpu_op", "user_annotation")}
    return et, kineto


def _run_steps(t, n: int, model=None, check=None) -> None:
    model = model or torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU())
    for i in range(n):
        with torch.profiler.record_function(f"user_step{i}"):
            model(torch.randn(4, 16)).sum().backward()
        if check:
            check(i)
        t.step()


def test_import_does_not_import_torch():
    code = "import sys, chakra_hooks.collectors.torch; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_only_the_window_is_recorded_and_ids_link(tmp_path):
    states = {}

    def check(i):  # nothing may be active outside the window
        states[i] = (torch.autograd._profiler_enabled(),
                     len(torch.nn.modules.module._global_forward_hooks))

    with ct.trace(tmp_path, steps=range(2, 4)) as t:
        _run_steps(t, 6, check=check)
    et, kineto = _names(tmp_path)
    for names in (et, kineto):
        assert {n for n in names if n.startswith("user_step")} == {"user_step2", "user_step3"}
        assert {n for n in names if n.startswith("ProfilerStep#")} == {"ProfilerStep#2",
                                                                     "ProfilerStep#3"}
    assert [i for i, (on, _) in states.items() if on] == [2, 3]
    assert all(hooks == 0 for i, (_, hooks) in states.items() if i not in (2, 3))
    assert not torch.autograd._profiler_enabled()
    # ET rf_id == Kineto "Record function id": the observer ran together with Kineto.
    et_ids = {a["value"] for n in _load(tmp_path / "host_et.rank0.json")["nodes"]
              for a in n["attrs"] if a["name"] == "rf_id"}
    k_ids = {e["args"].get("Record function id") for e in
             _load(tmp_path / "kineto.rank0.pt.trace.json")["traceEvents"]
             if e.get("cat") in ("cpu_op", "user_annotation")}
    assert len(et_ids) > 50 and len(et_ids & k_ids) >= 0.95 * len(et_ids)
    man = _load(tmp_path / "manifest.json")
    assert man["complete"] and man["steps"] == [2, 3] and man["world_size"] == 1
    assert man["ranks"] == {"0": {"host_et": "host_et.rank0.json",
                                  "kineto": "kineto.rank0.pt.trace.json"}}
    assert man["versions"]["torch"] == torch.__version__
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_exception_flushes_marks_incomplete_and_propagates(tmp_path):
    class Boom(Exception):
        pass

    err = Boom("step 3 failed")

    def check(i):
        if i == 3:
            raise err

    with pytest.raises(Boom) as caught:
        with ct.trace(tmp_path, steps=range(2, 5)) as t:
            _run_steps(t, 6, check=check)
    assert caught.value is err
    man = _load(tmp_path / "manifest.json")
    assert man["complete"] is False
    assert "Boom: step 3 failed" in man["rank_status"]["0"]["error"]
    assert man["rank_status"]["0"]["steps"] == [2, 3]
    et, kineto = _names(tmp_path)
    assert "user_step3" in et and "user_step3" in kineto and "user_step4" not in et
    assert not torch.autograd._profiler_enabled()


def test_a_second_trace_in_the_same_process(tmp_path):
    for run in ("a", "b"):
        with ct.trace(tmp_path / run, steps=range(1, 2)) as t:
            _run_steps(t, 3)
        et, kineto = _names(tmp_path / run)
        assert "user_step1" in et and "user_step1" in kineto
        assert _load(tmp_path / run / "manifest.json")["complete"]


def test_decorator_and_explicit_start_stop(tmp_path):
    model = torch.nn.Linear(8, 8)
    t = ct.trace(tmp_path / "deco", steps=[1, 2])

    @t
    def train_step(i):
        with torch.profiler.record_function(f"user_step{i}"):
            model(torch.randn(2, 8)).sum().backward()

    for i in range(4):
        train_step(i)
    et, _ = _names(tmp_path / "deco")
    assert {n for n in et if n.startswith("user_step")} == {"user_step1", "user_step2"}

    t2 = ct.trace(tmp_path / "manual", steps=range(0, 2))
    t2.start()
    _run_steps(t2, 1)
    t2.stop()  # before the window's end: flushed, incomplete
    man = _load(tmp_path / "manual" / "manifest.json")
    assert man["complete"] is False and man["steps"] == [0, 1]
    assert "before the end of the window" in man["rank_status"]["0"]["error"]


def test_another_active_profiler_is_left_alone(tmp_path, caplog):
    with torch.profiler.profile() as outer:
        with ct.trace(tmp_path, steps=range(0, 2)) as t:
            _run_steps(t, 3)
    assert any("another torch profiler is already active" in r.message for r in caplog.records)
    assert len(outer.events()) > 10  # the user's profiler kept its events
    man = _load(tmp_path / "manifest.json")
    assert man["complete"] is False and man["ranks"]["0"] == {}


def test_bad_steps_are_a_user_error():
    with pytest.raises(ValueError, match="consecutive"):
        ct.trace("unused", steps=[1, 3])
    with pytest.raises(ValueError):
        ct.trace("unused", steps=[])


def test_disk_full_is_logged_and_training_goes_on(tmp_path):
    """A real write failure: the file-size limit makes writes past 64 kB fail (EFBIG)."""
    script = textwrap.dedent(f"""
        import resource, signal, torch, logging
        logging.basicConfig()
        import chakra_hooks.collectors.torch as ct
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, resource.RLIM_INFINITY))
        model = torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(20)])
        with ct.trace({str(tmp_path)!r}, steps=range(1, 3)) as t:
            for i in range(5):
                model(torch.randn(2, 8)).sum().backward()
                t.step()
        print("TRAINING DONE")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "TRAINING DONE" in out.stdout
    assert "chakra-hooks: rank 0" in out.stderr
    man = _load(tmp_path / "manifest.json")
    assert man["complete"] is False
    assert "not written completely" in man["rank_status"]["0"]["error"]


def test_convert_at_the_end_of_the_run(tmp_path):
    from chakra_hooks.converter.etio import read_et

    with ct.trace(tmp_path, steps=range(1, 3), convert=True) as t:
        _run_steps(t, 4)
    (et,) = sorted((tmp_path / "chakra").glob("*.et"))
    names = {n.name for n in read_et(et).nodes}
    assert "aten::addmm" in names or "aten::linear" in names
