"""Do two states of the code write the same bytes? Converts every corpus trace with both
targets and lists a SHA-256 per output file; with ``--against``, compares with an earlier list.
``--tools`` adds what the run tools print and write of each conversion (``stats --json``,
``whatif --json`` under four changes, ``timeline``), and ``--runs`` folders of converted runs
of one's own (a recording's conversion, a tiled run) to read with them. ``--traces`` adds
folders of traces of one's own (a recording) to convert beside the corpus.

Run as plain Python (``CHAKRA_HOOKS_PURE_PYTHON=1``) on one side and compiled on the other, it
says whether both builds write the same bytes (tests/test_compiled.py does so).

    python benchmarks/same_outputs.py --save /tmp/before.json      # on the old state
    python benchmarks/same_outputs.py --against /tmp/before.json   # on the new: exit 1 if any
                                                                    # file differs, and which

A restructuring must leave every line of the comparison "same" (docs/development.md).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import shutil
import tempfile
from pathlib import Path

from bench_model_time import REPO, TRACES

from chakra_hooks.convert import convert_paths

TARGETS = ("full", "astra-sim")


# The run tools' commands on a converted run (its folder appended), each a file to compare.
TOOLS = {
    "stats.json": ["stats", "--json"],
    "whatif_comm.json": ["whatif", "--json", "--comm", "0.5x"],
    "whatif_compute_rank0.json": ["whatif", "--json", "--compute", "0.5x", "--ranks", "0"],
    "whatif_all_reduce.json": ["whatif", "--json", "--comm", "all_reduce=0x"],
    "whatif_bandwidth.json": ["whatif", "--json", "--bandwidth", "2x"],
}


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def tool_digests(folder: Path, name: str, work: Path) -> dict[str, str]:
    """``name/tool`` -> SHA-256 of what each run tool printed of ``folder`` (run from a fixed
    path, so that the paths they print agree between the two states), and of its timeline."""
    from click.testing import CliRunner

    from chakra_hooks.cli import cli

    out: dict[str, str] = {}
    for tool, args in TOOLS.items():
        result = CliRunner().invoke(cli, [*args, str(folder)])
        out[f"{name}/{tool}"] = _sha(f"exit {result.exit_code}\n{result.output}".encode())
    drawn = work / "timeline.json"
    result = CliRunner().invoke(cli, ["timeline", str(folder), "-o", str(drawn), "--comm", "0.5x"])
    out[f"{name}/timeline"] = _sha(f"exit {result.exit_code}\n{result.output}".encode()
                                   + (drawn.read_bytes() if drawn.exists() else b""))
    return out


def digests(corpus: Path, tools: bool = False, runs: list[str] = (),
            traces: list[str] = ()) -> dict[str, str]:
    """``trace/target/file`` -> SHA-256 of every file the conversion wrote, of the corpus
    traces and of each folder of ``traces`` (and, with ``tools``, of what the run tools make
    of each conversion and of each of ``runs``)."""
    out: dict[str, str] = {}
    # A fixed place, not a new temporary one: the tools print the paths they read.
    work = Path(tempfile.gettempdir()) / "chakra-hooks-same-outputs"
    shutil.rmtree(work, ignore_errors=True)
    inputs_of = {name: [corpus / i for i in inputs] for name, (inputs, _) in TRACES.items()}
    inputs_of.update({f"traces/{folder}": [Path(folder)] for folder in traces})
    for name, inputs in inputs_of.items():
        for target in TARGETS:
            folder = work / name.replace("/", "_") / target
            convert_paths(inputs, folder, target=target,
                          progress=False, warn=lambda _: None)
            for path in sorted(folder.rglob("*")):
                if path.is_file():
                    key = f"{name}/{target}/{path.relative_to(folder)}"
                    out[key] = _sha(path.read_bytes())
            if tools:
                out.update(tool_digests(folder, f"{name}/{target}", work))
    for run in runs:
        out.update(tool_digests(Path(run), f"runs/{run}", work))
    shutil.rmtree(work, ignore_errors=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", default=str(REPO.parent / "shared" / "corpus"))
    ap.add_argument("--save", help="write the digests to this JSON file")
    ap.add_argument("--against", help="compare with digests saved earlier")
    ap.add_argument("--tools", action="store_true",
                    help="also what stats, whatif and timeline make of each conversion")
    ap.add_argument("--runs", nargs="*", default=[],
                    help="folders of converted runs to read with the run tools too")
    ap.add_argument("--traces", nargs="*", default=[],
                    help="folders of traces (a recording) to convert beside the corpus")
    args = ap.parse_args()
    now = digests(Path(args.corpus), args.tools or bool(args.runs), args.runs, args.traces)
    if args.save:
        Path(args.save).write_text(json.dumps(now, indent=1, sort_keys=True))
    print(f"{len(now)} files from {len(TRACES) + len(args.traces)} traces x {len(TARGETS)} "
          "targets")
    if not args.against:
        return 0
    before = json.loads(Path(args.against).read_text())
    changed = 0
    for key in sorted(set(before) | set(now)):
        if before.get(key) != now.get(key):
            changed += 1
            state = "new" if key not in before else "gone" if key not in now else "differs"
            print(f"  {state}: {key}")
    print("same bytes" if not changed else f"{changed} of {len(before)} files changed")
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())
