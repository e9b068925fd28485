"""The linked trace: one rank's (or one device's) activity on ONE integer clock.

Every reader in ``linker/`` ends here, and the converter starts here knowing nothing about
Kineto, the PyTorch ET or XSpace. All times are integer picoseconds on the clock named by
``LinkedTrace.clock``: picoseconds hold TPU clocks exactly and nanosecond GPU clocks too, and
integers never drift the way float microseconds do. Unit conversion happens in the readers and
nowhere else; the converter only rounds picoseconds to Chakra's microseconds at the very end.
"""

from __future__ import annotations

import enum
from array import array
from dataclasses import dataclass, field
from typing import Union

try:  # read by Cython when it compiles this module (setup.py): see Op
    import cython
except ImportError:  # run as plain Python without Cython installed
    from chakra_hooks.common.no_cython import cython

Picoseconds = int
"""A time or duration in integer picoseconds."""

PS_PER_NS = 1_000
PS_PER_US = 1_000_000
# How late a dependency may end after its dependant started and still be kept (clock noise):
# above the skew between the host and device timestamps of one profile, and under half of
# Chakra's microsecond, so that no kept edge is more than 1 us late in the written ET either
# (the converter rounds ends and starts alike: converter/graph.py).
CLOCK_TOLERANCE_PS = 500_000
# More ranks (devices) than any job runs: a world size or replica group beyond it is damage.
MAX_RANKS = 1 << 24

AttrValue = Union[bool, int, float, str, list[int], list[float], list[str], list[bool]]
"""Extra attribute values. The converter maps bool -> bool_val, int -> int64_val,
float -> double_val, str -> string_val, and lists to the matching *_list oneof."""


class OpKind(enum.IntEnum):
    """What an op is, as the converter needs to know it (maps onto Chakra's NodeType)."""

    COMPUTE = 1  # host op or device kernel -> COMP_NODE
    COLLECTIVE = 2  # -> COMM_COLL_NODE (needs Op.comm with comm_type)
    SEND = 3  # -> COMM_SEND_NODE (needs Op.comm with src, dst, tag)
    RECV = 4  # -> COMM_RECV_NODE
    MEM_LOAD = 5  # host -> device copy -> MEM_LOAD_NODE (Op.bytes = size)
    MEM_STORE = 6  # device -> host copy -> MEM_STORE_NODE
    METADATA = 7  # process-group configuration and the like -> METADATA_NODE


class EdgeKind(enum.IntEnum):
    """Why one op waits for another. DATA edges become Chakra ``data_deps``; the rest
    become ``ctrl_deps``. The kind is kept so that analyses and tests can tell them apart."""

    HOST_ORDER = 1  # program order on one host thread
    PARENT = 2  # a child op runs inside its parent (the child depends on the parent's start)
    LAUNCH = 3  # host launch call -> device op it launched
    STREAM_ORDER = 4  # device ops in order on one stream / queue
    SYNC = 5  # device -> host (stream/device synchronise) or device -> device (event wait)
    DATA = 6  # producer -> consumer through a tensor / HLO operand


class CommType(enum.IntEnum):
    """Chakra ``CollectiveCommType`` values (schema field values, do not renumber)."""

    ALL_REDUCE = 0
    REDUCE = 1
    ALL_GATHER = 2
    GATHER = 3
    SCATTER = 4
    BROADCAST = 5
    ALL_TO_ALL = 6
    REDUCE_SCATTER = 7
    REDUCE_SCATTER_BLOCK = 8
    BARRIER = 9


@dataclass  # slotted by linker/model.pxd when compiled (a C class)
class CommInfo:
    """What a communication op moves and with whom."""

    size_bytes: int
    comm_type: CommType | None = None  # collectives only
    group: int | None = None  # key of LinkedTrace.groups; None = all ranks
    src: int | None = None  # point-to-point: global ranks
    dst: int | None = None
    tag: int | None = None


@dataclass  # slotted by linker/model.pxd when compiled (a C class)
class TensorIO:
    """Inputs or outputs as the Chakra ``IOInfo`` strings: JSON text, as the ET has it, as a
    str or as its UTF-8 bytes (a PyTorch ET's text stays the bytes the file has, which the
    writer copies as they are). Ops may share one (every run of an XLA instruction does):
    nothing changes a TensorIO once made."""

    values: str | bytes = ""
    shapes: str | bytes = ""
    types: str | bytes = ""


# Compiled, ops and edges are C classes that the garbage collector does not track (nothing
# they hold ever refers back to one, so they are in no cycle): 16 bytes less each, of a large
# device's 450 or so per op, and nothing for a collection to walk.
@cython.no_gc
@cython.cclass
@dataclass  # slotted by linker/model.pxd when compiled (a C class)
class Op:
    """One host op, device op, copy or communication, with its measured time."""

    uid: int  # unique within the trace; becomes the Chakra node id
    name: str
    kind: OpKind
    on_device: bool  # False: runs on a host thread (Chakra is_cpu_op = true)
    lane: str  # "thread:<tid>", "stream:<device>:<stream>", "tpu:<chip>:XLA Ops", ...
    start_ps: Picoseconds | None = None
    dur_ps: Picoseconds | None = None
    comm: CommInfo | None = None
    bytes: int | None = None  # bytes touched or copied (Chakra tensor_size)
    flops: int | None = None  # operation count (Chakra num_ops)
    inputs: TensorIO | None = None
    outputs: TensorIO | None = None
    attrs: dict[str, AttrValue] = None  # type: ignore[assignment]  # {} if not given

    def __post_init__(self) -> None:
        # Not field(default_factory=dict): the compiled build's dataclass imports the
        # dataclasses module in every __init__ that runs a default factory.
        if self.attrs is None:
            self.attrs = {}


def shared_key_attrs(*names: str) -> type:
    """A class for the ``Op.attrs`` dicts of the many ops of a trace whose attribute names
    come from one small set known in advance (an idle stretch's: linker/enrich/gaps.py): set
    the attributes on an instance, then take its ``__dict__`` as the op's attrs (the instance
    can go). (An XLA device's ops have C fields instead: linker/xla/link.py:DeviceOpAttrs.)

    CPython keeps the attribute names of a class's instances in one table, so each such dict
    holds only its values (a key-sharing dict, PEP 412): about 124 bytes for up to five items
    against 188 for a dict made with ``{}`` (``sys.getsizeof`` also counts a share of the
    table, large while few dicts share it). They are dicts like any other to every reader;
    one that takes a name outside the set becomes an ordinary dict, as a growing dict does.
    Setting an instance's attributes costs less than setting the items of its ``__dict__``.
    """
    holder = type("SharedKeyAttrs", (), {})
    table = holder().__dict__  # the first dict fills the class's table of names, in order
    for name in names:
        table[name] = None
    return holder


@cython.no_gc  # see Op
@cython.cclass
@dataclass  # slotted by linker/model.pxd when compiled (a C class)
class Edge:
    """``dst`` cannot start before ``src`` (has finished, for every kind but PARENT).

    Not frozen, though nothing changes an edge once made: a frozen dataclass sets each field
    through ``object.__setattr__``, which made creating one 4x slower (a rank has about two
    edges per op)."""

    src: int
    dst: int
    kind: EdgeKind


_EDGE_KINDS = (None, *EdgeKind)  # an EdgeKind by its value (1..6)


@cython.cclass
class EdgeColumns:
    """A trace's edges as three columns (source uid, destination uid, kind): 17 bytes an edge
    where an ``Edge`` and its list slot take 56. A linker that makes millions of edges (an
    XLA device's) keeps them so. The hot readers (``add_gaps``, the converter's
    ``_resolve_edges``) read the arrays in place through ``columns()``; to every other reader
    it is a sequence of edges like a list of ``Edge`` (iterating makes each ``Edge`` as it
    goes), and ``append`` takes one. The columns are whole once ``columns()``, ``len()`` or
    iteration has run: edges are added to a short list first and moved into the columns a
    batch at a time by a loop the compiled build types (an array's own ``append`` or
    ``extend`` parses each value: 300 instructions or so)."""

    def __init__(self) -> None:
        self.src = array("q")
        self.dst = array("q")
        self.kind = array("b")
        self._pending = []  # src, dst, kind, src, dst, kind, ... not in the columns yet

    def add(self, src: int, dst: int, kind: EdgeKind) -> None:
        pending = self._pending
        pending.append(src)
        pending.append(dst)
        pending.append(kind)
        if len(pending) >= 3 * 4096:
            self._flush()

    def append(self, edge: Edge) -> None:
        self.add(edge.src, edge.dst, edge.kind)

    def _flush(self) -> None:
        pending = self._pending
        if pending:
            _move(pending, 0, self.src)
            _move(pending, 1, self.dst)
            _move(pending, 2, self.kind)
            pending.clear()

    def columns(self) -> tuple[array, array, array]:
        """The source, destination and kind columns, whole: for readers that read the edges
        in place rather than as ``Edge`` objects."""
        self._flush()
        return self.src, self.dst, self.kind

    def __len__(self) -> int:
        self._flush()
        return len(self.kind)

    def __iter__(self):
        self._flush()
        return map(Edge, self.src, self.dst, map(_EDGE_KINDS.__getitem__, self.kind))


def _move(pending: list, first: int, column: array) -> None:
    """Append every third item of ``pending`` from ``first`` on to ``column``: room made in
    one step, then filled in place (typed loops in the compiled build: linker/model.pxd)."""
    at = len(column)
    column.frombytes(bytes((len(pending) - first + 2) // 3 * column.itemsize))
    if column.typecode == "b":
        kinds = column
        for i in range(first, len(pending), 3):
            kinds[at] = pending[i]
            at += 1
    else:
        uids = column
        for i in range(first, len(pending), 3):
            uids[at] = pending[i]
            at += 1


@dataclass(slots=True)
class LinkedTrace:
    """One rank's linked trace: what the converter turns into one Chakra ET file."""

    rank: int
    framework: str  # "pytorch", "jax", ...
    clock: str  # which clock the times are on, e.g. "kineto baseTimeNanoseconds" (stated in output)
    ops: list[Op] = field(default_factory=list)
    edges: list[Edge] | EdgeColumns = field(default_factory=list)
    groups: dict[int, list[int]] = field(default_factory=dict)  # process group id -> global ranks
    metadata: dict[str, AttrValue] = field(default_factory=dict)  # copied into GlobalMetadata
    stats: dict[str, float | int] = field(default_factory=dict)  # match rates etc., for summaries
    warnings: list[str] = field(default_factory=list)
    # Annotation ranges that steps after linking read (vLLM engine steps, KV-cache ranges):
    # (name, start ps, duration ps, lane). Not written to the ET.
    annotations: list[tuple[str, int, int, str]] = field(default_factory=list)
