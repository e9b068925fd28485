"""The capture directory's manifests, written atomically and without collectives.

Layout of a capture directory written by :func:`chakra_hooks.collectors.torch.trace`::

    <outdir>/manifest.json                 run manifest (merged from the rank manifests)
    <outdir>/rank-<r>.manifest.json        what rank r recorded
    <outdir>/host_et.rank<r>.json          PyTorch execution trace (ExecutionTraceObserver)
    <outdir>/kineto.rank<r>.pt.trace.json  Kineto trace of the same window (same rf ids)
    <outdir>/routing.rank<r>.json          MoE routing bins (only when routers ran)

``manifest.json`` (read by the PyTorch discoverer) has the keys ``format``, ``framework``,
``versions``, ``world_size``, ``steps``, ``complete``, ``process_groups``, ``clocks``,
``expected_ranks``, ``missing_ranks``, ``ranks`` (role -> file, only files that exist:
``{"<r>": {"host_et": relpath, "kineto": relpath, "routing": relpath}}``, paths relative to
the capture directory), ``rank_status`` (``{"<r>": {"complete", "error", "steps"}}``) and
``hosts`` (``{"<r>": {"host", "host_clock"}}``: which ranks share a machine, and which share
one clock: ranks in containers or network namespaces of one machine differ in the first, not
in the second).
``complete`` is true only when every expected rank recorded its whole window.

Why no collectives: a barrier in the collector could hang a job whose other rank crashed.
Instead every rank writes its own file, then merges whatever rank files exist. The merged file
is written with ``os.replace`` (overwriting) only by a rank that sees every expected rank; a
rank that sees only some of them writes the partial merge with ``os.link``, which never
overwrites. So the full merge always wins, and a run with a crashed rank still gets a manifest
that says which ranks are missing.
"""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path

from ..files import atomic_write_json

FORMAT = "chakra-hooks-capture/1"
RUN_MANIFEST = "manifest.json"
_RANK_FILE = re.compile(r"^rank-(\d+)\.manifest\.json$")


def host_identity() -> dict:
    """Where this process runs: its host name, and the machine's boot id, which every process
    of one running kernel shares (containers and namespaces included) and no other machine
    has: ranks with one ``host_clock`` read one clock."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            clock = f.read().strip() or None
    except OSError:
        clock = None
    return {"host": socket.gethostname(), "host_clock": clock}


def rank_manifest_name(rank: int) -> str:
    return f"rank-{rank}.manifest.json"


def write_rank_manifest(outdir: Path, entry: dict) -> None:
    atomic_write_json(outdir / rank_manifest_name(int(entry["rank"])), entry)


def read_rank_manifests(outdir: Path) -> dict[int, dict]:
    found: dict[int, dict] = {}
    for p in outdir.iterdir():
        m = _RANK_FILE.match(p.name)
        if not m:
            continue
        try:
            found[int(m.group(1))] = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue  # a rank file being replaced right now; the last rank rereads it
    return found


def merge(entries: dict[int, dict], expected: list[int]) -> dict:
    """The run manifest for the rank manifests found so far."""
    first = entries[min(entries)]
    # "ranks" maps roles to files only (the discoverer treats every value as a path).
    ranks = {str(r): {role: rel for role, rel in e["files"].items() if rel}
             for r, e in sorted(entries.items())}
    status = {str(r): {"complete": bool(e.get("complete")), "error": e.get("error"),
                       "steps": e.get("steps", [])} for r, e in sorted(entries.items())}
    missing = [r for r in expected if r not in entries]
    steps = sorted({s for e in entries.values() for s in e.get("steps", [])})
    # A rank only sees the groups it belongs to: the run's groups are the union.
    by_name: dict[str, dict] = {}
    for _, e in sorted(entries.items()):
        for g in e.get("process_groups", []):
            by_name.setdefault(str(g.get("pg_name")), g)
    pgs = [by_name[k] for k in sorted(by_name, key=lambda n: (len(n), n))]
    return {
        "format": FORMAT,
        "framework": first.get("framework", "pytorch"),
        "versions": first.get("versions", {}),
        "world_size": first.get("world_size", len(expected)),
        "steps": steps,
        "complete": not missing and all(v["complete"] for v in status.values()),
        "process_groups": pgs,
        "clocks": first.get("clocks", {}),
        "expected_ranks": expected,
        "missing_ranks": missing,
        "ranks": ranks,
        "rank_status": status,
        "hosts": {str(r): e["host"] for r, e in sorted(entries.items()) if "host" in e},
    }


def update_run_manifest(outdir: Path, expected: list[int]) -> bool:
    """Merge the rank manifests into ``manifest.json``; True if this call wrote the full one."""
    # Rank files of other runs in the same directory (e.g. a larger world) are not ours.
    entries = {r: e for r, e in read_rank_manifests(outdir).items() if r in expected}
    if not entries:
        return False
    full = all(r in entries for r in expected)
    wrote = atomic_write_json(outdir / RUN_MANIFEST, merge(entries, expected), overwrite=full)
    return full and wrote
