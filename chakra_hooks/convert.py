"""`convert`: find every rank's raw files, link and convert them in parallel, write the ETs.

Nothing is written into the output folder until every rank has converted: files are staged in
a hidden folder beside them and moved in at the end, so a failure leaves no partial output.
"""

from __future__ import annotations

import errno
import importlib
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from chakra_hooks import storage
from chakra_hooks.common.errors import TraceFormatError
from chakra_hooks.converter.options import ConvertOptions
from chakra_hooks.converter.targets import all_files, rules
from chakra_hooks.executors import job_memory, make_executor, progress_bar
from chakra_hooks.linker.gc_pause import gc_paused
from chakra_hooks.linker.model import LinkedTrace
from chakra_hooks.linker.sources import DISCOVERERS, LOADERS, RankJob
from chakra_hooks.common.progress import reached

if TYPE_CHECKING:
    from chakra_hooks.converter.summary import Tally

OUTPUT_SUFFIXES = (".et", ".et.gz")
LINKED = 0.65  # share of a job's conversion done when its traces are linked (progress bar)
COMM_GROUP_FILE = "comm_group.json"


@dataclass
class RankResult:
    """What one converted rank looks like, for the summary table and for callers."""

    rank: int
    files: list[str]
    summary: dict[str, object]  # converter.summary.Summary.to_json()
    stats: dict[str, float | int]
    groups: dict[int, list[int]]
    warnings: list[str]
    source: str
    # For rules across ranks (--target astra-sim): the COMM_COLL nodes as (place among the
    # file's nodes, serialised node), and the counts of all other nodes.
    collectives: list[tuple[int, bytes]] = field(default_factory=list)
    others_tally: Tally | None = None
    # The communication nodes as plain values, for matching them across ranks (graph.py).
    comm_facts: list[tuple] = field(default_factory=list)


@dataclass
class ConvertResult:
    outdir: Path | str  # a str for a URL
    ranks: list[RankResult]
    comm_group: Path | str | None
    warnings: list[str] = field(default_factory=list)


def _resolve(spec: str) -> Callable:
    """The function a "module:function" entry of linker/sources.py names."""
    module_name, func = spec.split(":")
    return getattr(importlib.import_module(module_name), func)


def expand_inputs(inputs: Sequence[str | os.PathLike],
                  warn: Callable[[str], None] | None = None) -> list[Path]:
    """Files named, plus every file below folders named (sorted), minus Chakra outputs: ETs,
    comm_group.json, and every file of a folder below that holds ETs (a conversion's output
    folder, with its timelines and simulator configurations; said once per folder)."""
    files: list[Path] = []
    for item in inputs:
        path = Path(item)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if not p.name.startswith("."))
            # (the folder named itself is the user's choice, whatever it holds)
            outputs = {p.parent for p in found if p.name.endswith(OUTPUT_SUFFIXES)} - {path}
            for folder in sorted(outputs):
                if warn is not None:
                    warn(f"{folder}: left out, it holds a conversion's output (ETs; its other "
                         f"files, timelines and configurations, are not traces either)")
            files.extend(p for p in found if p.is_file() and not outputs.intersection(p.parents))
        elif path.is_file():
            files.append(path)
        else:
            raise FileNotFoundError(f"{path}: no such file or directory")
    unique = list(dict.fromkeys(f.resolve() for f in files))  # a file named twice is one file
    return [f for f in unique if not f.name.endswith(OUTPUT_SUFFIXES) and f.name != COMM_GROUP_FILE]


def discover(inputs: Sequence[str | os.PathLike], warn: Callable[[str], None]) -> list[RankJob]:
    """Every conversion job found in the inputs, in rank order."""
    remaining = expand_inputs(inputs, warn)
    jobs: list[RankJob] = []
    for spec in DISCOVERERS.values():
        if not remaining:
            break
        found, claimed = _resolve(spec)(remaining, warn)
        jobs.extend(found)
        remaining = [f for f in remaining if f not in claimed]
    return sorted(jobs, key=lambda job: (job.rank is None, job.rank if job.rank is not None else 0))


def convert_job(job: RankJob, staging: str, options: ConvertOptions) -> list[RankResult]:
    """Load one job, build and write its graphs. Runs in a worker process (which fetches a
    remote job's files itself and uploads its ETs to a remote staging prefix: storage.py)."""
    with storage.local_job(job) as job, storage.local_staging(staging) as where:
        try:
            return _convert_local_job(job, where, options)
        except RecursionError:  # a reader's recursion (JSON args nested thousands deep)
            files = ", ".join(str(p) for p in job.files.values()) or job.describe()
            raise TraceFormatError(files, "a value nested too deeply", "values nested fewer "
                                   f"than about {sys.getrecursionlimit():,} levels (the reader "
                                   "recurses into each)") from None


def _convert_local_job(job: RankJob, staging: str, options: ConvertOptions) -> list[RankResult]:
    """read -> link -> enrich (the format's loader, linker/sources.py), then per linked trace:
    the target's preparation -> the graph -> the file."""
    loader = _resolve(LOADERS[job.format])
    with gc_paused():  # conversion builds millions of objects, none in a reference cycle
        traces = loader(job)
        linked = LINKED if isinstance(traces, list) else 0.0  # a TraceStream links as it goes
        reached(linked)
        results = []
        for done, trace in enumerate(traces, 1):
            results.append(_convert_trace(trace, job, staging, options))
            reached(linked + (1 - linked) * done / len(traces))
        return results


def _convert_trace(trace: LinkedTrace, job: RankJob, staging: str,
                   options: ConvertOptions) -> RankResult:
    from chakra_hooks.converter import etio, graph

    target = rules(options.target)
    target.prepare(trace, options)  # e.g. the slack gaps, as this target replays them
    chakra = graph.build_graph(trace, target=options.target, keep_mem=options.keep_mem,
                               consume=True)
    path = Path(staging) / f"{options.prefix}.{trace.rank}.et"
    etio.write_et(path, chakra.metadata_body, chakra.bodies)
    files = [path.name]
    if options.write_json:
        json_path = path.with_suffix(".json")
        etio.write_workload_json(json_path, chakra.nodes)
        files.append(json_path.name)
    summary = chakra.tally.summary(path.name, chakra.version, chakra.metadata_values).to_json()
    # What the target's rules across ranks may rewrite (its finish_run).
    collectives = ([(i, chakra.bodies[i]) for i in chakra.collectives]
                   if target.NEEDS_RUN_COLLECTIVES == "nodes" else [])
    return RankResult(trace.rank, files, summary, {**trace.stats, **chakra.stats},
                      chakra.groups, chakra.warnings, job.describe(), collectives, chakra.others_tally,
                      chakra.comm_facts if target.NEEDS_RUN_COLLECTIVES else [])


def _merge_groups(results: list[RankResult]) -> tuple[dict[int, list[int]], list[str]]:
    groups: dict[int, list[int]] = {}
    problems = []
    for result in results:
        for gid, ranks in result.groups.items():
            if gid in groups and groups[gid] != list(ranks):
                problems.append(f"process group {gid}: rank {result.rank} says {list(ranks)}, "
                                f"another rank says {groups[gid]}")
            groups.setdefault(gid, list(ranks))
    return dict(sorted(groups.items())), problems


def convert_paths(inputs: Sequence[str | os.PathLike], outdir: str | os.PathLike,
                  options: ConvertOptions | None = None, *, workers: int | None = None,
                  progress: bool | None = None, warn: Callable[[str], None] | None = None,
                  overwrite: bool = False, executor: str = "local",
                  ray_address: str | None = None, **changes: object) -> ConvertResult:
    """Convert every rank found in ``inputs`` into ``outdir``. Raises TraceFormatError on bad
    input, and when ``outdir`` holds an earlier conversion's files (``overwrite``: replace
    them; other files are never touched). Writes everything or nothing.

    What is written: ``options``, with any of its fields given as keywords instead
    (``target="astra-sim"``, ``prefix=...``: converter/options.py). How: ``executor`` "local"
    (processes on this machine, ``workers`` of them) or "ray" (a task per rank on the Ray
    cluster at ``ray_address``, else ``RAY_ADDRESS``, else a local Ray; every node must see
    the inputs and the output folder)."""
    options = replace(options or ConvertOptions(), **changes)
    prefix = options.prefix
    warnings: list[str] = []

    def note(message: str) -> None:
        warnings.append(message)
        if warn is not None:
            warn(message)

    remote_out = storage.RemoteOutput(str(outdir)) if storage.is_url(outdir) else None
    out: Path | str = str(outdir).rstrip("/") if remote_out else Path(outdir)
    # checked first: a refusal should not wait for discovery
    earlier = (_ours(remote_out.names(), prefix) if remote_out
               else [p.name for p in our_outputs(out, prefix)])
    if earlier and not overwrite:
        _refuse_earlier(out, earlier)
    heads = None
    lock = None  # local stand-ins of remote inputs (storage.mirror_inputs)
    staging = None
    done = False
    runner = None
    created = False
    try:
        local_inputs = [item for item in inputs if not storage.is_url(item)]
        remote_inputs = [str(item) for item in inputs if storage.is_url(item)]
        mirrored: dict[Path, tuple[str, int]] = {}
        if remote_inputs:
            heads = tempfile.mkdtemp(prefix="chakra-hooks-heads-")
            mirrored = storage.mirror_inputs(remote_inputs, Path(heads))
            local_inputs.append(heads)
        jobs = discover(local_inputs, note)
        if not jobs:
            raise TraceFormatError(", ".join(map(str, inputs)), "inputs",
                                   "PyTorch ET / Kineto JSON or XSpace (.xplane.pb) files; found none")
        for job in jobs:
            remote = {role: mirrored[path.resolve()] for role, path in job.files.items()
                      if path.resolve() in mirrored}
            if remote:
                job.options["remote"] = remote
            if options.force_pair:  # link ET + Kineto however few ops match (linker/pytorch/link.py)
                job.options["force_pair"] = True
        _refuse_duplicate_ranks([(job.rank, job.describe()) for job in jobs if job.rank is not None],
                                inputs)
        if remote_out:
            staging = remote_out.make_staging()
        else:
            created = not out.exists()
            try:
                out.mkdir(parents=True, exist_ok=True)
                lock = storage.claim_folder(out, note)
                staging = tempfile.mkdtemp(prefix=storage.STAGING_PREFIX, dir=out)
            except OSError as exc:
                raise TraceFormatError(out, "output folder", f"cannot be created or written "
                                       f"({exc.strerror or exc}): choose another folder") from None
            # Again, now that the folder is ours: a convert into it may have ended meanwhile.
            earlier = [p.name for p in our_outputs(out, prefix)]
            if earlier and not overwrite:
                _refuse_earlier(out, earlier)
        runner = make_executor(executor, workers, len(jobs), progress, ray_address)
        bar = progress_bar(len(jobs), progress)
        args = [(job, staging, options) for job in jobs]
        try:
            if executor == "ray":
                per_job = runner.map(convert_job, args, bar, memory=[job_memory(j) for j in jobs])
            else:
                per_job = runner.map(convert_job, args, bar)
        finally:
            bar.close()
        results = sorted((r for found in per_job for r in found), key=lambda r: r.rank)
        _refuse_duplicate_ranks([(r.rank, r.source) for r in results], inputs)
        groups, problems = _merge_groups(results)
        for problem in problems:
            note(problem)
        for result in results:
            for message in result.warnings:
                note(f"rank {result.rank}: {message}")
        target = rules(options.target)
        groups = target.finish_run(staging, results, groups, options, note, runner)
        comm_group = None
        if groups or target.COMM_GROUP_ALWAYS:
            data = orjson.dumps({str(k): v for k, v in groups.items()}, option=orjson.OPT_INDENT_2)
            if remote_out:
                remote_out.write(COMM_GROUP_FILE, data)
                comm_group = f"{out}/{COMM_GROUP_FILE}"
            else:
                (Path(staging) / COMM_GROUP_FILE).write_bytes(data)
                comm_group = out / COMM_GROUP_FILE
        if remote_out:
            remote_out.commit(earlier)
        else:
            # --overwrite: only our own files of the earlier conversion go. All of them are
            # removed before the new ones move in: renaming over an existing file makes ext4
            # (auto_da_alloc) write the new file out before the rename returns (45 ms for 16
            # ResNet ranks' ETs), which removing it first does not.
            names = os.listdir(staging)
            in_the_way = [out / name for name in names if (out / name).is_dir()]
            if in_the_way:  # before anything moves: all of the outputs, or none
                raise IsADirectoryError(errno.EISDIR, "a folder where a file goes",
                                        str(in_the_way[0]))
            for name in earlier:
                (out / name).unlink(missing_ok=True)
            for name in names:
                os.replace(Path(staging) / name, out / name)
        done = True
    finally:
        if runner is not None:
            runner.close()
        if heads is not None:
            shutil.rmtree(heads, ignore_errors=True)
        if remote_out:
            remote_out.cleanup(failed=not done)
        elif staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
        if lock is not None:
            storage.release_folder(lock)
        if not done and created and not remote_out:
            try:  # a failed convert leaves nothing behind: the folder it made, if still empty
                out.rmdir()
            except OSError:
                pass
    return ConvertResult(out, results, comm_group, warnings)


def _refuse_earlier(out: Path | str, earlier: list[str]) -> None:
    shown = ", ".join(earlier[:3]) + (" ..." if len(earlier) > 3 else "")
    raise TraceFormatError(out, "output folder",
                           f"holds an earlier conversion ({len(earlier)} file(s): {shown}): "
                           f"add --overwrite to replace it, or choose another folder")


def our_outputs(out: Path, prefix: str | None = None) -> list[Path]:
    """The files of an earlier conversion in ``out``: ETs (of ``prefix`` when given), their
    JSON twins, comm_group.json and the ASTRA-sim configurations."""
    if not out.is_dir():
        return []
    names = sorted(p.name for p in out.iterdir() if p.is_file())
    return [out / name for name in _ours(names, prefix)]


def _ours(names: list[str], prefix: str | None = None) -> list[str]:
    """Of a folder's file names, those a conversion (with ``prefix``: one writing that prefix)
    writes: ``--prefix foo --overwrite`` replaces foo's ETs, never another prefix's."""
    present = set(names)
    # beside the ETs: the process groups, and what a target writes (ASTRA-sim's network...)
    fixed = (COMM_GROUP_FILE, *all_files())

    def et_of_prefix(name: str) -> bool:
        if not name.endswith(OUTPUT_SUFFIXES):
            return False
        stem = name.removesuffix(".gz").removesuffix(".et")
        head, _, rank = stem.rpartition(".")
        return prefix is None or (head == prefix and rank.isdigit())

    return [name for name in names if et_of_prefix(name) or name in fixed
            or (name.endswith(".json") and name[:-5] + ".et" in present
                and et_of_prefix(name[:-5] + ".et"))]  # an ET's JSON twin


def _refuse_duplicate_ranks(ranks: list[tuple[int, str]], inputs: Sequence[str | os.PathLike]
                            ) -> None:
    """Two traces claiming one rank: traces of several runs in one folder. Checked on the jobs
    before any work where their ranks are known, and on the results (ranks found in files)."""
    sources: dict[int, list[str]] = {}
    for rank, source in ranks:
        sources.setdefault(rank, []).append(source)
    clashes = {rank: found for rank, found in sources.items() if len(found) > 1}
    if clashes:
        rank, found = next(iter(sorted(clashes.items())))
        raise TraceFormatError(", ".join(map(str, inputs)), f"rank {rank}",
                               f"one set of traces per rank, found {len(found)} ({'; '.join(found)}); "
                               "traces of different runs? convert each run on its own")
