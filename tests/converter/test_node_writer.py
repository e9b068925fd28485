"""The compiled build's node writer (graph._NodeWriter) against _make_node, the reference:
the same bytes, the same error for a value no Chakra field holds, and the same counts."""

from __future__ import annotations

import random

import pytest

from chakra_hooks._compiled import compiled_status, is_compiled
from chakra_hooks.converter import graph
from chakra_hooks.converter.graph import _make_node, _time_base
from chakra_hooks.converter.summary import Tally
from chakra_hooks.converter.wire import NodeEncoder
from chakra_hooks.linker.model import PS_PER_US, CommInfo, CommType, EdgeKind, Op, OpKind, TensorIO

pytestmark = pytest.mark.skipif(not is_compiled(graph),
                                reason=f"the compiled build's writer ({compiled_status()})")

EPOCH_PS = 1_716_423_322_446_085_432_000  # a Kineto time: picoseconds since the epoch
BIG = 1 << 60  # the writer's bound for ids, offsets and durations


class OtherAttrs:
    """Attrs that are not a dict (as an XLA device op's): the writer leaves the op."""

    def __init__(self, **values: object) -> None:
        self.values = values

    def items(self):
        return self.values.items()

    def __bool__(self) -> bool:
        return bool(self.values)


def _io(rng: random.Random) -> TensorIO | None:
    choice = rng.random()
    if choice < 0.4:
        return None
    if choice < 0.8:  # a PyTorch ET's: its text's bytes
        return TensorIO(b"[[1, 2], 3]" * rng.randrange(3), b"[[4]]" * rng.randrange(2),
                        b'["float"]' * rng.randrange(40))
    return TensorIO("[1]" * rng.randrange(2), b"[[2]]", "")  # str members, as XLA's


# Values of every kind the node fields and attributes take, within their ranges or, where
# ``wild``, beyond them (a conversion's error): a tenth of the ops are wild.
def _value(rng: random.Random, wild: bool) -> object:
    values = ["x", "", "é", True, False, 0, 7, 300, BIG - 1, BIG, (1 << 63) - 1, -1, 2.5,
              [1, 2], ["a"], [], None]
    if wild:
        values += [1 << 63, -(1 << 63) - 1, 1 << 64, [1, "a"]]
    return rng.choice(values)


def _attrs(rng: random.Random, wild: bool) -> object:
    names = ["category", "correlation", "segment", "et_id", "duration_unknown",
             "comm_unresolved", "lane", "tid"]
    if wild:  # attributes of a fixed type (attrs.CONSUMER_ONEOF), which refuse any other
        names += ["tensor_size", "num_ops", "comm_src", "comm_priority"]
    values = {rng.choice(names): _value(rng, wild) for _ in range(rng.randrange(5))}
    return OtherAttrs(**values) if rng.random() < 0.05 else values


def _time(rng: random.Random, base: int, whole_ns: bool, wild: bool) -> int | None:
    choice = rng.random()
    if choice < 0.05:
        return None
    if choice < 0.1:  # beyond the writer's bounds, either side
        offset = rng.choice([BIG, -BIG, BIG + 5_000] + [1 << 64] * wild)
    else:
        offset = rng.randrange(-10 * PS_PER_US, 10_000 * PS_PER_US)
    ps = base + offset
    return ps // 1000 * 1000 if whole_ns else ps


def _duration(rng: random.Random, whole_ns: bool, wild: bool) -> int | None:
    ps = rng.choice([None, 0, 1, 499_999, 500_000, rng.randrange(10**9), rng.randrange(10**9),
                     BIG - 1, BIG] + [-1_000, 1 << 64] * wild)
    return ps if ps is None or not whole_ns else ps // 1000 * 1000


def _source(rng: random.Random) -> int:
    return rng.choice([0, 1, 5, 300, 1 << 20, BIG, 1 << 61]) << 3 | rng.choice(list(EdgeKind))


def _deps(rng: random.Random, wild: bool) -> object:
    choice = rng.random()
    if choice < 0.2:
        return None
    if choice < 0.6:
        return _source(rng)
    if choice < 0.9:
        return (_source(rng), _source(rng))
    return [[rng.choice([1, 2, 1 << 40] + [-1] * wild) for _ in range(rng.randrange(4))],
            [rng.choice([3, 4] + [1 << 64] * wild) for _ in range(rng.randrange(4))]]


def _op(rng: random.Random, base: int, whole_ns: bool, wild: bool) -> Op:
    kind = rng.choice(list(OpKind))
    comm = None
    if kind in (OpKind.COLLECTIVE, OpKind.SEND, OpKind.RECV) or rng.random() < 0.05:
        comm = CommInfo(rng.choice([0, 4096]), CommType.ALL_REDUCE, group=0, src=0, dst=1, tag=2)
    uids = [0, 1, 17, 1 << 20, BIG] + [-3, 1 << 64] * wild
    return Op(rng.choice(uids), rng.choice(["aten::mm", "k", ""]), kind, rng.random() < 0.5,
              rng.choice(["thread:1", "stream:0:7", "", None]), _time(rng, base, whole_ns, wild),
              _duration(rng, whole_ns, wild), comm, rng.choice([None, None, 4096] + [-1] * wild),
              rng.choice([None, None, 10]), _io(rng), _io(rng), _attrs(rng, wild))


def _written(write, op, deps):
    """The node's bytes, or the error a value no Chakra field holds raises (build_graph turns a
    ValueError into the trace's error; a TypeError, a value of a type no attribute takes, is a
    linker's bug)."""
    try:
        return write(op, deps)
    except (ValueError, TypeError) as exc:
        return f"{type(exc).__name__}: {exc}"


@pytest.mark.parametrize("seed", range(12))
def test_the_writer_writes_what_make_node_writes(seed: int) -> None:
    rng = random.Random(seed)
    whole_ns = seed % 3 != 2  # ns in every third graph: ps since the epoch, else small ps
    start = EPOCH_PS if whole_ns else rng.choice([0, 7 * PS_PER_US, 1 << 59])
    wild = [rng.random() < 0.1 for _ in range(400)]
    ops = [_op(rng, start, whole_ns, wild[index]) for index in range(400)]
    unit = "ns" if whole_ns else "ps"
    base_ps = _time_base(ops)
    bases = (base_ps, base_ps // PS_PER_US, base_ps // 1000)
    reference_enc, reference_tally = NodeEncoder(), Tally()
    enc, tally = NodeEncoder(), Tally()
    writer = graph._NodeWriter(enc, unit, *bases)
    written = errors = 0
    for index, op in enumerate(ops):
        deps = _deps(rng, wild[index])
        expected = _written(lambda op, deps: _make_node(op, deps, unit, reference_enc,
                                                        reference_tally, *bases), op, deps)
        body = _written(lambda op, deps: writer.node(op, deps, tally), op, deps)
        if body is None:  # not the common op: build_graph has _make_node write it
            body = _written(lambda op, deps: _make_node(op, deps, unit, enc, tally, *bases),
                            op, deps)
        else:
            written += 1
        assert body == expected, (index, op, deps)
        if isinstance(expected, str):  # a conversion stops at its first error: start over
            errors += 1
            _same_counts(tally, reference_tally)
            reference_enc, reference_tally = NodeEncoder(), Tally()
            enc, tally = NodeEncoder(), Tally()
            writer = graph._NodeWriter(enc, unit, *bases)
    assert written > 60 and errors < 60  # the writer's ops, and the errors, are a share
    _same_counts(tally, reference_tally)


def _same_counts(tally: Tally, reference: Tally) -> None:
    tally.flush()
    for name in ("nodes", "data_deps", "ctrl_deps", "cpu"):
        assert getattr(tally, name) == getattr(reference, name), name
    for name in ("count_by", "duration_by", "comm_types", "comm_bytes", "unknown"):  # in order
        assert list(getattr(tally, name).items()) == list(getattr(reference, name).items()), name


def test_common_ops_are_the_writers() -> None:
    """A PyTorch trace's usual ops (a host op, a kernel; one or two dependencies; inputs as
    bytes; int and str attrs) are written by the writer, not left to _make_node."""
    enc, tally = NodeEncoder(), Tally()
    writer = graph._NodeWriter(enc, "ns", EPOCH_PS, EPOCH_PS // PS_PER_US, EPOCH_PS // 1000)
    io = TensorIO(b"[1]", b"[[2]]", b'["float"]')
    host = Op(3, "aten::mm", OpKind.COMPUTE, False, "thread:1", EPOCH_PS + 5_000, 2_000_000,
              inputs=io, outputs=io, attrs={"et_id": 12, "category": "cpu_op"})
    kernel = Op(4, "gemm", OpKind.COMPUTE, True, "stream:0:7", EPOCH_PS + 9_000, 1_000,
                attrs={"correlation": 5, "category": "kernel"})
    assert writer.node(host, 2 << 3 | EdgeKind.HOST_ORDER, tally) is not None
    two = (3 << 3 | EdgeKind.LAUNCH, 1 << 3 | EdgeKind.DATA)
    assert writer.node(kernel, two, tally) is not None
    tally.flush()
    assert (tally.nodes, tally.count_by, tally.cpu, tally.data_deps, tally.ctrl_deps) == (
        2, {4: 2}, 1, 1, 2)
