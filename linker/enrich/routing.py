"""MoE routing bins sidecar (``routing.rank<r>.json``) -> routing ops in a linked trace.

The PyTorch collector wraps every router call in a ``record_function`` annotation named
``moe_router:layer<N>`` and writes the per-expert token counts to a sidecar. :func:`attach`
adds one op per routing record, placed by its annotation's time: the annotation op when the
linked trace has one, else the annotation's range as Kineto recorded it
(``LinkedTrace.annotations``: vLLM's engine steps, whose counts the vLLM collector records),
else the sidecar's own times, which are on Kineto's clock (unix ns).

Routing op: ``name`` ``moe_routing:layer<N>``, kind COMPUTE, on the host (``is_cpu_op``), on
the router's thread lane, starting when the routing region ends, with ZERO duration (the
router's own ops inside the region already carry its time; a timed op would count it twice).
Edges: HOST_ORDER from the last op that started inside the region, HOST_ORDER to the first op
that starts after it, PARENT from the annotation op when there is one. Attributes (Chakra
oneof in brackets):

- ``moe_layer`` (int64_val): MoE layer index (0-based).
- ``moe_step`` (int64_val): training step.
- ``moe_num_experts`` (int64_val): experts in the layer.
- ``moe_top_k`` (int64_val): experts per token.
- ``moe_tokens`` (int64_val): tokens routed by this call on this rank.
- ``moe_expert_tokens`` (int64_list): ``[n_0, ..., n_{E-1}]``, (token, expert) assignments per
  expert; sums to ``moe_tokens * moe_top_k`` minus dropped assignments.
- ``moe_ep_rank_tokens`` (int64_list, only when the expert-parallel layout is known):
  assignments per expert-parallel rank (experts contiguous per EP rank), i.e. how many token
  copies the following all-to-all sends to each EP rank.
- ``moe_routing_dur_ns`` (int64_val): measured duration of the routing region (router call).
- ``moe_dropped`` (int64_val, only when non-zero): assignments to an out-of-range expert id.
- ``moe_module`` (string_val): the router's module name.
"""

from __future__ import annotations

import bisect
from pathlib import Path


from chakra_hooks.common.errors import TraceFormatError
from chakra_hooks.linker.model import Edge, EdgeKind, LinkedTrace, Op, OpKind
from chakra_hooks.linker.enrich.sidecars import check_integers, read_records, recorded_ranges

SIDECAR_FORMAT = "chakra-hooks-routing/1"
_REQUIRED = ("step", "layer", "num_experts", "top_k", "tokens", "bins", "annotation",
             "occurrence", "start_ns", "end_ns")


# Integer fields of a routing record (absent optional ones read as 0).
_INTEGERS = ("layer", "step", "num_experts", "top_k", "tokens", "occurrence", "start_ns",
             "end_ns", "dropped")


def read_sidecar(path: Path) -> list[dict]:
    """The records of a routing sidecar; TraceFormatError for anything else."""
    records = read_records(path, SIDECAR_FORMAT, "routing records", _REQUIRED)
    for i, rec in enumerate(records):
        check_integers(path, i, rec, _INTEGERS)
        if not isinstance(rec["annotation"], str):
            raise TraceFormatError(path, f"record {i}", "annotation: a name")
        ep_bins = rec.get("ep_bins")
        if ep_bins and (not isinstance(ep_bins, list) or not all(type(b) is int for b in ep_bins)):
            raise TraceFormatError(path, f"record {i}", "ep_bins: integers")
        bins = rec["bins"]
        if (not isinstance(bins, list) or len(bins) != rec["num_experts"]
                or not all(type(b) is int for b in bins)):
            raise TraceFormatError(path, f"record {i}", "bins: num_experts integers")
    return records


def _annotation_ops(trace: LinkedTrace, names: set[str]) -> dict[str, list[Op]]:
    """Host ops carrying one of ``names``, per name in time order (one per start time).

    Our PyTorch linker treats annotations as transparent containers (no op), so this is
    usually empty; other producers of linked traces may keep them.
    """
    found: dict[str, dict[int | None, Op]] = {}
    for op in trace.ops:
        if op.name in names and not op.on_device:
            found.setdefault(op.name, {}).setdefault(op.start_ps, op)
    return {
        name: sorted(by_start.values(), key=lambda o: (o.start_ps is None, o.start_ps or 0))
        for name, by_start in found.items()
    }


def _lanes(trace: LinkedTrace) -> dict[str, tuple[list[int], list[int]]]:
    """Host ops per lane in start order: (starts, uids)."""
    per: dict[str, list[tuple[int, int]]] = {}
    for op in trace.ops:
        if not op.on_device and op.start_ps is not None:
            per.setdefault(op.lane, []).append((op.start_ps, op.uid))
    out = {}
    for lane, items in per.items():
        items.sort()
        out[lane] = ([s for s, _ in items], [u for _, u in items])
    return out


def _attrs(rec: dict) -> dict:
    attrs = {
        "moe_layer": int(rec["layer"]),
        "moe_step": int(rec["step"]),
        "moe_num_experts": int(rec["num_experts"]),
        "moe_top_k": int(rec["top_k"]),
        "moe_tokens": int(rec["tokens"]),
        "moe_expert_tokens": [int(b) for b in rec["bins"]],
        "moe_routing_dur_ns": max(0, int(rec["end_ns"]) - int(rec["start_ns"])),
        "moe_module": str(rec.get("module") or ""),
    }
    if rec.get("ep_bins"):
        attrs["moe_ep_rank_tokens"] = [int(b) for b in rec["ep_bins"]]
    if rec.get("dropped"):
        attrs["moe_dropped"] = int(rec["dropped"])
    return attrs


Region = tuple[Op | None, int | None, int | None]  # annotation op, start ps, end ps


def _regions(trace: LinkedTrace, records: list[dict]) -> list[Region]:
    """Per record: (annotation op or None, region start ps, region end ps) on the trace clock."""
    anns = _annotation_ops(trace, {r["annotation"] for r in records})
    ranges = recorded_ranges(trace)
    # The sidecar's clock is unix ns, which is what Kineto-based traces are on (in ps).
    on_unix = trace.clock.startswith("kineto:")
    offsets = []
    matched = []
    for rec in records:
        cands = anns.get(rec["annotation"], [])
        ann = cands[rec["occurrence"]] if rec["occurrence"] < len(cands) else None
        if ann is not None and (ann.start_ps is None or ann.dur_ps is None):
            ann = None
        if ann is not None:
            offsets.append(ann.start_ps - rec["start_ns"] * 1000)
        matched.append(ann)
    offset = 0 if on_unix else (sorted(offsets)[len(offsets) // 2] if offsets else None)
    out = []
    for rec, ann in zip(records, matched):
        recorded = ranges.get(rec["annotation"], ())
        if ann is not None:
            out.append((ann, ann.start_ps, ann.start_ps + ann.dur_ps))
        elif rec["occurrence"] < len(recorded):
            out.append((None, *recorded[rec["occurrence"]][:2]))
        elif offset is not None:
            out.append((None, rec["start_ns"] * 1000 + offset, rec["end_ns"] * 1000 + offset))
        else:
            out.append((None, None, None))
    return out


def attach(trace: LinkedTrace, path: Path) -> None:
    """Add one routing op per sidecar record to ``trace`` (see the module docstring)."""
    records = read_sidecar(path)
    if not records:
        return
    lanes = _lanes(trace)
    next_uid = max((op.uid for op in trace.ops), default=0) + 1
    untimed = 0
    for rec, (ann, start, end) in zip(records, _regions(trace, records)):
        lane = ann.lane if ann is not None else f"thread:{rec.get('tid', '?')}"
        # A zero-length marker at the moment the routing decision is known (region end): the
        # router's own ops already carry the time, so a timed op would count it twice.
        op = Op(uid=next_uid, name=f"moe_routing:layer{rec['layer']}", kind=OpKind.COMPUTE,
                on_device=False, lane=lane, start_ps=end, dur_ps=None if end is None else 0,
                attrs=_attrs(rec))
        next_uid += 1
        trace.ops.append(op)
        if end is None:
            untimed += 1
            continue
        if ann is not None:
            trace.edges.append(Edge(ann.uid, op.uid, EdgeKind.PARENT))
        starts, uids = lanes.get(lane, ([], []))
        i = bisect.bisect_left(starts, end)  # first op starting at or after the region end
        if i > 0 and starts[i - 1] >= start:  # the last op inside the region
            trace.edges.append(Edge(uids[i - 1], op.uid, EdgeKind.HOST_ORDER))
        if i < len(uids):
            trace.edges.append(Edge(op.uid, uids[i], EdgeKind.HOST_ORDER))
    trace.stats["routing_records"] = len(records)
    if untimed:
        trace.warnings.append(
            f"{path}: {untimed} of {len(records)} routing records could not be placed in time "
            "(no moe_router annotation in the trace and its clock is not Kineto's)")
