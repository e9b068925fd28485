"""Gap ops do not depend on how a trace numbers its ops.

Both linkers number ops by their place in ``trace.ops``, and add_gaps works by place when that
holds; any other trace (ops built by hand, renumbered, reordered) takes its general path. The
same real trace, renumbered and reversed, must get the same gaps."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from chakra_hooks.converter.targets.astra_sim import replay_dur
from chakra_hooks.linker.enrich.gaps import GAP_NAME, add_gaps
from chakra_hooks.linker.model import Edge, LinkedTrace, Op
from chakra_hooks.linker.pytorch.link import link


def _copy(trace: LinkedTrace, uid_of, reverse: bool) -> LinkedTrace:
    ops = [Op(uid_of(op.uid), op.name, op.kind, op.on_device, op.lane, op.start_ps, op.dur_ps,
              op.comm, op.bytes, op.flops, op.inputs, op.outputs, dict(op.attrs))
           for op in trace.ops]
    if reverse:
        ops.reverse()
    edges = [Edge(uid_of(e.src), uid_of(e.dst), e.kind) for e in trace.edges]
    return LinkedTrace(trace.rank, trace.framework, trace.clock, ops, edges)


def _gaps(trace: LinkedTrace, first_gap: int, original) -> set[tuple]:
    """Each gap as (the op it precedes, its lane, side, start, duration, the ops it waits
    for), in the original trace's uids."""
    gaps = {op.uid: op for op in trace.ops if op.uid >= first_gap}
    assert all(op.name == GAP_NAME for op in gaps.values())
    waits: dict[int, set[int]] = {uid: set() for uid in gaps}
    before: dict[int, int] = {}
    for e in trace.edges:
        if e.dst in gaps:
            waits[e.dst].add(original(e.src))
        elif e.src in gaps:
            before[e.src] = original(e.dst)
    return {(before[uid], g.lane, g.on_device, g.start_ps, g.dur_ps, frozenset(waits[uid]))
            for uid, g in gaps.items()}


@pytest.fixture(scope="module")
def resnet(corpus: Path) -> LinkedTrace:
    d = corpus / "pytorch/a100_resnet_nccl"
    return link(d / "host_et.json.gz", d / "kineto.json.gz")


@pytest.mark.parametrize("per_resource", [False, True])
def test_gaps_are_the_same_however_the_ops_are_numbered(resnet, per_resource):
    as_linked = _copy(resnet, lambda uid: uid, reverse=False)
    assert [op.uid for op in as_linked.ops] == list(range(len(as_linked.ops)))  # uids are places
    renumbered = _copy(resnet, lambda uid: 3 * uid + 7, reverse=True)  # order kept, places not

    def gaps_of(trace: LinkedTrace, original) -> set[tuple]:
        first_gap = max(op.uid for op in trace.ops) + 1
        dur = replay_dur(trace.ops) if per_resource else None
        added = add_gaps(trace, per_resource=per_resource, replay_dur=dur)
        assert added == trace.stats["gaps"]
        return _gaps(trace, first_gap, original)

    expected = gaps_of(as_linked, lambda uid: uid)
    assert len(expected) > 100  # the ResNet rank has thousands of idle stretches
    assert gaps_of(renumbered, lambda uid: (uid - 7) // 3) == expected
    assert renumbered.stats["gap_ps"] == as_linked.stats["gap_ps"]


def test_idle_stretches_share_their_attribute_names(resnet):
    """A launches profile has an idle stretch for every other op: their attribute dicts
    share one table of names (smaller than a dict of their own, on CPython)."""
    trace = _copy(resnet, lambda uid: uid, reverse=False)
    first_gap = len(trace.ops)
    assert add_gaps(trace) > 100
    gaps = trace.ops[first_gap:]
    assert all(list(gap.attrs) == ["gap_ns"] and gap.attrs["gap_ns"] == gap.dur_ps // 1000
               for gap in gaps)
    if sys.implementation.name == "cpython":
        assert all(sys.getsizeof(gap.attrs) < sys.getsizeof(dict(gap.attrs)) for gap in gaps)


def test_finding_the_slack_holds_little_per_op() -> None:
    """add_gaps runs on a whole device's ops at once, where a large profile's conversion peaks:
    what it holds per op while it works is a list slot or two, not an integer of its own
    (an end time each was 40 bytes an op of 60; the ops here leave no slack, so no gap ops)."""
    import tracemalloc

    from chakra_hooks.linker.model import EdgeKind, OpKind

    n = 50_000
    ops = [Op(i, "k", OpKind.COMPUTE, True, "stream:0:7", 1_000_000_000 + 5_000 * i, 4_000)
           for i in range(n)]
    edges = [Edge(i - 1, i, EdgeKind.STREAM_ORDER) for i in range(1, n)]
    trace = LinkedTrace(0, "jax", "test", ops, edges)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        assert add_gaps(trace) == 0
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert (peak - before) / n < 24, (peak - before) / n
