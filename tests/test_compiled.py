"""The compiled build (setup.py, chakra_hooks/_compiled.py): same code, all or nothing."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys

import pytest

from chakra_hooks import _compiled


def test_either_every_listed_module_runs_compiled_or_none() -> None:
    # setup.py builds every module or none (compiled modules call each other's declared
    # functions directly), and a checkout runs all from source once one is stale: a mix
    # means one of those rules broke.
    modules = [importlib.import_module(name) for name, _ in _compiled.COMPILED]
    compiled = [m.__name__ for m in modules if _compiled.is_compiled(m)]
    assert compiled in ([], [m.__name__ for m in modules]), compiled


def test_listed_sources_exist() -> None:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for name, source in _compiled.COMPILED:
        assert os.path.isfile(os.path.join(root, source)), (name, source)
        assert name.rpartition(".")[2] == os.path.basename(source)[:-3]


def _compiled_count(pure: str | None) -> int:
    """How many listed modules a fresh interpreter imports compiled, CHAKRA_HOOKS_PURE_PYTHON
    set to ``pure`` (None: unset)."""
    code = ("import importlib; from chakra_hooks import _compiled; "
            "print(sum(_compiled.is_compiled(importlib.import_module(n)) "
            "for n, _ in _compiled.COMPILED))")
    env = {k: v for k, v in os.environ.items() if k != _compiled.PURE_ENV}
    if pure is not None:
        env[_compiled.PURE_ENV] = pure
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True)
    return int(out.stdout)


def test_pure_python_switch_runs_the_sources() -> None:
    assert _compiled_count("1") == 0
    # A no is a no: "0" runs what an unset variable runs (compiled, where the build compiled).
    assert _compiled_count("0") == _compiled_count(None)


@pytest.mark.parametrize("value, on, off", [
    ("1", True, False), ("yes", True, False), (" TRUE ", True, False), ("on", True, False),
    ("0", False, True), ("false", False, True), ("No", False, True), ("off", False, True),
    ("", False, False), (None, False, False),
])
def test_switches_read_yes_and_no(monkeypatch, value, on, off) -> None:
    if value is None:
        monkeypatch.delenv(_compiled.PURE_ENV, raising=False)
    else:
        monkeypatch.setenv(_compiled.PURE_ENV, value)
    assert _compiled.switched_on(_compiled.PURE_ENV) is on
    assert _compiled.switched_off(_compiled.PURE_ENV) is off


def test_compiled_and_pure_python_write_the_same_bytes(corpus, tmp_path) -> None:
    # Meaningful when the build compiled (the CI build does): the same sources, two ways.
    outputs = []
    for pure in ("", "1"):
        out = tmp_path / f"pure{pure or 0}"
        env = dict(os.environ, CHAKRA_HOOKS_PURE_PYTHON=pure)
        subprocess.run([sys.executable, "-m", "chakra_hooks.cli", "convert",
                        str(corpus / "pytorch" / "a100_resnet_nccl"), "-o", str(out), "-j", "1"],
                       env=env, capture_output=True, text=True, check=True)
        outputs.append({p.name: p.read_bytes() for p in sorted(out.iterdir())})
    assert outputs[0] and outputs[0] == outputs[1]


@pytest.mark.extended
def test_both_builds_write_the_same_bytes_on_the_corpus_and_a_recording(corpus, gloo_traces,
                                                                         tmp_path) -> None:
    # Every corpus trace and a live recording, both targets (benchmarks/same_outputs.py):
    # plain Python is the reference the compiled build must match byte for byte.
    if _compiled_count(None) == 0:
        pytest.skip("nothing is compiled here: there is one build only")
    script = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                          "benchmarks", "same_outputs.py")
    saved = tmp_path / "plain.json"
    runs = []
    for pure, args in (("1", ["--save", str(saved)]), ("", ["--against", str(saved)])):
        env = dict(os.environ, CHAKRA_HOOKS_PURE_PYTHON=pure)
        runs.append(subprocess.run([sys.executable, script, "--corpus", str(corpus),
                                    "--traces", str(gloo_traces), *args],
                                   env=env, capture_output=True, text=True, timeout=900))
    assert runs[0].returncode == 0, runs[0].stderr[-2000:]
    assert runs[1].returncode == 0 and "same bytes" in runs[1].stdout, runs[1].stdout[-3000:]
    assert len(json.loads(saved.read_text())) > 100


def test_ci_build_compiles_every_module() -> None:
    # A source that no longer compiles (or a .pxd declaration that no longer matches its
    # source) leaves the whole install pure Python, which only the speed would show. The CI
    # machine has Cython (a build requirement) and a C compiler: there, everything compiles.
    if not os.environ.get("CI"):
        pytest.skip("a local install may lack a compiler; CI's does not")
    listed = len(_compiled.COMPILED)
    assert _compiled.compiled_status() == f"{listed} of {listed}"


def test_checkout_runs_all_from_source_once_any_module_is_stale(tmp_path, monkeypatch) -> None:
    # Compiled modules call what another declares (.pxd) directly: one stale module means
    # every module runs from source, and a .pxd newer than its build (a module's own, or one
    # others cimport) counts as stale.
    from importlib.machinery import EXTENSION_SUFFIXES
    for _, source in _compiled.COMPILED:
        py = tmp_path / source
        py.parent.mkdir(parents=True, exist_ok=True)
        py.write_text("")
        built = py.with_name(py.stem + EXTENSION_SUFFIXES[0])
        built.write_text("")
        os.utime(py, (1000, 1000))
        os.utime(built, (2000, 2000))

    def stale() -> bool:
        monkeypatch.setattr(_compiled, "_stale", None)
        return _compiled._stale_build(tmp_path)

    assert not stale()
    first = tmp_path / _compiled.COMPILED[0][1]
    declarations = first.with_suffix(".pxd")
    declarations.write_text("")
    os.utime(declarations, (3000, 3000))
    assert stale()
    os.utime(declarations, (1500, 1500))
    assert not stale()
    shared = tmp_path / "linker" / "pytorch" / "layouts.pxd"  # no module owns it; some cimport it
    shared.write_text("")
    os.utime(shared, (3000, 3000))
    assert stale()
    os.utime(shared, (1500, 1500))
    assert not stale()
    last = tmp_path / _compiled.COMPILED[-1][1]
    last.with_name(last.stem + EXTENSION_SUFFIXES[0]).unlink()  # a module left uncompiled
    assert stale()


def test_ops_and_edges_carry_no_garbage_collector_header_compiled() -> None:
    # Compiled, a large device's ops and edges (millions) are C classes the garbage collector
    # does not track (linker/model.py): 16 bytes less each. Plain Python, they are dataclasses.
    import gc

    from chakra_hooks.linker import model

    op = model.Op(0, "k", model.OpKind.COMPUTE, True, "stream:0:1", 0, 1)
    edge = model.Edge(0, 1, model.EdgeKind.STREAM_ORDER)
    tracked = not _compiled.is_compiled(model)
    assert gc.is_tracked(op) is tracked and gc.is_tracked(edge) is tracked


def test_the_model_runs_as_plain_python_without_cython_installed() -> None:
    # Cython is a build requirement only: an install that runs the sources (no compiler) has
    # no `cython` module, and linker/model.py's class decorators must then change nothing.
    code = ("import sys; sys.modules['cython'] = None\n"
            "from chakra_hooks.linker import model\n"
            "op = model.Op(3, 'k', model.OpKind.COMPUTE, True, 'lane', 5, 7)\n"
            "assert op.attrs == {} and model.Edge(1, 3, model.EdgeKind.DATA).dst == 3\n"
            "edges = model.EdgeColumns(); edges.add(1, 3, model.EdgeKind.DATA)\n"
            "assert [(e.src, e.dst, e.kind) for e in edges] == [(1, 3, model.EdgeKind.DATA)]\n"
            "from chakra_hooks.linker.xla import link\n"
            "assert link.DeviceOpAttrs('m', None, 7) == {'hlo_module': 'm', 'correlation': 7}\n"
            "from chakra_hooks.converter import wire\n"
            "buf = bytearray(b'x'); wire._put_bytes(buf, 0x0a, b'ab'); assert buf == b'x\\x0a\\x02ab'\n"
            "from chakra_hooks.converter import graph\n"
            "assert graph._buffer_bytes(graph._new_buffer()) == b''\n"
            "print(model.__file__)")
    env = dict(os.environ, **{_compiled.PURE_ENV: "1"})
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("model.py")
