"""vLLM tests run where vLLM is installed (``nox -s vllm``); elsewhere each test module skips
itself with the reason (``pytest.importorskip``). Engines run in-process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``: about 2 s to start instead of 20) unless a test starts
its own processes; nothing is fetched from a hub."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ["HF_HUB_OFFLINE"] = "1"
sys.path.insert(0, str(Path(__file__).resolve().parent))  # connectors (a test KV connector)
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))  # tiny_models


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> Path:
    from tiny_models import build_llama

    return build_llama(tmp_path_factory.mktemp("tiny_llama"))


@pytest.fixture(scope="session")
def tiny_mixtral(tmp_path_factory) -> Path:
    from tiny_models import build_mixtral

    return build_mixtral(tmp_path_factory.mktemp("tiny_mixtral"))
