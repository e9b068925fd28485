"""XSpace + HLO -> linked traces -> Chakra ETs, on the real TPU and GPU profiles of the corpus."""

from __future__ import annotations

import gc
import random
import sys
from array import array
from collections import Counter
from collections.abc import MutableMapping
from pathlib import Path

import pytest

np = pytest.importorskip("numpy")

from chakra_hooks.convert import convert_paths
from chakra_hooks.converter import etio, graph, validate
from chakra_hooks.common.errors import TraceFormatError
from chakra_hooks.linker.xla import discover as xla_discover
from chakra_hooks.linker.xla import link as xla_link
from chakra_hooks.linker.xla.devices import Device, DeviceEvents
from chakra_hooks.linker.xla import xspace, xspace_pb2
from chakra_hooks.linker.gc_pause import gc_paused
from chakra_hooks.linker.model import CommType, Edge, EdgeColumns, EdgeKind, LinkedTrace, Op, OpKind
from chakra_hooks.linker.sources import RankJob

TPU = "jax_xla/tpu_inference_2.xplane.pb"
GPU = "jax_xla/mi300x_jax_conv.xplane.pb"
AR_BYTES = 5 * 1024 * 1024 * 256 * 4


@pytest.fixture(scope="module")
def tpu_traces(corpus: Path) -> list[LinkedTrace]:
    return xla_link.load(RankJob("xla", {"xspace": corpus / TPU}))


@pytest.fixture(scope="module")
def gpu_traces(corpus: Path) -> list[LinkedTrace]:
    return xla_link.load(RankJob("xla", {"xspace": corpus / GPU}))


def _preds(trace: LinkedTrace, kind: EdgeKind) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for e in trace.edges:
        if e.kind == kind:
            out.setdefault(e.dst, []).append(e.src)
    return out


def test_tpu_one_trace_per_chip_with_the_iota_groups(tpu_traces: list[LinkedTrace]) -> None:
    assert [t.rank for t in tpu_traces] == [0, 1, 2, 3]
    iota = np.arange(8).reshape(2, 4).transpose(1, 0).reshape(4, 2).tolist()  # [4,2]<=[2,4]T(1,0)
    for t in tpu_traces:
        assert t.groups == tpu_traces[0].groups  # one id per group, the same in every trace
        ars = [op for op in t.ops if op.kind == OpKind.COLLECTIVE]
        assert len(ars) == 3
        for op in ars:
            assert op.comm.comm_type == CommType.ALL_REDUCE and op.comm.size_bytes == AR_BYTES
            assert t.groups[op.comm.group] == next(g for g in iota if t.rank in g)
        assert t.stats["hlo_match_rate"] == 1.0 and t.metadata["hlo_source"] == "hlo proto"


def test_manifest_device_ids_become_ranks(corpus: Path) -> None:
    """A multi-host run: this host's chips are global devices 4..7 (from the run manifest)."""
    traces = xla_link.load(RankJob("xla", {"xspace": corpus / TPU}, options={"local_device_ids": [4, 5, 6, 7]}))
    assert [t.rank for t in traces] == [4, 5, 6, 7]
    for t in traces:
        assert t.metadata["local_device_ordinal"] == t.rank - 4
        for op in t.ops:
            if op.kind == OpKind.COLLECTIVE:
                assert t.groups[op.comm.group] == [t.rank - 4, t.rank]
    with pytest.raises(TraceFormatError):
        xla_link.load(RankJob("xla", {"xspace": corpus / TPU}, options={"local_device_ids": [0, 1]}))


def test_tpu_durations_are_device_durations(corpus: Path, tpu_traces: list[LinkedTrace]) -> None:
    # checked against a plain full decode with the generated classes, not our reader
    space = xspace_pb2.XSpace.FromString((corpus / TPU).read_bytes())
    for t in tpu_traces:
        [plane] = [p for p in space.planes if p.name == f"/device:TPU:{t.rank}"]
        dur_id = next(k for k, v in plane.stat_metadata.items() if v.name == "device_duration_ps")
        [line] = [ln for ln in plane.lines if ln.name == "XLA Ops"]
        expected = Counter(xspace.int_stat(ev.stats, dur_id) for ev in line.events)
        ops = [op for op in t.ops if op.lane.endswith(":XLA Ops")]
        got = Counter(op.dur_ps for op in ops)
        # a collective-permute would split; here one op per event
        assert got == expected
        assert all(isinstance(op.start_ps, int) for op in t.ops)
        # the converter rounds the same picoseconds to microseconds: the end like the start
        g = graph.build_graph(t)
        by_id = {n.id: n for n in g.nodes}
        for op in ops:
            assert by_id[op.uid].duration_micros == (graph.round_us(op.start_ps + op.dur_ps)
                                                     - graph.round_us(op.start_ps))


def test_tpu_host_offload_copies(tpu_traces: list[LinkedTrace]) -> None:
    chip0 = tpu_traces[0]
    ops = {op.uid: op for op in chip0.ops}
    kinds = Counter(op.kind for op in chip0.ops)
    assert kinds[OpKind.MEM_LOAD] == 300 and kinds[OpKind.MEM_STORE] == 300
    data_in = _preds(chip0, EdgeKind.DATA)
    data_out: dict[int, list[int]] = {}
    for dst, srcs in data_in.items():
        for s in srcs:
            data_out.setdefault(s, []).append(dst)
    for op in chip0.ops:
        if op.kind in (OpKind.MEM_LOAD, OpKind.MEM_STORE):
            assert op.bytes == AR_BYTES and op.lane == "tpu:0:Async XLA Ops"
            issuers = [ops[s].attrs.get("hlo_opcode") for s in data_in.get(op.uid, [])]
            waiters = [ops[d].attrs.get("hlo_opcode") for d in data_out.get(op.uid, [])]
            assert "copy-start" in issuers
            # XProf draws most transfers past the start of the copy-done that reads them: as a
            # dependency (copy-done after the transfer's end) such an edge would replay the
            # copy-done later than it ran, so it is left out, and counted.
            done = next(o for o in chip0.ops if o.attrs.get("hlo_opcode") == "copy-done"
                        and o.start_ps >= op.start_ps)
            assert "copy-done" in waiters or op.start_ps + op.dur_ps > done.start_ps
    assert chip0.stats["data_edges_overlapping"] > 0
    # chips without an Async XLA Ops line: the copy-start itself is the transfer
    for t in tpu_traces[1:]:
        mem = [op for op in t.ops if op.kind in (OpKind.MEM_LOAD, OpKind.MEM_STORE)]
        assert mem and all(op.attrs["hlo_opcode"] == "copy-start" for op in mem)
        preds = _preds(t, EdgeKind.DATA)
        dones = [op for op in t.ops if op.attrs.get("hlo_opcode") == "copy-done"]
        assert dones and all(any(t.ops[s].attrs.get("hlo_opcode") == "copy-start" for s in preds.get(d.uid, []))
                             for d in dones)


def test_tpu_data_edges_follow_hlo_operands(tpu_traces: list[LinkedTrace]) -> None:
    t = tpu_traces[1]
    preds = _preds(t, EdgeKind.DATA)
    fusions = [op for op in t.ops if op.attrs.get("hlo_op") == "broadcast_add_fusion.2"]
    assert fusions
    for op in fusions:  # operand: %copy-done, in the same module run
        names = [t.ops[s].attrs.get("hlo_op") for s in preds.get(op.uid, [])]
        assert names == ["copy-done"]
    for e in t.edges:
        assert e.src < e.dst  # uids follow start order: no cycles


def test_a_device_holds_its_edges_as_columns(tpu_traces: list[LinkedTrace]) -> None:
    """A device has about two edges an op: as columns they take 17 bytes each, where an Edge
    and its list slot took 56. Read, they are edges like any other."""
    t = tpu_traces[1]
    assert type(t.edges) is EdgeColumns
    kinds = Counter(e.kind for e in t.edges)
    assert len(t.ops) > 1000 and kinds[EdgeKind.DATA] > 1000 and kinds[EdgeKind.STREAM_ORDER] > 1000
    assert sum(kinds.values()) == len(t.edges) == len(t.edges.src)
    assert sum(column.itemsize for column in (t.edges.src, t.edges.dst, t.edges.kind)) == 17
    assert all(type(e) is Edge and type(e.kind) is EdgeKind and e.dst < len(t.ops) for e in t.edges)


def test_runs_of_an_instruction_share_what_they_have_in_common(tpu_traces: list[LinkedTrace],
                                                                gpu_traces: list[LinkedTrace]) -> None:
    """A device's ops are most of what a conversion holds, and the runs of one instruction
    share their TensorIO objects; ops of one duration its integer; their attributes are a
    DeviceOpAttrs (smaller than the same items in a dict, on CPython)."""
    t = tpu_traces[1]
    described = [op for op in t.ops if op.outputs is not None]
    by_inst: dict[tuple, list[Op]] = {}
    for op in described:
        by_inst.setdefault((op.attrs["hlo_module"], op.attrs["hlo_op"]), []).append(op)
    repeated = [ops for ops in by_inst.values() if len(ops) > 1]
    assert len(repeated) > 10 and sum(len(ops) for ops in repeated) > 1000
    for ops in repeated:
        assert all(op.outputs is ops[0].outputs and op.inputs is ops[0].inputs for op in ops)
    # ops of one duration share its integer object (beyond the few that CPython caches)
    durations: dict[int, int] = {}
    timed = [op for op in t.ops if op.dur_ps > 256]
    for op in timed:
        assert op.dur_ps is durations.setdefault(op.dur_ps, op.dur_ps)
    assert len(timed) > 1000 and len(durations) < len(timed) / 2
    # a host launch shares its kernel's correlation id object
    launched = 0
    for trace in gpu_traces:
        for e in trace.edges:
            if e.kind == EdgeKind.LAUNCH:
                launch, kernel = trace.ops[e.src], trace.ops[e.dst]
                if launch.attrs["correlation"] > 256:  # (CPython caches the smaller ones)
                    assert launch.attrs["correlation"] is kernel.attrs["correlation"]
                    launched += 1
    assert launched > 50
    if sys.implementation.name == "cpython":
        launches = [op for t in gpu_traces for op in t.ops if not op.on_device]
        for op in described[:100] + launches[:100]:
            assert sys.getsizeof(op.attrs) < sys.getsizeof(dict(op.attrs)), op.attrs
        assert launches and all(list(op.attrs) == ["correlation"] for op in launches)


def test_device_op_attrs_read_as_the_dict_they_stand_for() -> None:
    attrs = xla_link.DeviceOpAttrs("m", None, 7)
    as_dict = {"hlo_module": "m", "correlation": 7}
    assert attrs == as_dict and dict(attrs) == as_dict and len(attrs) == 2 and attrs
    attrs["_group"] = [0, 1]  # another name, as the linker sets it before _describe
    attrs["hlo_op"], attrs["hlo_opcode"] = "fusion.1", "fusion"
    as_dict.update(_group=[0, 1], hlo_op="fusion.1", hlo_opcode="fusion")
    assert attrs.items() == [("hlo_module", "m"), ("correlation", 7), ("hlo_op", "fusion.1"),
                             ("hlo_opcode", "fusion"), ("_group", [0, 1])]
    assert attrs.pop("_group") == [0, 1] == as_dict.pop("_group")
    assert attrs.pop("_group", None) is None and attrs.pop("hlo_category", 5) == 5
    # with the name set outside the fixed ones popped, the order is the dict's
    assert list(attrs) == list(as_dict) and attrs.items() == list(as_dict.items())
    assert repr(attrs) == repr(as_dict) and attrs == as_dict and attrs == attrs.copy()
    assert "hlo_op" in attrs and "hlo_category" not in attrs and "x" not in attrs
    assert attrs.get("hlo_category", 3) == 3 and attrs.get("hlo_op") == "fusion.1"
    for missing in ("hlo_category", "x"):
        with pytest.raises(KeyError):
            attrs[missing]
        with pytest.raises(KeyError):
            attrs.pop(missing)
    assert isinstance(attrs, MutableMapping) and not xla_link.DeviceOpAttrs()
    one, other = xla_link.DeviceOpAttrs(), xla_link.DeviceOpAttrs()
    one["a"], one["b"], other["b"], other["a"] = 1, 2, 2, 1
    assert one == other and one != {"a": 1} and one != [("a", 1), ("b", 2)]  # as dicts compare

    def body(attrs) -> list[bytes]:
        op = Op(0, "k", OpKind.COMPUTE, True, "stream:0:1", 0, 10**6, attrs=attrs)
        return graph.build_graph(LinkedTrace(0, "jax", "test clock", [op])).bodies

    assert body(attrs) == body(dict(attrs))


def test_gpu_one_trace_per_gpu_with_stream_order(gpu_traces: list[LinkedTrace]) -> None:
    assert [t.rank for t in gpu_traces] == list(range(8))
    for t in gpu_traces:
        preds = _preds(t, EdgeKind.STREAM_ORDER)
        lanes: dict[str, list] = {}
        for op in t.ops:
            if op.on_device:  # (the host's launch calls have lanes of their own)
                lanes.setdefault(op.lane, []).append(op)
        assert all(lane.startswith(f"stream:{t.rank}:") for lane in lanes)
        for lane_ops in lanes.values():
            lane_ops.sort(key=lambda o: o.start_ps)
            for prev, op in zip(lane_ops, lane_ops[1:]):
                srcs = preds.get(op.uid, [])
                assert len(srcs) == 1 and t.ops[srcs[0]].lane == op.lane
                if prev.start_ps + prev.dur_ps <= op.start_ps:
                    assert srcs == [prev.uid]
        assert _preds(t, EdgeKind.DATA)  # kernels matched to HLO get operand edges
    assert all(t.stats["hlo_match_rate"] == 1.0 for t in gpu_traces[1:])


@pytest.mark.parametrize("name", [TPU, GPU])
def test_convert_end_to_end_validates(corpus: Path, tmp_path: Path, name: str) -> None:
    result = convert_paths([corpus / name], tmp_path / "et", workers=1, progress=False)
    expected = 4 if name == TPU else 8
    assert [r.rank for r in result.ranks] == list(range(expected))
    for r in result.ranks:
        et = etio.read_et(tmp_path / "et" / r.files[0])
        report = validate.validate(r.files[0], et.metadata, et.nodes)
        assert report.ok, report.counts()
        assert et.nodes
    if name == TPU:
        assert result.comm_group is not None and result.comm_group.exists()


@pytest.mark.parametrize("name", [TPU, GPU])
def test_lines_read_a_part_at_a_time_convert_to_the_same_bytes(
        corpus: Path, tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Long lines are decoded a part of their events at a time (xspace.PartedLine): with
    parts of 64 bytes, every line of these profiles is, and the ETs are the same bytes."""
    convert_paths([corpus / name], tmp_path / "whole", workers=1, progress=False)
    monkeypatch.setattr(xspace, "_LINE_PART_BYTES", 64)
    convert_paths([corpus / name], tmp_path / "parts", workers=1, progress=False)
    files = sorted(p.name for p in (tmp_path / "whole").iterdir())
    assert files == sorted(p.name for p in (tmp_path / "parts").iterdir())
    assert len([f for f in files if f.endswith(".et")]) >= 4
    for f in files:
        assert (tmp_path / "whole" / f).read_bytes() == (tmp_path / "parts" / f).read_bytes(), f


def test_astra_sim_target_validates(tpu_traces: list[LinkedTrace]) -> None:
    for t in tpu_traces:
        g = graph.build_graph(t, target="astra-sim")
        report = validate.validate(f"tpu{t.rank}", g.metadata, g.nodes, target="astra-sim")
        assert report.ok, report.counts()


def test_discover_profile_layout(tmp_path: Path, corpus: Path) -> None:
    session = tmp_path / "logs" / "plugins" / "profile" / "2025_01_01_00_00_00"
    session.mkdir(parents=True)
    xplane = session / "host0.xplane.pb"
    xplane.write_bytes((corpus / GPU).read_bytes())
    twin = session / "host0.trace.json.gz"
    twin.write_bytes(b"")
    other = tmp_path / "notes.txt"
    other.write_text("x")
    jobs, claimed = xla_discover.discover(sorted([xplane, twin, other]), print)
    assert [j.files["xspace"] for j in jobs] == [xplane]
    assert claimed == {xplane, twin}


def test_corrupt_profile_is_one_line_and_writes_nothing(corpus: Path, tmp_path: Path) -> None:
    bad = tmp_path / "in" / "cut.xplane.pb"
    bad.parent.mkdir()
    data = (corpus / TPU).read_bytes()
    bad.write_bytes(data[: len(data) - 1000])
    out = tmp_path / "out"
    with pytest.raises(TraceFormatError) as err:
        convert_paths([bad.parent], out, workers=1, progress=False)
    assert "\n" not in str(err.value) and "cut.xplane.pb" in str(err.value)
    assert not any(p.suffix == ".et" for p in out.rglob("*")) if out.exists() else True


def test_gc_pause_nests_and_restores_the_collector_state() -> None:
    import gc

    from chakra_hooks.linker.gc_pause import gc_paused

    was = gc.isenabled()
    try:
        for start in (True, False):
            (gc.enable if start else gc.disable)()
            with gc_paused():
                with gc_paused():
                    assert not gc.isenabled()
                assert not gc.isenabled()
            assert gc.isenabled() is start
        gc.enable()
        with pytest.raises(RuntimeError):
            with gc_paused():
                raise RuntimeError("boom")
        assert gc.isenabled()
    finally:
        (gc.enable if was else gc.disable)()


def _damaged_gpu_profile(corpus: Path, tmp_path: Path) -> Path:
    """The MI300X profile as if only GPU 0 had worked, with a host-to-device copy on a copy
    stream of its own 50 us before GPU 0's first kernel of the second module run."""
    space = xspace_pb2.XSpace.FromString((corpus / "jax_xla" / "mi300x_jax_conv.xplane.pb").read_bytes())
    for plane in space.planes:
        if plane.name.startswith("/device:GPU:") and plane.name != "/device:GPU:0":
            for line in plane.lines:
                del line.events[:]
        elif plane.name == "/device:GPU:0":
            kernels = plane.lines[0]
            first = sorted(kernels.timestamp_ns * 1000 + e.offset_ps for e in kernels.events)[5]
            mid = max(plane.event_metadata) + 1
            plane.event_metadata[mid].id = mid
            plane.event_metadata[mid].name = "MemcpyH2D"
            copy = plane.lines.add(id=999, name="Stream #99(MemcpyH2D)", timestamp_ns=kernels.timestamp_ns)
            copy.events.add(metadata_id=mid, offset_ps=first - 60_000_000 - kernels.timestamp_ns * 1000,
                            duration_ps=10_000_000)
    path = tmp_path / "one_gpu.xplane.pb"
    path.write_bytes(space.SerializeToString())
    return path


def test_idle_gpus_get_no_et_and_copies_are_mem_loads_the_compute_stream_waits_for(corpus, tmp_path):
    warnings: list[str] = []
    result = convert_paths([_damaged_gpu_profile(corpus, tmp_path)], tmp_path / "out",
                           progress=False, warn=warnings.append)
    assert [r.rank for r in result.ranks] == [0]  # not 7 empty files beside it
    assert any("7 devices recorded no events" in w for w in warnings)
    [trace] = xla_link.load(RankJob("xla", {"xspace": tmp_path / "one_gpu.xplane.pb"}))
    [load] = [op for op in trace.ops if op.kind == OpKind.MEM_LOAD]
    assert load.name == "MemcpyH2D" and load.lane == "stream:0:99"
    waits = [trace.ops[e.dst] for e in trace.edges if e.src == load.uid and e.kind == EdgeKind.SYNC]
    assert waits and len({k.lane for k in waits}) == len(waits)  # one per compute stream
    for kernel in waits:
        assert kernel.lane != load.lane and kernel.start_ps >= load.start_ps + load.dur_ps
        earlier = [op for op in trace.ops if op.lane == kernel.lane
                   and load.start_ps + load.dur_ps <= op.start_ps < kernel.start_ps]
        assert not earlier  # the first op of that stream after the copy


def test_gpu_traces_hold_the_host_calls_that_launched_their_work(gpu_traces: list[LinkedTrace]) -> None:
    for t in gpu_traces:
        host = [op for op in t.ops if not op.on_device]
        assert host and t.stats["host_launches"] == len(host)
        assert all(op.name.startswith("hip") and op.lane.startswith("thread:Host Threads/") for op in host)
        launched = {e.src: t.ops[e.dst] for e in t.edges if e.kind == EdgeKind.LAUNCH}
        for op in host:  # each launches one device op of its own correlation, after it began
            device = launched[op.uid]
            assert device.on_device and device.attrs["correlation"] == op.attrs["correlation"]
            assert op.start_ps <= device.start_ps


def test_a_profile_is_linked_one_device_at_a_time_and_nothing_is_left_in_cycles(corpus: Path) -> None:
    """``convert`` takes a many-device profile's traces one at a time: when a device's trace
    is made, the ops alive are its own (the previous device's were consumed into its graph),
    and converting leaves no reference cycles, which the garbage collector that conversion
    pauses would not free until the job ended."""
    job = RankJob("xla", {"xspace": corpus / GPU})
    gc.collect()
    before = _ops_alive()  # other tests' traces
    gc.set_debug(gc.DEBUG_SAVEALL)  # what collect() finds stays in gc.garbage, to be looked at
    try:
        with gc_paused():
            stream = xla_link.load_each(job)
            assert len(stream) == 8
            sizes = []
            for trace in stream:
                sizes.append(len(trace.ops))
                assert _ops_alive() - before == len(trace.ops)
                graph.build_graph(trace, consume=True)
            gc.collect()
        # protobuf (upb) makes a message class for each profile it reads, and a class is always
        # in a cycle (with its MRO): those few objects are not the conversion's
        left = [o for o in gc.garbage if not _part_of_a_class(o)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert len(sizes) == 8 and min(sizes) > 0
    assert left == []


def _ops_alive() -> int:
    """Ops that something the garbage collector tracks holds (a list, a dict, a frame ...):
    compiled, an op itself is not tracked (linker/model.py)."""
    return len({id(x) for o in gc.get_objects() for x in gc.get_referents(o) if type(x) is Op})


def _part_of_a_class(o: object) -> bool:
    return (isinstance(o, type) or type(o).__name__ == "Descriptor"
            or (isinstance(o, tuple) and all(isinstance(x, type) for x in o))
            or (isinstance(o, dict) and "__module__" in o))


def test_host_launch_columns_take_ids_beyond_64_bits() -> None:
    """A correlation id is a uint64 stat: one beyond int64 turns the launch columns into lists,
    keeping every launch before it whole."""
    launches = xla_link._Launches()
    launches.add(0, 5, 7, 1, 42)
    launches.add(1, 6, 8, 2, 2**64 - 1)
    launches.add(0, 9, 3, 1, 43)
    assert len(launches) == 3
    assert list(launches.line) == [0, 1, 0]
    assert list(launches.offset) == [5, 6, 9] and list(launches.dur) == [7, 8, 3]
    assert list(launches.metadata) == [1, 2, 1] and list(launches.corr) == [42, 2**64 - 1, 43]


def test_host_launch_columns_are_packed_until_their_device_is_linked() -> None:
    """A device's launches (one per kernel) wait compressed for its turn, as its events do,
    and come back the same; widened columns stay as they are."""
    launches = xla_link._Launches()
    rows = [(i % 3, 2_000 * i + i % 7, 900 + i % 5, 1 + i % 4, 10_000 + 2 * i) for i in range(5_000)]
    for row in rows:
        launches.add(*row)
    launches.pack()
    assert launches.corr is None and launches.offset is None
    launches.unpack()
    assert len(launches) == len(rows)
    assert list(zip(launches.line, launches.offset, launches.dur, launches.metadata,
                    launches.corr)) == rows
    wide = xla_link._Launches()
    wide.add(0, 5, 7, 1, 2**64 - 1)
    wide.pack()
    assert list(wide.corr) == [2**64 - 1]


def test_stream_order_is_what_had_ended_last_when_each_op_started() -> None:
    """A lane whose ops each end before the next starts is chained op to op; a lane whose ops
    overlap is walked. Both give each op the lane's op that had ended last when it started."""
    us = 1_000_000
    events = DeviceEvents()
    kernel = events.intern("kernel")
    lanes = {"stream:0:7": [(0, 10), (10, 5), (20, 0), (20, 3)],  # one at a time
             "stream:0:8": [(0, 100), (10, 5), (16, 2), (50, 10)]}  # the first spans the rest
    for lane, spans in lanes.items():
        for start, dur in spans:
            events.add(kernel, 0, start * us, dur * us, events.intern(lane))
    device = Device("gpu", 0, "/device:GPU:0", "test clock", events)
    trace = xla_link._DeviceLinker(device, {}, Path("generated"), 0).link()
    assert len(device.events) == 0 and trace.stats["device_events"] == 8  # linking took them
    uid = {}
    for op in trace.ops:
        uid.setdefault((op.lane, op.start_ps // us, op.dur_ps // us), op.uid)
    edges = {(e.src, e.dst) for e in trace.edges if e.kind == EdgeKind.STREAM_ORDER}
    a = [uid["stream:0:7", s, d] for s, d in lanes["stream:0:7"]]
    b = [uid["stream:0:8", s, d] for s, d in lanes["stream:0:8"]]
    assert edges == {(a[0], a[1]), (a[1], a[2]), (a[2], a[3]),  # each after the one before
                     (b[1], b[2]), (b[2], b[3])}  # b[0] never ended in time; b[1] found none


@pytest.mark.parametrize("detail", [True, False], ids=["details", "no-details"])
def test_first_event_of_each_kind_in_the_order_given(detail: bool) -> None:
    """Which events the group pass resolves (one per module, name, details and copy stream),
    against keeping the first of each key tuple; with string-table indices past 2^20, which
    the compiled build cannot pack into one integer key (it keeps tuples for those)."""
    rng = random.Random(7)
    count = 3000
    big = 1 << 20
    modules = array("i", [rng.choice((0, 1, 2, big, big + 1)) for _ in range(count)])
    names = array("i", [rng.choice((3, 4, big - 1, big)) for _ in range(count)])
    details = array("i", [rng.choice((0, 5, big * 2)) for _ in range(count)]) if detail else None
    copies = array("b", [rng.randrange(4) for _ in range(count)])
    order = list(range(count))
    rng.shuffle(order)
    expected, seen = [], set()
    for i in order:
        key = (modules[i], names[i], details[i] if details is not None else 0, copies[i])
        if key not in seen:
            seen.add(key)
            expected.append(i)
    got = xla_link._first_of_each_kind(order, modules, names, details, copies)
    assert got == expected and 40 < len(got) < count
