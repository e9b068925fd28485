"""`convert`'s progress bar moves within a rank, not only when a rank is done: a single large
rank otherwise shows 0/1 for its whole conversion."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from chakra_hooks.convert import LINKED, convert_paths
from chakra_hooks.linker.pytorch.link import PROGRESS_ET_READ, PROGRESS_KINETO_READ, link
from chakra_hooks.common.progress import reporting_to


def _counts(stderr: str, total: int) -> list[float]:
    """The bar's counts as drawn, in order (tqdm redraws with a carriage return)."""
    return [float(n) for n in re.findall(rf"\| (\d+(?:\.\d+)?)/{total} ", stderr)]


def test_linking_says_when_each_file_is_read(corpus: Path) -> None:
    said: list[float] = []
    pair = corpus / "pytorch" / "rtx2080_linear"
    with reporting_to(said.append):
        link(pair / "host_et.json.gz", pair / "kineto.json.gz")
    assert said == [PROGRESS_ET_READ, PROGRESS_KINETO_READ]


def test_one_rank_in_process_moves_in_steps(corpus: Path, tmp_path: Path, capsys) -> None:
    convert_paths([corpus / "pytorch" / "rtx2080_linear"], tmp_path, workers=1, progress=True)
    counts = _counts(capsys.readouterr().err, 1)
    assert counts[0] == 0 and counts[-1] == 1
    assert {PROGRESS_ET_READ, PROGRESS_KINETO_READ, LINKED} <= set(counts)
    assert counts == sorted(counts)


def test_ranks_in_worker_processes_report_through_the_queue(corpus: Path, tmp_path: Path,
                                                            capsys) -> None:
    convert_paths([corpus / "pytorch" / "v100_dlrm_8rank"], tmp_path, workers=2, progress=True)
    counts = _counts(capsys.readouterr().err, 8)
    assert counts[-1] == 8 and counts == sorted(counts)
    # Parts of ranks were counted: the workers' reports reached the bar.
    assert any(c != int(c) for c in counts)


def test_benchmark_stages_read_every_mark(corpus: Path) -> None:
    """benchmarks/bench_convert.py --stages times a conversion by these marks: it must see
    each of its stages once, in order (a mark added or dropped would shift its columns)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from bench_convert import STAGE_NAMES, STAGES

    run = subprocess.run([sys.executable, "-c", STAGES, str(corpus / "pytorch" / "rtx2080_linear")],
                         capture_output=True, text=True, check=True)
    stages = json.loads(run.stdout)
    assert [name for name, _ in stages][:2] == ["imports", "find"]
    assert [name for name, _ in stages][2:] == [PROGRESS_ET_READ, PROGRESS_KINETO_READ, LINKED, 1]
    assert len(stages) == len(STAGE_NAMES) and all(seconds >= 0 for _, seconds in stages)
