"""The README's test command is what CI runs."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def readme_commands() -> list[str]:
    return re.findall(r"```bash\n(python3 -m venv .*?)\n```", (REPO / "README.md").read_text())


def test_ci_runs_the_readme_test_command() -> None:
    commands = readme_commands()
    assert len(commands) == 2, commands  # the main job, then the tests
    assert commands[1] in (REPO / ".ci" / "run").read_text()
