"""XSpace reader (``.xplane.pb``, written by jax.profiler / XProf) on integer picoseconds.

Built for files of hundreds of MB with millions of events, read plane by plane:

- the top-level records are split with a small varint walk (cheap: an XSpace has tens of
  records), so a plane is decoded only when asked for, and dropped when its view is;
- a plane is decoded without its lines (the metadata tables, as a real ``XPlane``); each
  line is decoded on its own when iterated (a long line a part of its events at a time:
  :class:`PartedLine`), with a line schema whose event stats stay raw bytes: the stats of an
  event are decoded only when asked for, through a per-plane cache keyed by those bytes (most
  stats, e.g. ``ref_value`` op names, repeat); plane and line names are read without decoding
  the record they name;
- event time = ``line.timestamp_ns * 1000 + event.offset_ps`` as an integer (the session
  clock: files written by jax.profiler are normalised to the profile start);
- stat values with ``ref_value`` resolved to the referenced stat metadata's name;
- the per-chip offset that maps a TPU op's ``device_offset_ps`` (the chip's own counter)
  onto the session clock, so device durations can be used as measured;
- one-line :class:`TraceFormatError` for files that are not, or no longer, an XSpace.
"""

from __future__ import annotations

import mmap
import zlib
from collections.abc import Iterator
from itertools import chain
from pathlib import Path
from typing import Union

from google.protobuf import descriptor_pb2, message_factory
from google.protobuf.message import DecodeError

try:  # read by Cython when it compiles this module (setup.py): see _scan_events
    import cython
except ImportError:  # run as plain Python without Cython installed
    from chakra_hooks.common.no_cython import cython

from chakra_hooks.common.errors import TraceFormatError
from chakra_hooks.linker.jsonio import release_pages
from chakra_hooks.linker.xla import xspace_pb2

StatValue = Union[int, float, str, bytes]

SESSION_CLOCK = "xspace session (line timestamp_ns*1000 + offset_ps, ps since profile start)"
DEVICE_OPS_LINE = "XLA Ops"

_PLANE_FIELD, _LINES_FIELD = 1, 3
_STAT_CACHE_LIMIT = 1 << 18  # distinct stat byte strings remembered per plane


def _line_schema():
    """``XLine`` as in xspace.proto, but with each event's stats kept as raw bytes.

    Declared in the private pool of xspace_pb2 (never the default pool), at import."""
    F = descriptor_pb2.FieldDescriptorProto
    fd = descriptor_pb2.FileDescriptorProto(name="xspace_lines.proto", syntax="proto3",
                                            package="chakra_hooks.xspace_lines")
    ev = fd.message_type.add(name="RawStatsEvent")
    ev.oneof_decl.add(name="data")
    for name, num, typ, rep, oneof in (("metadata_id", 1, F.TYPE_INT64, False, False),
                                       ("offset_ps", 2, F.TYPE_INT64, False, True),
                                       ("num_occurrences", 5, F.TYPE_INT64, False, True),
                                       ("duration_ps", 3, F.TYPE_INT64, False, False),
                                       ("stats", 4, F.TYPE_BYTES, True, False)):
        f = ev.field.add(name=name, number=num, type=typ,
                         label=F.LABEL_REPEATED if rep else F.LABEL_OPTIONAL)
        if oneof:
            f.oneof_index = 0
    line = fd.message_type.add(name="RawStatsLine")
    for name, num, typ in (("id", 1, F.TYPE_INT64), ("display_id", 10, F.TYPE_INT64),
                           ("name", 2, F.TYPE_STRING), ("display_name", 11, F.TYPE_STRING),
                           ("timestamp_ns", 3, F.TYPE_INT64), ("duration_ps", 9, F.TYPE_INT64)):
        line.field.add(name=name, number=num, type=typ, label=F.LABEL_OPTIONAL)
    line.field.add(name="events", number=4, type=F.TYPE_MESSAGE, label=F.LABEL_REPEATED,
                   type_name=".chakra_hooks.xspace_lines.RawStatsEvent")
    pool = xspace_pb2.DESCRIPTOR.pool
    pool.AddSerializedFile(fd.SerializeToString())
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(
        "chakra_hooks.xspace_lines.RawStatsLine"))


RawStatsLine = _line_schema()


# ---------------------------------------------------------------------------------------------
# Splitting length-delimited records without decoding them


def _read_varint(data, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data):
            raise IndexError(pos)
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _name_of(data, start: int, end: int) -> str:
    """The name (field 2; the last one, as protobuf reads a repeated field) of the XPlane
    record data[start:end], found by stepping over the other fields: decoding the record for
    it would copy them all (its lines) and read every page of them. Raises
    ValueError(offset, what)."""
    found = None
    for num, rec, a, b in _fields(data, start, end):
        if num == 2:
            if data[rec] != 0x12:
                raise ValueError(rec, "field 2 (the name) as a string")
            found = a, b
    if found is None:
        return ""
    try:
        return str(data[found[0]:found[1]], "utf-8")
    except UnicodeDecodeError:
        raise ValueError(found[0], "UTF-8 text in field 2 (the name)") from None


def _line_parts(data, start: int, end: int, part_bytes: int
                ) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """Where an XLine record's fields lie in data[start:end]: (the records of its own fields,
    its event records in parts of at most ``part_bytes`` (or one event), each part a run of
    consecutive event records); raises ValueError(offset, what) on damage, as _fields does.
    Runs for every event of a long line, so an event record (key 0x22) is stepped over
    inline."""
    head: list[tuple[int, int]] = []
    parts: list[tuple[int, int]] = []
    first = -1  # where the part being gathered starts (-1: none)
    pos = start
    while pos < end:
        rec = pos
        if data[pos] == 0x22:  # field 4, an event
            try:
                length = data[pos + 1]
                pos += 2
                if length >= 0x80:  # events of 128 bytes or more
                    length, pos = _read_varint(memoryview(data), pos - 1)
            except IndexError:
                raise ValueError(rec, "a complete varint (truncated?)") from None
            pos += length
            if pos > end:
                raise ValueError(rec, f"{length} bytes of field 4, but the record ends after "
                                      f"{end - (pos - length)} (truncated?)")
            if first < 0:
                first = rec
            elif pos - first > part_bytes:
                parts.append((first, rec))
                first = rec
            continue
        if first >= 0:  # any other field ends a run of events
            parts.append((first, rec))
            first = -1
        for _, _, _, field_end in _fields(data, rec, end):
            head.append((rec, field_end))
            pos = field_end
            break
    if first >= 0:
        parts.append((first, pos))
    return head, parts


def _fields(data, start: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """(field number, record start, payload start, payload end) of each field in data[start:end];
    raises ValueError(offset, what) on damage. Payload = the value bytes for wire type 2."""
    pos = start
    while pos < end:
        rec = pos
        try:
            tag, pos = _read_varint(data, pos)
            wire = tag & 7
            if wire == 2:
                length, pos = _read_varint(data, pos)
                if pos + length > end:
                    raise ValueError(rec, f"{length} bytes of field {tag >> 3}, but the record ends after "
                                          f"{end - pos} (truncated?)")
                yield tag >> 3, rec, pos, pos + length
                pos += length
                continue
            if wire == 0:
                _, pos = _read_varint(data, pos)
            elif wire in (1, 5):
                pos += 8 if wire == 1 else 4
            else:
                raise ValueError(rec, f"an XSpace field, got wire type {wire}")
        except IndexError:
            raise ValueError(rec, "a complete varint (truncated?)") from None
        if pos > end:
            raise ValueError(rec, "a complete fixed-size field (truncated?)")
        yield tag >> 3, rec, pos, pos


@cython.boundscheck(False)  # every read is checked to lie within [start, end), and that within
@cython.wraparound(False)  # the data (at the start)
def _scan_events(data, start: int, end: int, base: int, out: list, most: int) -> int:
    """Append to ``out`` the events of the XLine bytes data[start:end] (a whole line, whose
    own fields are stepped over, or a run of its event records) as (metadata_id,
    base + offset_ps, duration_ps, stats) tuples, ``stats`` the event's raw XStat records:
    what :meth:`PlaneView.events` yields for a decoded line, read from the bytes themselves.
    The compiled build reads lines so; reading a decoded event's fields, a Python call each,
    cost more than the rest of collecting a GPU event. Stops after ``most`` events, and
    returns where it stopped (``end`` once every event is read).

    Read as protobuf reads an XEvent: a scalar field given twice keeps the last value,
    ``offset_ps`` and ``num_occurrences`` are one oneof (the last set wins; offset 0 when it
    is num_occurrences), a field of an unexpected wire type is an unknown field and skipped.
    Raises ValueError(offset, what) on damage, as _fields does."""
    if not 0 <= start <= end <= len(data):  # the compiled build reads the bytes unchecked
        raise IndexError(f"bytes {start} to {end} of {len(data)}")
    pos, limit = start, end
    in_event = False  # reading an event's fields: they end at `limit`, the line's at `end`
    mid = offset = dur = 0
    stats: list[bytes] = []
    while True:
        if pos >= limit:
            if not in_event:
                return pos
            out.append((_signed(mid), base + _signed(offset), _signed(dur), stats))
            in_event, limit = False, end
            most -= 1
            if most <= 0:
                return pos
            continue
        rec = pos
        key = shift = 0
        while True:  # the field's key, a varint
            if pos >= limit:
                raise ValueError(rec, "a complete varint (truncated?)")
            byte = data[pos]
            pos += 1
            piece = byte & 0x7F  # a 64-bit number in C: shifted 28, it would overflow an int
            key |= piece << shift
            if byte < 0x80:
                break
            shift += 7
            if shift > 28:  # field numbers fit in 29 bits
                raise ValueError(rec, "a field key of at most 5 bytes")
        if key < 8 or key >> 32:
            raise ValueError(rec, "a field number from 1 to 2^29 - 1")
        wire = key & 7
        value = 0
        if wire == 0 or wire == 2:
            shift = 0
            while True:  # the value, or the length of a wire type 2 field
                if pos >= limit:
                    raise ValueError(rec, "a complete varint (truncated?)")
                byte = data[pos]
                pos += 1
                piece = byte & 0x7F
                if shift == 63:  # the 10th byte: only its lowest bit is within 64 bits
                    piece &= 1
                value |= piece << shift
                if byte < 0x80:
                    break
                shift += 7
                if shift > 63:
                    raise ValueError(rec, "a varint of at most 10 bytes")
        elif wire == 1 or wire == 5:
            pos += 8 if wire == 1 else 4
            if pos > limit:
                raise ValueError(rec, "a complete fixed-size field (truncated?)")
            continue
        else:
            raise ValueError(rec, f"an XSpace field, got wire type {wire}")
        field = key >> 3
        if wire == 2:
            if value > limit - pos:
                raise ValueError(rec, f"{value} bytes of field {field}, but the record ends "
                                      f"after {limit - pos} (truncated?)")
            if not in_event:
                if field == 4:  # an event: read its fields next
                    in_event, limit = True, pos + value
                    mid = offset = dur = 0
                    stats = []
                    continue
            elif field == 4:  # a stat of the event
                stats.append(_bytes_at(data, pos, value))
            pos += value
        elif in_event:
            if field == 1:
                mid = value
            elif field == 2:
                offset = value
            elif field == 3:
                dur = value
            elif field == 5:  # num_occurrences: offset_ps, its oneof, reads 0
                offset = 0


_TWO_64 = 1 << 64


def _signed(value: int) -> int:
    """An int64 field's value from its varint (two's complement, as protobuf writes one)."""
    return value - _TWO_64 if value >> 63 else value


if not cython.compiled:  # the compiled build's are C functions (xspace.pxd)
    def _bytes_at(data, pos: int, length: int) -> bytes:
        return bytes(data[pos:pos + length])


# ---------------------------------------------------------------------------------------------
# The file


class XSpaceFile:
    """A read ``.xplane.pb``: its raw bytes and where each plane record lies in them.

    ``planes`` iterates :class:`PlaneView` objects decoded one at a time; ``plane_names`` is
    known without decoding any plane."""

    __slots__ = ("path", "data", "spans", "plane_names", "odd_stats")

    def __init__(self, data: bytes, path: Path | str = "<bytes>") -> None:
        self.path = path
        self.data = data
        # Integer stats the planes read that were recorded as strings, by stat name and
        # whether the string spelled an integer (read as it) or not (left out): PlaneView's.
        self.odd_stats: dict[tuple[str, bool], int] = {}
        self.spans: list[tuple[int, int]] = []
        self.plane_names: list[str] = []
        view = memoryview(data)
        record = 0
        try:
            for num, rec, a, b in _fields(view, 0, len(data)):
                if num == _PLANE_FIELD:
                    self.spans.append((a, b))
                record += 1
        except ValueError as err:
            offset, what = err.args
            raise TraceFormatError(path, f"top-level record {record} at byte {offset}", what) from None
        for index, (a, b) in enumerate(self.spans):
            try:
                self.plane_names.append(_name_of(view, a, b))
            except ValueError as err:
                raise TraceFormatError(path, f"plane {index} at byte {err.args[0]}", err.args[1]) from None
        if not self.spans:
            raise TraceFormatError(path, f"byte 0 of {len(data)}", "an XSpace with at least one plane")

    @property
    def planes(self) -> Iterator[PlaneView]:
        return (self.plane(i) for i in range(len(self.spans)))

    def plane(self, index: int) -> PlaneView:
        return PlaneView.decode(self, index)

    def release(self, index: int) -> None:
        """Let the memory holding plane ``index``'s bytes go (a mapped file's pages leave the
        process and are read again from the file if the plane is decoded again); a no-op for
        bytes in memory. Device collection calls it after each plane, so that a profile's
        device planes are never all resident at once beside their events."""
        release_pages(self.data, *self.spans[index])


def read_xspace(path: Path | str) -> XSpaceFile:
    """Open a ``.xplane.pb``; a damaged or foreign file raises one TraceFormatError."""
    path = Path(path)
    try:
        data = _map(path)
    except OSError as err:
        raise TraceFormatError(path, "open", f"a readable .xplane.pb file ({err.strerror})") from None
    return parse_xspace(data, path)


def _map(path: Path) -> bytes | mmap.mmap:
    """The file's bytes, mapped read-only (pages are read as planes are decoded, and can be
    released: XSpaceFile.release); read whole where a map is not possible (an empty file, a
    pipe)."""
    with open(path, "rb") as file:
        try:
            return mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
        except (ValueError, OSError):
            return file.read()


def parse_xspace(data: bytes, path: Path | str = "<bytes>") -> XSpaceFile:
    return XSpaceFile(data, path)


def planes(space: XSpaceFile) -> Iterator[PlaneView]:
    return space.planes


def find_plane(space: XSpaceFile, name: str) -> PlaneView | None:
    for i, plane_name in enumerate(space.plane_names):
        if plane_name == name:
            return space.plane(i)
    return None


# ---------------------------------------------------------------------------------------------
# One plane

# A line with more bytes than this is decoded a part of its events at a time (PartedLine):
# decoded, an event takes about five times its bytes, and one GPU stream of a long profile is a
# line of millions of events.
_LINE_PART_BYTES = 1 << 20
# Events read from the bytes per batch (compiled, PartedLine.scan): a batch's tuples exist at
# once, about 200 bytes an event, where a line part's (1 MB of records) took several MB.
_SCAN_EVENTS = 4096


class PartedLine:
    """A long line: its own fields decoded (``head``, a RawStatsLine without events), its
    events decoded about _LINE_PART_BYTES at a time as ``events`` is iterated. Reads as a
    RawStatsLine does for what the linker asks of a line (its name, timestamp and events, in
    order), but ``events`` can only be iterated."""

    __slots__ = ("head", "_data", "_parts", "_path", "_where")

    def __init__(self, head: RawStatsLine, data, parts: list[tuple[int, int]],
                 path: Path | str, where: str) -> None:
        self.head = head
        self._data, self._parts, self._path, self._where = data, parts, path, where

    @property
    def name(self) -> str:
        return self.head.name

    @property
    def timestamp_ns(self) -> int:
        return self.head.timestamp_ns

    @property
    def events(self) -> Iterator:
        return chain.from_iterable(self._part(a, b).events for a, b in self._parts)

    def _part(self, a: int, b: int) -> RawStatsLine:
        try:
            return RawStatsLine.FromString(self._data[a:b])  # event records alone: a valid XLine
        except DecodeError as err:
            raise TraceFormatError(self._path, f"{self._where}, events at byte {a}",
                                   f"a well-formed XLine (decoder: {err})") from None

    def scan(self, base: int) -> Iterator[tuple[int, int, int, list[bytes]]]:
        """The events as PlaneView.events yields them, read from the bytes (_scan_events)
        _SCAN_EVENTS at a time: each batch is made whole before it is iterated."""
        return chain.from_iterable(self._scanned(base))

    def _scanned(self, base: int) -> Iterator[list[tuple[int, int, int, list[bytes]]]]:
        data = self._data
        for a, b in self._parts:
            while a < b:
                out: list[tuple[int, int, int, list[bytes]]] = []
                try:
                    a = _scan_events(data, a, b, base, out, _SCAN_EVENTS)
                except ValueError as err:
                    raise TraceFormatError(self._path, f"{self._where}, byte {err.args[0]}",
                                           err.args[1]) from None
                yield out


def _decoded_events(line: RawStatsLine | PartedLine, base: int
                    ) -> Iterator[tuple[int, int, int, list[bytes]]]:
    for ev in line.events:
        # The stats as a list: iterating the message's field itself costs about twice as
        # much (each item fetched alone, the end found by an IndexError).
        yield ev.metadata_id, base + ev.offset_ps, ev.duration_ps, ev.stats[:]


_VARINT_STATS = {0x18: "uint64_value", 0x20: "int64_value", 0x38: "ref_value"}  # tags, id 1 first
_U64 = (1 << 64) - 1


class PlaneView:
    """One plane: its metadata tables (``plane``, an ``XPlane`` without lines) indexed for fast
    lookups, and its lines, decoded one at a time by :meth:`lines` / :meth:`line`.

    Events are yielded as ``(metadata_id, start_ps, duration_ps, stats)`` tuples; ``stats`` is
    a list of the event's raw XStat records (bytes), to be resolved with :meth:`stats`,
    :meth:`pick` or :meth:`int_stat` only for the events that need them.
    """

    __slots__ = ("plane", "name", "stat_names", "stat_ids", "path", "where", "_data", "_line_spans",
                 "_line_names", "_split_lines", "_meta_stats", "_raw_cache", "odd_stats")

    def __init__(self, plane: xspace_pb2.XPlane, data=None, line_spans: list[tuple[int, int]] | None = None,
                 path: Path | str = "<bytes>", where: str = "plane",
                 odd_stats: dict[tuple[str, bool], int] | None = None) -> None:
        self.plane = plane
        self.odd_stats = {} if odd_stats is None else odd_stats
        self.name = plane.name
        self.stat_names = {k: v.name for k, v in plane.stat_metadata.items()}
        self.stat_ids = {v: k for k, v in self.stat_names.items()}
        self.path, self.where = path, where
        if data is None:  # a plane message built in memory: its lines are re-read from bytes
            data = memoryview(xspace_pb2.XPlane(lines=plane.lines).SerializeToString())
            line_spans = [(a, b) for num, _, a, b in _fields(data, 0, len(data)) if num == _LINES_FIELD]
        self._data = data
        self._line_spans = line_spans or []
        self._line_names: list[str] | None = None
        self._split_lines: dict[int, tuple] = {}  # a split line's (head, parts), found once
        self._meta_stats: dict[int, dict[str, StatValue]] = {}
        self._raw_cache: dict[bytes, tuple[int, str | None, object]] = {}

    @classmethod
    def decode(cls, space: XSpaceFile, index: int) -> PlaneView:
        """Plane ``index`` of ``space``: metadata decoded now, lines located but left as bytes."""
        data = memoryview(space.data)
        start, end = space.spans[index]
        where = f"plane {index} ({space.plane_names[index]!r}) at byte {start}"
        lines: list[tuple[int, int]] = []
        rest: list[memoryview] = []
        try:
            for num, rec, a, b in _fields(data, start, end):
                if num == _LINES_FIELD:
                    lines.append((a, b))
                else:
                    rest.append(data[rec:b])
            plane = xspace_pb2.XPlane.FromString(b"".join(rest))
        except ValueError as err:
            raise TraceFormatError(space.path, f"{where}, byte {err.args[0]}", err.args[1]) from None
        except DecodeError as err:
            raise TraceFormatError(space.path, where, f"a well-formed XPlane (decoder: {err})") from None
        return cls(plane, data, lines, space.path, where, space.odd_stats)

    # -- lines ---------------------------------------------------------------------------

    def line_names(self) -> list[str]:
        """Each line's name (a long line's events are not decoded for it)."""
        if self._line_names is None:
            self._line_names = [self._line(i).name for i in range(len(self._line_spans))]
        return self._line_names

    def lines(self) -> Iterator[RawStatsLine | PartedLine]:
        """Every line, decoded when reached (let it go before the next to keep memory low; a
        long line's events are decoded a part at a time: PartedLine). A mapped file's pages of
        a line leave the process when the next line is asked for."""
        for i in range(len(self._line_spans)):
            yield self._line(i)
            release_pages(self._data, *self._line_spans[i])

    def line(self, name: str) -> RawStatsLine | PartedLine | None:
        """The first line called ``name``."""
        for i, line_name in enumerate(self.line_names()):
            if line_name == name:
                return self._line(i)
        return None

    def _line(self, i: int) -> RawStatsLine | PartedLine:
        a, b = self._line_spans[i]
        where = f"{self.where}, line {i} at byte {a}"
        try:
            if b - a <= _LINE_PART_BYTES and not cython.compiled:
                # Plain Python: protobuf decodes a short line faster than Python reads its
                # bytes. Compiled, every line is split, and its events read by _scan_events.
                return RawStatsLine.FromString(self._data[a:b])
            found = self._split_lines.get(i)
            if found is None:
                data = self._data
                head, parts = _line_parts(data, a, b, _LINE_PART_BYTES)
                head = RawStatsLine.FromString(b"".join([data[r:e] for r, e in head]))
                found = self._split_lines[i] = (head, parts)
            return PartedLine(found[0], self._data, found[1], self.path, where)
        except ValueError as err:
            raise TraceFormatError(self.path, f"{where}, byte {err.args[0]}", err.args[1]) from None
        except DecodeError as err:
            raise TraceFormatError(self.path, where, f"a well-formed XLine (decoder: {err})") from None

    @staticmethod
    def line_base_ps(line: RawStatsLine | PartedLine) -> int:
        """The session time of the line's offset 0: an event starts at this + ``offset_ps``."""
        return line.timestamp_ns * 1000

    def events(self, line: RawStatsLine | PartedLine) -> Iterator[tuple[int, int, int, list[bytes]]]:
        """(metadata_id, start_ps, duration_ps, raw stats) of each of the line's events."""
        base = self.line_base_ps(line)
        if cython.compiled and type(line) is PartedLine:
            return line.scan(base)
        return _decoded_events(line, base)

    def event_name(self, metadata_id: int) -> str:
        return self.plane.event_metadata[metadata_id].name

    def event_display_name(self, metadata_id: int) -> str:
        md = self.plane.event_metadata[metadata_id]
        return md.display_name or md.name

    # -- stats ---------------------------------------------------------------------------

    def value(self, stat: xspace_pb2.XStat) -> StatValue | None:
        """The value of a decoded XStat (metadata and plane stats)."""
        kind = stat.WhichOneof("value")
        return self._resolve(kind, getattr(stat, kind) if kind is not None else None)

    def _resolve(self, kind: str | None, value: object) -> StatValue | None:
        if kind == "ref_value":
            return self.stat_names.get(value, "")
        if kind == "compressed_str_value":
            return _decompress(value)
        return value

    def raw_stat(self, raw: bytes) -> tuple[int, str, StatValue | None, int]:
        """(stat metadata id, stat name, resolved value, value as int_stat gives it) of one raw
        XStat record; cached per plane, since most stats repeat (op names, modules, ...)."""
        hit = self._raw_cache.get(raw)
        return hit if hit is not None else self._stat_miss(raw)

    @property
    def stat_cache(self) -> dict[bytes, tuple[int, str, StatValue | None, int]]:
        """What :meth:`raw_stat` has decoded so far, by record: its ``get`` is raw_stat for a
        record seen before, without a Python call."""
        return self._raw_cache

    def _stat_miss(self, raw: bytes) -> tuple[int, str, StatValue | None, int]:
        hit = self.unique_stat(raw)
        if len(self._raw_cache) < _STAT_CACHE_LIMIT:
            self._raw_cache[raw] = hit
        return hit

    def unique_stat(self, raw: bytes) -> tuple[int, str, StatValue | None, int]:
        """:meth:`raw_stat` without the cache, for a stat whose value is new with every event
        (an id): decoding the usual layout costs less than hashing the record."""
        n = len(raw)
        if 4 <= n <= 8 and raw[0] == 0x08 and raw[1] < 0x80 and raw[2] in _VARINT_STATS:
            # Fast path, inline (this runs for every stat whose value is new, e.g. ids):
            # the usual layout, id < 128 then one varint (ints and ref_value) of up to 5 bytes
            # (correlation ids past 2M are 4 bytes); longer ones (TPU device times) decode
            # faster in upb than in a Python loop.
            value = raw[3]
            pos = 3
            if value >= 0x80:
                value &= 0x7F
                shift = 7
                for pos in range(4, n):
                    byte = raw[pos]
                    value |= (byte & 0x7F) << shift
                    shift += 7
                    if byte < 0x80:
                        break
            if pos == n - 1 and raw[pos] < 0x80:  # exactly one varint, ending the record
                sid, kind = raw[1], _VARINT_STATS[raw[2]]
                if kind == "ref_value":
                    return (sid, self._stat_name(sid), self.stat_names.get(value & _U64, ""), 0)
                value &= _U64
                if kind == "int64_value" and value >= 1 << 63:
                    value -= 1 << 64
                return (sid, self._stat_name(sid), value, value)
        sid, kind, value = _decode_stat(raw, self.path, self.where)
        name = self._stat_name(sid)
        if kind == "str_value" and name in INTEGER_STATS:
            # A number recorded as text: read as the integer it spells, or left out (None)
            # rather than taken as 0; counted either way (odd_stats, said by the linker).
            try:
                number = int(value)
            except ValueError:
                number = None
            key = (name, number is not None)
            self.odd_stats[key] = self.odd_stats.get(key, 0) + 1
            return (sid, name, number, number)
        return (sid, name, self._resolve(kind, value), int(value) if kind in _NUMERIC else 0)

    def _stat_name(self, sid: int) -> str:
        names = self.stat_names
        return names[sid] if sid in names else str(sid)

    def stats(self, stats) -> dict[str, StatValue]:
        """Resolve an event's raw stats into {name: value} (ref_value becomes the referenced name)."""
        get, miss = self._raw_cache.get, self._stat_miss
        out: dict[str, StatValue] = {}
        for raw in stats:  # runs for every stat of every event read: kept flat
            hit = get(raw) or miss(raw)
            out[hit[1]] = hit[2]
        return out

    def pick(self, stats, wanted: dict[int, str]) -> dict[str, StatValue | None]:
        """{wanted name: value} of the stats whose metadata id is a key of ``wanted``.

        Stats of other ids are skipped without decoding when their id is the usual first
        byte pair (``08 <id < 128>``)."""
        return _pick(stats, wanted, self._raw_cache, self._stat_miss)

    def int_stat(self, stats, stat_id: int | None) -> int | None:
        """The integer value of stat ``stat_id`` among an event's raw stats, or None when absent."""
        if stat_id is None:
            return None
        return _int_stat(stats, stat_id, self._raw_cache, self._stat_miss)

    def message_stats(self, stats) -> dict[str, StatValue]:
        """Resolve a repeated (decoded) XStat into {name: value}."""
        names = self.stat_names
        return {names[st.metadata_id] if st.metadata_id in names else str(st.metadata_id): self.value(st)
                for st in stats}

    def metadata_stats(self, metadata_id: int) -> dict[str, StatValue]:
        """Stats stored once on the event metadata (TPU: flops, bytes_accessed, ...), cached."""
        cached = self._meta_stats.get(metadata_id)
        if cached is None:
            cached = self.message_stats(self.plane.event_metadata[metadata_id].stats)
            self._meta_stats[metadata_id] = cached
        return cached

    def plane_stats(self) -> dict[str, StatValue]:
        return self.message_stats(self.plane.stats)


_NUMERIC = ("int64_value", "uint64_value", "double_value")
# The stats the linker reads as integers (ids and device times).
INTEGER_STATS = frozenset({"correlation_id", "device_offset_ps", "device_duration_ps",
                           "program_id", "run_id", "device_ordinal"})


def _pick(stats, wanted: dict[int, str], cache: dict, miss) -> dict[str, StatValue | None]:
    """PlaneView.pick over a raw stats list: module level so that the compiled build reads each
    record as C bytes (xspace.pxd); ``cache`` and ``miss`` are the view's decoded stats and
    the decoder of one it has not seen."""
    out: dict[str, StatValue | None] = {}
    for raw in stats:
        if len(raw) > 1 and raw[0] == 0x08 and raw[1] < 0x80 and raw[1] not in wanted:
            continue
        hit = cache.get(raw) or miss(raw)
        name = wanted.get(hit[0])
        if name is not None:
            out[name] = hit[2]
    return out


def _int_stat(stats, stat_id: int, cache: dict, miss) -> int | None:
    """PlaneView.int_stat over a raw stats list (module level, as _pick)."""
    for raw in stats:
        if len(raw) > 1 and raw[0] == 0x08 and raw[1] < 0x80 and raw[1] != stat_id:
            continue
        hit = cache.get(raw) or miss(raw)
        if hit[0] == stat_id:
            return hit[3]
    return None


def _decode_stat(raw: bytes, path, where: str) -> tuple[int, str | None, object]:
    """(metadata id, oneof kind, unresolved value) of one serialized XStat, decoded by upb."""
    try:
        stat = xspace_pb2.XStat.FromString(raw)
    except DecodeError as err:
        raise TraceFormatError(path, where, f"a well-formed XStat (decoder: {err})") from None
    kind = stat.WhichOneof("value")
    return stat.metadata_id, kind, getattr(stat, kind) if kind is not None else None


def _decompress(raw: bytes) -> str:
    # XProf compresses long strings with zlib; keep the raw text if it is something else.
    try:
        return zlib.decompress(raw).decode("utf-8", "replace")
    except zlib.error:
        return raw.decode("utf-8", "replace")


def device_clock_offset(view: PlaneView, line: RawStatsLine | PartedLine) -> int | None:
    """Session-clock minus chip-clock offset for a TPU plane, in ps, or None without device times.

    Every TPU op carries ``device_offset_ps`` (the chip's counter) next to its session-clock
    start; their difference is one constant per chip up to the host/chip sync jitter, so the
    median over the line is taken. Device start mapped to the session = device_offset_ps + this.
    """
    sid = view.stat_ids.get("device_offset_ps")
    if sid is None:
        return None
    diffs: list[int] = []
    for _, start, _, stats in view.events(line):
        dev_off = view.int_stat(stats, sid)
        if dev_off is not None:
            diffs.append(start - dev_off)
    if not diffs:
        return None
    diffs.sort()
    return diffs[len(diffs) // 2]


def int_stat(stats, stat_id: int | None) -> int | None:
    """The integer value of stat ``stat_id`` in a repeated (decoded) XStat, or None when absent."""
    if stat_id is None:
        return None
    for st in stats:
        if st.metadata_id == stat_id:
            kind = st.WhichOneof("value")
            return int(getattr(st, kind)) if kind in _NUMERIC else 0
    return None


def profile_start_ns(space: XSpaceFile) -> int | None:
    """Epoch start of the session (``Task Environment`` plane's ``profile_start_time``)."""
    env = find_plane(space, "Task Environment")
    if env is None:
        return None
    value = env.plane_stats().get("profile_start_time")
    return int(value) if isinstance(value, (int, float)) else None
