"""PyTorch host execution trace (ET) reader: every schema from ``1.0.1`` to ``1.1.1-chakra.1.0.0``.

Two layouts exist and both are read into the same :class:`EtNode`:

- ``1.0.1`` (and the ``execution_graph`` era): flat keys ``parent``, ``rf_id``, ``tid``,
  ``scope``, ``inputs`` (a list of values), ``input_shapes``, ``input_types``, ``outputs``...
- ``1.0.2`` and later: ``ctrl_deps`` (the parent id), ``inputs`` / ``outputs`` as
  ``{values, shapes, types, strides}`` and ``attrs`` as ``[{name, type, value}]``.

The file is parsed once (orjson). Nodes are returned sorted by id: ids are given at op entry,
so id order is program (entry) order on each thread.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from chakra_hooks.errors import TraceFormatError
from chakra_hooks.linker.jsonio import load_json

KNOWN_SCHEMAS = ("1.0.1", "1.0.2", "1.0.3", "1.0.4", "1.1.0", "1.1.1")
USER_SCOPE = 7  # RecordScope::USER_SCOPE: record_function annotations and the ET roots
_STANDARD_ATTRS = frozenset(("rf_id", "fw_parent", "seq_id", "scope", "tid", "fw_tid",
                             "op_schema", "kernel_backend", "kernel_file", "tensor_range"))


@dataclass(slots=True)
class EtIO:
    """Inputs or outputs of one ET node, as the ET has them."""

    values: list = field(default_factory=list)
    shapes: list = field(default_factory=list)
    types: list = field(default_factory=list)


@dataclass(slots=True)
class EtNode:
    id: int
    name: str
    parent: int
    rf_id: int
    tid: int
    scope: int
    inputs: EtIO
    outputs: EtIO
    attrs: dict  # the non-standard attrs of new schemas (collective_name, pg_name, ...)
    children: list = field(default_factory=list)  # filled by read_host_et, in id order

    @property
    def is_root(self) -> bool:
        """The process root (its own parent) or a per-thread root."""
        return self.parent == self.id or self.name.startswith("[pytorch|profiler|execution_")


@dataclass(slots=True)
class HostEt:
    path: Path
    schema: str
    pid: int | None
    time: str
    nodes: list[EtNode]  # sorted by id
    by_id: dict[int, EtNode]
    raw_bytes: int
    warnings: list[str] = field(default_factory=list)

    def thread_roots(self) -> list[EtNode]:
        return [n for n in self.nodes if n.is_root and n.parent != n.id]


def _new_node(raw: dict) -> EtNode:
    attrs = {a["name"]: a["value"] for a in raw.get("attrs", ())}
    ins, outs = raw.get("inputs") or {}, raw.get("outputs") or {}
    return EtNode(
        raw["id"], raw["name"], raw["ctrl_deps"], attrs.pop("rf_id", 0) or 0,
        attrs.pop("tid", 0), attrs.pop("scope", 0),
        EtIO(ins.get("values", []), ins.get("shapes", []), ins.get("types", [])),
        EtIO(outs.get("values", []), outs.get("shapes", []), outs.get("types", [])),
        {k: v for k, v in attrs.items() if k not in _STANDARD_ATTRS},
    )


def _old_node(raw: dict) -> EtNode:
    return EtNode(
        raw["id"], raw["name"], raw["parent"], raw.get("rf_id", 0) or 0, raw.get("tid", 0),
        raw.get("scope", 0),
        EtIO(raw.get("inputs", []), raw.get("input_shapes", []), raw.get("input_types", [])),
        EtIO(raw.get("outputs", []), raw.get("output_shapes", []), raw.get("output_types", [])),
        {},
    )


def read_host_et(path: Path) -> HostEt:
    """Read a PyTorch host ET; raises TraceFormatError for anything that is not one."""
    path = Path(path)
    doc, raw_bytes = load_json(path)
    if not isinstance(doc, dict) or not isinstance(doc.get("nodes"), list):
        raise TraceFormatError(path, "top level", "a PyTorch execution trace with a 'nodes' list")
    schema = str(doc.get("schema", ""))
    raw_nodes = doc["nodes"]
    if not raw_nodes:
        raise TraceFormatError(path, "nodes", "at least one node (the trace is empty)")
    nodes = []
    for index, raw in enumerate(raw_nodes):
        try:
            nodes.append(_new_node(raw) if "ctrl_deps" in raw else _old_node(raw))
        except (KeyError, TypeError, AttributeError) as exc:
            raise TraceFormatError(path, f"nodes[{index}]",
                                   f"an ET node with id, name and parent/ctrl_deps ({exc!r})"
                                   ) from exc
    nodes.sort(key=lambda n: n.id)
    by_id = {n.id: n for n in nodes}
    for node in nodes:  # id order, so children lists come out in program order
        parent = by_id.get(node.parent)
        if parent is not None and parent is not node:
            parent.children.append(node)
    pid = doc.get("pid")
    et = HostEt(path, schema, pid if isinstance(pid, int) else None, str(doc.get("time", "")),
                nodes, by_id, raw_bytes)
    if not schema.startswith(KNOWN_SCHEMAS):
        et.warnings.append(f"{path}: schema {schema!r} is not one of {', '.join(KNOWN_SCHEMAS)}; "
                           "read as the closest known layout")
    return et


def tensor_bytes(value: object) -> int:
    """Bytes of the tensors in an ET value: a tensor is ``[id, storage, offset, numel, itemsize,
    device]``; lists of tensors (any depth) are summed; anything else counts 0."""
    if not isinstance(value, list) or not value:
        return 0
    if (len(value) == 6 and type(value[3]) is int and type(value[4]) is int
            and isinstance(value[5], str)):
        return value[3] * value[4]
    return sum(tensor_bytes(v) for v in value if isinstance(v, list))


def tensor_ids(value: object, out: list[int]) -> None:
    """Append the tensor ids in an ET value (same tensor encoding as :func:`tensor_bytes`)."""
    if not isinstance(value, list) or not value:
        return
    if (len(value) == 6 and type(value[0]) is int and type(value[3]) is int
            and isinstance(value[5], str)):
        out.append(value[0])
        return
    for v in value:
        if isinstance(v, list):
            tensor_ids(v, out)
