"""PyTorch linker on the real corpus, a live gloo job and bad pairs."""

from __future__ import annotations

import glob
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from chakra_hooks.convert import convert_paths
from chakra_hooks.common.errors import TraceFormatError
from chakra_hooks.linker.model import CommType, EdgeKind, LinkedTrace, OpKind
from chakra_hooks.linker.pytorch.link import link, load
from chakra_hooks.linker.sources import RankJob


def _device(trace: LinkedTrace):
    return [op for op in trace.ops if op.lane.startswith("stream:")]


def _check_edges(trace: LinkedTrace) -> None:
    """Every edge names two ops, none is a self edge, and none runs backwards in time."""
    ops = trace.ops
    assert [op.uid for op in ops] == list(range(len(ops)))
    for e in trace.edges:
        assert e.src != e.dst
        a, b = ops[e.src].start_ps, ops[e.dst].start_ps
        if a is not None and b is not None and e.kind != EdgeKind.PARENT:
            assert a <= b, (e, ops[e.src].name, ops[e.dst].name)
    assert len({(e.src, e.dst) for e in trace.edges}) == len(trace.edges)


@pytest.fixture(scope="module")
def resnet(corpus: Path) -> LinkedTrace:
    d = corpus / "pytorch/a100_resnet_nccl"
    return link(d / "host_et.json.gz", d / "kineto.json.gz")


def test_resnet_collectives(resnet: LinkedTrace) -> None:
    colls = [op for op in resnet.ops if op.kind == OpKind.COLLECTIVE]
    assert len(colls) == 21 and all(op.on_device for op in colls)
    assert Counter(op.comm.comm_type for op in colls) == {CommType.ALL_REDUCE: 15,
                                                           CommType.BROADCAST: 6}
    assert all(op.comm.size_bytes > 0 for op in colls)
    # Same sizes the reference tools found: 7 distinct, 424 B .. 31,502,336 B, sum 307,323,096.
    sizes = [op.comm.size_bytes for op in colls]
    assert len(set(sizes)) == 7 and min(sizes) == 424 and max(sizes) == 31_502_336
    assert sum(sizes) == 307_323_096
    # The world group (ranks [0, 1]) maps to None = all ranks, and is listed.
    assert all(op.comm.group is None for op in colls) and resnet.groups == {0: [0, 1]}


def test_resnet_every_device_op_present_timed_and_ordered(resnet: LinkedTrace) -> None:
    device = _device(resnet)
    assert Counter(op.attrs["category"] for op in device) == {
        "kernel": 2700, "gpu_memcpy": 960, "gpu_memset": 114}
    kernel_ps = sum(op.dur_ps for op in device if op.attrs["category"] == "kernel")
    assert abs(kernel_ps - 162_532_300_000) <= 0.001 * 162_532_300_000
    assert resnet.stats["device_time_ps"] == sum(op.dur_ps for op in device)
    successors = {e.src for e in resnet.edges if e.kind == EdgeKind.STREAM_ORDER}
    lanes = defaultdict(list)
    for op in device:
        lanes[op.lane].append(op)
    for ops in lanes.values():
        last = max(ops, key=lambda o: o.start_ps)
        assert all(op.uid in successors for op in ops if op is not last)
    assert resnet.stats["device_linked"] == len(device)  # every launch found
    assert all(type(op.start_ps) is int and type(op.dur_ps) is int for op in device)


def test_resnet_match_rate_and_soft_pid_note(resnet: LinkedTrace) -> None:
    assert resnet.metadata["match_strategy"] == "record_function_id"
    assert resnet.stats["host_matched"] >= 14_388 and resnet.stats["match_rate"] > 0.99
    assert not resnet.warnings  # two runs of one program: a note, not a warning
    assert "pid" in resnet.metadata["note"]
    assert resnet.clock == "kineto:baseTimeNanoseconds"


def test_resnet_edges(resnet: LinkedTrace) -> None:
    _check_edges(resnet)
    kinds = Counter(e.kind for e in resnet.edges)
    assert kinds[EdgeKind.LAUNCH] == 3774 and kinds[EdgeKind.HOST_ORDER] > 3000
    # NCCL waits on the compute stream and back (cudaStreamWaitEvent) -> device->device SYNC.
    ops = resnet.ops
    cross = [e for e in resnet.edges if e.kind == EdgeKind.SYNC and ops[e.dst].on_device]
    assert cross and all(ops[e.src].lane != ops[e.dst].lane for e in cross)
    assert any(ops[e.dst].kind == OpKind.COLLECTIVE for e in cross)
    # Host ops never nest: top-level ops of one thread do not overlap in time.
    host = sorted((op for op in ops if not op.on_device and op.start_ps is not None
                   and op.kind == OpKind.COMPUTE), key=lambda o: (o.lane, o.start_ps))
    for a, b in zip(host, host[1:]):
        if a.lane == b.lane:
            assert a.start_ps + a.dur_ps <= b.start_ps
    assert len(resnet.edges) < 4 * len(ops)  # linear-ish
    # Forward -> backward through autograd sequence numbers: the autograd thread's ops wait
    # for the forward ops whose gradients they compute (543 forward/backward pairs).
    data = [e for e in resnet.edges if e.kind == EdgeKind.DATA]
    assert len(data) == 543
    assert {(ops[e.src].lane, ops[e.dst].lane) for e in data} == {
        ("thread:2910249", "thread:2919752")}
    assert all("Backward" in ops[e.dst].name for e in data)


def test_dlrm_ranks_agree(corpus: Path) -> None:
    d = corpus / "pytorch/v100_dlrm_8rank"
    per_rank = []
    for rank in range(8):
        kineto = glob.glob(str(d / f"worker{rank}_step_12.*.pt.trace.json.gz"))[0]
        trace = link(d / f"dlrm_eg_{rank}.json.gz", Path(kineto), rank)
        assert trace.stats["match_rate"] > 0.99 and not trace.warnings
        _check_edges(trace)
        comms = sorted((op for op in trace.ops if op.comm), key=lambda o: o.start_ps)
        assert Counter(op.comm.comm_type for op in comms) == {CommType.ALL_TO_ALL: 5,
                                                               CommType.ALL_REDUCE: 3}
        per_rank.append(comms)
    for position in range(8):
        ops = [comms[position] for comms in per_rank]
        assert len({op.comm.comm_type for op in ops}) == 1
        uneven = "in_split_size" in ops[0].attrs and len(set(ops[0].attrs["in_split_size"])) > 1
        if not uneven:
            assert len({op.comm.size_bytes for op in ops}) == 1, position
        else:
            # all_to_allv: each rank sends what its splits say; the size is that rank's own.
            for op in ops:
                assert op.comm.size_bytes == 4 * max(sum(op.attrs["in_split_size"]),
                                                     sum(op.attrs["out_split_size"]))


def test_rtx2080_only_the_et_window(corpus: Path) -> None:
    d = corpus / "pytorch/rtx2080_linear"
    trace = link(d / "host_et.json.gz", d / "kineto.json.gz")
    assert trace.metadata["match_strategy"] == "name_sequence"
    assert trace.stats["match_rate"] > 0.95
    assert trace.stats["window_applied"] == 1
    device = _device(trace)
    # One iteration of the ~40 in Kineto (10,356 device events in all).
    assert 100 < len(device) < trace.stats["kineto_device_events"] / 20
    host = [op for op in trace.ops if not op.on_device and op.start_ps is not None]
    lo, hi = min(op.start_ps for op in host), max(op.start_ps + op.dur_ps for op in host)
    assert all(lo <= op.start_ps <= hi + 10**9 for op in device)
    _check_edges(trace)


def test_simple_add_old_format(corpus: Path) -> None:
    d = corpus / "pytorch/a100_simple_add"
    trace = link(d / "host_et.json.gz", d / "kineto.json.gz")
    assert trace.metadata["match_strategy"] == "external_id"
    assert trace.stats["match_rate"] > 0.9
    assert len(_device(trace)) == 4 and trace.stats["device_linked"] == 4
    assert trace.clock == "kineto:epoch-us"
    _check_edges(trace)


@pytest.mark.parametrize("rel, kernels", [
    ("kineto_only/sampled_rank-0.json.gz", None),
    ("kineto_only/sampled_rank-1.json.gz", None),
    ("kineto_only/b200_eager_rank0.json.gz", None),
    ("vllm/mi300x_decode_full/graph_capture_rank_0.pt.trace.json.gz", 7),
    ("vllm/mi300x_decode_full/graph_execution.json.gz", 425),
])
def test_kineto_only(corpus: Path, rel: str, kernels: int | None) -> None:
    trace = link(None, corpus / rel)
    device = _device(trace)
    assert len(device) == trace.stats["kineto_device_events"] > 0
    if kernels is not None:
        assert sum(op.attrs["category"] == "kernel" for op in device) == kernels
    assert any(not op.on_device for op in trace.ops)
    _check_edges(trace)


def test_sampled_ranks_sendrecv_typed_from_annotations(corpus: Path) -> None:
    for rank in (0, 1):
        trace = link(None, corpus / f"kineto_only/sampled_rank-{rank}.json.gz")
        nccl = [op for op in _device(trace) if "SendRecv" in op.name]
        assert len(nccl) == 10
        # SendRecv implements all-to-all, all-reduce and all-gather here (nccl:* annotations).
        assert all(op.kind == OpKind.COLLECTIVE and op.comm.size_bytes > 0 for op in nccl)
        assert {op.comm.comm_type for op in nccl} >= {CommType.ALL_TO_ALL, CommType.ALL_REDUCE}


def test_b200_process_groups(corpus: Path) -> None:
    trace = link(None, corpus / "kineto_only/b200_eager_rank0.json.gz")
    assert trace.groups[5] == [0] and trace.groups[69] == list(range(8))
    assert sum(op.kind == OpKind.METADATA for op in trace.ops) == 1


def test_et_only(corpus: Path) -> None:
    trace = link(corpus / "pytorch/a100_resnet_nccl/host_et.json.gz", None)
    assert trace.ops and all(op.start_ps is None for op in trace.ops)
    assert not _device(trace)
    # Without kernels, the c10d ops themselves carry the collectives.
    colls = [op for op in trace.ops if op.kind == OpKind.COLLECTIVE]
    assert len(colls) == 21 and all(op.on_device and op.comm.size_bytes > 0 for op in colls)
    assert Counter(e.kind for e in trace.edges)[EdgeKind.HOST_ORDER] > 3000
    _check_edges(trace)


def test_two_different_programs_are_refused_unless_forced(corpus: Path) -> None:
    et = corpus / "pytorch/a100_resnet_nccl/host_et.json.gz"
    kineto = corpus / "pytorch/a100_simple_add/kineto.json.gz"
    with pytest.raises(TraceFormatError, match=r"only \d+ of \d+ ET ops \(\d+\.\d%.*--force-pair"):
        link(et, kineto)
    trace = link(et, kineto, force_pair=True)
    assert trace.stats["match_rate"] < 0.1
    [said] = [w for w in trace.warnings if "two different runs" in w]
    assert "host_et.json.gz" in said and "kineto.json.gz" in said


def test_one_policy_for_a_pair_given_on_the_command_line(corpus: Path, tmp_path: Path) -> None:
    # An ET and a Kineto trace of two different programs, given as two files from two folders:
    # paired (not two unknown ranks refused as duplicates), then refused on their match rate,
    # in one line that says how to force it; forced, converted with the warning.
    et = corpus / "pytorch/a100_resnet_nccl/host_et.json.gz"
    kineto = corpus / "pytorch/a100_simple_add/kineto.json.gz"
    out = tmp_path / "out"
    with pytest.raises(TraceFormatError, match="--force-pair") as refused:
        convert_paths([et, kineto], out, progress=False)
    assert "\n" not in str(refused.value) and not out.exists()
    warnings: list[str] = []
    result = convert_paths([et, kineto], out, progress=False, force_pair=True, warn=warnings.append)
    assert len(result.ranks) == 1 and any("two different runs" in w for w in warnings)


def test_a_rank_mismatch_between_the_two_files_warns(corpus: Path, tmp_path: Path) -> None:
    dlrm = corpus / "pytorch/v100_dlrm_8rank"
    warnings: list[str] = []
    result = convert_paths([dlrm / "dlrm_eg_0.json.gz", next(dlrm.glob("worker1_*"))],
                           tmp_path / "out", progress=False, warn=warnings.append)
    assert [r.rank for r in result.ranks] == [1]
    assert any("names rank 0" in w and "rank 1" in w for w in warnings)


def test_bad_pair_raises(tmp_path: Path, corpus: Path) -> None:
    bad = tmp_path / "kineto.json.gz"
    bad.write_bytes((corpus / "pytorch/a100_simple_add/kineto.json.gz").read_bytes()[:500])
    with pytest.raises(TraceFormatError, match="truncated"):
        link(corpus / "pytorch/a100_simple_add/host_et.json.gz", bad)
    with pytest.raises(ValueError):
        link(None, None)


def test_load_job_uses_rank_and_attaches_nothing_without_routing(corpus: Path) -> None:
    d = corpus / "pytorch/a100_simple_add"
    job = RankJob("pytorch", {"host_et": d / "host_et.json.gz", "kineto": d / "kineto.json.gz"}, 3)
    traces = load(job)
    assert len(traces) == 1 and traces[0].rank == 3 and traces[0].framework == "pytorch"


@pytest.mark.slow
def test_gloo_collectives_on_cpu(gloo_traces: Path) -> None:
    per_rank = []
    for rank in (0, 1):
        trace = link(gloo_traces / f"et_rank{rank}.json", gloo_traces / f"kineto_rank{rank}.json")
        assert trace.metadata["match_strategy"] == "record_function_id"
        assert trace.stats["match_rate"] > 0.95 and not trace.warnings
        _check_edges(trace)
        comms = sorted((op for op in trace.ops if op.comm), key=lambda o: o.start_ps)
        # gloo runs them on CPU threads: comm ops on a comm lane, never CPU ops for ASTRA-sim.
        assert all(op.on_device and op.lane.startswith("comm:") for op in comms)
        assert all(op.start_ps is not None and op.dur_ps > 0 for op in comms)
        per_rank.append(comms)
        types = Counter(op.comm.comm_type for op in comms if op.kind == OpKind.COLLECTIVE)
        assert types == {CommType.ALL_REDUCE: 6, CommType.BROADCAST: 2, CommType.ALL_GATHER: 2,
                         CommType.ALL_TO_ALL: 2, CommType.BARRIER: 2}
        p2p = [op for op in comms if op.kind in (OpKind.SEND, OpKind.RECV)]
        assert [op.kind for op in p2p] == [OpKind.SEND if rank == 0 else OpKind.RECV] * 2
        assert all((op.comm.src, op.comm.dst) == (0, 1) and op.comm.size_bytes == 16
                   for op in p2p)
        gathers = [op for op in comms if op.comm.comm_type == CommType.ALL_GATHER]
        assert all(op.comm.size_bytes == 2 * 4 * 4 for op in gathers)  # the gathered output
        assert trace.groups == {0: [0, 1], 1: [0, 1]}
        # DATA edges exist (e.g. forward -> autograd thread), all between different threads.
        data = [e for e in trace.edges if e.kind == EdgeKind.DATA]
        assert data and all(trace.ops[e.src].lane != trace.ops[e.dst].lane for e in data)
    assert [op.comm.comm_type for op in per_rank[0] if op.kind == OpKind.COLLECTIVE] == \
        [op.comm.comm_type for op in per_rank[1] if op.kind == OpKind.COLLECTIVE]


@pytest.mark.slow
def test_an_annotation_the_et_emptied_is_read_through(gloo_traces: Path, tmp_path: Path) -> None:
    """The ET observer's stack, left wrong by an async collective, can hang an annotation's
    ops from the one around it (seen on DDP's last forward of a window): the annotation then
    had no children and was kept as an op of its own, beside the ops it held (their time
    twice, and the first of them waiting for nothing on its thread). Made here by moving
    ``train_forward``'s children up a level: the ops must come out as they do undamaged."""
    import json

    et = json.loads((gloo_traces / "et_rank0.json").read_text())
    nodes = {n["id"]: n for n in et["nodes"]}
    annotation = next(n for n in et["nodes"] if n["name"] == "train_forward")
    moved = [n for n in et["nodes"] if n["ctrl_deps"] == annotation["id"]]
    assert moved
    for n in moved:
        n["ctrl_deps"] = annotation["ctrl_deps"]
    assert nodes[annotation["ctrl_deps"]]
    damaged = tmp_path / "et_rank0.json"
    damaged.write_text(json.dumps(et))
    kineto = gloo_traces / "kineto_rank0.json"

    def ops(trace) -> list[tuple]:
        return sorted((op.name, op.start_ps, op.dur_ps, op.lane) for op in trace.ops)

    whole, emptied = link(gloo_traces / "et_rank0.json", kineto), link(damaged, kineto)
    assert "train_forward" not in {op.name for op in emptied.ops}
    assert ops(emptied) == ops(whole)
    assert emptied.stats["et_emptied_annotations"] == 1
    assert any("read through" in w for w in emptied.warnings), emptied.warnings


def test_reference_linked_et_alone(corpus: Path) -> None:
    """The reference linker's host + device ET carries Kineto times and GPU nodes itself."""
    trace = link(corpus / "chakra_reference/a100_resnet_nccl.ref_linked.json.gz", None)
    assert trace.clock.startswith("et:ts-us")
    device = _device(trace)
    assert len(device) == 3660 and trace.stats["device_linked"] == 3660
    colls = [op for op in trace.ops if op.kind == OpKind.COLLECTIVE]
    assert Counter(op.comm.comm_type for op in colls) == {CommType.ALL_REDUCE: 15,
                                                           CommType.BROADCAST: 6}
    assert all(op.on_device and op.lane.startswith("stream:") for op in colls)
    assert sum(op.comm.size_bytes for op in colls) == 307_323_096
    assert all(op.start_ps is not None for op in trace.ops if op.kind != OpKind.METADATA)
    successors = {e.src for e in trace.edges if e.kind == EdgeKind.STREAM_ORDER}
    assert len(successors) == len(device) - len({op.lane for op in device})
    _check_edges(trace)


def _sync_trace(path: Path, with_records: bool) -> Path:
    """A minimal Kineto trace in the layout Kineto writes with ``enable_cuda_sync_events``
    (no corpus file has cuda_sync records): host thread 100 launches K1 on stream 7 and K0
    on stream 20, records an event, makes stream 20 wait for it, launches K2 on stream 20."""
    def x(cat, name, ts, dur, pid=1, tid=100, **args):
        return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts,
                "dur": dur, "args": args}

    def kernel(name, ts, stream, corr):
        return x("kernel", name, ts, 5, pid=0, tid=stream, device=0, stream=stream,
                 correlation=corr)

    events = [
        x("cpu_op", "aten::mul", 0, 10), x("cuda_runtime", "cudaLaunchKernel", 1, 1,
                                           correlation=1),
        x("cuda_runtime", "cudaLaunchKernel", 5, 1, correlation=10),
        x("cpu_op", "record_stream", 11, 3), x("cuda_runtime", "cudaEventRecord", 12, 1,
                                               correlation=2),
        x("cpu_op", "c10d::allreduce_", 15, 10),
        x("cuda_runtime", "cudaStreamWaitEvent", 16, 1, correlation=3),
        x("cuda_runtime", "cudaLaunchKernel", 18, 1, correlation=4),
        x("cuda_runtime", "cudaStreamSynchronize", 40, 2, correlation=5),
        x("cpu_op", "aten::item", 45, 3),
        kernel("K1", 20, 7, 1), kernel("K0", 22, 20, 10), kernel("K2", 30, 20, 4),
    ]
    if with_records:
        events += [x("cuda_sync", "Stream Wait Event", 16, 0, pid=0, tid=20, stream=20,
                     correlation=3, device=0, wait_on_stream=7,
                     wait_on_cuda_event_record_corr_id=2, wait_on_cuda_event_id=1),
                   x("cuda_sync", "Stream Sync", 40, 2, pid=0, tid=20, stream=20,
                     correlation=5, device=0)]
    import orjson

    path.write_bytes(orjson.dumps({"baseTimeNanoseconds": 10**18, "traceEvents": events}))
    return path


@pytest.mark.parametrize("with_records", [True, False])
def test_cuda_sync_records_name_the_streams(tmp_path: Path, with_records: bool) -> None:
    trace = link(None, _sync_trace(tmp_path / "k.json", with_records))
    uid = {op.name: op.uid for op in trace.ops}
    sync = {(e.src, e.dst) for e in trace.edges if e.kind == EdgeKind.SYNC}
    # Exact: stream 20 waits for stream 7's K1. The call-order rule cannot see it (the
    # thread's last launch before the record went to stream 20 itself).
    assert ((uid["K1"], uid["K2"]) in sync) == with_records
    assert (uid["K2"], uid["aten::item"]) in sync  # stream sync either way
    _check_edges(trace)


def test_kineto_only_forward_backward_edges(corpus: Path, resnet: LinkedTrace) -> None:
    """Without the ET, Kineto's Sequence numbers give the same forward -> backward edges."""
    trace = link(None, corpus / "pytorch/a100_resnet_nccl/kineto.json.gz")
    ops = trace.ops
    data = {(ops[e.src].name, ops[e.dst].name) for e in trace.edges if e.kind == EdgeKind.DATA}
    with_et = {(resnet.ops[e.src].name, resnet.ops[e.dst].name) for e in resnet.edges
               if e.kind == EdgeKind.DATA}
    assert len([e for e in trace.edges if e.kind == EdgeKind.DATA]) == 543
    assert data == with_et
    _check_edges(trace)


def test_host_ranges_in_entry_order_and_nested() -> None:
    """Host ranges of a thread go in entry order (earlier start first; at equal starts the
    longer, enclosing range first, else file order) and each gets the innermost range open
    around it as parent: here with many equal starts, as nested annotations have."""
    import random

    from chakra_hooks.linker.pytorch.kineto_events import KEvent
    from chakra_hooks.linker.pytorch.match import index_threads

    rng = random.Random(7)
    # Annotations: ranges that may overlap without nesting (op calls that do are cut, below).
    host = [KEvent(f"op{i}", "user_annotation", pid=1, tid=1 + i % 2,
                   start=rng.randrange(0, 40) * 10, dur=rng.randrange(0, 4) * 10)
            for i in range(3000)]
    threads = index_threads(list(host))
    for tid in (1, 2):
        mine = [ev for ev in host if ev.tid == tid]
        expected = sorted(mine, key=lambda ev: (ev.start, -ev.dur))  # stable: file order
        assert [id(ev) for ev in threads[(1, tid)].events] == [id(ev) for ev in expected]
        for ev in expected:
            parent = ev.parent
            if parent is not None:
                assert parent.start <= ev.start and ev.start < parent.start + parent.dur
    assert sum(len(th.events) for th in threads.values()) == len(host)


def test_threads_group_ranges_by_value_not_object() -> None:
    """index_threads looks a thread up once per run of its ranges, by the pid and tid objects
    the reader shares; equal ids in objects of their own still make one thread, in order."""
    from chakra_hooks.linker.pytorch.kineto_events import KEvent
    from chakra_hooks.linker.pytorch.match import index_threads

    def big(value: int) -> int:
        return int(str(value))  # a new int object each time

    host = [KEvent(f"op{i}", "cpu_op", pid=big(10**12), tid=big(10**12 + i % 3 // 2),
                   start=i * 10, dur=5) for i in range(30)]
    threads = index_threads(host)
    assert list(threads) == [(10**12, 10**12), (10**12, 10**12 + 1)]
    assert [ev.name for ev in threads[(10**12, 10**12 + 1)].events] == [
        f"op{i}" for i in range(30) if i % 3 == 2]
    assert sum(len(th.events) for th in threads.values()) == 30


def test_innermost_range_at_any_time() -> None:
    """KThread.innermost (the compiled build searches the starts on C integers) gives what
    bisecting the starts and walking up the parents gives, at every start, end and between,
    on nested ranges with equal starts and ends and clock-sized times."""
    import random
    from bisect import bisect_right

    from chakra_hooks.linker.pytorch.kineto_events import KEvent
    from chakra_hooks.linker.pytorch.match import index_threads

    rng = random.Random(11)
    base = 1_711_964_646_000_000_000
    host = []
    for i in range(400):
        start = base + rng.randrange(0, 2000) * 10
        host.append(KEvent(f"op{i}", "user_annotation", pid=1, tid=1, start=start,
                           dur=rng.choice([0, 10, 30, 200, 5000])))
    thread = index_threads(host)[(1, 1)]

    def reference(t: int):
        i = bisect_right(thread.starts, t) - 1
        ev = thread.events[i] if i >= 0 else None
        while ev is not None and ev.start + ev.dur < t:
            ev = ev.parent
        return ev

    times = {base - 1, base, base + 30_000}
    for ev in host:
        times.update((ev.start - 1, ev.start, ev.start + 1, ev.start + ev.dur,
                      ev.start + ev.dur + 1))
    found = 0
    for t in sorted(times):
        got = thread.innermost(t)
        assert got is reference(t), t
        found += got is not None
    assert 0 < found < len(times)


def test_an_op_call_that_outlives_the_range_it_is_in_is_cut_to_it() -> None:
    """An op whose duration became 1,000x its own (20 ms inside a 60 us backward function)
    made the next 80 ops of its thread its children: they were lost from the ET."""
    from chakra_hooks.linker.pytorch.kineto_events import KEvent
    from chakra_hooks.linker.pytorch.match import index_threads

    outer = KEvent("autograd::engine::evaluate_function: SumBackward1", "cpu_op", pid=1,
                   tid=1, start=0, dur=60)
    inner = KEvent("SumBackward1", "cpu_op", pid=1, tid=1, start=10, dur=20_000)
    after = KEvent("aten::add", "cpu_op", pid=1, tid=1, start=100, dur=5)
    # gloo's ranges run on after the call that queued them: kept as they are
    call = KEvent("c10d::recv_", "cpu_op", pid=1, tid=2, start=0, dur=60)
    gloo = KEvent("gloo:recv", "user_annotation", pid=1, tid=2, start=20, dur=5_000)
    threads = index_threads([outer, inner, after, call, gloo])
    assert threads[(1, 1)].clipped == [inner] and inner.dur == 50 and after.parent is None
    assert not threads[(1, 2)].clipped and gloo.dur == 5_000


def test_the_linker_lets_its_inputs_go_before_it_is_done(corpus: Path) -> None:
    """The ET's nodes and Kineto's events are let go as soon as nothing reads them, so that the
    ops and edges made afterwards reuse their memory (a rank's peak was the end of linking with
    both inputs whole: docs/performance.md, "Peak memory")."""
    from chakra_hooks.linker.pytorch.et import read_host_et
    from chakra_hooks.linker.pytorch.kineto import read_kineto
    from chakra_hooks.linker.pytorch.link import PytorchLinker, select_et

    d = corpus / "pytorch/a100_resnet_nccl"
    et, kt = read_host_et(d / "host_et.json.gz"), read_kineto(d / "kineto.json.gz")
    nodes, host = len(et.nodes), len(kt.host)
    linker = PytorchLinker(et, kt, None, select_et(et))
    trace = linker.build()
    assert nodes > 1000 and host > 1000
    assert et.nodes == [] and et.by_id == {} and linker.tops == [] and linker.selected is None
    assert kt.host == kt.device == kt.runtime == kt.syncs == [] and linker.threads == {}
    assert linker.match.by_et == {} and linker.match.matched == trace.stats["host_matched"] > 1000
    assert trace.stats["ops"] > 1000  # (same bytes as before the release: benchmarks/same_outputs.py)
