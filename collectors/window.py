"""The life cycle every collector shares: a window of consecutive training steps.

``start()`` arms the collector, ``step()`` marks the end of each training step, ``stop()`` ends
the run; the same object is a context manager and a decorator (each call of the decorated
function is one step). Subclasses say what happens at the window's edges through a few hooks;
this class only counts steps and guarantees two things: the user's exception propagates
unchanged, and a window still open when the run stops is flushed and reported incomplete.
Nothing here imports a framework.
"""

from __future__ import annotations

import atexit
import functools
import logging
from collections.abc import Callable, Iterable
from typing import Any


def window_bounds(steps: Iterable[int]) -> tuple[int, int]:
    """``steps`` as [first, end): it must be a non-empty run of consecutive integers >= 0."""
    s = sorted({int(x) for x in steps})
    if not s or s[0] < 0 or s[-1] - s[0] + 1 != len(s):
        raise ValueError(f"steps must be consecutive non-negative integers, got {s[:8]}")
    return s[0], s[-1] + 1


def guarded(log: logging.Logger, errors: list[str], what: str, fn: Callable, *args: Any,
            context: str = "") -> bool:
    """Run one tracing action; a failure is logged and appended to ``errors``, never raised.

    A tracing problem must never break the user's job; the capture's manifest reports it."""
    try:
        fn(*args)
        return True
    except Exception as exc:
        message = f"{what}: {type(exc).__name__}: {exc}"
        log.warning("chakra-hooks: %s%s", context, message)
        errors.append(message)
        return False


class StepWindow:
    """Counts steps and drives the hooks; see the module docstring."""

    def __init__(self, steps: Iterable[int]) -> None:
        self.first, self.end = window_bounds(steps)
        self.step_num = 0
        self._armed = False
        self._done = False

    # -- hooks for subclasses ----------------------------------------------------------------
    def _advance(self) -> None:
        """A step begins (``step_num`` is its index): open or close the window as due."""
        raise NotImplementedError

    def _end_step(self) -> None:
        """The current step ends (before ``step_num`` moves on)."""

    def _window_open(self) -> bool:
        """Whether a capture is in progress (it is flushed as incomplete on an early stop)."""
        raise NotImplementedError

    def _finish_early(self, why: str) -> None:
        """Flush an open window because the run stopped before its end."""
        raise NotImplementedError

    def _after_stop(self) -> None:
        """The run is over (e.g. convert what was captured)."""

    # -- public API --------------------------------------------------------------------------
    def start(self) -> "StepWindow":
        if not self._armed and not self._done:
            self._armed = True
            atexit.register(self.stop)  # a script that never calls stop() still gets its files
            self._advance()
        return self

    def step(self) -> None:
        """Mark the end of one training step. Costs an attribute check outside the window."""
        if not self._armed:
            return
        self._end_step()
        self.step_num += 1
        self._advance()

    def stop(self, exc: BaseException | None = None) -> None:
        """End the run: flush a window still open (marked incomplete)."""
        if not self._armed:
            return
        self._armed = False
        atexit.unregister(self.stop)
        if self._window_open():
            self._finish_early(f"{type(exc).__name__}: {exc}" if exc is not None else
                               f"stopped at step {self.step_num}, before the end of the window ({self.end})")
        self._done = True
        self._after_stop()

    def __enter__(self) -> "StepWindow":
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> bool:
        self.stop(exc)
        return False  # the user's exception propagates unchanged

    def __call__(self, fn: Callable) -> Callable:
        """Decorate a step function: each call is one step."""

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            self.start()
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:
                self.stop(exc)
                raise
            self.step()
            return result

        return wrapper
