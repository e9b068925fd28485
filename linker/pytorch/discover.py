"""Find PyTorch ranks among the files given to ``convert`` and pair each rank's files.

In order:

1. A run manifest (``manifest.json`` written by our collectors) whose ``framework`` is a
   PyTorch one: ``{"framework": "pytorch", "world_size": N, "ranks": {"<r>": {"host_et":
   relpath, "kineto": relpath, "routing": relpath?}}}``; paths relative to the manifest.
2. Otherwise each ``.json`` / ``.json.gz`` file is sniffed from its first 64 KiB (never
   parsed whole here): a Kineto trace (``traceEvents`` / ``schemaVersion``) or a host ET
   (``schema`` + ``nodes``). A Kineto file's rank is ``distributedInfo.rank`` when it is in
   that head; otherwise, and for ETs, the rank number in the file name
   (``rank-3``, ``_rank3.``, ``worker3_``, ``dlrm_eg_3.json``).
3. Per rank, the ET and the Kineto trace are paired. A directory holding exactly one ET and
   one Kineto trace is one rank whatever the names say (``host_et.json.gz`` +
   ``kineto.json.gz``), and so are one ET and one Kineto trace given in all, wherever they
   are; where both name a rank and the two differ, a warning says so. ET-only and
   Kineto-only ranks are jobs too. (Whether the two are of one run is the linker's to say:
   by how many ops match.)

Warnings (not errors): ranks missing from ``world_size``, a rank with only one of two
files while other ranks have both, two traces of one kind for one rank (converted apart), and
each JSON file that is neither trace (empty, corrupt gzip, other content), with the reason.
"""

from __future__ import annotations

import re
import zlib
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import orjson

from chakra_hooks.common.errors import TraceFormatError
from chakra_hooks.linker.model import MAX_RANKS
from chakra_hooks.linker.sources import RankJob

FORMAT = "pytorch"
MANIFEST = "manifest.json"
_OWN_FILES = frozenset((MANIFEST, "comm_group.json"))  # JSON files of ours that are no trace
PYTORCH_FRAMEWORKS = frozenset(("pytorch", "torch", "vllm", "nemo"))
HEAD_BYTES = 65536
_RANK_MANIFEST = re.compile(r"^rank-\d+\.manifest\.json$")
_RANK_RE = re.compile(rb'"distributedInfo"\s*:\s*\{[^{}]*?"rank"\s*:\s*(\d+)')
_WORLD_RE = re.compile(rb'"distributedInfo"\s*:\s*\{[^{}]*?"world_size"\s*:\s*(\d+)')
_NAME_RANK = (
    re.compile(r"rank[-_]?(\d+)(?!\d)", re.IGNORECASE),
    re.compile(r"worker[-_]?(\d+)(?!\d)", re.IGNORECASE),
    re.compile(r"[-_](\d+)(?:\.pt\.trace)?\.json(?:\.gz)?$"),
)


def discover(files: list[Path], warn: Callable[[str], None]) -> tuple[list[RankJob], set[Path]]:
    """Claim the PyTorch traces among ``files``; one job per rank (see the module docstring)."""
    jobs: list[RankJob] = []
    claimed: set[Path] = set()
    for manifest in (f for f in files if f.name == MANIFEST):
        found = _from_manifest(manifest, warn)
        if found is not None:
            jobs.extend(found)
            claimed.add(manifest)
            claimed.update(p for job in found for p in job.files.values())
            # The per-rank manifests the collector merged into this one.
            claimed.update(f for f in files if f.parent == manifest.parent
                           and _RANK_MANIFEST.match(f.name))
            _claim_unlisted(manifest, files, claimed, warn)
    sniffed = []
    skipped: dict[str, list[Path]] = {}  # problem -> files
    for path in files:
        if path in claimed or not _is_json(path):
            continue
        found, problem = _sniff(path)
        if found is not None:
            sniffed.append(found)
        elif not _RANK_MANIFEST.match(path.name):
            skipped.setdefault(problem, []).append(path)
    # Said, not passed over: an empty or corrupt trace beside a good one would otherwise leave
    # its rank converted with half its data and no word why. One line per reason: a folder of
    # 10,000 empty files is one warning, not 10,000.
    for problem, paths in skipped.items():
        if len(paths) <= 3:
            for path in paths:
                warn(f"{path}: skipped: {problem}")
        else:
            warn(f"{len(paths):,} files skipped ({paths[0]}, {paths[1]}, ...): {problem}")
    if sniffed:
        _check_ranks(sniffed, warn)
        jobs.extend(_pair(sniffed, warn))
        claimed.update(s.path for s in sniffed)
    return jobs, claimed


def _claim_unlisted(manifest: Path, files: list[Path], claimed: set[Path],
                    warn: Callable[[str], None]) -> None:
    """Traces beside a manifest that it does not list belong to an earlier run in the same
    folder (e.g. one with more ranks): converting them would mix two runs."""
    stale = sorted(f for f in files if f.parent == manifest.parent and f not in claimed and _is_json(f))
    if stale:
        warn(f"{manifest}: ignoring {len(stale)} trace file(s) the manifest does not list, "
             f"left by an earlier run? ({', '.join(f.name for f in stale[:4])})")
        claimed.update(stale)


def _is_json(path: Path) -> bool:
    name = path.name.lower()
    return name.endswith((".json", ".json.gz")) and name not in _OWN_FILES


class _Sniffed:
    __slots__ = ("path", "role", "rank", "world", "name_rank")

    def __init__(self, path: Path, role: str, rank: int | None, world: int | None,
                 name_rank: int | None = None) -> None:
        self.path, self.role, self.rank, self.world = path, role, rank, world
        self.name_rank = name_rank  # the rank the file's name carries, if any


def _check_ranks(sniffed: list[_Sniffed], warn: Callable[[str], None]) -> None:
    """A Kineto trace's rank is below its own world size; where its name carries a rank
    too, the two agree (or the trace was relabelled, or renamed: said)."""
    for s in sniffed:
        if s.role != "kineto" or s.rank is None:
            continue
        if s.world and s.rank >= s.world:
            raise TraceFormatError(s.path, "distributedInfo.rank",
                                   f"a rank below the trace's world_size {s.world}, got {s.rank}")
        if s.name_rank is not None and s.name_rank != s.rank:
            warn(f"{s.path}: its name says rank {s.name_rank}, its distributedInfo rank "
                 f"{s.rank}: converted as rank {s.rank} (relabelled or renamed?)")


def _head(path: Path) -> tuple[bytes, str]:
    """The first HEAD_BYTES of the file's content (gunzipped), or b"" and what is wrong."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(HEAD_BYTES)
    except OSError as exc:
        return b"", f"cannot be read ({exc.strerror or exc})"
    if not data:
        return b"", "the file is empty"
    if data[:2] == b"\x1f\x8b":
        try:
            data = zlib.decompressobj(31).decompress(data, HEAD_BYTES)
        except zlib.error as exc:
            return b"", f"not a valid gzip stream ({exc})"
        if not data:
            return b"", "empty once gunzipped"
    return data, ""


def _sniff(path: Path) -> tuple[_Sniffed | None, str]:
    """What the file is, or None and why it is neither a Kineto trace nor a host ET."""
    head, problem = _head(path)
    if problem:
        return None, problem
    name_rank = rank_from_name(path.name)
    if b'"traceEvents"' in head or b'"schemaVersion"' in head or b'"deviceProperties"' in head:
        rank, world = _RANK_RE.search(head), _WORLD_RE.search(head)
        return _Sniffed(path, "kineto", int(rank.group(1)) if rank else name_rank,
                        int(world.group(1)) if world else None, name_rank), ""
    if b'"nodes"' in head and b'"schema"' in head:
        return _Sniffed(path, "host_et", name_rank, None), ""
    return None, (f"neither a Kineto trace ('traceEvents') nor a PyTorch ET ('schema' and "
                  f"'nodes') in its first {HEAD_BYTES // 1024} KiB")


def rank_from_name(name: str) -> int | None:
    """The rank number a file name carries, if any."""
    for pattern in _NAME_RANK:
        found = pattern.search(name)
        if found:
            return int(found.group(1))
    return None


def _from_manifest(manifest: Path, warn: Callable[[str], None]) -> list[RankJob] | None:
    try:
        doc = orjson.loads(manifest.read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        warn(f"{manifest}: not a readable run manifest ({exc}); files are discovered by content")
        return None
    if not isinstance(doc, dict) or str(doc.get("framework", "")).lower() not in PYTORCH_FRAMEWORKS:
        return None
    ranks = doc.get("ranks")
    if not isinstance(ranks, dict):
        warn(f"{manifest}: 'ranks' is not an object of rank -> files; ignored")
        return None
    jobs = []
    for key, roles in sorted(ranks.items(), key=lambda kv: int(kv[0]) if str(kv[0]).isdigit()
                             else -1):
        if not str(key).isdigit() or not isinstance(roles, dict):
            warn(f"{manifest}: rank entry {key!r} is not '<rank>': {{role: path}}; skipped")
            continue
        files = {}
        for role, rel in roles.items():
            path = manifest.parent / str(rel)
            if path.is_file():
                files[role] = path
            else:
                warn(f"{manifest}: rank {key}: {role} file {rel} is missing")
        if "host_et" in files or "kineto" in files:
            jobs.append(RankJob(FORMAT, files, int(key), {"manifest": str(manifest),
                                                          **_host(doc, key)}))
    _warn_missing({j.rank for j in jobs}, doc.get("world_size"), str(manifest), warn)
    return jobs


def _host(doc: dict, rank: str) -> dict[str, str]:
    """The rank's ``host`` and ``host_clock`` as its manifest states them (strings only)."""
    hosts = doc.get("hosts")
    entry = hosts.get(rank) if isinstance(hosts, dict) else None
    if not isinstance(entry, dict):
        return {}
    return {k: entry[k] for k in ("host", "host_clock") if isinstance(entry.get(k), str)}


def _pair(sniffed: list[_Sniffed], warn: Callable[[str], None]) -> list[RankJob]:
    by_dir: dict[Path, list[_Sniffed]] = defaultdict(list)
    roles = [s.role for s in sniffed]
    if roles.count("host_et") == 1 and roles.count("kineto") == 1:
        by_dir[Path()] = list(sniffed)  # one ET and one Kineto trace in all: a pair, wherever
    else:
        for s in sniffed:
            by_dir[s.path.parent].append(s)
    per_rank: dict[int | None, dict[str, list[Path]]] = defaultdict(lambda: defaultdict(list))
    for group in by_dir.values():
        roles = [s.role for s in group]
        if roles.count("host_et") == 1 and roles.count("kineto") == 1:
            kineto = next(s for s in group if s.role == "kineto")
            et = next(s for s in group if s.role == "host_et")
            rank = kineto.rank if kineto.rank is not None else et.rank
            if et.rank is not None and kineto.rank is not None and et.rank != kineto.rank:
                warn(f"{et.path.name} names rank {et.rank} and {kineto.path.name} rank "
                     f"{kineto.rank}: paired as rank {rank} (the Kineto trace's); two ranks' "
                     "files? (the ops' match rate says how well they fit)")
            per_rank[rank]["host_et"].append(et.path)
            per_rank[rank]["kineto"].append(kineto.path)
            continue
        for s in group:
            per_rank[s.rank][s.role].append(s.path)
    worlds = {s.world for s in sniffed if s.world}
    if len(worlds) > 1:
        # Ranks of one run agree on its size: these are traces of different jobs.
        by_world = {}
        for s in sniffed:
            if s.world:
                by_world.setdefault(s.world, s.path)
        shown = ", ".join(f"{path.name} ({world} ranks)" for world, path in sorted(by_world.items()))
        raise TraceFormatError(
            by_world[max(by_world)].parent, "distributedInfo.world_size",
            f"one world size for the Kineto traces of one run; they name {len(worlds)}: "
            f"{shown}: convert each job apart")
    jobs = _jobs(per_rank, warn)
    if len(worlds) == 1:
        _warn_missing({j.rank for j in jobs}, worlds.pop(), "the Kineto traces", warn)
    return jobs


def _jobs(per_rank: dict, warn: Callable[[str], None]) -> list[RankJob]:
    paired = any(len(r["host_et"]) and len(r["kineto"]) for r in per_rank.values())
    jobs = []
    for rank in sorted(per_rank, key=lambda r: (r is None, r or 0)):
        roles = per_rank[rank]
        ets, kinetos = sorted(roles["host_et"]), sorted(roles["kineto"])
        if len(ets) > 1 or len(kinetos) > 1:
            warn(f"{_rank_words(rank)}: {len(ets)} host ETs and {len(kinetos)} Kineto traces; "
                 "each is converted on its own")
            jobs.extend(RankJob(FORMAT, {"host_et": p}, rank, {"label": p.name}) for p in ets)
            jobs.extend(RankJob(FORMAT, {"kineto": p}, rank, {"label": p.name}) for p in kinetos)
            continue
        files = {}
        if ets:
            files["host_et"] = ets[0]
        if kinetos:
            files["kineto"] = kinetos[0]
        if paired and len(files) == 1:
            missing = "Kineto trace" if ets else "host ET"
            warn(f"{_rank_words(rank)}: no {missing} next to {next(iter(files.values())).name}; "
                 "converted with what there is")
        jobs.append(RankJob(FORMAT, files, rank))
    return jobs


def _rank_words(rank: int | None) -> str:
    """How a message names a rank: the number, or that neither the trace nor its name had one."""
    if rank is not None:
        return f"rank {rank}"
    return "rank unknown (no distributedInfo, none in the file names)"


def _warn_missing(ranks: set, world: object, source: str, warn: Callable[[str], None]) -> None:
    if type(world) is not int or not 0 < world <= MAX_RANKS:
        if world is not None:
            warn(f"{source} name a world size of {str(world)[:24]}, which is no rank count: "
                 "ignored")
        return
    missing = sorted(set(range(world)) - ranks)
    if not missing:
        return
    shown = ", ".join(map(str, missing[:8])) + (" ..." if len(missing) > 8 else "")
    warn(f"{len(missing)} of {world} ranks named by {source} have no trace (missing: {shown})")
