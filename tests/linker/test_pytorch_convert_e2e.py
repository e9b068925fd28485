"""PyTorch corpus end to end at the linker/converter seam: link -> build_graph -> validate,
written and read back by the reference MLCommons reader."""

from __future__ import annotations

import glob
from collections import Counter
from pathlib import Path

import pytest

from chakra_hooks.converter import etio
from chakra_hooks.converter.graph import build_graph
from chakra_hooks.converter.summary import summarize
from chakra_hooks.converter.validate import validate
from chakra_hooks.linker.model import OpKind
from chakra_hooks.linker.pytorch.link import link

PAIRS = {
    "resnet": ("pytorch/a100_resnet_nccl/host_et.json.gz", "pytorch/a100_resnet_nccl/kineto.json.gz"),
    "simple_add": ("pytorch/a100_simple_add/host_et.json.gz",
                   "pytorch/a100_simple_add/kineto.json.gz"),
    "rtx2080": ("pytorch/rtx2080_linear/host_et.json.gz", "pytorch/rtx2080_linear/kineto.json.gz"),
    "dlrm3": ("pytorch/v100_dlrm_8rank/dlrm_eg_3.json.gz",
              "pytorch/v100_dlrm_8rank/worker3_step_12.*.pt.trace.json.gz"),
    "sampled": (None, "kineto_only/sampled_rank-1.json.gz"),
    "vllm": (None, "vllm/mi300x_decode_full/graph_execution.json.gz"),
    "ref_linked": ("chakra_reference/a100_resnet_nccl.ref_linked.json.gz", None),
}


def _path(corpus: Path, rel: str | None) -> Path | None:
    return None if rel is None else Path(glob.glob(str(corpus / rel))[0])


@pytest.mark.parametrize("name", sorted(PAIRS))
@pytest.mark.parametrize("target", ["full", "astra-sim"])
def test_corpus_converts_and_validates(corpus: Path, tmp_path: Path, name: str,
                                       target: str, reference_reader) -> None:
    et, kineto = PAIRS[name]
    trace = link(_path(corpus, et), _path(corpus, kineto))
    graph = build_graph(trace, target)
    report = validate(name, graph.metadata, graph.nodes,
                      "astra-sim" if target == "astra-sim" else "chakra")
    assert report.ok, report.counts()
    # The node bytes we write ourselves (converter/wire.py) are protobuf's own encoding.
    assert all(node.SerializeToString() == body for node, body in zip(graph.nodes, graph.bodies))
    # What the converter counted as it wrote is what inspect counts in the decoded nodes.
    assert (graph.tally.summary(f"{name}.0.et", graph.version, graph.metadata_values)
            == summarize(f"{name}.0.et", graph.metadata, graph.nodes))
    # The metadata bytes we write ourselves are protobuf's own encoding too.
    assert graph.metadata.SerializeToString() == graph.metadata_body
    out = tmp_path / f"{name}.0.et"
    etio.write_et(out, graph.metadata, graph.bodies)
    assert len(reference_reader(out)[1]) == len(graph.nodes)
    if target == "full":
        # Every op becomes a node, and device time survives rounding (within 0.1 %).
        assert len(graph.nodes) == len(trace.ops)
        device_ps = trace.stats["device_time_ps"]
        device = [n for n, op in zip(graph.nodes, trace.ops)
                  if op.on_device and op.lane.startswith("stream:")]
        device_us = sum(n.duration_micros for n in device)
        # Rounding moves each node by at most half a microsecond.
        assert abs(device_us * 10**6 - device_ps) <= max(0.001 * device_ps,
                                                          len(device) * 500_000)


def test_resnet_astra_sim_keeps_collectives(corpus: Path) -> None:
    et, kineto = PAIRS["resnet"]
    trace = link(_path(corpus, et), _path(corpus, kineto))
    graph = build_graph(trace, "astra-sim")
    assert Counter(n.type for n in graph.nodes).most_common()  # non-empty
    colls = [op for op in trace.ops if op.kind == OpKind.COLLECTIVE]
    from chakra_hooks.converter.schema import NodeType

    assert sum(n.type == NodeType.Value("COMM_COLL_NODE") for n in graph.nodes) == len(colls)
