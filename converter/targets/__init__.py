"""Output targets: who reads the ETs, and what that reader needs of them.

``full`` (the default) keeps everything the linked trace holds, for analysis and replay tools;
``astra-sim`` writes what ASTRA-sim accepts and the files it runs with. Each target is one
module here, with the same names:

- ``prepare(trace, options)``: on the linked trace, before its graph is built (the slack gaps,
  as this reader will replay them: linker/enrich/gaps.py);
- ``retarget(ops, keep_mem)``: the ops to write, kinds changed where the reader refuses them;
- ``NEEDS_RUN_COLLECTIVES`` and ``finish_run(staging, results, groups, options, note, runner)``:
  after every rank's ET is staged, the rules across ranks and the files beside the ETs
  (returns the process groups to write in comm_group.json); what the workers hand over for
  it: ``"facts"`` (each communication node's id, type, times and comm attributes as plain
  values), ``"nodes"`` (those and the serialised communication nodes), or False;
- ``FILES``: the files ``finish_run`` writes beside the ETs (``--overwrite`` replaces them);
- ``COMM_GROUP_ALWAYS``: comm_group.json is written even when the run has no process group;
- ``REFUSED_NODE_TYPES``, ``COMM_TYPES`` (None: any), ``COMM_SIZE_REQUIRED``: what
  ``validate --target`` checks beyond the Chakra schema.

A third reader (another simulator, a replay tool) is a module here and a member of Target.
"""

from __future__ import annotations

import importlib
from enum import Enum
from types import ModuleType


class Target(str, Enum):
    FULL = "full"
    ASTRA_SIM = "astra-sim"


# validate's older name of the full target's rules, still accepted
ALIASES = {"chakra": Target.FULL}
NAMES = tuple(t.value for t in Target)
_MODULES = {Target.FULL: "chakra_hooks.converter.targets.full",
            Target.ASTRA_SIM: "chakra_hooks.converter.targets.astra_sim"}


def parse_target(name: str | Target) -> Target:
    """The Target a name (or an alias) stands for; ValueError for any other."""
    if isinstance(name, Target):
        return name
    found = ALIASES.get(name)
    if found is not None:
        return found
    try:
        return Target(name)
    except ValueError:
        raise ValueError(f"unknown target {name!r}; expected one of {', '.join(NAMES)}") from None


def rules(target: str | Target) -> ModuleType:
    """The module holding ``target``'s rules (imported when first asked for)."""
    return importlib.import_module(_MODULES[parse_target(target)])


def all_files() -> tuple[str, ...]:
    """Every file a target writes beside the ETs."""
    return tuple(name for target in Target for name in rules(target).FILES)
