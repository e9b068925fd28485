"""What goes in must come out: a rank's host ops, their time and its collectives, counted in
the raw Kineto trace and in the ET we wrote (read with the reference reader, mlc-chakra).

Counted independently of the linker, from Kineto alone:
- host ops: per thread, the outermost ``cpu_op`` ranges (``user_annotation`` ranges are
  containers), by name, with their recorded time; those that start inside the window the ET
  covers (its host nodes' first start to last end);
- collectives: NCCL / RCCL kernels where the trace has kernels, else the c10d collective
  calls (gloo, which runs them on the CPU; what ran inside such a call is part of it, not a
  host op).

Counted in the ET: host COMP nodes (lane ``thread:*``) by name, a split op once (from its
first part's start to its last part's end: the wait between parts is a dependency); COMM
nodes, and collectives replayed as compute (``comm_unresolved``).
"""

from __future__ import annotations

import gzip
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

# The c10d calls that are collectives (``c10d::wait`` and friends are not).
C10D_COLLECTIVES = {
    "c10d::allreduce_", "c10d::allreduce_coalesced_", "c10d::broadcast_", "c10d::reduce_",
    "c10d::allgather_", "c10d::_allgather_base_", "c10d::allgather_into_tensor_coalesced_",
    "c10d::reduce_scatter_", "c10d::_reduce_scatter_base_",
    "c10d::reduce_scatter_tensor_coalesced_", "c10d::alltoall_", "c10d::alltoall_base_",
    "c10d::gather_", "c10d::scatter_", "c10d::send", "c10d::recv_", "c10d::barrier",
}
COMM_TYPES = (5, 6, 7)  # COMM_SEND, COMM_RECV, COMM_COLL


@dataclass
class Inventory:
    ops: Counter = field(default_factory=Counter)  # name -> count
    time_us: Counter = field(default_factory=Counter)  # name -> recorded time
    collectives: int = 0
    # Top-level ranges that share their start with another range of their thread: in a trace
    # timed in whole microseconds, which holds which is a guess (the ET may nest them the
    # other way); a name may be short in the ET by this many.
    ambiguous: Counter = field(default_factory=Counter)


def _kineto_events(path: Path) -> tuple[list[dict], int]:
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    doc = json.loads(raw)
    base = doc.get("baseTimeNanoseconds") or 0
    return [e for e in doc["traceEvents"] if e.get("ph") == "X"], base


def kineto_inventory(path: Path, window_ns: tuple[int, int] | None = None) -> Inventory:
    """Host ops and collectives of a raw Kineto trace (module docstring)."""
    events, base = _kineto_events(path)
    inv = Inventory()

    def inside(e: dict) -> bool:
        if window_ns is None:
            return True
        t = base + e["ts"] * 1000
        return window_ns[0] - 1000 <= t <= window_ns[1] + 1000

    kernels = [e for e in events if e.get("cat") == "kernel" and inside(e)]
    threads: dict[tuple, list[dict]] = {}
    for e in events:
        if e.get("cat") == "cpu_op":
            threads.setdefault((e.get("pid"), e.get("tid")), []).append(e)
    for ranges in threads.values():
        ranges.sort(key=lambda e: (e["ts"], -e.get("dur", 0)))
        starts = Counter(e["ts"] for e in ranges)
        open_until = None  # end of the outermost range open
        for e in ranges:
            end = e["ts"] + e.get("dur", 0)
            # Nested in an op: inside it, ends included (times in whole microseconds put a
            # range's first child at its start and its last at its end).
            if open_until is not None and (e["ts"] < open_until or (
                    e["ts"] == open_until and end == open_until)):
                continue
            open_until = end
            # Without kernels a c10d collective ran on the CPU: a collective, counted below,
            # and what ran inside its call (gloo's chunk / empty under an all-gather) with it.
            if inside(e) and (kernels or e["name"] not in C10D_COLLECTIVES):
                inv.ops[e["name"]] += 1
                inv.time_us[e["name"]] += e.get("dur", 0)
                if starts[e["ts"]] > 1:
                    inv.ambiguous[e["name"]] += 1
    if kernels:
        inv.collectives = sum(1 for e in kernels
                              if "nccl" in e["name"].lower() or "rccl" in e["name"].lower())
    else:
        inv.collectives = sum(1 for e in events if e.get("cat") == "cpu_op" and inside(e)
                              and e["name"] in C10D_COLLECTIVES)
    return inv


def node_attrs(node) -> dict:
    """A node's attributes by name, as their values (the reference reader's Node)."""
    out = {}
    for a in node.attr:
        kind = a.WhichOneof("value")
        out[a.name] = getattr(a, kind) if kind else None
    return out


def et_inventory(nodes: list) -> tuple[Inventory, tuple[int, int] | None]:
    """Host ops and collectives of an ET read by the reference reader, and the window its
    host nodes cover (ns)."""
    inv = Inventory()
    lanes: dict[str, list[tuple[int, int, str, int]]] = {}
    for node in nodes:
        attrs = node_attrs(node)
        if node.type in COMM_TYPES or "comm_unresolved" in attrs:
            inv.collectives += 1
            continue
        lane = attrs.get("lane", "")
        if not lane.startswith("thread:") or node.name == "host_gap" or "start_ns" not in attrs:
            continue
        start = attrs["start_ns"]
        lanes.setdefault(lane, []).append(
            (start, start + attrs.get("duration_ns", 0), node.name, attrs.get("segment", 0)))
    lo = hi = None
    for parts in lanes.values():
        parts.sort()
        lo = parts[0][0] if lo is None else min(lo, parts[0][0])
        # An op split where it waited is one op from its first part's start to its last
        # part's end: the wait between its parts is a dependency, not lost time.
        current = None  # [name, start, end]
        for start, end, name, segment in parts:
            hi = end if hi is None else max(hi, end)
            if segment and current is not None and current[0] == name:
                current[2] = max(current[2], end)
                continue
            if current is not None:
                inv.time_us[current[0]] += (current[2] - current[1]) / 1000
            inv.ops[name] += 1
            current = [name, start, end]
        if current is not None:
            inv.time_us[current[0]] += (current[2] - current[1]) / 1000
    return inv, (lo, hi) if lo is not None else None


@dataclass
class Conservation:
    lost_ops: dict  # name -> how many fewer in the ET than in Kineto
    time_kept: float  # share of Kineto's top-level op time the ET holds
    kineto_collectives: int
    et_collectives: int

    def problems(self, min_time: float = 0.99) -> list[str]:
        out = []
        if self.lost_ops:
            out.append(f"ops lost: {dict(sorted(self.lost_ops.items())[:8])}")
        if self.time_kept < min_time:
            out.append(f"time kept {self.time_kept:.1%} < {min_time:.0%}")
        if self.et_collectives < self.kineto_collectives:
            out.append(f"collectives: {self.et_collectives} in the ET of "
                       f"{self.kineto_collectives} recorded")
        return out


def conservation(kineto: Path, et_nodes: list) -> Conservation:
    """Compare one rank's Kineto trace with the ET converted from it."""
    out, window = et_inventory(et_nodes)
    got = kineto_inventory(kineto, window)
    lost = {name: n - out.ops[name] for name, n in got.ops.items()
            if out.ops[name] + got.ambiguous[name] < n}
    total = sum(got.time_us.values())
    kept = sum(min(out.time_us[name], t) for name, t in got.time_us.items())
    return Conservation(lost, kept / total if total else 1.0, got.collectives, out.collectives)
