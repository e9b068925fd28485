"""The vLLM plugin on real vLLM (CPU, in-process engines, tiny models with random weights):
vLLM's own profiler flags give host ET + Kineto per worker that convert into linked Chakra ETs
with engine steps, MoE routing bins and KV-cache MEM nodes."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

vllm = pytest.importorskip(
    "vllm", reason="vLLM is not installed here (its tests run in: nox -s vllm)")

from chakra_hooks.converter.etio import read_et  # noqa: E402
from chakra_hooks.converter.validate import validate  # noqa: E402
from chakra_hooks.convert import convert_paths  # noqa: E402

from fuzz_cases import FUZZ, convert_property, damage_bytes, mutate_tree  # noqa: E402
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from tiny_models import prompt  # noqa: E402

PROMPTS = [prompt(0, 40), prompt(100, 17)]
MAX_TOKENS = 6


def _attrs(node) -> dict:
    out = {}
    for a in node.attr:
        value = getattr(a, a.WhichOneof("value"))
        out[a.name] = list(value.values) if hasattr(value, "values") else value
    return out


def _profiled_llm(model: Path, folder: Path, **kwargs):
    from vllm import LLM

    profiler = {"profiler": "torch", "torch_profiler_dir": str(folder),
                "torch_profiler_with_stack": False}
    return LLM(model=str(model), enforce_eager=True, dtype="float32", max_model_len=256,
               kv_cache_memory_bytes=64 << 20, block_size=32, seed=0,
               profiler_config=profiler, **kwargs)


def _generate(llm, prompts=PROMPTS) -> list[list[int]]:
    from vllm import SamplingParams

    outputs = llm.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS, temperature=0),
                           use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs]


def _shutdown(llm) -> None:
    try:
        llm.llm_engine.engine_core.shutdown()
    except Exception:
        pass


@pytest.fixture(scope="module")
def mixtral_capture(tiny_mixtral, tmp_path_factory):
    folder = tmp_path_factory.mktemp("mixtral_capture")
    llm = _profiled_llm(tiny_mixtral, folder)
    try:
        llm.start_profile()
        _generate(llm)
        llm.stop_profile()
    finally:
        _shutdown(llm)
    out = tmp_path_factory.mktemp("mixtral_chakra")
    result = convert_paths([folder], out, progress=False)
    return folder, out, result


def test_capture_files_and_manifest(mixtral_capture):
    folder, _, _ = mixtral_capture
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["framework"] == "vllm" and manifest["complete"] is True
    files = manifest["ranks"]["0"]
    assert set(files) == {"host_et", "kineto", "routing"}
    for name in files.values():
        assert (folder / name).is_file()
    # Named after vLLM's worker, so that convert pairs them even without the manifest.
    worker = files["kineto"].split(".")[0]
    assert worker.endswith("rank0") and all(n.startswith(worker) for n in files.values())
    rank = json.loads((folder / "rank-0.manifest.json").read_text())
    assert rank["versions"]["vllm"] == vllm.__version__
    assert rank["vllm"]["tensor_parallel_size"] == 1 and "mixtral" in rank["vllm"]["model"]
    assert not [p for p in folder.iterdir() if p.name.startswith(".")]  # no temporary files


def test_host_et_links_to_kineto_by_record_function_id(mixtral_capture):
    _, out, result = mixtral_capture
    (rank,) = result.ranks
    assert rank.stats["match_rate"] >= 0.999 and rank.stats["host_matched"] > 500
    metadata = {a.name: getattr(a, a.WhichOneof("value"))
                for a in read_et(out / "chakra.0.et").metadata.attr}
    assert metadata["match_strategy"] == "record_function_id"


def _nodes(out: Path) -> list:
    return read_et(out / "chakra.0.et").nodes


def test_engine_steps_and_routing_bins(mixtral_capture, tiny_mixtral):
    folder, out, _ = mixtral_capture
    config = json.loads((tiny_mixtral / "config.json").read_text())
    experts, top_k, layers = (config["num_local_experts"], config["num_experts_per_tok"],
                              config["num_hidden_layers"])
    nodes = _nodes(out)
    steps = {a["engine_step"]: a for n in nodes if n.name.startswith("engine_step:")
             for a in [_attrs(n)]}
    manifest = json.loads((folder / "manifest.json").read_text())
    assert sorted(steps) == manifest["steps"] and len(steps) >= MAX_TOKENS
    # One prefill step holding both prompts, then decode steps of one token per request.
    prompt_tokens = sum(len(p.split()) for p in PROMPTS)
    assert steps[0]["prefill_tokens"] == prompt_tokens and steps[0]["prefill_requests"] == 2
    assert all(steps[i]["decode_tokens"] == 2 for i in range(1, MAX_TOKENS))
    routing = [_attrs(n) for n in nodes if n.name.startswith("moe_routing:")]
    assert len(routing) == layers * len(steps)
    for r in routing:
        assert r["moe_num_experts"] == experts and len(r["moe_expert_tokens"]) == experts
        # Every token of the step routed to top_k experts, in every layer.
        assert r["moe_tokens"] == steps[r["moe_step"]]["scheduled_tokens"]
        assert sum(r["moe_expert_tokens"]) == r["moe_tokens"] * top_k
    tagged = [a for n in nodes for a in [_attrs(n)] if "engine_step" in a
              and not n.name.startswith("engine_step:")]
    assert {a["engine_step"] for a in tagged} == set(steps)


def test_outputs_pass_both_readers(mixtral_capture, reference_reader, tmp_path):
    folder, out, _ = mixtral_capture
    et = read_et(out / "chakra.0.et")
    assert validate("chakra.0.et", et.metadata, et.nodes).ok
    ref_metadata, ref_nodes = reference_reader(out / "chakra.0.et")
    assert len(ref_nodes) == len(et.nodes)
    convert_paths([folder], tmp_path / "astra", target="astra-sim", progress=False)
    et = read_et(tmp_path / "astra" / "chakra.0.et")
    report = validate("chakra.0.et", et.metadata, et.nodes, target="astra-sim")
    assert report.ok, report


def _store_then_load(model: Path, folder: Path, transfer) -> tuple[list, list]:
    """One prompt, the prefix cache emptied, the same prompt again (its KV now comes back
    from the connector), all inside the profiling window: (first tokens, second tokens)."""
    llm = _profiled_llm(model, folder, kv_transfer_config=transfer,
                        disable_hybrid_kv_cache_manager=True)
    try:
        llm.start_profile()
        first = _generate(llm, PROMPTS[:1])
        llm.reset_prefix_cache()
        again = _generate(llm, PROMPTS[:1])
        llm.stop_profile()
    finally:
        _shutdown(llm)
    return first, again


@pytest.fixture(scope="module")
def kv_capture(tiny_llama, tmp_path_factory) -> tuple[Path, list, list]:
    """A capture through ChakraKVConnector around ExampleConnector: store, then load."""
    tmp = tmp_path_factory.mktemp("kv")
    store = {"shared_storage_path": str(tmp / "kv")}
    transfer = _kv_config({"kv_connector": "ExampleConnector", "kv_role": "kv_both",
                           "kv_connector_extra_config": store})
    folder = tmp / "capture"
    first, again = _store_then_load(tiny_llama, folder, transfer)
    return folder, first, again


def test_kv_connector_store_then_load(tiny_llama, kv_capture, tmp_path):
    config = json.loads((tiny_llama / "config.json").read_text())
    head = config["hidden_size"] // config["num_attention_heads"]
    slot_bytes = 2 * config["num_key_value_heads"] * head * 4  # K and V, fp32
    block = 32
    folder, first, again = kv_capture
    assert first == again  # the KV loaded back gives the same greedy tokens
    convert_paths([folder], tmp_path / "chakra", progress=False)
    nodes = _nodes(tmp_path / "chakra")
    by_id = {n.id: n for n in nodes}
    stores = [n for n in nodes if n.type == 3]  # MEM_STORE_NODE
    loads = [n for n in nodes if n.type == 2]  # MEM_LOAD_NODE
    # ExampleConnector keeps whole blocks of the prompt: 40 tokens -> one block of 32 slots.
    stored_slots = (len(PROMPTS[0].split()) // block) * block
    assert len(stores) == config["num_hidden_layers"]
    for n in stores:
        a = _attrs(n)
        assert a["tensor_size"] == stored_slots * slot_bytes and a["kv_step"] == 0
        (attention,) = [by_id[d] for d in n.data_deps]
        assert attention.name == "vllm::unified_attention_with_output"
        assert "kv_excluded_ns" in _attrs(attention)
    (load,) = loads
    a = _attrs(load)
    assert a["tensor_size"] == stored_slots * slot_bytes * config["num_hidden_layers"]
    assert a["kv_step"] > 0 and a["kv_connector"] == "ExampleConnector"
    from chakra_hooks.converter.summary import summarize

    et = read_et(tmp_path / "chakra" / "chakra.0.et")
    shown = summarize("chakra.0.et", et.metadata, et.nodes).kv
    assert shown == {"loads": 1, "stores": len(stores), "load_bytes": a["tensor_size"],
                     "store_bytes": sum(_attrs(n)["tensor_size"] for n in stores)}


@FUZZ
@given(data=st.data())
def test_damaged_kv_sidecar(kv_capture, tmp_path_factory, data):
    """The KV sidecar of the real capture, damaged (a record's field set to a hostile value,
    records dropped or duplicated, bytes cut or flipped): a success or one error line."""
    import shutil

    folder = tmp_path_factory.mktemp("kvfuzz") / "capture"
    shutil.copytree(kv_capture[0], folder)
    (path,) = folder.glob("*.kv.json")
    if data.draw(st.booleans()):
        path.write_text(json.dumps(mutate_tree(json.loads(path.read_text()), data)))
    else:
        path.write_bytes(damage_bytes(path.read_bytes(), data))
    convert_property(folder, folder.parent / "out")


def test_plugin_inactive_without_profiler(tiny_llama, tmp_path, monkeypatch):
    from vllm import LLM

    monkeypatch.chdir(tmp_path)
    llm = LLM(model=str(tiny_llama), enforce_eager=True, dtype="float32", max_model_len=256,
              kv_cache_memory_bytes=64 << 20, seed=0)
    try:
        tokens = _generate(llm)
    finally:
        _shutdown(llm)
    assert all(len(t) == MAX_TOKENS for t in tokens)
    assert list(tmp_path.iterdir()) == []  # nothing of ours anywhere near


def _wrapper(folder: str):
    """vLLM's own worker profiler object, as a worker builds it."""
    from vllm.config import ProfilerConfig
    from vllm.profiler.wrapper import TorchProfilerWrapper

    from chakra_hooks.collectors.vllm import register

    register()  # what vLLM's plugin loader ran in this process already; idempotent
    config = ProfilerConfig(profiler="torch", torch_profiler_dir=folder,
                            torch_profiler_with_stack=False)
    return TorchProfilerWrapper(config, worker_name="rank0", local_rank=0, activities=["CPU"])


def test_stop_without_start_does_nothing(tmp_path):
    wrapper = _wrapper(str(tmp_path / "never"))
    wrapper.stop()
    assert not (tmp_path / "never").exists()


def test_remote_profiler_folder_is_left_to_vllm(caplog, tmp_path, monkeypatch):
    import torch

    monkeypatch.chdir(tmp_path)  # torch's trace handler writes "s3:/..." as a local path
    wrapper = _wrapper("s3://bucket/traces")
    with caplog.at_level(logging.WARNING, logger="chakra_hooks.collectors.vllm"):
        wrapper._start()  # vLLM's own start; ours must step aside
        try:
            assert "execution_trace_observer" not in wrapper._profiler_kwargs
            assert wrapper._chakra_capture is None
            torch.ones(2).sum()
        finally:
            wrapper.profiler.stop()
    assert any("not a local path" in r.message for r in caplog.records)


def test_unwritable_folder_keeps_vllm_serving(tmp_path, caplog):
    import torch

    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    wrapper = _wrapper(str(blocker / "traces"))
    with caplog.at_level(logging.WARNING, logger="chakra_hooks.collectors.vllm"):
        wrapper.start()  # vLLM's public path: its own failures are logged, not raised
        torch.ones(4).sum()
        wrapper.stop()
    messages = [r.message for r in caplog.records if "chakra-hooks" in r.message]
    assert messages and any("ET observer" in m for m in messages)
    assert blocker.read_text() == "not a folder"


TP_SCRIPT = """
import os, sys
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "0|1"
from vllm import LLM, SamplingParams

if __name__ == "__main__":
    llm = LLM(model=sys.argv[1], tensor_parallel_size=2, enforce_eager=True, dtype="float32",
              max_model_len=256, kv_cache_memory_bytes=64 << 20, block_size=32,
              profiler_config={"profiler": "torch", "torch_profiler_dir": sys.argv[2],
                               "torch_profiler_with_stack": False})
    llm.start_profile()
    llm.generate([" ".join(f"w{i}" for i in range(40))],
                 SamplingParams(max_tokens=3, temperature=0), use_tqdm=False)
    llm.stop_profile()
"""


@pytest.mark.slow
def test_tensor_parallel_workers_record_and_agree(tiny_llama, tmp_path):
    """Two worker processes (vLLM loads the plugin in each): two ranks whose collectives
    (vLLM's shared-memory all-reduce / all-gather on CPU) agree in type, size and order."""
    import subprocess
    import sys

    script = tmp_path / "tp2.py"
    script.write_text(TP_SCRIPT)
    folder = tmp_path / "capture"
    run = subprocess.run([sys.executable, str(script), str(tiny_llama), str(folder)],
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["complete"] and sorted(manifest["ranks"]) == ["0", "1"]
    result = convert_paths([folder], tmp_path / "chakra", target="astra-sim", progress=False)
    assert [r.rank for r in result.ranks] == [0, 1]
    plans = []
    for rank in (0, 1):
        et = read_et(tmp_path / "chakra" / f"chakra.{rank}.et")
        assert validate(f"chakra.{rank}.et", et.metadata, et.nodes, target="astra-sim").ok
        plans.append([(n.name, a["comm_type"], a["comm_size"]) for n in et.nodes if n.type == 7
                      for a in [_attrs(n)]])
    assert plans[0] == plans[1] and len(plans[0]) >= 2 * 2  # per layer, per step
    names = {name for name, _, _ in plans[0]}
    # vLLM's shared-memory communicator needs its _C ops (built for AVX-512 machines); without
    # them it falls back to torch.distributed (gloo), as its log says: c10d collectives then.
    assert ("_C::shm_allreduce" if _vllm_has_shm_ops() else "c10d::allreduce_") in names
    assert all(size > 0 for _, _, size in plans[0])


def _vllm_has_shm_ops() -> bool:
    import torch
    import vllm._custom_ops  # noqa: F401 (loads vLLM's _C ops where this machine can)

    return hasattr(torch.ops._C, "init_shm_manager")


def _kv_config(child: dict):
    from vllm.config import KVTransferConfig

    return KVTransferConfig(kv_connector="ChakraKVConnector",
                            kv_connector_module_path="chakra_hooks.collectors.vllm.kv",
                            kv_role="kv_both", kv_connector_extra_config={"connectors": [child]})


def test_kv_measuring_failure_leaves_transfers_alone(tiny_llama, tmp_path, caplog):
    child = {"kv_connector": "UnmeasurableConnector", "kv_connector_module_path": "connectors",
             "kv_role": "kv_both",
             "kv_connector_extra_config": {"shared_storage_path": str(tmp_path / "kv")}}
    folder = tmp_path / "capture"
    with caplog.at_level(logging.WARNING, logger="chakra_hooks.collectors.vllm"):
        first, again = _store_then_load(tiny_llama, folder, _kv_config(child))
    assert first == again and len(first[0]) == MAX_TOKENS
    assert list((tmp_path / "kv").rglob("*.safetensors"))  # the child still saved its KV
    warnings = [r.message for r in caplog.records if "KV-cache records off" in r.message]
    assert len(warnings) == 1  # logged once, not per call
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["complete"] and "kv" not in manifest["ranks"]["0"]


def test_full_disk_keeps_vllm_serving(tiny_llama, tmp_path, caplog):
    import subprocess

    folder = tmp_path / "small"
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=128k", "tmpfs", str(folder)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs to fill up: {mounted.stderr.strip()}")
    try:
        llm = _profiled_llm(tiny_llama, folder)
        try:
            with caplog.at_level(logging.WARNING, logger="chakra_hooks.collectors.vllm"):
                llm.start_profile()
                _generate(llm)
                llm.stop_profile()
            after = _generate(llm)  # still serving
        finally:
            _shutdown(llm)
        assert all(len(t) == MAX_TOKENS for t in after)
        assert any("host ET" in r.message for r in caplog.records)
        # Nothing half-written of ours: no temporary file, no truncated ET left behind.
        assert not [p for p in folder.iterdir() if p.name.startswith(".")]
        assert not list(folder.glob("*.et.json*"))
    finally:
        subprocess.run(["umount", str(folder)], check=False)


def test_the_example_runs_end_to_end(tmp_path):
    import subprocess
    import sys

    example = Path(__file__).resolve().parents[2] / "examples" / "vllm_tiny_moe.py"
    run = subprocess.run([sys.executable, str(example), str(tmp_path)], capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "== again: True" in run.stdout and "critical path" in run.stdout
    kinds = {n.type for n in read_et(tmp_path / "chakra" / "chakra.0.et").nodes}
    assert {2, 3} <= kinds  # MEM_LOAD and MEM_STORE from the KV connector


def test_shared_captures_reveal_no_names(mixtral_capture, kv_capture, tmp_path):
    """`chakra-hooks share` on vLLM's outputs: no word or id of the capture (request ids,
    model and layer names, the connector's) is in the shared files; KV bytes and MoE bins
    are kept."""
    from chakra_hooks.converter.share import Options, check, share_run

    key = b"0123456789abcdef" * 4
    folder, out, _ = mixtral_capture
    kv_folder = kv_capture[0]
    convert_paths([kv_folder], tmp_path / "kv", progress=False)
    for source, converted in ((folder, out), (kv_folder, tmp_path / "kv")):
        shared = tmp_path / f"shared_{converted.name}"
        share_run(converted, shared, key, Options())
        found = check(shared, [source])
        assert not found.leaks and found.searched > 50, found.leaks[:5]
        for before, after in zip(_nodes(converted), _nodes(shared)):
            kept = ("tensor_size", "moe_expert_tokens", "kv_step", "comm_size")
            assert {k: v for k, v in _attrs(before).items() if k in kept} == \
                {k: v for k, v in _attrs(after).items() if k in kept}
