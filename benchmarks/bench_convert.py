"""Benchmark: ``chakra-hooks convert`` on tiled ResNet inputs, beside the reference converter.

    python benchmarks/bench_convert.py [--tiles 1 6 22 55] [--workdir DIR] [--reference]
                                       [--builds] [--floor] [--link-only] [--stages]
                                       [--repeat N] [--instructions]

For each K, tiles the real ``a100_resnet_nccl`` pair K times (benchmarks/tile_resnet.py,
cached in the work directory), then runs our whole ``convert`` (read, link, convert, write)
in a fresh process with one worker (so MB/s is MB/s per core), ``--repeat`` times, and
reports raw input MB, the best run's seconds and MB/s, the median run's seconds, CPU seconds
(user + system) and MB per CPU second of the best run, and peak RSS
(the high-water mark of the converting processes, from ``getrusage(RUSAGE_CHILDREN)`` of a
wrapper process, so one measurement cannot inflate the next). ``--link-only`` times
``linker.pytorch.link.link`` alone (no converter, no writer). ``--reference`` also runs mlc-chakra's
``chakra_converter`` on the reference-linked ``a100_resnet_nccl.ref_linked.json.gz`` (the
reference linker needs PARAM's et_replay, which is not on PyPI, so only K=1 exists for it).

``--builds`` runs each K twice, as installed (compiled where it was built: the default) and
as plain Python (``CHAKRA_HOOKS_PURE_PYTHON=1``, what an install without a C compiler runs).
``--floor`` times msgspec's typed decode of the same two files into structs holding the fields
linking reads (``args`` and attributes left undecoded): the least any reader built on it can
take; each build's time is then also given as a multiple of it.

``--stages`` times the stages of one rank's conversion in a fresh process, through the
conversion's own progress marks (``convert_job``, as a worker runs it): the command's imports,
finding the rank's files, reading the ET (with the linker's own imports), reading Kineto,
linking, and building and writing the nodes; each stage's best of ``--repeat`` runs. It also
reports the MB/s of the stages up to the end of reading alone: the most a conversion with
these readers could reach if linking, building and writing took no time (the interpreter's
own start, about 20 ms, is not in any stage).

``--instructions`` instead counts the instructions of one ``convert`` per K under valgrind's
callgrind (about 100x slower than a plain run: use K=1 or K=6), with a fixed hash seed. On a
shared machine whose speed drifts by the hour, that count is the figure to compare two builds
by.

Every measured process runs with Python's bytecode cache, after a run that is not counted
(``child_env``): as an install runs after its first start.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from tile_resnet import CORPUS, tile  # noqa: E402

# Runs a command and prints its wall time and the peak RSS (KiB) of its process tree's
# largest member, as JSON. A fresh wrapper per measurement keeps the high-water marks apart.
WRAPPER = r"""
import json, resource, subprocess, sys, time
t = time.perf_counter()
run = subprocess.run(sys.argv[1:], capture_output=True, text=True)
dt = time.perf_counter() - t
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"seconds": dt, "cpu": usage.ru_utime + usage.ru_stime, "peak_kib": usage.ru_maxrss,
                  "rc": run.returncode,
                  "err": run.stderr[-500:]}))
"""

LINK_ONLY = r"""
import sys
from chakra_hooks.linker.pytorch.link import link
trace = link(sys.argv[1], sys.argv[2])
assert trace.stats["match_rate"] > 0.99, trace.stats
"""


# msgspec's typed decode of a Kineto trace and a host ET (the fields linking reads), for --floor
FLOOR = r"""
import sys
import msgspec

class Event(msgspec.Struct):
    ph: str = ""
    name: str = ""
    cat: str = ""
    ts: float = 0.0
    dur: float = 0.0
    pid: object = None
    tid: object = None
    args: msgspec.Raw = msgspec.Raw(b"null")

class Kineto(msgspec.Struct):
    traceEvents: list[Event]

class Node(msgspec.Struct):
    id: int
    name: str = ""
    ctrl_deps: int = 0
    inputs: msgspec.Raw = msgspec.Raw(b"null")
    outputs: msgspec.Raw = msgspec.Raw(b"null")
    attrs: msgspec.Raw = msgspec.Raw(b"null")

class HostEt(msgspec.Struct):
    nodes: list[Node]

et, kineto = sys.argv[1], sys.argv[2]
assert msgspec.json.decode(open(et, "rb").read(), type=HostEt).nodes
assert msgspec.json.decode(open(kineto, "rb").read(), type=Kineto).traceEvents
"""

# One rank's conversion (the tiles are one job) timed at its progress marks: what
# linker/pytorch/link.py and convert.py report as they go (ET read, Kineto read, linked, done).
STAGES = r"""
import json, sys, tempfile, time
start = time.perf_counter()
import chakra_hooks.cli  # noqa: F401 (what the command imports before it converts)
from chakra_hooks.common.progress import reporting_to
from chakra_hooks.convert import ConvertOptions, convert_job, discover
marks = [("imports", time.perf_counter())]
(job,) = discover([sys.argv[1]], lambda message: None)
marks.append(("find", time.perf_counter()))
with tempfile.TemporaryDirectory() as staging:
    with reporting_to(lambda fraction: marks.append((fraction, time.perf_counter()))):
        convert_job(job, staging, ConvertOptions())
print(json.dumps([("imports", marks[0][1] - start)] + [
    (mark, at - before) for (_, before), (mark, at) in zip(marks, marks[1:])]))
"""
STAGE_NAMES = ("imports", "find files", "read ET", "read Kineto", "link", "nodes + write")

REPEAT = 3  # runs per measurement; the fastest is reported (--repeat)
# Best seconds per (K, what ran): "compiled", "plain" or "floor", for the ratio to the floor.
BEST: dict[tuple[int, str], float] = {}


def compiled_status() -> str:
    """How many modules a fresh process runs compiled, e.g. "17 of 17"."""
    return subprocess.run([sys.executable, "-c", "from chakra_hooks._compiled import "
                           "compiled_status; print(compiled_status())"],
                          capture_output=True, text=True, check=True).stdout.strip()


def installed(command: str) -> str:
    """The command installed beside this interpreter, else the one on PATH: a PATH found first
    may hold another environment's install of the same command."""
    beside = Path(sys.executable).with_name(command)
    found = str(beside) if beside.is_file() else shutil.which(command)
    if found is None:
        raise SystemExit(f"{command} is not installed beside {sys.executable} nor on PATH")
    return found


def child_env(pure: bool = False) -> dict:
    """The environment the measured processes run in: as installed (compiled), or plain Python;
    either way with Python's bytecode cache, as any install runs after its first start (pip
    writes it at install; an editable install writes it at the first run). A shell that sets
    PYTHONDONTWRITEBYTECODE would otherwise have every run compile the package's Python modules
    from source again: about 45 ms a run here, 4 % of the 110 MB conversion."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if pure:
        env["CHAKRA_HOOKS_PURE_PYTHON"] = "1"
    return env


def measure(cmd: list[str], env: dict | None = None) -> dict:
    """The fastest of REPEAT runs, after one that is not counted (it fills the bytecode cache and
    the page cache): on a shared virtual machine other tenants' load only ever adds time (CPU
    steal shows up as user time here), so the minimum is the steadiest figure."""
    env = child_env() if env is None else env
    subprocess.run([sys.executable, "-c", WRAPPER, *cmd], capture_output=True, text=True,
                   check=True, env=env)
    runs = []
    for _ in range(REPEAT):
        out = subprocess.run([sys.executable, "-c", WRAPPER, *cmd], capture_output=True,
                             text=True, check=True, env=env)
        result = json.loads(out.stdout)
        if result["rc"] != 0:
            raise SystemExit(f"{' '.join(cmd)} failed: {result['err']}")
        runs.append(result)
    best = min(runs, key=lambda r: r["seconds"])
    best["median"] = sorted(r["seconds"] for r in runs)[len(runs) // 2]
    return best


def ensure_tiles(k: int, workdir: Path) -> tuple[Path, int]:
    folder = workdir / f"resnet_x{k}"
    files = [folder / "host_et.json", folder / "kineto.json"]
    if not all(f.is_file() for f in files):
        tile(k, folder)
    return folder, sum(f.stat().st_size for f in files)


def row(label: str, mb: float, result: dict) -> str:
    seconds, cpu, peak_mb = result["seconds"], result["cpu"], result["peak_kib"] / 1024
    return (f"{label:<34} {mb:9.1f} {seconds:9.2f} {mb / seconds:8.1f} {result['median']:9.2f} "
            f"{cpu:9.2f} {mb / cpu:8.1f} {peak_mb:9.0f} {peak_mb / mb:7.2f}")


def ours(k: int, workdir: Path, link_only: bool, pure: bool = False) -> str:
    folder, size = ensure_tiles(k, workdir)
    mb = size / 1e6
    env = child_env(pure)
    build = ", plain Python" if pure else ""
    if link_only:
        result = measure([sys.executable, "-c", LINK_ONLY, str(folder / "host_et.json"),
                          str(folder / "kineto.json")], env)
        return row(f"ours link K={k}{build}", mb, result)
    out = workdir / f"out_x{k}"
    shutil.rmtree(out, ignore_errors=True)
    cli = installed("chakra-hooks")
    result = measure([cli, "convert", str(folder), "-o", str(out), "-j", "1", "--overwrite"],
                     env)
    BEST[k, "plain" if pure else "compiled"] = result["seconds"]
    return row(f"ours convert K={k}{build}", mb, result)


def floor(k: int, workdir: Path) -> str:
    """msgspec's typed decode of the same two files (FLOOR)."""
    folder, size = ensure_tiles(k, workdir)
    result = measure([sys.executable, "-c", FLOOR, str(folder / "host_et.json"),
                      str(folder / "kineto.json")])
    BEST[k, "floor"] = result["seconds"]
    return row(f"msgspec typed decode K={k}", size / 1e6, result)


def to_floor(k: int) -> str:
    """Each build's best time as a multiple of the floor's: the figure that holds while this
    shared machine's speed moves (by up to 2x from one hour to the next)."""
    builds = [(name, BEST[k, name]) for name in ("compiled", "plain") if (k, name) in BEST]
    return f"K={k}: " + ", ".join(f"{name} {seconds / BEST[k, 'floor']:.1f}x the floor's time"
                                  for name, seconds in builds)


def stages(k: int, workdir: Path, pure: bool = False) -> str:
    """Seconds per stage of one rank's conversion (STAGES), each stage's best of REPEAT."""
    folder, size = ensure_tiles(k, workdir)
    env = child_env(pure)
    subprocess.run([sys.executable, "-c", STAGES, str(folder)], capture_output=True, env=env)
    runs = []
    for _ in range(REPEAT):
        out = subprocess.run([sys.executable, "-c", STAGES, str(folder)], capture_output=True,
                             text=True, env=env)
        if out.returncode != 0:
            raise SystemExit(f"stages K={k} failed: {out.stderr[-500:]}")
        runs.append([seconds for _, seconds in json.loads(out.stdout)])
    if any(len(run) != len(STAGE_NAMES) for run in runs):
        raise SystemExit(f"stages K={k}: expected the marks of {', '.join(STAGE_NAMES)}, got "
                         f"{len(runs[0])} stages (did the progress marks change?)")
    best = [min(column) for column in zip(*runs)]
    reading = sum(best[:4])
    build = ", plain Python" if pure else ""
    listed = ", ".join(f"{name} {seconds:.2f}" for name, seconds in zip(STAGE_NAMES, best))
    return (f"stages K={k}{build} (s): {listed}; imports and reading alone "
            f"{size / 1e6 / reading:.0f} MB/s")


def instructions(k: int, workdir: Path) -> str:
    """Instructions of one whole convert at K, counted by callgrind."""
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        raise SystemExit("--instructions needs valgrind (Debian: apt-get install valgrind)")
    folder, size = ensure_tiles(k, workdir)
    out = workdir / f"out_x{k}"
    shutil.rmtree(out, ignore_errors=True)
    cli = installed("chakra-hooks")
    command = [cli, "convert", str(folder), "-o", str(out), "-j", "1", "--overwrite"]
    # A fixed hash seed: str hashes, and so the probing of every dict and set, otherwise
    # change from run to run, and the count with them (by about 0.1 %).
    env = dict(child_env(), PYTHONHASHSEED="0")
    subprocess.run(command, capture_output=True, env=env)  # fills the bytecode cache
    run = subprocess.run([valgrind, "--tool=callgrind", "--callgrind-out-file=/dev/null",
                          *command], capture_output=True, text=True, env=env)
    found = re.search(r"I\s+refs:\s+([\d,]+)", run.stderr)
    if run.returncode != 0 or found is None:
        raise SystemExit(f"callgrind run failed: {run.stderr[-500:]}")
    count = int(found.group(1).replace(",", ""))
    return f"ours convert K={k}: {count / 1e9:.3f}e9 instructions ({count / size:.0f} per input byte)"


def reference(workdir: Path) -> str:
    src = CORPUS / "chakra_reference" / "a100_resnet_nccl.ref_linked.json.gz"
    linked = workdir / "ref_linked.json"
    if not linked.is_file():
        linked.write_bytes(gzip.decompress(src.read_bytes()))
    cli = installed("chakra_converter")
    mb = linked.stat().st_size / 1e6
    result = measure([cli, "--log-filename", str(workdir / "ref.log"), "PyTorch", "--input",
                      str(linked), "--output", str(workdir / "ref.et")])
    lines = [row("reference chakra_converter K=1", mb, result)]
    # The same reference-linked file through our convert (it reads that ET on its own).
    ours_cli = installed("chakra-hooks")
    out = workdir / "out_ref_linked"
    shutil.rmtree(out, ignore_errors=True)
    result = measure([ours_cli, "convert", str(linked), "-o", str(out), "-j", "1", "--overwrite"])
    lines.append(row("ours convert, same ref_linked file", mb, result))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiles", type=int, nargs="+", default=[1, 6, 22, 55])
    parser.add_argument("--workdir", type=Path, default=None,
                        help="where tiles and outputs go (default: a temporary folder)")
    parser.add_argument("--reference", action="store_true")
    parser.add_argument("--link-only", action="store_true")
    parser.add_argument("--builds", action="store_true",
                        help="also each K as plain Python (CHAKRA_HOOKS_PURE_PYTHON=1)")
    parser.add_argument("--floor", action="store_true",
                        help="also msgspec's typed decode of the same files")
    parser.add_argument("--stages", action="store_true",
                        help="also the seconds of each stage of one conversion")
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure (best kept)")
    parser.add_argument("--instructions", action="store_true",
                        help="count instructions under callgrind instead of timing")
    args = parser.parse_args()
    global REPEAT
    REPEAT = args.repeat
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="chakra_bench_"))
    workdir.mkdir(parents=True, exist_ok=True)
    status = compiled_status()
    print(f"compiled modules running: {status} (setup.py; 0 = pure Python)")
    try:
        if args.instructions:
            for k in args.tiles:
                print(instructions(k, workdir), flush=True)
            return
        print(f"{'run':<34} {'input MB':>9} {'seconds':>9} {'MB/s':>8} {'median s':>9} "
              f"{'CPU s':>9} {'MB/CPU-s':>8} {'peak MB':>9} {'peak/in':>7}")
        for k in args.tiles:
            print(ours(k, workdir, args.link_only), flush=True)
            if args.builds:
                print(ours(k, workdir, args.link_only, pure=True), flush=True)
            if args.floor:
                print(floor(k, workdir), flush=True)
                if not args.link_only:
                    print(to_floor(k), flush=True)
            if args.stages:
                print(stages(k, workdir), flush=True)
                if args.builds:
                    print(stages(k, workdir, pure=True), flush=True)
        if args.reference:
            print(reference(workdir), flush=True)
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    if compiled_status() != status:  # a source edited meanwhile runs from source (_compiled.py)
        print(f"warning: compiled modules running changed to {compiled_status()} during the "
              "runs: figures after the change are not of the compiled build")


if __name__ == "__main__":
    main()
