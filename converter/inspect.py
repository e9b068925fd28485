"""Summaries of Chakra ETs: what `chakra-hooks inspect` prints.

The JSON form is a contract other tools rely on: one object per file with at least the keys
``path``, ``schema``, ``nodes``, ``by_type``, ``comm_types``, ``comm_bytes``, ``duration_us``,
``data_deps`` and ``ctrl_deps``.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from chakra_hooks.errors import TraceFormatError

from .attrs import value_of
from .schema import CollectiveCommType, GlobalMetadata, Node, NodeType

_RANK_IN_NAME = re.compile(r"\.(\d+)\.et(?:\.gz)?$")


_KNOWN_TYPES = frozenset(NodeType.values())
_COMM_COLL = NodeType.Value("COMM_COLL_NODE")
_COMM_NODE_TYPES = frozenset({_COMM_COLL, NodeType.Value("COMM_SEND_NODE"), NodeType.Value("COMM_RECV_NODE")})


def _comm_name(value: object) -> str:
    return CollectiveCommType.Name(value) if value in CollectiveCommType.values() else f"UNKNOWN_{value}"


@dataclass
class Summary:
    path: str
    schema: str  # the metadata's ``schema`` attribute, else its ``version``
    nodes: int
    by_type: dict[str, int]
    comm_types: dict[str, int]
    comm_bytes: int
    duration_us: int  # sum of duration_micros over all nodes
    data_deps: int  # edge counts
    ctrl_deps: int
    rank: int | None = None  # from the <prefix>.<rank>.et file name
    version: str = ""
    metadata: dict[str, object] = field(default_factory=dict)
    duration_by_type_us: dict[str, int] = field(default_factory=dict)
    comm_bytes_by_type: dict[str, int] = field(default_factory=dict)
    cpu_nodes: int = 0  # nodes with is_cpu_op true

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def summarize(path: str, metadata: GlobalMetadata, nodes: Sequence[Node], check: bool = True) -> Summary:
    """Count what is in one decoded ET.

    Raises TraceFormatError on a node type outside the schema or an attribute whose value is of
    no type the schema knows (``validate`` lists every such problem instead of stopping).
    Counting is keyed by the integer type (names are looked up once at the end): this runs over
    every node of every converted rank. ``check=False`` (for nodes this process just built)
    skips the per-attribute type check and stops reading a non-COMM node's attributes at
    ``is_cpu_op``.
    """
    meta = {attr.name: value_of(attr) for attr in metadata.attr}
    count_by: Counter[int] = Counter()
    duration_by: Counter[int] = Counter()
    comm_types: Counter[str] = Counter()
    comm_bytes: Counter[str] = Counter()
    data_deps = ctrl_deps = cpu = 0
    for index, node in enumerate(nodes):
        kind = node.type
        if kind not in _KNOWN_TYPES:
            raise TraceFormatError(path, f"node id {node.id} (#{index})",
                                   f"a Chakra NodeType (0-{max(_KNOWN_TYPES)}), got {kind}")
        count_by[kind] += 1
        duration_by[kind] += node.duration_micros
        data_deps += len(node.data_deps)
        ctrl_deps += len(node.ctrl_deps)
        comm_type = size = None
        is_comm = kind in _COMM_NODE_TYPES
        for attr in node.attr:
            name = attr.name
            if check and attr.WhichOneof("value") is None:
                raise TraceFormatError(path, f"node id {node.id} attribute {name!r}",
                                       "a value of a type the Chakra schema defines (unknown field)")
            if name == "is_cpu_op":
                cpu += attr.bool_val
                if not (is_comm or check):
                    break
            elif is_comm:
                if name == "comm_type":
                    comm_type = value_of(attr)
                elif name == "comm_size":
                    size = value_of(attr)
        if comm_type is not None and kind == _COMM_COLL:
            comm_types[_comm_name(comm_type)] += 1
            comm_bytes[_comm_name(comm_type)] += int(size or 0)
        elif size is not None and kind != _COMM_COLL:
            comm_bytes[NodeType.Name(kind)] += int(size)
    by_type = {NodeType.Name(k): v for k, v in count_by.items()}
    duration = {NodeType.Name(k): v for k, v in duration_by.items()}
    match = _RANK_IN_NAME.search(path)
    return Summary(
        path=path, schema=str(meta.get("schema", metadata.version)), nodes=len(nodes),
        by_type=by_type, comm_types=dict(comm_types), comm_bytes=sum(comm_bytes.values()),
        duration_us=sum(duration.values()), data_deps=data_deps, ctrl_deps=ctrl_deps,
        rank=int(match.group(1)) if match else None, version=metadata.version,
        metadata={k: v for k, v in meta.items() if isinstance(v, (str, int, float, bool))},
        duration_by_type_us=duration, comm_bytes_by_type=dict(comm_bytes), cpu_nodes=cpu,
    )


def render(summary: Summary) -> str:
    """The human form: a few aligned lines."""
    lines = [f"{summary.path}" + (f"  (rank {summary.rank})" if summary.rank is not None else "")]
    meta = ", ".join(f"{k}={v}" for k, v in summary.metadata.items())
    lines.append(f"  metadata   version={summary.version or '-'} {meta}")
    lines.append(f"  nodes      {summary.nodes:,} ({summary.cpu_nodes:,} on the host), "
                 f"edges: {summary.data_deps:,} data, {summary.ctrl_deps:,} ctrl")
    lines.append(f"  duration   {summary.duration_us:,} us in all")
    for kind, count in sorted(summary.by_type.items(), key=lambda kv: -kv[1]):
        lines.append(f"    {kind:<16} {count:>9,} nodes {summary.duration_by_type_us.get(kind, 0):>14,} us")
    if summary.comm_types or summary.comm_bytes:
        lines.append(f"  comm       {summary.comm_bytes:,} bytes")
        for kind, count in sorted(summary.comm_types.items()):
            lines.append(f"    {kind:<16} {count:>9,} nodes {summary.comm_bytes_by_type.get(kind, 0):>14,} bytes")
        for kind in ("COMM_SEND_NODE", "COMM_RECV_NODE"):
            if kind in summary.comm_bytes_by_type:
                lines.append(f"    {kind:<16} {summary.by_type.get(kind, 0):>9,} nodes "
                             f"{summary.comm_bytes_by_type[kind]:>14,} bytes")
    return "\n".join(lines)
