"""The ``full`` target: everything the linked trace holds (METADATA and MEM nodes, every
collective type, gaps per lane), for analysis and replay tools that run every thread and stream
in parallel. Rules of a target: converter/targets/__init__.py."""

from __future__ import annotations

from collections.abc import Callable

from chakra_hooks.linker.enrich.gaps import add_gaps
from chakra_hooks.linker.model import LinkedTrace, Op

NEEDS_RUN_COLLECTIVES = "facts"  # for converter/peers.py's peer_wait_ns
FILES: tuple[str, ...] = ()
COMM_GROUP_ALWAYS = False
REFUSED_NODE_TYPES: frozenset[int] = frozenset()
COMM_TYPES: frozenset[int] | None = None
COMM_SIZE_REQUIRED = False


def prepare(trace: LinkedTrace, options) -> None:
    if options.gaps:
        add_gaps(trace)


def retarget(ops: list[Op], keep_mem: bool) -> list[Op]:
    return ops


def finish_run(staging: str, results: list, groups: dict[int, list[int]], options,
               note: Callable[[str], None], runner) -> dict[int, list[int]]:
    """Each communication node's wait for its peers (converter/peers.py), written into the
    staged ETs; returns every group as recorded (torch's default group is "0")."""
    annotate_peers(staging, results, groups, options, note, runner)
    return groups


def annotate_peers(staging: str, results: list, groups: dict[int, list[int]], options,
                   note: Callable[[str], None], runner) -> None:
    """``peer_wait_ns`` / ``peer_wait_unknown`` on the communication nodes, from the facts the
    workers handed over, appended to those nodes in the staged files by tasks of ``runner``
    (run_files.append_attrs: no ET is decoded)."""
    from chakra_hooks.converter import peers
    from chakra_hooks.converter.targets.run_files import append_attrs

    if not any(r.comm_facts for r in results):
        return
    found, additions = peers.annotate_facts({r.rank: r.comm_facts for r in results},
                                            {str(k): v for k, v in groups.items()},
                                            world_size(results), rank_metadata(results))
    for message in found.notes:
        note(message)
    tasks = [(f"{staging}/{r.files[0]}", f"{staging}/{r.files[1]}" if options.write_json else None,
              additions.get(r.rank, [])) for r in results]
    for result, added in zip(results, runner.map(append_attrs, tasks)):
        if added:
            unknown = result.summary.setdefault("unknown", {})
            unknown[peers.UNKNOWN_ATTR] = unknown.get(peers.UNKNOWN_ATTR, 0) + added


def rank_metadata(results: list) -> dict[int, dict]:
    """Per rank, its ET's metadata (host, host_clock, world_size)."""
    return {r.rank: r.summary.get("metadata") or {} for r in results}


def world_size(results: list) -> int:
    """The run's size: the largest ``world_size`` an ET states, else the ranks present."""
    return max([int(meta.get("world_size") or 0) for meta in rank_metadata(results).values()]
               + [max((r.rank for r in results), default=-1) + 1])


def peer_waits(results: list, groups: dict[int, list[int]], nodes: dict, note: Callable[[str], None]):
    """The run's waits for peers, matched from the facts the workers handed over (exact
    times, as ``annotate_peers`` does for the full target), written onto the decoded
    communication ``nodes`` (rank -> nodes, changed in place); the run's size taken from the
    ETs' ``world_size``; the matching's notes (clocks that disagree, groups not all recorded)
    said. Returns its Peers."""
    from chakra_hooks.converter import peers

    found = peers.analyse(peers.ranks_from_facts({r.rank: r.comm_facts for r in results},
                                                 rank_metadata(results)),
                          {str(k): v for k, v in groups.items()}, world_size(results))
    peers.annotate_nodes(nodes, found)
    for message in found.notes:
        note(message)
    return found
