"""Which modules are compiled (setup.py builds them with Cython), and when to run their source.

A compiled module is built from the very ``.py`` file beside it, so either runs the same code.
Two cases must still run the source:

- a source checkout (an editable install) where a ``.py`` changed after ``pip install -e .``
  compiled it: Python's import system would keep loading the stale compiled copy;
- ``CHAKRA_HOOKS_PURE_PYTHON=1`` in the environment, to compare or debug the two.

:func:`install` puts a finder in front of the import system that serves these modules from
their source in those cases and otherwise leaves importing to Python.
"""

from __future__ import annotations

import os
import sys
from importlib.machinery import EXTENSION_SUFFIXES, PathFinder, SourceFileLoader, ModuleSpec
from importlib.util import spec_from_file_location
from pathlib import Path

# (module, source in the repository): the per-event and per-node loops of reading, linking
# and converting. setup.py compiles exactly these.
COMPILED = (
    ("chakra_hooks.linker.model", "linker/model.py"),
    ("chakra_hooks.linker.jsonio", "linker/jsonio.py"),
    ("chakra_hooks.linker.pytorch.kineto_events", "linker/pytorch/kineto_events.py"),
    ("chakra_hooks.linker.pytorch.kineto", "linker/pytorch/kineto.py"),
    ("chakra_hooks.linker.pytorch.et_nodes", "linker/pytorch/et_nodes.py"),
    ("chakra_hooks.linker.pytorch.et", "linker/pytorch/et.py"),
    ("chakra_hooks.linker.pytorch.match", "linker/pytorch/match.py"),
    ("chakra_hooks.linker.pytorch.comms", "linker/pytorch/comms.py"),
    ("chakra_hooks.linker.pytorch.edges", "linker/pytorch/edges.py"),
    ("chakra_hooks.linker.pytorch.waits", "linker/pytorch/waits.py"),
    ("chakra_hooks.linker.pytorch.link", "linker/pytorch/link.py"),
    ("chakra_hooks.linker.enrich.gaps", "linker/enrich/gaps.py"),
    ("chakra_hooks.linker.xla.xspace", "linker/xla/xspace.py"),
    ("chakra_hooks.linker.xla.devices", "linker/xla/devices.py"),
    ("chakra_hooks.linker.xla.link", "linker/xla/link.py"),
    ("chakra_hooks.linker.xla.hlo", "linker/xla/hlo.py"),
    ("chakra_hooks.converter.attrs", "converter/attrs.py"),
    ("chakra_hooks.converter.dag", "converter/dag.py"),
    ("chakra_hooks.converter.graph", "converter/graph.py"),
    ("chakra_hooks.converter.wire", "converter/wire.py"),
    ("chakra_hooks.converter.etio", "converter/etio.py"),
    ("chakra_hooks.converter.summary", "converter/summary.py"),
    ("chakra_hooks.converter.timeline", "converter/timeline.py"),
    # the run tools' per-node passes (the run model, the critical path, the run's replay)
    ("chakra_hooks.converter.run_model", "converter/run_model.py"),
    ("chakra_hooks.converter.stats", "converter/stats.py"),
    ("chakra_hooks.converter.whatif", "converter/whatif.py"),
)
PURE_ENV = "CHAKRA_HOOKS_PURE_PYTHON"
_NAMES = frozenset(name for name, _ in COMPILED)
_NO = frozenset(("0", "false", "no", "off"))


def _switch(name: str) -> str:
    """The environment variable ``name`` as a switch reads it ("" when unset)."""
    return os.environ.get(name, "").strip().lower()


def switched_on(name: str) -> bool:
    """Whether the environment variable ``name`` says yes: set to anything but nothing or a
    no (0, false, no, off). ``CHAKRA_HOOKS_PURE_PYTHON=0`` means compiled, as one reads it."""
    value = _switch(name)
    return bool(value) and value not in _NO


def switched_off(name: str) -> bool:
    """Whether the environment variable ``name`` says no (0, false, no, off)."""
    return _switch(name) in _NO


def is_compiled(module: object) -> bool:
    """Whether an imported module runs from a compiled extension."""
    origin = getattr(module, "__file__", None) or ""
    return origin.endswith(tuple(EXTENSION_SUFFIXES))


def compiled_status() -> str:
    """How many of the compilable modules run compiled in this process, e.g. "17 of 17"."""
    import importlib

    running = sum(is_compiled(importlib.import_module(name)) for name in _NAMES)
    return f"{running} of {len(_NAMES)}"


class _SourceWhenStale:
    # A meta path finder (importlib.abc.MetaPathFinder's protocol; importing that module costs
    # ~10 ms, on the import path of every collector).

    def find_spec(self, name: str, path: object = None, target: object = None) -> ModuleSpec | None:
        if name not in _NAMES:
            return None
        spec = PathFinder.find_spec(name, path)
        if spec is None or not spec.origin or not spec.origin.endswith(tuple(EXTENSION_SUFFIXES)):
            return None
        compiled = Path(spec.origin)
        source = compiled.with_name(name.rpartition(".")[2] + ".py")
        if not source.is_file():
            return None
        if not switched_on(PURE_ENV):
            # Only a source checkout edits sources after compiling; an installed wheel's files
            # are all written at once and are never stale.
            # linker/model.py is chakra_hooks.linker.model, linker/xla/link.py ...xla.link.
            checkout = compiled.parents[name.count(".") - 1]
            if not (checkout / "setup.py").is_file() or not _stale_build(checkout):
                return None
            # Silently: a warning line would break the CLI's one-line errors. Benchmarks
            # print compiled_status() instead.
        return spec_from_file_location(name, source, loader=SourceFileLoader(name, str(source)))


_stale: bool | None = None


def _stale_build(checkout: Path) -> bool:
    """Whether any compiled module of this checkout is missing or older than any compiled
    source or declarations file (``.pxd``: a module's own, or one it cimports, such as
    linker/pytorch/layouts.pxd). Then every module runs from source: compiled modules call the
    functions and classes another one declares directly, so a stale module and a fresh one
    cannot be mixed."""
    global _stale
    if _stale is None:
        # Each folder is listed once (the modules share a few): every process a checkout
        # starts asks this, and a glob per module took several times as long.
        listings: dict[str, dict[str, float]] = {}
        newest = 0.0  # of the sources and declarations
        built_times = []  # each module's newest compiled file
        for _, source in COMPILED:
            folder, name = os.path.split(os.path.join(checkout, source))
            files = listings.get(folder)
            if files is None:
                files = listings[folder] = _modified_times(folder)
                newest = max([newest, *(t for n, t in files.items() if n.endswith(".pxd"))])
            newest = max(newest, files.get(name, 0.0))
            prefix = name[:-len(".py")] + "."
            built = [t for n, t in files.items() if n.startswith(prefix) and n.endswith(_BUILT)]
            if not built:
                _stale = True
                return _stale
            built_times.append(max(built))
        _stale = newest > min(built_times)
    return _stale


_BUILT = tuple(EXTENSION_SUFFIXES)


def _modified_times(folder: str) -> dict[str, float]:
    """Name -> modification time of the sources, declarations and compiled files in
    ``folder`` (none if it cannot be listed)."""
    try:
        with os.scandir(folder) as entries:
            return {entry.name: entry.stat().st_mtime for entry in entries
                    if entry.name.endswith((".py", ".pxd", *_BUILT)) and entry.is_file()}
    except OSError:
        return {}


def install() -> None:
    if not any(isinstance(finder, _SourceWhenStale) for finder in sys.meta_path):
        sys.meta_path.insert(0, _SourceWhenStale())
