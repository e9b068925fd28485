"""linker.routing.attach on a real capture's sidecar and Kineto trace."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chakra_hooks.common.errors import TraceFormatError
from chakra_hooks.linker.model import EdgeKind, LinkedTrace, Op, OpKind
from chakra_hooks.linker.enrich.routing import attach

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def capture(tmp_path_factory) -> Path:
    import chakra_hooks.collectors.torch as ct

    out = tmp_path_factory.mktemp("cap")
    torch.manual_seed(0)
    gate = torch.nn.Linear(8, 4)

    class Router(torch.nn.Module):
        def forward(self, x):
            logits = gate(x)
            return logits, logits.topk(2, dim=-1).indices

    router = Router()
    ct.register_router(router, num_experts=4, top_k=2, name="layers.3.router", ep_size=2)
    with ct.trace(out, steps=range(0, 2)) as t:
        for _ in range(2):
            router(torch.randn(6, 8))[0].sum().backward()
            t.step()
    return out


def _kineto_trace(capture: Path, keep_annotations: bool) -> LinkedTrace:
    """A linked trace of the rank's Kineto cpu_ops (and optionally its annotations), in ps."""
    doc = json.loads((capture / "kineto.rank0.pt.trace.json").read_text())
    base = doc["baseTimeNanoseconds"]
    trace = LinkedTrace(rank=0, framework="pytorch", clock="kineto:baseTimeNanoseconds")
    cats = ("cpu_op", "user_annotation") if keep_annotations else ("cpu_op",)
    for i, e in enumerate(x for x in doc["traceEvents"] if x.get("cat") in cats):
        if not keep_annotations or e["name"].startswith("moe_router") or e["cat"] == "cpu_op":
            trace.ops.append(Op(uid=i + 1, name=e["name"], kind=OpKind.COMPUTE, on_device=False,
                                lane=f"thread:{e['tid']}",
                                start_ps=(base + round(e["ts"] * 1000)) * 1000,
                                dur_ps=round(e["dur"] * 1000) * 1000))
    return trace


def _routing_ops(trace: LinkedTrace) -> list[Op]:
    return [op for op in trace.ops if op.name.startswith("moe_routing:")]


def test_routing_ops_sit_at_the_end_of_their_region(capture):
    trace = _kineto_trace(capture, keep_annotations=False)
    records = json.loads((capture / "routing.rank0.json").read_text())["records"]
    attach(trace, capture / "routing.rank0.json")
    ops = _routing_ops(trace)
    assert len(ops) == len(records) == 2 and not trace.warnings
    by_uid = {op.uid: op for op in trace.ops}
    for op, rec in zip(ops, records):
        assert op.name == "moe_routing:layer3" and op.dur_ps == 0
        assert op.start_ps == rec["end_ns"] * 1000
        assert op.attrs["moe_expert_tokens"] == rec["bins"] and sum(rec["bins"]) == 12
        assert op.attrs["moe_ep_rank_tokens"] == [rec["bins"][0] + rec["bins"][1],
                                                  rec["bins"][2] + rec["bins"][3]]
        assert (op.attrs["moe_layer"], op.attrs["moe_num_experts"], op.attrs["moe_top_k"],
                op.attrs["moe_tokens"], op.attrs["moe_step"]) == (3, 4, 2, 6, rec["step"])
        into = [e for e in trace.edges if e.dst == op.uid]
        out = [e for e in trace.edges if e.src == op.uid]
        assert len(into) == 1 and len(out) == 1
        assert all(e.kind == EdgeKind.HOST_ORDER for e in into + out)
        inside = by_uid[into[0].src]
        assert rec["start_ns"] * 1000 <= inside.start_ps < op.start_ps  # the router's topk
        assert by_uid[out[0].dst].start_ps >= op.start_ps


def test_annotation_ops_are_used_when_the_trace_has_them(capture):
    trace = _kineto_trace(capture, keep_annotations=True)
    anns = [op for op in trace.ops if op.name == "moe_router:layer3"]
    assert len(anns) == 2
    attach(trace, capture / "routing.rank0.json")
    for ann, op in zip(anns, _routing_ops(trace)):
        assert op.start_ps == ann.start_ps + ann.dur_ps
        assert any(e.src == ann.uid and e.dst == op.uid and e.kind == EdgeKind.PARENT
                   for e in trace.edges)


def test_unknown_clock_without_annotations_gives_untimed_ops_and_a_warning(capture):
    trace = _kineto_trace(capture, keep_annotations=False)
    trace.clock = "et:monotonic"
    attach(trace, capture / "routing.rank0.json")
    assert all(op.start_ps is None for op in _routing_ops(trace))
    assert trace.warnings and "could not be placed in time" in trace.warnings[0]


def test_bad_sidecars_are_one_line_errors(tmp_path):
    trace = LinkedTrace(rank=0, framework="pytorch", clock="kineto:baseTimeNanoseconds")
    bad = tmp_path / "routing.rank0.json"
    bad.write_text('{"format": "chakra-hooks-routing/1", "records": [{"step": 1}]}')
    with pytest.raises(TraceFormatError, match=r"routing.rank0.json: record 0: keys layer"):
        attach(trace, bad)
    bad.write_text("{not json")
    with pytest.raises(TraceFormatError, match="byte"):
        attach(trace, bad)
    bad.write_text('{"format": "other"}')
    with pytest.raises(TraceFormatError, match="format"):
        attach(trace, bad)
