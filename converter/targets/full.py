"""The ``full`` target: everything the linked trace holds (METADATA and MEM nodes, every
collective type, gaps per lane), for analysis and replay tools that run every thread and stream
in parallel. Rules of a target: converter/targets/__init__.py."""

from __future__ import annotations

from collections.abc import Callable

from chakra_hooks.linker.enrich.gaps import add_gaps
from chakra_hooks.linker.model import LinkedTrace, Op

NEEDS_RUN_COLLECTIVES = False
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
    return groups  # every group as recorded (torch's default group is "0")
