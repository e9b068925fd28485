"""What a convert process and each worker it starts import: start-up is paid once per process,
so per rank when ranks are small (docs/performance.md, many ranks)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

# Loaded by the CLI and by reading ETs back, never by converting (about 40 ms each).
HEAVY = ("click", "google.protobuf.message", "chakra_hooks.converter.schema.et_def_pb2")


def loaded_after(code: str) -> list[str]:
    """Which of HEAVY a fresh interpreter has imported after running ``code``."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_a_whole_conversion_loads_neither_the_cli_nor_protobuf(corpus: Path, tmp_path: Path) -> None:
    # A worker's whole job: read, link, build the graph, write the ET and its summary.
    rank = corpus / "pytorch" / "v100_dlrm_8rank"
    code = ("from chakra_hooks.convert import convert_paths\n"
            f"convert_paths([{str(rank)!r}], {str(tmp_path)!r}, workers=1)")
    assert loaded_after(code) == []
    assert len(list(tmp_path.glob("chakra.*.et"))) == 8
    # Reading an ET back does load protobuf: the probe can see it.
    assert "google.protobuf.message" in loaded_after(
        "from chakra_hooks.converter import etio\n"
        f"etio.read_et({str(next(tmp_path.glob('chakra.*.et')))!r})")


def test_spawned_workers_do_not_import_the_cli() -> None:
    # Spawn runs the parent's main script again in each worker, as __mp_main__.
    beside = Path(sys.executable).with_name("chakra-hooks")
    if not beside.is_file():
        pytest.skip("the chakra-hooks command is not installed beside this interpreter")
    script = str(beside)
    assert loaded_after(f"import runpy\nrunpy.run_path({script!r}, run_name='__mp_main__')") == []
    assert "click" in loaded_after("from chakra_hooks.__main__ import main\n"
                                   "import sys\nsys.argv = ['chakra-hooks', '--help']\n"
                                   "try:\n    main()\nexcept SystemExit:\n    pass")
