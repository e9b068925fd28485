"""Shared fixtures: the real-trace corpus beside the repository."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CORPUS = REPO.parent / "shared" / "corpus"


@pytest.fixture(scope="session")
def corpus() -> Path:
    """``../shared/corpus``; skipped on a user's machine without it, a failure in CI."""
    if not CORPUS.is_dir():
        if os.environ.get("CI") == "true":
            pytest.fail(f"corpus folder {CORPUS} is missing in CI")
        pytest.skip(f"corpus folder {CORPUS} is absent")
    return CORPUS


def _read_with_reference(path: Path) -> tuple[object, list]:
    from chakra.schema.protobuf.et_def_pb2 import GlobalMetadata, Node
    from chakra.src.third_party.utils.protolib import decodeMessage, openFileRd

    handle = openFileRd(str(path))
    metadata = GlobalMetadata()
    assert decodeMessage(handle, metadata), f"{path}: the reference reader found no metadata"
    nodes = []
    while True:
        node = Node()
        if not decodeMessage(handle, node):
            break
        nodes.append(node)
    handle.close()
    return metadata, nodes


@pytest.fixture(scope="session")
def reference_reader():
    """mlc-chakra's own reader (node by node): ``read(path) -> (metadata, nodes)``.

    The second opinion on every ET we write. mlc-chakra's generated schema module needs
    protobuf >= 6.31 at run time: in the NeMo session (NeMo pins protobuf 5.29) it cannot load,
    and the tests that need it are skipped there, saying so; everywhere else it must load."""
    try:
        import chakra.schema.protobuf.et_def_pb2  # noqa: F401
    except Exception as exc:
        import google.protobuf

        if not google.protobuf.__version__.startswith("5."):
            raise
        pytest.skip(f"the reference reader (mlc-chakra) cannot load on protobuf "
                    f"{google.protobuf.__version__}: {type(exc).__name__}")
    return _read_with_reference


@pytest.fixture
def dlrm_two_ranks(corpus: Path, tmp_path: Path) -> Path:
    """Ranks 0 and 1 of the corpus's 8-rank DLRM run (ET + Kineto each), copied into a folder
    of their own, to change or damage."""
    source = corpus / "pytorch" / "v100_dlrm_8rank"
    run = tmp_path / "run2"
    run.mkdir()
    for rank in (0, 1):
        shutil.copy(source / f"dlrm_eg_{rank}.json.gz", run)
        shutil.copy(next(source.glob(f"worker{rank}_step_12.*.pt.trace.json.gz")), run)
    return run


@pytest.fixture(scope="session")
def dlrm_converted(corpus: Path, tmp_path_factory) -> Path:
    """The corpus's 8-rank DLRM run converted (--target full), to read; copy it to damage it."""
    from chakra_hooks.convert import convert_paths

    out = tmp_path_factory.mktemp("dlrm_converted") / "run"
    convert_paths([corpus / "pytorch" / "v100_dlrm_8rank"], out, progress=False,
                  warn=lambda _: None)
    return out


GLOO_JOB = REPO / "tests" / "linker" / "torch_gloo_job.py"


def _free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


@pytest.fixture(scope="session")
def gloo_traces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ET + Kineto per rank from torch 2.13 on CPU (gloo), 2 processes
    (tests/linker/torch_gloo_job.py)."""
    pytest.importorskip("torch")
    out = tmp_path_factory.mktemp("gloo")
    run = subprocess.run([sys.executable, str(GLOO_JOB), str(out), _free_port()],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    return out
