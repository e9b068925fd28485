"""NeMo / Lightning collector: ``ChakraTraceCallback``, a ``lightning.pytorch.Callback`` that
records chosen optimizer steps with the PyTorch collector.

    from chakra_hooks.collectors.nemo import ChakraTraceCallback

    trainer = Trainer(..., callbacks=[ChakraTraceCallback("runs/x", start_step=10, num_steps=2)])

Importing this package imports neither Lightning nor torch; naming ``ChakraTraceCallback``
imports Lightning (which the trainer has already).
"""

from __future__ import annotations

from typing import Any

__all__ = ["ChakraTraceCallback"]


def __getattr__(name: str) -> Any:
    if name == "ChakraTraceCallback":
        from .callback import ChakraTraceCallback

        return ChakraTraceCallback
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
