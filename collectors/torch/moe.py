"""MoE routing bins: how many tokens each expert of each MoE layer received, per call.

Routers are found automatically:

- Hugging Face transformers (5.x) routers: classes named ``*TopKRouter`` / ``*TopkRouter``
  with ``num_experts`` and ``top_k`` attributes (``MixtralTopKRouter``, ``Qwen2MoeTopKRouter``,
  ``Qwen3MoeTopKRouter``, ``OlmoeTopKRouter``, ``GptOssTopKRouter``, ``DeepseekV3TopkRouter``).
  They return ``(router_logits, scores, indices)`` with integer ``indices`` [tokens, top_k].
- Megatron-core ``TopKRouter`` (``config.num_moe_experts``, ``topk``, ``layer_number``,
  ``config.expert_model_parallel_size``), returning ``(probs, routing_map)`` with a bool
  ``routing_map`` [tokens, experts]. Detected by class name only: Megatron needs CUDA, so this
  path is exercised here through :func:`register_router` with the same output shape.
- NeMo AutoModel's ``Gate`` (``n_experts``, ``topk``), returning ``(weights, indices,
  aux_loss)``.
- transformers 4.x sparse MoE blocks (``MixtralSparseMoeBlock`` ... with a ``Linear`` gate),
  returning ``(hidden_states, router_logits)``: the top-k of the logits.
- Anything else: :func:`register_router`.

Inside the capture window every router call is wrapped in a ``record_function`` annotation
named ``moe_router:layer<N>`` (so it shows up with its timing in both the host ET and the
Kineto trace), and its per-expert counts are computed ON THE DEVICE without a host sync
(``bincount`` on CPU; ``where`` + ``scatter_add`` on accelerators, where ``bincount`` would read
``max()`` back); all counts are copied to the host once, at the end of the window. Outside the
window no hook is installed at all. Layer index: ``register_router(layer=...)`` or Megatron's
``layer_number - 1``, else the first number in the module name (``model.layers.<N>.mlp.gate``),
else (auto-detection without ``model=``, names unknown) the router's call order in the step.
A failure inside a hook is logged and marks the capture incomplete; it never reaches the
user's forward.

Sidecar ``routing.rank<r>.json``: ``{"format", "rank", "clock", "records": [...]}``, each record
``step, layer, module, num_experts, top_k, tokens, bins, dropped, ep_size, ep_bins, start_ns,
end_ns, annotation, occurrence, tid``. ``bins[e]`` counts (token, expert) assignments, so
``sum(bins) + dropped == tokens * top_k`` for index routers (``dropped``: indices outside
``[0, num_experts)``). ``ep_bins[j]`` is the number of assignments whose expert lives on
expert-parallel rank ``j`` (experts contiguous per EP rank), i.e. how many token copies the
following all-to-all sends to EP rank ``j``; null when the EP layout is unknown. ``start_ns`` /
``end_ns`` are ``time.time_ns()`` (CLOCK_REALTIME), the clock of Kineto's
``baseTimeNanoseconds + ts * 1000``. ``annotation`` + ``occurrence`` (0-based count of that
annotation name in the window on this rank) identify the annotation event in the traces.
"""

from __future__ import annotations

import functools
import logging
import re
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

SIDECAR_FORMAT = "chakra-hooks-routing/1"
ANNOTATION_PREFIX = "moe_router:layer"
CLOCK = "unix_ns: time.time_ns(), CLOCK_REALTIME (Kineto baseTimeNanoseconds + ts*1000)"

log = logging.getLogger("chakra_hooks.collectors.torch")
_LAYER_IN_NAME = re.compile(r"(?:^|\.)(\d+)(?:\.|$)")


@dataclass(slots=True)
class RouterSpec:
    """What the collector needs to know about one router module."""

    num_experts: int
    top_k: int
    layer: int | None = None  # None: from the module name, else the call order in the step
    name: str = ""
    ep_size: int | None = None  # expert-parallel size (experts contiguous per EP rank)
    select: Callable[[Any], Any] | None = None  # output -> indices or bool routing map


_REGISTERED: "weakref.WeakKeyDictionary[Any, RouterSpec]" = weakref.WeakKeyDictionary()


def register_router(
    module: Any,
    num_experts: int,
    top_k: int,
    *,
    layer: int | None = None,
    name: str | None = None,
    ep_size: int | None = None,
    select: Callable[[Any], Any] | None = None,
) -> None:
    """Record routing bins for ``module`` (any ``nn.Module``) inside capture windows.

    The module's output must be, or contain (last integer or bool tensor of a tuple, unless
    ``select`` picks it), either expert indices [tokens, top_k] or a bool routing map
    [tokens, num_experts].
    """
    if num_experts < 1 or top_k < 1:
        raise ValueError(f"num_experts and top_k must be >= 1, got {num_experts}, {top_k}")
    if ep_size is not None and (ep_size < 1 or num_experts % ep_size):
        raise ValueError(f"ep_size {ep_size} must divide num_experts {num_experts}")
    _REGISTERED[module] = RouterSpec(num_experts, top_k, layer, name or "", ep_size, select)


def detect_router(module: Any) -> RouterSpec | None:
    """A spec for a known router class, else None (cheap: class name and attributes)."""
    spec = _REGISTERED.get(module)
    if spec is not None:
        return spec
    cls = type(module).__name__
    config = getattr(module, "config", None)
    if cls == "TopKRouter" and hasattr(config, "num_moe_experts"):
        layer_number = getattr(module, "layer_number", None)
        ep = getattr(config, "expert_model_parallel_size", None)
        return RouterSpec(
            num_experts=int(config.num_moe_experts),
            top_k=int(getattr(module, "topk", getattr(config, "moe_router_topk", 1))),
            layer=None if layer_number is None else int(layer_number) - 1,  # Megatron: 1-based
            ep_size=int(ep) if ep and int(config.num_moe_experts) % int(ep) == 0 else None,
        )
    if cls.lower().endswith("topkrouter"):
        num_experts = getattr(module, "num_experts", None)
        top_k = getattr(module, "top_k", None)
        if isinstance(num_experts, int) and isinstance(top_k, int):
            return RouterSpec(num_experts=num_experts, top_k=top_k)
    if cls in ("Gate", "FakeBalancedGate"):
        # NeMo AutoModel (nemo_automodel.components.moe.layers): forward returns
        # (weights, indices [tokens, topk], aux_loss or None).
        num_experts, top_k = getattr(module, "n_experts", None), getattr(module, "topk", None)
        if isinstance(num_experts, int) and isinstance(top_k, int):
            return RouterSpec(num_experts=num_experts, top_k=top_k)
    if cls.endswith("SparseMoeBlock") and type(getattr(module, "gate", None)).__name__ == "Linear":
        # transformers 4.x (Mixtral, Qwen2-MoE, ...): the block's gate is a plain Linear and the
        # block returns (hidden_states, router_logits); in 5.x the gate is a *TopKRouter
        # (above) and the block is not counted a second time.
        num_experts = getattr(module, "num_experts", None)
        top_k = getattr(module, "top_k", None)
        if isinstance(num_experts, int) and isinstance(top_k, int):
            return RouterSpec(num_experts=num_experts, top_k=top_k,
                              select=functools.partial(_topk_of_logits, top_k=top_k))
    return None


def _topk_of_logits(output: Any, top_k: int) -> Any:
    """The experts a transformers 4.x sparse MoE block chose: top-k of its router logits
    (the block's own choice, recomputed on the device from the logits it returns)."""
    logits = output[1] if isinstance(output, (tuple, list)) and len(output) > 1 else None
    return None if logits is None else logits.topk(top_k, dim=-1).indices


def routing_tensor(output: Any) -> Any:
    """The indices or bool routing map in a router's output (last int/bool tensor)."""
    import torch

    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)):
        for item in reversed(output):
            if isinstance(item, torch.Tensor) and not item.is_floating_point():
                return item
    return None


def count_on_device(t: Any, num_experts: int, top_k: int) -> tuple[Any, int]:
    """Per-expert counts of a routing tensor, on its device, without a host sync.

    Returns (counts, tokens). For index tensors counts has at least ``num_experts + 1``
    entries: those from ``num_experts`` on count out-of-range ids (padding, dropped tokens).
    For bool routing maps it has ``num_experts`` entries. Integer and bool tensors carry no
    autograd history, so no detach / no_grad is needed (each would be one more recorded op).
    """
    import torch

    if t.dtype == torch.bool:  # routing map [..., tokens, experts]
        return t.reshape(-1, num_experts).sum(dim=0, dtype=torch.int64), t.numel() // num_experts
    # Indices [..., tokens, top_k] (leading batch dims allowed) or already flattened.
    tokens = t.numel() // (t.shape[-1] if t.dim() >= 2 else top_k)
    flat = t.view(-1) if t.is_contiguous() else t.reshape(-1)  # view: one recorded op, not two
    if flat.device.type == "cpu":
        try:  # the common case in one op; negative ids make bincount raise
            return torch.bincount(flat, minlength=num_experts + 1), tokens
        except RuntimeError:
            pass
    # Accelerators (bincount reads max() back to the host; scatter_add does not) and negative
    # ids: out-of-range ids go to the extra bucket instead of failing.
    flat = flat.long()
    flat = torch.where((flat >= 0) & (flat < num_experts), flat, num_experts)
    counts = torch.zeros(num_experts + 1, dtype=torch.int64, device=flat.device)
    return counts.scatter_add_(0, flat, torch.ones_like(flat)), tokens


@dataclass(slots=True)
class _Pending:
    step: int
    layer: int
    module: str
    spec: RouterSpec
    tokens: int
    counts: Any  # device tensor until the window ends
    start_ns: int
    end_ns: int
    annotation: str
    occurrence: int
    tid: int


@dataclass
class RoutingRecorder:
    """Hooks routers for one capture window and keeps their counts on the device."""

    models: list[Any] | None = None
    ep_size: int | None = None
    # Count only training forward passes: not eval-mode calls (validation inside the window)
    # and not activation recomputation, which re-runs a forward inside the backward pass
    # (the autograd engine is then running a graph task on this thread).
    training_only: bool = False
    step: int = 0
    pending: list[_Pending] = field(default_factory=list)
    _handles: list[Any] = field(default_factory=list)
    _names: dict[int, str] = field(default_factory=dict)
    _open: dict[int, list[tuple]] = field(default_factory=dict)  # (rf, start, name, layer, module)
    _occurrence: dict[str, int] = field(default_factory=dict)
    _calls_in_step: int = 0
    _type_cache: dict[type, bool] = field(default_factory=dict)
    _hooked_ids: set[int] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)

    def activate(self) -> None:
        """Install the hooks (window start)."""
        import torch

        hooked: set[int] = set()
        for model in self.models or []:
            for name, mod in model.named_modules():
                if detect_router(mod) is not None and id(mod) not in hooked:
                    self._names[id(mod)] = name
                    self._hook(mod)
                    hooked.add(id(mod))
        for mod in list(_REGISTERED.keys()):
            if id(mod) not in hooked:
                self._hook(mod)
                hooked.add(id(mod))
        if self.models is None:
            # No model given: watch every module call (only inside the window) for routers.
            self._hooked_ids = hooked
            mm = torch.nn.modules.module
            self._handles.append(mm.register_module_forward_pre_hook(self._global_pre))
            self._handles.append(
                mm.register_module_forward_hook(self._global_post, always_call=True)
            )

    def deactivate(self) -> None:
        """Remove every hook (window end); close annotations left open by an exception."""
        for h in self._handles:
            h.remove()
        self._handles.clear()
        for stack in self._open.values():
            for entry in reversed(stack):
                entry[0].__exit__(None, None, None)
        self._open.clear()

    def new_step(self, step: int) -> None:
        self.step = step
        self._calls_in_step = 0

    def _hook(self, mod: Any) -> None:
        self._handles.append(mod.register_forward_pre_hook(self._pre))
        self._handles.append(mod.register_forward_hook(self._post, always_call=True))

    def _is_router(self, mod: Any) -> bool:
        cls = type(mod)
        hit = self._type_cache.get(cls)
        if hit is None:
            hit = detect_router(mod) is not None
            self._type_cache[cls] = hit
        return hit and id(mod) not in self._hooked_ids

    def _global_pre(self, mod: Any, args: Any) -> None:
        if self._is_router(mod):
            self._pre(mod, args)

    def _global_post(self, mod: Any, args: Any, out: Any) -> None:
        if self._is_router(mod):
            self._post(mod, args, out)

    def _layer(self, mod: Any, spec: RouterSpec, name: str) -> int:
        if spec.layer is not None:
            return spec.layer
        m = _LAYER_IN_NAME.search(name)
        return int(m.group(1)) if m else self._calls_in_step

    def _counted(self, mod: Any) -> bool:
        if not self.training_only:
            return True
        import torch

        return bool(mod.training) and torch._C._current_graph_task_id() == -1

    def _pre(self, mod: Any, args: Any) -> None:
        try:
            if self._counted(mod):
                self._enter(mod)
        except Exception as exc:  # a tracing problem must never break the user's forward
            self._fail(exc)

    def _post(self, mod: Any, args: Any, out: Any) -> None:
        try:
            self._exit(mod, out)
        except Exception as exc:
            self._fail(exc)

    def _fail(self, exc: Exception) -> None:
        if not self.errors:
            log.warning("chakra-hooks: routing bins: %s: %s", type(exc).__name__, exc)
        self.errors.append(f"{type(exc).__name__}: {exc}")

    def _enter(self, mod: Any) -> None:
        import torch

        spec = detect_router(mod)
        name = spec.name or self._names.get(id(mod), "")
        layer = self._layer(mod, spec, name)
        self._calls_in_step += 1
        annotation = f"{ANNOTATION_PREFIX}{layer}"
        rf = torch.autograd.profiler.record_function(annotation)
        rf.__enter__()
        self._open.setdefault(id(mod), []).append((rf, time.time_ns(), annotation, layer, name))

    def _exit(self, mod: Any, out: Any) -> None:
        stack = self._open.get(id(mod))
        if not stack:
            return
        rf, start_ns, annotation, layer, name = stack.pop()
        rf.__exit__(None, None, None)
        end_ns = time.time_ns()
        occurrence = self._occurrence.get(annotation, 0)
        self._occurrence[annotation] = occurrence + 1
        spec = detect_router(mod)
        t = None if out is None else (spec.select or routing_tensor)(out)
        if t is None:
            return  # the router raised, or its output has no routing tensor
        counts, tokens = count_on_device(t, spec.num_experts, spec.top_k)
        self.pending.append(
            _Pending(
                self.step, layer, name or type(mod).__name__, spec, tokens, counts,
                start_ns, end_ns, annotation, occurrence, threading.get_native_id(),
            )
        )

    def records(self) -> list[dict]:
        """Copy every count to the host at once and build the sidecar records."""
        if not self.pending:
            return []
        import torch

        by_device: dict[Any, list[_Pending]] = {}
        for p in self.pending:
            by_device.setdefault(p.counts.device, []).append(p)
        host: dict[int, list[int]] = {}
        for items in by_device.values():
            flat = torch.cat([p.counts for p in items]).cpu().tolist()  # the one copy
            pos = 0
            for p in items:
                n = p.counts.numel()
                host[id(p)] = flat[pos : pos + n]
                pos += n
        return [self._record(p, host[id(p)]) for p in self.pending]

    def _record(self, p: _Pending, counts: list[int]) -> dict:
        e = p.spec.num_experts
        bins, dropped = counts[:e], sum(counts[e:])
        ep = p.spec.ep_size or self.ep_size
        ep_bins = None
        if ep and e % ep == 0:
            per = e // ep
            ep_bins = [sum(bins[j * per : (j + 1) * per]) for j in range(ep)]
        return {
            "step": p.step, "layer": p.layer, "module": p.module, "num_experts": e,
            "top_k": p.spec.top_k, "tokens": p.tokens, "bins": bins, "dropped": dropped,
            "ep_size": ep if ep_bins is not None else None, "ep_bins": ep_bins,
            "start_ns": p.start_ns, "end_ns": p.end_ns, "annotation": p.annotation,
            "occurrence": p.occurrence, "tid": p.tid,
        }
