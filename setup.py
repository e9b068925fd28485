"""Build step for the compiled converter path (everything else is in pyproject.toml).

The linker and converter modules listed in ``COMPILED`` are plain Python and run as such. When
Cython and a C compiler are at hand, pip also compiles those same sources into extension
modules, which makes ``chakra-hooks convert`` about a third faster (benchmarks/bench_convert.py;
README, "Speed"). Nothing is written twice: there is no Cython-only code, and a module that
fails to compile is simply left as Python (a warning in pip's log, never a failed install).

``CHAKRA_HOOKS_PURE_PYTHON=1`` at install time skips compiling, and at run time runs the
sources even where compiled copies exist. In an editable install, a module edited after the
install is imported from its source, not from the stale compiled copy
(chakra_hooks/_compiled.py), until ``pip install -e .`` runs again.
"""

from __future__ import annotations

import os
import runpy
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
# chakra_hooks/_compiled.py lists the modules (it also decides, at import, when to run a
# module's source instead); read without importing the package, which is not installed yet.
_LISTING = runpy.run_path(str(HERE / "chakra_hooks" / "_compiled.py"))
COMPILED, PURE_ENV = _LISTING["COMPILED"], _LISTING["PURE_ENV"]

# Python semantics unchanged: annotations are documentation, not C types (a dict annotation
# must still accept a defaultdict), and functions stay introspectable.
DIRECTIVES = {"language_level": 3, "annotation_typing": False, "binding": True}


class OptionalBuildExt(build_ext):
    """Compile what can be compiled, in parallel; a failure leaves that module as Python."""

    def finalize_options(self) -> None:
        super().finalize_options()
        if self.parallel is None:
            self.parallel = os.cpu_count() or 1

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # no compiler at all, say: the pure-Python install still works
            self.warn(f"compiled modules not built, running as pure Python: {exc}")

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:
            self.warn(f"{ext.name} not compiled, running as Python: {exc}")


def compiled_extensions() -> list[Extension]:
    if os.environ.get(PURE_ENV):
        return []
    try:
        from Cython.Build import cythonize
    except ImportError:
        return []
    extensions = []
    for name, source in COMPILED:
        try:
            extensions += cythonize([Extension(name, [source])], compiler_directives=DIRECTIVES,
                                    build_dir="build/cython", quiet=True)
        except Exception as exc:  # Cython cannot translate it: it stays Python
            print(f"warning: {name} not compiled, running as Python: {exc}")
    return extensions


setup(ext_modules=compiled_extensions(), cmdclass={"build_ext": OptionalBuildExt})
