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
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field

from chakra_hooks.linker.gc_pause import gc_paused
from chakra_hooks.linker.xla.xspace import SESSION_CLOCK, PlaneView, XSpaceFile, device_clock_offset

_DEVICE_PLANE_RE = re.compile(r"^/device:(TPU|GPU):(\d+)$")
_STREAM_RE = re.compile(r"Stream #(\d+)")


@dataclass(slots=True)
class DeviceEvent:
    """One op execution on a device (a TPU op, a GPU kernel, a CPU thunk)."""

    name: str  # HLO instruction name when known, else the event name
    module_key: str  # "<module name>(<program id>)", "" when unknown
    start_ps: int
    dur_ps: int
    lane: str
    exec_key: object  # identifies one run of the module (run id, module span index, ...)
    text: str | None = None  # full instruction text (TPU event names)
    flops: int | None = None
    bytes_accessed: int | None = None
    category: str | None = None
    transfer: bool = False  # TPU async copy transfer span (Async XLA Ops)
    copy: str | None = None  # GPU copy direction from its stream line: "load", "store", "device"
    correlation: int | None = None  # GPU: the id of the host call that launched it


@dataclass(slots=True)
class Device:
    kind: str  # "tpu", "gpu", "cpu"
    ordinal: int
    plane: str
    clock: str
    events: list[DeviceEvent] = field(default_factory=list)


def collect_devices(space: XSpaceFile) -> list[Device]:
    """Planes are decoded one at a time (by name, without decoding the others) and let go."""
    with gc_paused():
        return _collect_devices(space)


def _collect_devices(space: XSpaceFile) -> list[Device]:
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
    if not devices:
        for index, name in enumerate(space.plane_names):
            if name == "/host:CPU":
                devices.extend(_cpu_devices(space.plane(index)))
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
    spans = _module_spans(view)
    starts = [s for s, _, _ in spans]
    off_id = view.stat_ids.get("device_offset_ps")
    dur_id = view.stat_ids.get("device_duration_ps")
    points: list[tuple[int, int]] = []  # (session start, session - device) of every op
    transfers: list[DeviceEvent] = []
    for line_name, transfer in (("XLA Ops", False), ("Async XLA Ops", True)):
        line = ops_line if not transfer else view.line(line_name)  # each line decoded once
        if line is None:
            continue
        lane = f"tpu:{ordinal}:{line_name}"
        for mid, start, dur, stats in view.events(line):
            ev = _tpu_event(view, mid, start, dur, lane, transfer)
            idx = bisect.bisect_right(starts, start) - 1  # module run, on the session clock
            if idx >= 0:
                ev.exec_key = idx
                ev.module_key = spans[idx][2]
            dev.events.append(ev)
            dev_off = None if transfer else view.int_stat(stats, off_id)
            if transfer:
                transfers.append(ev)
            elif dev_off is not None and chip_offset is not None:
                points.append((start, start - dev_off))
                ev.start_ps = dev_off + chip_offset
                dev_dur = view.int_stat(stats, dur_id)
                ev.dur_ps = dur if dev_dur is None else dev_dur  # 0 is a real device duration
    if points and chip_offset is not None:
        points.sort()
        keys = [p[0] for p in points]
        for ev in transfers:
            end = ev.start_ps + ev.dur_ps
            dstart = points[max(0, bisect.bisect_right(keys, ev.start_ps) - 1)][1]
            dend = points[max(0, bisect.bisect_right(keys, end) - 1)][1]
            ev.start_ps, end = ev.start_ps - dstart + chip_offset, end - dend + chip_offset
            ev.dur_ps = max(0, end - ev.start_ps)
    _clamp_transfers(dev.events, transfers)
    return dev


def _clamp_transfers(events: list[DeviceEvent], transfers: list[DeviceEvent]) -> None:
    """A transfer cannot start before the copy-start that issues it.

    XProf draws some ``async-copy`` spans from an earlier point than their copy-start (by a
    few ms in the corpus); such a span is shortened to start at the nearest copy-start of the
    same instruction and module run, keeping its end."""
    issued: dict[tuple[str, object, str], list[int]] = {}
    for ev in events:
        if not ev.transfer:
            issued.setdefault((ev.module_key, ev.exec_key, ev.name), []).append(ev.start_ps)
    for starts in issued.values():
        starts.sort()
    for ev in transfers:
        starts = issued.get((ev.module_key, ev.exec_key, ev.name))
        if not starts:
            continue
        k = bisect.bisect_left(starts, ev.start_ps)
        nearest = min(starts[max(0, k - 1):k + 1], key=lambda s: abs(s - ev.start_ps))
        if nearest > ev.start_ps:
            end = ev.start_ps + ev.dur_ps
            ev.start_ps = nearest
            ev.dur_ps = max(0, end - nearest)


def _tpu_event(view: PlaneView, mid: int, start: int, dur: int, lane: str, transfer: bool) -> DeviceEvent:
    md = view.plane.event_metadata[mid]
    meta = view.metadata_stats(mid)
    text = md.name if md.name.startswith("%") else None
    name = md.name
    if text is not None:  # "%name = ..." -> "name"
        name = text[1:].split(" ", 1)[0]
    return DeviceEvent(
        name=name, module_key="", start_ps=start, dur_ps=dur, lane=lane, exec_key=None, text=text,
        flops=_int(meta.get("flops")), bytes_accessed=_int(meta.get("bytes_accessed")),
        category=str(meta.get("hlo_category")) if "hlo_category" in meta else None,
        transfer=transfer,
    )


def _module_spans(view: PlaneView) -> list[tuple[int, int, str]]:
    """(start, end, module key) of every module run on the ``XLA Modules`` line, by start."""
    line = view.line("XLA Modules")
    if line is None:
        return []
    spans = [(start, start + dur, view.event_name(mid)) for mid, start, dur, _ in view.events(line)]
    spans.sort()
    return spans


def _gpu_device(view: PlaneView, ordinal: int) -> Device:
    dev = Device("gpu", ordinal, view.name, SESSION_CLOCK)
    ids = _wanted(view, ("hlo_op", "hlo_module", "program_id", "correlation_id"))
    module_key = _ModuleKeys()
    for line in view.lines():
        sm = _STREAM_RE.search(line.name)
        lane = f"stream:{ordinal}:{sm.group(1) if sm else line.name}"
        copy = _copy_direction(line.name)
        for mid, start, dur, stats in view.events(line):
            values = view.pick(stats, ids)
            op = values.get("hlo_op")
            name = view.event_name(mid)
            dev.events.append(DeviceEvent(
                name=str(op) if op else name,
                module_key=module_key(values.get("hlo_module"), values.get("program_id")) if op else "",
                start_ps=start, dur_ps=dur, lane=lane, exec_key=None,
                copy=copy or _copy_direction(name), correlation=_int(values.get("correlation_id"))))
    _number_runs(dev.events)
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
    few, so they share the string too (memory) and the formatting is done once (time)."""

    def __call__(self, name: object, program_id: object) -> str:
        key = (name, program_id)
        text = self.get(key)
        if text is None:
            text = self[key] = _module_key(name, program_id)
        return text


def _wanted(view: PlaneView, names: tuple[str, ...]) -> dict[int, str]:
    """Stat metadata id -> name for the stats of ``names`` this plane has (resolved once)."""
    return {view.stat_ids[n]: n for n in names if n in view.stat_ids}


def _number_runs(events: list[DeviceEvent]) -> None:
    """GPU kernels carry no run id: a module's run ends when one of its instructions repeats.

    Several kernels of one instruction (a convolution and its helpers) are consecutive, so a
    repeat only counts after another instruction of the module was seen in between."""
    events.sort(key=lambda e: e.start_ps)
    state: dict[str, tuple[int, set[str], str]] = {}
    for ev in events:
        if not ev.module_key:
            continue
        run, seen, last = state.get(ev.module_key, (0, set(), ""))
        if ev.name in seen and ev.name != last:
            run, seen = run + 1, set()
        seen.add(ev.name)
        state[ev.module_key] = (run, seen, ev.name)
        ev.exec_key = run


def _cpu_devices(view: PlaneView) -> list[Device]:
    ids = _wanted(view, ("hlo_op", "hlo_module", "program_id", "run_id", "device_ordinal"))
    if "hlo_op" not in view.stat_ids:
        return []
    by_ordinal: dict[int, Device] = {}
    module_key = _ModuleKeys()
    lanes: dict[int, str] = {}
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
                lanes[ordinal] = f"cpu:{ordinal}"
            dev.events.append(DeviceEvent(
                name=str(op), module_key=module_key(values.get("hlo_module"), values.get("program_id")),
                start_ps=start, dur_ps=dur, lane=lanes[ordinal], exec_key=values.get("run_id")))
    return list(by_ordinal.values())
