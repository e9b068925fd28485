"""MoE routing bins inside vLLM: tokens per expert, per MoE layer, per engine step.

vLLM's routers (``BaseRouter`` in ``fused_moe/router/base_router.py``) call a capture function
with ``topk_ids`` [tokens, top_k] before expert-parallel remapping, so the ids are logical
experts. Ours counts them with in-place ops only (``index_add_`` into a preallocated
[layers, experts + 1] buffer on the ids' device, out-of-range ids into the last column): no
host sync, nothing Dynamo has to break a graph for under ``torch.compile``, and still right
under CUDA-graph replay, where Python never runs again but the captured in-place adds do.
A capture function already set (vLLM's routed-experts capturer) is chained, and put back when
the window ends. At each engine step the buffer is snapshotted on the device and zeroed;
all snapshots are copied to the host once, when the window ends.

Records use the PyTorch collector's sidecar format (``routing.rank<r>.json``, read by
``linker/enrich/routing.py``): one per layer and engine step, the region being the engine step (the
routing node sits at the step's end).
"""

from __future__ import annotations

import logging
import re
from typing import Any

log = logging.getLogger("chakra_hooks.collectors.vllm")
_LAYER_IN_NAME = re.compile(r"(?:^|\.)(\d+)(?:\.|$)")


class _Layer:
    __slots__ = ("module", "router", "name", "layer", "num_experts", "top_k", "ep_size",
                 "previous")

    def __init__(self, module: Any, order: int) -> None:
        self.module = module
        self.router = module.router
        self.name = str(getattr(module, "layer_name", "") or "")
        found = _LAYER_IN_NAME.search(self.name)
        self.layer = int(found.group(1)) if found else order
        self.num_experts = int(self.router.global_num_experts)
        self.top_k = int(self.router.top_k)
        ep = getattr(getattr(getattr(module, "moe_config", None), "moe_parallel_config", None),
                     "ep_size", None)
        self.ep_size = int(ep) if ep and int(ep) > 1 and self.num_experts % int(ep) == 0 else None
        self.previous = None


class VllmRouting:
    """Counts routed tokens per layer and engine step for one capture window."""

    def __init__(self, layers: list[_Layer]) -> None:
        import torch

        self.layers = layers
        self.width = max(layer.num_experts for layer in layers) + 1
        device = _device_of(layers[0].module)
        self.counts = torch.zeros((len(layers), self.width), dtype=torch.int64, device=device)
        self.tokens = torch.zeros(len(layers), dtype=torch.int64, device=device)
        self.snapshots: list[tuple[int, Any, Any]] = []  # (engine step, counts, tokens)
        self.errors: list[str] = []

    @classmethod
    def for_model(cls, model: Any) -> "VllmRouting | None":
        """The model's MoE layers whose router takes a capture function; None if none."""
        layers = []
        for module in model.modules():
            router = getattr(module, "router", None)
            if (router is not None and callable(getattr(router, "set_capture_fn", None))
                    and hasattr(router, "global_num_experts") and hasattr(router, "top_k")):
                layers.append(_Layer(module, len(layers)))
        return cls(layers) if layers else None

    def activate(self) -> None:
        for index, layer in enumerate(self.layers):
            layer.previous = getattr(layer.router, "capture_fn", None)
            layer.router.set_capture_fn(self._capture_fn(index, layer))

    def deactivate(self) -> None:
        for layer in self.layers:
            layer.router.set_capture_fn(layer.previous)
            layer.previous = None

    def _capture_fn(self, index: int, layer: _Layer) -> Any:
        import torch

        counts, tokens, previous = self.counts[index], self.tokens[index], layer.previous
        experts = layer.num_experts

        def capture(topk_ids: Any) -> None:
            try:
                ids = topk_ids.reshape(-1).to(torch.int64)
                ids = torch.where((ids >= 0) & (ids < experts), ids, experts)
                counts.index_add_(0, ids, torch.ones_like(ids))
                tokens.add_(topk_ids.shape[0])
            except Exception as exc:  # a tracing problem must never break vLLM's forward
                if not self.errors:
                    log.warning("chakra-hooks: routing bins: %s: %s", type(exc).__name__, exc)
                self.errors.append(f"{type(exc).__name__}: {exc}")
            if previous is not None:
                previous(topk_ids)

        return capture

    def end_step(self, step: dict | None) -> None:
        """The counts so far belong to ``step`` (None: before the first step): keep a device
        copy and start again from zero."""
        if step is not None:
            self.snapshots.append((step["index"], self.counts.clone(), self.tokens.clone()))
        self.counts.zero_()
        self.tokens.zero_()

    def records(self, steps: list[dict]) -> list[dict]:
        """Sidecar records for every (engine step, layer) that routed tokens: one host copy."""
        import torch

        if steps:
            self.end_step(steps[-1])  # the last step's counts are still in the live buffer
        if not self.snapshots:
            return []
        counts = torch.stack([c for _, c, _ in self.snapshots]).cpu().tolist()
        tokens = torch.stack([t for _, _, t in self.snapshots]).cpu().tolist()
        by_index = {s["index"]: s for s in steps}
        occurrence: dict[str, int] = {}
        out = []
        for (step_index, _, _), step_counts, step_tokens in zip(self.snapshots, counts, tokens):
            step = by_index.get(step_index, {})
            annotation = str(step.get("annotation", ""))
            seen = occurrence.get(annotation, 0)
            occurrence[annotation] = seen + 1
            for layer, row, n in zip(self.layers, step_counts, step_tokens):
                if n:
                    out.append(_record(layer, row, n, step_index, step, annotation, seen))
        return out


def _record(layer: _Layer, row: list[int], tokens: int, step_index: int, step: dict,
            annotation: str, occurrence: int) -> dict:
    experts = layer.num_experts
    bins = row[:experts]
    ep_bins = None
    if layer.ep_size:
        per = experts // layer.ep_size
        ep_bins = [sum(bins[j * per:(j + 1) * per]) for j in range(layer.ep_size)]
    return {
        "step": step_index, "layer": layer.layer, "module": layer.name,
        "num_experts": experts, "top_k": layer.top_k, "tokens": tokens, "bins": bins,
        "dropped": sum(row[experts:]), "ep_size": layer.ep_size, "ep_bins": ep_bins,
        "start_ns": step.get("start_ns", 0), "end_ns": step.get("end_ns") or 0,
        "annotation": annotation, "occurrence": occurrence, "tid": step.get("tid"),
    }


def _device_of(module: Any) -> Any:
    import torch

    for param in module.parameters():
        return param.device
    return torch.device("cpu")
