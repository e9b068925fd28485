"""XSpace reader (``.xplane.pb``, written by jax.profiler / XProf) on integer picoseconds.

The file is decoded once with protobuf's upb backend (``ParseFromString``); events are then
read straight from the decoded messages, without building a Python object per event, because
a device plane can hold millions of them. What this module adds on top of the raw messages:

- event time = ``line.timestamp_ns * 1000 + event.offset_ps`` as an integer (the session
  clock: files written by jax.profiler are normalised to the profile start);
- stat values with ``ref_value`` resolved to the referenced stat metadata's name;
- the per-chip offset that maps a TPU op's ``device_offset_ps`` (the chip's own counter)
  onto the session clock, so device durations can be used as measured;
- one-line :class:`TraceFormatError` for files that are not, or no longer, an XSpace.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Union

from google.protobuf.message import DecodeError

from chakra_hooks.errors import TraceFormatError
from chakra_hooks.linker import xspace_pb2

StatValue = Union[int, float, str, bytes]

SESSION_CLOCK = "xspace session (line timestamp_ns*1000 + offset_ps, ps since profile start)"
DEVICE_OPS_LINE = "XLA Ops"


def read_xspace(path: Path | str) -> xspace_pb2.XSpace:
    """Decode a whole ``.xplane.pb``; a damaged or foreign file raises one TraceFormatError."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as err:
        raise TraceFormatError(path, "open", f"a readable .xplane.pb file ({err.strerror})") from None
    return parse_xspace(data, path)


def parse_xspace(data: bytes, path: Path | str = "<bytes>") -> xspace_pb2.XSpace:
    space = xspace_pb2.XSpace()
    try:
        space.ParseFromString(data)
    except DecodeError as err:
        where, what = _locate_damage(data)
        raise TraceFormatError(path, where, f"{what} (decoder: {err})") from None
    if not space.planes:
        raise TraceFormatError(path, f"byte 0 of {len(data)}", "an XSpace with at least one plane")
    return space


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
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


def _locate_damage(data: bytes) -> tuple[str, str]:
    """Walk the top-level records (planes, hostnames, ...) to say where the damage starts.

    Only the few top-level records are visited, so this is cheap even for large files."""
    pos = record = 0
    while pos < len(data):
        start = pos
        try:
            tag, pos = _read_varint(data, pos)
            wire = tag & 7
            if wire == 2:
                length, pos = _read_varint(data, pos)
                if pos + length > len(data):
                    return (f"top-level record {record} at byte {start}",
                            f"{length} bytes of field {tag >> 3}, but the file ends after "
                            f"{len(data) - pos} (truncated?)")
                pos += length
            elif wire == 0:
                _, pos = _read_varint(data, pos)
            else:
                return f"top-level record {record} at byte {start}", f"an XSpace field, got wire type {wire}"
        except IndexError:
            return f"top-level record {record} at byte {start}", "a complete varint (truncated?)"
        record += 1
    return f"inside one of {record} top-level records", "a well-formed XSpace plane"


@dataclass(slots=True)
class PlaneView:
    """One plane with its metadata tables indexed for fast lookups.

    Events are yielded as ``(metadata_id, start_ps, duration_ps, stats)`` tuples; ``stats`` is
    the raw repeated XStat, to be resolved with :meth:`stats` only for the events that need it.
    """

    plane: xspace_pb2.XPlane
    name: str = ""
    stat_names: dict[int, str] = field(default_factory=dict)
    stat_ids: dict[str, int] = field(default_factory=dict)
    _meta_stats: dict[int, dict[str, StatValue]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.name = self.plane.name
        self.stat_names = {k: v.name for k, v in self.plane.stat_metadata.items()}
        self.stat_ids = {v: k for k, v in self.stat_names.items()}

    def line(self, name: str) -> xspace_pb2.XLine | None:
        for line in self.plane.lines:
            if line.name == name:
                return line
        return None

    def events(self, line: xspace_pb2.XLine) -> Iterator[tuple[int, int, int, object]]:
        base = line.timestamp_ns * 1000
        for ev in line.events:
            yield ev.metadata_id, base + ev.offset_ps, ev.duration_ps, ev.stats

    def event_name(self, metadata_id: int) -> str:
        return self.plane.event_metadata[metadata_id].name

    def event_display_name(self, metadata_id: int) -> str:
        md = self.plane.event_metadata[metadata_id]
        return md.display_name or md.name

    def value(self, stat: xspace_pb2.XStat) -> StatValue | None:
        kind = stat.WhichOneof("value")
        if kind is None:
            return None
        if kind == "ref_value":
            return self.stat_names.get(stat.ref_value, "")
        if kind == "compressed_str_value":
            return _decompress(stat.compressed_str_value)
        return getattr(stat, kind)

    def stats(self, stats) -> dict[str, StatValue]:
        """Resolve a repeated XStat into {name: value} (ref_value becomes the referenced name)."""
        names = self.stat_names
        out: dict[str, StatValue] = {}
        for st in stats:  # inlined value(): this runs for every stat of every event read
            kind = st.WhichOneof("value")
            if kind == "ref_value":
                value: StatValue | None = names.get(st.ref_value, "")
            elif kind is None or kind == "compressed_str_value":
                value = self.value(st)
            else:
                value = getattr(st, kind)
            key = st.metadata_id
            out[names[key] if key in names else str(key)] = value
        return out

    def metadata_stats(self, metadata_id: int) -> dict[str, StatValue]:
        """Stats stored once on the event metadata (TPU: flops, bytes_accessed, ...), cached."""
        cached = self._meta_stats.get(metadata_id)
        if cached is None:
            cached = self.stats(self.plane.event_metadata[metadata_id].stats)
            self._meta_stats[metadata_id] = cached
        return cached

    def plane_stats(self) -> dict[str, StatValue]:
        return self.stats(self.plane.stats)


def _decompress(raw: bytes) -> str:
    # XProf compresses long strings with zlib; keep the raw text if it is something else.
    try:
        return zlib.decompress(raw).decode("utf-8", "replace")
    except zlib.error:
        return raw.decode("utf-8", "replace")


def planes(space: xspace_pb2.XSpace) -> list[PlaneView]:
    return [PlaneView(p) for p in space.planes]


def find_plane(space: xspace_pb2.XSpace, name: str) -> PlaneView | None:
    for p in space.planes:
        if p.name == name:
            return PlaneView(p)
    return None


def device_clock_offset(view: PlaneView, line: xspace_pb2.XLine) -> int | None:
    """Session-clock minus chip-clock offset for a TPU plane, in ps, or None without device times.

    Every TPU op carries ``device_offset_ps`` (the chip's counter) next to its session-clock
    start; their difference is one constant per chip up to the host/chip sync jitter, so the
    median over the line is taken. Device start mapped to the session = device_offset_ps + this.
    """
    sid = view.stat_ids.get("device_offset_ps")
    if sid is None:
        return None
    diffs: list[int] = []
    base = line.timestamp_ns * 1000
    for ev in line.events:
        for st in ev.stats:
            if st.metadata_id == sid:
                diffs.append(base + ev.offset_ps - _int_value(st))
                break
    if not diffs:
        return None
    diffs.sort()
    return diffs[len(diffs) // 2]


def _int_value(stat: xspace_pb2.XStat) -> int:
    kind = stat.WhichOneof("value")
    return int(getattr(stat, kind)) if kind in ("int64_value", "uint64_value", "double_value") else 0


def int_stat(stats, stat_id: int | None) -> int | None:
    """The integer value of stat ``stat_id`` in a repeated XStat, or None when absent."""
    if stat_id is None:
        return None
    for st in stats:
        if st.metadata_id == stat_id:
            return _int_value(st)
    return None


def profile_start_ns(space: xspace_pb2.XSpace) -> int | None:
    """Epoch start of the session (``Task Environment`` plane's ``profile_start_time``)."""
    env = find_plane(space, "Task Environment")
    if env is None:
        return None
    value = env.plane_stats().get("profile_start_time")
    return int(value) if isinstance(value, (int, float)) else None
