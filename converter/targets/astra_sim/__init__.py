"""The ``astra-sim`` target: what ASTRA-sim's workload layer accepts, and the files it runs with.

Per rank (:func:`prepare`, :func:`retarget`): ASTRA-sim runs one compute node at a time per
NPU. METADATA nodes are dropped (their dependants inherit their dependencies). What it cannot
run as it was (a collective of a type it does not simulate, or of unknown size; a MEM node
unless ``keep_mem``) becomes a COMP node; where that op ran beside compute in the trace (a
collective on its own stream, a copy on a copy engine or TPU "Async XLA Ops"), replayed as
compute for its full time it would serialise with everything else (a TPU trace ran 3.5x long
that way), so it is replayed in zero time (:func:`replay_dur`), its measured time kept in
``overlapped_duration_ps``. The slack gaps are counted per resource with those durations
(linker/enrich/gaps.py), so the ops that waited for it still start when they did, and every
rank gets a window anchor (the run's ranks began recording at different moments).

Across ranks (:func:`finish_run`): collectives agree in type, size and order on every member
of their group, groups are renumbered as ASTRA-sim needs (run_rules.py), and the network is
fitted to the measured collectives (network.py), written beside the ETs.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import orjson

from chakra_hooks import storage
from chakra_hooks.converter.schema import COMM_TYPE_NAMES, NODE_TYPE_NAMES
from chakra_hooks.linker.enrich.gaps import GAP_NAME, add_gaps, add_window_anchor
from chakra_hooks.linker.model import CommType, LinkedTrace, Op, OpKind

from ..full import peer_waits, rank_metadata, world_size
from ..run_files import rewrite_run
from . import network

NEEDS_RUN_COLLECTIVES = "nodes"
FILES = (network.NETWORK_FILE, network.SYSTEM_FILE, network.MEMORY_FILE)
# ASTRA-sim's command line names comm_group.json whether or not the run has groups.
COMM_GROUP_ALWAYS = True
REFUSED_NODE_TYPES = frozenset(NODE_TYPE_NAMES.index(n) for n in
                               ("INVALID_NODE", "METADATA_NODE", "MEM_LOAD_NODE", "MEM_STORE_NODE"))
# Simulated, or (BROADCAST) replayed from its duration; any other type aborts ASTRA-sim.
COMM_TYPES = frozenset(COMM_TYPE_NAMES.index(n) for n in
                       ("ALL_REDUCE", "ALL_GATHER", "ALL_TO_ALL", "REDUCE_SCATTER", "BROADCAST"))
COMM_SIZE_REQUIRED = True  # a simulator would move 0 bytes for a size not recorded
COLLECTIVES = frozenset({CommType.ALL_REDUCE, CommType.ALL_GATHER, CommType.ALL_TO_ALL,
                         CommType.REDUCE_SCATTER, CommType.BROADCAST})
_COMPUTE, _COLLECTIVE, _METADATA = OpKind.COMPUTE, OpKind.COLLECTIVE, OpKind.METADATA
_MEM_KINDS = frozenset({OpKind.MEM_LOAD, OpKind.MEM_STORE})
_COMM_KINDS = frozenset({OpKind.COLLECTIVE, OpKind.SEND, OpKind.RECV})


def prepare(trace: LinkedTrace, options) -> None:
    """ASTRA-sim's analytical backend runs one host op and one device op at a time, so the
    slack is counted per resource, not per lane, with the durations it will replay."""
    if options.gaps:
        add_gaps(trace, per_resource=True, replay_dur=replay_dur(trace.ops, options.keep_mem))
        add_window_anchor(trace)


def retarget(ops: list[Op], keep_mem: bool) -> list[Op]:
    """The ops to write (module docstring)."""
    dur_of = replay_dur(ops, keep_mem)
    host_as_device = not _has_device_compute(ops)
    out: list[Op] = []
    for op in ops:
        kind = op.kind
        if kind == _METADATA:
            continue
        if as_compute(op, keep_mem):
            attrs = dict(op.attrs, replayed_as_compute=kind.name)
            dur_ps = dur_of(op)
            if op.dur_ps and not dur_ps:
                attrs["overlapped_duration_ps"] = op.dur_ps
            op = Op(op.uid, op.name, _COMPUTE, op.on_device, op.lane, op.start_ps, dur_ps,
                    None, op.bytes, op.flops, op.inputs, op.outputs, attrs)
        if host_as_device and op.kind == _COMPUTE and not op.on_device:
            op = Op(op.uid, op.name, _COMPUTE, True, op.lane, op.start_ps, op.dur_ps, None,
                    op.bytes, op.flops, op.inputs, op.outputs, dict(op.attrs, host_op=True))
        out.append(op)
    return out


def _has_device_compute(ops: list[Op]) -> bool:
    """Whether the rank ran compute on a device. A rank that did not (gloo on CPUs) has its
    host ops written as ASTRA-sim's device compute (``is_cpu_op`` false, ``host_op`` says
    what they were): the resource is the same one-op-at-a-time kind, and this ASTRA-sim's
    statistics step, which runs as each NPU finishes, throws on any CPU node ("Only GPU and
    COMM types are supported for overlap extraction"), which kills the NPUs still running
    when one finishes first (a 4-rank send/recv ring: 1 of 4 finished)."""
    for op in ops:
        if op.on_device and op.kind == _COMPUTE and op.name != GAP_NAME:
            return True
    return False


def as_compute(op: Op, keep_mem: bool) -> bool:
    """Whether ASTRA-sim gets ``op`` as a COMP node (it cannot run it as what it was)."""
    kind = op.kind
    if kind in _MEM_KINDS:
        return not keep_mem
    if kind in _COMM_KINDS and "comm_size_unknown" in op.attrs:
        return True
    return kind == _COLLECTIVE and (op.comm is None or op.comm.comm_type not in COLLECTIVES)


def replay_dur(ops: list[Op], keep_mem: bool = False) -> Callable[[Op], int]:
    """The duration ASTRA-sim replays each op for: the measured one, except zero for a
    collective replayed as compute and for a copy replayed as compute on a lane where no
    compute runs (module docstring)."""
    compute_lanes = {op.lane for op in ops if op.kind == _COMPUTE}

    def dur_of(op: Op) -> int:
        dur = op.dur_ps
        if dur and as_compute(op, keep_mem) and (
                op.kind in _COMM_KINDS or op.lane not in compute_lanes):
            return 0
        return dur

    return dur_of


def finish_run(staging: str, results: list, groups: dict[int, list[int]], options,
               note: Callable[[str], None], runner) -> dict[int, list[int]]:
    """Make the staged ETs agree across ranks as ASTRA-sim needs (run_rules.py), in a second
    round: the plan is made here from the communication the workers handed over (each rank's
    COMM_COLL nodes, and its sends and receives for the network), and each rank's file is
    rewritten by a task of ``runner`` (converter/targets/run_files.py). Returns the renumbered
    groups."""
    from chakra_hooks.converter import etio

    from . import run_rules

    nodes = {r.rank: list(etio.decode_bodies([body for _, body in r.collectives])) for r in results}
    # Waits for peers as the run's own groups say (a group whose members were not all
    # recorded has none known), before the groups are renumbered for ASTRA-sim.
    found = peer_waits(results, groups, nodes, note)
    new_groups = run_rules.harmonize(nodes, groups, note)
    transfer = run_rules.one_at_a_time(
        {rank: run_rules.comm_rows(rank_nodes) for rank, rank_nodes in nodes.items()},
        found.transfer_us)
    run_rules.align_windows(nodes, note)
    hosts = {rank: meta.get("host") if isinstance(meta.get("host"), str) else None
             for rank, meta in rank_metadata(results).items()}
    _write_network(staging, nodes, new_groups, len(results), transfer, world_size(results),
                   hosts)
    rewrite_run(staging, results, nodes, options, runner)
    if len(results) == 1:
        _two_npus(staging, results[0], options, note)
    return new_groups


def _two_npus(staging: str, result, options, note: Callable[[str], None]) -> None:
    """A run of one rank, ready to run: ASTRA-sim's analytical backend needs two NPUs or more
    and reads NPU i's ET from ``<prefix>.<i>.et``, so the rank's ET is written as NPU 0's and
    NPU 1's (the network beside it has two NPUs already). Said, since the files' names no
    longer give the rank (the ETs' metadata does)."""
    rank = result.rank
    names = [f"{options.prefix}.{npu}.et" for npu in (0, 1)]
    files = list(names)
    pairs = [(result.files[0], names)]
    if len(result.files) > 1:  # the JSON twin
        twins = [f"{options.prefix}.{npu}.json" for npu in (0, 1)]
        pairs.append((result.files[1], twins))
        files += twins
    for written, (first, second) in pairs:
        storage.move_and_copy(staging, written, first, second)
    result.files = files
    note(f"one rank (rank {rank}): its ET is written as {names[0]} and {names[1]}, the two NPUs "
         f"ASTRA-sim's analytical backend needs (the same ET twice; its metadata gives the rank)")


def _write_network(staging: str, nodes: dict[int, list], groups: dict[int, list[int]],
                   ranks: int, transfer: dict[tuple[int, int], float], world: int,
                   hosts: dict[int, str | None]) -> None:
    """ASTRA-sim's network fitted to the run's measured collectives, and the system layer the
    fit assumes (network.py), beside the ETs. Each collective counts for its transfer, the
    time after its last member arrived (converter/peers.py): ASTRA-sim makes every
    member wait for the others itself, and a network fitted to the waits too would count
    them twice (a DDP run simulated at 1.44x its span). A collective of all ranks counts at
    the run's size (``world``, from the ETs), not at the number of ranks recorded: a run
    recorded on rank 0 of 4 ran its all-reduces over 4 (fitted over 2, the network came out
    1.4x too slow for the run made whole by ``scale``). Where the run's ranks sit on hosts of
    G ranks each in rank order (``host`` in the ETs), the network has two dimensions (G ranks
    within a host, the hosts between them), each fitted to the collectives on it
    (network.py, ``fit_two_dims``)."""
    from chakra_hooks.converter.attrs import attr_dict, value_of
    from chakra_hooks.converter.schema import COMM_COLL, COMM_SEND
    from chakra_hooks.converter.run_model import node_times

    npus = max(ranks, 2)  # the analytical backend needs two NPUs (astra-run replicates one)
    per_host = network.ranks_per_host(hosts) if ranks == world else None
    samples = []
    shapes: list[tuple[int, int] | None] = []  # per sample, over two dimensions
    for rank, rank_nodes in nodes.items():
        for node in rank_nodes:
            if node.type == COMM_SEND and (rank, node.id) in transfer:
                attrs = attr_dict(node)
                samples.append(network.Sample(
                    network.POINT_TO_POINT, int(value_of(attrs["comm_size"])), 2,
                    transfer[(rank, node.id)] * 1000))
                peer = int(value_of(attrs["comm_dst"])) if "comm_dst" in attrs else rank
                shapes.append(network.shape_of([rank, peer], per_host) if per_host else None)
            if node.type != COMM_COLL:
                continue
            attrs = attr_dict(node)
            group = str(value_of(attrs["pg_name"])) if "pg_name" in attrs else ""
            members = groups.get(int(group), ()) if group.isdigit() and group != "0" else ()
            took = transfer.get((rank, node.id))
            if took is None:
                took = node_times(node, attrs)[1]
            samples.append(network.Sample(
                int(value_of(attrs["comm_type"])), int(value_of(attrs["comm_size"])),
                len(members) or max(world, npus), took * 1000))
            members = list(members) or list(range(ranks))
            shapes.append(network.shape_of(members, per_host) if per_host else None)
    system = dict(network.SYSTEM)
    if per_host:
        inner, outer = network.fit_two_dims(
            [s for s, shape in zip(samples, shapes) if shape is None or shape[1] < 2],
            [(s, shape) for s, shape in zip(samples, shapes) if shape and shape[1] > 1])
        text = network.two_dims_yaml(inner, outer, per_host, ranks // per_host)
        for key, value in system.items():
            if key.endswith("-implementation"):
                system[key] = value * 2
    else:
        text = network.fit(samples).yaml(npus)
    with storage.local_staging(staging) as where:
        Path(where, network.NETWORK_FILE).write_text(text)
        Path(where, network.SYSTEM_FILE).write_bytes(
            orjson.dumps(system, option=orjson.OPT_INDENT_2))
        Path(where, network.MEMORY_FILE).write_bytes(orjson.dumps(network.MEMORY))
