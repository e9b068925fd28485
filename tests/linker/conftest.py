"""Fixtures of the linker tests: a real 2-rank gloo job recorded once per session."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

JOB = Path(__file__).with_name("torch_gloo_job.py")


def _free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


@pytest.fixture(scope="session")
def gloo_traces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ET + Kineto per rank from torch 2.13 on CPU (gloo), 2 processes."""
    pytest.importorskip("torch")
    out = tmp_path_factory.mktemp("gloo")
    run = subprocess.run([sys.executable, str(JOB), str(out), _free_port()],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    return out
