"""Dependency-graph checks shared by the converter (before writing) and validate (after reading)."""

from __future__ import annotations

from collections.abc import Iterable


def unfinished_nodes(dependencies: Iterable[tuple[int, Iterable[int]]]) -> list[int]:
    """Kahn's algorithm: the nodes that can never run because they sit on or behind a cycle.

    ``dependencies`` yields (node, the nodes it waits for); every node must be yielded once, and
    every dependency must name a yielded node (filter missing ones first). Empty when acyclic.
    """
    waiting: dict[int, int] = {}
    dependants: dict[int, list[int]] = {}
    for node, deps in dependencies:
        count = 0
        for dep in deps:
            count += 1
            dependants.setdefault(dep, []).append(node)
        waiting[node] = count
    ready = [node for node, count in waiting.items() if count == 0]
    while ready:
        node = ready.pop()
        for child in dependants.get(node, ()):
            waiting[child] -= 1
            if not waiting[child]:
                ready.append(child)
    return sorted(node for node, count in waiting.items() if count > 0)
