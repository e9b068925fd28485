"""A straggler recorded twice (examples/straggler.py: the last rank doing 3x the compute, then
1x): from either recording, ``whatif --ranks 1 --compute`` predicts the other's run and rank
0's span, since rank 0's collectives wait for rank 1 in the replay as they did in the run."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from chakra_hooks.convert import convert_paths

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from straggler_pair import premise, predict, record_pair  # noqa: E402 (tests/straggler_pair.py)

SLOW = 3
PEER_WAIT = Path(__file__).resolve().parents[3] / "shared" / "tools" / "peer-wait.py"


def test_a_straggler_made_fast_predicts_the_run_without_it(tmp_path):
    slow, even, given_up = record_pair(tmp_path, SLOW)
    why = premise(slow, even, SLOW)
    if why is not None:  # the machine changed more than rank 1's compute: no ground truth
        pytest.skip(f"premise failed on {len(given_up)} pairs ({'; '.join(given_up)})")
    for source, target, factor in ((slow, even, 1 / SLOW), (even, slow, float(SLOW))):
        run, rank0 = predict(source, target, factor)
        assert 0.9 <= run <= 1.1, (source.capture.name, run)
        assert 0.9 <= rank0 <= 1.1, (source.capture.name, rank0)
    # Rank 0 waits for rank 1: most of its collectives' time in the slow run, little in the other.
    waits = {r: sum(t for (rank, _), t in slow.peers.wait_us.items() if rank == r) for r in (0, 1)}
    assert waits[0] > 5 * waits[1]
    if PEER_WAIT.exists():  # the checker, from the raw Kineto files: within 10 % per rank
        files = [str(slow.capture / f"kineto.rank{r}.pt.trace.json") for r in (0, 1)]
        text = subprocess.run([sys.executable, str(PEER_WAIT), *files], capture_output=True,
                              text=True, check=True).stdout
        theirs = [float(m) for m in re.findall(r"peer wait ([\d.]+) us", text)]
        assert waits[0] == pytest.approx(theirs[0], rel=0.10), (waits, theirs)
    # The ASTRA-sim network is fitted to transfers, so the straggler does not slow it (fitted to
    # whole durations it halved: 0.135 -> 0.063 GB/s). gloo's own transfers on this loopback
    # vary by up to 30 % from one recording to the next (benchmarks/bench_straggler.py prints
    # the pairs: 6-30 % apart), so what is held is that the fits differ only as the transfers
    # they were given do, not as the waits.
    fitted, moved = [], []
    for run in (slow, even):
        out = run.out.with_name(run.out.name + "_astra")
        convert_paths([run.capture], out, target="astra-sim", progress=False, warn=lambda _: None)
        text = (out / "astra_network.yml").read_text()
        fitted.append(float(re.search(r"bandwidth: \[ ([\d.e+-]+) \]", text).group(1)))
        moved.append(sum(run.peers.transfer_us.values()))
    assert fitted[0] / fitted[1] == pytest.approx(moved[1] / moved[0], rel=0.15), (fitted, moved)
