"""One vLLM worker's recording window: the host ET beside vLLM's own Kineto trace, MoE routing
bins, KV-cache transfers and the manifests, started and stopped with vLLM's torch profiler.

vLLM builds ``torch.profiler.profile`` itself (``TorchProfilerWrapper._start``) and has no
registry for extra profiler options, so :mod:`.plugin` calls :meth:`WorkerCapture.before_start`
just before that ``_start`` (which hands our ``ExecutionTraceObserver`` to the profile as
``execution_trace_observer``: the profile starts and stops it with Kineto, so ET ``rf_id`` ==
Kineto ``Record function id``) and :meth:`WorkerCapture.after_stop` right after ``_stop``
(vLLM calls ``profile.stop()``, not ``__exit__``, so torch never unregisters the observer and
the ET would stay unfinished; the Kineto file exists only once ``_stop`` has returned).

Files, in vLLM's ``torch_profiler_dir`` (named after vLLM's worker name so that ``convert``
pairs them even without the manifest)::

    <worker>.<ns>.pt.trace.json.gz      vLLM's Kineto trace (vLLM writes it)
    <worker>.<ns>.et.json[.gz]          host ET of the same window (ours)
    <worker>.<ns>.routing.json          MoE routing bins per layer and engine step (MoE models)
    <worker>.<ns>.kv.json               KV-cache loads / stores (with ChakraKVConnector)
    rank-<r>.manifest.json, manifest.json

Every step here is guarded: a tracing failure is logged once and marked in the manifest, and
vLLM keeps serving. Nothing is imported from vLLM or torch at module level.
"""

from __future__ import annotations

import gzip
import logging
import os
import re
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any

from ..files import atomic_write_json, temp_path
from ..torch import manifest as mf
from ..torch.capture import _looks_complete_json
from ..torch.moe import CLOCK as UNIX_CLOCK
from ..window import guarded

log = logging.getLogger("chakra_hooks.collectors.vllm")

KV_FORMAT = "chakra-hooks-kv/1"
CLOCKS = {
    "host_et": "start_ts/finish_ts: monotonic ms",
    "kineto": "unix ns: baseTimeNanoseconds + ts*1000 (CLOCK_REALTIME)",
    "routing": UNIX_CLOCK,
    "kv": UNIX_CLOCK,
}
_RANK_IN_NAME = re.compile(r"rank(\d+)$")
_PARALLEL_IN_NAME = re.compile(r"(dp|pp|tp|dcp|ep)(\d+)")

_current: "WorkerCapture | None" = None  # the window recording in this process, if any


def current() -> "WorkerCapture | None":
    """The capture recording right now in this process (read by the KV connector)."""
    return _current


def _find_worker() -> Any:
    """vLLM's worker object whose profiler is starting, from the calling frames.

    ``TorchProfilerWrapper`` holds no reference to its worker, and the worker's ``profile()``
    (or ``annotate_profile()`` for a delayed start) is on the stack when ``_start`` runs: its
    ``self`` has the model runner (the model, for its MoE routers) and the parallel config."""
    frame = sys._getframe(1)
    for _ in range(16):
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        if owner is not None and hasattr(owner, "model_runner") and hasattr(owner, "vllm_config"):
            return owner
        frame = frame.f_back
    return None


def _versions() -> dict[str, str]:
    import platform

    import torch

    from chakra_hooks import __version__

    versions = {"torch": torch.__version__, "python": platform.python_version(),
                "chakra_hooks": __version__}
    vllm = sys.modules.get("vllm")
    if vllm is not None:
        versions["vllm"] = str(getattr(vllm, "__version__", "?"))
    return versions


def _rank_and_world(worker_name: str, worker: Any) -> tuple[int, int]:
    rank = getattr(worker, "rank", None)
    if rank is None:
        found = _RANK_IN_NAME.search(worker_name)
        rank = int(found.group(1)) if found else 0
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return int(rank), dist.get_world_size()
    except Exception:  # vLLM's own process groups are what matters; fall back to its config
        pass
    parallel = getattr(getattr(worker, "vllm_config", None), "parallel_config", None)
    return int(rank), int(getattr(parallel, "world_size", 1) or 1)


def _layout(worker_name: str, worker: Any) -> dict[str, Any]:
    """vLLM's parallel layout and model, for the manifest."""
    config = getattr(worker, "vllm_config", None)
    parallel = getattr(config, "parallel_config", None)
    model = getattr(config, "model_config", None)
    out: dict[str, Any] = {"worker_name": worker_name,
                           "ranks_in_groups": {k: int(v) for k, v in
                                               _PARALLEL_IN_NAME.findall(worker_name)}}
    for key in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size",
                "enable_expert_parallel", "world_size"):
        value = getattr(parallel, key, None)
        if value is not None:
            out[key] = value
    if model is not None:
        out["model"] = str(getattr(model, "served_model_name", None) or getattr(model, "model", ""))
        out["dtype"] = str(getattr(model, "dtype", ""))
    return out


class WorkerCapture:
    """What one profiling window of one vLLM worker records (see the module docstring)."""

    def __init__(self, outdir: Path, worker_name: str, use_gzip: bool) -> None:
        self.outdir = outdir
        self.worker_name = worker_name
        self.use_gzip = use_gzip
        self.stamp = time.time_ns()
        self.worker = _find_worker()
        self.rank, self.world_size = _rank_and_world(worker_name, self.worker)
        self.errors: list[str] = []
        self.et: Any = None
        self.routing: Any = None
        self.steps: list[dict] = []  # engine steps seen: index, annotation, start_ns
        self.kv_records: list[dict] = []
        self.kv_lock = threading.Lock()
        self.files: dict[str, str | None] = {"host_et": None, "kineto": None, "routing": None,
                                             "kv": None}

    def _name(self, suffix: str) -> str:
        return f"{self.worker_name}.{self.stamp}.{suffix}"

    def guard(self, what: str, fn: Any, *args: Any) -> bool:
        return guarded(log, self.errors, what, fn, *args, context=f"vLLM rank {self.rank}: ")

    # -- window start ----------------------------------------------------------------------
    def before_start(self, profiler_kwargs: dict) -> None:
        """Create the folder and the ET observer, hand it to vLLM's profile; arm routing."""
        global _current
        self.guard("creating the ET observer", self._make_observer, profiler_kwargs)
        self.guard("hooking MoE routers", self._arm_routing)
        _current = self

    def _make_observer(self, profiler_kwargs: dict) -> None:
        from torch.profiler import ExecutionTraceObserver

        # The observer cannot create its file in a folder that does not exist yet (vLLM makes
        # it only when writing Kineto at the stop) and then silently records nothing.
        self.outdir.mkdir(parents=True, exist_ok=True)
        if not os.access(self.outdir, os.W_OK):
            raise PermissionError(f"cannot write into {self.outdir}")
        et = ExecutionTraceObserver()
        et.register_callback(str(temp_path(self.outdir / self._name("et.json"))))
        if not et.is_registered:
            raise RuntimeError("the ExecutionTraceObserver did not register (another one is "
                               "registered in this process, or its file cannot be opened)")
        self.et = et
        profiler_kwargs["execution_trace_observer"] = et

    def _arm_routing(self) -> None:
        model = _model_of(self.worker)
        if model is None:
            return
        from .routing import VllmRouting

        routing = VllmRouting.for_model(model)
        if routing is not None:
            routing.activate()
            self.routing = routing

    # -- during the window -----------------------------------------------------------------
    def on_step(self, annotation: str) -> None:
        """vLLM annotates an engine step: close the previous one's routing counts."""
        index = len(self.steps)
        now = time.time_ns()
        if self.steps:
            self.steps[-1]["end_ns"] = now
        self.steps.append({"index": index, "annotation": annotation, "start_ns": now,
                           "end_ns": None, "tid": threading.get_native_id()})
        if self.routing is not None:
            self.routing.end_step(self.steps[-2] if index else None)

    def add_kv_record(self, record: dict) -> None:
        with self.kv_lock:
            self.kv_records.append(record)

    def abandon(self) -> None:
        """vLLM's profiler failed to start: drop everything of ours, write nothing."""
        global _current
        if _current is self:
            _current = None
        et, self.et = self.et, None
        if et is not None:
            self.guard("unregistering the ET observer", et.unregister_callback)
            temp_path(self.outdir / self._name("et.json")).unlink(missing_ok=True)
        if self.routing is not None:
            self.guard("removing router captures", self.routing.deactivate)

    # -- window end ------------------------------------------------------------------------
    def after_stop(self) -> None:
        """Finish the ET, find vLLM's Kineto file, write sidecars and manifests. Never raises."""
        global _current
        if _current is self:
            _current = None
        if self.steps and self.steps[-1]["end_ns"] is None:
            self.steps[-1]["end_ns"] = time.time_ns()
        self.guard("writing the host ET", self._finish_et)
        self.guard("finding vLLM's Kineto trace", self._find_kineto)
        if self.routing is not None:
            self.guard("removing router captures", self.routing.deactivate)
            self.guard("writing routing bins", self._write_routing)
        if self.kv_records:
            self.guard("writing KV-cache records", self._write_kv)
        self.guard("writing the manifest", self._write_manifests)

    def _finish_et(self) -> None:
        et, self.et = self.et, None
        if et is None:
            return
        tmp = temp_path(self.outdir / self._name("et.json"))
        et.unregister_callback()
        if not _looks_complete_json(tmp):
            tmp.unlink(missing_ok=True)
            raise OSError(f"host ET {tmp} was not written completely (disk full?)")
        if self.use_gzip:
            final = self.outdir / self._name("et.json.gz")
            packed = temp_path(final)
            try:
                with open(tmp, "rb") as src, gzip.open(packed, "wb", compresslevel=3) as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
                os.replace(packed, final)
            finally:
                packed.unlink(missing_ok=True)
                tmp.unlink(missing_ok=True)
        else:
            final = self.outdir / self._name("et.json")
            os.replace(tmp, final)
        self.files["host_et"] = final.name

    def _find_kineto(self) -> None:
        """vLLM's tensorboard handler names the file ``<worker>.<ns>.pt.trace.json[.gz]``;
        ours is the newest of them written since this window started."""
        found = [p for p in self.outdir.glob(f"{self.worker_name}.*.pt.trace.json*")
                 if p.stat().st_mtime_ns >= self.stamp - 1_000_000_000]
        if not found:
            raise FileNotFoundError(f"no {self.worker_name}.*.pt.trace.json* in {self.outdir} "
                                    "after the profiler stopped")
        self.files["kineto"] = max(found, key=lambda p: p.stat().st_mtime_ns).name

    def _write_routing(self) -> None:
        from ..torch.moe import SIDECAR_FORMAT

        records = self.routing.records(self.steps)
        if self.routing.errors:
            self.errors.append(f"routing bins: {len(self.routing.errors)} router call(s) not "
                               f"counted ({self.routing.errors[0]})")
        if not records:
            return
        name = self._name("routing.json")
        atomic_write_json(self.outdir / name, {"format": SIDECAR_FORMAT, "rank": self.rank,
                                               "clock": UNIX_CLOCK, "records": records})
        self.files["routing"] = name

    def _write_kv(self) -> None:
        name = self._name("kv.json")
        with self.kv_lock:
            records = list(self.kv_records)
        atomic_write_json(self.outdir / name, {"format": KV_FORMAT, "rank": self.rank,
                                               "clock": UNIX_CLOCK, "records": records})
        self.files["kv"] = name

    def _write_manifests(self) -> None:
        entry = {
            "rank": self.rank, "world_size": self.world_size, "framework": "vllm",
            "versions": _versions(), "steps": [s["index"] for s in self.steps],
            "complete": not self.errors, "error": "; ".join(self.errors) or None,
            "files": self.files, "process_groups": [], "clocks": CLOCKS, "pid": os.getpid(),
            "vllm": _layout(self.worker_name, self.worker),
            "host": mf.host_identity(),
        }
        mf.write_rank_manifest(self.outdir, entry)
        mf.update_run_manifest(self.outdir, list(range(self.world_size)))


def _model_of(worker: Any) -> Any:
    runner = getattr(worker, "model_runner", None)
    if runner is None:
        return None
    try:
        return runner.get_model()
    except Exception:  # not loaded yet, or a runner without get_model
        return getattr(runner, "model", None)
