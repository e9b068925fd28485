"""KV-cache sidecar (``<worker>.<ns>.kv.json``, vLLM collector) -> MEM_LOAD / MEM_STORE ops.

The vLLM collector's ``ChakraKVConnector`` runs each transfer call inside a ``record_function``
range (``kv:load``, ``kv:wait_load:layer<N>``, ``kv:save:layer<N>``, ``kv:wait_save``) and
writes one sidecar record per call: ``kind`` (load, wait_load, store, wait_save), ``range``,
``layer`` (-1: all layers / none), ``layer_name``, ``bytes``, ``slots``, ``requests``,
``connector``, ``start_ns`` / ``end_ns`` (unix ns), ``tid``, ``step`` (engine step).

Each record is placed by its range as Kineto recorded it (``LinkedTrace.annotations``, the
n-th range of a name for the n-th record of it), else by its own times when the trace is on
Kineto's clock. Then:

- A range that is itself a host op (ranges outside any op, e.g. ``kv:load`` before the
  forward: the linker keeps ``kv:`` ranges whole) becomes the KV op.
- A range inside a host op (vLLM calls ``wait_for_layer_load`` / ``save_kv_layer`` from inside
  the attention op, ``vllm::unified_attention_with_output``) becomes a new op on that thread,
  and the attention op gives it its time: it starts after the loads it contains and lasts its
  measured span minus theirs and the stores', so nothing is counted twice. Edges: the op
  before attention -> load -> attention (DATA) -> store (DATA) -> the op after attention.
- Otherwise the new op sits between the ops before and after it on its thread.

KV ops: ``MEM_LOAD`` (load) / ``MEM_STORE`` (store) with ``tensor_size`` = bytes, or COMP for
the waits; attributes ``kv_layer`` (int64_val, -1 for all layers), ``kv_layer_name``,
``kv_connector`` (string_val), ``kv_requests``, ``kv_slots``, ``kv_step`` (int64_val). The
attention op keeps ``kv_excluded_ns`` (int64_val): the time it handed to the KV ops.
"""

from __future__ import annotations

import bisect
from pathlib import Path


from chakra_hooks.common.errors import TraceFormatError, json_kind
from chakra_hooks.linker.model import PS_PER_NS, Edge, EdgeKind, LinkedTrace, Op, OpKind
from chakra_hooks.linker.enrich.sidecars import check_integers, read_records, recorded_ranges

KV_FORMAT = "chakra-hooks-kv/1"
_KINDS = {"load": OpKind.MEM_LOAD, "store": OpKind.MEM_STORE,
          "wait_load": OpKind.COMPUTE, "wait_save": OpKind.COMPUTE}
_BEFORE = frozenset(("load", "wait_load"))  # inside attention: these run before its work
_REQUIRED = ("kind", "range", "layer", "bytes", "start_ns", "end_ns", "tid")


def read_sidecar(path: Path) -> list[dict]:
    """The records of a KV sidecar; TraceFormatError for anything else."""
    records = read_records(path, KV_FORMAT, "KV-cache records", _REQUIRED)
    for i, rec in enumerate(records):
        if rec["kind"] not in _KINDS:
            raise TraceFormatError(path, f"record {i}", f"kind one of {', '.join(_KINDS)}")
        check_integers(path, i, rec, ("bytes", "requests", "slots", "step"), nullable=True)
        check_integers(path, i, rec, ("start_ns", "end_ns"))
        check_integers(path, i, rec, ("layer",), low=-1)
        if rec["end_ns"] < rec["start_ns"]:
            raise TraceFormatError(path, f"record {i}", "end_ns at or after start_ns")
        if not isinstance(rec["range"], str) or type(rec["tid"]) not in (int, str):
            raise TraceFormatError(path, f"record {i}", "range: a name, tid: an integer or a "
                                   f"name, got {json_kind(rec['range'])} and "
                                   f"{json_kind(rec['tid'])}")
        for key in ("layer_name", "connector"):
            if not isinstance(rec.get(key) or "", str):
                raise TraceFormatError(path, f"record {i}", f"{key}: a name or null, got "
                                       f"{json_kind(rec[key])}")
    return records


def _ranges(trace: LinkedTrace, records: list[dict]) -> list[tuple[int, int, str] | None]:
    """Per record: (start ps, end ps, lane) on the trace's clock, or None."""
    recorded = recorded_ranges(trace)
    on_unix = trace.clock.startswith("kineto:")
    seen: dict[str, int] = {}
    out: list[tuple[int, int, str] | None] = []
    for rec in records:
        name = str(rec["range"])
        n = seen.get(name, 0)
        seen[name] = n + 1
        found = recorded.get(name, [])
        if n < len(found):
            out.append(found[n])
        elif on_unix:
            out.append((int(rec["start_ns"]) * PS_PER_NS, int(rec["end_ns"]) * PS_PER_NS,
                        f"thread:{rec['tid']}"))
        else:
            out.append(None)
    return out


def _attrs(rec: dict) -> dict:
    return {"kv_layer": int(rec["layer"]), "kv_layer_name": str(rec.get("layer_name") or ""),
            "kv_connector": str(rec.get("connector") or ""),
            "kv_requests": int(rec.get("requests") or 0), "kv_slots": int(rec.get("slots") or 0),
            "kv_step": int(rec.get("step", -1) if rec.get("step") is not None else -1)}


class _Lane:
    """A thread's host ops in start order, to find the op around or next to a time."""

    def __init__(self, ops: list[Op]) -> None:
        ops.sort(key=lambda o: (o.start_ps, o.uid))
        self.ops = ops
        self.starts = [o.start_ps for o in ops]

    def around(self, start: int, end: int) -> tuple[Op | None, int]:
        """(the op whose span holds [start, end] or None, index of the first op after start)."""
        i = bisect.bisect_right(self.starts, start)
        if i > 0:
            op = self.ops[i - 1]
            if op.start_ps <= start and end <= op.start_ps + (op.dur_ps or 0):
                return op, i
        return None, i


def attach(trace: LinkedTrace, path: Path) -> None:
    """Turn each KV record into an op of ``trace`` (see the module docstring)."""
    records = read_sidecar(path)
    if not records:
        return
    per_lane: dict[str, list[Op]] = {}
    by_name_start: dict[tuple[str, int], Op] = {}
    for op in trace.ops:
        if not op.on_device and op.start_ps is not None:
            per_lane.setdefault(op.lane, []).append(op)
            by_name_start[(op.name, op.start_ps)] = op
    lanes = {lane: _Lane(ops) for lane, ops in per_lane.items()}
    next_uid = max((op.uid for op in trace.ops), default=-1) + 1
    inside: dict[int, list[Op]] = {}  # attention op uid -> the KV ops it held
    placed = 0
    for rec, where in zip(records, _ranges(trace, records)):
        if where is None:
            continue
        start, end, lane = where
        kind = _KINDS[rec["kind"]]
        op = by_name_start.get((str(rec["range"]), start))
        if op is not None:  # the range is a host op of its own: it becomes the KV op
            op.kind = kind
        else:
            op = Op(uid=next_uid, name=str(rec["range"]), kind=kind, on_device=False,
                    lane=lane, start_ps=start, dur_ps=end - start)
            next_uid += 1
            trace.ops.append(op)
            _link_new(trace, op, lanes.get(lane), inside)
        if kind != OpKind.COMPUTE and rec["bytes"] is not None:
            op.bytes = int(rec["bytes"])
        op.attrs.update(_attrs(rec))
        op.attrs["kv_direction"] = rec["kind"]
        placed += 1
    _hand_over_time(trace, lanes, inside)
    trace.stats["kv_records"] = placed
    if placed < len(records):
        trace.warnings.append(f"{path}: {len(records) - placed} of {len(records)} KV-cache "
                              "records could not be placed in time (no kv: ranges in the trace "
                              "and its clock is not Kineto's)")


def _link_new(trace: LinkedTrace, op: Op, lane: _Lane | None, inside: dict[int, list[Op]]
              ) -> None:
    if lane is None:
        return
    holder, i = lane.around(op.start_ps, op.start_ps + op.dur_ps)
    if holder is not None:
        inside.setdefault(holder.uid, []).append(op)
        return
    if i > 0:
        trace.edges.append(Edge(lane.ops[i - 1].uid, op.uid, EdgeKind.HOST_ORDER))
    if i < len(lane.ops):
        trace.edges.append(Edge(op.uid, lane.ops[i].uid, EdgeKind.HOST_ORDER))


def _hand_over_time(trace: LinkedTrace, lanes: dict[str, _Lane], inside: dict[int, list[Op]]
                    ) -> None:
    """Each op that held KV ops: loads before it, stores after it, its time minus theirs."""
    for uid, kv_ops in inside.items():
        lane = lanes[kv_ops[0].lane]
        at = next(i for i, o in enumerate(lane.ops) if o.uid == uid)
        holder = lane.ops[at]
        before = [o for o in kv_ops if o.attrs["kv_direction"] in _BEFORE]
        after = [o for o in kv_ops if o.attrs["kv_direction"] not in _BEFORE]
        excluded = sum(o.dur_ps for o in kv_ops)
        span = holder.dur_ps or 0
        if before:
            holder.start_ps = max(o.start_ps + o.dur_ps for o in before)
        # loads + the rest of its work + stores == the span it measured
        holder.dur_ps = max(0, span - excluded)
        holder.attrs["kv_excluded_ns"] = excluded // PS_PER_NS
        previous = lane.ops[at - 1].uid if at > 0 else None
        following = lane.ops[at + 1].uid if at + 1 < len(lane.ops) else None
        for o in before:
            if previous is not None:
                trace.edges.append(Edge(previous, o.uid, EdgeKind.HOST_ORDER))
            trace.edges.append(Edge(o.uid, holder.uid, EdgeKind.DATA))
        for o in after:
            trace.edges.append(Edge(holder.uid, o.uid, EdgeKind.DATA))
            if following is not None:
                trace.edges.append(Edge(o.uid, following, EdgeKind.HOST_ORDER))
