"""Benchmark: reading XSpace profiles (.xplane.pb), against raw protobuf decoding.

    python benchmarks/bench_xspace.py [--size-mb 500] [--corpus ../shared/corpus] [--skip-big]
                                      [--launches] [--file PATH]

For the corpus profiles and for a generated GPU-like XSpace of about ``--size-mb`` MB, each
measured in a fresh child process (so peak memory is that measurement's own):

- ``parse``: ``XSpace.ParseFromString`` of the whole file alone (upb; the floor for any
  protobuf reader, though it hands back nothing usable from Python yet);
- ``bare``: parse, then the cheapest Python loop over every event: metadata id, offset and
  duration, nothing else (the floor for a Python reader that looks at each event);
- ``raw``: parse, then every event plus every stat's id and value kind, with the generated
  classes and nothing else;
- ``reader``: our reader over every event (integer ps start times) with every stat resolved
  to {name: value} (``ref_value`` -> name): the same coverage as ``raw``;
- ``pick``: our reader over every event resolving only the stats the GPU linker reads
  (``hlo_op``, ``hlo_module``, ``program_id``), the others skipped undecoded;
- ``devices``: the linker's read phase, ``xla_devices.collect_devices`` (each device's events
  as columns);
- ``convert``: the whole path as ``chakra-hooks convert -j 1`` runs it (read, collect, link
  and convert one device at a time, write the ETs).

Reported: MB, seconds, MB/s, events/s, peak RSS (as a multiple of the file's size, and above
the interpreter's own with the modules imported: for a profile of 1 MB, the interpreter is
most of the peak), and reader / bare ratios.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_convert import compiled_status

REPO = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, resource, sys, time
mode, path = sys.argv[1], sys.argv[2]
from chakra_hooks.linker.xla import xspace, xspace_pb2
if mode in ("devices", "convert"):  # imported before the baseline, as the reader modes' are
    from chakra_hooks.linker.xla import devices, link
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # the interpreter and its imports
events = 0
t = time.perf_counter()
if mode == "parse":
    space = xspace_pb2.XSpace(); space.ParseFromString(open(path, "rb").read())
    events = -1
elif mode == "bare":
    space = xspace_pb2.XSpace(); space.ParseFromString(open(path, "rb").read())
    for plane in space.planes:
        for line in plane.lines:
            for ev in line.events:
                ev.metadata_id, ev.offset_ps, ev.duration_ps
                events += 1
elif mode == "raw":
    space = xspace_pb2.XSpace(); space.ParseFromString(open(path, "rb").read())
    for plane in space.planes:
        for line in plane.lines:
            ts = line.timestamp_ns
            for ev in line.events:
                ev.metadata_id; ev.offset_ps; ev.duration_ps
                for st in ev.stats:
                    st.metadata_id; st.WhichOneof("value")
                events += 1
elif mode == "reader":
    for plane in xspace.read_xspace(path).planes:
        for line in plane.lines():
            for mid, start, dur, stats in plane.events(line):
                plane.stats(stats)
                events += 1
elif mode == "pick":
    for plane in xspace.read_xspace(path).planes:
        wanted = {plane.stat_ids[k]: k for k in ("hlo_op", "hlo_module", "program_id") if k in plane.stat_ids}
        for line in plane.lines():
            for mid, start, dur, stats in plane.events(line):
                plane.pick(stats, wanted)
                events += 1
elif mode == "devices":
    from chakra_hooks.linker.xla.devices import collect_devices
    events = sum(len(d.events) for d in collect_devices(xspace.read_xspace(path)))
else:
    import tempfile
    from chakra_hooks.convert import convert_paths
    with tempfile.TemporaryDirectory() as out:
        result = convert_paths([path], out, workers=1, progress=False, warn=lambda _: None)
        events = sum(r.stats["device_events"] for r in result.ranks)
dt = time.perf_counter() - t
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"seconds": dt, "events": events, "peak_mb": peak / 1024, "added_mb": (peak - base) / 1024}))
"""


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def make_space(path: Path, size_mb: int, events_per_line: int = 200_000, launches: bool = False) -> int:
    """A GPU-like XSpace: 8 device planes of stream lines of kernel events with ref_value /
    int stats. One line is built and its bytes repeated (with fresh line ids) so that hundreds
    of MB are written in seconds. Returns the number of device events.

    ``launches``: as a real GPU profile has, a ``/host:CPU`` plane with the host call that
    launched each kernel (``cuLaunchKernel``, 2 us before it), joined to it by a
    ``correlation_id`` unique in the profile. Every line is then the same bytes but for the top
    two bytes of each id (:func:`_line_pieces`)."""
    from chakra_hooks.linker.xla import xspace_pb2

    if launches:
        device_pieces = _line_pieces(events_per_line, device=True)
        host_pieces = _line_pieces(events_per_line, device=False)
        body = _line_of(device_pieces, 0, "Stream #1(Kernel)", 1_000_000)
    else:
        line = xspace_pb2.XLine(id=1, name="Stream #1(Kernel)", timestamp_ns=1_000_000)
        for i in range(events_per_line):
            ev = line.events.add(metadata_id=1 + i % 1000, offset_ps=i * 5_000_123, duration_ps=3_000 + i % 997)
            ev.stats.add(metadata_id=1, ref_value=10 + i % 1000)  # hlo_op -> a name
            ev.stats.add(metadata_id=2, ref_value=5)  # hlo_module
            ev.stats.add(metadata_id=3, int64_value=i)  # correlation_id
        body = line.SerializeToString()
    head = xspace_pb2.XPlane(id=0, name="/device:GPU:0")
    for name, sid in (("hlo_op", 1), ("hlo_module", 2), ("correlation_id", 3), ("jit_step(7)", 5)):
        head.stat_metadata[sid].name = name
    for k in range(1000):
        head.stat_metadata[10 + k].name = f"fusion.{k}"
        head.event_metadata[1 + k].name = f"fusion_kernel_{k}"
    plane_head = head.SerializeToString()
    lines_total = max(8, (size_mb * 1_000_000) // len(body))
    per_plane = -(-lines_total // 8)
    events = 0
    with open(path, "wb") as out:
        for p in range(8):
            if launches:
                lines = [_field(3, _line_of(device_pieces, p * per_plane + k, "Stream #1(Kernel)", 1_000_000))
                         for k in range(per_plane)]
            else:
                lines = [_field(3, body) for _ in range(per_plane)]
            plane = plane_head.replace(b"/device:GPU:0", f"/device:GPU:{p}".encode()) + b"".join(lines)
            out.write(_field(1, plane))
            events += per_plane * events_per_line
        if launches:
            host = xspace_pb2.XPlane(id=100, name="/host:CPU")
            host.stat_metadata[3].name = "correlation_id"
            host.event_metadata[1].name = "cuLaunchKernel"
            lines = [_field(3, _line_of(host_pieces, n, f"launcher {n // per_plane}", 998_000))
                     for n in range(8 * per_plane)]
            out.write(_field(1, host.SerializeToString() + b"".join(lines)))
    return events


def _varint_field(number: int, value: int) -> bytes:
    return _varint(number << 3) + _varint(value)


def _line_pieces(n: int, device: bool) -> list[bytes]:
    """The events of one line, cut just before the last two bytes of each event's correlation
    id: a 5-byte varint whose low 21 bits are the event's index and top 14 bits the line's
    number (from 128 on, so that every id takes exactly 5 bytes). ``b"".join`` with a line's two
    bytes between the pieces makes that line (:func:`_line_of`)."""
    pieces = []
    for i in range(n):
        if device:
            head = (_varint_field(1, 1 + i % 1000) + _varint_field(2, i * 5_000_123)
                    + _varint_field(3, 3_000 + i % 997)
                    + _field(4, _varint_field(1, 1) + _varint_field(7, 10 + i % 1000))  # hlo_op
                    + _field(4, _varint_field(1, 2) + _varint_field(7, 5)))  # hlo_module
        else:
            head = _varint_field(1, 1) + _varint_field(2, i * 5_000_123) + _varint_field(3, 1_500_000)
        low = bytes([(i & 0x7F) | 0x80, ((i >> 7) & 0x7F) | 0x80, ((i >> 14) & 0x7F) | 0x80])
        stat = _varint_field(1, 3) + _varint(4 << 3) + low  # correlation_id, int64_value: 2 bytes to come
        event = head + _varint(4 << 3 | 2) + _varint(len(stat) + 2) + stat
        pieces.append(_varint(4 << 3 | 2) + _varint(len(event) + 2) + event)
    pieces.append(b"")
    return pieces


def _line_of(pieces: list[bytes], number: int, name: str, timestamp_ns: int) -> bytes:
    top = number + 128
    assert top < 1 << 14 and len(pieces) - 1 <= 1 << 21
    events = bytes([(top & 0x7F) | 0x80, top >> 7]).join(pieces)
    return (_varint_field(1, number + 1) + _field(2, name.encode()) + _varint_field(3, timestamp_ns)
            + events)


def measure(mode: str, path: Path) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, mode, str(path)], capture_output=True, text=True,
                         check=True, cwd=REPO)
    return json.loads(out.stdout.strip().splitlines()[-1])


def report(label: str, path: Path, modes: list[str]) -> None:
    mb = path.stat().st_size / 1e6
    results = {m: measure(m, path) for m in modes}
    events = results["bare"]["events"]
    print(f"\n{label}: {mb:.1f} MB, {events:,} events")
    for m, r in results.items():
        rate = f"{events / r['seconds']:,.0f} events/s" if events > 0 else ""
        note = f"  ({r['events']:,} device events kept)" if m in ("devices", "convert") else ""
        print(f"  {m:7s} {r['seconds']:8.3f} s  {mb / r['seconds']:8.1f} MB/s  {rate:>22s}  "
              f"peak {r['peak_mb']:.0f} MB = {r['peak_mb'] / mb:.2f}x the input "
              f"(+{r['added_mb']:.0f} MB over the interpreter){note}")
    sec = {m: r["seconds"] for m, r in results.items()}
    print(f"  reader / raw = {sec['reader'] / sec['raw']:.2f}x, reader / bare = {sec['reader'] / sec['bare']:.2f}x, "
          f"pick / bare = {sec['pick'] / sec['bare']:.2f}x, reader / parse-only = {sec['reader'] / sec['parse']:.1f}x")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mb", type=int, default=500)
    ap.add_argument("--corpus", type=Path, default=REPO.parent / "shared" / "corpus")
    ap.add_argument("--skip-big", action="store_true")
    ap.add_argument("--launches", action="store_true",
                    help="the generated profile with a host plane: a launch per kernel (make_space)")
    ap.add_argument("--file", type=Path, action="append", default=[],
                    help="also measure this .xplane.pb (e.g. a big generated one kept from an earlier run)")
    args = ap.parse_args()
    # A checkout whose sources are newer than its build runs them as plain Python (a git
    # checkout or stash touches them): say which build the figures are of.
    status = compiled_status()
    print(f"compiled modules running: {status} (setup.py; 0 = pure Python)")
    for path in args.file:
        report(str(path), path, ["parse", "bare", "raw", "reader", "pick", "devices", "convert"])
    for name in ("jax_xla/tpu_inference_2.xplane.pb", "jax_xla/mi300x_jax_conv.xplane.pb"):
        path = args.corpus / name
        if path.exists():
            report(name, path, ["parse", "bare", "raw", "reader", "pick", "devices", "convert"])
    if not args.skip_big:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "big.xplane.pb"
            t = time.perf_counter()
            n = make_space(path, args.size_mb, launches=args.launches)
            print(f"\ngenerated {path.stat().st_size / 1e6:.0f} MB, {n:,} events in {time.perf_counter() - t:.1f} s")
            report("generated", path, ["parse", "bare", "raw", "reader", "pick", "devices", "convert"])
    if compiled_status() != status:
        print(f"warning: compiled modules running changed to {compiled_status()} during the "
              "runs: figures after the change are not of the compiled build")


if __name__ == "__main__":
    main()
