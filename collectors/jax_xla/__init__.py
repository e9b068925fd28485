"""JAX / XLA collector: ``trace`` (jax.profiler XSpace of chosen steps + the optimised HLO).

Importing this package does not import jax; jax is imported when a window starts.

    import chakra_hooks.collectors.jax_xla as cj

    with cj.trace("runs/exp1", steps=range(10, 12)) as t:
        for batch in data:
            state = train_step(state, batch)
            t.step()
"""

from .capture import Trace, trace

__all__ = ["Trace", "trace"]
