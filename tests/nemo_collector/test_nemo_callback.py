"""ChakraTraceCallback on real Lightning and NeMo 2 (CPU): a tiny Hugging Face Mixtral trained
by 2 ``ddp`` ranks with gradient accumulation, through plain Lightning, ``ddp_spawn`` and NeMo's
``nl.Trainer`` with the callback from ``run.Config``; failures and bad settings in-process."""

from __future__ import annotations

import collections
import copy
import json
import logging
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip(
    "lightning", reason="Lightning / NeMo are not installed here (their tests run in: nox -s nemo)")
torch = pytest.importorskip("torch")

from chakra_hooks.collectors.nemo import ChakraTraceCallback  # noqa: E402
from chakra_hooks.convert import convert_paths  # noqa: E402
from chakra_hooks.converter.etio import read_et  # noqa: E402
from chakra_hooks.converter.validate import validate  # noqa: E402

HERE = Path(__file__).resolve().parent
JOB = HERE / "lightning_job.py"
sys.path.insert(0, str(HERE))
import lightning_job as job  # noqa: E402

WINDOW = [job.START + i for i in range(job.NUM)]


def _run_job(out: Path, strategy: str, *extra: str) -> None:
    run = subprocess.run([sys.executable, str(JOB), str(out), strategy, *extra],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]


def _step_annotations(path: Path, key: str) -> set[str]:
    doc = json.loads(path.read_text())
    names = (e.get("name", "") for e in doc[key])
    return {n for n in names if n.startswith("ProfilerStep#")}


def _check_capture(out: Path, ranks=(0, 1)) -> None:
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["complete"] and manifest["steps"] == WINDOW
    expected = {f"ProfilerStep#{s}" for s in WINDOW}
    for rank in ranks:
        kineto = out / f"kineto.rank{rank}.pt.trace.json"
        assert _step_annotations(kineto, "traceEvents") == expected
        assert _step_annotations(out / f"host_et.rank{rank}.json", "nodes") == expected
        # Tokens routed per layer and optimizer step: every micro-batch of the step, top-k each.
        per = collections.defaultdict(int)
        for rec in json.loads((out / f"routing.rank{rank}.json").read_text())["records"]:
            assert sum(rec["bins"]) == rec["tokens"] * rec["top_k"]
            per[(rec["step"], rec["layer"])] += rec["tokens"]
        tokens = job.MICRO_BATCH * job.SEQ * job.ACCUMULATE
        assert per == {(s, layer): tokens for s in WINDOW for layer in range(job.LAYERS)}


@pytest.fixture(scope="module")
def ddp_capture(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ddp")
    _run_job(out, "ddp")
    return out


def test_ddp_window_counts_optimizer_steps(ddp_capture):
    _check_capture(ddp_capture)


def test_ddp_capture_converts_and_agrees_across_ranks(ddp_capture, tmp_path):
    result = convert_paths([ddp_capture], tmp_path, target="astra-sim", progress=False)
    assert [r.rank for r in result.ranks] == [0, 1]
    plans = []
    for rank in (0, 1):
        et = read_et(tmp_path / f"chakra.{rank}.et")
        assert validate(f"chakra.{rank}.et", et.metadata, et.nodes, target="astra-sim").ok
        plans.append([(n.name, n.attr) for n in et.nodes if n.type == 7])
    sizes = [[{a.name: a for a in attrs}["comm_size"].int64_val for _, attrs in p] for p in plans]
    assert sizes[0] == sizes[1] and sizes[0]  # DDP's gradient all-reduces, the same on both


def test_ddp_spawn_pickles_the_callback(tmp_path):
    _run_job(tmp_path, "ddp_spawn")
    _check_capture(tmp_path)


def test_nemo_trainer_with_run_config(tmp_path):
    pytest.importorskip("nemo.lightning", reason="NeMo 2 is not installed here")
    pytest.importorskip("nemo_run", reason="nemo_run is not installed here")
    _run_job(tmp_path, "ddp", "--nemo")
    _check_capture(tmp_path)


def test_plain_values_pickle_and_deepcopy():
    callback = ChakraTraceCallback("runs/x", start_step=3, num_steps=2, ranks=[0])
    for clone in (pickle.loads(pickle.dumps(callback)), copy.deepcopy(callback)):
        assert (clone.output_dir, clone.start_step, clone.end_step, clone.ranks) == \
            ("runs/x", 3, 5, [0])


def _fit_in_process(callback, fail_at=None) -> None:
    import lightning.pytorch as pl

    trainer = pl.Trainer(callbacks=[callback], **job.trainer_kwargs("auto", 1))
    trainer.fit(job.TinyMixtral(fail_at), job.loader())


def test_exception_in_window_reaches_the_caller(tmp_path):
    from torch.profiler import ExecutionTraceObserver

    callback = ChakraTraceCallback(tmp_path, start_step=job.START, num_steps=job.NUM)
    with pytest.raises(ValueError, match="planned failure at step 3"):
        _fit_in_process(callback, fail_at=3)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["complete"] is False
    assert "planned failure" in manifest["rank_status"]["0"]["error"]
    assert not torch.autograd._profiler_enabled()  # no profiler left running
    probe = ExecutionTraceObserver().register_callback(str(tmp_path / "probe.json"))
    assert probe.is_registered  # and no observer left registered
    probe.unregister_callback()


def test_side_by_side_with_nemo_profiler_callback(tmp_path):
    """NeMo's own callback keeps one step of the window in its device trace; ours all."""
    callbacks = pytest.importorskip("nemo.lightning.pytorch.callbacks",
                                    reason="NeMo 2 is not installed here")
    theirs = tmp_path / "nemo"
    theirs.mkdir()
    nemo_callback = callbacks.PytorchProfilerCallback(
        start_step=job.START, end_step=job.START + job.NUM - 1, trace_dir=str(theirs),
        profiler_kwargs={"activities": [torch.profiler.ProfilerActivity.CPU]})
    _fit_in_process(nemo_callback)
    ours = tmp_path / "ours"
    _fit_in_process(ChakraTraceCallback(ours, start_step=job.START, num_steps=job.NUM))
    ours_steps = _step_annotations(ours / "kineto.rank0.pt.trace.json", "traceEvents")
    theirs_steps = _step_annotations(theirs / "device" / "rank-0.json", "traceEvents")
    assert len(ours_steps) == job.NUM
    assert len(theirs_steps) < len(ours_steps)


@pytest.mark.parametrize("settings, expected", [
    ({"start_step": 50}, "before the window"),
    ({"ranks": [7]}, "name no rank"),
])
def test_window_or_ranks_that_record_nothing_warn(tmp_path, caplog, settings, expected):
    callback = ChakraTraceCallback(tmp_path / "out", **{"start_step": 2, **settings})
    with caplog.at_level(logging.WARNING, logger="chakra_hooks.collectors.nemo"):
        _fit_in_process(callback)
    assert any(expected in r.message for r in caplog.records)
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").glob("*.json"))


def test_unwritable_output_folder_leaves_training_alone(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    callback = ChakraTraceCallback(blocker / "traces", start_step=job.START, num_steps=job.NUM)
    with caplog.at_level(logging.WARNING, logger="chakra_hooks.collectors.torch"):
        _fit_in_process(callback)  # trains to the end
    assert any("chakra-hooks" in r.message for r in caplog.records)
    assert blocker.read_text() == "not a folder"


def test_builds_from_a_yaml_target():
    """NeMo 2 configs name callbacks by ``_target_`` (Hydra instantiation)."""
    hydra = pytest.importorskip("hydra.utils", reason="Hydra is not installed here")
    omegaconf = pytest.importorskip("omegaconf")
    config = omegaconf.OmegaConf.create(
        "_target_: chakra_hooks.collectors.nemo.ChakraTraceCallback\n"
        "output_dir: runs/yaml\nstart_step: 5\nnum_steps: 3\nranks: [0, 1]\n")
    callback = hydra.instantiate(config)
    assert isinstance(callback, ChakraTraceCallback)
    assert (callback.start_step, callback.end_step, list(callback.ranks)) == (5, 8, [0, 1])


def test_shared_capture_reveals_no_names(ddp_capture, tmp_path):
    """`chakra-hooks share` on the NeMo callback's capture: no word or id of it (module and
    file names, hosts, pids) is in the shared files, and the collectives are kept."""
    from chakra_hooks.converter.share import Options, check, share_run

    convert_paths([ddp_capture], tmp_path / "out", target="astra-sim", progress=False)
    share_run(tmp_path / "out", tmp_path / "shared", b"0123456789abcdef" * 4, Options())
    found = check(tmp_path / "shared", [ddp_capture])
    assert not found.leaks and found.searched > 50, found.leaks[:5]
    for rank in (0, 1):
        before = read_et(tmp_path / "out" / f"chakra.{rank}.et").nodes
        after = read_et(tmp_path / "shared" / f"chakra.{rank}.et").nodes
        assert [(n.type, n.duration_micros, list(n.ctrl_deps)) for n in before] == \
            [(n.type, n.duration_micros, list(n.ctrl_deps)) for n in after]
