"""Process groups of one PyTorch rank -> small integer ids for ``CommInfo.group``.

Sources: Kineto ``distributedInfo.pg_config``, the ET's ``## process_group:init ##`` node
and ``record_param_comms`` (``pg_name`` with ``global_rank_start/stride`` and ``pg_size``).

Ids must agree across ranks without the ranks talking to each other. PyTorch names groups
with a counter that every rank advances in the same order (``new_group`` is collective), so
a numeric ``pg_name`` IS the id. Non-numeric names (rare: user-named groups) get
``NAMED_BASE + position in sorted name order``. A group that spans the whole world maps to
``None`` (ASTRA-sim reads an empty ``pg_name`` as all ranks) but is still listed in
``LinkedTrace.groups``. Caveat for the writer of ``comm_group.json``: split groups
(``new_subgroups``) reuse one name for disjoint rank sets on different ranks; merge the
per-rank tables and renumber on conflict.
"""

from __future__ import annotations

import re

import orjson

NAMED_BASE = 100_000
# A process group's description that names data parallelism.
DATA_PARALLEL = re.compile(r"(?i)(?:^|[^a-z])(?:data[_ ]?parallel|dp)(?:[^a-z]|$)")


class Groups:
    def __init__(self, world: int | None) -> None:
        self.world = world
        self.by_name: dict[str, list[int]] = {}
        self.descs: dict[str, str] = {}  # name -> the group's description (``pg_desc``)
        # collectives resolved to "all ranks" only because nothing said which group they ran on
        self.unresolved = 0

    def add(self, name: object, ranks: list[int] | None, size: object = None) -> None:
        if name in (None, ""):
            return
        name = str(name)
        if not ranks and isinstance(size, int) and size > 0 and size == self.world:
            ranks = list(range(size))  # the ET writes [] for groups that span the world
        if ranks:
            self.by_name.setdefault(name, sorted(ranks))

    def add_pg_config(self, configs: object) -> None:
        """Kineto ``pg_config`` or the ET process-group init list."""
        if isinstance(configs, str):
            try:
                configs = orjson.loads(configs)
            except orjson.JSONDecodeError:
                return
        if not isinstance(configs, list):
            return
        for cfg in configs:
            if isinstance(cfg, dict):
                ranks = cfg.get("ranks")
                self.add(cfg.get("pg_name"), ranks if isinstance(ranks, list) else None,
                         cfg.get("pg_size", cfg.get("group_size")))
                desc = cfg.get("pg_desc")
                if isinstance(desc, str) and cfg.get("pg_name") not in (None, ""):
                    self.descs.setdefault(str(cfg["pg_name"]), desc)

    def resolve(self, name: str | None, ranks: list[int] | None) -> int | None:
        """The id of the group a collective ran on; None = all ranks (or unknown)."""
        if name is not None and ranks:
            self.add(name, ranks)
        ranks = self.by_name.get(name) if name is not None else ranks
        if not ranks:
            self.unresolved += 1
            return None
        if self.world and ranks == list(range(self.world)):
            return None
        if name is None:
            name = next((n for n, r in self.by_name.items() if r == sorted(ranks)), None)
            if name is None:
                return None
        return self._id(name)

    def _id(self, name: str) -> int:
        if name.isdigit():
            return int(name)
        named = sorted(n for n in self.by_name if not n.isdigit())
        return NAMED_BASE + named.index(name)

    def subgroups(self) -> list[list[int]]:
        """The groups known that are not the whole run."""
        return [r for r in self.by_name.values() if not self.world or r != list(range(self.world))]

    def table(self) -> dict[int, list[int]]:
        return {self._id(name): ranks for name, ranks in self.by_name.items()}

    def data_parallel(self) -> list[int]:
        """The ids of the groups that are not the whole run whose description says data
        parallel (Megatron's ``DATA_PARALLEL_GROUP``, ``EXPERT_DATA_PARALLEL_GROUP``; a device
        mesh's ``mesh_dp``, ``mesh_dp_shard``): the groups ``scale`` grows. Only this role is
        kept of a description, not its words."""
        return sorted(self._id(name) for name, desc in self.descs.items()
                      if name in self.by_name and DATA_PARALLEL.search(desc)
                      and not (self.world and self.by_name[name] == list(range(self.world))))
