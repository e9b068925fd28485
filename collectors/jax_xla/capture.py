"""``trace``: profile chosen steps of a JAX loop with jax.profiler and keep the HLO beside it.

Layout written into ``outdir`` (the profiler's log dir)::

    <outdir>/plugins/profile/<session>/<host>.xplane.pb       jax.profiler (device + host trace)
    <outdir>/plugins/profile/<session>/<host>.trace.json.gz   jax.profiler (same, Chrome JSON)
    <outdir>/plugins/profile/<session>/<module>.<id>.hlo.txt  optimised HLO of each module run
    <outdir>/jax_manifest.json                                run manifest (jax_manifest.p<i>.json
                                                              per process when there are several)

With several JAX processes (multi-host, or several processes on one host) each process's
profile goes under ``<outdir>/process_<i>/plugins/...``: jax.profiler names a profile after the
host alone, so two processes of one host would write one file. The manifests, which give each
process's devices their global ids (hence the ETs' ranks), stay in ``<outdir>``.

Steps are counted by ``.step()`` calls from 0; the profiler runs from the start of step
``steps[0]`` to the end of step ``steps[-1]``, each step inside a
``jax.profiler.StepTraceAnnotation`` so that XProf's step view works. Tracing problems are
logged and recorded in the manifest (``complete: false``), never raised into the loop; the
user's own exceptions propagate unchanged. jax is imported only when a window starts.
"""

from __future__ import annotations

import logging
import os
import platform
import time
from pathlib import Path
from typing import Any, Callable, Iterable

from ..files import atomic_write_json
from ..window import StepWindow, guarded
from . import hlo_dump

log = logging.getLogger("chakra_hooks.collectors.jax_xla")

MANIFEST_FORMAT = "chakra-hooks-jax-capture/1"
CLOCK = ("xspace session clock: event = line timestamp_ns*1000 + offset_ps (ps since the "
         "profile start; epoch start in Task Environment profile_start_time)")


def manifest_name(process_index: int, process_count: int) -> str:
    return "jax_manifest.json" if process_count <= 1 else f"jax_manifest.p{process_index}.json"


class Trace(StepWindow):
    """Context manager, decorator, or start()/step()/stop() object; see :func:`trace`."""

    def __init__(self, outdir: str | os.PathLike, steps: Iterable[int] = range(10, 12),
                 convert: bool = False, *, name: str = "train") -> None:
        super().__init__(steps)
        self.outdir = Path(outdir)
        self.convert = convert
        self.name = name
        self.steps: list[int] = []
        self.errors: list[str] = []
        self.complete: bool | None = None
        self._registered: list[tuple[Any, tuple, dict]] = []
        self._active = False
        self._annotation: Any = None
        self._before: set[Path] = set()
        self._t0 = 0.0

    # -- public API -------------------------------------------------------------------------
    def register(self, fn: Any, *args: Any, **kwargs: Any) -> None:
        """A jitted function and example arguments: its compiled HLO text is saved when the
        profile itself carries no HLO (``fn.lower(*args, **kwargs).compile().as_text()``)."""
        self._registered.append((fn, args, kwargs))

    # -- StepWindow hooks -------------------------------------------------------------------
    def _end_step(self) -> None:
        self._guard("closing the step annotation", self._close_annotation)

    def _window_open(self) -> bool:
        return self._active

    def _finish_early(self, why: str) -> None:
        self._finish(why)

    # -- window ----------------------------------------------------------------------------
    def _advance(self) -> None:
        n = self.step_num
        if n == self.first and not self._active and not self._done:
            if not self._guard("starting jax.profiler", self._begin):
                self._finish(None)
                return
        if not self._active:
            return
        if n >= self.end:
            self._finish(None)
            return
        self._guard("opening the step annotation", self._open_annotation, n)

    def _guard(self, what: str, fn: Callable, *args: Any) -> bool:
        return guarded(log, self.errors, what, fn, *args)

    def _log_dir(self) -> Path:
        import jax

        count = jax.process_count()
        return self.outdir if count <= 1 else self.outdir / f"process_{jax.process_index()}"

    def _begin(self) -> None:
        import jax

        self.outdir.mkdir(parents=True, exist_ok=True)
        self._before = set(self._log_dir().glob("plugins/profile/*/*.xplane.pb"))
        self._t0 = time.time()
        jax.profiler.start_trace(str(self._log_dir()))
        self._active = True

    def _open_annotation(self, n: int) -> None:
        import jax

        self.steps.append(n)
        self._annotation = jax.profiler.StepTraceAnnotation(self.name, step_num=n)
        self._annotation.__enter__()

    def _close_annotation(self) -> None:
        ann, self._annotation = self._annotation, None
        if ann is not None:
            ann.__exit__(None, None, None)

    def _finish(self, error: str | None) -> None:
        """Stop the profiler, save HLO sidecars and the manifest. Never raises."""
        if error:
            self.errors.append(error)
        self._guard("closing the step annotation", self._close_annotation)
        files: dict[str, Any] = {"xspace": [], "trace_json": [], "hlo": {}}
        hlo_source = "none"
        if self._active:
            self._active = False
            if self._guard("stopping jax.profiler", self._stop_profiler):
                new = sorted(set(self._log_dir().glob("plugins/profile/*/*.xplane.pb")) - self._before)
                if not new:
                    self.errors.append("jax.profiler wrote no .xplane.pb")
                for xplane in new:
                    files["xspace"].append(self._rel(xplane))
                    twin = xplane.with_name(xplane.name.replace(".xplane.pb", ".trace.json.gz"))
                    if twin.exists():
                        files["trace_json"].append(self._rel(twin))
                    hlo_source = self._save_hlo(xplane, files["hlo"]) or hlo_source
        self._done = True
        self.complete = not self.errors
        self._guard("writing the manifest", self._write_manifest, files, hlo_source)
        if self.convert:
            self._guard("converting", self._convert)

    def _stop_profiler(self) -> None:
        import jax

        jax.profiler.stop_trace()

    def _save_hlo(self, xplane: Path, out: dict[str, str]) -> str | None:
        written: dict[str, str] = {}
        source = None
        if self._guard("saving HLO from the XSpace", lambda: written.update(hlo_dump.save_from_xspace(xplane))) \
                and written:
            source = hlo_dump.SOURCE_XSPACE
        elif self._registered and self._guard(
                "compiling registered functions for their HLO",
                lambda: written.update(hlo_dump.save_registered(xplane.parent, self._registered))):
            source = hlo_dump.SOURCE_COMPILE if written else None
        for name, key in written.items():
            out[self._rel(xplane.parent / name)] = key
        return source

    def _rel(self, path: Path) -> str:
        return str(path.relative_to(self.outdir))

    def _write_manifest(self, files: dict[str, Any], hlo_source: str) -> None:
        import jax

        from chakra_hooks import __version__

        pcount, pindex = jax.process_count(), jax.process_index()
        manifest = {
            "format": MANIFEST_FORMAT, "framework": "jax",
            "versions": {"jax": jax.__version__, "jaxlib": _jaxlib_version(),
                         "python": platform.python_version(), "chakra_hooks": __version__},
            "process_index": pindex, "process_count": pcount,
            "devices": [{"id": d.id, "platform": d.platform, "kind": getattr(d, "device_kind", ""),
                         "process_index": d.process_index} for d in jax.devices()],
            # global ids of this process's devices, by local ordinal: the ETs' ranks
            "local_device_ids": [d.id for d in sorted(jax.local_devices(), key=_local_ordinal)],
            "steps_requested": [self.first, self.end], "steps": self.steps,
            "complete": not self.errors, "errors": self.errors, "files": files,
            "hlo_source": hlo_source,
            "hlo_modules": {Path(k).name: v for k, v in files["hlo"].items()},
            "clock": CLOCK, "started_unix_s": self._t0, "pid": os.getpid(),
        }
        atomic_write_json(self.outdir / manifest_name(pindex, pcount), manifest)

    def _convert(self) -> None:
        from chakra_hooks.convert import convert_paths

        convert_paths([self.outdir], self.outdir / "chakra", progress=False)


def _local_ordinal(device: Any) -> int:
    hw = getattr(device, "local_hardware_id", None)
    return hw if isinstance(hw, int) else device.id


def _jaxlib_version() -> str:
    try:
        import jaxlib

        return getattr(jaxlib, "__version__", "?")
    except ImportError:
        return "?"


def trace(outdir: str | os.PathLike, steps: Iterable[int] = range(10, 12), convert: bool = False,
          **options: Any) -> Trace:
    """Record steps ``steps`` (consecutive, counted by ``.step()`` calls from 0) of a JAX loop.

        import chakra_hooks.collectors.jax_xla as cj

        with cj.trace("runs/exp1", steps=range(10, 12)) as t:
            for batch in data:
                state = train_step(state, batch)
                t.step()

    Options: ``name`` (step annotation name, default "train"). ``t.register(fn, *args)`` adds a
    jitted function whose compiled HLO is saved if the profile carries none.
    """
    return Trace(outdir, steps, convert, **options)
