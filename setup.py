"""Build step for the compiled converter path (everything else is in pyproject.toml).

The linker and converter modules listed in ``chakra_hooks/_compiled.py`` are plain Python and
run as such. Where a C compiler is at hand, pip also compiles those same sources with Cython (a
build requirement, which pip fetches) into extension modules, which makes ``chakra-hooks
convert`` about 1.5x faster (docs/performance.md). At ``-O1`` that takes about 60 s of a 2-core
machine (2026-11-27, 20 modules; ``-O3``, Python's default, took 2.5x as long for 2.6 % fewer
instructions and no difference in measured time). The sources are plain Python; a few ``.pxd`` files beside them declare
the hottest helpers and classes to Cython (direct C calls instead of Python calls), and mean
nothing to Python. The one exception, linker/model.py's class decorators (ops and edges
untracked by the garbage collector), falls back to decorators that change nothing where
Cython is not installed. If any module fails to compile (no compiler, say), none is compiled and the
install is pure Python (a warning in pip's log, never a failed install).

``CHAKRA_HOOKS_PURE_PYTHON=1`` (or ``CHAKRA_HOOKS_COMPILE=0``; 1 / true / yes / on and
0 / false / no / off alike) at install time skips compiling,
and ``CHAKRA_HOOKS_PURE_PYTHON=1`` at run time runs the sources even where compiled copies
exist. In an editable install, a module edited after the install is imported from its source,
not from the stale compiled copy (chakra_hooks/_compiled.py), until ``pip install -e .`` runs
again. docs/development.md has more.
"""

from __future__ import annotations

import os
import runpy
import shutil
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
# chakra_hooks/_compiled.py lists the modules (it also decides, at import, when to run a
# module's source instead); read without importing the package, which is not installed yet.
_LISTING = runpy.run_path(str(HERE / "chakra_hooks" / "_compiled.py"))
COMPILED, PURE_ENV = _LISTING["COMPILED"], _LISTING["PURE_ENV"]
switched_on, switched_off = _LISTING["switched_on"], _LISTING["switched_off"]
COMPILE_ENV = "CHAKRA_HOOKS_COMPILE"

# Python semantics unchanged: annotations are documentation, not C types (a dict annotation
# must still accept a defaultdict), and functions stay introspectable.
DIRECTIVES = {"language_level": 3, "annotation_typing": False, "binding": True}
# The generated C runs within 3 % of -O3's instruction count at -O1 (the time is in the CPython
# API it calls) and compiles in less than half the time (a first install: ~60 s, not ~150 s).
# Added after Python's own flags, so it also overrides an -O level given in CFLAGS.
UNIX_FLAGS = ["-O1"]


class OptionalBuildExt(build_ext):
    """Compile every module, in parallel, or none: compiled modules call what another one
    declares directly, so a module left as Python cannot sit beside compiled ones. A failure
    leaves the install pure Python (a warning in pip's log, never a failed install)."""

    def finalize_options(self) -> None:
        super().finalize_options()
        if self.parallel is None:
            self.parallel = os.cpu_count() or 1

    def build_extensions(self) -> None:
        if self.compiler.compiler_type == "unix":  # gcc and clang: after Python's own -O3
            for ext in self.extensions:
                ext.extra_compile_args = [*ext.extra_compile_args, *UNIX_FLAGS]
        super().build_extensions()

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # no compiler at all, say: the pure-Python install still works
            for ext in self.extensions:  # those built before the failure, and stale copies
                for built in (self.get_ext_fullpath(ext.name),
                              os.path.join(self.build_lib, self.get_ext_filename(ext.name))):
                    if os.path.exists(built):
                        os.remove(built)
            self.warn(f"compiled modules not built, running as pure Python: {exc}")


def stage_declarations() -> str:
    """The ``.pxd`` declarations beside the sources, under their package names.

    Cython looks a module's declarations up by its full name (``chakra_hooks/converter/
    wire.pxd``), which this repository's folders (``converter/wire.pxd``, mapped to the
    package by pyproject.toml) do not spell; they are copied into that layout under build/.
    """
    root = HERE / "build" / "cython-declarations"
    package = root / "chakra_hooks"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.pxd").touch()
    for folder in sorted({str(Path(source).parent) for _, source in COMPILED}):
        target = package / folder
        for level in (target, *target.parents):  # each package level has its __init__.pxd
            if level == package:
                break
            level.mkdir(parents=True, exist_ok=True)
            (level / "__init__.pxd").touch()
        for declarations in (HERE / folder).glob("*.pxd"):
            copy = target / declarations.name
            if not copy.exists() or copy.read_bytes() != declarations.read_bytes():
                shutil.copyfile(declarations, copy)
        for copy in target.glob("*.pxd"):  # a declarations file since removed must not linger
            if copy.name != "__init__.pxd" and not (HERE / folder / copy.name).exists():
                copy.unlink()
    return str(root)


def compiled_extensions() -> list[Extension]:
    if switched_on(PURE_ENV) or switched_off(COMPILE_ENV):
        return []
    try:
        from Cython.Build import cythonize
    except ImportError:
        return []
    try:
        # Translated in parallel too (the C compiles are, by OptionalBuildExt): on 2 cores a
        # first install's build went from 70 to 61 s.
        return cythonize([Extension(name, [source]) for name, source in COMPILED],
                         compiler_directives=DIRECTIVES, build_dir="build/cython",
                         include_path=[stage_declarations()], quiet=True,
                         nthreads=os.cpu_count() or 1)
    except Exception as exc:  # Cython cannot translate one of them: all stay Python
        print(f"warning: compiled modules not built, running as pure Python: {exc}")
        return []


setup(ext_modules=compiled_extensions(), cmdclass={"build_ext": OptionalBuildExt})
