"""Device events out of an XSpace, per device, on one integer picosecond clock.

Three layouts are handled, all found in real files:

- TPU: planes ``/device:TPU:<n>``; ops on line ``XLA Ops`` (event name = the instruction text,
  display name = the instruction name, device times in ``device_offset_ps`` /
  ``device_duration_ps``), module runs on ``XLA Modules``, host-offload transfers on
  ``Async XLA Ops``.
- GPU: planes ``/device:GPU:<n>``, one line per stream, kernels with ``hlo_op`` /
  ``hlo_module`` / ``program_id`` stats (often as ``ref_value``).
- CPU backend: no device plane; XLA ops run on ``/host:CPU`` thread lines with ``hlo_op``,
  ``hlo_module``, ``program_id``, ``run_id`` and ``device_ordinal`` stats.

A device's events are kept as columns (:class:`DeviceEvents`), not an object each: a large
profile has millions, and an object per event with its three integers took ~210 bytes, seven
times the profile's own size in memory (docs/performance.md).
"""

from __future__ import annotations

import bisect
import marshal
import re
import zlib
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field

try:  # read by Cython when it compiles this module (setup.py): see _push
    import cython
except ImportError:  # run as plain Python without Cython installed
    from chakra_hooks.common.no_cython import cython

from chakra_hooks.linker.gc_pause import gc_paused
from chakra_hooks.linker.xla.xspace import SESSION_CLOCK, PlaneView, XSpaceFile, device_clock_offset

_DEVICE_PLANE_RE = re.compile(r"^/device:(TPU|GPU):(\d+)$")
_STREAM_RE = re.compile(r"Stream #(\d+)")

_COPIES = (None, "load", "store", "device")  # DeviceEvents.copy codes
_COPY_CODES = {copy: code for code, copy in enumerate(_COPIES)}
_NO_CORRELATION = -(1 << 63)  # DeviceEvents.correlation of an event without one
_NO_DETAILS = (None, None, None, None)
# The columns DeviceEvents.pack compresses (exec_key too, marshalled: its values are small ints,
# strings or None, the same object for every event of one run).
_PACKED_COLUMNS = ("start_ps", "dur_ps", "correlation", "name", "module_key", "lane", "detail",
                   "copy", "transfer")
# Packed as each value less the one before it: start times and correlation ids mostly grow by
# small steps, which compress better than the values (start times: 4.0-4.3 bytes an event
# as values, 2.8-3.0 as steps on the corpus TPU profile and a real JAX CPU profile).
_STEP_COLUMNS = ("start_ps", "correlation")

# A varint of 1 to 4 bytes read as one little-endian integer: it is exactly one varint when
# the high bit of every byte but the last is set (its 7-bit groups then are the value).
_VARINT_HIGH_BITS = [0, 0x80, 0x8080, 0x808080, 0x80808080]
_VARINT_MORE_BITS = [0, 0, 0x80, 0x8080, 0x808080]

if not cython.compiled:
    # A value appended to a column (an array), as a function: array.append itself in plain
    # Python. The compiled build has its own (devices.pxd), a resize and a store, where a call
    # of the method costs about 500 instructions; it grows an array by half again, and
    # DeviceEvents.fit gives back what is left once a device is collected.
    _push = array.append
    # A column's item ``i``: indexing itself in plain Python; the compiled build reads an
    # array's item in C (devices.pxd), where indexing an array costs a generic item call.
    from operator import getitem as _item


def pack_column(column: array, steps: bool) -> tuple[str, bytes, bool]:
    """A column as (typecode, compressed bytes, whether they are steps): ``steps`` for a
    64-bit column whose values mostly grow (:data:`_STEP_COLUMNS`); values whose steps could
    overflow 64 bits (the no-correlation sentinel beside real ids) stay values."""
    if (steps and column.typecode == "q" and len(column) > 1
            and max(column) - min(column) < 1 << 63):
        stepped = array(column.typecode, bytes(len(column) * column.itemsize))
        _fill_steps(stepped, column)
        return column.typecode, zlib.compress(stepped, 1), True
    return column.typecode, zlib.compress(column, 1), False


def unpack_column(packed: tuple[str, bytes, bool]) -> array:
    """A column from :func:`pack_column`."""
    typecode, data, steps = packed
    column = array(typecode)
    column.frombytes(zlib.decompress(data))
    if steps:
        _fill_sums(column)
    return column


# (typed loops in the compiled build: devices.pxd)
def _fill_steps(steps: array, values: array) -> None:
    """``steps[i] = values[i] - values[i - 1]``, the first value as it is."""
    before = 0
    for i in range(len(values)):
        value = values[i]
        steps[i] = value - before
        before = value


def _fill_sums(steps: array) -> None:
    """The values back from :func:`_fill_steps`' steps, in place."""
    total = 0
    for i in range(len(steps)):
        total += steps[i]
        steps[i] = total


class _PackedLength:
    """What DeviceEvents.exec_key holds while packed: its length, and nothing to index."""

    __slots__ = ("length",)

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length


@dataclass  # a C class when compiled (linker/xla/devices.pxd)
class DeviceEvent:
    """One op execution on a device (a TPU op, a GPU kernel, a CPU thunk), as the linker reads
    it: made on demand from a device's columns (:meth:`DeviceEvents.event`)."""

    __slots__ = ("name", "module_key", "start_ps", "dur_ps", "lane", "exec_key", "text", "flops",
                 "bytes_accessed", "category", "transfer", "copy", "correlation")
    name: str  # HLO instruction name when known, else the event name
    module_key: str  # "<module name>(<program id>)", "" when unknown
    start_ps: int
    dur_ps: int
    lane: str
    exec_key: object  # identifies one run of the module (run id, module span index, ...)
    text: str | None  # full instruction text (TPU event names)
    flops: int | None
    bytes_accessed: int | None
    category: str | None
    transfer: bool  # TPU async copy transfer span (Async XLA Ops)
    copy: str | None  # GPU copy direction from its stream line: "load", "store", "device"
    correlation: int | None  # GPU: the id of the host call that launched it


DAY_PS = 86_400 * 10**12


class DeviceEvents:
    """One device's events as columns: item ``i`` of each column is event ``i``'s field, in the
    order the events were read.

    Times and correlation ids are 64-bit arrays (a column becomes a list if a damaged or
    unusual profile gives a value beyond 64 bits); names, module keys and lanes are indices
    into ``strings``; a TPU op's instruction text, flops, bytes and category, which its event
    metadata fixes, are an index into ``details``."""

    __slots__ = ("start_ps", "dur_ps", "name", "module_key", "lane", "exec_key", "copy",
                 "correlation", "detail", "transfer", "strings", "details", "_string_ids",
                 "_packed")

    def __init__(self) -> None:
        self.start_ps = array("q")
        self.dur_ps = array("q")
        self.correlation = array("q")  # _NO_CORRELATION: none
        self.name = array("i")
        self.module_key = array("i")
        self.lane = array("i")
        self.detail: array | None = None  # TPU only: made (zeros before) by the first detail
        self.copy = array("b")  # index into _COPIES
        self.transfer: array | None = None  # TPU only: made by the first transfer
        self.exec_key: list[object] = []  # appended last: its length is the number of events
        self.strings: list[str] = [""]
        self._string_ids: dict[str, int] = {"": 0}
        self.details: list[tuple] = [_NO_DETAILS]
        self._packed: dict[str, tuple[str, bytes, bool]] | None = None  # see pack()

    def __len__(self) -> int:
        return len(self.exec_key)

    def pack(self) -> None:
        """Keep the columns compressed (zlib's fastest level) while the device waits for its
        turn to be linked: a profile's devices are collected before any is linked, and their
        columns were the largest thing in memory then (docs/performance.md). Until
        :meth:`unpack`, only ``len()`` and the string tables may be read.

        The first call compresses; a call after :meth:`unpack` only lets the columns go again
        (what it compressed stays): the columns must not change in between. Columns widened
        to lists (times beyond 64 bits) stay as they are."""
        if self._packed is None:
            if type(self.start_ps) is list:
                return
            try:
                keys = marshal.dumps(self.exec_key)
            except ValueError:  # an exec key marshal cannot write: the columns stay as they are
                return
            packed = {name: pack_column(column, name in _STEP_COLUMNS)
                      for name in _PACKED_COLUMNS if (column := getattr(self, name)) is not None}
            packed["exec_key"] = ("", zlib.compress(keys, 1), False)
            self._packed = packed
        length = _PackedLength(len(self.exec_key))
        for name in _PACKED_COLUMNS:
            setattr(self, name, None)
        self.exec_key = length  # type: ignore[assignment]

    @property
    def packed(self) -> bool:
        """Whether the columns are compressed now (:meth:`pack`), not readable."""
        return type(self.exec_key) is _PackedLength

    def unpack(self) -> None:
        """The columns back from :meth:`pack` (nothing to do if they are here)."""
        if not self.packed:
            return
        for name, packed in self._packed.items():
            if name == "exec_key":
                self.exec_key = marshal.loads(zlib.decompress(packed[1]))
            else:
                setattr(self, name, unpack_column(packed))

    def column(self, name: str) -> array | list:
        """One column, decompressed alone if the events are packed."""
        if self.packed:
            return unpack_column(self._packed[name])
        return getattr(self, name)

    def intern(self, text: str) -> int:
        """The index of ``text`` in ``strings`` (added when new)."""
        index = self._string_ids.get(text)
        if index is None:
            index = self._string_ids[text] = len(self.strings)
            self.strings.append(text)
        return index

    def add(self, name: int, module_key: int, start_ps: int, dur_ps: int, lane: int,
            exec_key: object = None, detail: int = 0, transfer: bool = False, copy: int = 0,
            correlation: int | None = None) -> None:
        """Append one event (strings as :meth:`intern` indices, ``copy`` an index into
        _COPIES)."""
        if type(self.start_ps) is list:
            self.start_ps.append(start_ps)
            self.dur_ps.append(dur_ps)
            self.correlation.append(correlation)
        else:
            try:
                if correlation == _NO_CORRELATION:
                    raise OverflowError  # the sentinel itself as a real id: keep it apart
                _push(self.start_ps, start_ps)
                _push(self.dur_ps, dur_ps)
                _push(self.correlation, _NO_CORRELATION if correlation is None else correlation)
            except OverflowError:
                self.widen()
                self.start_ps.append(start_ps)
                self.dur_ps.append(dur_ps)
                self.correlation.append(correlation)
        _push(self.name, name)
        _push(self.module_key, module_key)
        _push(self.lane, lane)
        if detail or self.detail is not None:
            _push(self._made("detail", "i"), detail)
        _push(self.copy, copy)
        if transfer or self.transfer is not None:
            _push(self._made("transfer", "b"), transfer)
        self.exec_key.append(exec_key)

    def fit(self) -> None:
        """Let the array columns give back the room their growth left (the compiled build's
        _push grows an array by half again; array.append's own slack is kept)."""
        if cython.compiled:
            for column in (self.start_ps, self.dur_ps, self.correlation, self.name,
                           self.module_key, self.lane, self.detail, self.copy, self.transfer):
                if type(column) is array:
                    _fit(column)

    def _made(self, column: str, typecode: str) -> array:
        """An optional column, made of zeros for the events before it was first needed."""
        values = getattr(self, column)
        if values is None:
            values = array(typecode, bytes(len(self) * array(typecode).itemsize))
            setattr(self, column, values)
        return values

    def fill_line(self, count: int, lane: int) -> None:
        """For the last ``count`` events, appended to the time, correlation, name, module and
        copy columns only: the rest (``lane``, no run yet; no details, not transfers)."""
        if count:
            self.lane.extend(array("i", [lane]) * count)
            for column in (self.detail, self.transfer):
                if column is not None:
                    column.frombytes(bytes(count * column.itemsize))
            self.exec_key.extend([None] * count)

    def widen(self) -> None:
        """The integer columns as lists (None for "no correlation"), cut to the complete
        events (a failed append may have added a value to some of them)."""
        if type(self.start_ps) is list:
            return
        n = len(self.exec_key)
        self.start_ps = list(self.start_ps[:n])
        self.dur_ps = list(self.dur_ps[:n])
        self.correlation = [None if c == _NO_CORRELATION else c for c in self.correlation[:n]]

    def correlation_of(self, i: int) -> int | None:
        corr = _item(self.correlation, i)
        return None if corr == _NO_CORRELATION and type(self.correlation) is not list else corr

    def set_times(self, i: int, start_ps: int, dur_ps: int) -> None:
        try:
            self.start_ps[i], self.dur_ps[i] = start_ps, dur_ps
        except OverflowError:
            self.widen()
            self.start_ps[i], self.dur_ps[i] = start_ps, dur_ps

    def event(self, i: int) -> DeviceEvent:
        strings = self.strings
        if cython.compiled:
            # The columns read in C (devices.pxd: _item), the event made without a call of its
            # class (its fields set one by one, as its __init__ sets them).
            ev = DeviceEvent.__new__(DeviceEvent)
            ev.name, ev.module_key = strings[_item(self.name, i)], strings[_item(self.module_key, i)]
            ev.start_ps, ev.dur_ps = _item(self.start_ps, i), _item(self.dur_ps, i)
            ev.lane, ev.exec_key = strings[_item(self.lane, i)], self.exec_key[i]
            ev.text, ev.flops, ev.bytes_accessed, ev.category = (
                _NO_DETAILS if self.detail is None else self.details[_item(self.detail, i)])
            ev.transfer, ev.copy = self.is_transfer(i), _COPIES[_item(self.copy, i)]
            ev.correlation = self.correlation_of(i)
            return ev
        text, flops, bytes_accessed, category = (
            _NO_DETAILS if self.detail is None else self.details[self.detail[i]])
        return DeviceEvent(strings[self.name[i]], strings[self.module_key[i]], self.start_ps[i],
                           self.dur_ps[i], strings[self.lane[i]], self.exec_key[i], text, flops,
                           bytes_accessed, category, self.is_transfer(i), _COPIES[self.copy[i]],
                           self.correlation_of(i))

    def out_of_range(self) -> set[int]:
        """Events whose time cannot belong to the profile: a start more than a day from the
        median start, or a duration over a day (a profile spans seconds to minutes; one event
        moved 11 days made a span of 11 days, one lasting 11 days swallowed the 11 ops after
        it), as the Kineto reader drops them."""
        start, dur = self.start_ps, self.dur_ps
        n = len(self)
        if not n:
            return set()
        sample = sorted(start[::997] if n > 997 else start)
        middle = sample[len(sample) // 2]
        lo, hi = middle - DAY_PS, middle + DAY_PS
        return {i for i in range(n) if not lo <= start[i] <= hi or dur[i] > DAY_PS}

    def exact_repeats(self, order: list[int]) -> set[int]:
        """Events equal in every column to the one before them in ``order`` (start order,
        ties by lane: an event recorded twice is next to its copy)."""
        start, dur, lane, name = self.start_ps, self.dur_ps, self.lane, self.name
        repeats = set()
        prev = -1
        for i in order:
            if (prev >= 0 and start[i] == start[prev] and dur[i] == dur[prev]
                    and lane[i] == lane[prev] and name[i] == name[prev]
                    and self._same_rest(i, prev)):
                repeats.add(i)
            else:
                prev = i
        return repeats

    def _same_rest(self, i: int, j: int) -> bool:
        return (self.module_key[i] == self.module_key[j] and self.copy[i] == self.copy[j]
                and self.correlation[i] == self.correlation[j]
                and self.exec_key[i] == self.exec_key[j]
                and (self.detail is None or self.detail[i] == self.detail[j])
                and (self.transfer is None or self.transfer[i] == self.transfer[j]))

    def is_transfer(self, i: int) -> bool:
        return self.transfer is not None and bool(_item(self.transfer, i))

    @property
    def has_transfers(self) -> bool:
        return self.transfer is not None and any(self.transfer)

    def by_start(self) -> Iterator[int]:
        """Event indices in start order (ties: read order). Each index is sorted packed
        beside its start in one integer, half the memory of sorting indices by a key."""
        n = len(self)
        if not n:
            return iter(())
        start = self.start_ps
        low = min(start)
        if cython.compiled and type(start) is array:
            order = _sorted_by_start(start, low, 1, None, 0, None, None)
            if order is not None:
                return iter(order)
        shift = n.bit_length()
        packed = [(s - low) << shift | i for i, s in enumerate(start)]
        packed.sort()
        mask = (1 << shift) - 1
        return (p & mask for p in packed)

    def linking_order(self) -> list[int]:
        """Event indices by (start, transfer, lane name), ties in read order: at equal starts
        a transfer follows the copy-start that issues it."""
        strings = self.strings
        ranks = {lane: rank for rank, lane in enumerate(sorted(set(self.lane), key=strings.__getitem__))}
        lanes = len(ranks)
        start, transfer, lane = self.start_ps, self.transfer, self.lane
        low = min(start) if len(self) else 0
        if cython.compiled and type(start) is array:
            rank = array("q", bytes(8 * len(strings)))
            for lane_id, lane_rank in ranks.items():
                rank[lane_id] = lane_rank
            order = _sorted_by_start(start, low, 2 * lanes, transfer, lanes, lane, rank)
            if order is not None:
                return order
        if transfer is None:
            keys = [(start[i] - low) * 2 * lanes + ranks[lane[i]] for i in range(len(self))]
        else:
            keys = [((start[i] - low) * 2 + transfer[i]) * lanes + ranks[lane[i]] for i in range(len(self))]
        return sorted(range(len(self)), key=keys.__getitem__)


@dataclass(slots=True)
class Device:
    kind: str  # "tpu", "gpu", "cpu"
    ordinal: int
    plane: str
    clock: str
    events: DeviceEvents = field(default_factory=DeviceEvents)


def collect_devices(space: XSpaceFile, packed: bool = False) -> list[Device]:
    """Planes are decoded one at a time (by name, without decoding the others) and let go.
    ``packed``: each device's events are packed (:meth:`DeviceEvents.pack`) once collected."""
    with gc_paused():
        return _collect_devices(space, packed)


def _collect_devices(space: XSpaceFile, packed: bool) -> list[Device]:
    devices: list[Device] = []
    for index, name in enumerate(space.plane_names):
        m = _DEVICE_PLANE_RE.match(name)
        if m is None:
            continue
        view = space.plane(index)
        if m.group(1) == "TPU":
            devices.append(_tpu_device(view, int(m.group(2))))
        else:
            devices.append(_gpu_device(view, int(m.group(2))))
        space.release(index)
        devices[-1].events.fit()
        if packed:
            devices[-1].events.pack()
    if not devices:
        for index, name in enumerate(space.plane_names):
            if name == "/host:CPU":
                devices.extend(_cpu_devices(space.plane(index)))
                for dev in devices:
                    dev.events.fit()
                    if packed:
                        dev.events.pack()
    devices.sort(key=lambda d: (d.kind, d.ordinal))
    return devices


def _int(value: object) -> int | None:
    if isinstance(value, (int, float)):
        return int(value)
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            return None
    return None


def _module_key(name: object, program_id: object) -> str:
    if not name:
        return ""
    return f"{name}({program_id})" if program_id is not None else str(name)


def _tpu_device(view: PlaneView, ordinal: int) -> Device:
    """TPU ops on the chip's own clock, shifted by one offset per chip onto the session clock.

    XProf re-aligns TPU ops to the host in pieces: in real files ``start - device_offset_ps``
    is constant over stretches of ops but jumps between them (by up to hundreds of ms), and
    some session durations are stretched. The chip counter is the consistent clock, so ops keep
    ``device_offset_ps`` / ``device_duration_ps`` exactly, plus one per-chip offset (the median
    of ``start - device_offset_ps``). Async transfers carry no device times: both their ends
    are mapped through the offset of the op just before them on the session clock."""
    ops_line = view.line("XLA Ops")
    chip_offset = device_clock_offset(view, ops_line) if ops_line is not None else None
    clock = SESSION_CLOCK
    if chip_offset is not None:
        clock += f"; TPU ops: device_offset_ps + {chip_offset} ps (per-chip offset)"
    dev = Device("tpu", ordinal, view.name, clock)
    events = dev.events
    spans = _module_spans(view)
    starts = [s for s, _, _ in spans]
    span_keys = [events.intern(key) for _, _, key in spans]
    off_id = view.stat_ids.get("device_offset_ps")
    dur_id = view.stat_ids.get("device_duration_ps")
    points: list[tuple[int, int]] = []  # (session start, session - device) of every op
    transfers: list[int] = []
    by_metadata: dict[int, tuple[int, int]] = {}  # event metadata id -> (name, details) indices
    for line_name, transfer in (("XLA Ops", False), ("Async XLA Ops", True)):
        line = ops_line if not transfer else view.line(line_name)  # each line decoded once
        if line is None:
            continue
        lane = events.intern(f"tpu:{ordinal}:{line_name}")
        for mid, start, dur, stats in view.events(line):
            named = by_metadata.get(mid)
            if named is None:
                named = by_metadata[mid] = _tpu_op(view, mid, events)
            idx = bisect.bisect_right(starts, start) - 1  # module run, on the session clock
            module_key, exec_key = (span_keys[idx], idx) if idx >= 0 else (0, None)
            dev_off = None if transfer else view.int_stat(stats, off_id)
            if transfer:
                transfers.append(len(events))
            elif dev_off is not None and chip_offset is not None:
                points.append((start, start - dev_off))
                dev_dur = view.int_stat(stats, dur_id)
                start = dev_off + chip_offset
                dur = dur if dev_dur is None else dev_dur  # 0 is a real device duration
            events.add(named[0], module_key, start, dur, lane, exec_key, named[1], transfer)
    if points and chip_offset is not None:
        points.sort()
        keys = [p[0] for p in points]
        for i in transfers:
            start = events.start_ps[i]
            end = start + events.dur_ps[i]
            dstart = points[max(0, bisect.bisect_right(keys, start) - 1)][1]
            dend = points[max(0, bisect.bisect_right(keys, end) - 1)][1]
            start, end = start - dstart + chip_offset, end - dend + chip_offset
            events.set_times(i, start, max(0, end - start))
    _clamp_transfers(events, transfers)
    return dev


def _clamp_transfers(events: DeviceEvents, transfers: list[int]) -> None:
    """A transfer cannot start before the copy-start that issues it.

    XProf draws some ``async-copy`` spans from an earlier point than their copy-start (by a
    few ms in the corpus); such a span is shortened to start at the nearest copy-start of the
    same instruction and module run, keeping its end."""
    if not transfers:
        return
    start_ps, dur_ps = events.start_ps, events.dur_ps
    module_key, exec_key, name, transfer = events.module_key, events.exec_key, events.name, events.transfer
    issued: dict[tuple[int, object, int], list[int]] = {}
    for i in range(len(events)):
        if not transfer[i]:
            issued.setdefault((module_key[i], exec_key[i], name[i]), []).append(start_ps[i])
    for starts in issued.values():
        starts.sort()
    for i in transfers:
        starts = issued.get((module_key[i], exec_key[i], name[i]))
        if not starts:
            continue
        start = start_ps[i]
        k = bisect.bisect_left(starts, start)
        nearest = min(starts[max(0, k - 1):k + 1], key=lambda s: abs(s - start))
        if nearest > start:
            events.set_times(i, nearest, max(0, start + dur_ps[i] - nearest))
            start_ps, dur_ps = events.start_ps, events.dur_ps


def _tpu_op(view: PlaneView, mid: int, events: DeviceEvents) -> tuple[int, int]:
    """(name, details) indices of a TPU op's event metadata: the name from the instruction
    text when the event name is one, flops, bytes and category from the metadata's stats."""
    md = view.plane.event_metadata[mid]
    meta = view.metadata_stats(mid)
    text = md.name if md.name.startswith("%") else None
    name = md.name
    if text is not None:  # "%name = ..." -> "name"
        name = text[1:].split(" ", 1)[0]
    details = (text, _int(meta.get("flops")), _int(meta.get("bytes_accessed")),
               str(meta.get("hlo_category")) if "hlo_category" in meta else None)
    detail = 0
    if details != _NO_DETAILS:
        detail = len(events.details)
        events.details.append(details)
    return events.intern(name), detail


def _module_spans(view: PlaneView) -> list[tuple[int, int, str]]:
    """(start, end, module key) of every module run on the ``XLA Modules`` line, by start."""
    line = view.line("XLA Modules")
    if line is None:
        return []
    spans = [(start, start + dur, view.event_name(mid)) for mid, start, dur, _ in view.events(line)]
    spans.sort()
    return spans


def _gpu_device(view: PlaneView, ordinal: int) -> Device:
    """Kernels and copies, one lane per stream line.

    This runs for every event of a GPU profile (millions), so it is written for that: the stats
    are read in one loop rather than through PlaneView.pick, each distinct string an event
    yields is resolved once, values are appended to the columns by _push, and what is the
    same for a whole line (lane, no run yet, no TPU details) is added once per line. A value
    beyond 64 bits turns the time columns into lists (DeviceEvents.widen); every event after
    it is appended by DeviceEvents.add."""
    dev = Device("gpu", ordinal, view.name, SESSION_CLOCK)
    events = dev.events
    intern = events.intern
    ids = view.stat_ids
    op_id, module_id, program_id, corr_id = [
        ids.get(name, -1) for name in ("hlo_op", "hlo_module", "program_id", "correlation_id")]
    wanted = {op_id, module_id, program_id, corr_id}
    raw_stat, unique_stat, cached_stat = view.raw_stat, view.unique_stat, view.stat_cache.get
    by_metadata: dict[int, tuple[int, int]] = {}  # event metadata id -> (name, copy code)
    op_names: dict[object, int] = {}  # hlo_op value -> name
    module_keys: dict[tuple[object, object], int] = {}  # (hlo_module, program_id) -> key
    starts, durs, corrs = events.start_ps, events.dur_ps, events.correlation
    names, modules, copies = events.name, events.module_key, events.copy
    wide = False  # a value beyond 64 bits was met: the time columns are lists from there on
    for line in view.lines():
        sm = _STREAM_RE.search(line.name)
        lane = intern(f"stream:{ordinal}:{sm.group(1) if sm else line.name}")
        line_copy = _copy_direction(line.name)
        count = 0  # events of this line appended to the columns that fill_line completes
        for mid, start, dur, stats in view.events(line):
            op = module = program = corr = None
            for raw in stats:
                if len(raw) > 1 and raw[0] == 0x08 and raw[1] < 0x80:  # the usual layout
                    sid = raw[1]
                    if sid not in wanted:
                        continue  # a stat no one reads: not decoded
                    if sid == corr_id:  # new with every event: decoded here, not cached
                        size = len(raw) - 3
                        if 0 < size <= 4 and (raw[2] == 0x20 or raw[2] == 0x18):  # int64/uint64
                            if cython.compiled:  # read from the bytes in C (devices.pxd)
                                value = _varint_tail(raw, size)
                                if value >= 0:
                                    corr = value
                                    continue
                            else:
                                word = int.from_bytes(raw[3:], "little")
                                if word & _VARINT_HIGH_BITS[size] == _VARINT_MORE_BITS[size]:
                                    corr = ((word & 0x7F) | (word >> 1 & 0x3F80)
                                            | (word >> 2 & 0x1FC000) | (word >> 3 & 0xFE00000))
                                    continue
                        corr = unique_stat(raw)[2]
                        continue
                hit = cached_stat(raw) or raw_stat(raw)
                sid = hit[0]
                if sid == op_id:
                    op = hit[2]
                elif sid == module_id:
                    module = hit[2]
                elif sid == program_id:
                    program = hit[2]
                elif sid == corr_id:
                    corr = hit[2]
            named = by_metadata.get(mid)
            if named is None:
                name = view.event_name(mid)
                named = by_metadata[mid] = (intern(name), _COPY_CODES[line_copy or _copy_direction(name)])
            if op:
                name_index = op_names.get(op)
                if name_index is None:
                    name_index = op_names[op] = intern(str(op))
                module_index = module_keys.get((module, program))
                if module_index is None:
                    module_index = module_keys[(module, program)] = intern(_module_key(module, program))
            else:
                name_index, module_index = named[0], 0
            if corr is not None and type(corr) is not int:
                corr = _int(corr)
            if not wide:
                try:
                    if corr == _NO_CORRELATION:
                        raise OverflowError  # the sentinel itself as a real id
                    _push(starts, start)
                    _push(durs, dur)
                    _push(corrs, _NO_CORRELATION if corr is None else corr)
                except OverflowError:  # lists from here on; widen() drops a partial event
                    events.fill_line(count, lane)
                    events.widen()
                    wide, count = True, 0
                else:
                    _push(names, name_index)
                    _push(modules, module_index)
                    _push(copies, named[1])
                    count += 1
                    continue
            events.add(name_index, module_index, start, dur, lane, None, 0, False, named[1], corr)
        events.fill_line(count, lane)
    _number_runs(events)
    return dev


def _copy_direction(text: str) -> str | None:
    """A GPU copy's direction from its stream line ("Stream #14(MemcpyH2D)") or event name
    (CUDA "MemcpyH2D", HIP "hipMemcpyHtoDAsync"): "load" (host to device), "store" (device
    to host), "device" (within or between devices); None for anything else."""
    if "Memcpy" not in text and "memcpy" not in text:
        return None
    if "H2D" in text or "HtoD" in text:
        return "load"
    if "D2H" in text or "DtoH" in text:
        return "store"
    return "device"


class _ModuleKeys(dict):
    """_module_key, one string per distinct (module, program id): millions of events share a
    few, so the formatting is done once."""

    def __call__(self, name: object, program_id: object) -> str:
        key = (name, program_id)
        text = self.get(key)
        if text is None:
            text = self[key] = _module_key(name, program_id)
        return text


def _wanted(view: PlaneView, names: tuple[str, ...]) -> dict[int, str]:
    """Stat metadata id -> name for the stats of ``names`` this plane has (resolved once)."""
    return {view.stat_ids[n]: n for n in names if n in view.stat_ids}


def _number_runs(events: DeviceEvents) -> None:
    """GPU kernels carry no run id: a module's run ends when one of its instructions repeats.

    Several kernels of one instruction (a convolution and its helpers) are consecutive, so a
    repeat only counts after another instruction of the module was seen in between."""
    module_key, name, exec_key = events.module_key, events.name, events.exec_key
    state: dict[int, list] = {}  # module -> [run, instructions seen in it, last instruction]
    for i in events.by_start():
        module = module_key[i]
        if not module:
            continue
        op = name[i]
        run = state.get(module)
        if run is None:
            run = state[module] = [0, set(), op]
        elif op != run[2] and op in run[1]:
            run[0] += 1
            run[1] = set()
        seen = run[1]
        seen.add(op)
        run[2] = op
        exec_key[i] = run[0]


def _cpu_devices(view: PlaneView) -> list[Device]:
    ids = _wanted(view, ("hlo_op", "hlo_module", "program_id", "run_id", "device_ordinal"))
    if "hlo_op" not in view.stat_ids:
        return []
    by_ordinal: dict[int, Device] = {}
    module_key = _ModuleKeys()
    lanes: dict[int, int] = {}
    for line in view.lines():
        for mid, start, dur, stats in view.events(line):
            values = view.pick(stats, ids)
            op = values.get("hlo_op")
            if not op:
                continue
            ordinal = _int(values.get("device_ordinal")) or 0
            dev = by_ordinal.get(ordinal)
            if dev is None:
                dev = by_ordinal[ordinal] = Device("cpu", ordinal, f"{view.name} device_ordinal={ordinal}",
                                                   SESSION_CLOCK)
                lanes[ordinal] = dev.events.intern(f"cpu:{ordinal}")
            events = dev.events
            events.add(events.intern(str(op)),
                       events.intern(module_key(values.get("hlo_module"), values.get("program_id"))),
                       start, dur, lanes[ordinal], values.get("run_id"))
    return list(by_ordinal.values())
