"""PyTorch collector: ``trace`` (host ET + Kineto per rank, with MoE routing bins).

Importing this package does not import torch; torch is imported when a window starts.

    import chakra_hooks.collectors.torch as ct

    with ct.trace("runs/exp1", steps=range(10, 12), model=model) as t:
        for batch in loader:
            train_step(batch)
            t.step()
"""

from .capture import Trace, trace
from .moe import register_router

__all__ = ["Trace", "trace", "register_router"]
