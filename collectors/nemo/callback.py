"""``ChakraTraceCallback``: the PyTorch collector driven by a Lightning (NeMo) trainer.

One capture per rank, by the PyTorch collector (:class:`chakra_hooks.collectors.torch.Trace`:
host ET and Kineto trace of the same window, linkable by record-function id, MoE routing bins,
manifests, atomic files, never raising into training): this class only tells it where the
optimizer steps are.

- The window is counted in optimizer steps, ``trainer.global_step``: with gradient
  accumulation a step holds every micro-batch of it, and under ``MegatronStrategy`` (one
  Lightning batch is one global batch) it is one batch. A step ends in the
  ``on_train_batch_end`` that sees ``global_step`` move on.
- The constructor takes plain values only, and the recording state exists only while training
  runs: the callback pickles (``ddp_spawn``), deep-copies (NeMo 2's ``nl.Trainer.io_init``) and
  builds from ``nemo_run``'s ``run.Config(ChakraTraceCallback, ...)`` or a YAML ``_target_``.
- ``on_train_end``, ``on_exception`` and ``teardown`` all close the capture, once: an exception
  leaves the manifest marked incomplete and reaches the caller unchanged; nothing keeps running.
- MoE routing bins are counted in training forward passes only (not validation, not activation
  recomputation), for the routers the PyTorch collector finds in the LightningModule:
  Megatron-core ``TopKRouter``, Hugging Face routers (transformers 4.x and 5.x), anything given
  to ``register_router``.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from lightning.pytorch import Callback

log = logging.getLogger("chakra_hooks.collectors.nemo")


class ChakraTraceCallback(Callback):
    """Record optimizer steps ``[start_step, start_step + num_steps)`` of every chosen rank.

    Files land in ``output_dir`` as the PyTorch collector writes them (``chakra-hooks convert
    output_dir`` needs no flags). ``ranks``: only these global ranks record (default all).
    ``warmup``: start Kineto one step early. ``moe_routing``: count routed tokens per expert.
    ``ep_size``: expert-parallel size for per-EP-rank counts (Megatron's is read by itself).
    ``record_shapes``: Kineto input shapes. ``convert``: convert the capture when training ends
    (True: into ``<output_dir>/chakra``, or a folder).
    """

    def __init__(self, output_dir: str = "chakra_traces", start_step: int = 10,
                 num_steps: int = 2, ranks: list[int] | None = None, warmup: bool = True,
                 moe_routing: bool = True, ep_size: int | None = None,
                 record_shapes: bool = False, convert: bool | str = False) -> None:
        if start_step < 0 or num_steps < 1:
            raise ValueError(f"start_step must be >= 0 and num_steps >= 1, got {start_step}, "
                             f"{num_steps}")
        self.output_dir = str(output_dir)
        self.start_step = int(start_step)
        self.num_steps = int(num_steps)
        self.ranks = None if ranks is None else [int(r) for r in ranks]
        self.warmup = bool(warmup)
        self.moe_routing = bool(moe_routing)
        self.ep_size = ep_size
        self.record_shapes = bool(record_shapes)
        self.convert = convert
        self._trace: Any = None  # the running capture, only between train start and end
        self._steps_seen = 0

    # Recording state is not configuration: copies and pickles start without it.
    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_trace"] = None
        state["_steps_seen"] = 0
        return state

    @property
    def end_step(self) -> int:
        return self.start_step + self.num_steps

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        try:
            self._start(trainer, pl_module)
        except Exception as exc:  # a tracing problem never stops training
            log.warning("chakra-hooks: not recording: %s: %s", type(exc).__name__, exc)
            self._trace = None

    def _start(self, trainer: Any, pl_module: Any) -> None:
        from chakra_hooks.collectors.torch import Trace

        world = int(getattr(trainer, "world_size", 1) or 1)
        if self.ranks is not None and not any(0 <= r < world for r in self.ranks):
            if trainer.global_rank == 0:
                log.warning("chakra-hooks: ranks %s name no rank of this %d-rank run; "
                            "nothing is recorded", self.ranks, world)
            return
        trace = Trace(self.output_dir, steps=range(self.start_step, self.end_step),
                      ranks=self.ranks, convert=self.convert,
                      model=pl_module if self.moe_routing else None,
                      routing=self.moe_routing, ep_size=self.ep_size, warmup=self.warmup,
                      record_shapes=self.record_shapes, routing_training_only=True)
        # Resumed runs start at their checkpoint's step: count from there.
        trace.step_num = self._steps_seen = int(trainer.global_step)
        self._trace = trace.start()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        trace = self._trace
        if trace is None:
            return
        while self._steps_seen < trainer.global_step:  # an optimizer step has completed
            trace.step()
            self._steps_seen += 1

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._close(None, trainer)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._close(exception, trainer)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self._close(None, trainer)

    def _close(self, exc: BaseException | None, trainer: Any) -> None:
        trace, self._trace = self._trace, None
        if trace is None:
            return
        try:
            trace.stop(exc)
        except Exception as err:  # stop() guards itself; this is the last line of defence
            log.warning("chakra-hooks: closing the capture: %s: %s", type(err).__name__, err)
        if trace.complete is None and exc is None and trainer.global_step < self.end_step \
                and (self.ranks is None or trainer.global_rank in self.ranks):
            log.warning("chakra-hooks: training ended at step %d, before the window "
                        "[%d, %d) was recorded; %s holds no capture of this rank",
                        trainer.global_step, self.start_step, self.end_step,
                        os.path.abspath(self.output_dir))
