"""Kineto (Chrome-trace JSON) reader for the PyTorch linker.

Reads ``.json`` / ``.json.gz`` once with orjson and keeps only what linking needs: host
ranges (``cpu_op``, ``user_annotation``), runtime calls (``cuda_runtime``, ``cuda_driver``:
launches and synchronisation), device activity (``kernel``, ``gpu_memcpy``, ``gpu_memset``),
device-side ``cuda_sync`` records, and the ``ac2g`` flow ends (a fallback link from a device
op to its launch when ``correlation`` is missing). Everything else (python_function, flows
for fwd/bwd, counters, metadata) is dropped without building an object for it.

Time: ``ts`` / ``dur`` are microseconds with three decimals. Each is turned into integer
nanoseconds at once (``round(x * 1000)``; ints are scaled exactly) and, when the file has
``baseTimeNanoseconds``, shifted by it, so no float survives the reader. The clock is named
``kineto:baseTimeNanoseconds`` (relative timestamps made absolute) or ``kineto:epoch-us``
(older files whose ``ts`` already is absolute).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from chakra_hooks.errors import TraceFormatError
from chakra_hooks.linker.jsonio import load_json

HOST_CATS = frozenset(("cpu_op", "user_annotation"))
RUNTIME_CATS = frozenset(("cuda_runtime", "cuda_driver"))
DEVICE_CATS = frozenset(("kernel", "gpu_memcpy", "gpu_memset"))


class KEvent:
    """One kept Kineto event. Times in integer ns on the trace's clock.

    ``parent`` (host ranges: the enclosing range on the same thread), ``op`` (uid of the
    linked-trace op this range became, -1 if none) and ``et`` (the matched host ET node) are
    filled in by the linker.
    """

    __slots__ = ("name", "cat", "pid", "tid", "start", "dur", "args", "parent", "op", "et")

    def __init__(self, name: str, cat: str, pid: object, tid: object, start: int, dur: int,
                 args: dict) -> None:
        self.name = name
        self.cat = cat
        self.pid = pid
        self.tid = tid
        self.start = start
        self.dur = dur
        self.args = args
        self.parent: KEvent | None = None
        self.op = -1
        self.et = None

    @property
    def end(self) -> int:
        return self.start + self.dur

    def __repr__(self) -> str:  # for test failure messages
        return f"KEvent({self.cat}:{self.name!r} tid={self.tid} start={self.start})"


@dataclass(slots=True)
class KinetoTrace:
    """The kept content of one Kineto file."""

    path: Path
    clock: str
    base_ns: int  # 0 when timestamps are absolute
    raw_bytes: int
    distributed: dict = field(default_factory=dict)
    host: list[KEvent] = field(default_factory=list)  # cpu_op + user_annotation
    runtime: list[KEvent] = field(default_factory=list)  # cuda_runtime / cuda_driver
    device: list[KEvent] = field(default_factory=list)  # kernel / gpu_memcpy / gpu_memset
    syncs: list[KEvent] = field(default_factory=list)  # device-side cuda_sync records
    flow_ends: dict[tuple, int] = field(default_factory=dict)  # (pid, tid, ts ns) -> ac2g id
    pids: set = field(default_factory=set)  # host process ids seen on host ranges
    events_total: int = 0

    @property
    def rank(self) -> int | None:
        rank = self.distributed.get("rank")
        return rank if isinstance(rank, int) else None

    @property
    def world_size(self) -> int | None:
        size = self.distributed.get("world_size")
        return size if isinstance(size, int) else None


def _ns(value: object) -> int:
    """Microseconds (int, or float with 3 decimals) -> integer ns, exactly where possible."""
    if type(value) is int:
        return value * 1000
    return round(value * 1000)  # type: ignore[operator]


def read_kineto(path: Path) -> KinetoTrace:
    """Read a Kineto trace; raises TraceFormatError for anything that is not one."""
    path = Path(path)
    doc, raw_bytes = load_json(path)
    if isinstance(doc, list):  # the Chrome trace "array" form
        doc = {"traceEvents": doc}
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise TraceFormatError(path, "top level", "a Kineto trace object with a 'traceEvents' list")
    base = doc.get("baseTimeNanoseconds")
    base_ns = base if isinstance(base, int) else 0
    clock = "kineto:baseTimeNanoseconds" if base_ns else "kineto:epoch-us"
    dist = doc.get("distributedInfo")
    trace = KinetoTrace(path, clock, base_ns, raw_bytes, dist if isinstance(dist, dict) else {})
    _read_events(trace, doc["traceEvents"])
    if not (trace.host or trace.device or trace.runtime):
        raise TraceFormatError(path, "traceEvents", "at least one cpu_op, runtime or device event "
                               "(the trace is empty)")
    return trace


def _read_events(trace: KinetoTrace, events: list) -> None:
    """Sort the events into the kept lists; the hot loop of the reader."""
    host, runtime, device, syncs = trace.host, trace.runtime, trace.device, trace.syncs
    flow_ends, pids = trace.flow_ends, trace.pids
    base = trace.base_ns
    host_cats, runtime_cats, device_cats = HOST_CATS, RUNTIME_CATS, DEVICE_CATS
    path = trace.path
    for index, ev in enumerate(events):
        try:
            ph = ev.get("ph")
            if ph == "X":
                cat = ev.get("cat")
                if cat in host_cats:
                    out = host
                    pids.add(ev["pid"])
                elif cat in runtime_cats:
                    out = runtime
                elif cat in device_cats:
                    out = device
                elif cat == "cuda_sync":
                    out = syncs
                else:
                    continue
                dur = ev.get("dur", 0)
                out.append(KEvent(ev["name"], cat, ev["pid"], ev["tid"], base + _ns(ev["ts"]),
                                  _ns(dur) if dur else 0, ev.get("args") or {}))
            elif ph == "f" and ev.get("cat") == "ac2g":
                flow_ends[(ev["pid"], ev["tid"], base + _ns(ev["ts"]))] = ev["id"]
        except (KeyError, TypeError, AttributeError) as exc:
            raise TraceFormatError(path, f"traceEvents[{index}]",
                                   f"an event object with name, pid, tid and numeric ts ({exc!r})"
                                   ) from exc
    trace.events_total = len(events)
