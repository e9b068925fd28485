"""``trace``: record the host ET and the Kineto trace of chosen training steps, per rank.

Why the profiler is driven by hand: ``torch.profiler.profile(schedule=...,
execution_trace_observer=..., on_trace_ready=...)`` with the default ``repeat=0`` restarts its
cycle forever; when the loop ends right as a new cycle enters its active phase, the exit calls
``on_trace_ready`` a second time with an empty Kineto trace, which overwrites the good one,
while the ET (which accumulates across cycles) stays full (reproduced in
tests/collectors/test_profiler_schedule_pitfall.py). Here there is no schedule: one
``profile`` object (no schedule) and one ``ExecutionTraceObserver`` exist only for the window;
``prepare_trace`` runs one step early (warm-up), ``start_trace`` at the first chosen step starts
Kineto and the observer together (so ET ``rf_id`` == Kineto ``Record function id``), and
``stop_trace`` at the end of the last chosen step stops both. Outside the window no profiler
object, observer or hook exists.
"""

from __future__ import annotations

import logging
import os
import platform
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from ..files import atomic_write_json, temp_path
from ..window import StepWindow, guarded
from . import manifest as mf
from .groups import GroupAnnotator
from .moe import CLOCK as ROUTING_CLOCK
from .moe import SIDECAR_FORMAT, RoutingRecorder

log = logging.getLogger("chakra_hooks.collectors.torch")

CLOCKS = {
    "host_et": "start_ts/finish_ts: monotonic ms",
    "kineto": "unix ns: baseTimeNanoseconds + ts*1000 (CLOCK_REALTIME)",
    "routing": ROUTING_CLOCK,
}


def _rank_and_world() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def _process_groups() -> list[dict]:
    """Process groups as torch records them for the ET (``pg_name``, ``ranks``, ...)."""
    try:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return []
        world = dist.distributed_c10d._world
        out = []
        for pg, name in world.pg_names.items():
            ranks = sorted(dist.get_process_group_ranks(pg))
            desc = str(getattr(pg, "group_desc", "") or "")
            out.append({"pg_name": str(name), "pg_desc": desc, "ranks": ranks,
                        "group_size": len(ranks)})
        return sorted(out, key=lambda g: (len(g["pg_name"]), g["pg_name"]))
    except Exception as exc:  # private API: never fail the capture over it
        log.warning("chakra-hooks: could not list process groups: %s", exc)
        return []


def _megatron_layout() -> dict[str, int]:
    """Tensor / pipeline / expert / data-parallel ranks and sizes when Megatron-core's
    parallel_state is initialised (NeMo 2, Megatron-Bridge); {} otherwise. Read only if the
    job imported Megatron already."""
    ps = sys.modules.get("megatron.core.parallel_state")
    try:
        if ps is None or not ps.model_parallel_is_initialized():
            return {}
        out = {}
        for key, rank, size in (
                ("tp", "get_tensor_model_parallel_rank", "get_tensor_model_parallel_world_size"),
                ("pp", "get_pipeline_model_parallel_rank",
                 "get_pipeline_model_parallel_world_size"),
                ("ep", "get_expert_model_parallel_rank", "get_expert_model_parallel_world_size"),
                ("dp", "get_data_parallel_rank", "get_data_parallel_world_size")):
            if hasattr(ps, rank) and hasattr(ps, size):
                out[f"{key}_rank"], out[f"{key}_size"] = int(getattr(ps, rank)()), \
                    int(getattr(ps, size)())
        return out
    except Exception as exc:  # a private layout of another Megatron release: no layout
        log.warning("chakra-hooks: could not read Megatron's parallel layout: %s", exc)
        return {}


def _distributed() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


# torch 2.13 stores a contextvars.Context in thread-local state during every backward
# (torch/autograd/graph.py, _engine_run_backward), and a gloo work started then (DDP's bucket
# all-reduces, from autograd hooks) keeps a copy of that state. The gloo worker that finishes
# such a work drops it holding its queue's lock and needs the GIL to release the Context. If the
# program frees its model (the DDP reducer, the last owner of the group) before that worker got
# the GIL, ~ProcessGroupGloo joins the worker while holding the GIL: a deadlock (the worker's
# stack: ~AsyncAllreduceWork -> ~ThreadLocalState -> SafePyObject decref -> take_gil). Untraced
# runs are exposed too; traced ones hung more often (4 of 43 against 0 of 43 here), since
# stopping the collector is what a program does right before freeing its model. So the
# collector, when it stops, lets a worker waiting for the GIL have it first.
GIL_HANDOFF_S = 0.02


def _hand_over_the_gil() -> None:
    import time

    time.sleep(GIL_HANDOFF_S)  # sleeping releases the GIL: a waiting gloo worker takes it


def _profiler_enabled() -> bool:
    import torch

    return bool(torch.autograd._profiler_enabled())


def _check_no_other_profiler() -> None:
    # torch lets a second profiler start silently and the first one then loses all its events
    # (seen on 2.13): never do that to the user's own profiler.
    if _profiler_enabled():
        raise RuntimeError("another torch profiler is already active in this process; "
                           "not recording (starting ours would discard its events)")


def _versions() -> dict[str, str]:
    import torch

    from chakra_hooks import __version__

    v = {"torch": torch.__version__, "python": platform.python_version(),
         "chakra_hooks": __version__}
    tf = sys.modules.get("transformers")
    if tf is not None:
        v["transformers"] = getattr(tf, "__version__", "?")
    return v


def _looks_complete_json(path: Path) -> bool:
    """Cheap check that a JSON file was written to the end (no full parse)."""
    try:
        size = path.stat().st_size
        if size < 2:
            return False
        with open(path, "rb") as f:
            f.seek(max(0, size - 64))
            return f.read().rstrip().endswith((b"}", b"]"))
    except OSError:
        return False


# torch.distributed.nn.functional's collective wrappers take ``group=group.WORLD`` as a default,
# evaluated when the module is imported. The profiler's prepare_trace imports it (through
# ``hasattr(torch, "_inductor")``); after init_process_group, those ten defaults hold the live
# default group for good, so destroy_process_group cannot free it, gloo's threads outlive it and
# a process exiting while one of them takes the GIL aborts ("terminate called without an
# active exception"). Plain torch.profiler does the same to every profiled gloo job.
_FUNCTIONAL = "torch.distributed.nn.functional"


def unpin_default_group() -> int:
    """Give torch.distributed.nn.functional's wrappers ``group=None`` (the default group, as
    every c10d call reads it) in place of the live default group their defaults captured when
    the profiler imported the module. Same meaning; the group can be freed. Returns how many
    functions were changed."""
    module = sys.modules.get(_FUNCTIONAL)
    if module is None:
        return 0
    import torch.distributed as dist

    world = dist.group.WORLD if dist.is_available() and dist.is_initialized() else None
    if world is None:
        return 0
    changed = 0
    for fn in list(vars(module).values()):
        defaults = getattr(fn, "__defaults__", None)
        if defaults and any(d is world for d in defaults):
            fn.__defaults__ = tuple(None if d is world else d for d in defaults)
            changed += 1
    return changed


@dataclass
class _Session:
    """Everything that exists only while a window is being recorded."""

    rank: int
    world_size: int
    prof: Any = None
    et: Any = None
    routing: RoutingRecorder | None = None
    groups: GroupAnnotator | None = None
    step_rf: Any = None
    steps: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    started: bool = False


class Trace(StepWindow):
    """Context manager, decorator, or start()/step()/stop() object; see :func:`trace`."""

    def __init__(
        self,
        outdir: str | os.PathLike,
        steps: Iterable[int] = range(10, 12),
        ranks: Iterable[int] | None = None,
        convert: bool | str | os.PathLike = False,
        *,
        model: Any = None,
        routing: bool = True,
        ep_size: int | None = None,
        warmup: bool = True,
        record_shapes: bool = False,
        routing_training_only: bool = False,
    ) -> None:
        super().__init__(steps)
        self.outdir = Path(outdir)
        self.ranks = None if ranks is None else sorted({int(r) for r in ranks})
        self.convert = convert
        if model is not None and not isinstance(model, (list, tuple)):
            model = [model]
        self.models = None if model is None else list(model)
        self.routing = routing
        self.ep_size = ep_size
        self.warmup = warmup
        self.record_shapes = record_shapes
        self.routing_training_only = routing_training_only
        self.complete: bool | None = None  # set when the window has been written
        self.wrote_run_manifest = False
        self._session: _Session | None = None

    # -- StepWindow hooks -------------------------------------------------------------------
    def _end_step(self) -> None:
        s = self._session
        if s is not None and s.step_rf is not None:
            self._guard(s, "closing the step annotation", self._close_step_rf, s)

    def _window_open(self) -> bool:
        return self._session is not None

    def _finish_early(self, why: str) -> None:
        self._finish(error=why)

    def _after_stop(self) -> None:
        if self.convert and self.wrote_run_manifest:
            self._convert()
        if _distributed():
            _hand_over_the_gil()

    # -- window state machine ----------------------------------------------------------------
    def _advance(self) -> None:
        n = self.step_num
        if self._session is None and not self._done:
            if n == self.first - 1 and self.warmup or n == self.first:
                self._prepare()
        s = self._session
        if s is None:
            return
        if n == self.first and not s.started:
            if not self._guard(s, "starting the profiler", self._begin, s):
                self._finish(error=None)  # nothing to record: write the manifest, drop it all
                return
        if n >= self.end:
            self._finish(error=None)
            return
        if s.started:
            self._guard(s, "opening the step annotation", self._open_step_rf, s, n)

    def _guard(self, s: _Session, what: str, fn: Callable, *args) -> bool:
        """Run a tracing action; a failure is logged and recorded, never raised."""
        return guarded(log, s.errors, what, fn, *args, context=f"rank {s.rank}: ")

    def _prepare(self) -> None:
        rank, world = _rank_and_world()
        if self.ranks is not None and rank not in self.ranks:
            self._done = True  # this rank records nothing and writes nothing
            return
        s = _Session(rank, world)
        self._session = s
        if not self._guard(s, "preparing the profiler", self._prepare_profiler, s):
            self._finish(error=None)  # the manifest says why this rank has no capture

    def _prepare_profiler(self, s: _Session) -> None:
        import torch
        from torch.profiler import ExecutionTraceObserver, ProfilerActivity, profile

        _check_no_other_profiler()
        self.outdir.mkdir(parents=True, exist_ok=True)
        # A rank file left by an earlier run into this directory must not be merged as ours.
        (self.outdir / mf.rank_manifest_name(s.rank)).unlink(missing_ok=True)
        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        if not os.access(self.outdir, os.W_OK):
            raise PermissionError(f"cannot write into {self.outdir}")
        et = ExecutionTraceObserver()
        et.register_callback(str(self._tmp(self._et_name(s.rank))))
        if not et.is_registered:
            raise RuntimeError("the ExecutionTraceObserver did not register (another one is "
                               "registered in this process, or its file cannot be opened)")
        s.et = et
        s.prof = profile(activities=activities, execution_trace_observer=et,
                         record_shapes=self.record_shapes)
        s.prof.prepare_trace()  # Kineto warm-up: its start-up cost lands before the window
        # Whoever imported the module (the profiler, or the program before us): the same
        # meaning, and the group can be freed. A program that imports it later pins it anew;
        # _finish unpins again.
        unpin_default_group()

    def _begin(self, s: _Session) -> None:
        if s.prof is None:
            return
        _check_no_other_profiler()
        s.prof.start_trace()  # starts the ET observer and Kineto together
        s.started = True
        if self.routing:
            s.routing = RoutingRecorder(self.models, self.ep_size,
                                        training_only=self.routing_training_only)
            s.routing.activate()
        if _distributed():
            s.groups = GroupAnnotator()
            s.groups.activate()

    def _open_step_rf(self, s: _Session, n: int) -> None:
        import torch

        s.steps.append(n)
        if s.routing is not None:
            s.routing.new_step(n)
        s.step_rf = torch.autograd.profiler.record_function(f"ProfilerStep#{n}")
        s.step_rf.__enter__()

    def _close_step_rf(self, s: _Session) -> None:
        rf, s.step_rf = s.step_rf, None
        rf.__exit__(None, None, None)

    # -- writing -------------------------------------------------------------------------------
    def _et_name(self, rank: int) -> str:
        return f"host_et.rank{rank}.json"

    def _kineto_name(self, rank: int) -> str:
        return f"kineto.rank{rank}.pt.trace.json"

    def _routing_name(self, rank: int) -> str:
        return f"routing.rank{rank}.json"

    def _tmp(self, name: str) -> Path:
        return temp_path(self.outdir / name)

    def _finish(self, error: str | None) -> None:
        """Stop everything, write this rank's files and manifests. Never raises."""
        s = self._session
        if s is None:
            return
        if error:
            s.errors.append(error)
        files: dict[str, str | None] = {"host_et": None, "kineto": None, "routing": None}
        if s.step_rf is not None:
            self._guard(s, "closing the step annotation", self._close_step_rf, s)
        routing_records: list[dict] = []
        if s.routing is not None:
            self._guard(s, "removing router hooks", s.routing.deactivate)
        if s.groups is not None:
            self._guard(s, "unwrapping the collectives", s.groups.deactivate)
            s.groups = None
        if s.prof is not None and s.started:
            self._guard(s, "stopping the profiler", s.prof.stop_trace)
            self._guard(s, "writing the Kineto trace", self._write_kineto, s, files)
        self._guard(s, "freeing the default process group", unpin_default_group)
        if s.routing is not None:
            self._guard(s, "copying routing bins",
                        lambda: routing_records.extend(s.routing.records()))
            if s.routing.errors:
                s.errors.append(f"routing bins: {len(s.routing.errors)} router call(s) not "
                                f"counted ({s.routing.errors[0]})")
        self._guard(s, "writing the host ET", self._write_et, s, files)
        if routing_records:
            self._guard(s, "writing routing bins", self._write_routing, s, routing_records, files)
        self._release(s)
        self._guard(s, "writing the manifest", self._write_manifests, s, files)
        self.complete = not s.errors

    def _write_kineto(self, s: _Session, files: dict) -> None:
        name = self._kineto_name(s.rank)
        tmp = self._tmp(name)
        s.prof.export_chrome_trace(str(tmp))
        if not _looks_complete_json(tmp):
            raise OSError(f"Kineto trace {tmp} was not written completely")
        os.replace(tmp, self.outdir / name)
        files["kineto"] = name

    def _write_et(self, s: _Session, files: dict) -> None:
        if s.et is None:
            return
        name = self._et_name(s.rank)
        tmp = self._tmp(name)
        s.et.unregister_callback()  # finalises the file
        s.et = None
        if not s.started:
            tmp.unlink(missing_ok=True)
            return
        if not _looks_complete_json(tmp):
            raise OSError(f"host ET {tmp} was not written completely (disk full?)")
        os.replace(tmp, self.outdir / name)
        files["host_et"] = name

    def _write_routing(self, s: _Session, records: list[dict], files: dict) -> None:
        name = self._routing_name(s.rank)
        obj = {"format": SIDECAR_FORMAT, "rank": s.rank, "clock": ROUTING_CLOCK,
               "records": records}
        atomic_write_json(self.outdir / name, obj)
        files["routing"] = name

    def _write_manifests(self, s: _Session, files: dict) -> None:
        entry = {
            "rank": s.rank, "world_size": s.world_size, "framework": "pytorch",
            "versions": _versions(), "steps": s.steps, "complete": not s.errors,
            "error": "; ".join(s.errors) or None, "files": files,
            "process_groups": _process_groups(), "clocks": CLOCKS, "pid": os.getpid(),
            "host": mf.host_identity(),
        }
        megatron = _megatron_layout()
        if megatron:
            entry["megatron"] = megatron
        self.outdir.mkdir(parents=True, exist_ok=True)
        mf.write_rank_manifest(self.outdir, entry)
        expected = [r for r in range(s.world_size) if self.ranks is None or r in self.ranks]
        self.wrote_run_manifest = mf.update_run_manifest(self.outdir, expected)

    def _release(self, s: _Session) -> None:
        """Drop every profiler object so nothing runs after the window."""
        if s.prof is not None and not s.started and not _profiler_enabled():
            # Prepared (warm-up) but never started: Kineto must be shut down properly, or the
            # next profiler in this process finds it half-initialised.
            try:
                s.prof.start_trace()
                s.prof.stop_trace()
            except Exception as exc:
                log.warning("chakra-hooks: rank %s: shutting down the profiler: %s", s.rank, exc)
        if s.et is not None:
            try:
                s.et.unregister_callback()
            except Exception as exc:
                log.warning("chakra-hooks: rank %s: unregistering the ET observer: %s", s.rank, exc)
            self._tmp(self._et_name(s.rank)).unlink(missing_ok=True)
        s.et = None
        s.prof = None
        s.routing = None
        self._session = None
        self._done = True

    def _convert(self) -> None:
        """Run the converter on the whole capture (by the rank that completed the manifest)."""
        out = self.outdir / "chakra" if self.convert is True else Path(self.convert)
        try:
            from chakra_hooks.convert import convert_paths

            convert_paths([self.outdir], out, progress=False, overwrite=True)  # its own folder
            log.info("chakra-hooks: converted %s into %s", self.outdir, out)
        except Exception as exc:
            log.warning("chakra-hooks: converting %s failed: %s", self.outdir, exc)


def trace(
    outdir: str | os.PathLike,
    steps: Iterable[int] = range(10, 12),
    ranks: Iterable[int] | None = None,
    convert: bool | str | os.PathLike = False,
    **options: Any,
) -> Trace:
    """Record steps ``steps`` (consecutive; counted by ``.step()`` calls from 0) of a run.

    Writes, for every chosen rank (all by default), the host ET, the Kineto trace of the same
    window, the MoE routing bins (when routers ran) and the manifests into ``outdir``.
    Use a fresh ``outdir`` per run: files of an earlier run with more ranks would stay beside.
    ``convert``: when the run ends, the rank that completes the run manifest converts the
    capture into Chakra ETs (``True``: into ``<outdir>/chakra``; or a directory path).
    Options: ``model`` (module(s) to search for routers; without it every module call in the
    window is checked), ``routing`` (False: no router hooks), ``ep_size`` (expert-parallel
    size for per-EP-rank counts), ``warmup`` (start Kineto one step early; default True),
    ``record_shapes``, ``routing_training_only`` (count routers only in training-mode forward
    passes, not in eval-mode calls or activation recomputation).
    """
    return Trace(outdir, steps, ranks, convert, **options)
