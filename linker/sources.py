"""How `convert` finds its inputs: each input format contributes a discoverer and a loader.

A discoverer looks at the files it was given (directories already expanded, sorted) and claims
the ones it understands, grouped into jobs, one per rank (or, for formats that hold several
devices in one file, one per file). A loader turns one job into linked traces. The convert
command runs loaders in parallel worker processes, so jobs and their loaders must be picklable
(plain paths and strings; loaders named by module path, imported in the worker).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from chakra_hooks.linker.model import LinkedTrace


@dataclass(slots=True)
class RankJob:
    """One unit of conversion work."""

    format: str  # key of LOADERS, e.g. "pytorch" or "xla"
    files: dict[str, Path]  # role -> file, e.g. {"host_et": ..., "kineto": ...}
    rank: int | None = None  # None when the loader finds the rank(s) in the file itself
    options: dict[str, object] = field(default_factory=dict)  # e.g. from a run manifest

    def describe(self) -> str:
        names = ", ".join(f"{role}={path.name}" for role, path in sorted(self.files.items()))
        rank = (f"rank {self.rank}" if self.rank is not None
                else "rank not known yet (read from the trace)")
        return f"{self.format} {rank} ({names})"


# Discoverers: "module:function" taking (files: list[Path], warn: Callable[[str], None]) and
# returning (jobs, claimed files). Tried in this order; a file claimed by one is not offered to
# the next. Loaders: "module:function" taking a RankJob and returning list[LinkedTrace], or a
# TraceStream when a file holds many devices and only one device's trace should be in memory.
DISCOVERERS: dict[str, str] = {
    "xla": "chakra_hooks.linker.xla.discover:discover",
    "pytorch": "chakra_hooks.linker.pytorch.discover:discover",
}
LOADERS: dict[str, str] = {
    "xla": "chakra_hooks.linker.xla.link:load_each",
    "pytorch": "chakra_hooks.linker.pytorch.link:load",
}


@dataclass(slots=True)
class TraceStream:
    """A job's linked traces, made one at a time as they are taken, their number known up
    front (the progress bar). Iterate it once."""

    count: int
    traces: Iterator[LinkedTrace]

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[LinkedTrace]:
        return self.traces
