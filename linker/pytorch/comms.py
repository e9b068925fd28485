"""What a PyTorch collective is: type, bytes, process group, peers.

Sources, best first: ``record_param_comms`` metadata (ET attrs in new schemas, positional
inputs in old ones), Kineto args copied onto kernels / ``record_param_comms`` ranges
(``Collective name``, ``In msg nelems``...), the c10d op the collective ran under (and its ET
tensors), and last the NCCL / RCCL kernel name.

``comm_size`` (bytes) is the per-rank total buffer a collective works on, which is what
ASTRA-sim's collective generators take: the input for all-reduce, reduce-scatter, broadcast,
reduce; the full gathered output for all-gather and gather; the larger of input and output
for all-to-all (uneven all-to-all-v included, split sizes kept as attributes).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import orjson

from chakra_hooks.linker.model import CommType, OpKind
from chakra_hooks.linker.pytorch.et import tensor_bytes
from chakra_hooks.linker.pytorch.et_nodes import EtNode

# Collective names as record_param_comms, c10d op names, nccl:* annotations and kernel names
# spell them, lower-cased with '_' removed -> kind and type.
_NAMES: dict[str, tuple[OpKind, CommType | None]] = {}
for _type, _spellings in {
    CommType.ALL_REDUCE: ("allreduce", "allreducecoalesced", "allreducebase"),
    CommType.ALL_GATHER: ("allgather", "allgatherbase", "allgatherintotensor",
                          "allgatherintotensorcoalesced", "allgathercoalesced"),
    CommType.REDUCE_SCATTER: ("reducescatter", "reducescatterbase", "reducescattertensor",
                              "reducescattertensorcoalesced"),
    CommType.BROADCAST: ("broadcast",),
    CommType.ALL_TO_ALL: ("alltoall", "alltoallv", "alltoallbase", "alltoallsingle"),
    CommType.REDUCE: ("reduce",),
    CommType.GATHER: ("gather",),
    CommType.SCATTER: ("scatter",),
    CommType.BARRIER: ("barrier",),
}.items():
    for _s in _spellings:
        _NAMES[_s] = (OpKind.COLLECTIVE, _type)
_NAMES.update({"send": (OpKind.SEND, None), "recv": (OpKind.RECV, None),
               "recvanysource": (OpKind.RECV, None), "sendrecv": (OpKind.SEND, None)})

# c10d ops gloo runs on CPU threads: name -> (output arg index, input arg index,
# peer arg index or None). Argument order from the c10d op schemas.
C10D_OPS: dict[str, tuple[int, int, int | None]] = {
    "c10d::allreduce_": (0, 0, None), "c10d::allreduce_coalesced_": (0, 0, None),
    "c10d::broadcast_": (0, 0, None), "c10d::reduce_": (0, 0, None),
    "c10d::allgather_": (0, 1, None), "c10d::_allgather_base_": (0, 1, None),
    "c10d::allgather_into_tensor_coalesced_": (0, 1, None),
    "c10d::reduce_scatter_": (0, 1, None), "c10d::_reduce_scatter_base_": (0, 1, None),
    "c10d::reduce_scatter_tensor_coalesced_": (0, 1, None),
    "c10d::alltoall_": (0, 1, None), "c10d::alltoall_base_": (0, 1, None),
    "c10d::gather_": (0, 1, None), "c10d::scatter_": (0, 1, None),
    "c10d::barrier": (0, 0, None), "c10d::send": (0, 0, 2), "c10d::recv_": (0, 0, 2),
    "c10d::recv_any_source_": (0, 0, None),
    # vLLM's own collectives (no c10d op, no record_param_comms): on CPU its shared-memory ops
    # ``_C::shm_allreduce(int handle, Tensor data)`` and ``_C::shm_all_gather(int handle,
    # Tensor data, Tensor output)``; on GPUs its ``vllm::all_reduce(Tensor, str group)``
    # custom op around pynccl or the custom all-reduce kernels.
    "_C::shm_allreduce": (1, 1, None), "_C::shm_all_gather": (2, 1, None),
    "vllm::all_reduce": (0, 0, None),
}
# Prefixes that name the library, not the collective (compared without '_', lower case).
_LIBRARY_PREFIXES = ("c10d::", "nccl:", "c::shm", "vllm::")

DTYPE_BYTES = {
    "float": 4, "float32": 4, "double": 8, "float64": 8, "half": 2, "float16": 2,
    "bfloat16": 2, "long": 8, "int64": 8, "long int": 8, "int": 4, "int32": 4, "short": 2,
    "int16": 2, "char": 1, "signed char": 1, "int8": 1, "byte": 1, "uint8": 1, "unsigned char": 1, "bool": 1,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "complexfloat": 8, "complexdouble": 16,
}


def classify(name: str) -> tuple[OpKind, CommType | None] | None:
    """A collective name in any of its spellings -> (kind, type), or None."""
    key = name.lower().replace("_", "")
    for prefix in _LIBRARY_PREFIXES:
        if key.startswith(prefix):
            key = key[len(prefix):]
            break
    return _NAMES.get(key)


def kernel_collective(name: str) -> str | None:
    """``ncclDevKernel_AllReduce_Sum_f32_RING_LL(...)`` -> ``AllReduce``; None if not NCCL/RCCL."""
    if "cross_device_reduce_" in name:  # vLLM's custom all-reduce kernels (1stage / 2stage)
        return "AllReduce"
    for prefix in ("ncclDevKernel_", "ncclKernel_", "rcclKernel_"):
        at = name.find(prefix)
        if at >= 0:
            rest = name[at + len(prefix):]
            return rest.split("_", 1)[0].split("(", 1)[0]
    return None


def dtype_bytes(dtype: object) -> int:
    if not isinstance(dtype, str):
        return 0
    text = dtype.lower()
    if text.startswith("tensor(") and text.endswith(")"):
        text = text[7:-1]
    return DTYPE_BYTES.get(text, 0)


@dataclass(slots=True)
class CommMeta:
    """What is known about one collective, before it becomes a CommInfo."""

    name: str  # collective name as found
    in_bytes: int = 0
    out_bytes: int = 0
    pg_name: str | None = None
    ranks: list[int] | None = None
    in_split: list[int] = field(default_factory=list)
    out_split: list[int] = field(default_factory=list)
    peer: int | None = None
    tag: int | None = None

    def size_for(self, comm_type: CommType | None) -> int:
        if comm_type in (CommType.ALL_GATHER, CommType.GATHER):
            return self.out_bytes or self.in_bytes
        if comm_type == CommType.ALL_TO_ALL:
            return max(self.in_bytes, self.out_bytes)
        return self.in_bytes or self.out_bytes


def _int_list(value: object) -> list[int]:
    if isinstance(value, str):
        try:
            value = orjson.loads(value)
        except orjson.JSONDecodeError:
            return []
    return [v for v in value if type(v) is int] if isinstance(value, list) else []


def _ranks(start: object, stride: object, size: object) -> list[int] | None:
    if type(start) is int and type(stride) is int and type(size) is int and size > 0 \
            and start >= 0 and stride > 0:
        return [start + stride * i for i in range(size)]
    return None


def from_record_param_comms(node: EtNode) -> CommMeta | None:
    """Metadata of a ``record_param_comms`` ET node, new (attrs) or old (positional) layout."""
    attrs = node.attrs
    if "collective_name" in attrs:
        width = dtype_bytes(attrs.get("dtype"))
        meta = CommMeta(str(attrs["collective_name"]),
                        int(attrs.get("in_msg_nelems") or 0) * width,
                        int(attrs.get("out_msg_nelems") or 0) * width,
                        str(attrs["pg_name"]) if attrs.get("pg_name") not in (None, "") else None,
                        _ranks(attrs.get("global_rank_start"), attrs.get("global_rank_stride"),
                               attrs.get("pg_size")),
                        _int_list(attrs.get("in_split_size")), _int_list(attrs.get("out_split_size")))
        return meta
    values, types = node.inputs.values, node.inputs.types
    coll = next((i for i, (v, t) in enumerate(zip(values, types))
                 if t == "String" and isinstance(v, str) and (classify(v) or v == "wait")), None)
    if coll is None:
        return None
    meta = CommMeta(values[coll])
    meta.in_bytes = sum(tensor_bytes(v) for v in values[:coll])
    meta.out_bytes = sum(tensor_bytes(v) for v in node.outputs.values) or meta.in_bytes
    for v, t in zip(values[:coll], types[:coll]):
        if t.startswith("Tuple[String") and isinstance(v, list) and v and v[0] != "":
            meta.pg_name = str(v[0])
    tail = values[coll + 1:]
    if len(tail) >= 2:
        meta.in_split, meta.out_split = _int_list(tail[0]), _int_list(tail[1])
    if len(tail) >= 5 and type(tail[4]) is int and tail[4] > 1:
        # Some writers put 1 in the size slot whatever the group; a 1-rank group is no info.
        meta.ranks = _ranks(tail[2], tail[3], tail[4])
    return meta


def from_kineto_args(args: dict) -> CommMeta | None:
    """Metadata Kineto copied onto a kernel or a ``record_param_comms`` range."""
    name = args.get("Collective name")
    if not isinstance(name, str):
        return None
    width = dtype_bytes(args.get("dtype"))
    ranks = _int_list(args.get("Process Group Ranks"))
    pg = args.get("Process Group Name")
    return CommMeta(name, int(args.get("In msg nelems") or 0) * width,
                    int(args.get("Out msg nelems") or 0) * width,
                    str(pg) if pg not in (None, "") else None, ranks or None,
                    _int_list(args.get("In split size")), _int_list(args.get("Out split size")))


def from_c10d_et(node: EtNode) -> CommMeta:
    """Metadata of a c10d op from its ET tensors (gloo collectives have no record_param_comms)."""
    out_i, in_i, peer_i = C10D_OPS[node.name]
    values = node.inputs.values
    meta = CommMeta(node.name.removeprefix("c10d::"))
    meta.out_bytes = tensor_bytes(values[out_i]) if out_i < len(values) else 0
    meta.in_bytes = tensor_bytes(values[in_i]) if in_i < len(values) else 0
    if node.name == "c10d::alltoall_base_" and len(values) > 4:
        meta.out_split, meta.in_split = _int_list(values[3]), _int_list(values[4])
    if peer_i is not None and peer_i + 1 < len(values):
        peer, tag = values[peer_i], values[peer_i + 1]
        meta.peer = peer if type(peer) is int else None
        meta.tag = tag if type(tag) is int else None
    return meta


def _kineto_arg_bytes(args: dict, i: int) -> int:
    """Bytes of positional argument ``i`` from Kineto's recorded shapes (record_shapes=True)."""
    dims, types = args.get("Input Dims") or [], args.get("Input type") or []
    if i >= len(dims) or i >= len(types) or not isinstance(dims[i], list) or not dims[i]:
        return 0
    count = 1
    for d in dims[i]:
        if type(d) is not int:
            return 0
        count *= d
    return count * dtype_bytes(types[i])


def kineto_input_empty(name: str, args: dict) -> bool:
    """Whether a c10d op range recorded its input as a tensor of no elements (a recorded size
    of 0, not a size Kineto left out, as it does for tensor lists)."""
    dims = args.get("Input Dims") or []
    i = C10D_OPS[name][1]
    return i < len(dims) and isinstance(dims[i], list) and 0 in dims[i]


def from_c10d_kineto(name: str, args: dict) -> CommMeta:
    """Metadata of a c10d op range from Kineto's recorded shapes (Kineto-only input)."""
    out_i, in_i, _ = C10D_OPS[name]
    return CommMeta(name.removeprefix("c10d::"), _kineto_arg_bytes(args, in_i),
                    _kineto_arg_bytes(args, out_i))


def from_nccl_annotation(name: str, args: dict) -> CommMeta | None:
    """``nccl:all_reduce`` style annotations record their first tensor's shape; for gathers
    this is the per-rank input, not the full output (noted as a limitation)."""
    nbytes = _kineto_arg_bytes(args, 0)
    if not nbytes:
        return None
    return CommMeta(name.removeprefix("nccl:"), nbytes, nbytes)
