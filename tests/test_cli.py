"""The installed `chakra-hooks` command: inspect and validate, run as a user would."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


def run(*args: str) -> subprocess.CompletedProcess:
    # The command installed beside this interpreter: one found on PATH may belong to another
    # environment (CI calls .venv/bin/pytest without activating the venv).
    exe = Path(sys.executable).with_name("chakra-hooks")
    command = [str(exe)] if exe.is_file() else [sys.executable, "-m", "chakra_hooks"]
    return subprocess.run([*command, *args], capture_output=True, text=True, timeout=300)


def test_inspect_json_keys_and_values(corpus: Path) -> None:
    result = run("inspect", "--json", str(corpus / "chakra_reference" / "chakra.0.et"))
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    for key in ("path", "schema", "nodes", "by_type", "comm_types", "comm_bytes", "duration_us",
                "data_deps", "ctrl_deps"):
        assert key in summary
    # schema: the Chakra schema version, which the reference tools leave unset; the host
    # ET's schema they wrote is the source's.
    assert summary["schema"] == "" and summary["source_schema"] == "1.0.1"
    assert summary["nodes"] == 3664
    assert summary["by_type"] == {"COMP_NODE": 3643, "COMM_COLL_NODE": 21}
    assert summary["rank"] == 0


def test_inspect_folder_lists_files_per_rank(corpus: Path) -> None:
    result = run("inspect", str(corpus / "chakra_reference" / "astra_sim_microbench"))
    assert result.returncode == 0, result.stderr
    assert "4 files" in result.stdout
    assert "ALL_TO_ALL" in result.stdout and "1,048,576 bytes" in result.stdout


def test_validate_exit_codes(corpus: Path) -> None:
    bad = run("validate", str(corpus / "chakra_reference" / "chakra.0.et"))
    assert bad.returncode == 1
    assert "self-dependency: node" in bad.stdout and "comm-on-host" in bad.stdout
    good = run("validate", "--json", str(corpus / "chakra_reference" / "astra_sim_microbench"))
    assert good.returncode == 0
    assert all(json.loads(line)["ok"] for line in good.stdout.splitlines())


@pytest.mark.parametrize("command", ["inspect", "validate"])
def test_bad_file_gives_one_line_error(tmp_path: Path, command: str) -> None:
    path = tmp_path / "not.et"
    path.write_text("this is not a trace\n")
    result = run(command, str(path))
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    # what the file is, not where its bytes broke (tests/test_first_hour.py: JSON, XSpace)
    assert len(lines) == 1 and str(path) in lines[0] and "a Chakra ET, but this is a text file" in lines[0]


def _write_et_with(tmp_path: Path, node_bytes: bytes) -> Path:
    from chakra_hooks.converter import etio
    from chakra_hooks.converter.schema import GlobalMetadata

    meta = GlobalMetadata(version="0.0.4").SerializeToString()
    path = tmp_path / "odd.0.et"
    path.write_bytes(etio.encode_varint(len(meta)) + meta + etio.encode_varint(len(node_bytes)) + node_bytes)
    return path


def test_unknown_node_type_and_attribute_are_one_line_errors(tmp_path: Path) -> None:
    from chakra_hooks.converter.schema import AttributeProto, Node

    unknown_type = _write_et_with(tmp_path, Node(id=7, name="x", type=42).SerializeToString())
    result = run("inspect", str(unknown_type))
    assert result.returncode == 1 and "node id 7" in result.stderr and "NodeType" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    checked = run("validate", str(unknown_type))
    assert checked.returncode == 1 and "node-type: node 7" in checked.stdout
    # An attribute whose value sits in a field number the schema does not define (99, varint).
    attr = AttributeProto(name="mystery").SerializeToString() + bytes([0x98, 0x06, 0x01])
    node = Node(id=8, name="y", type=4).SerializeToString() + b"\x52" + bytes([len(attr)]) + attr
    unknown_attr = _write_et_with(tmp_path, node)
    result = run("inspect", str(unknown_attr))
    assert result.returncode == 1 and "node id 8 attribute 'mystery'" in result.stderr


def test_protobuf_uses_the_fast_upb_backend() -> None:
    from google.protobuf.internal import api_implementation

    assert api_implementation.Type() == "upb"


def test_a_wrong_option_is_one_line_and_exit_1(tmp_path: Path) -> None:
    for args, says in ((("stats", "--bogus", str(tmp_path)), "--bogus"),
                       (("whatif", "--comm"), "--comm"),
                       (("share", str(tmp_path), "--level", "exact"), "--level")):
        result = run(*args)
        assert result.returncode == 1, (args, result.returncode, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("chakra-hooks: error:"), result.stderr
        assert says in lines[0] and "--help" in lines[0], lines[0]
