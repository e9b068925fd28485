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
from typing import TYPE_CHECKING

from chakra_hooks.common.errors import TraceFormatError

try:  # read by Cython when it compiles this module (setup.py): see Tally.add_plain
    import cython
except ImportError:  # run as plain Python without Cython installed
    from chakra_hooks.common.no_cython import cython

from .attrs import value_of
from .schema import COMM_COLL, COMM_TYPE_NAMES, COMM_TYPES, KNOWN_TYPES, NODE_TYPE_NAMES

if TYPE_CHECKING:
    from .schema import GlobalMetadata, Node

_RANK_IN_NAME = re.compile(r"\.(\d+)\.et(?:\.gz)?$")
# Attributes saying a value was not recorded (or could not be resolved): counted per file.
UNKNOWN_ATTRS = frozenset({"duration_unknown", "comm_size_unknown", "comm_unresolved",
                           "peer_wait_unknown"})


_COMM_NAMES = dict(enumerate(COMM_TYPE_NAMES))
_COMM_TYPE_BITS = sum(1 << kind for kind in COMM_TYPES)  # (Tally.add_plain's: a C integer)


def _comm_name(value: object) -> str:
    try:
        return _COMM_NAMES[value]  # type: ignore[index]
    except (KeyError, TypeError):
        return f"UNKNOWN_{value}"


@dataclass
class Summary:
    path: str
    schema: str  # the Chakra ET schema version (GlobalMetadata.version; "" when unset)
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
    # What our collectors add, when present (``inspect`` only; the convert table leaves them):
    # {"layers", "steps", "nodes", "tokens", "max_over_mean", "worst_layer"} and
    # {"loads", "stores", "load_bytes", "store_bytes"}.
    moe: dict[str, object] | None = None
    kv: dict[str, object] | None = None
    # The schema of the trace it was converted from (the host ET's ``schema``), when it says.
    source_schema: str = ""
    unknown: dict[str, int] = field(default_factory=dict)  # UNKNOWN_ATTRS name -> nodes

    def to_json(self) -> dict[str, object]:
        return asdict(self)


class Tally:
    """The counts behind a Summary, fed one node at a time: by :func:`summarize` from decoded
    nodes, and by the converter from the nodes it writes (no decoding back)."""

    __slots__ = ("count_by", "duration_by", "comm_types", "comm_bytes", "nodes", "data_deps",
                 "ctrl_deps", "cpu", "unknown")

    def __init__(self) -> None:
        self.count_by: dict[int, int] = {}
        self.duration_by: dict[int, int] = {}
        self.comm_types: Counter[str] = Counter()
        self.comm_bytes: Counter[str] = Counter()
        self.unknown: dict[str, int] = {}
        self.nodes = self.data_deps = self.ctrl_deps = self.cpu = 0

    def add(self, kind: int, duration_us: int, data_deps: int, ctrl_deps: int, cpu: bool,
            comm_type: object = None, comm_size: object = None) -> None:
        """One node: its NodeType value, duration_micros, dependency counts, is_cpu_op, and
        for COMM nodes the comm_type / comm_size attribute values. (Runs once per node.)"""
        self.nodes += 1
        count_by, duration_by = self.count_by, self.duration_by
        count_by[kind] = count_by.get(kind, 0) + 1
        duration_by[kind] = duration_by.get(kind, 0) + duration_us
        self.data_deps += data_deps
        self.ctrl_deps += ctrl_deps
        if cpu:
            self.cpu += 1
        if comm_type is not None and kind == COMM_COLL:
            name = _comm_name(comm_type)
            self.comm_types[name] += 1
            self.comm_bytes[name] += int(comm_size or 0)
        elif kind != COMM_COLL and kind in COMM_TYPES:  # point-to-point, by node type
            name = NODE_TYPE_NAMES[kind]
            self.comm_types[name] += 1
            self.comm_bytes[name] += int(comm_size or 0)

    def add_plain(self, kind: int, duration_us: int, data_deps: int, ctrl_deps: int,
                  cpu: bool) -> None:
        """``add`` for a node of no communication type, as the converter's node writer counts
        it. The compiled build counts it by type on C integers (summary.pxd) and adds those to
        ``count_by`` and ``duration_by`` at :meth:`flush`, which must run before they are read:
        a dict update a node was most of what ``add`` cost. The types keep the order they were
        first counted in, as ``add`` would give them."""
        if (cython.compiled and 0 <= kind < 8 and not _COMM_TYPE_BITS >> kind & 1
                and 0 <= duration_us < 4_294_967_296):  # (2^32 us a node: no sum overflows)
            if not self._pending_count[kind]:
                self.count_by.setdefault(kind, 0)
                self.duration_by.setdefault(kind, 0)
            self._pending_count[kind] += 1
            self._pending_duration[kind] += duration_us
            self.nodes += 1
            self.data_deps += data_deps
            self.ctrl_deps += ctrl_deps
            if cpu:
                self.cpu += 1
        else:
            self.add(kind, duration_us, data_deps, ctrl_deps, cpu)

    def flush(self) -> None:
        """Add what :meth:`add_plain` counted on C integers to the dicts (nothing to add in
        plain Python); :meth:`merge` and :meth:`summary` do it first."""
        if cython.compiled:
            for kind in range(8):
                if self._pending_count[kind]:
                    self.count_by[kind] += self._pending_count[kind]
                    self.duration_by[kind] += self._pending_duration[kind]
                    self._pending_count[kind] = 0
                    self._pending_duration[kind] = 0

    def add_node(self, node: Node, path: str = "<nodes>", index: int = 0, check: bool = True) -> None:
        """One decoded node (``index``: its place in the file at ``path``, for errors); see
        :func:`summarize` for ``check``."""
        kind = node.type
        if kind not in KNOWN_TYPES:
            raise TraceFormatError(path, f"node id {node.id} (#{index})",
                                   f"a Chakra NodeType (0-{max(KNOWN_TYPES)}), got {kind}")
        comm_type = size = None
        cpu = False
        is_comm = kind in COMM_TYPES
        for attr in node.attr:
            name = attr.name
            if check and attr.WhichOneof("value") is None:
                raise TraceFormatError(path, f"node id {node.id} attribute {name!r}",
                                       "a value of a type the Chakra schema defines (unknown field)")
            if name == "is_cpu_op":
                cpu = attr.bool_val
                if not (is_comm or check):
                    break
            elif name in UNKNOWN_ATTRS:
                self.unknown[name] = self.unknown.get(name, 0) + 1
            elif is_comm:
                if name == "comm_type":
                    comm_type = value_of(attr)
                elif name == "comm_size":
                    size = value_of(attr)
        self.add(kind, node.duration_micros, len(node.data_deps), len(node.ctrl_deps), cpu,
                 comm_type, size)

    def merge(self, other: Tally) -> None:
        """Add the counts of ``other`` (other nodes of the same file): the result is what
        one tally fed both sets of nodes would hold."""
        self.flush()
        other.flush()
        self.nodes += other.nodes
        self.data_deps += other.data_deps
        self.ctrl_deps += other.ctrl_deps
        self.cpu += other.cpu
        for kind, count in other.count_by.items():
            self.count_by[kind] = self.count_by.get(kind, 0) + count
            self.duration_by[kind] = self.duration_by.get(kind, 0) + other.duration_by[kind]
        self.comm_types.update(other.comm_types)
        self.comm_bytes.update(other.comm_bytes)
        for name, count in other.unknown.items():
            self.unknown[name] = self.unknown.get(name, 0) + count

    def summary(self, path: str, version: str, meta: dict[str, object]) -> Summary:
        """The Summary of the file at ``path``, whose GlobalMetadata has ``version`` and the
        attributes ``meta`` (name -> value, as :func:`metadata_values` reads them)."""
        self.flush()
        by_type = {NODE_TYPE_NAMES[k]: v for k, v in self.count_by.items()}
        duration = {NODE_TYPE_NAMES[k]: v for k, v in self.duration_by.items()}
        match = _RANK_IN_NAME.search(path)
        return Summary(
            path=path, schema=version, nodes=self.nodes,
            by_type=by_type, comm_types=dict(self.comm_types),
            comm_bytes=sum(self.comm_bytes.values()), duration_us=sum(duration.values()),
            data_deps=self.data_deps, ctrl_deps=self.ctrl_deps,
            rank=int(match.group(1)) if match else None, version=version,
            metadata={k: v for k, v in meta.items() if isinstance(v, (str, int, float, bool))},
            duration_by_type_us=duration, comm_bytes_by_type=dict(self.comm_bytes),
            cpu_nodes=self.cpu, source_schema=str(meta.get("schema", "")),
            unknown=dict(sorted(self.unknown.items())),
        )


def summarize(path: str, metadata: GlobalMetadata, nodes: Sequence[Node], check: bool = True) -> Summary:
    """Count what is in one decoded ET.

    Raises TraceFormatError on a node type outside the schema or an attribute whose value is of
    no type the schema knows (``validate`` lists every such problem instead of stopping).
    ``check=False`` (for nodes this process just built) skips the per-attribute type check and
    stops reading a non-COMM node's attributes at ``is_cpu_op``.
    """
    tally = Tally()
    for index, node in enumerate(nodes):
        tally.add_node(node, path, index, check)
    summary = tally.summary(path, metadata.version, metadata_values(metadata))
    summary.moe, summary.kv = _moe_and_kv(nodes)
    return summary


def metadata_values(metadata: GlobalMetadata) -> dict[str, object]:
    """A GlobalMetadata's attributes, name -> value (the last of a repeated name wins)."""
    return {attr.name: value_of(attr) for attr in metadata.attr}


def _moe_and_kv(nodes: Sequence[Node]) -> tuple[dict | None, dict | None]:
    """Routing bins (``moe_routing:*`` nodes) and KV-cache transfers (``kv:*``) in brief."""
    layers, steps, tokens, routing = set(), set(), 0, 0
    worst, worst_layer = 0.0, None
    kv = {"loads": 0, "stores": 0, "load_bytes": 0, "store_bytes": 0}
    for node in nodes:
        name = node.name
        if not name.startswith(("moe_routing:", "kv:")):
            continue
        attrs = {a.name: value_of(a) for a in node.attr}
        if name.startswith("moe_routing:"):
            routing += 1
            layers.add(attrs.get("moe_layer"))
            steps.add(attrs.get("moe_step"))
            tokens += int(attrs.get("moe_tokens") or 0)
            bins = list(attrs.get("moe_expert_tokens") or [])
            if bins and sum(bins):
                imbalance = max(bins) / (sum(bins) / len(bins))
                if imbalance > worst:
                    worst, worst_layer = imbalance, attrs.get("moe_layer")
        elif attrs.get("kv_direction") in ("load", "store"):
            kind = attrs["kv_direction"]
            kv[f"{kind}s"] += 1
            kv[f"{kind}_bytes"] += int(attrs.get("tensor_size") or 0)
    moe = None
    if routing:
        moe = {"layers": len(layers), "steps": len(steps), "nodes": routing, "tokens": tokens,
               "max_over_mean": round(worst, 3), "worst_layer": worst_layer}
    return moe, (kv if kv["loads"] or kv["stores"] else None)


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
    if summary.unknown:
        lines.append("  unknown    " + ", ".join(f"{count:,} {name}" for name, count
                                                 in summary.unknown.items())
                     + " (nodes whose value was not recorded; docs/output-format.md)")
    if summary.moe:
        m = summary.moe
        lines.append(f"  MoE        {m['nodes']:,} routing nodes: {m['layers']} layers x "
                     f"{m['steps']} steps, {m['tokens']:,} tokens routed; worst imbalance "
                     f"{m['max_over_mean']} (max / mean tokens per expert, layer "
                     f"{m['worst_layer']})")
    if summary.kv:
        k = summary.kv
        lines.append(f"  KV cache   {k['loads']:,} loads ({k['load_bytes']:,} bytes), "
                     f"{k['stores']:,} stores ({k['store_bytes']:,} bytes)")
    return "\n".join(lines)
