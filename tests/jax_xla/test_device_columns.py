"""Device events kept as columns (linker/xla/devices.py): the same events the reader yields, on
the real GPU and TPU profiles of the corpus; values beyond 64 bits kept exactly; a mapped
profile's planes read again after their pages were let go."""

from __future__ import annotations

import sys
import zlib
from array import array
from pathlib import Path

import pytest

from chakra_hooks.linker.xla import xspace, xspace_pb2
from chakra_hooks.linker.xla.devices import DeviceEvents, collect_devices

TPU = "jax_xla/tpu_inference_2.xplane.pb"
GPU = "jax_xla/mi300x_jax_conv.xplane.pb"


def test_gpu_columns_hold_what_the_reader_yields(corpus: Path) -> None:
    """Every kernel of every GPU, field by field, against the reader's own view of it."""
    space = xspace.read_xspace(corpus / GPU)
    devices = {d.ordinal: d for d in collect_devices(space)}
    assert len(devices) == 8
    for index, name in enumerate(space.plane_names):
        if not name.startswith("/device:GPU:"):
            continue
        view = space.plane(index)  # decoded again: its pages were released after collection
        wanted = {view.stat_ids[n]: n for n in ("hlo_op", "hlo_module", "program_id", "correlation_id")
                  if n in view.stat_ids}
        expected = []
        for line in view.lines():
            for mid, start, dur, stats in view.events(line):
                values = view.pick(stats, wanted)
                op = values.get("hlo_op")
                expected.append((str(op) if op else view.event_name(mid), start, dur,
                                 values.get("correlation_id")))
        events = devices[int(name.rsplit(":", 1)[1])].events
        got = [(e.name, e.start_ps, e.dur_ps, e.correlation)
               for e in (events.event(i) for i in range(len(events)))]
        assert got == expected and len(got) > 0


def test_tpu_columns_keep_instruction_text_and_metadata_stats(corpus: Path) -> None:
    space = xspace.read_xspace(corpus / TPU)
    devices = collect_devices(space)
    assert [d.ordinal for d in devices] == [0, 1, 2, 3]
    for dev in devices:
        events = [dev.events.event(i) for i in range(len(dev.events))]
        ops = [e for e in events if not e.transfer]
        assert ops and all(e.text is not None and e.text.startswith(f"%{e.name} ") for e in ops)
        assert any(e.flops for e in ops) and any(e.category for e in ops)
        assert all(e.module_key and e.exec_key is not None for e in events)
        transfers = {e.lane for e in events if e.transfer}  # host-offload spans: chip 0 only
        assert transfers == ({"tpu:0:Async XLA Ops"} if dev.ordinal == 0 else set())


def _gpu_space(timestamp_ns: int, lines: list[list[int]]) -> bytes:
    """One GPU plane: a stream line per list of correlation ids, an event per id (uint64 from
    2^63, int64 below), 1 ns apart, each 7 ps long."""
    space = xspace_pb2.XSpace()
    plane = space.planes.add(id=1, name="/device:GPU:0")
    plane.stat_metadata[1].name = "correlation_id"
    plane.event_metadata[5].name = "kernel"
    for number, correlations in enumerate(lines, 1):
        line = plane.lines.add(id=number, name=f"Stream #{number}(Kernel)", timestamp_ns=timestamp_ns)
        for k, corr in enumerate(correlations):
            ev = line.events.add(metadata_id=5, offset_ps=1000 * k, duration_ps=7)
            if corr >= 1 << 63:
                ev.stats.add(metadata_id=1, uint64_value=corr)
            else:
                ev.stats.add(metadata_id=1, int64_value=corr)
    return space.SerializeToString()


def _collected(timestamp_ns: int, lines: list[list[int]]) -> list:
    [dev] = collect_devices(xspace.parse_xspace(_gpu_space(timestamp_ns, lines)))
    return [dev.events.event(i) for i in range(len(dev.events))]


@pytest.mark.parametrize("timestamp_ns, lines", [
    (1_795_307_354_765_663_656, [[1, 2, 3]]),  # epoch ns: starts of ~1.8e21 ps, beyond 64 bits
    (1000, [[1, (1 << 64) - 1, 3]]),  # a uint64 correlation id beyond int64
    (1000, [[1, -(1 << 63), 3]]),  # the column's "no correlation" value as a real id
    (1000, [[1, 2], [3, (1 << 64) - 1, 5, 6], [7, 8]]),  # widened mid-profile: lines after it
    (1000, [[1, 2], [(1 << 64) - 1], [7]]),  # widened by a line's only event
])
def test_values_beyond_the_64_bit_columns_are_kept_exactly(timestamp_ns: int, lines: list[list[int]]) -> None:
    events = _collected(timestamp_ns, lines)
    expected = [(f"stream:0:{number}", timestamp_ns * 1000 + 1000 * k, corr)
                for number, correlations in enumerate(lines, 1) for k, corr in enumerate(correlations)]
    assert [(e.lane, e.start_ps, e.correlation) for e in events] == expected
    assert {e.dur_ps for e in events} == {7} and {e.name for e in events} == {"kernel"}
    assert all(e.exec_key is None and e.copy is None for e in events)


def test_correlation_ids_of_every_varint_size_are_read_as_protobuf_writes_them() -> None:
    """The collector reads a correlation id of up to 4 bytes itself (in C when compiled),
    and leaves longer ones to the stat decoder: every size on both sides of each boundary."""
    sizes = [0, 1, 127, 128, 16383, 16384, (1 << 21) - 1, 1 << 21, (1 << 28) - 1, 1 << 28,
             (1 << 35) + 5, (1 << 63) - 1, -1, 1 << 63]
    events = _collected(1000, [sizes])
    assert [e.correlation for e in events] == sizes


def test_columns_widen_without_losing_earlier_events() -> None:
    events = DeviceEvents()
    lane = events.intern("lane")
    events.add(events.intern("a"), 0, 5, 1, lane)
    events.add(events.intern("b"), 0, 1 << 70, 2, lane, correlation=9)  # widens
    events.add(events.intern("c"), 0, 6, 3, lane)
    got = [(e.name, e.start_ps, e.dur_ps, e.correlation) for e in map(events.event, range(3))]
    assert got == [("a", 5, 1, None), ("b", 1 << 70, 2, 9), ("c", 6, 3, None)]
    assert events.linking_order() == [0, 2, 1]


def _columns(events: DeviceEvents) -> list:
    return [getattr(events, name) for name in ("start_ps", "dur_ps", "correlation", "name",
                                               "module_key", "lane", "detail", "copy",
                                               "transfer", "exec_key", "strings", "details")]


@pytest.mark.parametrize("profile", [GPU, TPU])
def test_packed_columns_come_back_the_same(corpus: Path, profile: str) -> None:
    """A device waiting its turn keeps its columns compressed (linker/xla/link.py): they come
    back the same, exec keys the same objects for every event of a run."""
    plain = collect_devices(xspace.read_xspace(corpus / profile))
    packed = collect_devices(xspace.read_xspace(corpus / profile), packed=True)
    assert len(packed) == len(plain)
    for a, b in zip(plain, packed):
        events = b.events
        assert len(events) == len(a.events) > 0 and events.start_ps is None  # packed
        assert events.column("correlation") == a.events.correlation
        with pytest.raises(TypeError):
            events.event(0)  # nothing to read until unpacked
        for _ in range(2):  # packing again only lets the columns go
            events.unpack()
            assert _columns(events) == _columns(a.events)
            events.pack()
            assert events.start_ps is None and len(events) == len(a.events)
        events.unpack()
        keys = [k for k in events.exec_key if k is not None]
        assert len({id(k) for k in keys}) == len(set(keys))  # one object per run, as read


def test_widened_columns_are_not_packed() -> None:
    events = DeviceEvents()
    lane = events.intern("lane")
    events.add(events.intern("a"), 0, 1 << 70, 2, lane)
    events.pack()
    assert events.start_ps == [1 << 70] and events.column("start_ps") == [1 << 70]
    events.unpack()
    assert events.event(0).start_ps == 1 << 70


def test_growing_columns_are_packed_as_steps_and_come_back_exact() -> None:
    """Start times and correlation ids are compressed as the steps between them (a real
    profile's start times: about a third smaller); a step that would overflow 64 bits (the
    no-correlation sentinel beside a real id) leaves that column as values."""
    events = DeviceEvents()
    lane = events.intern("lane")
    starts = [1_000_000 + 4_999 * i + (i % 7) * 13 for i in range(20_000)]
    for i, start in enumerate(starts):
        # ids beyond int64's range as steps from the sentinel; every 5th event has none
        events.add(events.intern(f"k{i % 50}"), 0, start, 3_000 + i % 11, lane,
                   correlation=None if i % 5 == 0 else (1 << 62) + i)
    plain = zlib.compress(events.start_ps, 1)
    events.pack()
    assert events._packed["start_ps"][2] is True and len(events._packed["start_ps"][1]) < len(plain) / 4
    assert events._packed["correlation"][2] is False  # sentinel -> id overflows as a step
    events.unpack()
    assert list(events.start_ps) == starts
    assert [events.correlation_of(i) for i in range(len(starts))] == [
        None if i % 5 == 0 else (1 << 62) + i for i in range(len(starts))]


def test_gpu_columns_hold_little_more_room_than_their_values() -> None:
    """Collected columns are not left with the room their growth made (the compiled build
    grows them by half again, then cuts them to their values): at most array.append's own
    slack, about 1/16. 3,600 events: just past a step of growing by half (3,595 to 5,393)."""
    [dev] = collect_devices(xspace.parse_xspace(_gpu_space(1000, [list(range(3600))])))
    _assert_room_at_most_appends_slack(dev.events, 3600, ("start_ps", "dur_ps", "correlation",
                                                          "name", "module_key", "copy"))


def test_columns_filled_one_event_at_a_time_fit_their_values() -> None:
    """DeviceEvents.add (TPU ops, CPU thunks) grows the columns as _gpu_device does, and
    fit() leaves them no more room than array.append's own slack."""
    events = DeviceEvents()
    lane = events.intern("lane")
    for k in range(3600):
        events.add(events.intern(f"op{k % 7}"), 0, 1000 * k, 7, lane, k // 100, detail=k % 3,
                   transfer=k % 5 == 0, correlation=k)
    events.fit()
    assert [events.correlation_of(i) for i in (0, 3599)] == [0, 3599]
    _assert_room_at_most_appends_slack(events, 3600, ("start_ps", "dur_ps", "correlation", "name",
                                                      "module_key", "lane", "detail", "copy",
                                                      "transfer"))


def _assert_room_at_most_appends_slack(events: DeviceEvents, count: int, names: tuple[str, ...]) -> None:
    """Each named column holds ``count`` values and at most array.append's own slack (1/16)
    beyond them."""
    for name in names:
        column = getattr(events, name)
        room = sys.getsizeof(column) - sys.getsizeof(array(column.typecode))
        assert len(column) == count and room <= len(column) * column.itemsize * 1.07, name


def test_a_column_with_a_view_alive_is_neither_grown_nor_cut_under_it() -> None:
    """Appending to a column a memoryview reads refuses as array.append does (BufferError),
    in the compiled build too, whose appends and fit() resize the array themselves."""
    events = DeviceEvents()
    lane = events.intern("lane")
    events.add(events.intern("a"), 0, 5, 1, lane)
    view = memoryview(events.start_ps)
    with pytest.raises(BufferError):
        events.add(events.intern("b"), 0, 6, 1, lane)
    events.fit()  # leaves the viewed column alone
    assert view.tolist() == [5]
    view.release()


def _stable_order(keys: list[int]) -> list[int]:
    return sorted(range(len(keys)), key=keys.__getitem__)


@pytest.mark.parametrize("spread", [1, 1 << 59], ids=["small", "keys-beyond-64-bits"])
def test_event_orders_are_the_stable_sorts_of_their_keys(spread: int) -> None:
    """by_start and linking_order (sorted in C, compiled) against the sort of devices.py's keys:
    ties in read order, a transfer after a copy-start of the same start, lanes by name; with
    starts 2^59 apart the starts still fit the 64-bit column but the linking keys do not (the
    compiled build falls back to Python's sort for them)."""
    events = DeviceEvents()
    lanes = [events.intern(name) for name in ("z-lane", "a-lane", "m-lane")]
    names = [events.intern(f"op{k}") for k in range(5)]
    starts = [(k * 7919 % 13) * spread for k in range(400)]  # many equal starts
    for k, start in enumerate(starts):
        events.add(names[k % 5], 0, start, 3, lanes[k % 3], detail=k % 2, transfer=k % 4 == 1)
    assert type(events.start_ps) is array  # not widened: the C sort is what is tested
    assert list(events.by_start()) == _stable_order(starts)
    rank = {lanes[0]: 2, lanes[1]: 0, lanes[2]: 1}  # by lane name
    keys = [((s - min(starts)) * 2 + (k % 4 == 1)) * 3 + rank[lanes[k % 3]]
            for k, s in enumerate(starts)]
    assert events.linking_order() == _stable_order(keys)
    assert (max(keys) >= 1 << 63) == (spread > 1)


def test_an_event_is_read_alike_at_either_end_and_refused_past_it() -> None:
    """event(i) (read in C, compiled) indexes as the columns do: -1 is the last event, and an
    index past the end is an IndexError, whatever the column's type."""
    events = DeviceEvents()
    lane = events.intern("lane")
    events.add(events.intern("a"), events.intern("m"), 5, 1, lane, correlation=3)
    events.add(events.intern("b"), 0, 9, 2, lane, transfer=True, copy=2)
    last = events.event(1)
    assert (last.name, last.module_key, last.start_ps, last.transfer, last.copy, last.correlation) == \
        ("b", "", 9, True, "store", None)
    assert events.event(-1) == last and events.event(0).correlation == 3
    for widened in (False, True):
        if widened:
            events.widen()
        with pytest.raises(IndexError):
            events.event(2)
