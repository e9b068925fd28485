"""``stats`` and the gap nodes on the real corpus: the critical path agrees with a second,
independent computation, and with gaps the ETs replay to the span that was measured."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from chakra_hooks.cli import cli
from chakra_hooks.convert import convert_paths
from chakra_hooks.converter.etio import read_et
from chakra_hooks.converter.attrs import attr_dict, value_of
from chakra_hooks.converter.schema import NodeType
from chakra_hooks.converter.run_model import node_times
from chakra_hooks.converter.stats import rank_stats
from chakra_hooks.linker.enrich.gaps import GAP_NAME

# Every trace of the corpus: PyTorch with ET, Kineto only, vLLM, XLA on TPU and GPU.
TRACES = ["pytorch/a100_resnet_nccl", "pytorch/a100_simple_add", "pytorch/v100_dlrm_8rank",
          "pytorch/rtx2080_linear", "kineto_only/b200_eager_rank0.json.gz",
          "kineto_only/sampled_rank-0.json.gz", "kineto_only/sampled_rank-1.json.gz",
          "vllm/mi300x_decode_full/graph_capture_rank_0.pt.trace.json.gz",
          "vllm/mi300x_decode_full/graph_execution.json.gz",
          "jax_xla/tpu_inference_2.xplane.pb", "jax_xla/mi300x_jax_conv.xplane.pb"]


def _longest_path_by_dfs(nodes, durations: dict[int, float]) -> float:
    """Longest path ending at each node by depth-first search from the sinks (memoised,
    iterative): the other direction from stats' forward pass over dependency counts."""
    deps = {n.id: [d for d in (*n.data_deps, *n.ctrl_deps) if d != n.id] for n in nodes}
    best: dict[int, float] = {}
    for root in deps:
        stack = [(root, False)]
        while stack:
            nid, expanded = stack.pop()
            if nid in best:
                continue
            if expanded:
                best[nid] = durations[nid] + max((best[d] for d in deps[nid] if d in deps),
                                                 default=0.0)
            else:
                stack.append((nid, True))
                stack.extend((d, False) for d in deps[nid] if d in deps and d not in best)
    return max(best.values())


@pytest.mark.parametrize("trace", TRACES, ids=[t.split("/")[-1].split(".")[0] for t in TRACES])
def test_critical_path_matches_an_independent_computation(corpus, tmp_path, trace):
    convert_paths([corpus / trace], tmp_path, progress=False)
    for et_path in sorted(tmp_path.glob("*.et")):
        nodes = read_et(et_path).nodes
        stats = rank_stats(str(et_path), nodes)
        durations = {n.id: node_times(n, attr_dict(n))[1] for n in nodes}
        assert stats.critical_path_us == pytest.approx(_longest_path_by_dfs(nodes, durations),
                                                       rel=1e-9)
        # The ET now replays to the window it came from (within 1 %).
        assert stats.critical_path_us == pytest.approx(stats.span_us, rel=0.01)


def test_gaps_are_the_difference_and_can_be_left_out(corpus, tmp_path):
    source = corpus / "pytorch" / "a100_resnet_nccl"
    with_gaps = convert_paths([source], tmp_path / "gaps", progress=False)
    ops_only = convert_paths([source], tmp_path / "ops", gaps=False, progress=False)
    gap_nodes = [n for n in read_et(tmp_path / "gaps" / "chakra.0.et").nodes
                 if n.name == GAP_NAME]
    assert gap_nodes and with_gaps.ranks[0].stats["gaps"] == len(gap_nodes)
    assert not [n for n in read_et(tmp_path / "ops" / "chakra.0.et").nodes
                if n.name == GAP_NAME]
    assert "gaps" not in ops_only.ranks[0].stats
    ops = rank_stats("ops", read_et(tmp_path / "ops" / "chakra.0.et").nodes)
    full = rank_stats("gaps", read_et(tmp_path / "gaps" / "chakra.0.et").nodes)
    # Without gaps the waits are still there (edges: the main thread waits for autograd's),
    # only the slack is lost (Python between ops, launch latency): the path is shorter by it.
    assert 0.8 * ops.span_us < ops.critical_path_us < 0.95 * ops.span_us
    assert full.critical_path_us == pytest.approx(full.span_us, rel=0.01)


def test_astra_sim_target_gaps_only_where_their_resource_idled(corpus, tmp_path):
    # ASTRA-sim runs one host op and one device compute op at a time: a host gap must not
    # overlap another host node, nor a device gap another device compute node (each would be
    # serialised with it: the time counted twice). Host and device gaps may overlap.
    convert_paths([corpus / "pytorch" / "a100_resnet_nccl"], tmp_path, target="astra-sim",
                  progress=False)
    nodes = read_et(tmp_path / "chakra.0.et").nodes
    on_host = {n.id: value_of(attr_dict(n)["is_cpu_op"]) for n in nodes}
    gaps = [n for n in nodes if n.name == GAP_NAME]
    assert any(on_host[g.id] for g in gaps) and any(not on_host[g.id] for g in gaps)
    for side in (True, False):
        busy = sorted((n.start_time_micros, n.start_time_micros + n.duration_micros)
                      for n in nodes if n.name != GAP_NAME and n.duration_micros
                      and on_host[n.id] == side and n.type == NodeType.Value("COMP_NODE"))
        for gap in (g for g in gaps if on_host[g.id] == side):  # to the microsecond
            lo, hi = gap.start_time_micros + 1, gap.start_time_micros + gap.duration_micros - 1
            assert not any(s < hi and e > lo for s, e in busy), gap.id


def test_stats_command_json(corpus, tmp_path):
    convert_paths([corpus / "pytorch" / "v100_dlrm_8rank"], tmp_path, progress=False)
    out = CliRunner().invoke(cli, ["stats", "--json", str(tmp_path)])
    assert out.exit_code == 0, out.output
    lines = [json.loads(line) for line in out.output.splitlines()]
    assert len(lines) == 9 and lines[-1]["run"]["ranks"] == 8
    for rank in lines[:-1]:
        kinds = rank["critical_path_by_kind_us"]
        assert sum(kinds.values()) == pytest.approx(rank["critical_path_us"], rel=1e-6)
        assert rank["top_ops"] and rank["coverage"] == pytest.approx(1.0, abs=0.01)
    text = CliRunner().invoke(cli, ["stats", str(tmp_path)])
    assert "critical path" in text.output and "run of 8 ranks" in text.output
