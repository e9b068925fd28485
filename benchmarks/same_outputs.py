"""Do two states of the code write the same bytes? Converts every corpus trace with both
targets and lists a SHA-256 per output file; with ``--against``, compares with an earlier list.

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
import tempfile
from pathlib import Path

from bench_model_time import REPO, TRACES

from chakra_hooks.convert import convert_paths

TARGETS = ("full", "astra-sim")


def digests(corpus: Path) -> dict[str, str]:
    """``trace/target/file`` -> SHA-256 of every file the conversion wrote."""
    out: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, (inputs, _) in TRACES.items():
            for target in TARGETS:
                folder = Path(tmp) / name / target
                convert_paths([corpus / i for i in inputs], folder, target=target,
                              progress=False, warn=lambda _: None)
                for path in sorted(folder.rglob("*")):
                    if path.is_file():
                        key = f"{name}/{target}/{path.relative_to(folder)}"
                        out[key] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", default=str(REPO.parent / "shared" / "corpus"))
    ap.add_argument("--save", help="write the digests to this JSON file")
    ap.add_argument("--against", help="compare with digests saved earlier")
    args = ap.parse_args()
    now = digests(Path(args.corpus))
    if args.save:
        Path(args.save).write_text(json.dumps(now, indent=1, sort_keys=True))
    print(f"{len(now)} files from {len(TRACES)} traces x {len(TARGETS)} targets")
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
