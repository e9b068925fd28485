"""Shared fixtures: the real-trace corpus beside the repository."""

from __future__ import annotations

import os
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
