"""validate: the reference tools' real defects are found; clean files pass; each rule can fail."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from chakra_hooks.cli import cli
from chakra_hooks.converter import etio
from chakra_hooks.converter.attrs import make_attr
from chakra_hooks.converter.schema import AttributeProto, GlobalMetadata, Node, NodeType
from chakra_hooks.converter.validate import validate

COMP = NodeType.Value("COMP_NODE")
COLL = NodeType.Value("COMM_COLL_NODE")


def test_reference_chakra_et_defects_are_reported(corpus: Path) -> None:
    path = corpus / "chakra_reference" / "chakra.0.et"
    et = etio.read_et(path)
    counts = validate(str(path), et.metadata, et.nodes).counts()
    # The figures formats.md gives for this file.
    assert counts["missing-dependency"] == 1277
    assert counts["self-dependency"] == 383
    assert counts["comm-on-host"] == 14


def test_astra_sim_microbenchmarks_are_clean(corpus: Path) -> None:
    for path in sorted((corpus / "chakra_reference" / "astra_sim_microbench").glob("*.et")):
        et = etio.read_et(path)
        report = validate(str(path), et.metadata, et.nodes, target="astra-sim")
        assert report.ok, report.problems


def _comp(nid: int, *deps: int, **fields) -> Node:
    node = Node(id=nid, name=f"op{nid}", type=COMP, duration_micros=2, **fields)
    node.ctrl_deps.extend(deps)
    node.attr.append(make_attr("is_cpu_op", True))
    return node


def _check(nodes: list[Node], target: str = "chakra", metadata: GlobalMetadata | None = None) -> dict[str, int]:
    return validate("t.et", metadata or GlobalMetadata(version="0.0.4"), nodes, target).counts()


def test_clean_graph_passes() -> None:
    assert _check([_comp(1), _comp(2, 1), _comp(3, 1, 2)]) == {}


def test_each_rule_fires() -> None:
    assert _check([_comp(1), _comp(1)]) == {"duplicate-id": 1}
    assert _check([_comp(1, 7)]) == {"missing-dependency": 1}
    assert _check([_comp(1, 1)]) == {"self-dependency": 1}
    assert _check([_comp(1, 2), _comp(2, 1)]) == {"cycle": 1}
    assert _check([Node(id=1, name="x", type=COMP)]) == {"duration": 1}
    assert _check([Node(id=1, name="x", type=42)]) == {"node-type": 1}
    bad_attr = _comp(1)
    bad_attr.attr.append(AttributeProto(name="is_cpu_op", double_val=1.0))
    assert _check([bad_attr]) == {"attribute-type": 1}
    coll = Node(id=1, name="ar", type=COLL)
    coll.attr.extend([make_attr("comm_type", 1), make_attr("is_cpu_op", True), make_attr("pg_name", "tp-group")])
    assert _check([coll]) == {"comm-on-host": 1, "comm-attribute": 1, "pg-name": 1}
    assert _check([coll], target="astra-sim")["astra-sim-comm-type"] == 1
    send = Node(id=1, name="send", type=NodeType.Value("COMM_SEND_NODE"))
    send.attr.extend([make_attr("comm_src", 0), make_attr("comm_size", 8)])
    assert _check([send]) == {"comm-attribute": 2}  # comm_dst and comm_tag


def test_integer_attributes_accept_any_integer_oneof() -> None:
    coll = Node(id=1, name="ar", type=COLL)
    coll.attr.extend([AttributeProto(name="comm_type", uint64_val=0), AttributeProto(name="comm_size", int32_val=64)])
    assert _check([coll]) == {}
    coll.attr.append(AttributeProto(name="comm_priority", string_val="high"))
    assert _check([coll]) == {"attribute-type": 1}


def test_node_in_place_of_metadata_is_reported(tmp_path: Path) -> None:
    import pytest

    from chakra_hooks.common.errors import TraceFormatError

    # A node written first: either it does not decode as GlobalMetadata at all ...
    path = tmp_path / "no_metadata.et"
    path.write_bytes(b"".join(etio.encode_et(_comp(9), [_comp(1)])))
    with pytest.raises(TraceFormatError, match="GlobalMetadata"):
        etio.read_et(path)
    # ... or it does, and leaves fields GlobalMetadata does not define.
    stray = Node(name="", start_time_micros=5)
    as_metadata = GlobalMetadata.FromString(stray.SerializeToString())
    assert _check([_comp(1)], metadata=as_metadata) == {"metadata": 1}


def test_astra_sim_target_refuses_metadata_and_mem_nodes() -> None:
    nodes = [Node(id=1, name="pg", type=NodeType.Value("METADATA_NODE")),
             Node(id=2, name="h2d", type=NodeType.Value("MEM_LOAD_NODE"))]
    assert _check(nodes) == {}
    assert _check(nodes, target="astra-sim") == {"astra-sim-type": 2}


def test_validate_reports_every_file_when_one_cannot_be_read(corpus, tmp_path):
    from chakra_hooks.convert import convert_paths

    convert_paths([corpus / "jax_xla" / "tpu_inference_2.xplane.pb"], tmp_path, progress=False)
    broken = tmp_path / "chakra.1.et"
    broken.write_bytes(broken.read_bytes()[:300])
    out = CliRunner().invoke(cli, ["validate", str(tmp_path)])
    assert out.exit_code == 1
    lines = out.output.splitlines()
    assert sum(": ok (" in line for line in lines) == 3
    assert any(line.startswith("chakra-hooks: error: ") and "chakra.1.et" in line
               for line in lines)
