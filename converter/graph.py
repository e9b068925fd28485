"""Linked trace -> Chakra graph.

This module knows nothing about Kineto, the PyTorch ET or XSpace: it maps ``linker.model``
ops and edges onto Chakra nodes, with the attribute oneofs consumers read, and guarantees what
every consumer needs: unique ids, every dependency naming a node of the same file, no
self-dependency, no cycle.

What a reader of the ETs accepts (which ops, of which kinds) is its target's rule
(converter/targets/): the ops come here retargeted; a dependency on an op the target dropped
goes to that op's own dependencies.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Union

from chakra_hooks import __version__
from chakra_hooks.common.errors import TraceFormatError
from chakra_hooks.linker.model import PS_PER_US, EdgeColumns, EdgeKind, LinkedTrace, Op, OpKind

from .attrs import oneof_for
from .dag import unfinished_nodes
from .etio import decode_bodies
from .schema import COMM_COLL, COMM_RECV, COMM_SEND, COMP, MEM_LOAD, MEM_STORE, METADATA
from .summary import UNKNOWN_ATTRS, Tally
from .targets import Target, parse_target, rules
from .wire import (_CTRL_KEY, _DATA_KEY, _DURATION_KEY, _ID_KEY, _INPUTS_KEY, _OUTPUTS_KEY,
                   _START_KEY, _TIMING_PREFIXES, NodeEncoder, _int_prefixes, encode_metadata)

try:  # read by Cython when it compiles this module (setup.py)
    import cython
except ImportError:  # run as plain Python without Cython installed
    from chakra_hooks.common.no_cython import cython

if not cython.compiled:
    # A node's buffer, and its bytes once written: the compiled build makes both by direct C
    # calls (wire.pxd), where calling the types costs about 600 instructions each.
    _new_buffer, _buffer_bytes = bytearray, bytes

if TYPE_CHECKING:  # protobuf is loaded only where messages are read (schema/)
    from .schema import GlobalMetadata, Node

CHAKRA_SCHEMA_VERSION = "0.0.4"
# Enum members read per op or per edge, bound once: reading one off its class goes through
# EnumType's __getattr__ hook, about ten times the cost of a module global.
_DATA, _HOST_ORDER, _PARENT = EdgeKind.DATA, EdgeKind.HOST_ORDER, EdgeKind.PARENT
_COLLECTIVE = OpKind.COLLECTIVE
# round_us runs twice per node: its constants are worked out once, and held as C integers too
# (the compiled build's, graph.pxd) for the times it rounds on C integers
_HALF_US = PS_PER_US // 2
_C_US, _C_HALF_US = PS_PER_US, _HALF_US
_COMPILED = cython.compiled  # (a C constant compiled: graph.pxd; a global read in plain Python)

_NODE_TYPE = {
    OpKind.COMPUTE: COMP,
    OpKind.COLLECTIVE: COMM_COLL,
    OpKind.SEND: COMM_SEND,
    OpKind.RECV: COMM_RECV,
    OpKind.MEM_LOAD: MEM_LOAD,
    OpKind.MEM_STORE: MEM_STORE,
    OpKind.METADATA: METADATA,
}
_COMM_KINDS = frozenset({OpKind.COLLECTIVE, OpKind.SEND, OpKind.RECV})
# The compiled node writer's constants (_NodeWriter; C integers there, graph.pxd): the node
# type of each OpKind but communication's, the keys it writes.
_COMMON_TYPES = {kind: node_type for kind, node_type in _NODE_TYPE.items()
                 if kind not in _COMM_KINDS}
_C_DATA, _C_PARENT = _DATA, _PARENT
_W_ID, _W_CTRL, _W_DATA, _W_START, _W_DURATION, _W_INPUTS, _W_OUTPUTS = (
    _ID_KEY, _CTRL_KEY, _DATA_KEY, _START_KEY, _DURATION_KEY, _INPUTS_KEY, _OUTPUTS_KEY)

Deps = Union[int, tuple[int, int], list[Sequence]]
"""A node's dependencies: its one source as ``source << 3 | kind`` (_one_source), its two
sources as a pair of such ints (in the order their edges came), else [data_deps, ctrl_deps]."""


@dataclass
class ChakraGraph:
    """One Chakra ET in memory, ready for ``etio.write_et(path, metadata_body, bodies)``."""

    rank: int
    metadata_body: bytes  # the serialised GlobalMetadata message
    bodies: list[bytes]  # each node's serialised Node message, in file order
    groups: dict[int, list[int]]
    tally: Tally  # what summary.summarize would count in the nodes, counted as they were made
    stats: dict[str, int] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    # Where the COMM_COLL nodes (and the window anchor, linker/enrich/gaps.add_window_anchor) are in
    # ``bodies``, and the tally of every other node: what rules across a run's ranks
    # (converter/targets/astra_sim), which rewrite only those, leave as is.
    collectives: list[int] = field(default_factory=list)
    others_tally: Tally = field(default_factory=Tally)
    # Per communication node, what matching it across ranks reads (converter/peers.py), as
    # plain values: (place in ``bodies``, id, node type, start ps, duration ps, comm attrs).
    comm_facts: list[tuple] = field(default_factory=list)
    version: str = CHAKRA_SCHEMA_VERSION  # the GlobalMetadata's, and its attributes' values:
    metadata_values: dict[str, object] = field(default_factory=dict)  # what tally.summary reads
    _nodes: Sequence[Node] | None = field(default=None, repr=False)

    @property
    def metadata(self) -> GlobalMetadata:
        """The GlobalMetadata as a protobuf message (decoded from ``metadata_body``)."""
        from .schema import GlobalMetadata

        return GlobalMetadata.FromString(self.metadata_body)

    @property
    def nodes(self) -> Sequence[Node]:
        """The nodes as protobuf messages (decoded from ``bodies`` on first use)."""
        if self._nodes is None:
            self._nodes = decode_bodies(self.bodies)
        return self._nodes


def round_us(ps: int) -> int:
    """Picoseconds to whole microseconds, rounded half up (never truncated)."""
    # Within 2^62 (an XLA profile's times, from its start) the compiled build adds and divides
    # C integers (graph.pxd); the bounds are literals, which it compares without making ints.
    if -4_611_686_018_427_387_904 < ps < 4_611_686_018_427_387_904:
        small = ps
        return (small + _C_HALF_US) // _C_US
    return (ps + _HALF_US) // PS_PER_US  # picoseconds since the epoch: beyond 64 bits


def build_graph(trace: LinkedTrace, target: str | Target = Target.FULL, keep_mem: bool = False,
                consume: bool = False) -> ChakraGraph:
    """Turn one linked trace into one Chakra graph.

    ``consume=True`` releases each op as soon as its node exists (the trace is emptied), so
    that the ops and the nodes, of similar size, are never both whole in memory.
    """
    target = parse_target(target)
    ops = rules(target).retarget(trace.ops, keep_mem)
    deps, stats = _resolve_edges(trace, ops, ops is trace.ops, consume)
    by_place = type(deps) is list
    dep_list = deps if by_place else None  # (compiled: a list, indexed in C)
    exact_unit = "ns" if _all_whole_ns(ops) else "ps"
    stats.update(ops=len(trace.ops))
    base_ps = _time_base(ops)
    base_us, base_ns = base_ps // PS_PER_US, base_ps // 1000
    if consume:
        trace.ops, trace.edges = [], []
    bodies = []
    encoder, others, collective_tally = NodeEncoder(), Tally(), Tally()
    collectives, comm_facts = [], []
    # (plain Python writes every node with _make_node, the reference)
    writer = _NodeWriter(encoder, exact_unit, base_ps, base_us, base_ns) if _COMPILED else None
    for index, op in enumerate(ops):
        if op.kind in _COMM_KINDS or "window_anchor" in op.attrs:
            collectives.append(index)
            if op.kind in _COMM_KINDS:
                comm_facts.append((index, op.uid, _NODE_TYPE[op.kind], op.start_ps, op.dur_ps,
                                   dict(_comm_attrs(op))))
            tally = collective_tally
        else:
            tally = others
        if by_place:  # the edge map is a list by place (see _resolve_edges)
            node_deps = dep_list[index]
            dep_list[index] = None
        else:
            node_deps = deps.pop(op.uid, None)
        try:
            if writer is None:  # (one test a node in plain Python)
                bodies.append(_make_node(op, node_deps, exact_unit, encoder, tally, base_ps,
                                         base_us, base_ns))
            else:
                body = writer.node(op, node_deps, tally)
                if body is None:
                    body = _make_node(op, node_deps, exact_unit, encoder, tally, base_ps,
                                      base_us, base_ns)
                bodies.append(body)
        except ValueError as exc:  # a number the trace gave that no Chakra field holds
            raise TraceFormatError(_sources(trace), f"op {op.name[:60]!r}",
                                   f"values a Chakra node can hold ({exc})") from None
        if consume:
            ops[index] = None  # type: ignore[call-overload]
    stats.update(nodes=len(bodies))
    values = _metadata_values(trace, target, exact_unit)
    others.flush()
    collective_tally.flush()
    tally = Tally()
    tally.merge(others)
    tally.merge(collective_tally)
    return ChakraGraph(trace.rank, encode_metadata(CHAKRA_SCHEMA_VERSION, values), bodies,
                       dict(trace.groups), tally, stats, list(trace.warnings),
                       collectives=collectives, others_tally=others, comm_facts=comm_facts,
                       metadata_values=values)


def _sources(trace: LinkedTrace) -> str:
    """The files a linked trace came from, as its metadata names them."""
    names = [str(trace.metadata[key]) for key in ("host_et_file", "kineto_file", "source_file")
             if key in trace.metadata]
    return ", ".join(names) or f"rank {trace.rank}"


def _time_base(ops: list[Op]) -> int:
    """A whole microsecond at the first timed op's start (0 if none): nodes' times are worked
    out from their offsets to it (see _make_node)."""
    for op in ops:
        if op.start_ps is not None:
            return op.start_ps // PS_PER_US * PS_PER_US
    return 0


def _all_whole_ns(ops: list[Op]) -> bool:
    """Whether every op's times are whole nanoseconds (then ns is the exact time unit)."""
    for op in ops:
        if (op.start_ps or 0) % 1000 or (op.dur_ps or 0) % 1000:
            return False
    return True


def _resolve_edges(trace: LinkedTrace, ops: list[Op], all_kept: bool = False,
                   consume: bool = False) -> tuple[dict[int, Deps] | list[Deps | None], dict]:
    """Per node (an op of ``ops``, those the target keeps) its dependencies (Deps), dropped
    ops bypassed, invalid edges removed, no cycles: by uid, or as a list by place where uids
    are places in ``ops`` (None: no dependencies).

    ``all_kept``: ``ops`` are all the trace's ops. ``consume``: the trace's edges are let go
    as they are read (the trace is emptied)."""
    # The kept ops by uid: the list itself where uids are places in it (both linkers number
    # ops so) and every op is kept, else a dict (one of every op was a twentieth of a large
    # XLA device's conversion memory). The known uids: the same, or a set of the trace's.
    by_place = all_kept and _numbered_by_place(ops)
    kept: dict[int, Op] | list[Op] = ops if by_place else {op.uid: op for op in ops}
    known = kept if all_kept else {op.uid for op in trace.ops}
    count = len(ops)
    # The edge map: node -> its sources. Most nodes have one or two (a kernel: its launch and
    # its stream), each held with its edge's kind in one int (see _one_source): one int, or a
    # pair of them; a dict {source: kind} from a third source on. A dict each took most of a
    # large XLA device's conversion memory (docs/performance.md). Where uids are places the
    # map is a list by place (8 bytes a node, against about 45 for a dict of every node); the
    # rarer passes below take it as a dict.
    listed = by_place
    places: list[object] = [None] * count if listed else []
    incoming: dict[int, object] = {}
    # A list of Edge, or an XLA device's model.EdgeColumns, read in place (making an Edge of
    # each to read it cost 3 % of a conversion).
    edges = trace.edges
    columns = type(edges) is EdgeColumns
    if columns:
        srcs, dsts, kinds = edges.columns()
    else:
        edge_list = edges if type(edges) is list else list(edges)
    edge_count = len(kinds) if columns else len(edge_list)
    stats = {"edges_in": edge_count, "edges_missing_end": 0, "edges_self": 0, "edges_against_time": 0}
    if consume:
        trace.edges = []
    has_parent = False
    for i in range(edge_count):
        if columns:
            src, dst, kind = srcs[i], dsts[i], kinds[i]
        else:
            edge = edge_list[i]
            if consume:
                edge_list[i] = None  # the edge map replaces it
            src, dst, kind = edge.src, edge.dst, edge.kind
        # (compiled: src, dst and kind C integers, graph.pxd)
        if (not (0 <= src < count and 0 <= dst < count) if by_place
                else src not in known or dst not in known):
            stats["edges_missing_end"] += 1
        elif src == dst:
            stats["edges_self"] += 1
        else:
            if kind == _C_PARENT:
                has_parent = True
            if listed:  # (compiled, indexed as a C integer: graph.pxd)
                place = dst
                slot = places[place]
                grown = _with_place_source(slot, src, kind)
            else:
                slot = incoming.get(dst)
                grown = _with_source(slot, src, kind)
            if grown is not slot:
                if listed:
                    places[place] = grown
                else:
                    incoming[dst] = grown
    if listed and (has_parent or not _places_in_time_order(places, kept)):
        incoming = {dst: slot for dst, slot in enumerate(places) if slot is not None}
        places, listed = [], False
    if not listed:
        _finish_map(trace, incoming, kept, known, ops, by_place, has_parent, stats)
    # The edge map becomes the dependencies in place (a second map beside it would double
    # what a large device's conversion holds): a node's one source stays one int and two a
    # pair, which _make_node reads as such, and a dict of sources becomes [data, ctrl].
    deps = places if listed else incoming
    edges_out = 0
    for dst, sources in (enumerate(places) if listed else incoming.items()):
        if sources is None:
            continue
        if type(sources) is int:
            edges_out += 1
            continue
        if type(sources) is tuple:
            edges_out += 2
            continue
        data = [s for s, k in sources.items() if k == _DATA]
        ctrl = [s for s, k in sources.items() if k != _DATA]
        deps[dst] = [data, ctrl]
        edges_out += len(data) + len(ctrl)
    stats["edges_out"] = edges_out
    return deps, stats


def _finish_map(trace: LinkedTrace, incoming: dict[int, object], kept: dict[int, Op] | list[Op],
                known: object, ops: list[Op], by_place: bool, has_parent: bool, stats: dict
                ) -> None:
    """The rarer passes over the edge map as a dict: PARENT edges, dropped ops, edges
    against time (and a cycle they make); what no kept op receives is left out."""
    if has_parent or len(kept) < len(known):
        _as_dicts(incoming)
        if has_parent:
            _start_with_parents(incoming)
        if len(kept) < len(known):
            _bypass_dropped(incoming, kept)
    if not _in_time_order(incoming, kept):
        _as_dicts(incoming)
        if by_place:  # the rare passes below look ops up by uid
            kept = {op.uid: op for op in ops}
        if _has_cycle(incoming, kept):
            stats["edges_against_time"] = _drop_edges_against_time(incoming, kept)
            if _has_cycle(incoming, kept):
                raise ValueError(f"rank {trace.rank}: the linked trace's dependencies form a "
                                 "cycle even in time order (a linker bug)")
    if len(kept) < len(known):
        for dst in [dst for dst in incoming if dst not in kept]:
            del incoming[dst]


def _with_source(slot: object, src: int, kind: int) -> object:
    """A node's sources (an edge map entry, None for none yet) with one more edge's: the same
    object where it already holds it (a dict is changed in place)."""
    if slot is None:
        return _one_source(src, kind) if src >= 0 else {src: kind}
    if type(slot) is int:
        first = slot >> 3
        if first != src:
            return (slot, _one_source(src, kind)) if src >= 0 else {first: slot & 7, src: kind}
        if slot & 7 != _DATA:  # DATA wins over order edges between the same pair
            return _one_source(src, kind)
        return slot
    if type(slot) is tuple:
        a, b = slot
        if a >> 3 == src:
            if a & 7 != _DATA:  # the pair keeps the order the sources came in
                return (_one_source(src, kind), b)
        elif b >> 3 == src:
            if b & 7 != _DATA:
                return (a, _one_source(src, kind))
        else:
            return {a >> 3: a & 7, b >> 3: b & 7, src: kind}
        return slot
    if slot.get(src) != _DATA:
        slot[src] = kind
    return slot


def _with_place_source(slot: object, src: int, kind: int) -> object:
    """_with_source for a source that is a place in the ops (0 to 2^62) and a kind below 8: the
    compiled build's works on C integers (graph.pxd), down to the int or pair it makes. Plain
    Python binds the name to _with_source; tests hold the two to the same results."""
    if slot is None:
        return src << 3 | kind
    if type(slot) is int:
        one = slot
        if one >> 3 != src:
            return (slot, src << 3 | kind)
        if one & 7 != _C_DATA:
            return src << 3 | kind
        return slot
    if type(slot) is tuple:
        a, b = slot
        first, second = a, b
        if first >> 3 == src:
            if first & 7 != _C_DATA:
                return (src << 3 | kind, b)
        elif second >> 3 == src:
            if second & 7 != _C_DATA:
                return (a, src << 3 | kind)
        else:
            return {first >> 3: first & 7, second >> 3: second & 7, src: kind}
        return slot
    return _with_source(slot, src, kind)


if not cython.compiled:
    _with_place_source = _with_source  # noqa: F811 (the reference; see above)


def _one_source(src: int, kind: int) -> int:
    """A node's one source (a uid >= 0) and its edge's kind (an EdgeKind, below 8) as one int."""
    return src << 3 | kind


def _as_dicts(incoming: dict[int, object]) -> None:
    """Every entry of the edge map as a dict {source: kind}, as the rarer passes read it."""
    for dst, slot in incoming.items():
        if type(slot) is int:
            incoming[dst] = {slot >> 3: slot & 7}
        elif type(slot) is tuple:
            a, b = slot
            incoming[dst] = {a >> 3: a & 7, b >> 3: b & 7}


def _start_with_parents(incoming: dict[int, dict[int, EdgeKind]]) -> None:
    """A PARENT edge says "starts inside its parent" (a gloo collective within the autograd op
    that called it); a Chakra dependency says "after the source ends", which would replay the
    child after its whole parent, counting its time twice (a 4-rank gloo run: critical path
    103.5 % of its span). The child waits for what its parent waited for instead (the
    parent's own PARENT edges resolved the same way), and what follows the parent already
    waits for the child."""
    resolved: dict[int, dict[int, EdgeKind]] = {}
    for dst in [d for d, sources in incoming.items() if _PARENT in sources.values()]:
        incoming[dst] = {s: k for s, k in _sources_above_parents(dst, incoming, resolved).items()
                         if s != dst}


# (The recursive helpers here are module functions, not closures: a closure that calls itself
# is a reference cycle, which holds the whole edge map until the garbage collector runs, and
# conversion pauses it: every linked trace of a job would stay in memory until the job ends.)
def _sources_above_parents(node: int, incoming: dict[int, dict[int, EdgeKind]],
                           resolved: dict[int, dict[int, EdgeKind]]) -> dict[int, EdgeKind]:
    """``node``'s sources with each PARENT source replaced by that parent's own (resolved the
    same way); memoised in ``resolved``."""
    done = resolved.get(node)
    if done is not None:
        return done
    out: dict[int, EdgeKind] = {}
    for src, kind in incoming.get(node, {}).items():
        if kind == _PARENT:
            for up, up_kind in _sources_above_parents(src, incoming, resolved).items():
                if out.get(up) != _DATA:
                    out[up] = up_kind
        elif out.get(src) != _DATA:
            out[src] = kind
    resolved[node] = out
    return out


def _bypass_dropped(incoming: dict[int, dict[int, EdgeKind]], kept: dict[int, Op]) -> None:
    """Make dependants of dropped nodes depend on what the dropped nodes depended on."""
    resolved: dict[int, dict[int, EdgeKind]] = {}
    for dst in list(incoming):
        if dst not in kept:
            continue
        sources = incoming[dst]
        if all(src in kept for src in sources):
            continue
        new: dict[int, EdgeKind] = {}
        for src, kind in sources.items():
            if src in kept:
                new[src] = kind
            else:
                for inherited in _kept_sources(src, set(), incoming, kept, resolved):
                    new.setdefault(inherited, _HOST_ORDER)
        new.pop(dst, None)
        incoming[dst] = new


def _kept_sources(uid: int, stack: set[int], incoming: dict[int, dict[int, EdgeKind]],
                  kept: dict[int, Op], resolved: dict[int, dict[int, EdgeKind]]) -> dict[int, EdgeKind]:
    """The kept nodes a dropped node ``uid`` depends on, through other dropped ones
    (``stack``: the dropped nodes being resolved, against cycles); memoised in ``resolved``."""
    if uid in resolved:
        return resolved[uid]
    out: dict[int, EdgeKind] = {}
    stack.add(uid)
    for src, kind in incoming.get(uid, {}).items():
        if src in kept:
            out[src] = kind
        elif src not in stack:
            out.update(_kept_sources(src, stack, incoming, kept, resolved))
    stack.discard(uid)
    resolved[uid] = out
    return out


def _numbered_by_place(ops: list[Op]) -> bool:
    """Whether each op's uid is its place in ``ops``."""
    for place, op in enumerate(ops):
        if op.uid != place:
            return False
    return True


def _in_time_order(incoming: dict[int, object] | list[object],
                   kept: dict[int, Op] | list[Op]) -> bool:
    """Whether every kept edge runs from an earlier (start, uid) to a later one, which rules a
    cycle out in one pass (the usual case; else _has_cycle decides). ``kept``: the kept ops
    by uid, or as a list where uids are places and every uid in ``incoming`` is one;
    ``incoming``: the edge map, a dict or a list by place."""
    by_place = type(kept) is list
    for dst, sources in (enumerate(incoming) if type(incoming) is list else incoming.items()):
        if sources is None:
            continue
        dst_op = kept[dst] if by_place else kept.get(dst)
        if dst_op is None:
            continue
        dst_start = dst_op.start_ps
        if dst_start is None:
            return False
        if type(sources) is int:  # one source (see _resolve_edges)
            if not _runs_before(kept, by_place, sources >> 3, dst, dst_start):
                return False
        elif type(sources) is tuple:  # two
            if not (_runs_before(kept, by_place, sources[0] >> 3, dst, dst_start)
                    and _runs_before(kept, by_place, sources[1] >> 3, dst, dst_start)):
                return False
        else:
            for src in sources:
                if not _runs_before(kept, by_place, src, dst, dst_start):
                    return False
    return True


def _places_in_time_order(places: list[object], ops: list[Op]) -> bool:
    """_in_time_order for an edge map by place over all the ops (uids are places, every
    source one of them): the compiled build's, each source's place a C integer (graph.pxd).
    Plain Python binds the name to _in_time_order; tests hold the two alike."""
    for dst in range(len(places)):
        sources = places[dst]
        if sources is None:
            continue
        dst_op = ops[dst]
        dst_start = dst_op.start_ps
        if dst_start is None:
            return False
        if type(sources) is int:
            one = sources
            if not _place_before(ops, one >> 3, dst, dst_start):
                return False
        elif type(sources) is tuple:
            first, second = sources
            if not (_place_before(ops, first >> 3, dst, dst_start)
                    and _place_before(ops, second >> 3, dst, dst_start)):
                return False
        else:
            for src in sources:
                if not _runs_before(ops, True, src, dst, dst_start):
                    return False
    return True


def _place_before(ops: list[Op], src: int, dst: int, dst_start: int) -> bool:
    """_runs_before for ops by place (src a place in them)."""
    src_op = ops[src]
    src_start = src_op.start_ps
    return not (src_start is None or src_start > dst_start or (src_start == dst_start and src > dst))


if not cython.compiled:
    _places_in_time_order = _in_time_order  # noqa: F811 (the reference; see above)


def _runs_before(kept: dict[int, Op] | list[Op], by_place: bool, src: int, dst: int,
                 dst_start: int) -> bool:
    """Whether the kept op ``src`` comes before ``dst`` (which starts at ``dst_start``) in
    (start, uid) order; True for an op not kept."""
    src_op = kept[src] if by_place else kept.get(src)
    if src_op is None:
        return True
    src_start = src_op.start_ps
    return not (src_start is None or src_start > dst_start or (src_start == dst_start and src > dst))


def _has_cycle(incoming: dict[int, dict[int, EdgeKind]], kept: dict[int, Op]) -> bool:
    return bool(unfinished_nodes(
        (uid, [src for src in incoming.get(uid, ()) if src in kept]) for uid in kept))


def _drop_edges_against_time(incoming: dict[int, dict[int, EdgeKind]], kept: dict[int, Op]) -> int:
    dropped = 0
    for dst, sources in incoming.items():
        dst_op = kept.get(dst)
        if dst_op is None or dst_op.start_ps is None:
            continue
        # (start, uid) order, as _in_time_order checks it: no cycle survives among timed ops
        # (a damaged profile can tie two starts and link them both ways).
        at = (dst_op.start_ps, dst)
        for src in [s for s in sources if s in kept and ((kept[s].start_ps or 0), s) > at]:
            del sources[src]
            dropped += 1
    return dropped


def _make_node(op: Op, deps: Deps | None, exact_unit: str, enc: NodeEncoder, tally: Tally,
               base_ps: int, base_us: int, base_ns: int) -> bytes:
    """One Chakra node, serialised (converter/wire.py) and counted. Runs once per node (the
    compiled build: for the ops _NodeWriter leaves).
    ``base_ps``: a whole microsecond near the op's times (_time_base), as ``base_us`` and
    ``base_ns`` too."""
    if deps is None:
        data, ctrl = (), ()
    elif type(deps) is int:  # one source (see _resolve_edges)
        one = (deps >> 3,)
        data, ctrl = (one, ()) if deps & 7 == _DATA else ((), one)
    elif type(deps) is tuple:  # two, in the order their edges came
        a, b = deps
        if a & 7 == _DATA:
            data, ctrl = ((a >> 3, b >> 3), ()) if b & 7 == _DATA else ((a >> 3,), (b >> 3,))
        else:
            data, ctrl = ((b >> 3,), (a >> 3,)) if b & 7 == _DATA else ((), (a >> 3, b >> 3))
    else:
        data, ctrl = deps
    start_ps, dur_ps = op.start_ps, op.dur_ps
    kind = op.kind
    node_type = _NODE_TYPE[kind]
    # The end is rounded like the start, so that an edge that holds in picoseconds holds in
    # microseconds too (a rounded duration could end a parent 1 us after its child starts).
    # Times since the epoch in picoseconds are beyond 64 bits; their offsets to the base are
    # not, and, the base being a whole microsecond, round alike: base_us + round_us(offset)
    # is round_us(start_ps) exactly (as base_ns + offset // 1000 is start_ps // 1000).
    offset = None
    small = False  # the times were worked out on C integers (start_ns, duration_ns too)
    if start_ps is None:
        start_us = None
        duration_us = 0 if dur_ps is None else round_us(dur_ps)
    else:
        offset = start_ps - base_ps
        # (the bounds, 2^60 and 2^62 for the base, are literals: the compiled build compares
        # an int with a literal without making an int object of it)
        if (_COMPILED
                and -1_152_921_504_606_846_976 < offset < 1_152_921_504_606_846_976
                and -4_611_686_018_427_387_904 < base_ns < 4_611_686_018_427_387_904
                and (dur_ps is None
                     or -1_152_921_504_606_846_976 < dur_ps < 1_152_921_504_606_846_976)):
            # Offset and duration within 2^60, the base (ns since the epoch) within 2^62: the
            # same arithmetic on C integers (graph.pxd; floor division as Python's), without
            # an int object for each step.
            small = True
            start_ns = duration_ns = None
            small_offset, small_base_us, small_base_ns = offset, base_us, base_ns
            small_offset_us = (small_offset + _C_HALF_US) // _C_US
            start_us = small_base_us + small_offset_us
            if exact_unit == "ns":
                start_ns = small_base_ns + small_offset // 1000
            if dur_ps is None:
                duration_us = 0
            else:
                small_dur = dur_ps
                duration_us = (small_offset + small_dur + _C_HALF_US) // _C_US - small_offset_us
                if exact_unit == "ns":
                    duration_ns = small_dur // 1000
        else:
            offset_us = round_us(offset)
            start_us = base_us + offset_us
            duration_us = 0 if dur_ps is None else round_us(offset + dur_ps) - offset_us
    buf = _new_buffer()
    enc.head(buf, op.uid, enc.name(op.name, node_type), ctrl, data, start_us, duration_us)
    io = op.inputs
    if io is not None:
        enc.io(buf, True, io.values, io.shapes, io.types)
    io = op.outputs
    if io is not None:
        enc.io(buf, False, io.values, io.shapes, io.types)
    # COMM nodes are never host ops for consumers (ASTRA-sim rejects them); gloo's host-side
    # collectives keep that fact in ``host_side``.
    is_comm = kind in _COMM_KINDS
    on_host = not op.on_device
    cpu = on_host and not is_comm
    enc.attr(buf, "is_cpu_op", cpu)
    if is_comm and on_host:
        enc.attr(buf, "host_side", True)
    if exact_unit == "ns":
        if small:
            enc.timing(buf, exact_unit, start_ns, duration_ns)
        else:
            enc.timing(buf, exact_unit, None if offset is None else base_ns + offset // 1000,
                       None if dur_ps is None else dur_ps // 1000)
    else:
        enc.timing(buf, exact_unit, start_ps, dur_ps)
    if dur_ps is None:
        # Say so rather than pass off 0 as a measurement (an ET op that Kineto did not record).
        enc.attr(buf, "duration_unknown", True)
        _count_unknown(tally, "duration_unknown")
    if op.bytes is not None:
        enc.int_attr(buf, "tensor_size", op.bytes, "uint64_val")
    if op.flops is not None:
        enc.int_attr(buf, "num_ops", op.flops)
    comm_type = comm_size = None
    comm = op.comm
    if comm is not None and is_comm:
        for name, value in _comm_attrs(op):
            enc.attr(buf, name, value)
        comm_type = comm.comm_type if kind == _COLLECTIVE else None
        comm_size = comm.size_bytes
    tally.add(node_type, duration_us, len(data), len(ctrl), cpu, comm_type, comm_size)
    enc.attr(buf, "lane", op.lane)
    attrs = op.attrs
    if attrs:
        for name, value in attrs.items():
            enc.attr(buf, name, value)
            if name in UNKNOWN_ATTRS:
                _count_unknown(tally, name)
    return _buffer_bytes(buf)


class _NodeWriter:
    """The compiled build's node writer for the common op: the bytes and counts of
    :func:`_make_node`, with times, ids and dependencies as C integers (graph.pxd) and the
    encoder's caches read in place, where _make_node calls the encoder's general methods for
    each field (it took about half of its instructions). The common op: no communication, its
    start and duration known, its id, times and dependencies within 2^60 (2^62 for the
    graph's base), its attrs a dict (an XLA device op's are not). :meth:`node` returns None
    for any other, which _make_node writes. Plain Python runs _make_node alone, the
    reference: tests hold the two to the same bytes, errors and counts
    (tests/converter/test_node_writer.py)."""

    def __init__(self, enc: NodeEncoder, exact_unit: str, base_ps: int, base_us: int,
                 base_ns: int) -> None:
        self.enc = enc
        self.ns = exact_unit == "ns"
        self.start_prefixes, self.duration_prefixes = _TIMING_PREFIXES[exact_unit]
        # The base within 2^62 in ns (as in _make_node), and in ps where ps are written
        # (base_ps + an offset within 2^60 must fit 63 bits): else every node is _make_node's.
        self.usable = (-4_611_686_018_427_387_904 < base_ns < 4_611_686_018_427_387_904
                       and (exact_unit == "ns"
                            or -1_152_921_504_606_846_976 < base_ps < 1_152_921_504_606_846_976))
        self.base_ps = base_ps
        if self.usable:
            self.base_us, self.base_ns = base_us, base_ns
        self.int_prefixes = {}  # attribute name -> its prefixes for an int value, or ()
        self.names = [{} for _ in range(8)]  # by node type: name -> name and type fields
        self.lanes = {}  # lane -> its attr field
        # is_cpu_op's two fields, as the encoder writes them
        self.cpu_fields = tuple(_attr_field(enc, "is_cpu_op", cpu) for cpu in (False, True))

    def node(self, op: Op, deps: Deps | None, tally: Tally) -> bytes | None:
        found = _COMMON_TYPES.get(op.kind)
        if found is None or not self.usable:
            return None
        node_type = found
        uid, start_ps, dur_ps, attrs = op.uid, op.start_ps, op.dur_ps, op.attrs
        if (type(attrs) is not dict or start_ps is None or dur_ps is None or type(uid) is not int
                or not 0 <= uid < 1_152_921_504_606_846_976
                or not 0 <= dur_ps < 1_152_921_504_606_846_976):
            return None
        offset = start_ps - self.base_ps
        if not -1_152_921_504_606_846_976 < offset < 1_152_921_504_606_846_976:
            return None
        small_offset, small_dur = offset, dur_ps
        offset_us = (small_offset + _C_HALF_US) // _C_US
        start_us = self.base_us + offset_us
        duration_us = (small_offset + small_dur + _C_HALF_US) // _C_US - offset_us
        if self.ns:
            start_time, duration_time = self.base_ns + small_offset // 1000, small_dur // 1000
        else:
            start_time, duration_time = self.base_ps + small_offset, small_dur
        if start_us < 0 or start_time < 0:
            return None
        # The dependencies (see _resolve_edges): one or two as C integers, else two lists.
        data_count = ctrl_count = 0
        data_first = data_second = ctrl_first = ctrl_second = 0
        lists = None
        if deps is not None:
            if type(deps) is int:
                if not 0 <= deps < 1_152_921_504_606_846_976:
                    return None
                first = deps
                if first & 7 == _C_DATA:
                    data_count, data_first = 1, first >> 3
                else:
                    ctrl_count, ctrl_first = 1, first >> 3
            elif type(deps) is tuple:
                a, b = deps
                if (type(a) is not int or type(b) is not int
                        or not 0 <= a < 1_152_921_504_606_846_976
                        or not 0 <= b < 1_152_921_504_606_846_976):
                    return None
                first, second = a, b
                if first & 7 == _C_DATA:
                    data_count, data_first = 1, first >> 3
                else:
                    ctrl_count, ctrl_first = 1, first >> 3
                if second & 7 == _C_DATA:
                    if data_count:
                        data_count, data_second = 2, second >> 3
                    else:
                        data_count, data_first = 1, second >> 3
                elif ctrl_count:
                    ctrl_count, ctrl_second = 2, second >> 3
                else:
                    ctrl_count, ctrl_first = 1, second >> 3
            else:
                lists = deps
        enc = self.enc
        buf = _new_buffer()
        if uid:
            _put_byte(buf, _W_ID)
            _append_varint(buf, uid)
        name = op.name
        names = self.names[node_type]
        field = names.get(name)
        if field is None:
            field = names[name] = enc.name(name, node_type)
        _extend(buf, field)
        if lists is None:
            _packed_pair(buf, _W_CTRL, ctrl_count, ctrl_first, ctrl_second)
            _packed_pair(buf, _W_DATA, data_count, data_first, data_second)
        else:
            data, ctrl = lists
            data_count, ctrl_count = len(data), len(ctrl)
            if ctrl:
                _packed(buf, _W_CTRL, ctrl)
            if data:
                _packed(buf, _W_DATA, data)
        if start_us:
            _put_byte(buf, _W_START)
            _append_varint(buf, start_us)
        if duration_us:
            _put_byte(buf, _W_DURATION)
            _append_varint(buf, duration_us)
        io = op.inputs
        if io is not None and not _io_bytes(buf, _W_INPUTS, io.values, io.shapes, io.types):
            enc.io(buf, True, io.values, io.shapes, io.types)
        io = op.outputs
        if io is not None and not _io_bytes(buf, _W_OUTPUTS, io.values, io.shapes, io.types):
            enc.io(buf, False, io.values, io.shapes, io.types)
        cpu = not op.on_device
        _extend(buf, self.cpu_fields[cpu])
        _int_field(buf, self.start_prefixes, start_time)
        _int_field(buf, self.duration_prefixes, duration_time)
        if op.bytes is not None:
            enc.int_attr(buf, "tensor_size", op.bytes, "uint64_val")
        if op.flops is not None:
            enc.int_attr(buf, "num_ops", op.flops)
        tally.add_plain(node_type, duration_us, data_count, ctrl_count, cpu)
        lane = op.lane
        field = self.lanes.get(lane)
        if field is None:
            field = self.lanes[lane] = _attr_field(enc, "lane", lane)
        _extend(buf, field)
        if attrs:
            for name, value in attrs.items():
                value_type = type(value)
                if value_type is str or value_type is bool:
                    self.cached_attr(buf, name, value)
                elif value_type is int and 0 <= value < 1_152_921_504_606_846_976:
                    prefixes = self.int_prefixes.get(name)
                    if prefixes is None:
                        oneof = oneof_for(name, value)
                        prefixes = self.int_prefixes[name] = (
                            _int_prefixes(name, oneof) if oneof in ("int64_val", "uint64_val")
                            else ())
                    if prefixes:
                        _int_field(buf, prefixes, value)
                    else:
                        enc.attr(buf, name, value)
                else:
                    enc.attr(buf, name, value)
                if name in UNKNOWN_ATTRS:
                    _count_unknown(tally, name)
        return _buffer_bytes(buf)

    def cached_attr(self, buf: bytearray, name: str, value: object) -> None:
        """A str or bool attribute's field, from the encoder's cache where it is there."""
        fields = self.enc._attrs.get(name)
        field = None if fields is None else fields.get(value)
        if field is None:
            self.enc.attr(buf, name, value)  # (which caches it)
        else:
            _extend(buf, field)


def _attr_field(enc: NodeEncoder, name: str, value: object) -> bytes:
    """The whole ``attr`` field ``enc`` writes for one attribute."""
    buf = bytearray()
    enc.attr(buf, name, value)
    return bytes(buf)


def _count_unknown(tally: Tally, name: str) -> None:
    """What inspect counts of the attributes that say a value was not recorded."""
    tally.unknown[name] = tally.unknown.get(name, 0) + 1


def _comm_attrs(op: Op) -> Iterable[tuple[str, object]]:
    comm = op.comm
    if op.kind == _COLLECTIVE and comm.comm_type is not None:
        yield "comm_type", int(comm.comm_type)
    yield "comm_size", comm.size_bytes
    yield "pg_name", "" if comm.group is None else str(comm.group)
    yield "comm_src", comm.src
    yield "comm_dst", comm.dst
    yield "comm_tag", comm.tag


def _metadata_values(trace: LinkedTrace, target: Target, exact_unit: str) -> dict[str, object]:
    """The GlobalMetadata's attributes: the trace's metadata, then what every ET states."""
    fixed = {
        "producer": f"chakra-hooks {__version__}",
        "framework": trace.framework,
        "rank": trace.rank,
        "target": target.value,
        "clock": trace.clock,
        "time_unit": "us (start_time_micros, duration_micros rounded half up)",
        "exact_time_unit": exact_unit,
    }
    return {**{k: v for k, v in trace.metadata.items() if v is not None}, **fixed}
