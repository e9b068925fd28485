"""The plain-torch pitfall the collector avoids (formats.md section 2), reproduced.

``torch.profiler.profile(schedule=..., execution_trace_observer=..., on_trace_ready=...)`` with
the default ``repeat=0``: when the loop ends right after ``step()`` entered a new cycle's active
phase, leaving the ``with`` block calls ``on_trace_ready`` again with an (almost) empty Kineto
trace, overwriting the good one written at the end of the first cycle, while the host ET, which
accumulates across cycles, stays full. This pins torch's real behaviour on the installed
version; if torch fixes it, this test fails and tells us.
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from chakra_hooks.collectors.torch import trace  # noqa: E402


def _work() -> None:
    a = torch.randn(32, 32, requires_grad=True)
    (a @ a).relu().sum().backward()


def _cpu_ops(path) -> int:
    return sum(1 for e in json.loads(path.read_text())["traceEvents"] if e.get("cat") == "cpu_op")


def test_schedule_with_observer_overwrites_kineto_with_an_empty_trace(tmp_path):
    from torch.profiler import ExecutionTraceObserver, ProfilerActivity, profile, schedule

    et = ExecutionTraceObserver()
    et.register_callback(str(tmp_path / "et.json"))
    kineto = tmp_path / "kineto.json"
    ready: list[int] = []

    def on_ready(p):
        p.export_chrome_trace(str(kineto))
        ready.append(_cpu_ops(kineto))

    # cycle = wait 1 + warmup 1 + active 2; after 6 steps a second cycle is active.
    with profile(activities=[ProfilerActivity.CPU], execution_trace_observer=et,
                 schedule=schedule(wait=1, warmup=1, active=2), on_trace_ready=on_ready) as p:
        for _ in range(6):
            _work()
            p.step()
    et_nodes = len(json.loads((tmp_path / "et.json").read_text())["nodes"])
    assert len(ready) == 2
    assert ready[0] > 20  # the first cycle's trace was full ...
    assert ready[1] == 0 and _cpu_ops(kineto) == 0  # ... and got overwritten by an empty one
    assert et_nodes > 40  # while the ET is full


def test_collector_gets_both_full_for_the_same_loop(tmp_path):
    with trace(tmp_path, steps=range(2, 4), routing=False) as t:
        for _ in range(6):
            _work()
            t.step()
    kineto_ops = _cpu_ops(tmp_path / "kineto.rank0.pt.trace.json")
    et_nodes = len(json.loads((tmp_path / "host_et.rank0.json").read_text())["nodes"])
    assert kineto_ops > 20 and et_nodes > 20
