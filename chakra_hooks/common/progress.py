"""How far `convert` has come within one job, for its progress bar.

A loader's long steps (reading a large file, linking) end with ``reached(fraction)``: the share
of the job's whole conversion done by then. `convert` says where that goes (its bar, or, from a
worker process, a queue the bar is fed from); when nothing listens it costs one global read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

_sink: Callable[[float], None] | None = None


def reached(fraction: float) -> None:
    """The current job is ``fraction`` (0-1) done."""
    if _sink is not None:
        _sink(fraction)


@contextmanager
def reporting_to(sink: Callable[[float], None] | None) -> Iterator[None]:
    """Send what ``reached`` says to ``sink`` while the block runs."""
    global _sink
    previous, _sink = _sink, sink
    try:
        yield
    finally:
        _sink = previous
