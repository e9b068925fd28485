"""The run as columns: what the run tools (``stats``, ``whatif``, the straggler, ``timeline``,
``scale``) read of a converted run, one rank's ET at a time.

A rank's nodes are kept as arrays in the ET's order (``Columns``): id, type, start and
duration (us, ``nan`` for a node outside time), kind, name and lane (indices into one table of
strings for the run), and dependencies as positions into the same arrays. Attributes are kept
only for the communication nodes (plain values, by node id: what matching reads) and for the
few nodes that carry MoE routing bins or KV-cache bytes. Decoded protobuf nodes are dropped as
soon as a rank's columns are built, unless a writer asks to keep them (``scale``, ``timeline``
of the ranks it draws). A node costs about 60 bytes here, where a decoded node with a dict of
its attributes cost about 3.8 KB.
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from chakra_hooks.linker.enrich.gaps import GAP_NAME

from .attrs import value_of
from .schema import (COMM_COLL, COMM_RECV, COMM_SEND, COMM_TYPE_NAMES, MEM_LOAD, MEM_STORE,
                     METADATA)

try:  # read by Cython when it compiles this module (setup.py): see _scan_frame
    import cython
except ImportError:  # run as plain Python without Cython installed
    from chakra_hooks.common.no_cython import cython

if TYPE_CHECKING:
    from .schema import Node

NAN = float("nan")
# A node's kind, as stats reads it (whatif: host, device and mem are all compute).
HOST, DEVICE, COMM, MEM, GAP = range(5)
KIND_NAMES = ("host", "device", "comm", "mem", "gap")
COMM_TYPES = frozenset((COMM_COLL, COMM_SEND, COMM_RECV))
_MEM = frozenset((MEM_LOAD, MEM_STORE))
UNRESOLVED = "comm_unresolved"  # a NCCL kernel with no known peer: communication all the same
EXTRA_ATTRS = ("moe_expert_tokens", "moe_layer", "kv_direction", "tensor_size")
# The attributes a node's columns are made of (a communication node keeps all of its own).
_READ = frozenset(("start_ns", "duration_ns", "start_ps", "duration_ps", "duration_unknown",
                   "is_cpu_op", "lane", UNRESOLVED, "pg_config", *EXTRA_ATTRS))


class Strings:
    """One table of the names and lanes of a run: each string kept once, nodes hold its index."""

    __slots__ = ("values", "_index")

    def __init__(self) -> None:
        self.values: list[str] = []
        self._index: dict[str, int] = {}

    def add(self, text: str) -> int:
        found = self._index.get(text)
        if found is None:
            found = self._index[text] = len(self.values)
            self.values.append(text)
        return found


class Columns:
    """One rank's nodes in the ET's order (module docstring). ``dep_at[p]:dep_at[p + 1]``
    slices ``deps`` for node p's dependencies (data, then ctrl; its own id and ids not in the
    ET left out), and ``users`` / ``user_at`` the same for the nodes that depend on it."""

    __slots__ = ("ids", "types", "starts", "durs", "kinds", "names", "lanes", "cpu", "dep_at",
                 "deps", "extras", "strings", "pg_config", "_users")

    def __init__(self, strings: Strings) -> None:
        self.strings = strings  # the run's table that ``names`` and ``lanes`` index
        self.ids = array("q")
        self.types = array("i")
        self.starts = array("d")
        self.durs = array("d")
        self.kinds = bytearray()
        self.names = array("i")
        self.lanes = array("i")  # -1: no lane
        self.cpu = bytearray()  # is_cpu_op
        self.dep_at = array("q", [0])
        self.deps = array("q")
        self.extras: dict[int, dict[str, object]] = {}  # position -> MoE / KV attributes
        self.pg_config: str | None = None  # the process groups the rank recorded (JSON)
        self._users: tuple[array, array] | None = None

    def __len__(self) -> int:
        return len(self.ids)

    def append(self, nid: int, node_type: int, start: float | None, dur: float, kind: int,
               name: str = "") -> None:
        """One node without dependencies or lane (a conversion's communication facts)."""
        self.ids.append(nid)
        self.types.append(node_type)
        self.starts.append(NAN if start is None else start)
        self.durs.append(dur)
        self.kinds.append(kind)
        self.names.append(self.strings.add(name))
        self.lanes.append(-1)
        self.cpu.append(0)
        self.dep_at.append(len(self.deps))

    def users(self) -> tuple[array, array]:
        """(user_at, users): per node, the positions that depend on it, in the ET's order (a
        node depending twice on one counts twice, as its dependencies do)."""
        if self._users is None:
            self._users = _users_of(len(self.ids), self.deps, self.dep_at)
        return self._users

    def name(self, p: int) -> str:
        return self.strings.values[self.names[p]]

    def unreached(self) -> list[int]:
        """Positions of the nodes no replay reaches (on or behind a dependency cycle)."""
        finish = longest_path(self, self.durs)[0]
        return [p for p in range(len(finish)) if finish[p] != finish[p]]

    def start(self, p: int) -> float | None:
        s = self.starts[p]
        return None if s != s else s

    def retimed(self, starts: array, durs: array) -> Columns:
        """The same nodes with other times (the graph and tables shared)."""
        other = Columns.__new__(Columns)
        for name in Columns.__slots__:
            setattr(other, name, getattr(self, name))
        other.starts, other.durs = starts, durs
        return other


def _users_of(n: int, deps: array, dep_at: array) -> tuple[array, array]:
    """Columns.users of ``n`` nodes with dependencies ``deps`` / ``dep_at`` (typed loops in the
    compiled build: run_model.pxd)."""
    count = array("q", bytes(8 * (n + 1)))
    users = array("q", bytes(8 * len(deps)))
    fill = array("q", bytes(8 * (n + 1)))
    # The same arrays as typed views in the compiled build, indexed in C (run_model.pxd).
    count_v, users_v, fill_v, deps_v, dep_at_v = count, users, fill, deps, dep_at
    for k in range(len(deps)):
        count_v[deps_v[k] + 1] += 1
    for p in range(n):
        count_v[p + 1] += count_v[p]
    for p in range(n + 1):
        fill_v[p] = count_v[p]
    for p in range(n):
        for k in range(dep_at_v[p], dep_at_v[p + 1]):
            d = deps_v[k]
            users_v[fill_v[d]] = p
            fill_v[d] += 1
    return count, users


def longest_path(c: Columns, dur: array) -> tuple[array, array, int]:
    """The critical path over a rank's columns (stats.py ``critical_path``, by position): each
    node's earliest finish after its dependencies with durations ``dur`` (nan: never reached,
    behind a cycle), the node that decided its start (-1: none), and the node that finishes
    last (the first to get there; -1 for no node)."""
    n = len(c)
    user_at, users = c.users()
    if type(dur) is not array or dur.typecode != "d":
        dur = array("d", dur)
    waiting = array("q", bytes(8 * n))
    start = array("d", bytes(8 * n))
    via = array("q", [-1]) * n
    finish = array("d", [float("nan")]) * n
    # The same arrays as typed views in the compiled build, indexed in C (run_model.pxd).
    user_at_v, users_v, dep_at_v, dur_v = user_at, users, c.dep_at, dur
    waiting_v, start_v, via_v, finish_v = waiting, start, via, finish
    ready = []
    for p in range(n):
        waiting_v[p] = dep_at_v[p + 1] - dep_at_v[p]
        if waiting_v[p] == 0:
            ready.append(p)
    best, last = 0.0, -1
    while ready:
        p = ready.pop()
        f = start_v[p] + dur_v[p]
        finish_v[p] = f
        if last < 0 or f > best:
            best, last = f, p
        for k in range(user_at_v[p], user_at_v[p + 1]):
            user = users_v[k]
            if via_v[user] < 0 or f > start_v[user]:
                start_v[user] = f
                via_v[user] = p
            waiting_v[user] -= 1
            if waiting_v[user] == 0:
                ready.append(user)
    return finish, via, last


PS_PER_UNIT = {"ps": 1, "ns": 1_000, "us": 1_000_000}
_US_PER_PS = {1: 1e-6, 1_000: 1e-3, 1_000_000: 1.0}  # (exact factors: 1000 * 1e-6 is not 1e-3)


def node_time_fields(node: Node, attrs: Mapping[str, object]) -> tuple[int, object, object]:
    """(ps per unit, start or None, duration) of a node, as recorded: in its finest unit
    (``start_ns`` / ``duration_ns``, ``_ps``, else whole microseconds). An exact duration
    counts without its start too; a duration said to be unknown is 0 (a negative exact one is
    kept, for the reader to refuse)."""
    return _time_fields(node.start_time_micros, node.duration_micros, attrs, value_of)


def _time_fields(start_micros: int, duration_micros: int, attrs: Mapping[str, object],
                 read: Callable[[object], object]) -> tuple[int, object, object]:
    """node_time_fields of a node's two microsecond fields and its attributes, each attribute's
    value taken by ``read`` (``value_of``, or as it is where the values are plain)."""
    for unit in ("ns", "ps"):
        if f"start_{unit}" in attrs:
            key = f"duration_{unit}"
            return (PS_PER_UNIT[unit], read(attrs[f"start_{unit}"]),
                    read(attrs[key]) if key in attrs else 0)
    start = start_micros or None  # (0: never set, a node outside time)
    for unit in ("ns", "ps"):  # an exact duration without its start
        if f"duration_{unit}" in attrs:
            dur = read(attrs[f"duration_{unit}"])
            per = PS_PER_UNIT[unit]
            return (per, None if start is None else start * (PS_PER_UNIT["us"] // per),
                    0 if "duration_unknown" in attrs and dur >= 0 else dur)
    return PS_PER_UNIT["us"], start, 0 if "duration_unknown" in attrs else duration_micros


def node_times(node: Node, attrs: Mapping[str, object]) -> tuple[float | None, float]:
    """(start us or None, duration us) at the finest precision the node carries."""
    return _in_us(*node_time_fields(node, attrs))


def _in_us(per: int, start: object, dur: object) -> tuple[float | None, float]:
    scale = _US_PER_PS[per]
    return (None if start is None else start * scale), dur * scale


def _as_is(value: object) -> object:
    return value


LONGEST_US = 86_400e6  # a node longer than a day is said: a clock or unit gone wrong


def columns_of(nodes: Iterable[Node], strings: Strings, path: str = "<nodes>",
               warn: Callable[[str], None] | None = None, frames: Sequence[bytes] | None = None
               ) -> tuple[Columns, dict[int, dict]]:
    """A rank's decoded nodes as Columns, and its communication nodes' attributes (node id ->
    name -> plain value; the last of a name wins, as in consumers' lookups). ``frames``: the
    nodes' frames in the file (etio.read_et's), which the compiled build reads most nodes'
    fields from (_scan_frame).

    What no figure can be made of is refused (TraceFormatError: a node id used twice, a
    negative duration); what the figures leave out is said to ``warn`` (dependencies on nodes
    not in the file, nodes on or behind a dependency cycle, durations over a day)."""
    from chakra_hooks.common.errors import TraceFormatError

    c = Columns(strings)
    comm: dict[int, dict] = {}
    wanted: list[tuple[int, ...]] = []
    position: dict[int, int] = {}
    ids, types, starts, durs, kinds = c.ids, c.types, c.starts, c.durs, c.kinds
    names, lanes, cpu = c.names, c.lanes, c.cpu
    add = strings.add
    read = _READ
    if not _SCAN_FRAMES:
        frames = None
    for p, node in enumerate(nodes):
        scanned = None if frames is None else _scan_frame(frames[p])
        if scanned is None:
            nid = node.id
            node_type = node.type
            attrs = {}
            for a in node.attr:  # only what the columns hold (the last of a name wins)
                if a.name in read:
                    attrs[a.name] = a
            if node_type in COMM_TYPES or UNRESOLVED in attrs:  # communication: every attribute
                attrs = {a.name: a for a in node.attr}
            start, dur = node_times(node, attrs)
            name = node.name
            is_cpu = "is_cpu_op" in attrs and bool(value_of(attrs["is_cpu_op"]))
            lane = str(value_of(attrs["lane"])) if "lane" in attrs else None
            wanted.append((*node.data_deps, *node.ctrl_deps))
        else:  # plain values (no communication node, no extras: see _scan_frame)
            nid, node_type, name, start_micros, duration_micros, node_deps, attrs = scanned
            start, dur = _in_us(*_time_fields(start_micros, duration_micros, attrs, _as_is))
            is_cpu = "is_cpu_op" in attrs and bool(attrs["is_cpu_op"])
            lane = str(attrs["lane"]) if "lane" in attrs else None
            wanted.append(node_deps)
        if not dur >= 0:  # (nan too)
            raise TraceFormatError(path, f"node {nid}", f"a duration of 0 or more, not {dur} us")
        if dur > LONGEST_US and warn is not None:
            warn(f"{path}: node {nid} ({name[:60]}) lasts {dur / 3.6e9:,.1f} h: a clock or "
                 "unit gone wrong? Its time is taken as it is")
        if name == GAP_NAME:
            kind = GAP
        elif node_type in COMM_TYPES or UNRESOLVED in attrs:
            kind = COMM
        elif node_type in _MEM:
            kind = MEM
        else:
            kind = HOST if is_cpu else DEVICE
        ids.append(nid)
        types.append(node_type)
        starts.append(NAN if start is None else start)
        durs.append(dur)
        kinds.append(kind)
        names.append(add(name))
        lanes.append(add(lane) if lane is not None else -1)
        cpu.append(is_cpu)
        if kind == COMM:
            comm[nid] = {k: value_of(v) for k, v in attrs.items()}
        if "pg_config" in attrs:
            c.pg_config = str(value_of(attrs["pg_config"]))
        if "moe_expert_tokens" in attrs or "kv_direction" in attrs:
            c.extras[p] = {k: value_of(attrs[k]) for k in EXTRA_ATTRS if k in attrs}
        if nid in position:
            raise TraceFormatError(path, f"node {nid}", f"a node id used once; nodes "
                                   f"#{position[nid]} and #{p} both have it")
        position[nid] = p
    deps, dep_at = c.deps, c.dep_at
    dangling, example = 0, None
    for p, ds in enumerate(wanted):
        nid = ids[p]
        for d in ds:
            if d != nid:
                q = position.get(d)
                if q is not None:
                    deps.append(q)
                else:
                    dangling += 1
                    example = example or (nid, d)
        dep_at.append(len(deps))
    if warn is not None:
        if dangling:
            warn(f"{path}: {dangling:,} dependencies name nodes not in the file (e.g. node "
                 f"{example[0]} on {example[1]}): left out")
        strange = [p for p in range(len(ids)) if not METADATA <= types[p] <= COMM_COLL]
        if strange:
            p = strange[0]
            warn(f"{path}: {len(strange):,} node(s) have a type the Chakra schema does not have "
                 f"(e.g. node {ids[p]}: {types[p]}): taken as compute")
        odd = [(nid, a["comm_type"]) for nid, a in comm.items() if "comm_type" in a and not (
            isinstance(a["comm_type"], int) and 0 <= a["comm_type"] < len(COMM_TYPE_NAMES))]
        if odd:
            warn(f"{path}: {len(odd):,} communication node(s) have a comm_type the Chakra schema "
                 f"does not have (e.g. node {odd[0][0]}: {odd[0][1]})")
        timed = sorted(x for x in starts if x == x)
        if timed:
            middle = timed[len(timed) // 2]
            far = [p for p in range(len(ids)) if abs(starts[p] - middle) > LONGEST_US]
            if far:
                p = far[0]
                warn(f"{path}: {len(far):,} node(s) start more than a day from the rank's other "
                     f"nodes (e.g. node {ids[p]}, {(starts[p] - middle) / 8.64e10:+,.1f} days): "
                     "a clock gone wrong? Their times are taken as they are")
        stuck = c.unreached()
        if stuck:
            warn(f"{path}: {len(stuck):,} of {len(ids):,} nodes are on or behind a dependency "
                 f"cycle (e.g. node {ids[stuck[0]]}): no replay runs them, and no figure here "
                 "counts them")
    return c, comm


# ------------------------------------------------------------------ reading nodes from frames
# The compiled build reads the column fields of most nodes straight from their frames (each
# Node message's bytes in the file), after protobuf has parsed the whole file, which checks
# every byte as before. Read through the parsed messages, each attribute read made Python
# objects: 11-16 us a node, where parsing the whole file takes 1-2 us a node.
_SCAN_FRAMES = cython.compiled
# The AttributeProto oneofs whose values the scanner reads (formats.md), and the wire type of
# each; an attribute the columns read in any other oneof leaves its node to the parsed message.
_INT64_VAL, _UINT64_VAL, _BOOL_VAL, _STRING_VAL = 9, 13, 27, 29
_TIME_ATTRS = frozenset(("start_ns", "duration_ns", "start_ps", "duration_ps"))
# Attributes whose node the columns read more of (communication, process groups, MoE / KV
# extras): such a node is read from its parsed message.
_WHOLE_NODE_ATTRS = frozenset((UNRESOLVED, "pg_config", "moe_expert_tokens", "kv_direction"))
_after_varint = 0  # where the varint _varint read last ends (-1: it did not end in bounds)


def _scan_frame(frame: bytes) -> tuple | None:
    """(id, type, name, start_time_micros, duration_micros, dependencies, attributes) of one
    Node frame (its length prefix first), as protobuf reads them: the dependencies data first,
    then ctrl; of the attributes, those of _READ by name (the last of a name wins), as plain
    values. None where the columns need more of the node (a communication node, an attribute
    of _WHOLE_NODE_ATTRS) or the frame holds what this reader does not follow (an unknown
    field, a field of another wire type than the schema's, an attribute the columns read in
    another oneof): the caller reads the parsed message then. Protobuf has parsed the frame
    already, so its bytes are well formed and its strings UTF-8."""
    return _scan_node(frame, len(frame))


def _scan_node(frame: bytes, n: int) -> tuple | None:
    at = 0
    while at < n and frame[at] & 0x80:  # the length prefix
        at += 1
    at += 1
    nid = node_type = start = dur = 0
    name = ""
    data_deps: list = []
    ctrl_deps: list = []
    values: dict = {}
    while at < n:
        key = _varint(frame, at, n)
        at = _after_varint
        if at < 0:
            return None
        field = key >> 3
        wire = key & 7
        if wire == 0:
            value = _varint(frame, at, n)
            at = _after_varint
            if at < 0:
                return None
            if field == 1:
                nid = value
            elif field == 3:
                if value > 0x7FFFFFFF:  # an enum is an int32: protobuf would wrap it
                    return None
                node_type = value
            elif field == 4:
                ctrl_deps.append(value)
            elif field == 5:
                data_deps.append(value)
            elif field == 6:
                start = value
            elif field == 7:
                dur = value
            else:
                return None
        elif wire == 2:
            size = _varint(frame, at, n)
            at = _after_varint
            if at < 0 or size > n - at:
                return None
            end = at + size
            if field == 2:
                name = frame[at:end].decode("utf-8")
            elif field == 4 or field == 5:  # packed dependencies
                deps = ctrl_deps if field == 4 else data_deps
                while at < end:
                    deps.append(_varint(frame, at, end))
                    at = _after_varint
                    if at < 0:
                        return None
            elif field == 10:
                if not _scan_attr(frame, at, end, values):
                    return None
            elif field != 8 and field != 9:  # inputs and outputs: not read
                return None
            at = end
        else:
            return None
    if node_type in COMM_TYPES:
        return None
    return nid, node_type, name, start, dur, (*data_deps, *ctrl_deps), values


def _scan_attr(frame: bytes, at: int, end: int, values: dict) -> bool:
    """The AttributeProto at frame[at:end] into ``values`` where the columns read its name;
    False where its node must be read from the parsed message."""
    name_at = name_end = text_at = text_end = -1
    which = 0  # the oneof set last (0: none)
    number = 0
    while at < end:
        key = _varint(frame, at, end)
        at = _after_varint
        if at < 0:
            return False
        field = key >> 3
        wire = key & 7
        if field == 1 or field == 2 or field == _STRING_VAL:  # name, doc_string, string_val
            if wire != 2:
                return False
        elif field == _INT64_VAL or field == _UINT64_VAL or field == _BOOL_VAL:
            if wire != 0:
                return False
        elif not 3 <= field <= 32:
            return False
        if wire == 0:
            number = _varint(frame, at, end)
            at = _after_varint
            if at < 0:
                return False
        elif wire == 2:
            size = _varint(frame, at, end)
            at = _after_varint
            if at < 0 or size > end - at:
                return False
            if field == 1:
                name_at, name_end = at, at + size
            elif field == _STRING_VAL:
                text_at, text_end = at, at + size
            at += size
        elif wire == 1:
            at += 8
        elif wire == 5:
            at += 4
        else:
            return False
        if at > end:
            return False
        if field >= 3:
            which = field
    name = frame[name_at:name_end].decode("utf-8") if name_at >= 0 else ""
    if name not in _READ:
        return True
    if name in _WHOLE_NODE_ATTRS:
        return False
    if which == 0:
        value = None
    elif which == _STRING_VAL and name == "lane":
        value = frame[text_at:text_end].decode("utf-8")
    elif which == _BOOL_VAL and name == "is_cpu_op":
        value = number != 0
    elif (which == _INT64_VAL or which == _UINT64_VAL) and name in _TIME_ATTRS:
        value = number  # (under 2^63: _varint reads no longer varint)
    elif name == "duration_unknown" or name == "moe_layer" or name == "tensor_size":
        value = None  # only its presence is read here (the extras are whole-node)
    else:
        return False
    values[name] = value
    return True


def _varint(frame: bytes, at: int, end: int) -> int:
    """The varint at ``at`` (its end in _after_varint; -1 there when it does not end before
    ``end`` or within 9 bytes: a value of 2^63 or more, a negative int64 say, is left to the
    parsed message)."""
    global _after_varint
    value = 0
    shift = 0
    while at < end and shift < 63:
        byte = frame[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            _after_varint = at
            return value
        shift += 7
    _after_varint = -1
    return 0


@dataclass
class Rank:
    """One rank's ET as the run tools read it: its nodes as ``Columns``, its communication
    nodes' attributes (``comm``: node id -> name -> value; plain values, or AttributeProtos
    where a writer kept them), and where it ran."""

    rank: int
    path: str
    columns: Columns
    comm: dict[int, Mapping[str, object]] = field(default_factory=dict)
    host: str | None = None  # the machine it ran on, where the recording says (ET metadata)
    clock: str | None = None  # its machine's clock (``host_clock``): one clock, one value
    made_from: int | None = None  # not recorded: made by ``scale`` from this rank's ET
    nodes: Sequence[Node] | None = None  # the decoded ET, kept where a writer asked for it
    _where: dict[int, int] | None = field(default=None, repr=False)

    @classmethod
    def of_nodes(cls, rank: int, path: str, nodes: Sequence[Node], strings: Strings | None = None,
                 keep: bool = True, warn: Callable[[str], None] | None = None,
                 frames: Sequence[bytes] | None = None, **where) -> Rank:
        """A rank of decoded nodes (``keep``: the nodes kept beside the columns; ``warn``: what
        ``columns_of`` says; ``frames``: the nodes' frames, see ``columns_of``)."""
        columns, comm = columns_of(nodes, strings or Strings(), path, warn, frames)
        return cls(rank, path, columns, comm, nodes=nodes if keep else None, **where)

    def position(self, nid: int) -> int:
        """Where a communication node sits in the columns."""
        if self._where is None:
            ids = self.columns.ids
            self._where = {ids[p]: p for p in range(len(ids)) if ids[p] in self.comm}
        return self._where[nid]

    def time(self, nid: int) -> tuple[float | None, float]:
        """(start us or None, duration us) of a communication node."""
        p = self.position(nid)
        return self.columns.start(p), self.columns.durs[p]

    def comm_nodes(self) -> Iterable[tuple[int, int, float | None, float]]:
        """(id, type, start or None, duration) of each communication node, in the ET's order."""
        c = self.columns
        for nid in self.comm:
            p = self.position(nid)
            yield nid, c.types[p], c.start(p), c.durs[p]

    def start(self) -> float:
        starts = self.columns.starts
        return min((s for s in starts if s == s), default=0.0)

    def retimed(self, shift_us: float = 0.0, duration_factor: float = 1.0, **where) -> Rank:
        """The same rank with every start moved by ``shift_us`` and every duration scaled (a
        clock that disagrees, a slower rank), and ``host`` / ``clock`` as given."""
        c = self.columns
        starts = array("d", (s + shift_us for s in c.starts))
        durs = array("d", (d * duration_factor for d in c.durs))
        return replace(self, columns=c.retimed(starts, durs), _where=None, **where)


def ranks_at_least(ranks: Sequence[Rank]) -> int:
    """The smallest run the ranks present can be from (where no ET states ``world_size``)."""
    return max((r.rank for r in ranks), default=-1) + 1


def host_and_clock(meta: Mapping[str, object] | None) -> tuple[str | None, str | None]:
    """(host, host_clock) from an ET's metadata, each None where it is not a string."""
    meta = meta or {}
    return tuple(v if isinstance(v, str) and v else None
                 for v in (meta.get("host"), meta.get("host_clock")))


GROUPS_FILE = "comm_group.json"


def read_groups(folder) -> dict[str, list[int]]:
    """The process groups of ``comm_group.json`` in ``folder`` (group -> ranks), or none."""
    from pathlib import Path

    import orjson

    from chakra_hooks.common.errors import TraceFormatError, json_kind

    beside = Path(folder) / GROUPS_FILE
    if not beside.exists():
        return {}
    try:
        loaded = orjson.loads(beside.read_bytes())
    except orjson.JSONDecodeError as exc:
        raise TraceFormatError(beside, "file", f"JSON, a process group -> ranks object ({exc})"
                               ) from None
    if not isinstance(loaded, dict) or not all(isinstance(v, list) for v in loaded.values()):
        raise TraceFormatError(beside, "file", "a process group -> ranks object")
    out = {}
    for name, members in loaded.items():
        if not all(type(m) is int and m >= 0 for m in members) or len(set(members)) < len(members):
            raise TraceFormatError(beside, f"group {name!r}", "its ranks as distinct whole "
                                   f"numbers, not {json_kind(members) if not members else members[:8]}")
        out[str(name)] = list(members)
    return out


PARALLEL_FROM = 64  # ranks: fewer are read in this process (a worker costs ~0.5 s to start)


@dataclass
class _Read:
    """One ET as read: its Rank, the rank its metadata and its name give (None: not said),
    the run's size it states (0: none), and what reading it said."""

    rank: Rank
    stated: int | None
    named: int | None
    world: int
    said: list[str]
    target: str = ""  # the conversion's target (metadata)


def _read_one(path, position: int, strings: Strings, keep: bool) -> _Read:
    """One ET as a Rank (rank from its metadata, else its name, else ``position``)."""
    from . import etio

    et = etio.read_et(path, keep_frames=_SCAN_FRAMES)
    meta = {a.name: value_of(a) for a in et.metadata.attr}
    stated = int(meta["rank"]) if isinstance(meta.get("rank"), int) else None
    named = etio.name_and_rank(path)[1]
    rank = stated if stated is not None else named if named is not None else position
    world = int(meta["world_size"]) if isinstance(meta.get("world_size"), int) else 0
    host, clock = host_and_clock(meta)
    made = meta.get("made_from_rank")
    said: list[str] = []
    return _Read(Rank.of_nodes(rank, str(path), et.nodes, strings, keep, said.append,
                               frames=et.frames, host=host, clock=clock,
                               made_from=made if isinstance(made, int) else None),
                 stated, named, world, said, str(meta.get("target", "")))


def _read_some(items: Sequence[tuple[int, str]]) -> tuple[list[str], list[_Read]]:
    """``_read_one`` of each (position, path) in a worker: its strings, and what it read."""
    strings = Strings()
    return strings.values, [_read_one(path, position, strings, False)
                            for position, path in items]


def _read_in_workers(paths: Sequence, strings: Strings, progress: bool | None, workers: int
                     ) -> list[_Read]:
    """``_read_one`` of every path, in chunks over ``workers`` processes; each rank's names and
    lanes then index ``strings``."""
    from chakra_hooks.executors import make_executor, progress_bar

    items = [(position, str(path)) for position, path in enumerate(paths)]
    size = -(-len(items) // (4 * workers))  # a few chunks a worker: they even out
    chunks = [(items[i:i + size],) for i in range(0, len(items), size)]
    executor = make_executor("local", workers, len(chunks), progress)
    bar = progress_bar(len(chunks), progress)
    try:
        results = executor.map(_read_some, chunks, bar)
    finally:
        bar.close()
        executor.close()
    out = []
    for values, read in results:
        table = array("i", [strings.add(text) for text in values])
        for one in read:
            c = one.rank.columns
            c.names = array("i", [table[i] for i in c.names])
            c.lanes = array("i", [-1 if i < 0 else table[i] for i in c.lanes])
            c.strings = strings
            out.append(one)
    return out


def recorded_groups(pg_config: str | None, world: int) -> dict[str, list[int]]:
    """Process group -> ranks as a rank recorded them (torch's pg_config: ``ranks`` [] for a
    group of the whole run, its size then ``group_size``); groups it does not say left out."""
    import orjson

    try:
        configs = orjson.loads(pg_config) if pg_config else []
    except orjson.JSONDecodeError:
        return {}
    out = {}
    for cfg in configs if isinstance(configs, list) else ():
        if not isinstance(cfg, dict) or not isinstance(cfg.get("pg_name"), str):
            continue
        ranks, size = cfg.get("ranks"), cfg.get("pg_size", cfg.get("group_size"))
        if isinstance(ranks, list) and ranks and all(type(r) is int for r in ranks):
            out[cfg["pg_name"]] = sorted(ranks)
        elif ranks == [] and world and size == world:
            out[cfg["pg_name"]] = list(range(world))
    return out


def _check_run(read: Sequence[_Read], groups: Mapping[str, Sequence[int]], world: int,
               groups_file, warn: Callable[[str], None] | None) -> None:
    """The ETs are one run's, one per rank, and agree with ``comm_group.json``: refused
    (TraceFormatError) where not; process groups it does not list are said to ``warn``."""
    from pathlib import Path

    from chakra_hooks.common.errors import TraceFormatError

    stated = {one.world for one in read if one.world}
    if len(stated) > 1:
        first = next(one for one in read if one.world)
        other = next(one for one in read if one.world and one.world != first.world)
        raise TraceFormatError(other.rank.path, "metadata", f"world_size {first.world} as "
                               f"{first.rank.path} says: the ETs of one run (this one says "
                               f"{other.world})")
    # One rank of --target astra-sim is written as NPUs 0 and 1 (the same ET twice): the only
    # run in which two files may state one rank.
    one_rank = (len(read) == 2 and len({one.stated for one in read}) == 1
                and all(one.target == "astra-sim" for one in read))
    seen: dict[int, str] = {}
    for one in read:
        r = one.rank
        if one.stated is not None and one.named is not None and one.stated != one.named:
            if not one_rank:
                raise TraceFormatError(r.path, "metadata", f"rank {one.named}, as the file's "
                                       f"name says; its metadata says rank {one.stated} (a "
                                       "copy of another rank's ET?)")
            r.rank = one.named
        if r.rank in seen:
            raise TraceFormatError(r.path, "metadata", f"one ET per rank; rank {r.rank} is "
                                   f"also {seen[r.rank]} (ETs of two runs?)")
        seen[r.rank] = r.path
        if world and not 0 <= r.rank < world and not one_rank:
            raise TraceFormatError(r.path, "metadata", f"a rank below the run's world_size "
                                   f"{world}, not {r.rank}")
    for name, members in groups.items():
        beyond = [m for m in members if world and m >= world]
        if beyond:
            raise TraceFormatError(groups_file, f"group {name!r}", f"ranks below the run's "
                                   f"world_size {world}, not {beyond[0]}")
    for one in read:  # the groups each rank recorded (torch's pg_config) against the file's
        for name, recorded in recorded_groups(one.rank.columns.pg_config, world).items():
            listed = groups.get(name)
            if listed is not None and sorted(listed) != recorded:
                raise TraceFormatError(groups_file, f"group {name!r}", f"the ranks "
                                       f"{recorded[:8]} that {one.rank.path} recorded for it "
                                       f"(pg_config), not {sorted(listed)[:8]}")
    unlisted: dict[str, int] = {}
    for one in read:
        r = one.rank
        for nid, a in r.comm.items():
            group = a.get("pg_name")
            if group is None or str(group) in ("", "0"):
                continue
            group = str(group)
            members = groups.get(group)
            if members is None:
                unlisted[group] = unlisted.get(group, 0) + 1
            elif r.rank not in members:
                raise TraceFormatError(groups_file, f"group {group!r}", f"rank {r.rank} among "
                                       f"its members {list(members)[:8]}: node {nid} of "
                                       f"{r.path} is a collective of that group")
    if unlisted and (groups or Path(str(groups_file)).is_file()) and warn is not None:
        names = ", ".join(repr(g) for g in list(unlisted)[:4]) + (", ..." if len(unlisted) > 4
                                                                  else "")
        warn(f"{groups_file}: lists no members for process group(s) {names}, which "
             f"{sum(unlisted.values()):,} communication node(s) name: their waits for peers are "
             "unknown")


def read_run(paths: Sequence, keep_nodes: bool | Iterable[int] = False,
             progress: bool | None = False, workers: int | None = 1,
             warn: Callable[[str], None] | None = None
             ) -> tuple[list[Rank], dict[str, list[int]], int]:
    """The ETs of one run as Ranks, read one at a time (rank from each file's metadata, else
    its position), the process groups from ``comm_group.json`` beside the first file, and the
    run's size: the largest ``world_size`` an ET states, else the smallest that holds the ranks
    present. ``keep_nodes``: True, or the positions in ``paths`` whose decoded nodes to keep.
    Damage is refused (TraceFormatError naming the file, the record and what was expected:
    ``columns_of``, ``_check_run``) or said to ``warn``. ``workers``: processes to read a run
    of ``PARALLEL_FROM`` ranks or more on (none kept;
    None: one per core; spawned, so a script that asks for them needs ``if __name__ ==
    "__main__"``). ``progress``: a bar on stderr (None: where stderr is a terminal)."""
    from pathlib import Path

    keep = (lambda _: True) if keep_nodes is True else (
        (lambda _: False) if not keep_nodes else set(keep_nodes).__contains__)
    strings = Strings()
    workers = workers or os.cpu_count() or 1
    if len(paths) >= PARALLEL_FROM and not keep_nodes and workers > 1:
        read = _read_in_workers(paths, strings, progress, workers)
    else:
        read = [_read_one(path, position, strings, keep(position))
                for position, path in enumerate(paths)]
    for one in read:
        for message in one.said if warn is not None else ():
            warn(message)
    world = max((one.world for one in read), default=0)
    folder = Path(str(paths[0])).parent if paths else None
    groups = read_groups(folder) if folder is not None else {}
    _check_run(read, groups, world, folder / GROUPS_FILE if folder else "", warn)
    ranks = [one.rank for one in read]
    return ranks, groups, world or ranks_at_least(ranks)
