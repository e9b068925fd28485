"""Kineto reader: real corpus files, integer clocks, and bad input."""

from __future__ import annotations

import gzip
from collections import Counter
from pathlib import Path

import pytest

from chakra_hooks.common.errors import TraceFormatError
from chakra_hooks.linker.pytorch.kineto import _ns, read_kineto


@pytest.fixture(scope="module")
def resnet(corpus: Path):
    return read_kineto(corpus / "pytorch/a100_resnet_nccl/kineto.json.gz")


def test_resnet_device_events_and_kernel_time(resnet) -> None:
    cats = Counter(ev.cat for ev in resnet.device)
    assert cats == {"kernel": 2700, "gpu_memcpy": 960, "gpu_memset": 114}
    kernel_ns = sum(ev.dur for ev in resnet.device if ev.cat == "kernel")
    # 162,532.3 us summed from the file's 3-decimal microseconds, kept exactly in ns.
    assert kernel_ns == 162_532_340
    assert len(resnet.runtime) == 8740
    assert Counter(ev.cat for ev in resnet.host)["cpu_op"] == 14346


def test_relative_timestamps_become_absolute_integer_ns(resnet) -> None:
    assert resnet.clock == "kineto:baseTimeNanoseconds"
    assert resnet.base_ns == 1711964646000000000
    first = min(resnet.device, key=lambda e: e.start)
    assert type(first.start) is int and type(first.dur) is int
    assert first.start > resnet.base_ns
    assert all(type(ev.start) is int for ev in resnet.host)
    assert resnet.rank == 0 and resnet.world_size == 2


def test_absolute_epoch_timestamps(corpus: Path) -> None:
    trace = read_kineto(corpus / "pytorch/a100_simple_add/kineto.json.gz")
    assert trace.clock == "kineto:epoch-us" and trace.base_ns == 0
    kernels = [ev for ev in trace.device if ev.cat == "kernel"]
    assert len(kernels) == 4
    # 2023-07-14 in ns since the epoch.
    assert all(1_689_000_000 * 10**9 < ev.start < 1_690_000_000 * 10**9 for ev in kernels)


def test_three_decimals_round_not_truncate(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_text('{"baseTimeNanoseconds": 1000, "traceEvents": ['
                    '{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, '
                    '"ts": 0.29, "dur": 1.001, "args": {"correlation": 1}}]}')
    ev = read_kineto(path).device[0]
    # 0.29 * 1000 is 289.99999999999997 in floats: truncation would give 289.
    assert (ev.start, ev.dur) == (1290, 1001)


def test_time_conversion_is_round_of_microseconds_times_1000() -> None:
    # The compiled build's _ns spells out round-half-to-even (on C numbers): it must
    # give what round() gives for every float, ties, negatives and huge values included.
    import random

    rng = random.Random(7)
    floats = [0.0, -0.0, 0.0005, 0.0015, 0.0025, -0.0005, -0.0015, 2.5e-3, 0.29, 1.001,
              1711964646123.456, -1711964646123.456, 4.6e15, 4.7e15, 9.3e15, 1e300, -1e300,
              2.0 ** 52, 2.0 ** 53 + 2, (2.0 ** 62) / 1000, -(2.0 ** 62) / 1000]
    floats += [rng.uniform(-1e7, 1e7) for _ in range(20000)]
    floats += [round(rng.uniform(-1e6, 1e6), 3) for _ in range(20000)]
    floats += [rng.randrange(-10**9, 10**9) / 2000 for _ in range(20000)]  # exact half-ns ties
    for value in floats:
        assert _ns(value) == round(value * 1000), value
    assert _ns(True) == 1000 and _ns(123) == 123_000 and type(_ns(1.5)) is int
    # Not numbers, or not finite: an error the reader turns into the event's (not a value).
    for bad in ("12", None, [1], float("nan"), float("inf")):
        with pytest.raises((TypeError, ValueError, OverflowError)):
            _ns(bad)


def _kernel_times_read(tmp_path: Path, pairs: list, base) -> list:
    """(start, dur) of each (ts, dur) kernel event read back (dur None: no dur in the file)."""
    import json

    events = []
    for i, (ts, dur) in enumerate(pairs):
        event = {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": ts,
                 "args": {"correlation": i}}
        if dur is not None:
            event["dur"] = dur
        events.append(event)
    doc = {"traceEvents": events}
    if base is not None:
        doc["baseTimeNanoseconds"] = base
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    trace = read_kineto(path)
    assert all(type(ev.start) is int and type(ev.dur) is int for ev in trace.device)
    unknown = {ev.args.correlation for ev in trace.unknown_dur}
    assert unknown == {i for i, (_, dur) in enumerate(pairs) if dur is None}
    return [(ev.start, ev.dur) for ev in sorted(trace.device, key=lambda ev: ev.args.correlation)]


@pytest.mark.parametrize("base", [None, 1000, 1711964646000000000, (1 << 62) - 10**15])
def test_event_times_are_base_plus_round_of_microseconds(tmp_path: Path, base) -> None:
    # The compiled reader works most times out on C integers and the rest as plain Python
    # does: every kept event's start and duration must be base + round(ts * 1000) and
    # round(dur * 1000), whichever way each went (ints past 2^52 and times near 2^62 take
    # the Python way; ties, ints and floats within the clock the C way).
    import random

    rng = random.Random(base or 0)
    shift = base or 0
    center = 1_711_964_646_123.456 if base is None else 10**9
    day_us = 86_400 * 10**6
    offsets = [0, 0.0005, 0.0015, 0.0025, 0.29, 1.001, 2.5, True]
    offsets += [rng.uniform(0, day_us / 2) for _ in range(3000)]
    offsets += [round(rng.uniform(0, 1e9), 3) for _ in range(3000)]
    offsets += [rng.randrange(0, 10**9) / 2000 for _ in range(3000)]  # exact half-ns ties
    offsets += [rng.randrange(0, 10**10) for _ in range(1000)]
    pairs = [(center + offset if rng.random() < 0.5 else int(center) + offset,
              rng.choice([None, 0, 1, 0.0005, 3.0015, rng.uniform(0, 1e6), rng.randrange(10**9)]))
             for offset in offsets]
    expected = [(shift + round(ts * 1000), 0 if dur is None else round(dur * 1000))
                for ts, dur in pairs]
    assert _kernel_times_read(tmp_path, pairs, base) == expected
    # One event a file (no other event to be a day away from): times at the clock's edges.
    limit = 1 << 62
    # (Durations stay within a day: a longer one is dropped as damage, drop_out_of_range.)
    for ts, dur in [(2**52 - 1, 1), (2**52, 1), (2**52 + 1, 1.5), (4_555_000_000_000_000, 10**6),
                    (4.55e15, 8.64e10), ((limit - shift - 1) // 1000, 0), (True, True)]:
        start = shift + round(ts * 1000)
        if 0 <= start < limit:
            assert _kernel_times_read(tmp_path, [(ts, dur)], base) == [(start, round(dur * 1000))]


@pytest.mark.parametrize("ts, dur, base", [
    (4.7e15, 1.0, None), (4_700_000_000_000_000, 1, None), (2**70, 1, None), (1.0, -0.5, None),
    (-0.001, 1.0, None), (1.0, 4.7e15, None), (1.0, 2**64, None), (1.0, 1.0, 1 << 62),
    (1.0, 1.0, -(1 << 62) - 5), ("1", 1.0, None), (1.0, "1", None), (1.0, float("nan"), None),
    (float("inf"), 1.0, None)])
def test_times_beyond_the_clock_are_errors_either_way(tmp_path: Path, ts, dur, base) -> None:
    import json

    doc = {"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7,
                            "ts": ts, "dur": dur, "args": {"correlation": 1}}]}
    if base is not None:
        doc["baseTimeNanoseconds"] = base
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc).replace("NaN", "1e999").replace("Infinity", "1e999"))
    with pytest.raises(TraceFormatError, match=r"traceEvents\[0\]"):
        read_kineto(path)


def test_rocm_trace_reads(corpus: Path) -> None:
    trace = read_kineto(corpus / "vllm/mi300x_decode_full/graph_execution.json.gz")
    assert Counter(ev.cat for ev in trace.device)["kernel"] == 425


@pytest.mark.parametrize("content, where", [
    (b'{"traceEvents": [{"ph": "X", "cat": "kernel"', "byte"),
    (b"", "byte 0"),
    (b'{"traceEvents": []}', "traceEvents"),
    (b'{"something": 1}', "top level"),
    (b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0}]}',
     "traceEvents[0]"),
])
def test_bad_json_is_one_line_error(tmp_path: Path, content: bytes, where: str) -> None:
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(TraceFormatError) as info:
        read_kineto(path)
    message = str(info.value)
    assert "\n" not in message and str(path) in message and where in message


def test_truncated_and_corrupt_gzip(tmp_path: Path, corpus: Path) -> None:
    data = (corpus / "pytorch/a100_simple_add/kineto.json.gz").read_bytes()
    truncated = tmp_path / "truncated.json.gz"
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(TraceFormatError, match="truncated"):
        read_kineto(truncated)
    corrupt = tmp_path / "corrupt.json.gz"
    corrupt.write_bytes(data[:20] + bytes(b ^ 0xFF for b in data[20:60]) + data[60:])
    with pytest.raises(TraceFormatError, match="gzip"):
        read_kineto(corrupt)


def test_gzip_detected_by_content_not_suffix(tmp_path: Path) -> None:
    path = tmp_path / "plain_name.json"
    path.write_bytes(gzip.compress(b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a",'
                                   b' "pid": 1, "tid": 1, "ts": 5, "dur": 2, "args": {}}]}'))
    trace = read_kineto(path)
    assert trace.host[0].start == 5000 and trace.host[0].dur == 2000


@pytest.mark.parametrize("bad, expected", [
    (b'{"ph": "X", "cat": "cpu_op", "name": 5, "pid": 1, "tid": 1, "ts": 1, "dur": 1}',
     "Expected `str`"),
    (b'{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 1, "dur": 1, '
     b'"args": [1]}', "'args' an object"),
])
def test_bad_event_named_by_index_past_first_chunk(tmp_path: Path, bad: bytes,
                                                   expected: str) -> None:
    """Events are decoded in chunks: an error in a later chunk still names its own index,
    whether the reader cut the array itself or msgspec split it (an event whose name holds
    the text of a cut, ``},{``, makes one cut fail its proof)."""
    from chakra_hooks.linker.pytorch.kineto import CHUNK, CHUNK_BYTES
    good = b'{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 1, "dur": 1}'
    odd = good.replace(b'"a"', b'"a},{b"')
    index = max(CHUNK, CHUNK_BYTES // len(good)) + 7
    for events in ([good] * index + [bad, good],
                   [good] * (index // 2) + [odd] * 200 + [good] * (index - index // 2 - 200) + [bad]):
        path = tmp_path / "bad_event.json"
        path.write_bytes(b'{"traceEvents": [' + b",".join(events) + b"]}")
        with pytest.raises(TraceFormatError) as info:
            read_kineto(path)
        message = str(info.value)
        assert f"traceEvents[{index}]" in message and expected in message and "\n" not in message


@pytest.mark.parametrize("bad", [
    b'{"ph": "X", "cat": "cpu_op", "name": "a\xff", "pid": 1, "tid": 1, "ts": 1, "dur": 1}',
    b'{"ph": "f", "cat": "ac2g", "name": "\xc3(", "pid": 1, "tid": 1, "ts": 1, "id": 3}',
    b'{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 1, "dur": 1, '
    b'"args": {"External id": "\x80"}}',
    b'{"ph": "X", "cat": "cpu_op", "name": "a\\q", "pid": 1, "tid": 1, "ts": 1, "dur": 1}',
], ids=["complete-event-name", "flow-name", "args", "bad-escape"])
def test_strings_that_are_not_utf8_are_one_line_errors(tmp_path: Path, bad: bytes) -> None:
    """A byte flipped inside a string (found by the fuzz tests: msgspec's own DecodeError came
    out). The array's split proves its structure, not its strings: the chunk's decode says so,
    on both paths (the reader's cuts and msgspec's split, which an odd name forces)."""
    from chakra_hooks.linker.pytorch.kineto import CHUNK, CHUNK_BYTES
    good = b'{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 1, "dur": 1}'
    odd = good.replace(b'"a"', b'"a},{b"')
    index = max(CHUNK, CHUNK_BYTES // len(good)) + 7
    for events in ([good] * index + [bad, good], [odd] * 3 + [good] * index + [bad]):
        path = tmp_path / "bad_text.json"
        path.write_bytes(b'{"traceEvents": [' + b",".join(events) + b"]}")
        with pytest.raises(TraceFormatError) as info:
            read_kineto(path)
        message = str(info.value)
        assert str(path) in message and "\n" not in message
        # a bad escape is found by the split itself, which names its byte
        assert ("traceEvents[" in message and "UTF-8" in message
                or "byte " in message and "escape" in message), message


def _same_events(a, b) -> bool:
    fields = ("name", "cat", "pid", "tid", "start", "dur", "args", "id")
    return [tuple(getattr(e, f) for f in fields) for e in a] == [
        tuple(getattr(e, f) for f in fields) for e in b]


@pytest.mark.parametrize("name", ["pytorch/a100_resnet_nccl/kineto.json.gz",
                                  "vllm/mi300x_decode_full/graph_execution.json.gz",
                                  "pytorch/a100_simple_add/kineto.json.gz"])
def test_cut_and_split_read_alike(corpus: Path, name: str, monkeypatch) -> None:
    """The reader's own cuts and msgspec's split give the same events (the corpus files are
    cut by the reader: the split is the fallback)."""
    from chakra_hooks.linker.pytorch import kineto
    monkeypatch.setattr(kineto, "CHUNK_BYTES", 1 << 14)  # many chunks even for small files
    assert kineto._cut_events(kineto.map_bytes(corpus / name)) is not None
    cut = read_kineto(corpus / name)
    monkeypatch.setattr(kineto, "_cut_events", lambda raw: None)
    split = read_kineto(corpus / name)
    assert cut.events_total == split.events_total > 0
    for kept in ("host", "runtime", "device", "syncs"):
        assert _same_events(getattr(cut, kept), getattr(split, kept)), kept
    assert (cut.base_ns, cut.clock, cut.distributed) == (split.base_ns, split.clock, split.distributed)


@pytest.mark.parametrize("text, cut", [
    (b'{"traceEvents": [ ]}', True),  # nothing to cut
    (b'{"traceEvents": [{"ph": "X"},\n {"ph": "i"}], "x": "]"}', True),
    (b'{"traceEvents": [{"ph": "X"}, {"ph": "i"}], "logs": ["a]", "b}]"]}', False),  # "}]" in a log
    (b'{"traceEvents": [{"ph": "X"}, {"ph": "i"}], "logs": ["a]", "b"]}', True),
    (b'{"a": {"traceEvents": [{"ph": "X"}]}, "traceEvents": [{"ph": "X"}]}', False),  # nested
    (b'{"traceEvents": [{"ph": "X"}], "traceEvents": [{"ph": "i"}]}', False),  # last key wins
    (b'{"traceEvents": [{"ph": "X", "args": {"l": [{"a": 1}]}}], "x": 1}', True),
    (b'{"traceEvents": [{"ph": "X"}], "d": [{"id": 0}, {"id": 1}]}', False),  # "}]" after it
    (b'{"traceEvents": [{"ph": "X", "name": "a},{b"}, {"ph": "i"}]}', False),  # "},{" in a name
    (b'{"traceEvents": [{"ph": "X", "args": {"l": [{"a": 1}, {"b": 2}]}}, {"ph": "i"}]}', False),
])
def test_cuts_prove_the_document_or_give_way(text: bytes, cut: bool, monkeypatch) -> None:
    """Cut where the proofs hold, giving exactly the document's events; else left to msgspec's
    split: the marker check refuses an array that is not the document's own traceEvents, and a
    cut inside an event fails its chunk's decoding."""
    import msgspec
    from chakra_hooks.linker.pytorch import kineto
    monkeypatch.setattr(kineto, "CHUNK_BYTES", 1)  # a cut at every "},{"
    found = kineto._cut_events(text)
    try:
        events = None if found is None else [ev.ph for _, part in found[1](True) for ev in part]
    except kineto._NotProved:
        events = None
    assert (events is not None) == cut
    if cut:
        assert events == [ev["ph"] for ev in msgspec.json.decode(text)["traceEvents"]]


@pytest.mark.parametrize("name", ["pytorch/a100_resnet_nccl/kineto.json.gz",
                                  "vllm/mi300x_decode_full/graph_execution.json.gz"])
def test_events_read_by_phase_as_when_read_whole(corpus: Path, name: str, monkeypatch) -> None:
    """Events decoded by their phase (other phases as small structs) keep what decoding every
    event whole keeps: the same events, other phases counted alike."""
    from chakra_hooks.linker.pytorch import kineto
    by_phase = read_kineto(corpus / name)
    decode = kineto._decode_events
    monkeypatch.setattr(kineto, "_decode_events", lambda array, any_phase: decode(array, True))
    whole = read_kineto(corpus / name)
    assert by_phase.events_total == whole.events_total > 0
    for kept in ("host", "runtime", "device", "syncs", "unknown_dur"):
        assert _same_events(getattr(by_phase, kept), getattr(whole, kept)), kept
    assert by_phase.other_phases == whole.other_phases
    assert by_phase.flow_ends == whole.flow_ends and by_phase.pids == whole.pids


def test_a_phase_not_listed_reads_the_chunk_whole(tmp_path: Path) -> None:
    """An event of a phase the reader does not list (or none) is read as before, with the
    complete events beside it; a kept category's other phases are counted by phase."""
    path = tmp_path / "phases.json"
    path.write_bytes(b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", '
                     b'"pid": 1, "tid": 1, "ts": 1, "dur": 4}, '
                     b'{"ph": "Q", "cat": "cpu_op", "name": "odd"}, {"cat": "cpu_op", "name": "none"}, '
                     b'{"ph": "B", "cat": "kernel", "name": "k"}, '
                     b'{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 2, "dur": 1}]}')
    trace = read_kineto(path)
    assert [ev.name for ev in trace.host] == ["aten::mm"]
    assert [ev.name for ev in trace.device] == ["k"]
    assert trace.other_phases == {("cpu_op", "Q"): 1, ("cpu_op", ""): 1, ("kernel", "B"): 1}
    assert trace.events_total == 5


def test_chrome_array_form_reads(tmp_path: Path) -> None:
    """The Chrome trace format's bare array of events (no traceEvents key) reads too."""
    path = tmp_path / "array.json"
    path.write_bytes(b'[{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1.5, '
                     b'"dur": 2, "args": {"correlation": 3}},\n {"ph": "X", "cat": "cpu_op", '
                     b'"name": "aten::mm", "pid": 1, "tid": 1, "ts": 1, "dur": 4}]')
    trace = read_kineto(path)
    assert [(ev.name, ev.start, ev.dur) for ev in trace.device] == [("k", 1500, 2000)]
    assert trace.device[0].args.correlation == 3 and trace.events_total == 2
    assert [ev.name for ev in trace.host] == ["aten::mm"] and trace.clock == "kineto:epoch-us"


@pytest.mark.parametrize("damage", [{"dur": -5}, {"ts": 1e30}, {"ts": 2**63}],
                         ids=["negative-dur", "ts-1e30", "ts-2^63"])
def test_impossible_times_are_one_line_errors(tmp_path, damage):
    """Hand-made damage: the event is named (index and name), exit 1, nothing written."""
    import json
    import subprocess
    import sys

    kernel = {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 10.5,
              "dur": 3.0, "args": {"correlation": 1}}
    kernel.update(damage)
    doc = {"schemaVersion": 1, "traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 0, "tid": 1, "ts": 1.0,
         "dur": 2.0, "args": {}}, kernel]}
    trace = tmp_path / "rank0.pt.trace.json"
    trace.write_text(json.dumps(doc))
    run = subprocess.run([sys.executable, "-m", "chakra_hooks", "convert", str(trace), "-o",
                          str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
    assert run.returncode == 1
    (line,) = run.stderr.strip().splitlines()
    assert str(trace) in line and "traceEvents[1] ('gemm')" in line and "dur >= 0" in line
    assert not (tmp_path / "out").exists()


_TEXTS = ["", "a", "b", "ab", "ba", "abcdefg", "abcdefgh", "abcdefgi", "Xbcdefgh", "é", "e",
          "éé", "ab€", "ab\U0001f600", "kernel", "cpu_op", "cuda_runtime", "gpu_memcpy",
          "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>(int)",
          "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<double>>(int)",
          "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>(int) "]


def test_name_cache_compares_and_places_names_as_str_does() -> None:
    # The compiled reader finds a new name string in its cache by _slot_of and one _same_text
    # (length, width, memcmp): equal texts must share a place and compare equal, any two
    # others compare unequal, whatever their widths (ASCII, Latin-1, BMP, astral).
    from chakra_hooks.linker.pytorch.kineto import _same_text, _slot_of

    for a in _TEXTS:
        copy = "".join(list(a))  # the same text in a new object
        assert copy is not a or len(a) < 2
        assert _same_text(a, copy) and _slot_of(a) == _slot_of(copy)
        assert 0 <= _slot_of(a) < 4096  # (_NAME_SLOTS: a C constant compiled, not importable)
        for b in _TEXTS:
            assert _same_text(a, b) is (a == b), (a, b)
        assert not _same_text(a, None) and not _same_text(None, a)  # and no crash either
    assert _same_text(None, None) and 0 <= _slot_of(None) < 4096


def test_names_that_share_a_cache_place_read_as_their_own(tmp_path: Path) -> None:
    # Names that evict each other from the compiled reader's cache, in turn, in one chunk:
    # every event keeps its own name, and equal names are one object (interned).
    import json
    import sys

    from chakra_hooks.linker.pytorch.kineto import _slot_of

    by_place: dict[int, list[str]] = {}
    i = 0
    while not any(len(names) == 3 for names in by_place.values()):
        name = f"aten::op_{i}_{'x' * (i % 23)}"
        by_place.setdefault(_slot_of(name), []).append(name)
        i += 1
    colliding = next(names for names in by_place.values() if len(names) == 3)
    names = [colliding[k % 3] for k in range(60)] + ["other"] * 5
    events = [{"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": 10 * k,
               "dur": 5, "args": {"External id": k}} for k, name in enumerate(names)]
    path = tmp_path / "names.json"
    path.write_text(json.dumps({"traceEvents": events}))
    host = sorted(read_kineto(path).host, key=lambda ev: ev.start)
    assert [ev.name for ev in host] == names
    assert all(ev.name is sys.intern(ev.name) for ev in host)
    assert len({id(ev.name) for ev in host}) == 4
