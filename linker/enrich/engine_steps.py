"""vLLM engine steps in a linked PyTorch trace: which op belongs to which step, and its batch.

vLLM's workers annotate every engine step while its torch profiler records (Kineto
``user_annotation``, ET ``record_function``), in one of two spellings
(``vllm/v1/worker/gpu_worker.py``, ``annotate_profile``)::

    execute_context_<n>(<tokens>)_generation_<m>(<tokens>)
    execute_<total>_context_<n>(sq<tokens>sk<..>sqsq<..>sqsk<..>)_generation_<m>(sq<tokens>...)

where the context part counts prefill requests and their new tokens, the generation part decode
requests and theirs. An engine step is the inference counterpart of a training step.

:func:`tag` (run by the PyTorch loader when the Kineto trace has such annotations, with or
without our collector) gives every op that starts inside a step's range (host ops by their
start; device ops through the host op that launched them) the attribute ``engine_step`` (0-based,
in time order), and adds one zero-duration COMP node ``engine_step:<i>`` per step at its start,
on its thread, before the step's first op, with:

- ``engine_step`` (int64_val), ``engine_step_dur_ns`` (int64_val): the step's measured length;
- ``prefill_requests``, ``prefill_tokens``, ``decode_requests``, ``decode_tokens``,
  ``scheduled_tokens`` (int64_val): the batch;
- ``annotation`` (string_val): vLLM's annotation as written.
"""

from __future__ import annotations

import bisect
import re

from chakra_hooks.linker.model import PS_PER_NS, Edge, EdgeKind, LinkedTrace, Op, OpKind

STEP_NAME = re.compile(
    r"^execute_(?:(\d+)_)?context_(\d+)\((?:sq)?(\d+)[^)]*\)_generation_(\d+)\((?:sq)?(\d+)[^)]*\)$")


def parse(name: str) -> dict[str, int] | None:
    """The batch an engine-step annotation describes, or None for any other name."""
    found = STEP_NAME.match(name)
    if found is None:
        return None
    total, ctx_reqs, ctx_tokens, gen_reqs, gen_tokens = found.groups()
    prefill, decode = int(ctx_tokens), int(gen_tokens)
    return {"prefill_requests": int(ctx_reqs), "prefill_tokens": prefill,
            "decode_requests": int(gen_reqs), "decode_tokens": decode,
            "scheduled_tokens": int(total) if total is not None else prefill + decode}


def tag(trace: LinkedTrace) -> None:
    """Tag ops with their engine step and add the step nodes (module docstring)."""
    steps = sorted((start, dur, lane, name, batch) for name, start, dur, lane in trace.annotations
                   if (batch := parse(name)) is not None)
    if not steps:
        return
    starts = [s[0] for s in steps]
    by_uid: dict[int, Op] = {}
    for op in trace.ops:
        by_uid[op.uid] = op
        if op.on_device or op.start_ps is None:
            continue
        i = bisect.bisect_right(starts, op.start_ps) - 1
        if i >= 0 and op.start_ps <= steps[i][0] + steps[i][1]:
            op.attrs["engine_step"] = i
    for edge in trace.edges:  # device work belongs to the step that launched it
        if edge.kind == EdgeKind.LAUNCH:
            src, dst = by_uid.get(edge.src), by_uid.get(edge.dst)
            if src is not None and dst is not None and "engine_step" in src.attrs:
                dst.attrs["engine_step"] = src.attrs["engine_step"]
    _add_step_nodes(trace, steps)
    trace.stats["engine_steps"] = len(steps)


def _add_step_nodes(trace: LinkedTrace, steps: list[tuple]) -> None:
    lanes: dict[str, list[tuple[int, int]]] = {}
    for op in trace.ops:
        if not op.on_device and op.start_ps is not None:
            lanes.setdefault(op.lane, []).append((op.start_ps, op.uid))
    for items in lanes.values():
        items.sort()
    next_uid = max((op.uid for op in trace.ops), default=-1) + 1
    for index, (start, dur, lane, name, batch) in enumerate(steps):
        attrs = {"engine_step": index, "engine_step_dur_ns": dur // PS_PER_NS, **batch,
                 "annotation": name}
        node = Op(uid=next_uid, name=f"engine_step:{index}", kind=OpKind.COMPUTE,
                  on_device=False, lane=lane, start_ps=start, dur_ps=0, attrs=attrs)
        next_uid += 1
        trace.ops.append(node)
        items = lanes.get(lane, [])
        i = bisect.bisect_left(items, (start, -1))  # first op starting at or after the step
        if i > 0:
            trace.edges.append(Edge(items[i - 1][1], node.uid, EdgeKind.HOST_ORDER))
        if i < len(items):
            trace.edges.append(Edge(node.uid, items[i][1], EdgeKind.HOST_ORDER))
