"""The vLLM plugin: ``register`` is the ``vllm.general_plugins`` entry point of this package.

vLLM runs it in every process it starts (API server, engine core, each worker; possibly more
than once per process). It only wraps three methods of vLLM's ``TorchProfilerWrapper``, so it
costs nothing until a user starts vLLM's own torch profiler
(``--profiler-config '{"profiler": "torch", "torch_profiler_dir": ...}'``, then
``/start_profile`` or ``LLM.start_profile()``). Then, in each worker:

- ``_start``: a :class:`~.capture.WorkerCapture` creates the folder and an
  ``ExecutionTraceObserver`` that vLLM's profile starts with Kineto, and hooks MoE routers;
- ``annotate_context_manager`` (vLLM's per-engine-step annotation): routing counts per step;
- ``_stop``: the ET is finished, the sidecars and manifests are written.

Acts only where the profiler writes to a local folder (a ``gs://`` / ``s3://`` folder gets a
warning and nothing of ours) and not for the frontend's CPU-only profiler. Nothing here raises
into vLLM: a failure is logged and recorded in the capture's manifest.
"""

from __future__ import annotations

import functools
import logging
import sys
from pathlib import Path
from typing import Any

log = logging.getLogger("chakra_hooks.collectors.vllm")

_PATCHED = "_chakra_hooks_patched"
# vLLM's AsyncLLM names its own (CPU-only, whole-session) profiler <host>_<pid>.async_llm.
_FRONTEND_SUFFIX = ".async_llm"
_warned: set[str] = set()


def register() -> None:
    """Entry point (group ``vllm.general_plugins``): wrap vLLM's torch profiler, once."""
    try:
        from vllm.profiler.wrapper import TorchProfilerWrapper
    except Exception as exc:  # another vLLM layout: leave vLLM untouched
        _warn_once("import", "chakra-hooks: vLLM plugin inactive (no "
                   f"vllm.profiler.wrapper.TorchProfilerWrapper: {exc})")
        return
    if getattr(TorchProfilerWrapper, _PATCHED, False):
        return
    TorchProfilerWrapper._start = _wrap_start(TorchProfilerWrapper._start)
    TorchProfilerWrapper._stop = _wrap_stop(TorchProfilerWrapper._stop)
    TorchProfilerWrapper.annotate_context_manager = _wrap_annotate(
        TorchProfilerWrapper.annotate_context_manager)
    setattr(TorchProfilerWrapper, _PATCHED, True)


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning(message)


def _wanted(wrapper: Any) -> Path | None:
    """The local folder to record into, or None where we do not act."""
    folder = getattr(wrapper, "_torch_profiler_trace_dir", None)
    name = str(getattr(wrapper, "_worker_name", ""))
    if not folder or name.endswith(_FRONTEND_SUFFIX):
        return None
    if "://" in str(folder):
        _warn_once("uri", f"chakra-hooks: profiler folder {folder} is not a local path; "
                          "recording vLLM's own trace only (no host ET, routing or KV)")
        return None
    config = getattr(wrapper, "profiler_config", None)
    if getattr(config, "torch_profiler_with_stack", False):
        _warn_once("stack", "chakra-hooks: torch_profiler_with_stack is on (vLLM's default): "
                            "stopping the profiler can take minutes; set "
                            "torch_profiler_with_stack=false in --profiler-config")
    return Path(folder)


def _wrap_start(original: Any) -> Any:
    @functools.wraps(original)
    def _start(self: Any) -> None:
        capture = None
        try:
            folder = _wanted(self)
            if folder is not None:
                from .capture import WorkerCapture

                use_gzip = bool(getattr(self, "_torch_profiler_use_gzip", True))
                capture = WorkerCapture(folder, str(self._worker_name), use_gzip)
                capture.before_start(self._profiler_kwargs)
        except Exception as exc:  # never stop vLLM's own profiler from starting
            _warn_once("start", f"chakra-hooks: not recording a host ET: {exc}")
            capture = None
        self._chakra_capture = capture
        pinned_before = _FUNCTIONAL in sys.modules
        try:
            original(self)
            if not pinned_before:  # see collectors/torch/capture.py: unpin_default_group
                _unpin_default_group()
        except BaseException:
            if capture is not None:  # vLLM logs its own failure; ours must not linger
                capture.abandon()
                self._chakra_capture = None
            raise
        finally:
            # The observer must not outlive this profile (vLLM reuses the kwargs next time).
            self._profiler_kwargs.pop("execution_trace_observer", None)

    return _start


_FUNCTIONAL = "torch.distributed.nn.functional"


def _unpin_default_group() -> None:
    """torch's profiler, started by vLLM, imports torch.distributed.nn.functional, whose
    wrappers then hold the live default group: give it back (never fails vLLM's start)."""
    try:
        from chakra_hooks.collectors.torch.capture import unpin_default_group

        unpin_default_group()
    except Exception as exc:  # noqa: BLE001 (a tracing aid must not stop vLLM)
        _warn_once("unpin", f"chakra-hooks: could not release the default process group: {exc}")


def _wrap_stop(original: Any) -> Any:
    @functools.wraps(original)
    def _stop(self: Any) -> None:
        try:
            original(self)
        finally:
            capture = getattr(self, "_chakra_capture", None)
            self._chakra_capture = None
            if capture is not None:
                capture.after_stop()

    return _stop


def _wrap_annotate(original: Any) -> Any:
    @functools.wraps(original)
    def annotate_context_manager(self: Any, name: str) -> Any:
        capture = getattr(self, "_chakra_capture", None)
        if capture is not None and self.should_annotate:
            capture.guard("counting an engine step", capture.on_step, name)
        return original(self, name)

    return annotate_context_manager
