"""vLLM-specific linking without vLLM installed: engine steps on the corpus's real vLLM trace,
the annotation spellings, vLLM's collective names, and the KV sidecar's errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chakra_hooks.convert import convert_paths
from chakra_hooks.converter.etio import read_et
from chakra_hooks.common.errors import TraceFormatError
from chakra_hooks.linker.enrich import kv
from chakra_hooks.linker.enrich import engine_steps
from chakra_hooks.linker.model import CommType, OpKind
from chakra_hooks.linker.pytorch.comms import classify, kernel_collective


def _attrs(node) -> dict:
    return {a.name: getattr(a, a.WhichOneof("value")) for a in node.attr}


def test_both_annotation_spellings():
    assert engine_steps.parse("execute_context_1(40)_generation_3(3)") == {
        "prefill_requests": 1, "prefill_tokens": 40, "decode_requests": 3,
        "decode_tokens": 3, "scheduled_tokens": 43}
    detailed = ("execute_32_context_0(sq0sk0sqsq0sqsk0)_generation_32"
                "(sq32sk55086sqsq32sqsk55086)")
    assert engine_steps.parse(detailed) == {
        "prefill_requests": 0, "prefill_tokens": 0, "decode_requests": 32,
        "decode_tokens": 32, "scheduled_tokens": 32}
    for other in ("ProfilerStep#3", "execute_model", "execute_context_1(40)"):
        assert engine_steps.parse(other) is None


def test_engine_steps_on_the_corpus_vllm_trace(corpus, tmp_path):
    """vLLM's own profiler output from an MI300X (no plugin, no ET): the step annotation still
    makes an engine step, and the kernels launched inside it carry its index."""
    trace = corpus / "vllm" / "mi300x_decode_full" / "graph_execution.json.gz"
    convert_paths([trace], tmp_path, progress=False)
    nodes = read_et(tmp_path / "chakra.0.et").nodes
    steps = [_attrs(n) for n in nodes if n.name.startswith("engine_step:")]
    assert len(steps) == 1
    (step,) = steps
    assert (step["decode_requests"], step["decode_tokens"], step["prefill_tokens"]) == (32, 32, 0)
    assert step["engine_step_dur_ns"] > 0
    tagged = [n for n in nodes if "engine_step" in _attrs(n) and not n.name.startswith("engine")]
    assert tagged  # ops inside the step say so


@pytest.mark.parametrize("name, expected", [
    ("_C::shm_allreduce", CommType.ALL_REDUCE), ("_C::shm_all_gather", CommType.ALL_GATHER),
    ("vllm::all_reduce", CommType.ALL_REDUCE), ("c10d::allreduce_", CommType.ALL_REDUCE),
    ("nccl:all_gather", CommType.ALL_GATHER),
])
def test_vllm_collective_names(name, expected):
    assert classify(name) == (OpKind.COLLECTIVE, expected)


def test_custom_all_reduce_kernels_are_collectives():
    name = "void vllm::cross_device_reduce_1stage<float, 2>(vllm::RankData*, float*, int)"
    assert kernel_collective(name) == "AllReduce"
    assert kernel_collective("void at::native::vectorized_elementwise_kernel<4>()") is None


def _sidecar(tmp_path: Path, doc: object) -> Path:
    path = tmp_path / "rank0.1.kv.json"
    path.write_text(json.dumps(doc))
    return path


def _record(**changes) -> dict:
    rec = {"kind": "store", "range": "kv:save:layer0", "layer": 0, "bytes": 16384,
           "start_ns": 1, "end_ns": 2, "tid": 7}
    rec.update(changes)
    return rec


@pytest.mark.parametrize("doc, where, expected", [
    ({"format": "other", "records": []}, "top level", "chakra-hooks-kv/1"),
    ({"format": kv.KV_FORMAT, "records": {}}, "records", "a list of KV-cache records"),
    ({"format": kv.KV_FORMAT, "records": [{"kind": "store"}]}, "record 0", "keys range"),
    ({"format": kv.KV_FORMAT, "records": [_record(), _record(kind="copy")]}, "record 1",
     "kind one of"),
    ({"format": kv.KV_FORMAT, "records": [_record(bytes=-1)]}, "record 0",
     "bytes: an integer from 0"),
    ({"format": kv.KV_FORMAT, "records": [_record(layer="x")]}, "record 0",
     "layer: an integer from -1"),
])
def test_bad_kv_sidecar_names_file_and_record(tmp_path, doc, where, expected):
    path = _sidecar(tmp_path, doc)
    with pytest.raises(TraceFormatError) as err:
        kv.read_sidecar(path)
    message = str(err.value)
    assert str(path) in message and where in message and expected in message
    assert "\n" not in message


def test_truncated_kv_sidecar(tmp_path):
    path = tmp_path / "rank0.1.kv.json"
    path.write_text('{"format": "chakra-hooks-kv/1", "records": [')
    with pytest.raises(TraceFormatError, match="JSON"):
        kv.read_sidecar(path)
