"""Check a Chakra ET, ours or anyone's, against what its consumers require.

The rules come from formats.md section 1: what the reference reader and ASTRA-sim actually do
with a file. ASTRA-sim silently skips nodes on a cycle or depending on themselves and still
reports success, so "it ran" proves nothing; these checks are the second opinion.

Per target (converter/targets/): ``full`` (any consumer: the schema and the attribute types;
``chakra`` is an older name of it) and ``astra-sim`` (also what the simulator refuses: METADATA
and MEM nodes, collectives it does not simulate, sizes not recorded).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from types import ModuleType

from google.protobuf.unknown_fields import UnknownFieldSet

from .attrs import CONSUMER_ONEOF, INTEGER_ONEOFS, attr_dict, oneof_of, value_of
from .dag import unfinished_nodes
from .targets import Target, rules
from .schema import (COMM_COLL, COMM_TYPES, COMP, KNOWN_TYPES, CollectiveCommType, GlobalMetadata,
                     Node, NodeType)
KNOWN_COMM_TYPES = frozenset(CollectiveCommType.values())
# Attributes that account for a duration_micros of 0: the exact time (a sub-microsecond op
# rounds to 0), or a producer saying the op was not measured (ours write duration_unknown).
EXACT_DURATION_ATTRS = ("duration_ns", "duration_ps", "duration_unknown")


@dataclass(slots=True)
class Problem:
    check: str  # short, stable name of the rule
    node: int | None  # node id, None for file-level problems
    message: str


@dataclass
class Report:
    path: str
    nodes: int = 0
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for problem in self.problems:
            out[problem.check] = out.get(problem.check, 0) + 1
        return out


def validate(path: str, metadata: GlobalMetadata, nodes: Sequence[Node],
             target: str | Target = Target.FULL) -> Report:
    """All problems in one decoded ET."""
    target = rules(target)
    report = Report(path=path, nodes=len(nodes))
    add = report.problems.append
    _check_metadata(metadata, add)
    if not nodes:
        add(Problem("empty", None, "no nodes: nothing of this rank was recorded (an idle device?)"))
    ids = _check_ids(nodes, add)
    for node in nodes:
        _check_node(node, ids, target, add)
    _check_acyclic(nodes, ids, add)
    return report


def _check_metadata(metadata: GlobalMetadata, add) -> None:
    # A Node read as GlobalMetadata leaves its fields unknown (id is a varint where version is a
    # string): consumers then take the first node as metadata and find nothing to run.
    if len(UnknownFieldSet(metadata)):
        add(Problem("metadata", None, "the first message is not a GlobalMetadata (it has fields GlobalMetadata "
                                      "does not define; a Node first?)"))


def _check_ids(nodes: Sequence[Node], add) -> set[int]:
    ids: set[int] = set()
    for node in nodes:
        if node.id in ids:
            add(Problem("duplicate-id", node.id, f"node id {node.id} is used more than once"))
        ids.add(node.id)
    return ids


def _check_node(node: Node, ids: set[int], target: ModuleType, add) -> None:
    nid = node.id
    for kind, deps in (("data_deps", node.data_deps), ("ctrl_deps", node.ctrl_deps)):
        for dep in deps:
            if dep == nid:
                add(Problem("self-dependency", nid, f"{kind} names the node itself"))
            elif dep not in ids:
                add(Problem("missing-dependency", nid, f"{kind} names node {dep}, which is not in the file"))
    if node.type not in KNOWN_TYPES:
        add(Problem("node-type", nid, f"type {node.type} is not a Chakra NodeType"))
        return
    if node.type == NodeType.Value("INVALID_NODE"):
        add(Problem("node-type", nid, "type INVALID_NODE (its dependants never run)"))
    elif node.type in target.REFUSED_NODE_TYPES:
        add(Problem("astra-sim-type", nid, f"{NodeType.Name(node.type)} is refused by ASTRA-sim"))
    attrs = attr_dict(node)
    _check_attr_types(nid, attrs, add)
    if node.type in COMM_TYPES:
        _check_comm(node, attrs, target, add)
    elif node.type == COMP and node.duration_micros == 0 and not any(a in attrs for a in EXACT_DURATION_ATTRS):
        add(Problem("duration", nid, "COMP node without a duration (duration_micros is 0)"))
    for name in ("duration_ns", "duration_ps"):
        value = value_of(attrs[name]) if name in attrs else 0
        if isinstance(value, (int, float)) and value < 0:
            add(Problem("duration", nid, f"{name} {value}: a duration below 0"))


def _check_attr_types(nid: int, attrs: dict, add) -> None:
    for name, attr in attrs.items():
        which = oneof_of(attr)
        if which is None:
            add(Problem("attribute-type", nid, f"attribute {name!r} has no value of a known type"))
            continue
        wanted = CONSUMER_ONEOF.get(name)
        if wanted is None or which == wanted:
            continue
        if wanted in INTEGER_ONEOFS and which in INTEGER_ONEOFS:
            continue  # every consumer accepts any integer oneof here
        add(Problem("attribute-type", nid, f"attribute {name!r} is {which}; consumers read {wanted}"))


def _check_comm(node: Node, attrs: dict, target: ModuleType, add) -> None:
    nid = node.id
    cpu = attrs.get("is_cpu_op")
    if cpu is not None and oneof_of(cpu) == "bool_val" and cpu.bool_val:
        add(Problem("comm-on-host", nid, "COMM node with is_cpu_op true (ASTRA-sim: 'Comm node should not be on CPU')"))
    required = ("comm_type", "comm_size") if node.type == COMM_COLL else ("comm_src", "comm_dst", "comm_tag", "comm_size")
    for name in required:
        if name not in attrs:
            add(Problem("comm-attribute", nid, f"{NodeType.Name(node.type)} without {name}"))
    if node.type == COMM_COLL and "comm_type" in attrs:
        comm_type = value_of(attrs["comm_type"])
        if comm_type not in KNOWN_COMM_TYPES:
            add(Problem("comm-type", nid, f"comm_type {comm_type!r} is not a CollectiveCommType"))
        elif target.COMM_TYPES is not None and comm_type not in target.COMM_TYPES:
            add(Problem("astra-sim-comm-type", nid,
                        f"{CollectiveCommType.Name(comm_type)} is not simulated by ASTRA-sim (it aborts)"))
    if target.COMM_SIZE_REQUIRED and "comm_size_unknown" in attrs:
        add(Problem("comm-size-unknown", nid, f"{NodeType.Name(node.type)} whose size was not recorded "
                                              "(comm_size_unknown): a simulator would move 0 bytes"))
    pg = attrs.get("pg_name")
    if pg is not None and oneof_of(pg) == "string_val" and pg.string_val and not pg.string_val.isdigit():
        add(Problem("pg-name", nid, f"pg_name {pg.string_val!r} is not \"\" or an integer string "
                                    "(ASTRA-sim looks it up in its comm-group JSON)"))


def _check_acyclic(nodes: Sequence[Node], ids: set[int], add) -> None:
    """Over the dependencies that resolve (missing ones and self-dependencies are reported apart)."""
    stuck = unfinished_nodes(
        (node.id, {d for d in (*node.data_deps, *node.ctrl_deps) if d in ids and d != node.id}) for node in nodes)
    if stuck:
        add(Problem("cycle", stuck[0], f"{len(stuck)} nodes are on or behind a dependency cycle "
                                       f"(never run), e.g. {stuck[:5]}"))
