"""The `chakra-hooks` command line: convert, inspect, validate, stats, whatif."""

from __future__ import annotations

import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import orjson

from chakra_hooks import __version__
from chakra_hooks.common.errors import TraceFormatError
from chakra_hooks.converter.targets import ALIASES, NAMES as TARGET_NAMES, Target, parse_target

TARGET_ALIASES = tuple(ALIASES)

ET_SUFFIXES = (".et", ".et.gz")


def _fail(message: str) -> None:
    click.echo(f"chakra-hooks: error: {message}", err=True)
    sys.exit(1)


def _et_files(paths: tuple[str, ...]) -> Iterator[Path]:
    """The files named, and the ETs inside folders named (in rank order)."""
    for item in paths:
        path = Path(item)
        if path.is_dir():
            found = [p for p in path.iterdir() if p.name.endswith(ET_SUFFIXES)]
            if not found:
                _fail(f"{path}: no .et or .et.gz files in this folder; if it holds traces, convert "
                      f"them first: chakra-hooks convert {path} -o OUT")
            yield from sorted(found, key=_rank_order)
        elif path.name == "comm_group.json":  # beside the ETs, read with them
            _fail(f"{path}: the run's process groups, read with its ETs; give the folder "
                  f"{path.parent}")
        elif path.exists():
            yield path
        else:
            _fail(f"{path}: no such file or directory")


def _rank_order(path: Path) -> tuple[str, int]:
    from chakra_hooks.converter.etio import name_and_rank

    prefix, rank = name_and_rank(path)
    return prefix, -1 if rank is None else rank


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="chakra-hooks")
def cli() -> None:
    """Record ML runs and convert them to MLCommons Chakra execution traces."""


class _Terminated(BaseException):
    """SIGTERM, raised where the command is so that it ends as on Ctrl-C: what a conversion
    staged is removed (convert_paths), where Python's default would end the process at once
    and leave it in the output folder."""


def _terminated(signum: int, frame: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends the clean-up too
    raise _Terminated


def _os_error(exc: OSError) -> str:
    """One line for an error of the file system, naming the file and what to do."""
    import errno

    where = getattr(exc, "filename2", None) or exc.filename or "output"  # (a move: its target)
    if exc.errno == errno.ENOSPC:
        return f"{where}: no space left on the device; free some or write elsewhere (-o)"
    if exc.errno == errno.EISDIR:
        return f"{where}: a folder where a file goes; move it away or write elsewhere (-o)"
    return f"{where}: {exc.strerror or exc}"


def main() -> None:
    """Entry point: bad input ends in one line on stderr and exit status 1, never a traceback;
    Ctrl-C in exit status 130, the shell's convention (click's own would be 1), and SIGTERM (a
    scheduler's time limit, `kill`) in 143, each with nothing left half written."""
    # Here, not in the library: a conversion may run inside a training process, whose signal
    # handlers are its own.
    signal.signal(signal.SIGTERM, _terminated)
    try:
        code = cli.main(standalone_mode=False)
    except (TraceFormatError, FileNotFoundError) as exc:
        _fail(str(exc))
    except OSError as exc:  # the machine's, not the input's: a full disk, a folder in the way
        _fail(_os_error(exc))
    except (KeyboardInterrupt, click.exceptions.Abort):
        click.echo("chakra-hooks: interrupted", err=True)
        sys.exit(130)
    except _Terminated:
        click.echo("chakra-hooks: terminated", err=True)
        sys.exit(143)
    except click.UsageError as exc:  # a wrong option: one line, as any bad input
        command = exc.ctx.command_path if exc.ctx is not None else "chakra-hooks"
        _fail(f"{exc.format_message().rstrip('.')} (see {command} --help)")
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    else:
        sys.exit(code if isinstance(code, int) else 0)


@cli.command()
@click.argument("inputs", nargs=-1, required=True, type=click.Path())
@click.option("-o", "--output", "outdir", required=True, type=click.Path(),
              help="Folder for <prefix>.<rank>.et and comm_group.json.")
@click.option("--prefix", default="chakra", show_default=True, help="Output file prefix.")
@click.option("--target", type=click.Choice(TARGET_NAMES), default=Target.FULL.value,
              show_default=True,
              help="full: every node kind, for analysis and replay; astra-sim: only what ASTRA-sim "
                   "runs, and its network fitted to the run.")
@click.option("--json", "write_json", is_flag=True, help="Also write ASTRA-sim's JSON workload twin of each ET.")
@click.option("--keep-mem", is_flag=True, help="With --target astra-sim: keep MEM_LOAD/MEM_STORE nodes.")
@click.option("--overwrite", is_flag=True,
              help="Replace the ETs, JSON twins and comm_group.json of an earlier conversion in "
                   "the output folder (other files are never touched).")
@click.option("--no-gaps", is_flag=True,
              help="Ops only: no host_gap nodes for the time between ops (the ET then replays "
                   "shorter than it ran).")
@click.option("--force-pair", is_flag=True,
              help="Link a host ET with its Kineto trace even when fewer than half of the ET's "
                   "ops match (refused otherwise: two different runs).")
@click.option("-j", "--jobs", type=int, default=None,
              help="Ranks converted in parallel on this machine [default: CPU count].")
@click.option("--executor", type=click.Choice(["local", "ray"]), default="local", show_default=True,
              help="local: processes on this machine; ray: one task per rank on a Ray cluster "
                   "(inputs and output on storage every node sees).")
@click.option("--ray-address", default=None,
              help="The Ray cluster for --executor ray [default: $RAY_ADDRESS, else a local Ray "
                   "started for the run].")
def convert(inputs: tuple[str, ...], outdir: str, prefix: str, target: str, write_json: bool,
            keep_mem: bool, overwrite: bool, no_gaps: bool, force_pair: bool, jobs: int | None,
            executor: str, ray_address: str | None) -> None:
    """Convert traces (files or folders) into one Chakra ET per rank."""
    from chakra_hooks.convert import convert_paths
    from chakra_hooks.converter.options import ConvertOptions

    def warn(message: str) -> None:
        click.echo(f"chakra-hooks: warning: {message}", err=True)

    if Path(outdir).is_file():
        _fail(f"{outdir}: a file; -o names the folder the ETs go to")
    options = ConvertOptions(prefix=prefix, target=target, write_json=write_json,
                             keep_mem=keep_mem, gaps=not no_gaps, force_pair=force_pair)
    result = convert_paths(inputs, outdir, options, workers=jobs, warn=warn, overwrite=overwrite,
                           executor=executor, ray_address=ray_address)
    click.echo(_table(result))


def _table(result) -> str:
    header = f"{'rank':>4} {'nodes':>8} {'comp':>8} {'coll':>5} {'p2p':>5} {'mem':>5} {'dur us':>12} " \
             f"{'comm bytes':>14} {'linked':>7}  file"
    lines = [header]
    for r in result.ranks:
        s = r.summary
        by = s["by_type"]
        p2p = by.get("COMM_SEND_NODE", 0) + by.get("COMM_RECV_NODE", 0)
        mem = by.get("MEM_LOAD_NODE", 0) + by.get("MEM_STORE_NODE", 0)
        rate = r.stats.get("match_rate")
        lines.append(f"{r.rank:>4} {s['nodes']:>8,} {by.get('COMP_NODE', 0):>8,} {by.get('COMM_COLL_NODE', 0):>5} "
                     f"{p2p:>5} {mem:>5} {s['duration_us']:>12,} {s['comm_bytes']:>14,} "
                     f"{(f'{100 * rate:.1f}%' if rate is not None else '-'):>7}  {', '.join(r.files)}")
    for r in result.ranks:
        unknown = r.summary.get("unknown")
        if unknown:  # said apart from the columns: these nodes' values were not measured
            lines.append(f"rank {r.rank}: not recorded in the trace: " + ", ".join(
                f"{count:,} nodes {name}" for name, count in unknown.items()))
    if result.comm_group is not None:
        lines.append(f"process groups: {result.comm_group}")
    lines.append(f"wrote {len(result.ranks)} rank(s) to {result.outdir}")
    lines.extend(COLUMNS)
    from chakra_hooks.storage import is_url

    # Absolute, so that the commands work from any folder (ASTRA-sim's run scripts cd first).
    out = result.outdir if is_url(result.outdir) else Path(result.outdir).resolve()
    groups = result.comm_group
    if groups is not None and not is_url(groups):
        groups = Path(groups).resolve()
    prefix = result.ranks[0].files[0].split(".")[0] if result.ranks else "chakra"
    from chakra_hooks.converter.targets.astra_sim import network as astra_files

    astra = (astra_files.command(out, prefix, groups)
             if Path(str(out), astra_files.NETWORK_FILE).exists() else
             f"convert ... --target astra-sim, then {astra_files.BINARY} "
             f"--workload-configuration={out}/{prefix} ..."
             + (f" --comm-group-configuration={groups}" if groups else ""))
    lines.append(f"next: chakra-hooks inspect {out} | chakra-hooks stats {out} | chakra-hooks "
                 f"whatif {out} --comm 0.25x | chakra-hooks timeline {out} -o run.json.gz | "
                 f"for ASTRA-sim: {astra}")
    return "\n".join(lines)


COLUMNS = (
    "  nodes: Chakra nodes (comp: compute incl. host_gap, coll: collectives, p2p: send + recv, "
    "mem: memory loads / stores)",
    "  dur us: the nodes' durations added up (host, device and gap nodes overlap in time: not "
    "the wall time; `stats` gives the span and the critical path)",
    "  comm bytes: bytes the communication nodes move; linked: share of the host ET's ops found "
    "in the Kineto trace (an XLA profile: of its device ops found in the HLO modules; '-': "
    "only one of the two files)",
)


LINE_WIDTH = 200  # characters: a longer line of stats goes on, indented, on the next


def _within_width(text: str) -> str:
    """``text`` with every line longer than ``LINE_WIDTH`` broken after a comma (after a space
    where a part alone is too long), its rest indented under it."""
    out = []
    for line in text.splitlines():
        indent = " " * (len(line) - len(line.lstrip()) + 4)
        while len(line) > LINE_WIDTH:
            cut = line.rfind(", ", 0, LINE_WIDTH - 1)
            if cut <= len(indent):
                cut = line.rfind(" ", 0, LINE_WIDTH)
                if cut <= len(indent):
                    break
                out.append(line[:cut])
                line = indent + line[cut + 1:]
                continue
            out.append(line[:cut + 1])
            line = indent + line[cut + 2:]
        out.append(line)
    return "\n".join(out)


@cli.command()
@click.argument("files", nargs=-1, required=True, type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="One JSON object per file, then the run.")
def stats(files: tuple[str, ...], as_json: bool) -> None:
    """How much of the measured window the ETs replay: span, critical path and its make-up
    (host, device, exposed and overlapped communication, gaps), top ops on it, MoE imbalance,
    KV-cache bytes."""
    from chakra_hooks.converter import peers as run_peers
    from chakra_hooks.converter import run_model
    from chakra_hooks.converter import stats as measure
    from chakra_hooks.converter import whatif as model

    try:
        said: list[str] = []
        run, groups, world = run_model.read_run(list(_et_files(files)), progress=None,
                                                workers=None, warn=said.append)
    except ValueError as exc:
        _fail(str(exc))
    peers = run_peers.analyse(run, groups, world)
    said += peers.warnings
    for message in said:
        _warn(message)
    ranks = []
    per_rank = peers.by_rank()
    for r in run:
        mine = per_rank.get(r.rank, run_peers.RankPeers())
        matched = bool(mine.wait_us) or mine.unknown > 0  # without communication: nothing said
        ranks.append(measure.rank_stats(r.path, r.columns, mine.wait_us if matched else None,
                                        mine.transfer_us, mine.unknown))
        ranks[-1].rank = r.rank
    late = model.straggler(run, peers) if len(run) > 1 and peers.columns else None
    if as_json:
        for r in ranks:
            click.echo(orjson.dumps(r.to_json()).decode())
        span = max((r.span_us for r in ranks), default=0.0)
        path = max((r.critical_path_us for r in ranks), default=0.0)
        summary = {"ranks": len(ranks), "span_us": round(span, 3),
                   "critical_path_us": round(path, 3),
                   "coverage": round(path / span, 4) if span else 0.0,
                   "matched_collectives": len(peers.columns), "wait_unknown": len(peers.unknown),
                   "clock_offsets_us": {str(k): round(v, 3) for k, v in peers.offsets_us.items()},
                   "clock_residual_us": round(peers.clock_residual_us, 3)}
        if late is not None:
            summary["straggler"] = late.to_json()
        if said:
            summary["warnings"] = said
        click.echo(orjson.dumps({"run": summary}).decode())
    else:
        said = [measure.render(ranks)]
        if late is not None:
            said.append(model.render_straggler(late))
        said += [f"  note: {note}" for note in peers.notes]
        click.echo(_within_width("\n".join(said)))


@cli.command()
@click.argument("files", nargs=-1, required=True, type=click.Path())
@click.option("--comm", "comm", multiple=True, metavar="FACTOR|TYPE=FACTOR",
              help="Multiply communication durations: '0.25x' (a 4x faster network), or per "
                   "collective type, 'all_reduce=0.5x'. Repeatable.")
@click.option("--compute", metavar="FACTOR", help="Multiply compute durations (host ops and "
              "kernels; gaps keep theirs): '2x' takes twice as long.")
@click.option("--comm-from", "comm_from", type=click.Path(exists=True, file_okay=False),
              help="Another conversion of the same program: each collective takes the transfer "
                   "time measured there (its whole time where its peers were not recorded), "
                   "same order per rank; --comm applies on top of them.")
@click.option("--ranks", "only", metavar="LIST",
              help="Apply --comm / --compute to these ranks only, e.g. '1' or '1,3' (a "
                   "straggler made faster: --ranks 1 --compute 0.33x).")
@click.option("--bandwidth", multiple=True, metavar="FACTOR|DIM=FACTOR",
              help="The network's bandwidth times FACTOR, through the network fitted to the "
                   "run's transfers (latency terms do not move): '2x', or per dimension, "
                   "'1=2x' (0: within a host, 1: between hosts). Repeatable.")
@click.option("--latency", multiple=True, metavar="FACTOR|VALUE|DIM=...",
              help="The network's latency times FACTOR ('0.5x') or set ('2us', '500ns'), "
                   "per dimension as --bandwidth. Repeatable.")
@click.option("--network", "network_file", type=click.Path(exists=True, dir_okay=False),
              help="An ASTRA-sim network file (.yml: npus_count, bandwidth, latency per "
                   "dimension): the run on that network, as ASTRA-sim would be given it.")
@click.option("--json", "as_json", is_flag=True,
              help="One JSON object per rank, one per line, then {\"run\": {...}}.")
def whatif(files: tuple[str, ...], comm: tuple[str, ...], compute: str | None,
           comm_from: str | None, only: str | None, bandwidth: tuple[str, ...],
           latency: tuple[str, ...], network_file: str | None, as_json: bool) -> None:
    """Replay converted ETs with communication, the network and/or compute changed: the
    ranks together (a collective's transfer starts when its last member reaches it; waits for
    peers follow from the replay and are never scaled), the predicted span per rank and for
    the run, and what moved on the critical path."""
    from chakra_hooks.converter import network_change as nets
    from chakra_hooks.converter import peers as run_peers
    from chakra_hooks.converter import run_model
    from chakra_hooks.converter import whatif as model

    fitted = None
    try:
        change = model.parse_change(comm, compute)
        chosen = _parse_ranks(only)
        said: list[str] = []
        ranks, groups, world = run_model.read_run(list(_et_files(files)), progress=None,
                                                  workers=None, warn=said.append)
        peers = run_peers.analyse(ranks, groups, world)
        for message in said + peers.warnings:
            _warn(message)
        net = nets.NetworkChange(
            {d: v for d, (_, v) in nets.parse_dimension_values("--bandwidth", bandwidth,
                                                               False).items()},
            nets.parse_dimension_values("--latency", latency, True),
            nets.read_network_file(network_file, world) if network_file else None,
            network_file or "")
        if network_file and (bandwidth or latency):
            _fail("--network gives the whole network: --bandwidth and --latency change the "
                  "fitted one; give one or the other")
        elsewhere, notes = None, []
        if comm_from is not None:
            theirs = run_model.read_run(list(_et_files((comm_from,))), progress=None,
                                        workers=None)
            notes += model.comm_from_problems(ranks, groups, world, *theirs, comm_from)
            elsewhere = model.run_comm_times(theirs[0], run_peers.analyse(*theirs))
        if chosen is not None and not chosen & {r.rank for r in ranks}:
            _fail(f"--ranks {only}: none of these ranks is among the ETs given "
                  f"({', '.join(str(r.rank) for r in ranks)})")
        factors = None
        if net:
            fitted = nets.fit_run(ranks, peers, groups, world)
            factors, net_notes = fitted.factors(net)
            notes += net_notes
        run = model.replay_run(ranks, change, chosen, peers, elsewhere, comm_factors=factors)
        run.notes += notes
    except (ValueError, TraceFormatError) as exc:
        _fail(str(exc))
    described = "; ".join(part for part in (
        change.describe() if change != model.Change() or not net else "",
        net.describe()) if part) + (f" on rank(s) {only}" if chosen is not None else "") + (
        f"; collectives as measured in {comm_from}" if comm_from else "")
    if as_json:
        extra = {"network_fitted": fitted.to_json()} if fitted is not None else {}
        for r in run.ranks:
            click.echo(orjson.dumps({"what_if": described, **r.to_json()}).decode())
        if said:
            extra["warnings"] = said
        click.echo(orjson.dumps({"run": {"what_if": described, **run.to_json(), **extra}}
                                ).decode())
    else:
        click.echo(model.render_run(run, described))
        if fitted is not None:
            click.echo("  network fitted to the run's transfers (convert --target astra-sim "
                       "writes the same): " + "; ".join(fitted.describe()))


def _warn(message: str) -> None:
    """What a reader of a converted run says of damage it did not refuse (stderr, one line)."""
    click.echo(f"chakra-hooks: warning: {message}", err=True)


def _parse_ranks(text: str | None) -> set[int] | None:
    if text is None:
        return None
    try:
        chosen = {int(part) for part in text.split(",") if part.strip()}
    except ValueError:
        raise ValueError(f"--ranks {text!r}: expected rank numbers separated by commas, "
                         f"such as 1,3") from None
    if not chosen:
        raise ValueError(f"--ranks {text!r}: expected at least one rank")
    return chosen


@cli.command()
@click.argument("folder", type=click.Path(exists=True, file_okay=False))
@click.option("-o", "--output", required=True, type=click.Path(),
              help="The folder for the new run's ETs (replaced whole).")
@click.option("--world", type=int, default=None,
              help="The new run's size: the recorded run's (its ETs say it) completes a run "
                   "recorded on some of its ranks; a multiple of it grows data parallelism.")
@click.option("--dp", default=None, metavar="FACTOR",
              help="Grow data parallelism: '4x' makes four copies of the (completed) run, its "
                   "whole-run process groups (and --grow's) spanning them.")
@click.option("--grow", multiple=True, metavar="GROUP",
              help="A process group (comm_group.json) that grows with --dp / --world, as the "
                   "whole-run groups do: the data-parallel groups of a run with other "
                   "dimensions. Repeatable.")
@click.option("--network", "network_file", type=click.Path(exists=True, dir_okay=False),
              help="An ASTRA-sim network file for the new run (npus_count multiplying to its "
                   "size; two dimensions: hosts of npus_count[0] ranks): transfers are modelled "
                   "on it [default: the network fitted to the recorded run].")
@click.option("--overwrite", is_flag=True, help="Replace what is in -o.")
def scale(folder: str, output: str, world: int | None, dp: str | None, grow: tuple[str, ...],
          network_file: str | None, overwrite: bool) -> None:
    """Chakra ETs for more ranks than were recorded: a run recorded on some of its ranks made
    whole (--world), or data parallelism grown (--dp 4x); transfers modelled at the new group
    sizes, the run replayed with its ranks together and written with the replayed times."""
    from chakra_hooks.converter import scale as scaling
    from chakra_hooks.converter.whatif import parse_factor

    out, source = Path(output), Path(folder)
    if out.resolve() == source.resolve() or source.resolve() in out.resolve().parents:
        _fail(f"{out}: inside the run it scales; choose a folder outside {source}")
    if out.exists() and (out.is_file() or any(out.iterdir())) and not overwrite:
        _fail(f"{out}: holds files already; add --overwrite or choose another folder")
    try:
        factor = None
        if dp is not None:
            value = parse_factor(dp)
            if value < 1 or value != int(value):
                raise ValueError(f"--dp {dp!r}: a whole number of copies, such as 2x or 4x")
            factor = int(value)
        done = scaling.scale_run(source, out, world, factor, grow, network_file)
    except ValueError as exc:
        _fail(str(exc))
    click.echo(scaling.render(done, source, out))


@cli.command()
@click.argument("files", nargs=-1, required=True, type=click.Path())
@click.option("-o", "--output", required=True, type=click.Path(),
              help="The Chrome Trace Event file to write (.json, or .json.gz compressed).")
@click.option("--comm", "comm", multiple=True, metavar="FACTOR|TYPE=FACTOR",
              help="As whatif's: also draw the schedule predicted with communication changed.")
@click.option("--compute", metavar="FACTOR", help="As whatif's, for compute.")
@click.option("--comm-from", "comm_from", type=click.Path(exists=True, file_okay=False),
              help="As whatif's: collectives as measured in another conversion of the program.")
@click.option("--ranks", "only", metavar="LIST",
              help="As whatif's: apply --comm / --compute to these ranks only.")
@click.option("--no-flows", is_flag=True, help="Leave out the dependency arrows between lanes.")
@click.option("--show-ranks", "show", metavar="LIST",
              help="A run of more than 16 ranks draws the straggler and the ranks of the longest "
                   "and the median span; these ranks too, e.g. '5,700'.")
@click.option("--every-rank", is_flag=True,
              help="Draw every rank of a big run (a file Perfetto may not open).")
def timeline(files: tuple[str, ...], output: str, comm: tuple[str, ...], compute: str | None,
             comm_from: str | None, only: str | None, no_flows: bool, show: str | None,
             every_rank: bool) -> None:
    """Draw converted ETs for Perfetto (ui.perfetto.dev) or chrome://tracing: a process per
    rank, a track per thread and stream, gaps and collectives' waits for peers apart,
    dependencies as arrows, the critical path on its own track; with --comm / --compute /
    --comm-from, the schedule predicted with the ranks replayed together, beside."""
    from chakra_hooks.converter import etio
    from chakra_hooks.converter import timeline as draw
    from chakra_hooks.converter import whatif as model

    try:
        change = model.parse_change(comm, compute)
        chosen = _parse_ranks(only)
        shown = _parse_ranks(show)
    except ValueError as exc:
        _fail(str(exc))
    changing = bool(comm or compute or comm_from)
    described = change.describe() + (f" on rank(s) {only}" if chosen is not None else "") + (
        f"; collectives as measured in {comm_from}" if comm_from else "")
    try:
        data, drawn = draw.draw_files(
            list(_et_files(files)), change if changing else None, described,
            flows=not no_flows, only=chosen,
            comm_from=list(_et_files((comm_from,))) if comm_from else None, show=shown,
            every_rank=every_rank, warn=_warn)
        recorded = drawn.recorded
    except ValueError as exc:  # --comm-from: not the same program
        _fail(str(exc))
    if Path(output).is_dir():
        _fail(f"{output}: a folder; -o names the timeline file to write (.json or .json.gz)")
    folder = Path(output).parent
    if not folder.exists():
        click.echo(f"chakra-hooks: creating {folder}", err=True)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        # .gz: compressed at level 1, 3x faster than 6 for a file 15 % larger
        etio.atomic_write(output, [data], compresslevel=1)
    except OSError as exc:
        _fail(f"{output}: cannot be written ({exc.strerror or exc})")
    slices = sum(len(tl.slices) for tl in recorded)
    click.echo(f"wrote {output}: {len(recorded)} rank(s), {slices:,} nodes"
               + (f", and the schedule predicted with {described}" if changing else "")
               + "; open it in ui.perfetto.dev or chrome://tracing")
    for tl in recorded:
        line = f"  rank {tl.rank}: critical path {tl.critical_us:,.3f} us"
        if tl.rank in drawn.replays:  # against the replay as recorded, as whatif says it
            span, replayed, then = drawn.replays[tl.rank]
            line = (f"  rank {tl.rank}: measured {span:,.3f} us, replayed {replayed:,.3f} us, "
                    f"predicted {then:,.3f} us"
                    + (f" ({then / replayed - 1:+.1%} against the replay)" if replayed else ""))
        if tl.stuck:
            line += (f"; {tl.stuck:,} nodes on or behind a dependency cycle never run in a "
                     "replay: drawn after the end, on a track of their own")
        if tl.rank in drawn.why:
            line += f" ({drawn.why[tl.rank]})"
        click.echo(line)
    if drawn.left_out:
        click.echo(f"  {drawn.left_out:,} other rank(s) left out (all were replayed): "
                   "--show-ranks LIST draws some of them, --every-rank all")


@cli.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True))
@click.option("-o", "--output", type=click.Path(), help="The folder to write the shared run to.")
@click.option("--level", type=click.Choice(["names", "shapes", "times"]), default="names",
              show_default=True,
              help="names: names, strings, paths and ids replaced or dropped; shapes: also tensor "
                   "shapes and the numbers among argument values rounded up to powers of two; "
                   "times: also durations perturbed within --bound, and starts moved with them.")
@click.option("--bound", type=float, default=0.0,
              help="With --level times: the largest relative change of a duration (0.05: 5 %).")
@click.option("--seed", type=int, default=0, show_default=True,
              help="With --level times: the noise's seed (mixed with the key: without the "
                   "key, the noise cannot be worked out).")
@click.option("--key-file", type=click.Path(), default="~/.chakra-hooks/share.key",
              show_default=True,
              help="The key the pseudonyms are made with (the default one is made on first "
                   "use; keep it, never send it: with the same key, runs shared later get the "
                   "same pseudonyms).")
@click.option("--new-key", is_flag=True,
              help="Make a new key at --key-file (which must not exist yet).")
@click.option("--overwrite", is_flag=True, help="Replace an earlier shared copy in -o.")
@click.option("--check", "check_leaks", is_flag=True,
              help="Instead: search every word and id of the original inputs (PATHS after the "
                   "shared folder) in the shared files, exact shapes at --level shapes and "
                   "times, and, given the conversion, durations that can be read back at "
                   "times; exit 1 on any found.")
def share(paths: tuple[str, ...], output: str | None, level: str, bound: float, seed: int,
          key_file: str, new_key: bool, overwrite: bool, check_leaks: bool) -> None:
    """Share a converted run without its names: `share OUT -o SHARED` writes a copy whose node
    names, strings, paths and process ids are keyed pseudonyms or gone, everything a
    simulator, stats, whatif and timeline read kept; `share --check SHARED INPUTS...` is the
    leak test to run before sending it."""
    from chakra_hooks.converter import share as sharing

    if check_leaks:
        if len(paths) < 2:
            _fail("share --check SHARED INPUTS...: the shared folder, then the original traces "
                  "(files or folders) whose words must not be in it")
        try:
            found = sharing.check(Path(paths[0]), [Path(p) for p in paths[1:]])
        except ValueError as exc:
            _fail(str(exc))
        for leak in found.leaks[:50]:
            click.echo(f"leak: {leak.token!r} in {leak.found_in} (from {leak.where})")
        for shape in found.shapes[:20]:
            click.echo(f"exact shape: {shape.file} node {shape.node} {shape.where} holds "
                       f"{', '.join(map(str, shape.numbers[:6]))}")
        durations = found.durations
        for rank, node, how in durations.examples if durations else ():
            click.echo(f"duration read back: rank {rank} node {node}: {how}")
        said = [f"{len(found.leaks)} of {found.searched:,} words and ids of the inputs are in "
                "the shared files" + (" (first 50 listed)" if len(found.leaks) > 50 else "")]
        if found.level in ("shapes", "times"):
            said.append(f"{len(found.shapes):,} node(s) hold an exact shape")
        if durations is not None:
            said.append(f"{durations.count:,} of {durations.of:,} recorded durations can be "
                        "read back")
        if found.found:
            _fail(f"{paths[0]}: " + "; ".join(said))
        said[0] = f"none of {found.searched:,} words and ids of the inputs is in the shared files"
        if found.level == "times" and durations is None:
            said.append("durations not checked: give the conversion it was shared from (the "
                        "folder convert wrote) among the inputs")
        click.echo(f"{paths[0]}: " + "; ".join(said))
        return
    if len(paths) != 1 or not output:
        _fail("share OUT -o SHARED: one converted run (the folder convert wrote) and -o")
    if level == "times" and not 0 < bound < 1:
        _fail(f"--level times: durations perturbed within --bound, a fraction above 0 and "
              f"below 1 such as 0.05, not {bound:g}")
    if level != "times" and bound:
        _fail(f"--bound {bound:g}: durations are perturbed at --level times only; add it, or "
              "leave --bound out")
    folder, out = Path(paths[0]), Path(output)
    if not folder.is_dir():
        _fail(f"{folder}: a folder convert wrote (chakra.<rank>.et files)")
    if out.resolve() == folder.resolve() or folder.resolve() in out.resolve().parents:
        _fail(f"{out}: inside the run it shares; choose a folder outside {folder}")
    if out.exists() and any(out.iterdir()) and not overwrite:
        _fail(f"{out}: holds files already; add --overwrite or choose another folder")
    try:
        key = sharing.load_key(Path(key_file), lambda line: click.echo(f"chakra-hooks: {line}",
                                                                        err=True), new_key)
        done = sharing.share_run(folder, out, key, sharing.Options(level, bound, seed))
    except ValueError as exc:
        _fail(str(exc))
    for path in done.left_out:
        click.echo(f"chakra-hooks: left out {path.name}: not a conversion output", err=True)
    click.echo(f"wrote {len(done.files)} file(s) to {out} ({level}): "
               f"{done.removed.describe(level)}")
    click.echo(f"next: chakra-hooks share --check {out} <the original traces>  (before sending "
               "it)")


@cli.command()
@click.argument("files", nargs=-1, required=True, type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="One JSON object per file, one per line.")
def inspect(files: tuple[str, ...], as_json: bool) -> None:
    """Summarise Chakra ET files (or the ETs in a folder)."""
    from chakra_hooks.converter import etio
    from chakra_hooks.converter import summary

    per_rank = []
    for path in _et_files(files):
        et = etio.read_et(path)
        result = summary.summarize(str(path), et.metadata, et.nodes)
        per_rank.append(result)
        click.echo(orjson.dumps(result.to_json()).decode() if as_json else summary.render(result))
    if not as_json and len(per_rank) > 1:
        ranks = [r.rank for r in per_rank if r.rank is not None]
        click.echo(f"{len(per_rank)} files, ranks {ranks}; nodes per rank {[r.nodes for r in per_rank]}")


@cli.command()
@click.argument("files", nargs=-1, required=True, type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="One JSON report per file, one per line.")
@click.option("--target", type=click.Choice([*TARGET_NAMES, *TARGET_ALIASES]),
              default=Target.FULL.value,
              show_default=True,
              help="As convert's: full (the Chakra rules; 'chakra' is an older name of it); "
                   "astra-sim: also what the simulator refuses (METADATA/MEM nodes, unsimulated "
                   "collectives).")
@click.option("--limit", type=int, default=20, show_default=True, help="Problems listed per check (human form).")
def validate(files: tuple[str, ...], as_json: bool, target: str, limit: int) -> None:
    """Check Chakra ETs against what their consumers require; exit 1 on any problem.

    With --target astra-sim, the files are also checked as one run: every process group's
    collectives must agree across its members, and comm_group.json (beside the files) must be
    one ASTRA-sim accepts.
    """
    from chakra_hooks.converter import etio
    from chakra_hooks.converter.validate import Problem
    from chakra_hooks.converter.validate import validate as check

    failed = False
    run: dict[int, object] = {}
    # Files of one run share a name (<prefix>.<rank>.et); others are workloads of their own.
    runs: dict[tuple[Path, str], list[Path]] = {}
    for path in _et_files(files):
        runs.setdefault((path.parent, _rank_order(path)[0]), []).append(path)
        try:
            et = etio.read_et(path)
        except TraceFormatError as exc:  # the one-line error; the other files still run
            failed = True
            click.echo(f"chakra-hooks: error: {exc}", err=True)
            if as_json:
                click.echo(orjson.dumps({"path": str(path), "ok": False, "nodes": 0,
                                         "problems": [{"check": "read", "node": None,
                                                       "message": str(exc)}]}).decode())
            continue
        report = check(str(path), et.metadata, et.nodes, target=target)
        made_for = next((a.string_val for a in et.metadata.attr if a.name == "target"), "")
        if parse_target(target) == Target.ASTRA_SIM and made_for == Target.FULL.value:
            # Not an ASTRA-sim conversion: one problem that says so, not one per node.
            report.problems = [Problem("target", None, "a --target full conversion (its "
                                       "metadata says so); convert --target astra-sim writes "
                                       "what ASTRA-sim reads")]
        failed |= not report.ok
        rank = _rank_order(path)[1]
        if rank >= 0:
            run[rank] = et.nodes
        if as_json:
            click.echo(orjson.dumps({
                "path": report.path, "ok": report.ok, "nodes": report.nodes, "counts": report.counts(),
                "problems": [{"check": p.check, "node": p.node, "message": p.message} for p in report.problems],
            }).decode())
            continue
        _print_report(path, report, limit)
    if parse_target(target) == Target.ASTRA_SIM and len(run) > 1:
        failed |= _validate_run(files, run, as_json)
    for (folder, _), paths in runs.items():
        if len(paths) > 1 or (folder / "comm_group.json").exists():
            failed |= _validate_as_one_run(paths, as_json)
    sys.exit(1 if failed else 0)


def _validate_as_one_run(paths: list[Path], as_json: bool) -> bool:
    """The files as one run, as stats, whatif and timeline read it (converter/run_model.py):
    one ET per rank of one world, and comm_group.json agreeing with them. True on a problem."""
    from chakra_hooks.converter import run_model

    try:
        run_model.read_run(paths)
        problem = None
    except TraceFormatError as exc:
        problem = str(exc)
    folder = paths[0].parent
    if as_json:
        click.echo(orjson.dumps({"path": str(folder), "ok": problem is None, "run": True,
                                 "problems": [{"check": "one-run", "message": problem}]
                                 if problem else []}).decode())
    else:
        click.echo(f"{folder}: as one run of {len(paths)} file(s): "
                   f"{'ok' if problem is None else 'FAILED'}")
        if problem:
            click.echo(f"  one-run: {problem}")
    return problem is not None


def _print_report(path: Path, report, limit: int) -> None:
    click.echo(f"{path}: {'ok' if report.ok else 'FAILED'} ({report.nodes:,} nodes)")
    shown: dict[str, int] = {}
    for problem in report.problems:
        shown[problem.check] = shown.get(problem.check, 0) + 1
        if shown[problem.check] <= limit:
            where = f"node {problem.node}" if problem.node is not None else "file"
            click.echo(f"  {problem.check}: {where}: {problem.message}")
    for name, count in report.counts().items():
        if count > limit:
            click.echo(f"  {name}: ... {count - limit} more ({count} in all)")


def _validate_run(files: tuple[str, ...], run: dict[int, object], as_json: bool) -> bool:
    """Cross-rank checks; True when there is a problem."""
    from chakra_hooks.converter.targets.astra_sim.run_rules import check_run

    from chakra_hooks.converter.run_model import read_groups

    folder = Path(files[0]) if Path(files[0]).is_dir() else Path(files[0]).parent
    problems = check_run(run, read_groups(folder))
    if as_json:
        click.echo(orjson.dumps({"path": str(folder), "ok": not problems, "ranks": sorted(run),
                                 "problems": [{"check": "run", "message": p} for p in problems]}).decode())
    else:
        click.echo(f"{folder}: run of {len(run)} ranks: {'ok' if not problems else 'FAILED'}")
        for problem in problems:
            click.echo(f"  run: {problem}")
    return bool(problems)


if __name__ == "__main__":
    main()
