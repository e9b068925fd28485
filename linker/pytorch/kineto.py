"""Kineto (Chrome-trace JSON) reader for the PyTorch linker.

Reads ``.json`` / ``.json.gz`` once. ``traceEvents`` is decoded CHUNK events at a time into
typed structs, so that dropped events and the floats and strings of kept ones never all exist
at once. The chunks are cut by byte offset where one event ends and the next begins; every cut
is proved by the chunk decoding as a JSON array, and the array by the rest of the document
decoding with a marker in its place (see :func:`_cut_events`). A file those checks do not
prove is split by msgspec (``list[msgspec.Raw]``), which costs a second scan of every byte.

``args`` is kept as raw JSON while an event is decoded and decoded afterwards for kept events
only, a chunk's worth per call: into :class:`CommonArgs` (the keys every event may need), or
into all of :class:`KArgs` for device events, ``cuda_sync`` records and collective host
ranges. Only what linking needs is kept: host ranges (``cpu_op``, ``user_annotation``),
runtime calls (``cuda_runtime``, ``cuda_driver``: launches and synchronisation), device
activity (``kernel``, ``gpu_memcpy``, ``gpu_memset``), device-side ``cuda_sync`` records, and
the ``ac2g`` flow ends (a fallback link from a device op to its launch when ``correlation`` is
missing). Everything else (python_function, flows for fwd/bwd, counters, metadata) is dropped
after decoding.

Time: ``ts`` / ``dur`` are microseconds with three decimals. Each is turned into integer
nanoseconds at once (``round(x * 1000)``; ints are scaled exactly) and, when the file has
``baseTimeNanoseconds``, shifted by it, so no float survives the reader. The clock is named
``kineto:baseTimeNanoseconds`` (relative timestamps made absolute) or ``kineto:epoch-us``
(older files whose ``ts`` already is absolute).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from mmap import PAGESIZE
from pathlib import Path
from sys import intern
from typing import Union

import msgspec

try:  # read by Cython when it compiles this module (setup.py): see _ns
    import cython
except ImportError:  # run as plain Python without Cython installed
    from chakra_hooks.common.no_cython import cython

from chakra_hooks.common.errors import TraceFormatError, json_kind
from chakra_hooks.linker.jsonio import (Buffer, bracketed, decode, json_array, map_bytes,
                                        release_pages)
from chakra_hooks.linker.pytorch.kineto_events import (NO_ARGS, CommonArgs, KArgs, KEvent,
                                                       KEventAnyPhase)

HOST_CATS = frozenset(("cpu_op", "user_annotation"))
RUNTIME_CATS = frozenset(("cuda_runtime", "cuda_driver"))
DEVICE_CATS = frozenset(("kernel", "gpu_memcpy", "gpu_memset"))


# Host ranges whose args the comm rules read (pytorch/comms.py: record_param_comms metadata,
# c10d op input dims and types, nccl:* annotations).
_FULL_HOST_NAMES = frozenset(("record_param_comms",))
_FULL_HOST_PREFIXES = ("c10d::", "nccl:")


def wants_full_args(cat: str, name: str) -> bool:
    """Whether a kept event gets all of KArgs (else CommonArgs)."""
    if cat in DEVICE_CATS or cat == "cuda_sync":
        return True
    return cat in HOST_CATS and (name in _FULL_HOST_NAMES or name.startswith(_FULL_HOST_PREFIXES))


class _KinetoDoc(msgspec.Struct):
    # The events as raw slices: how msgspec splits the array (see _split_events).
    traceEvents: list[msgspec.Raw] | None = None
    baseTimeNanoseconds: object = None
    distributedInfo: object = None


class _KinetoRest(msgspec.Struct):
    # The document with a marker in place of the events array (see _cut_events).
    traceEvents: object = None
    baseTimeNanoseconds: object = None
    distributedInfo: object = None


class _Complete(KEvent, tag_field="ph", tag="X", gc=False):
    """A complete event ("ph": "X"), decoded by its phase: the only phase kept."""


class _Phase(msgspec.Struct, tag_field="ph", gc=False):
    """An event of another phase (a flow, an instant, metadata...): only what the reader
    counts it by, and what every event is checked for (name and category are strings)."""

    name: str = ""
    cat: str = ""


# Every other phase of the Trace Event Format: a chunk with a phase not listed (or an event
# without one) is decoded again as KEventAnyPhase, each event with all its fields.
_OTHER_PHASES = ("B", "E", "i", "I", "C", "b", "n", "e", "s", "t", "f", "P", "N", "O", "D",
                 "M", "V", "v", "R", "c", "(", ")")
_PHASE_OF = {type(f"_Phase_{i}", (_Phase,), {}, tag=ph): ph for i, ph in enumerate(_OTHER_PHASES)}
CHUNK = 1024  # events per decoder call when msgspec splits the array
CHUNK_BYTES = 1 << 18  # about CHUNK events of a typical file, when the reader cuts it
_DECODER = msgspec.json.Decoder(_KinetoDoc)
_REST_DECODER = msgspec.json.Decoder(_KinetoRest)
# Events by their phase: the events of other phases (a third of a trace: flows) become small
# structs, not KEvents (~a fifth of the decoding, and their freeing).
_EVENTS_DECODER = msgspec.json.Decoder(list[Union[(_Complete, *_PHASE_OF)]])  # type: ignore[misc]
_ANY_PHASE_DECODER = msgspec.json.Decoder(list[KEventAnyPhase])
_COMMON_ARGS = msgspec.json.Decoder(list[Union[CommonArgs, None]])
_FULL_ARGS = msgspec.json.Decoder(list[Union[KArgs, None]])
_WHERE = re.compile(r"\$\[(\d+)\]")  # the failing element in a msgspec error: `$[12]`
_EVENTS_START = re.compile(rb'"traceEvents"\s*:\s*(\[)\s*')
_BETWEEN_EVENTS = re.compile(rb"\}\s*,\s*(?=\{)")
_BLANK = frozenset(b" \t\r\n")
_END_TRIES = 10_000
_ROUND_LIMIT = float(1 << 62)  # |ns| below this: _ns_at rounds on C integers
# Times beyond this are damage, not clocks (2^62 ns is the year 2116; the ET writes int64 ns).
_TIME_LIMIT_NS = 1 << 62
_DAY_NS = 86_400 * 10**9
# The compiled reader's cache of interned event names, per chunk of events: a new name string
# found there by its size, three of its words and one comparison (_slot_of, _same_text), where
# looking it up in a dict hashed every byte of it (kernel names run to hundreds of bytes).
_NAME_SLOTS = 4096  # a power of two
# The events array's stand-in when the rest of the document is checked: a value no trace has.
_MARK = b'"\\u0000chakra-hooks: traceEvents"'
_MARK_VALUE = msgspec.json.decode(_MARK)


class _NotProved(Exception):
    """A chunk of a cut array did not decode: the file is split by msgspec instead."""


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
    unknown_dur: list[KEvent] = field(default_factory=list)  # kept events the file gave no dur
    duplicates: int = 0  # exact repeats of kept events, dropped (see drop_duplicates)
    out_of_range: list = field(default_factory=list)  # kept events far from the rest, dropped
    # (category, phase) -> events of a kept category that are not complete events ("X"): not
    # read (a begin / end pair, an instant, no phase at all), counted for a warning
    other_phases: dict = field(default_factory=dict)
    ids: dict = field(default_factory=dict)  # reading: pid / tid values -> one shared object
    names: dict = field(default_factory=dict)  # reading: event name -> the interned name
    _full_names: dict = field(default_factory=dict)  # reading: category -> wants_full_args cache

    def kept_by_cat(self) -> dict[str, tuple[list[KEvent], str, dict | None]]:
        """Category -> (the list its events are kept in, the one shared category string,
        a name -> wants_full_args cache, or None if no event of it needs its full args)."""
        out: dict[str, tuple[list[KEvent], str, dict | None]] = {}
        for cats, kept in ((HOST_CATS, self.host), (RUNTIME_CATS, self.runtime),
                           (DEVICE_CATS, self.device), (("cuda_sync",), self.syncs)):
            for cat in cats:
                out[cat] = (kept, cat, self._full_names.setdefault(cat, {}))
        for cat in RUNTIME_CATS:
            out[cat] = (self.runtime, cat, None)
        return out

    def starts_in_the_future(self) -> int | None:
        """The first kept event's start (ns since the epoch) if it lies more than a day after
        now: a wrong ``baseTimeNanoseconds`` or recording clock moved every time (one event
        per list is enough, the whole clock moved)."""
        firsts = [kept[0].start for kept in (self.host, self.runtime, self.device) if kept]
        first = min(firsts, default=0)
        return first if first > time.time_ns() + _DAY_NS else None

    @property
    def rank(self) -> int | None:
        rank = self.distributed.get("rank")
        return rank if isinstance(rank, int) else None

    @property
    def world_size(self) -> int | None:
        size = self.distributed.get("world_size")
        return size if isinstance(size, int) else None


_TIME_KIND = "microseconds a clock can hold (a number, but this one overflows)"


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _ns(value: object) -> int:
    """Microseconds (int, or float with 3 decimals) -> integer ns: ``round(value * 1000)``.

    The compiled build rounds a float on C numbers (_ns_at, half to even, as ``round``),
    where the builtin ``round`` was most of this function's cost; plain Python calls
    ``round``, which there costs half of the spelled-out arithmetic.
    """
    if type(value) is int:
        return value * 1000
    if not cython.compiled:
        return round(value * 1000)  # type: ignore[operator]
    whole = _ns_at(value, 0)
    if whole != _SLOW:
        return whole
    number = value  # any other number (TypeError if none), converted to a C double here
    return round(number * 1000)  # type: ignore[operator]


# _ns_at's answer where C integers do not hold the time (or it is no int or float): the
# caller works it out with _ns, on Python integers, as plain Python does.
_SLOW = -(1 << 63)
_INT_LIMIT = 1 << 52  # |int microseconds| below this: times 1000 stays below 2^62


def _slot_of(text: str) -> int:
    """The name cache's place for ``text`` (see _NAME_SLOTS): compiled, from its size and its
    first, middle and last eight bytes (kineto.pxd); two names that share a place only evict
    each other."""
    if cython.compiled:
        return _text_slot(text)
    return hash(text) & (_NAME_SLOTS - 1)


def _same_text(a: str, b: str) -> bool:
    """``a == b`` for two str; compiled, by length, width and one memcmp (kineto.pxd): equal
    strings have the same width (CPython keeps each in its narrowest)."""
    if cython.compiled:
        return _text_equal(a, b)
    return a == b


def _ns_at(value: object, base: int) -> int:
    """``base + _ns(value)`` on C integers, for the compiled build (the per-event loop then
    keeps the times it checks in C, and makes one int object a time instead of two and a
    sum); _SLOW where that does not hold: a value that is neither an int nor a float, or one
    beyond 2^62 ns (``base`` is below 2^62 in magnitude: the caller's check). A float is
    rounded half to even, spelled out, as ``round`` rounds it."""
    if type(value) is int:
        try:
            whole = value  # the compiled build converts it to a C integer here
        except OverflowError:  # beyond 64 bits
            return _SLOW
        if -_INT_LIMIT < whole < _INT_LIMIT:
            return base + whole * 1000
        return _SLOW
    if type(value) is not float:
        return _SLOW
    number = value  # the compiled build converts it to a C double here
    scaled = number * 1000  # type: ignore[operator]
    if not -_ROUND_LIMIT < scaled < _ROUND_LIMIT:  # (NaN too)
        return _SLOW
    whole = int(scaled)  # toward zero (scaled - whole is then exact), then half to even
    rest = scaled - whole
    if rest > 0.5 or (rest == 0.5 and whole % 2):
        whole += 1
    elif rest < -0.5 or (rest == -0.5 and whole % 2):
        whole -= 1
    return base + whole


def _times_in_c(ev: KEvent, base: int, unknown_dur: list[KEvent]) -> bool:
    """Set ``ev``'s start and duration as _read_events does, where _ns_at works both out
    and both pass its checks; False, and ``ev`` untouched, where not (the Python reading
    then gives the same times, or the error)."""
    start = _ns_at(ev.start, base)
    if start == _SLOW or not 0 <= start < _TIME_LIMIT_NS:
        return False
    raw_dur = ev.dur
    dur = 0 if raw_dur is None else _ns_at(raw_dur, 0)
    if dur == _SLOW or not 0 <= dur <= _TIME_LIMIT_NS:
        return False
    ev.start = start
    ev.dur = dur
    if raw_dur is None:  # not measured (see _read_events)
        unknown_dur.append(ev)
    return True


def _check_id(trace: KinetoTrace, index: int, name: str, value: object) -> None:
    """A pid or tid is a number or a name (Kineto writes both); anything else is damage."""
    if not isinstance(value, (int, str)) or isinstance(value, bool):
        raise TraceFormatError(trace.path, f"traceEvents[{index}]",
                               f"{name}: a number or a name, got {json_kind(value)}")


def read_kineto(path: Path) -> KinetoTrace:
    """Read a Kineto trace; raises TraceFormatError for anything that is not one."""
    path = Path(path)
    raw = map_bytes(path)
    cut = _cut_events(raw)
    if cut is not None:
        try:
            return _read_trace(path, len(raw), *cut)
        except _NotProved:
            pass
    return _read_trace(path, len(raw), *_split_events(path, raw))


def _cut_events(raw: Buffer
                ) -> tuple[_KinetoRest, Callable[[bool], Iterator[tuple[int, list[KEvent]]]]] | None:
    """The document without its events, and a source of the events decoded in chunks of about
    CHUNK_BYTES of JSON, cut where one event ends and the next begins (each as the index of
    its first event and the events); None where this cannot be done.

    A cut is sought as text (``}`` ``,`` ``{``) and could fall inside a string or a nested
    value; it is proved when its chunk decodes as a JSON array (a chunk that starts at an
    event and decodes whole ends where an event ends), else reading raises _NotProved. The
    array is proved to be the document's ``traceEvents`` by decoding the rest of the document
    with a marker value in its place.
    """
    start = _EVENTS_START.search(raw)
    if start is None:
        return None
    spans: list[tuple[int, int]] = []
    lo = start.end()
    if raw[lo:lo + 1] == b"]":
        end = lo
    else:
        end, last = _events_end(raw, lo)
        if end < 0:
            return None
        while True:
            between = _BETWEEN_EVENTS.search(raw, lo + CHUNK_BYTES, last)
            if between is None:
                spans.append((lo, last + 1))
                break
            spans.append((lo, between.start() + 1))
            lo = between.end()
    try:
        doc = _REST_DECODER.decode(raw[:start.start(1)] + _MARK + raw[end + 1:])
    except (msgspec.MsgspecError, UnicodeDecodeError):
        return None
    if doc.traceEvents != _MARK_VALUE:
        return None
    view = memoryview(raw)

    def chunks(any_phase: bool = False) -> Iterator[tuple[int, list[KEvent]]]:
        first = done = 0
        for lo, hi in spans:
            try:
                events = _decode_events(bracketed(view[lo:hi]), any_phase)
            except (msgspec.MsgspecError, UnicodeDecodeError):
                raise _NotProved from None
            # The chunk is copied out: a mapped file's pages up to its end leave the process
            # (read again from the file if touched again), so that the file's pages and its
            # events are not all resident at once.
            release_pages(raw, done, hi)
            done = hi - hi % PAGESIZE
            yield first, events
            first += len(events)

    return doc, chunks


def _events_end(raw: Buffer, lo: int) -> tuple[int, int]:
    """Where the events array that starts at ``lo`` ends: (its ``]``, the ``}`` of its last
    event), or (-1, -1). Sought from the end of the file, where the array ends in every
    trace seen (a few short keys follow it); the last ``}`` then ``]`` is the candidate. The
    search gives up after _END_TRIES brackets (a truncated file could otherwise be walked
    bracket by bracket to its start)."""
    at, blank = len(raw), _BLANK
    for _ in range(_END_TRIES):
        at = raw.rfind(b"]", lo, at)
        if at < 0:
            break
        last = at - 1
        while last > lo and raw[last] in blank:
            last -= 1
        if raw[last] == 0x7D:  # "}"
            return at, last
    return -1, -1


def _split_events(path: Path, raw: Buffer
                  ) -> tuple[_KinetoDoc, Callable[[bool], Iterator[tuple[int, list[KEvent]]]]]:
    """The document, and a source of its events split by msgspec and decoded CHUNK at a time
    (one decoder call per chunk: a call per event cost more than the decoding itself)."""
    doc = decode(path, raw, _DECODER, list[msgspec.Raw])
    if isinstance(doc, list):  # the Chrome trace "array" form
        doc = _KinetoDoc(doc)
    events = doc.traceEvents
    if events is None:
        raise TraceFormatError(path, "top level", "a Kineto trace object with a 'traceEvents' list")

    def chunks(any_phase: bool = False) -> Iterator[tuple[int, list[KEvent]]]:
        for lo in range(0, len(events), CHUNK):
            try:
                yield lo, _decode_events(json_array(events[lo:lo + CHUNK]), any_phase)
            except msgspec.ValidationError as exc:
                # A typed field of one event is wrong: name the event.
                raise TraceFormatError(path, _where(exc, lo), "an event with name, pid, tid, "
                                       f"numeric ts / dur ({exc})") from exc
            except (UnicodeDecodeError, msgspec.DecodeError) as exc:
                # The split proved the JSON's structure and escapes, not its strings' bytes
                # (msgspec checks those as it decodes them): a byte that is not UTF-8.
                raise TraceFormatError(path, f"traceEvents[{lo}..{lo + CHUNK - 1}]",
                                       f"UTF-8 text ({exc}: a byte in these events is not; the "
                                       "file is damaged)") from exc

    return doc, chunks


def _decode_events(array: bytes, any_phase: bool) -> list:
    """A chunk's events (``array``: a JSON array of them) by their phase (complete events as
    KEvents, the others as small structs); or, with ``any_phase`` or where that fails (a phase
    not listed, or a field of the wrong type), each as a KEventAnyPhase, as every event was
    read before phases were told apart: the same checks, the same errors."""
    if not any_phase:
        try:
            return _EVENTS_DECODER.decode(array)
        except msgspec.ValidationError:
            pass
    return _ANY_PHASE_DECODER.decode(array)


def _failed_index(exc: msgspec.ValidationError) -> int | None:
    """Which element of a decoded array a msgspec error is about (None if it does not say)."""
    found = _WHERE.search(str(exc))
    return int(found.group(1)) if found else None


def _where(exc: msgspec.ValidationError, first: int) -> str:
    index = _failed_index(exc)
    return "traceEvents" if index is None else f"traceEvents[{first + index}]"


def _read_trace(path: Path, raw_bytes: int, doc: _KinetoDoc | _KinetoRest,
                chunks: Callable[[bool], Iterator[tuple[int, list[KEvent]]]]) -> KinetoTrace:
    base = doc.baseTimeNanoseconds
    if base is not None and type(base) is not int:  # ignored, it shifted nothing: say so
        raise TraceFormatError(path, "baseTimeNanoseconds",
                               f"an integer (ns since the epoch), got {json_kind(base)}")
    base_ns = base if type(base) is int else 0
    clock = "kineto:baseTimeNanoseconds" if base_ns else "kineto:epoch-us"
    dist = doc.distributedInfo
    trace = KinetoTrace(path, clock, base_ns, raw_bytes, dist if isinstance(dist, dict) else {})
    uncorrelated = total = 0
    for first, events in chunks():
        uncorrelated += _read_events(trace, events, first)
        total = first + len(events)
    if uncorrelated:  # only then are the ac2g flow ends worth indexing
        _index_flow_ends(trace, chunks)
    trace.events_total = total
    drop_duplicates(trace)
    drop_out_of_range(trace)
    if not (trace.host or trace.device or trace.runtime):
        raise TraceFormatError(path, "traceEvents", "at least one cpu_op, runtime or device event "
                               "(the trace is empty)")
    return trace


def _read_events(trace: KinetoTrace, events: list[KEvent], first: int) -> int:
    """Keep what linking needs from decoded events (``events[i]`` is event ``first + i`` of
    the file), set integer times and decode kept events' args; the hot loop. Returns how many
    device events have no correlation.

    Memory matters here (a 1 GB trace has millions of events): the float ``ts`` / ``dur``
    are replaced once converted, and repeated names, categories and thread ids share one
    object.
    """
    pids = trace.pids
    base = trace.base_ns
    out_of = trace.kept_by_cat()
    host, device = trace.host, trace.device
    devices_before = len(device)
    ids, names = trace.ids, trace.names
    unknown_dur = trace.unknown_dur
    raw_type = msgspec.Raw
    # kept events whose args are decoded afterwards (one decoder call for all of a kind: a
    # call each cost more than decoding), as CommonArgs or as all of KArgs
    common_events: list[KEvent] = []
    common_raws: list[msgspec.Raw] = []
    full_events: list[KEvent] = []
    full_raws: list[msgspec.Raw] = []
    complete, any_phase, phase_of = _Complete, KEventAnyPhase, _PHASE_OF
    last_pid = last_tid = last_host_pid = None  # the shared pid and tid objects last set
    reuse_ids = cython.compiled
    # The compiled build works the times out on C integers (_ns_at) where they fit, and
    # falls back to the Python reading below where they do not (or are damaged).
    c_times = cython.compiled and -_TIME_LIMIT_NS < base < _TIME_LIMIT_NS
    c_base = base if c_times else 0
    # (compiled: the name cache, and the category of the last kept or dropped event with what
    # out_of gave for it, found again by one comparison: events come in runs of a category)
    cached = [None] * _NAME_SLOTS if cython.compiled else None
    last_cat = last_found = None
    for index, item in enumerate(events, first):
        kind = type(item)
        if kind is not complete:
            phase = item.ph if kind is any_phase else phase_of[kind]
            if phase != "X":
                if item.cat in out_of:  # an op or kernel not written as a complete event: said
                    key = (item.cat, phase)
                    trace.other_phases[key] = trace.other_phases.get(key, 0) + 1
                continue
        ev = item
        if cached is None:
            found = out_of.get(ev.cat)
        elif last_cat is not None and _same_text(ev.cat, last_cat):
            found = last_found
        else:
            found = last_found = out_of.get(ev.cat)
            last_cat = ev.cat
        if found is None:
            continue
        out, cat, full_names = found
        ev.cat = cat  # one shared string per category, not one per event
        if not (c_times and _times_in_c(ev, c_base, unknown_dur)):
            field = "ts"
            try:
                start = ev.start = base + _ns(ev.start)
                field = "dur"
                dur = ev.dur
                if dur is None:  # not measured: kept as 0 for ordering, written duration_unknown
                    dur = ev.dur = 0
                    unknown_dur.append(ev)
                else:
                    dur = ev.dur = _ns(dur)
            except (TypeError, ValueError, OverflowError) as exc:
                got = ev.start if field == "ts" else ev.dur
                raise TraceFormatError(trace.path, f"traceEvents[{index}]",
                                       f"{field}: {_TIME_KIND if _is_number(got) else 'a number'}"
                                       f", got {json_kind(got)}") from exc
            if dur < 0 or not 0 <= start < _TIME_LIMIT_NS or dur > _TIME_LIMIT_NS:
                # A time before 1970 on Kineto's epoch clock (with baseTimeNanoseconds added)
                # is damage too, and a Chakra start time cannot hold it.
                name = ev.name if len(ev.name) <= 80 else ev.name[:77] + "..."
                raise TraceFormatError(trace.path, f"traceEvents[{index}] ({name!r})",
                                       f"ts (plus baseTimeNanoseconds) from 0 to 2^62 ns and "
                                       f"dur >= 0 (ts {ev.start} ns, dur {ev.dur} ns)")
        name = ev.name
        if ev.tid is None or not name:
            raise TraceFormatError(trace.path, f"traceEvents[{index}]",
                                   "an event with name, pid and tid")
        if cached is None:
            interned = names.get(name)  # (a dict hit costs a sixth of a call to intern)
            if interned is None:
                interned = names[name] = intern(name)
        else:
            slot = _slot_of(name)
            interned = cached[slot]
            if interned is None or not _same_text(name, interned):
                interned = names.get(name)
                if interned is None:
                    interned = names[name] = intern(name)
                cached[slot] = interned
        name = ev.name = interned
        args = ev.args
        if type(args) is raw_type:
            is_full = False
            if full_names is not None:  # None: this category never needs its full args
                is_full = full_names.get(name)
                if is_full is None:
                    is_full = full_names[name] = wants_full_args(cat, name)
            if is_full:
                full_events.append(ev)
                full_raws.append(args)
            else:
                common_events.append(ev)
                common_raws.append(args)
        pid = ev.pid
        tid = ev.tid
        if type(pid) is not int or type(tid) is not int:
            _check_id(trace, index, "pid", pid)
            _check_id(trace, index, "tid", tid)
        if reuse_ids:
            # Runs of events share their pid and tid: the one object for the last of each is
            # reused without a dict lookup (an int comparison costs a fifth of setdefault's,
            # compiled; in plain Python, the comparisons cost more than the calls).
            if type(pid) is int and type(last_pid) is int and pid == last_pid:
                pid = last_pid
            else:
                pid = last_pid = ids.setdefault(pid, pid)
            if type(tid) is int and type(last_tid) is int and tid == last_tid:
                tid = last_tid
            else:
                tid = last_tid = ids.setdefault(tid, tid)
            if out is host and pid is not last_host_pid:
                pids.add(pid)
                last_host_pid = pid
            ev.pid = pid
            ev.tid = tid
        else:
            if out is host:
                pids.add(pid)
            ev.pid = ids.setdefault(pid, pid)
            ev.tid = ids.setdefault(tid, tid)
        out.append(ev)
    if common_raws:
        _set_args(trace, events, first, common_events, common_raws, _COMMON_ARGS)
    if full_raws:
        _set_args(trace, events, first, full_events, full_raws, _FULL_ARGS)
    uncorrelated = 0
    for ev in device[devices_before:]:
        if ev.args.correlation is None:
            uncorrelated += 1
    return uncorrelated


def drop_out_of_range(trace: KinetoTrace) -> None:
    """Drop kept events whose time cannot belong to the trace: a start more than a day from
    the median start of the kept events, or a duration over a day. A profile spans seconds to
    minutes; one kernel at ts 0 (53 years early) made a gap of decades, one cpu_op of 12 days
    swallowed the 7,325 later ops of its thread. Kept in ``out_of_range`` for the linker's
    warning and the metadata."""
    lists = (trace.host, trace.runtime, trace.device, trace.syncs)
    sample = []
    for kept in lists:  # loops, not a generator: the compiled build types ``ev`` (kineto.pxd)
        for ev in kept[::997] or kept[:1]:
            sample.append(ev.start)
    sample.sort()
    if not sample:
        return
    middle = sample[len(sample) // 2]
    lo, hi = middle - _DAY_NS, middle + _DAY_NS
    for kept in lists:
        bad = []
        for ev in kept:
            if not lo <= ev.start <= hi or ev.dur > _DAY_NS:
                bad.append(ev)
        if bad:
            trace.out_of_range.extend(bad)
            dropped = set(map(id, bad))
            kept[:] = [ev for ev in kept if id(ev) not in dropped]


def drop_duplicates(trace: KinetoTrace) -> None:
    """Drop exact repeats of kept events (a trace written or merged twice): a repeated kernel
    would be a second node of work that never ran. An exact repeat has the same name,
    category, process, thread, start, duration and ids (correlation, External id, Record
    function id) as an earlier event; the count is kept for the linker's warning."""
    for kept in (trace.host, trace.runtime, trace.device, trace.syncs):
        # Only events that share their start with another can repeat one: the whole key is
        # built for those alone (usually none).
        starts: set[int] = set()
        shared: set[int] = set()
        for ev in kept:
            start = ev.start
            if start in starts:
                shared.add(start)
            else:
                starts.add(start)
        if not shared:
            continue
        seen = set()
        unique = []
        for ev in kept:
            if ev.start not in shared:
                unique.append(ev)
                continue
            args = ev.args
            key = (ev.name, ev.cat, ev.pid, ev.tid, ev.start, ev.dur, args.correlation,
                   args.external_id, args.record_function_id)
            try:
                repeated = key in seen
            except TypeError:  # an id of an odd type (a list, say): not compared, kept
                unique.append(ev)
                continue
            if not repeated:
                seen.add(key)
                unique.append(ev)
        if len(unique) != len(kept):
            trace.duplicates += len(kept) - len(unique)
            kept[:] = unique


def _set_args(trace: KinetoTrace, events: list[KEvent], first: int, kept: list[KEvent],
              raws: list[msgspec.Raw], decoder: msgspec.json.Decoder) -> None:
    """Decode the raw ``args`` of ``kept`` (events of ``events``), one decoder call for all."""
    try:
        decoded = decoder.decode(json_array(raws))
    except msgspec.ValidationError as exc:
        index = _failed_index(exc)
        where = "traceEvents"
        if index is not None:  # kept[index] is an event of this chunk: name it by its place
            where = f"traceEvents[{first + _place(events, kept[index])}]"
        raise TraceFormatError(trace.path, where, f"'args' an object or null ({exc})") from exc
    except (UnicodeDecodeError, msgspec.DecodeError) as exc:  # a string's bytes (see chunks)
        raise TraceFormatError(trace.path, f"traceEvents[{first}..{first + len(events) - 1}].args",
                               f"UTF-8 text ({exc}: a byte in these events' args is not; the "
                               "file is damaged)") from exc
    no_args = NO_ARGS
    for ev, args in zip(kept, decoded):
        ev.args = args or no_args


def _place(events: list[KEvent], event: KEvent) -> int:
    """The index of ``event`` (the object itself) in ``events``."""
    for index, candidate in enumerate(events):
        if candidate is event:
            return index
    raise ValueError("event not in events")


def _index_flow_ends(trace: KinetoTrace,
                     chunks: Callable[[bool], Iterator[tuple[int, list[KEvent]]]]) -> None:
    base, flow_ends = trace.base_ns, trace.flow_ends
    for _, events in chunks(True):
        for ev in events:
            ts = ev.start
            if ev.ph == "f" and ev.cat == "ac2g" and isinstance(ts, (int, float)):
                flow_ends[(ev.pid, ev.tid, base + _ns(ts))] = ev.id
