"""build_graph: linked trace -> Chakra nodes, on a small trace built by hand."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from chakra_hooks.converter import etio
from chakra_hooks.converter.attrs import attr_dict, value_of
from chakra_hooks.converter.graph import (
    _in_time_order, _places_in_time_order, _with_place_source, _with_source, build_graph,
    round_us,
)
from chakra_hooks.converter.schema import NodeType
from chakra_hooks.converter.validate import validate
from chakra_hooks.linker.enrich.gaps import add_gaps, add_window_anchor
from chakra_hooks.linker.model import (
    CommInfo, CommType, Edge, EdgeColumns, EdgeKind, LinkedTrace, Op, OpKind,
)

US = 1_000_000  # picoseconds


def small_trace() -> LinkedTrace:
    ops = [
        Op(1, "## process_group:init ##", OpKind.METADATA, False, "thread:1", 0, 0),
        Op(2, "aten::linear", OpKind.COMPUTE, False, "thread:1", 10 * US, 4_600_000, flops=1000),
        Op(3, "Memcpy HtoD", OpKind.MEM_LOAD, True, "stream:0:7", 12 * US, 2_499_000, bytes=4096),
        Op(4, "gemm_kernel", OpKind.COMPUTE, True, "stream:0:7", 15 * US, 400_000),
        Op(5, "ncclDevKernel_AllReduce", OpKind.COLLECTIVE, True, "stream:0:9", 16 * US, 3 * US,
           comm=CommInfo(4096, CommType.ALL_REDUCE, group=0)),
        Op(6, "ncclDevKernel_Reduce", OpKind.COLLECTIVE, True, "stream:0:9", 20 * US, 1 * US,
           comm=CommInfo(64, CommType.REDUCE, group=1)),
        Op(7, "c10d::send", OpKind.SEND, False, "comm:1", 22 * US, 1 * US, comm=CommInfo(64, src=0, dst=1, tag=3),
           attrs={"moe_expert_tokens": [1, 2, 5, 0]}),
    ]
    edges = [
        Edge(1, 2, EdgeKind.HOST_ORDER), Edge(2, 3, EdgeKind.LAUNCH), Edge(3, 4, EdgeKind.STREAM_ORDER),
        Edge(2, 4, EdgeKind.LAUNCH), Edge(4, 5, EdgeKind.DATA), Edge(4, 5, EdgeKind.SYNC),
        Edge(5, 6, EdgeKind.STREAM_ORDER), Edge(6, 7, EdgeKind.HOST_ORDER),
        Edge(7, 7, EdgeKind.HOST_ORDER), Edge(99, 2, EdgeKind.DATA),  # invalid: self and missing
    ]
    return LinkedTrace(0, "pytorch", "test clock", ops, edges, groups={0: [0, 1], 1: [0, 1]},
                       metadata={"schema": "1.1.1-chakra.0.0.4"})


def test_rounding_is_half_up_not_truncation() -> None:
    assert [round_us(ps) for ps in (0, 499_999, 500_000, 2_499_999, 4_600_000)] == [0, 0, 1, 2, 5]
    # compiled, times within 2^62 round on C integers and the rest (picoseconds since the
    # epoch) as Python integers: the same rule on both sides of the bound, negatives too
    edge = 1 << 62
    for ps in (-500_000, -500_001, -1_500_000, edge - 1, edge, edge + 1, -edge, -edge + 1,
               1_700_000_000_000_000_500_000, -1_700_000_000_000_000_500_001):
        assert round_us(ps) == (ps + 500_000) // 1_000_000, ps


# (ps since the epoch are whole ns, and beyond the int64 of a start_ps attribute: only an
# ET in exact ns holds them)
@pytest.mark.parametrize(("epoch_ps", "whole_ns"), [
    ((1 << 61) // 1000 * 1000, True), ((1 << 61) // 1000 * 1000, False),
    (1_716_423_322_446_085_432_000, True), ((1 << 62) * 1000 - 7 * US, True),
    ((1 << 62) * 1000 + 3_000, True)])
def test_node_times_are_the_rounded_times_on_both_sides_of_the_c_bounds(
        epoch_ps: int, whole_ns: bool) -> None:
    """Compiled, a node's times are worked out on C integers from its offset to the graph's
    base while offset, duration and the base in ns are in range, else on Python integers:
    either way start_time_micros is round_us(start), the duration the rounded end less it, and
    the exact times the ns (or ps) ones, for offsets before and after the base and across
    2^60."""
    tail = 0 if whole_ns else 1
    bound = (1 << 60) // 1000 * 1000  # whole ns, 2^60 within one ns
    cases = [(0, 4_600_000), (-1_500_000, 2_499_000), (3 * US + 500_000, 499_000),
             (bound - 2 * US, 5 * US), (bound + 2 * US, 5 * US),
             (-bound - 3 * US, bound + 5 * US), (7 * US, bound - 1_000),
             (9 * US, -3_000), (11 * US, None)]
    ops = [Op(uid, f"op{uid}", OpKind.COMPUTE, False, "thread:1", epoch_ps + offset + tail,
              None if dur is None else dur + tail) for uid, (offset, dur) in enumerate(cases, 1)]
    nodes = {n.id: n for n in build_graph(LinkedTrace(0, "pytorch", "c", ops, [])).nodes}
    for op in ops:
        node, attrs = nodes[op.uid], {k: value_of(v) for k, v in attr_dict(nodes[op.uid]).items()}
        start, end = op.start_ps, op.start_ps + (op.dur_ps or 0)
        assert node.start_time_micros == round_us(start), op
        assert node.duration_micros == (0 if op.dur_ps is None else round_us(end) - round_us(start))
        unit, scale = ("ns", 1000) if whole_ns else ("ps", 1)
        assert attrs[f"start_{unit}"] == start // scale, op
        assert attrs.get(f"duration_{unit}") == (None if op.dur_ps is None else op.dur_ps // scale)


def test_full_target_nodes_attributes_and_edges(tmp_path: Path) -> None:
    graph = build_graph(small_trace())
    nodes = {n.id: n for n in graph.nodes}
    assert [NodeType.Name(nodes[i].type) for i in range(1, 8)] == [
        "METADATA_NODE", "COMP_NODE", "MEM_LOAD_NODE", "COMP_NODE", "COMM_COLL_NODE", "COMM_COLL_NODE",
        "COMM_SEND_NODE"]
    assert (nodes[2].start_time_micros, nodes[2].duration_micros) == (10, 5)
    attrs = {i: {k: value_of(v) for k, v in attr_dict(n).items()} for i, n in nodes.items()}
    assert attrs[2]["is_cpu_op"] is True and attrs[2]["num_ops"] == 1000 and attrs[2]["duration_ns"] == 4600
    assert attrs[3]["tensor_size"] == 4096 and attrs[3]["is_cpu_op"] is False
    assert attrs[5]["comm_type"] == CommType.ALL_REDUCE and attrs[5]["comm_size"] == 4096
    assert attrs[5]["pg_name"] == "0"
    assert attrs[7]["is_cpu_op"] is False and attrs[7]["host_side"] is True
    assert (attrs[7]["comm_src"], attrs[7]["comm_dst"], attrs[7]["comm_tag"]) == (0, 1, 3)
    assert attrs[7]["moe_expert_tokens"] == [1, 2, 5, 0]
    assert attr_dict(nodes[5])["comm_type"].WhichOneof("value") == "int64_val"
    assert list(nodes[5].data_deps) == [4] and list(nodes[5].ctrl_deps) == []
    assert list(nodes[7].ctrl_deps) == [6] and list(nodes[2].data_deps) == []
    assert graph.stats["edges_self"] == 1 and graph.stats["edges_missing_end"] == 1
    path = tmp_path / "chakra.0.et"
    etio.write_et(path, graph.metadata, graph.nodes)
    et = etio.read_et(path)
    assert validate(str(path), et.metadata, et.nodes).ok



def _as_columns(edges: list[Edge]) -> EdgeColumns:
    """``edges`` as columns, half added as Edge objects and half as values; the last batch
    stays waiting to be moved into the columns until they are read."""
    columns = EdgeColumns()
    for edge in edges[:len(edges) // 2]:
        columns.append(edge)
    for edge in edges[len(edges) // 2:]:
        columns.add(edge.src, edge.dst, edge.kind)
    return columns


@pytest.mark.parametrize("count", [1, 4095, 4096, 4097, 10_000])  # across the batch size
def test_edges_as_columns_read_and_convert_as_a_list_of_edges(count: int) -> None:
    """Gaps, the window anchor and the converter read columns in place: the same ops, edges
    and bytes as from a list of Edge, with every edge kind, edges whose end is missing and
    self edges among them, for both targets."""
    kinds = list(EdgeKind)
    edges = [Edge(i, i + 1 + i % 3, kinds[i % len(kinds)]) for i in range(count)]
    edges += [Edge(0, 0, EdgeKind.DATA), Edge(1, count + 99, EdgeKind.SYNC)]
    columns = _as_columns(edges)
    assert len(columns) == len(edges) and list(columns) == edges
    assert all(type(e.kind) is EdgeKind for e in columns)
    # 10 us apart on one stream, 1 us long: slack before every op (device gaps: 5 us or more)
    ops = [Op(i, "k", OpKind.COMPUTE, True, "stream:0:1", i * 10 * US, US) for i in range(count + 3)]

    def converted(edges, target: str) -> tuple:
        trace = LinkedTrace(0, "jax", "test clock", list(ops), edges)
        gaps, anchor = add_gaps(trace), add_window_anchor(trace)
        made = [(op.uid, op.name, op.start_ps, op.dur_ps) for op in trace.ops]
        return gaps, anchor, made, list(trace.edges), build_graph(trace, target=target).bodies

    for target in ("full", "astra-sim"):
        from_columns = converted(_as_columns(edges), target)
        assert from_columns[0] > 0
        assert from_columns == converted(list(edges), target)


def test_astra_sim_target_keeps_timing_and_dependencies() -> None:
    graph = build_graph(small_trace(), target="astra-sim")
    nodes = {n.id: n for n in graph.nodes}
    assert 1 not in nodes  # METADATA dropped
    assert nodes[3].type == NodeType.Value("COMP_NODE")  # MEM replayed as compute
    assert nodes[6].type == NodeType.Value("COMP_NODE")  # REDUCE is not simulated
    # its time is the device gaps' (gaps.add_idle_gaps): zero here, the measured time kept
    assert nodes[6].duration_micros == 0
    assert {a.name: a.int64_val for a in nodes[6].attr}["overlapped_duration_ps"] == 1_000_000
    assert nodes[5].type == NodeType.Value("COMM_COLL_NODE")
    assert list(nodes[2].ctrl_deps) == []  # its only dependency was the METADATA node
    report = validate("t", graph.metadata, graph.nodes, target="astra-sim")
    assert report.ok, report.problems


def test_cycle_against_time_is_broken_and_counted() -> None:
    trace = small_trace()
    trace.edges.append(Edge(5, 4, EdgeKind.SYNC))  # 5 starts after 4: a backwards edge closing a cycle
    graph = build_graph(trace)
    assert graph.stats["edges_against_time"] >= 1
    assert validate("t", graph.metadata, graph.nodes).ok


@pytest.mark.parametrize("backwards", [False, True])
def test_ops_numbered_by_place_convert_as_ops_numbered_otherwise(backwards: bool) -> None:
    """Where uids are places in the ops list (as both linkers number them), the converter
    looks ops up in the list itself rather than in a dict by uid: the same nodes, edges left
    out for the same reasons (a missing end, a negative one, a self edge, one against time)."""
    def numbered_from(first: int) -> LinkedTrace:
        trace = small_trace()  # uids 1..7
        shift = 1 - first
        for op in trace.ops:
            op.uid -= shift
        trace.edges = [Edge(e.src - shift, e.dst - shift, e.kind) for e in trace.edges]
        trace.edges.append(Edge(-5, 3 - shift, EdgeKind.DATA))
        if backwards:
            trace.edges.append(Edge(5 - shift, 4 - shift, EdgeKind.SYNC))
        return trace

    by_place, by_uid = build_graph(numbered_from(0)), build_graph(numbered_from(1))
    assert by_place.stats == by_uid.stats
    assert by_place.stats["edges_missing_end"] == 2 and by_place.stats["edges_self"] == 1
    assert (by_place.stats["edges_against_time"] > 0) == backwards
    assert len(by_place.nodes) == len(by_uid.nodes) == 7
    for a, b in zip(by_place.nodes, by_uid.nodes):
        assert (a.id + 1, a.name) == (b.id, b.name)
        assert [d + 1 for d in a.data_deps] == list(b.data_deps)
        assert [d + 1 for d in a.ctrl_deps] == list(b.ctrl_deps)
    assert any(n.data_deps or n.ctrl_deps for n in by_place.nodes)


@pytest.mark.parametrize("arriving, data, ctrl", [
    # (source, kind) as the edges come; a node's deps keep that order, and DATA wins over an
    # order edge between the same two ops whichever comes first
    ([(1, "SYNC"), (2, "STREAM_ORDER")], [], [1, 2]),
    ([(2, "DATA"), (1, "LAUNCH")], [2], [1]),
    ([(1, "LAUNCH"), (2, "DATA")], [2], [1]),
    ([(2, "DATA"), (1, "DATA")], [2, 1], []),
    ([(1, "SYNC"), (2, "STREAM_ORDER"), (1, "DATA")], [1], [2]),
    ([(1, "SYNC"), (2, "STREAM_ORDER"), (1, "LAUNCH")], [], [1, 2]),
    ([(1, "SYNC"), (2, "STREAM_ORDER"), (2, "LAUNCH")], [], [1, 2]),
    ([(1, "DATA"), (2, "STREAM_ORDER"), (1, "SYNC"), (2, "LAUNCH")], [1], [2]),
    ([(2, "LAUNCH"), (1, "STREAM_ORDER"), (3, "DATA"), (1, "DATA")], [1, 3], [2]),
    ([(2, "LAUNCH"), (2, "STREAM_ORDER"), (2, "DATA"), (2, "SYNC")], [2], []),
])
def test_a_nodes_deps_keep_the_order_their_edges_came_in(arriving, data, ctrl) -> None:
    """One source, two (held as a pair) and three or more (a dict) give the same deps."""
    ops = [Op(uid, f"op{uid}", OpKind.COMPUTE, True, "stream:0:1", uid * US, US // 2)
           for uid in range(5)]
    edges = [Edge(src, 4, EdgeKind[kind]) for src, kind in arriving]
    node = build_graph(LinkedTrace(0, "pytorch", "test clock", ops, edges)).nodes[4]
    assert (list(node.data_deps), list(node.ctrl_deps)) == (data, ctrl)
    # the same with uids that are not places (the edge map is a dict by uid, not a list)
    for op in ops:
        op.uid += 10
    edges = [Edge(e.src + 10, e.dst + 10, e.kind) for e in edges]
    node = build_graph(LinkedTrace(0, "pytorch", "test clock", ops, edges)).nodes[4]
    assert (list(node.data_deps), list(node.ctrl_deps)) == ([d + 10 for d in data],
                                                             [c + 10 for c in ctrl])


def test_the_edge_map_of_ops_numbered_by_place_is_a_list() -> None:
    """A large device's conversion holds its edge map beside its ops: where uids are places
    it is a list by place (8 bytes a node), not a dict by uid (about 45); a trace numbered
    otherwise, or one with PARENT edges (a rarer pass resolves them), takes the dict."""
    from chakra_hooks.converter.graph import _resolve_edges

    def trace(first_uid: int, parent: bool) -> LinkedTrace:
        ops = [Op(first_uid + i, f"op{i}", OpKind.COMPUTE, True, "stream:0:1", i * US, US // 2)
               for i in range(4)]
        edges = [Edge(first_uid + i, first_uid + i + 1, EdgeKind.STREAM_ORDER) for i in range(3)]
        if parent:
            edges.append(Edge(first_uid, first_uid + 3, EdgeKind.PARENT))
        return LinkedTrace(0, "pytorch", "test clock", ops, edges)

    for first_uid, parent, kind in ((0, False, list), (1, False, dict), (0, True, dict)):
        t = trace(first_uid, parent)
        deps, stats = _resolve_edges(t, t.ops, True)
        assert type(deps) is kind and stats["edges_out"] == 3
        if kind is list:
            assert deps == [None] + [(i << 3) | EdgeKind.STREAM_ORDER for i in range(3)]


def test_unknown_target_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown target"):
        build_graph(small_trace(), target="ns3")


def test_a_value_no_chakra_field_holds_is_a_format_error() -> None:
    """An integer attribute beyond 64 bits from any source: one line naming the op and the
    rank's files, not a traceback from the node writer."""
    from chakra_hooks.common.errors import TraceFormatError

    trace = small_trace()
    trace.metadata["kineto_file"] = "k.json"
    trace.ops[0].attrs["sequence"] = 10**30
    with pytest.raises(TraceFormatError, match=r"^k\.json: op .*out of range"):
        build_graph(trace)


def test_unmeasured_ops_say_so() -> None:
    trace = small_trace()
    trace.ops.append(Op(8, "aten::select", OpKind.COMPUTE, False, "thread:1"))
    graph = build_graph(trace)
    node = next(n for n in graph.nodes if n.id == 8)
    attrs = attr_dict(node)
    assert node.duration_micros == 0 and attrs["duration_unknown"].bool_val
    assert "duration_ns" not in attrs and "start_ns" not in attrs
    assert validate("t", graph.metadata, graph.nodes).ok


def test_astra_sim_replays_copies_that_overlapped_compute_in_zero_time() -> None:
    trace = small_trace()
    trace.ops.append(Op(8, "copy-start", OpKind.MEM_LOAD, True, "tpu:0:Async XLA Ops", 30 * US, 9 * US, bytes=64))
    nodes = {n.id: n for n in build_graph(trace, target="astra-sim").nodes}
    overlapped = attr_dict(nodes[8])
    assert nodes[8].duration_micros == 0 and value_of(overlapped["overlapped_duration_ps"]) == 9 * US
    assert nodes[3].duration_micros == 2  # a copy on a stream that also runs kernels keeps its time


def test_time_order_check_holds_each_source_to_its_destination() -> None:
    """_in_time_order (typed in the compiled build) against a plain reading of its rule: every
    source of a kept op starts before it, or at once with a lower uid; a source not kept is
    no hindrance, a kept op without a start is. Sources held as one int, a pair or a dict."""
    starts = [0, 10, 10, 20, None, 30]
    ops = [Op(uid, f"op{uid}", OpKind.COMPUTE, True, "stream:0:7", start, 1)
           for uid, start in enumerate(starts)]

    def expected(edges: list[tuple[int, int]], kept: set[int]) -> bool:
        for src, dst in edges:
            if dst not in kept or src not in kept:
                continue
            if starts[dst] is None or starts[src] is None or (starts[src], src) > (starts[dst], dst):
                return False
        return True

    cases = [[(0, 1)], [(2, 1)], [(1, 2)], [(0, 3), (1, 3)], [(3, 1), (0, 1)], [(0, 5), (1, 5), (3, 5)],
             [(0, 5), (1, 5), (5, 3)], [(4, 5)], [(0, 4)], [(7, 1)], []]
    for edges in cases:
        for kept_uids in ({0, 1, 2, 3, 4, 5}, {0, 1, 2, 5}):
            slots: dict[int, object] = {}
            for src, dst in edges:
                slots[dst] = _with_source(slots.get(dst), src, EdgeKind.SYNC)
            kept = {uid: ops[uid] for uid in kept_uids}
            places = [slots.get(dst) for dst in range(len(ops))]
            want = expected(edges, kept_uids)
            assert _in_time_order({d: s for d, s in slots.items() if d in kept_uids}, kept) == want, edges
            if kept_uids == set(range(len(ops))) and all(src < len(ops) for src, _ in edges):
                assert _in_time_order(places, ops) == want, edges
                assert _places_in_time_order(places, ops) == want, edges


def test_an_edge_map_entry_grows_alike_by_place() -> None:
    """_with_place_source (the compiled build's on C integers, for sources that are places)
    makes what _with_source makes, edge after edge, from every kind of entry: none, one
    source, two, a dict; a repeated source, DATA against an order edge either way."""
    rng = random.Random(5)
    for _ in range(3000):
        sources = [rng.choice([0, 1, 2, 7, (1 << 40) + 3, (1 << 59) - 1]) for _ in range(5)]
        kinds = [rng.choice(list(EdgeKind)) for _ in sources]
        reference = place = None
        for src, kind in zip(sources, kinds):
            reference = _with_source(reference, src, kind)
            place = _with_place_source(place, src, kind)
            assert type(place) is type(reference) and place == reference, (sources, kinds)
