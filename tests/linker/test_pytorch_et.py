"""PyTorch host ET reader: every schema layout in the corpus plus a live torch 2.13 trace."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from chakra_hooks.common.errors import TraceFormatError
from chakra_hooks.linker.model import CommType
from chakra_hooks.linker.pytorch.comms import classify, from_record_param_comms
from chakra_hooks.linker.pytorch.et import USER_SCOPE, read_host_et, tensor_bytes


def test_schema_1_0_1_flat_layout(corpus: Path) -> None:
    et = read_host_et(corpus / "pytorch/a100_simple_add/host_et.json.gz")
    assert et.schema == "1.0.1" and len(et.nodes) == 38 and not et.warnings
    add = next(n for n in et.nodes if n.name == "aten::add")
    assert add.inputs.types[0] == "Tensor(float)" and add.inputs.shapes[0] == [256, 256]
    assert tensor_bytes(add.inputs.values[0]) == 256 * 256 * 4
    assert [r.name for r in et.thread_roots()] == ["[pytorch|profiler|execution_trace|thread]"]
    assert [n.id for n in et.nodes] == sorted(n.id for n in et.nodes)


def test_schema_1_0_3_attrs_layout_and_record_param_comms(corpus: Path) -> None:
    et = read_host_et(corpus / "pytorch/a100_resnet_nccl/host_et.json.gz")
    assert et.schema == "1.0.3-chakra.0.0.4" and len(et.nodes) == 14391
    rpc = [n for n in et.nodes if n.name == "record_param_comms"]
    assert len(rpc) == 27
    metas = [from_record_param_comms(n) for n in rpc]
    real = [m for m in metas if m.name != "wait"]
    assert Counter(m.name for m in real) == {"allreduce": 15, "broadcast": 6}
    assert all(m.in_bytes > 0 and m.pg_name == "0" for m in real)
    # The ResNet's largest bucket: 7,875,584 floats.
    assert max(m.in_bytes for m in real) == 31_502_336
    step = next(n for n in et.nodes if n.name.startswith("ProfilerStep#"))
    assert step.scope == USER_SCOPE and step.children and step.rf_id


def test_old_dlrm_all_to_allv_splits(corpus: Path) -> None:
    et = read_host_et(corpus / "pytorch/v100_dlrm_8rank/dlrm_eg_0.json.gz")
    metas = [from_record_param_comms(n) for n in et.nodes if n.name == "record_param_comms"]
    a2av = [m for m in metas if m.name == "all_to_allv"]
    assert len(a2av) == 4
    uneven = next(m for m in a2av if len(set(m.in_split)) > 1)
    assert sum(uneven.in_split) * 4 == uneven.in_bytes
    assert classify("all_to_allv") == classify("c10d::alltoall_base_")
    assert classify("all_to_allv")[1] == CommType.ALL_TO_ALL


@pytest.mark.slow
def test_live_torch_trace_schema_1_1_1(gloo_traces: Path) -> None:
    et = read_host_et(gloo_traces / "et_rank0.json")
    assert et.schema.startswith("1.1.1") and not et.warnings
    names = Counter(n.name for n in et.nodes)
    assert names["c10d::allreduce_"] == 6 and names["## process_group:init ##"] == 1
    ar = next(n for n in et.nodes if n.name == "c10d::allreduce_")
    assert ar.rf_id > 0 and ar.tid > 0 and "op_schema" not in ar.attrs


@pytest.mark.parametrize("content, where", [
    (b'{"schema": "1.0.1", "nodes": [', "byte"),
    (b'{"schema": "1.0.1", "nodes": []}', "nodes"),
    (b'{"schema": "1.0.1"}', "top level"),
    (b'{"schema": "1.0.1", "nodes": [{"id": 1}]}', "nodes[0]"),
])
def test_bad_et_is_one_line_error(tmp_path: Path, content: bytes, where: str) -> None:
    path = tmp_path / "et.json"
    path.write_bytes(content)
    with pytest.raises(TraceFormatError) as info:
        read_host_et(path)
    assert "\n" not in str(info.value) and str(path) in str(info.value)
    assert where in str(info.value)


def test_unknown_schema_warns(tmp_path: Path) -> None:
    path = tmp_path / "et.json"
    path.write_bytes(b'{"schema": "9.9", "nodes": [{"id": 1, "name": "[pytorch|profiler|'
                     b'execution_trace|process]", "ctrl_deps": 1, "attrs": []}]}')
    et = read_host_et(path)
    assert et.warnings and "9.9" in et.warnings[0]


def test_bad_attrs_named_by_node_past_first_chunk(tmp_path: Path) -> None:
    """Attrs are decoded many nodes at a time: a bad list still names its own node."""
    from chakra_hooks.linker.pytorch.et import CHUNK
    root = b'{"id": 1, "name": "[pytorch|profiler|execution_trace|process]", "ctrl_deps": 1}'
    good = b'{"id": %d, "name": "aten::add", "ctrl_deps": 1, "attrs": [{"name": "rf_id", ' \
           b'"type": "uint64", "value": 3}]}'
    bad_index = CHUNK + 3
    nodes = [root] + [good % i for i in range(2, bad_index + 1)]
    nodes.append(b'{"id": 99999, "name": "aten::mul", "ctrl_deps": 1, "attrs": [{"name": 5}]}')
    path = tmp_path / "bad_attrs.json"
    path.write_bytes(b'{"schema": "1.0.3", "nodes": [' + b",".join(nodes) + b"]}")
    with pytest.raises(TraceFormatError) as info:
        read_host_et(path)
    message = str(info.value)
    assert f"nodes[{bad_index}] (id 99999)" in message and "attrs" in message
    assert "\n" not in message


def test_standard_attrs_in_any_order_and_with_other_attrs(tmp_path: Path) -> None:
    """Standard attrs are read by name whatever their order; other attrs are kept."""
    root = b'{"id": 1, "name": "[pytorch|profiler|execution_trace|process]", "ctrl_deps": 1}'
    shuffled = (b'{"id": 2, "name": "aten::add", "ctrl_deps": 1, "attrs": ['
                b'{"name": "tid", "type": "uint64", "value": 4},'
                b'{"name": "op_schema", "type": "string", "value": "x"},'
                b'{"name": "rf_id", "type": "uint64", "value": 9},'
                b'{"name": "scope", "type": "uint64", "value": 7},'
                b'{"name": "seq_id", "type": "int64", "value": 12}]}')
    extra = (b'{"id": 3, "name": "record_param_comms", "ctrl_deps": 1, "attrs": ['
             b'{"name": "rf_id", "type": "uint64", "value": 5},'
             b'{"name": "pg_name", "type": "string", "value": "0"}]}')
    path = tmp_path / "et.json"
    path.write_bytes(b'{"schema": "1.1.1", "nodes": [' + b",".join((root, shuffled, extra))
                     + b"]}")
    nodes = read_host_et(path).by_id
    add, rpc = nodes[2], nodes[3]
    assert (add.rf_id, add.seq_id, add.tid, add.scope, add.attrs) == (9, 12, 4, 7, {})
    assert (rpc.rf_id, rpc.seq_id, rpc.tid, rpc.scope) == (5, -1, 0, 0)
    assert rpc.attrs == {"pg_name": "0"}


@pytest.mark.parametrize("rel", ["pytorch/a100_simple_add/host_et.json.gz",
                                 "pytorch/a100_resnet_nccl/host_et.json.gz",
                                 "pytorch/v100_dlrm_8rank/dlrm_eg_0.json.gz"])
def test_texts_kept_in_chunks_are_each_nodes_own(corpus: Path, rel: str) -> None:
    # release_raw decodes the kept nodes' inputs / outputs a chunk at a time: each node must
    # end up with what it would read itself, in either layout.
    et = read_host_et(corpus / rel)
    own = {n.id: (n.io_text(), n.io_text(outputs=True)) for n in et.nodes}
    et.release_raw(list(et.nodes), [])
    assert {n.id: (n.io_text(), n.io_text(outputs=True)) for n in et.nodes} == own


@pytest.mark.parametrize("rel", ["pytorch/a100_simple_add/host_et.json.gz",
                                 "pytorch/a100_resnet_nccl/host_et.json.gz",
                                 "pytorch/rtx2080_linear/host_et.json.gz",
                                 "pytorch/v100_dlrm_8rank/dlrm_eg_3.json.gz"])
def test_tensor_ids_one_per_tensor_type_from_raw_and_kept_text(corpus: Path, rel: str) -> None:
    """Data edges follow the tensor ids of a node's inputs and outputs: one id per tensor the
    ET's ``types`` name ("Tensor(float)", "GenericList[Tensor(float),Tensor(float)]"), the
    same read from the raw file as from the text kept once the file's bytes are released."""
    et = read_host_et(corpus / rel)
    from_raw = {n.id: (n.tensor_ids(), n.tensor_ids(outputs=True)) for n in et.nodes}
    with_tensors = 0
    for node in et.nodes:
        for outputs in (False, True):
            ids = from_raw[node.id][outputs]
            assert all(type(i) is int for i in ids)
            assert len(ids) == node.io_text(outputs)[2].count(b"Tensor("), (node.id, outputs)
            with_tensors += bool(ids)
    assert with_tensors > len(et.nodes) // 4
    et.release_raw(et.nodes, [])
    assert {n.id: (n.tensor_ids(), n.tensor_ids(outputs=True)) for n in et.nodes} == from_raw
