"""XSpace reader: real TPU and GPU profiles from the corpus, plus files built with our schema."""

from __future__ import annotations

import random
import zlib
from pathlib import Path

import pytest
from google.protobuf.message import DecodeError

from chakra_hooks.common.errors import TraceFormatError
from chakra_hooks.linker.xla import xspace, xspace_pb2

TPU = "jax_xla/tpu_inference_2.xplane.pb"
GPU = "jax_xla/mi300x_jax_conv.xplane.pb"


def test_tpu_planes_and_op_counts(corpus: Path) -> None:
    space = xspace.read_xspace(corpus / TPU)
    names = space.plane_names
    assert names == [p.name for p in space.planes]
    for n in range(4):
        assert f"/device:TPU:{n}" in names
    assert "/host:CPU" in names and "Task Environment" in names
    counts = []
    for n in range(4):
        view = xspace.find_plane(space, f"/device:TPU:{n}")
        counts.append(sum(1 for _ in view.events(view.line("XLA Ops"))))
    assert counts == [1504, 1503, 1503, 1503]


def test_event_time_is_integer_line_timestamp_plus_offset(corpus: Path) -> None:
    space = xspace.read_xspace(corpus / GPU)
    view = xspace.find_plane(space, "/device:GPU:0")
    line = next(view.lines())
    events = list(view.events(line))
    full = xspace_pb2.XSpace.FromString((corpus / GPU).read_bytes())
    [plane] = [p for p in full.planes if p.name == "/device:GPU:0"]
    assert plane.lines[0].name == line.name
    assert events[0][1] == line.timestamp_ns * 1000 + plane.lines[0].events[0].offset_ps
    assert all(isinstance(start, int) and isinstance(dur, int) for _, start, dur, _ in events)


def test_ref_values_resolve_to_stat_metadata_names(corpus: Path) -> None:
    space = xspace.read_xspace(corpus / GPU)
    view = xspace.find_plane(space, "/device:GPU:1")
    hlo_op_id = view.stat_ids["hlo_op"]
    seen = False
    for _, _, _, stats in view.events(next(view.lines())):
        refs = [xspace_pb2.XStat.FromString(raw) for raw in stats]
        refs = [st for st in refs if st.metadata_id == hlo_op_id]
        if refs:
            assert refs[0].WhichOneof("value") == "ref_value"
            resolved = view.stats(stats)
            assert resolved["hlo_op"] == view.stat_names[refs[0].ref_value]
            assert isinstance(resolved["hlo_op"], str) and resolved["hlo_op"]
            assert view.pick(stats, {hlo_op_id: "op"}) == {"op": resolved["hlo_op"]}
            seen = True
    assert seen


def test_tpu_metadata_stats_and_device_clock_offset(corpus: Path) -> None:
    space = xspace.read_xspace(corpus / TPU)
    view = xspace.find_plane(space, "/device:TPU:0")
    line = view.line("XLA Ops")
    mid = next(view.events(line))[0]
    meta = view.metadata_stats(mid)
    assert {"flops", "bytes_accessed", "program_id"} <= set(meta)
    offset = xspace.device_clock_offset(view, line)
    # the expectation comes from a plain full decode with the generated classes
    [full] = [p for p in xspace_pb2.XSpace.FromString((corpus / TPU).read_bytes()).planes
              if p.name == "/device:TPU:0"]
    [full_line] = [ln for ln in full.lines if ln.name == "XLA Ops"]
    diffs = sorted(
        full_line.timestamp_ns * 1000 + ev.offset_ps
        - xspace.int_stat(ev.stats, view.stat_ids["device_offset_ps"]) for ev in full_line.events)
    assert offset == diffs[len(diffs) // 2]


def test_profile_start_time(corpus: Path) -> None:
    assert xspace.profile_start_ns(xspace.read_xspace(corpus / TPU)) == 1741722099081044120


def _space_with_big_times() -> xspace_pb2.XSpace:
    space = xspace_pb2.XSpace(hostnames=["h"])
    plane = space.planes.add(id=1, name="/device:GPU:0")
    plane.stat_metadata[1].name = "hlo_op"
    plane.stat_metadata[2].name = "fusion.7"
    plane.stat_metadata[3].name = "flops"
    plane.event_metadata[5].name = "kernel"
    line = plane.lines.add(id=1, name="Stream #1(Kernel)", timestamp_ns=1_795_307_354_765_663_656)
    ev = line.events.add(metadata_id=5, offset_ps=123_456_789_012_345, duration_ps=7)
    ev.stats.add(metadata_id=1, ref_value=2)
    ev.stats.add(metadata_id=3, int64_value=42)
    return space


def test_picoseconds_stay_exact_beyond_float_precision() -> None:
    message = _space_with_big_times()
    space = xspace.parse_xspace(message.SerializeToString())
    for view in (space.plane(0), xspace.PlaneView(message.planes[0])):  # from a file, in memory
        [(mid, start, dur, stats)] = list(view.events(next(view.lines())))
        assert start == 1_795_307_354_765_663_656 * 1000 + 123_456_789_012_345
        assert float(start) != start  # would have been rounded as a float
        assert dur == 7 and view.event_name(mid) == "kernel"
        assert view.stats(stats) == {"hlo_op": "fusion.7", "flops": 42}


def test_truncated_file_is_a_one_line_error(corpus: Path, tmp_path: Path) -> None:
    data = (corpus / TPU).read_bytes()
    bad = tmp_path / "cut.xplane.pb"
    bad.write_bytes(data[: len(data) // 2])
    with pytest.raises(TraceFormatError) as err:
        xspace.read_xspace(bad)
    message = str(err.value)
    assert "\n" not in message and str(bad) in message and "truncated" in message


@pytest.mark.parametrize("payload", [b"", b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", b"not a profile at all"])
def test_foreign_or_empty_file_is_a_one_line_error(tmp_path: Path, payload: bytes) -> None:
    bad = tmp_path / "bad.xplane.pb"
    bad.write_bytes(payload)
    with pytest.raises(TraceFormatError) as err:
        xspace.read_xspace(bad)
    assert "\n" not in str(err.value) and str(bad) in str(err.value)


def test_missing_file_is_a_one_line_error(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError):
        xspace.read_xspace(tmp_path / "absent.xplane.pb")


def test_private_descriptor_pool() -> None:
    from google.protobuf import descriptor_pool

    with pytest.raises(KeyError):
        descriptor_pool.Default().FindMessageTypeByName("chakra_hooks.xspace.XSpace")


def _full_stats(plane: xspace_pb2.XPlane, stats) -> dict:
    """Reference resolution of decoded XStat messages, written independently of the reader."""
    names = {k: v.name for k, v in plane.stat_metadata.items()}
    out = {}
    for st in stats:
        kind = st.WhichOneof("value")
        value = getattr(st, kind) if kind else None
        if kind == "ref_value":
            value = names.get(value, "")
        elif kind == "compressed_str_value":
            value = zlib.decompress(value).decode()
        out[names.get(st.metadata_id, str(st.metadata_id))] = value
    return out


@pytest.mark.parametrize("part_bytes", [None, 64])
@pytest.mark.parametrize("name", [TPU, GPU])
def test_every_event_agrees_with_a_full_decode(corpus: Path, name: str, part_bytes: int | None,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Plane by plane, line by line, event by event: the lazy reader (lines decoded on demand,
    stats kept as bytes and decoded through a cache) gives what a full ParseFromString gives,
    also where lines are decoded a part of their events at a time (every line, with parts
    of 64 bytes)."""
    if part_bytes is not None:
        monkeypatch.setattr(xspace, "_LINE_PART_BYTES", part_bytes)
    data = (corpus / name).read_bytes()
    full = xspace_pb2.XSpace.FromString(data)
    space = xspace.parse_xspace(data, corpus / name)
    assert space.plane_names == [p.name for p in full.planes]
    checked = 0
    for view, plane in zip(space.planes, full.planes, strict=True):
        assert view.plane_stats() == _full_stats(plane, plane.stats)
        assert view.line_names() == [ln.name for ln in plane.lines]
        for line, full_line in zip(view.lines(), plane.lines, strict=True):
            if part_bytes is not None and len(full_line.events) > 1:
                assert isinstance(line, xspace.PartedLine) and line.name == full_line.name
            got = [(m, s, d, view.stats(st)) for m, s, d, st in view.events(line)]
            base = full_line.timestamp_ns * 1000
            want = [(e.metadata_id, base + e.offset_ps, e.duration_ps, _full_stats(plane, e.stats))
                    for e in full_line.events]
            assert got == want
            checked += len(want)
    assert checked > 1_000


def test_stat_values_of_every_kind() -> None:
    """The fast path (id, then one varint) and the fallback (anything else) decode alike."""
    space = xspace_pb2.XSpace()
    plane = space.planes.add(id=1, name="p")
    for sid in (1, 200, 300):
        plane.stat_metadata[sid].name = f"s{sid}"
    plane.event_metadata[1].name = "e"
    ev = plane.lines.add(name="l", timestamp_ns=5).events.add(metadata_id=1, offset_ps=3, duration_ps=4)
    values = [("int64_value", -5), ("int64_value", -(2**63)), ("int64_value", 2**63 - 1),
              ("uint64_value", 2**64 - 1), ("uint64_value", 0), ("double_value", 2.5),
              ("int64_value", 300_000), ("int64_value", 5_000_000), ("uint64_value", 127),
              ("str_value", "hé"), ("bytes_value", b"\x00\xff"), ("ref_value", 200),
              ("ref_value", 999), ("compressed_str_value", zlib.compress(b"long text")),
              # varints of 3, 4, 5 bytes (the fast path's reach) and 6 (upb's)
              ("int64_value", 2**21 - 1), ("int64_value", 2**21), ("int64_value", 2**28),
              ("int64_value", 2**35 - 1), ("int64_value", 2**35), ("uint64_value", 2**30),
              ("ref_value", 2**29)]
    expected = []
    for sid in (1, 200, 0):
        for kind, value in values:
            st = ev.stats.add(metadata_id=sid, **{kind: value})
            expected.append((sid, _full_stats(plane, [st])))
    ev.stats.add()  # no id, no value: an empty record
    expected.append((0, {"0": None}))
    view = xspace.parse_xspace(space.SerializeToString()).plane(0)
    [(_, start, _, stats)] = list(view.events(view.line("l")))
    assert view.pick(stats, {1: "a", 300: "b"}) == {"a": expected[len(values) - 1][1]["s1"]}
    assert start == 5003 and len(stats) == len(expected)
    for raw, (sid, want) in zip(stats, expected):
        assert view.stats([raw]) == want
        assert view.stats([raw]) == want  # second time from the cache
        [value] = want.values()
        numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
        kind = xspace_pb2.XStat.FromString(raw).WhichOneof("value")
        assert view.int_stat([raw], sid) == (int(value) if numeric and kind != "ref_value" else 0)


def test_damaged_plane_is_a_one_line_error(tmp_path: Path) -> None:
    space = _space_with_big_times()
    good = space.SerializeToString()
    plane = space.planes[0].SerializeToString()
    # same length, but the plane's name field now claims a wire type that does not exist
    bad_plane = plane.replace(b"\x12\x0d/device:GPU:0", b"\x17\x0d/device:GPU:0")
    assert bad_plane != plane
    bad = tmp_path / "bad.xplane.pb"
    bad.write_bytes(good.replace(plane, bad_plane))
    with pytest.raises(TraceFormatError) as err:
        xspace.read_xspace(bad).plane(0)
    assert "\n" not in str(err.value) and "plane 0" in str(err.value) and str(bad) in str(err.value)
    # damage inside a line's events is found when they are read (plain Python decodes a short
    # line whole as it is reached; compiled, its events are read from the bytes as iterated)
    line = space.planes[0].lines[0].SerializeToString()
    event = space.planes[0].lines[0].events[0].SerializeToString()
    bad.write_bytes(good.replace(line, line.replace(event, b"\x0f" + event[1:])))
    view = xspace.read_xspace(bad).plane(0)
    with pytest.raises(TraceFormatError) as err:
        for read in view.lines():
            list(view.events(read))
    assert "\n" not in str(err.value) and "line 0" in str(err.value) and str(bad) in str(err.value)


def test_damage_in_a_long_line_is_a_one_line_error(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A long line's events are decoded a part at a time: damage in a later part is found
    when the events get there, and named like damage in a line decoded whole."""
    monkeypatch.setattr(xspace, "_LINE_PART_BYTES", 16)
    space = _space_with_big_times()
    line = space.planes[0].lines[0]
    for k in range(8):
        line.events.add(metadata_id=5, offset_ps=1000 + k, duration_ps=3)
    last = line.events.add(metadata_id=5, offset_ps=999_999, duration_ps=11)
    good = space.SerializeToString()
    raw_line, event = line.SerializeToString(), last.SerializeToString()
    bad = tmp_path / "bad.xplane.pb"
    # the last event's first field with a wire type that does not exist
    bad.write_bytes(good.replace(raw_line, raw_line.replace(event, b"\x0f" + event[1:])))
    view = xspace.read_xspace(bad).plane(0)
    [parted] = view.lines()
    assert isinstance(parted, xspace.PartedLine)
    events = view.events(parted)
    assert next(events)[1] == 1_795_307_354_765_663_656 * 1000 + 123_456_789_012_345
    with pytest.raises(TraceFormatError) as err:
        list(events)
    assert "\n" not in str(err.value) and "line 0" in str(err.value) and str(bad) in str(err.value)
    # a record that claims more bytes than the line has is found when the line is reached
    record = b"\x22" + bytes([len(event)]) + event
    assert raw_line.endswith(record)
    cut = raw_line.replace(record, b"\x22" + bytes([len(event) + 40]) + event)
    bad.write_bytes(good.replace(raw_line, cut))
    with pytest.raises(TraceFormatError) as err:
        list(xspace.read_xspace(bad).plane(0).lines())
    assert "\n" not in str(err.value) and "line 0" in str(err.value) and "truncated" in str(err.value)


def test_line_named_twice_is_found_by_its_decoded_name() -> None:
    """A name field repeated after the events (legal protobuf, last one wins) is honoured."""
    space = _space_with_big_times()
    line = space.planes[0].lines.add(name="first", timestamp_ns=1)
    line.events.add(metadata_id=5, offset_ps=1)
    data = bytearray(space.SerializeToString())
    renamed = xspace_pb2.XLine(name="second").SerializeToString()
    # append "name: second" to the plane's second line, re-framing the lengths around it
    plane = space.planes[0]
    lines = [ln.SerializeToString() for ln in plane.lines]
    lines[1] += renamed
    body = xspace_pb2.XPlane(id=plane.id, name=plane.name, event_metadata=plane.event_metadata,
                             stat_metadata=plane.stat_metadata).SerializeToString()
    for raw in lines:
        body += b"\x1a" + _varint(len(raw)) + raw
    data = b"\x0a" + _varint(len(body)) + body
    full = xspace_pb2.XSpace.FromString(data)
    assert [ln.name for ln in full.planes[0].lines] == ["Stream #1(Kernel)", "second"]
    view = xspace.parse_xspace(data).plane(0)
    assert view.line("first") is None
    assert view.line("second").timestamp_ns == 1


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _read_from_bytes(raw: bytes, base: int) -> list:
    """A line's events as the compiled build reads them: its own fields decoded (the head),
    its event records read from the bytes by _scan_events (same source in both builds)."""
    view = memoryview(raw)
    head, parts = xspace._line_parts(view, 0, len(raw), 64)
    xspace.RawStatsLine.FromString(b"".join(raw[a:b] for a, b in head))
    out: list = []
    for a, b in parts:
        while a < b:  # three events at a time: stopping and starting again reads alike
            a = xspace._scan_events(view, a, b, base, out, 3)
    return out


def _decoded(raw: bytes, base: int) -> list:
    return list(xspace._decoded_events(xspace.RawStatsLine.FromString(raw), base))


def _event_record(fields: bytes) -> bytes:
    return b"\x22" + _varint(len(fields)) + fields


@pytest.mark.parametrize("fields", [
    b"\x08\x01\x08\x02",  # metadata_id twice: the last wins
    b"\x10\x05\x28\x03",  # offset_ps, then num_occurrences (their oneof): offset reads 0
    b"\x28\x03\x10\x05",  # num_occurrences, then offset_ps
    xspace_pb2.XEvent(metadata_id=-3, offset_ps=-1, duration_ps=-(2**63)).SerializeToString(),
    xspace_pb2.XEvent(metadata_id=2**63 - 1, offset_ps=2**62, duration_ps=300).SerializeToString(),
    b"",  # an event with no fields: all zero
    b"\x22\x00\x22\x02\x08\x01",  # an empty stat, then a stat
    b"\x30\x01\x39" + bytes(8) + b"\x45" + bytes(4) + b"\x4a\x02\xaa\xbb",  # unknown fields 6-9
    b"\x0a\x01\x05\x08\x07",  # field 1 as bytes (unknown), then as the int it is
    b"\x21" + bytes(8) + b"\x20\x01",  # stats as fixed64 and as a varint: unknown, skipped
    b"\x18" + b"\xff" * 9 + b"\x7f",  # a 10-byte varint whose last byte has bits past 64
    b"\xd8\x01\x05",  # a two-byte key (field 27)
])
def test_events_read_from_bytes_as_protobuf_reads_them(fields: bytes) -> None:
    line = xspace_pb2.XLine(id=3, name="Stream #7", timestamp_ns=12).SerializeToString()
    # events between, before and after the line's own fields
    raw = (_event_record(fields) + line + _event_record(b"\x08\x09\x10\x01\x22\x02\x08\x04")
           + _event_record(fields) + xspace_pb2.XLine(display_name="s").SerializeToString())
    want = _decoded(raw, 12_000)
    assert len(want) == 3
    assert _read_from_bytes(raw, 12_000) == want


def test_damaged_lines_fail_alike_when_read_from_bytes(corpus: Path) -> None:
    """Lines of the corpus GPU profile with bytes changed, cut or added at random: read from
    the bytes, a line gives protobuf's events or fails where protobuf fails. The one known
    difference: a group (wire types 3 and 4, which no XSpace holds) is refused, where
    protobuf skips it as an unknown field."""
    full = xspace_pb2.XSpace.FromString((corpus / GPU).read_bytes())
    lines = [ln.SerializeToString() for p in full.planes for ln in p.lines if 0 < len(ln.events) < 40]
    rng = random.Random(7)
    outcomes = {"same": 0, "both fail": 0}
    for _ in range(3000):
        raw = bytearray(rng.choice(lines))
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(len(raw) + 1)
            kind = rng.random()
            if kind < 0.6 and at < len(raw):
                raw[at] = rng.randrange(256)
            elif kind < 0.8:
                del raw[at:]
            else:
                raw.insert(at, rng.randrange(256))
        raw = bytes(raw)
        try:
            want = _decoded(raw, 5)
        except DecodeError:
            want = None
        try:
            got = _read_from_bytes(raw, 5)
        except (ValueError, DecodeError) as err:
            if want is not None:  # only a group may be refused where protobuf reads the line
                assert "got wire type 3" in str(err) or "got wire type 4" in str(err), raw.hex()
                continue
            outcomes["both fail"] += 1
            continue
        assert want is not None, f"read a line protobuf refuses: {raw.hex()}"
        assert got == want, raw.hex()
        outcomes["same"] += 1
    assert min(outcomes.values()) > 300, outcomes
