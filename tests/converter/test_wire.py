"""converter/wire.py writes Node bytes itself; protobuf's own serialiser is the second opinion."""

from __future__ import annotations

import random

import pytest

from chakra_hooks.converter import wire
from chakra_hooks.converter.attrs import make_attr, oneof_for
from chakra_hooks.converter.schema import GlobalMetadata, IOInfo, Node

def written(method, *args) -> bytes:
    """What an encoder method appends to an empty node buffer."""
    buf = bytearray()
    method(buf, *args)
    return bytes(buf)


ATTRS = [
    ("is_cpu_op", True), ("is_cpu_op", False), ("host_side", True),
    ("lane", "stream:0:7"), ("lane", ""), ("name with é", "välue ✓"),
    ("start_ns", 1716423322446085432), ("duration_ns", 0), ("duration_ns", 127),
    ("duration_ns", 16383), ("duration_ns", 16384), ("duration_ns", (1 << 28) - 1),
    ("duration_ns", 1 << 28), ("et_id", -1), ("et_id", -(1 << 63)), ("et_id", (1 << 63) - 1),
    ("tensor_size", 0), ("tensor_size", (1 << 64) - 1), ("num_ops", 123456789012),
    ("comm_type", 6), ("comm_size", 1 << 40), ("comm_src", -1), ("comm_dst", 7),
    ("comm_tag", (1 << 31) - 1), ("pg_name", "3"), ("ratio", 0.25), ("ratio", -1e300),
    ("tokens_per_expert", [3, 0, 5]), ("experts", ["a", "b"]), ("empty", []),
    ("flags", [True, False]), ("scales", [0.5, 2.0]), ("", 5), ("n" * 20000, 7),
    ("ranks", list(range(0, 300, 7))), ("ids", [-1, -(1 << 63), (1 << 63) - 1, 0]),
    ("names", ["", "é", "x" * 200]), ("pair", (4, 5)), ("involved_dim", [True]),
    ("involved_dim", []), ("no_strings", [""]), ("nan", [float("nan"), -0.0, 1e308]),
    ("mixed", [1.5, 2]), ("mixed", [True, 1]),
]


@pytest.mark.parametrize(("name", "value"), ATTRS)
def test_attribute_bytes_equal_protobufs(name: str, value: object) -> None:
    expected = Node(attr=[make_attr(name, value)]).SerializeToString()
    assert written(wire.NodeEncoder().attr, name, value) == expected
    oneof = oneof_for(name, value)
    if type(value) is int and oneof in ("int64_val", "uint64_val"):  # the timing / id fast path
        assert written(wire.NodeEncoder().int_attr, name, value, oneof) == expected


@pytest.mark.parametrize("value", [[1, True], [1, 1 << 63], ["a", 1]])
def test_lists_protobuf_refuses_are_refused(value: list) -> None:
    with pytest.raises((TypeError, ValueError)) as theirs:
        make_attr("x", value)
    with pytest.raises(type(theirs.value)):
        written(wire.NodeEncoder().attr, "x", value)


@pytest.mark.parametrize("version", ["0.0.4", ""])
def test_metadata_bytes_equal_protobufs(version: str) -> None:
    values = dict(ATTRS)  # one value per name: every kind, lists (protobuf's) and "" included
    values["skipped"] = None
    expected = GlobalMetadata(version=version, attr=[
        make_attr(name, value) for name, value in values.items() if value is not None])
    assert wire.encode_metadata(version, values) == expected.SerializeToString()


def test_cached_attributes_stay_right() -> None:
    enc = wire.NodeEncoder()
    for _ in range(3):  # the second and third calls come from the caches
        for name, value in ATTRS:
            expected = Node(attr=[make_attr(name, value)]).SerializeToString()
            assert written(enc.attr, name, value) == expected


@pytest.mark.parametrize(("name", "value"), [
    ("tensor_size", -1), ("tensor_size", 1 << 64), ("et_id", 1 << 63), ("et_id", -(1 << 63) - 1),
    ("comm_src", 1 << 31), ("comm_dst", -(1 << 31) - 1),
])
def test_out_of_range_values_are_refused_like_protobuf(name: str, value: int) -> None:
    with pytest.raises(ValueError):
        make_attr(name, value)
    with pytest.raises(ValueError):
        written(wire.NodeEncoder().attr, name, value)


@pytest.mark.parametrize("deps", [None, [], [1], [5, 127, 128, 1 << 20, (1 << 64) - 1]])
@pytest.mark.parametrize(("node_id", "start", "duration"), [
    (0, None, None), (1, 0, 0), (41814, 1716423322446085, 155), ((1 << 64) - 1, 1 << 63, 16384),
])
def test_node_head_and_io_equal_protobufs(deps: list[int] | None, node_id: int, start: int | None,
                                          duration: int | None) -> None:
    enc = wire.NodeEncoder()
    for node_type in (0, 4, 7):
        for name in ("", "aten::copy_", "void kernel<float, 2>(…)"):
            node = Node(id=node_id, name=name, type=node_type, ctrl_deps=deps or [],
                        data_deps=list(reversed(deps or [])), start_time_micros=start or 0,
                        duration_micros=duration or 0,
                        inputs=IOInfo(values="[[1,2]]", shapes="", types='["Tensor(float)"]'),
                        outputs=IOInfo())
            ours = (written(enc.head, node_id, enc.name(name, node_type), deps,
                            None if deps is None else list(reversed(deps)), start, duration)
                    + written(enc.io, True, "[[1,2]]", "", '["Tensor(float)"]')
                    + written(enc.io, False, "", "", ""))
            assert ours == node.SerializeToString()


@pytest.mark.parametrize(("start", "duration"), [(None, None), (0, None), (None, 0), (5, 7),
                                                 (1716423322446085432, -3)])
@pytest.mark.parametrize("unit", ["ns", "ps"])
def test_timing_attributes_equal_protobufs(unit: str, start: int | None, duration: int | None) -> None:
    attrs = [make_attr(f"{what}_{unit}", value) for what, value in
             (("start", start), ("duration", duration)) if value is not None]
    assert written(wire.NodeEncoder().timing, unit, start, duration) == Node(attr=attrs).SerializeToString()


@pytest.mark.parametrize("value", [-1, -(1 << 40), 1 << 64])
def test_varints_out_of_range_are_refused(value: int) -> None:
    with pytest.raises(ValueError):
        Node(start_time_micros=value)  # protobuf refuses them for an unsigned field
    with pytest.raises(ValueError):
        written(wire.NodeEncoder().head, 1, b"", None, None, value, None)
    with pytest.raises(ValueError):  # a dependency too
        written(wire.NodeEncoder().head, 1, b"", [3, value], None, None, None)


def test_varints_of_every_size_append_as_protobuf_writes_them() -> None:
    # (compiled, a varint of two bytes or more is written into the buffer in one step)
    values = [0, 1, 127, 128, 300, (1 << 64) - 1]
    values += [(1 << (7 * k)) - 1 for k in range(1, 10)] + [1 << (7 * k) for k in range(1, 10)]
    # plain Python writes 14 bits a step: around each step, and every bit length at random
    values += [(1 << (14 * k)) + d for k in range(1, 5) for d in (-1, 0, 1)]
    rng = random.Random(3)
    values += [rng.getrandbits(bits) for bits in range(1, 65) for _ in range(20)]
    buf, expected = bytearray(b"\xff"), b"\xff"
    for value in values:
        wire._put_varint(buf, value)
        varint = Node(start_time_micros=value).SerializeToString()[1:] or b"\x00"  # (0: unset)
        expected += varint
        assert wire._varint_size(value) == len(varint) and wire.encode_varint(value) == varint
    assert bytes(buf) == expected


@pytest.mark.parametrize("values", ["", "[1]", "x" * 127, "y" * 128, "é" * 9000])
def test_io_lengths_equal_protobufs(values: str) -> None:
    # The message's length is counted before its members are written: long members too.
    for shapes, types in (("", ""), ("[[2048]]", "z" * 300)):
        expected = Node(inputs=IOInfo(values=values, shapes=shapes, types=types)).SerializeToString()
        assert written(wire.NodeEncoder().io, True, values, shapes, types) == expected


def _buffers_with_room() -> list[tuple[str, bytearray]]:
    """Buffers that already hold bytes and have room beyond them (the compiled build writes
    into that room itself), or whose start was advanced (there it leaves the resize to CPython)."""
    roomy = bytearray(b"r" * 400)
    del roomy[250:]  # a cut to half or more keeps the allocation: room for 150 more
    advanced = bytearray(b"a" * 400)
    del advanced[:150]  # the 250 bytes left start past the allocation's start
    return [("empty", bytearray()), ("room", roomy), ("advanced", advanced)]


@pytest.mark.parametrize("kind", ["empty", "room", "advanced"])
def test_a_node_written_into_a_buffer_with_room_is_protobufs(kind: str) -> None:
    buf = dict(_buffers_with_room())[kind]
    before = bytes(buf)
    enc = wire.NodeEncoder()
    enc.head(buf, 300, enc.name("aten::mm", 4), [1, 1 << 40], [7], 1716423322446085, 155)
    enc.io(buf, True, "[[1,2]]" * 40, "[[2048]]", '["Tensor(float)"]')  # past the room
    enc.attr(buf, "is_cpu_op", False)
    enc.timing(buf, "ns", 1716423322446085432, 155000)
    enc.attr(buf, "lane", "stream:0:7")
    node = Node(id=300, name="aten::mm", type=4, ctrl_deps=[1, 1 << 40], data_deps=[7],
                start_time_micros=1716423322446085, duration_micros=155,
                inputs=IOInfo(values="[[1,2]]" * 40, shapes="[[2048]]", types='["Tensor(float)"]'),
                attr=[make_attr("is_cpu_op", False), make_attr("start_ns", 1716423322446085432),
                      make_attr("duration_ns", 155000), make_attr("lane", "stream:0:7")])
    assert bytes(buf) == before + node.SerializeToString()


def test_a_buffer_a_view_reads_is_not_written_under_it() -> None:
    """As bytearray.append refuses to resize a buffer a memoryview holds, so does every write
    of the encoder, room or not (the compiled build checks before writing into the room)."""
    for kind, buf in _buffers_with_room():
        before = bytes(buf)
        with memoryview(buf):
            for write in (lambda: wire._put_varint(buf, 5), lambda: wire._put_varint(buf, 1 << 40),
                          lambda: wire.NodeEncoder().attr(buf, "lane", "x"),
                          lambda: wire._put_bytes(buf, 10, b"abc")):
                with pytest.raises(BufferError):
                    write()
        assert bytes(buf) == before, kind
