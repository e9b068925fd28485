"""Links that are never silently wrong (issue 14, section 2): inputs built from the corpus's
DLRM rank 0 (ET + Kineto, NCCL on V100) with one defect each, converted, then checked with our
own ``validate`` (both targets) and with what the nodes say."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

from chakra_hooks.convert import convert_paths
from chakra_hooks.converter import etio, validate
from chakra_hooks.converter.summary import summarize
from chakra_hooks.converter.attrs import attr_dict, value_of
from chakra_hooks.converter.schema import (COMM_COLL, COMM_RECV, COMM_SEND, COMP, GlobalMetadata,
                                           Node, NodeType)

DLRM = "pytorch/v100_dlrm_8rank"


def _kineto(corpus: Path) -> dict:
    path = next((corpus / DLRM).glob("worker0_step_12.*.pt.trace.json.gz"))
    return json.loads(gzip.decompress(path.read_bytes()))


def _rank0(corpus: Path, folder: Path, kineto: dict, with_et: bool = True) -> Path:
    """A folder holding rank 0's ET (unless ``with_et`` is false) and the given Kineto trace."""
    folder.mkdir(parents=True)
    if with_et:
        shutil.copy(corpus / DLRM / "dlrm_eg_0.json.gz", folder)
    (folder / "worker0_step_12.pt.trace.json.gz").write_bytes(gzip.compress(json.dumps(kineto).encode()))
    return folder


def _convert(source: Path, out: Path, target: str = "full") -> tuple[list[Node], list[str]]:
    """Convert; the nodes of rank 0 and the warnings. Every output must pass our validate."""
    warnings: list[str] = []
    result = convert_paths([source], out, target=target, progress=False, warn=warnings.append,
                           workers=1)
    et = etio.read_et(out / result.ranks[0].files[0])
    report = validate.validate(str(out), et.metadata, et.nodes,
                               "astra-sim" if target == "astra-sim" else "chakra")
    assert report.ok, report.problems[:5]
    return list(et.nodes), warnings


def _attrs(node: Node) -> dict[str, object]:
    return {name: value_of(attr) for name, attr in attr_dict(node).items()}


def _sendrecv(events: list[dict]) -> list[dict]:
    return [e for e in events if e.get("cat") == "kernel" and "SendRecv" in e["name"]]


def test_sendrecv_kernels_without_their_launch_are_not_invalid_p2p_nodes(corpus, tmp_path):
    # The runtime calls that launched the five SendRecv kernels are missing: nothing says the
    # peer, so a COMM_SEND would lack comm_src / comm_dst / comm_tag (validate rejects it).
    kineto = _kineto(corpus)
    events = kineto["traceEvents"]
    launched = {e["args"]["correlation"] for e in _sendrecv(events)}
    assert len(launched) == 5
    kineto["traceEvents"] = [e for e in events if not (
        e.get("cat") == "cuda_runtime" and e.get("args", {}).get("correlation") in launched)]
    source = _rank0(corpus, tmp_path / "in", kineto)
    for target in ("full", "astra-sim"):
        nodes, _ = _convert(source, tmp_path / target, target)
        assert not [n for n in nodes if n.type in (COMM_SEND, COMM_RECV)]
        unresolved = [n for n in nodes if "comm_unresolved" in _attrs(n)]
        assert len(unresolved) == 5 and all(n.type == COMP and "SendRecv" in n.name for n in unresolved)
        summary = summarize(target, GlobalMetadata(), nodes)
        assert summary.unknown.get("comm_unresolved") == 5
    # Still communication to stats and whatif: --comm scales them, --compute does not (they
    # were device compute: 24.3 ms of a 71.5 ms top op on an MI300X trace moved with --compute).
    from chakra_hooks.converter import whatif
    from chakra_hooks.converter.run_model import COMM, Rank

    nodes, _ = _convert(source, tmp_path / "again", "full")
    rank = Rank.of_nodes(0, "r", nodes)
    ids = list(rank.columns.ids)
    unresolved = [ids.index(n.id) for n in nodes if "comm_unresolved" in _attrs(n)]
    assert len(unresolved) == 5 and all(rank.columns.kinds[p] == COMM for p in unresolved)
    durations = {p: rank.columns.durs[p] for p in unresolved}
    _, slower = whatif.durations(rank, whatif.Change(compute=2.0))
    _, faster = whatif.durations(rank, whatif.Change(comm=0.5))
    assert all(slower[i] == d and faster[i] == d * 0.5 for i, d in durations.items())


def test_a_c10d_call_that_launched_no_kernel_is_a_host_op(corpus, tmp_path):
    # The all-to-alls moved nothing (NCCL with a zero-size input launches no kernel): their
    # kernels and launches are gone. Before: five device COMM nodes of 0 bytes marked host-side.
    kineto = _kineto(corpus)
    events = kineto["traceEvents"]
    gone = {e["args"]["correlation"] for e in _sendrecv(events)}
    kineto["traceEvents"] = [e for e in events if e.get("args", {}).get("correlation") not in gone
                             or e.get("cat") not in ("kernel", "cuda_runtime")]
    nodes, _ = _convert(_rank0(corpus, tmp_path / "in", kineto), tmp_path / "out")
    assert not [n for n in nodes if "host_side_collective" in _attrs(n)]
    alltoall = [n for n in nodes if n.name == "c10d::alltoall_base_"]
    assert alltoall and all(n.type == COMP and _attrs(n)["is_cpu_op"] for n in alltoall)
    collectives = [n for n in nodes if n.type == COMM_COLL]
    assert len(collectives) == 3  # the all-reduces, which did launch their kernels


def test_collectives_without_sizes_say_so(corpus, tmp_path):
    # Kineto only, without the record_param_comms ranges and the input shapes of the c10d and
    # nccl:* ranges: nothing gives the collectives' sizes.
    kineto = _kineto(corpus)
    kept = []
    for e in kineto["traceEvents"]:
        if e.get("name") == "record_param_comms":
            continue
        if e.get("name", "").startswith(("c10d::", "nccl:")):
            e = dict(e, args={k: v for k, v in e["args"].items() if k not in ("Input Dims", "Input type")})
        kept.append(e)
    kineto["traceEvents"] = kept
    source = _rank0(corpus, tmp_path / "in", kineto, with_et=False)
    nodes, warnings = _convert(source, tmp_path / "full")
    unknown = [n for n in nodes if n.type == COMM_COLL and "comm_size_unknown" in _attrs(n)]
    assert unknown and all(_attrs(n)["comm_size"] == 0 for n in unknown)
    et = etio.read_et(tmp_path / "full" / "chakra.0.et")
    flagged = validate.validate("full", et.metadata, et.nodes, "astra-sim").counts()
    assert flagged.get("comm-size-unknown") == len(unknown)
    assert summarize("full", et.metadata, et.nodes).unknown["comm_size_unknown"] == len(unknown)
    # For ASTRA-sim (which would move 0 bytes) they are replayed for the time they took.
    nodes, _ = _convert(source, tmp_path / "astra", "astra-sim")
    replayed = [n for n in nodes if "comm_size_unknown" in _attrs(n)]
    assert len(replayed) == len(unknown) and all(n.type == COMP for n in replayed)


def test_a_kernel_without_dur_is_duration_unknown_not_a_measured_zero(corpus, tmp_path):
    kineto = _kineto(corpus)
    kernel = next(e for e in kineto["traceEvents"]
                  if e.get("cat") == "kernel" and "AllReduce" in e["name"])
    del kernel["dur"]
    nodes, warnings = _convert(_rank0(corpus, tmp_path / "in", kineto), tmp_path / "out")
    node = next(n for n in nodes if _attrs(n).get("correlation") == kernel["args"]["correlation"])
    assert _attrs(node).get("duration_unknown") is True and node.duration_micros == 0
    assert any("no 'dur'" in w for w in warnings)


def test_exact_duplicate_events_are_dropped_with_a_warning(corpus, tmp_path):
    kineto = _kineto(corpus)
    once, _ = _convert(_rank0(corpus, tmp_path / "once", kineto), tmp_path / "out1")
    kineto["traceEvents"] = kineto["traceEvents"] * 2  # the file written twice over
    twice, warnings = _convert(_rank0(corpus, tmp_path / "twice", kineto), tmp_path / "out2")
    assert len(twice) == len(once)
    assert sum(n.type == COMM_COLL for n in twice) == sum(n.type == COMM_COLL for n in once)
    assert any("exact repeats" in w for w in warnings)


def test_validate_calls_an_empty_et_a_problem(tmp_path):
    path = tmp_path / "chakra.3.et"
    etio.write_et(path, GlobalMetadata(version="0.0.4"), [])
    et = etio.read_et(path)
    assert validate.validate(str(path), et.metadata, et.nodes).counts() == {"empty": 1}


def test_inspect_counts_point_to_point_in_comm_types_and_schema_is_chakras(tmp_path):
    def node(nid: int, kind: str) -> Node:
        n = Node(id=nid, name=kind, type=NodeType.Value(kind), duration_micros=5)
        for name, value in (("comm_src", 0), ("comm_dst", 1), ("comm_tag", 0), ("comm_size", 64)):
            n.attr.add(name=name, int64_val=value)
        return n

    meta = GlobalMetadata(version="0.0.4")
    meta.attr.add(name="schema", string_val="1.0.3-chakra.0.0.4")  # the host ET's
    summary = summarize("x.0.et", meta, [node(0, "COMM_SEND_NODE"), node(1, "COMM_RECV_NODE")])
    assert summary.comm_types == {"COMM_SEND_NODE": 1, "COMM_RECV_NODE": 1}
    assert summary.comm_bytes_by_type == {"COMM_SEND_NODE": 64, "COMM_RECV_NODE": 64}
    assert summary.schema == "0.0.4" and summary.source_schema == "1.0.3-chakra.0.0.4"


@pytest.mark.parametrize("target", ["full", "astra-sim"])
def test_every_corpus_output_passes_validate(corpus, tmp_path, target):
    # convert never writes what validate rejects: the whole corpus, both targets.
    sources = ["pytorch/a100_resnet_nccl", "pytorch/a100_simple_add", "pytorch/rtx2080_linear",
               DLRM, "kineto_only", "vllm/mi300x_decode_full/graph_capture_rank_0.pt.trace.json.gz",
               "vllm/mi300x_decode_full/graph_execution.json.gz", "jax_xla/tpu_inference_2.xplane.pb",
               "jax_xla/mi300x_jax_conv.xplane.pb"]
    for index, rel in enumerate(sources):
        inputs = [corpus / rel] if rel != "kineto_only" else [corpus / rel / "b200_eager_rank0.json.gz"]
        out = tmp_path / str(index)
        result = convert_paths(inputs, out, target=target, progress=False, warn=lambda _: None)
        for rank in result.ranks:
            et = etio.read_et(out / rank.files[0])
            report = validate.validate(rank.files[0], et.metadata, et.nodes,
                                       "astra-sim" if target == "astra-sim" else "chakra")
            assert report.ok, (rel, rank.rank, report.problems[:3])


def _lanes(nodes: list[Node]) -> dict[str, list[int]]:
    """Host lane -> start times (us) of its linked ops (not gaps, not ops Kineto lacks)."""
    lanes: dict[str, list[int]] = {}
    for n in nodes:
        a = _attrs(n)
        if a.get("is_cpu_op") and n.name != "host_gap" and "duration_unknown" not in a:
            lanes.setdefault(a["lane"], []).append(n.start_time_micros)
    return lanes


def test_name_sequence_matching_keeps_all_threads_in_one_step(corpus, tmp_path):
    # rtx2080_linear: an ET of one step, Kineto of many, matched by op names alone (no
    # record-function or External ids: removed here). In Kineto, the backward thread of the
    # step the ET recorded loses 40 % of its ranges: aligned on its own, that thread would
    # match another step better, linking backward ops far from their forward.
    source = corpus / "pytorch" / "rtx2080_linear"
    kineto = json.loads(gzip.decompress((source / "kineto.json.gz").read_bytes()))
    for e in kineto["traceEvents"]:
        if isinstance(e.get("args"), dict):
            e["args"].pop("External id", None)
            e["args"].pop("Record function id", None)
    clean = tmp_path / "clean"
    clean.mkdir()
    shutil.copy(source / "host_et.json.gz", clean)
    (clean / "kineto.json.gz").write_bytes(gzip.compress(json.dumps(kineto).encode()))
    nodes, _ = _convert(clean, tmp_path / "clean_out")
    lanes = _lanes(nodes)
    assert len(lanes) == 2
    (fwd_lane, fwd), (bwd_lane, bwd) = sorted(lanes.items(), key=lambda kv: min(kv[1]))
    step = (min(fwd), max(max(fwd), max(bwd)))
    devices = sum("category" in _attrs(n) for n in nodes)  # kernels, copies, memsets

    bwd_tid = int(bwd_lane.split(":")[1])
    in_step = [e for e in kineto["traceEvents"] if e.get("tid") == bwd_tid and e.get("cat") == "cpu_op"
               and min(bwd) <= e["ts"] <= max(bwd)]
    dropped = {id(e) for e in in_step[::5] + in_step[1::5]}
    kineto["traceEvents"] = [e for e in kineto["traceEvents"] if id(e) not in dropped]
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    shutil.copy(source / "host_et.json.gz", damaged)
    (damaged / "kineto.json.gz").write_bytes(gzip.compress(json.dumps(kineto).encode()))
    result = convert_paths([damaged], tmp_path / "damaged_out", progress=False, warn=lambda _: None)
    nodes = etio.read_et(tmp_path / "damaged_out" / "chakra.0.et").nodes
    for lane, starts in _lanes(nodes).items():  # every linked op inside the one step
        assert step[0] <= min(starts) and max(starts) <= step[1] + 1, lane
    assert sum("category" in _attrs(n) for n in nodes) <= devices  # no other step's kernels
    assert result.ranks[0].stats["match_rate"] < 0.95  # what matched, honestly
    # The ET's tensor ids give data edges forward -> backward; with the threads in one step
    # none runs against time (which the converter would have to drop).
    assert result.ranks[0].stats["edges_against_time"] == 0


def test_collectives_without_their_group_are_said_to_span_all_ranks(corpus, tmp_path):
    # b200_eager_rank0 (Kineto only, 71 process groups): its collectives name their group. With
    # the names and ranks taken out, they cannot be placed, and convert says so.
    path = corpus / "kineto_only" / "b200_eager_rank0.json.gz"
    kineto = json.loads(gzip.decompress(path.read_bytes()))
    stripped = 0
    for e in kineto["traceEvents"]:
        args = e.get("args")
        if isinstance(args, dict) and "Process Group Name" in args:
            args.pop("Process Group Name")
            args.pop("Process Group Ranks", None)
            stripped += 1
    assert stripped
    source = tmp_path / "b200_rank0.json.gz"
    source.write_bytes(gzip.compress(json.dumps(kineto).encode()))
    warnings: list[str] = []
    result = convert_paths([source], tmp_path / "out", progress=False, warn=warnings.append)
    assert result.ranks[0].stats["comm_group_unknown"] > 0
    assert any("do not say which process group" in w and "subgroups" in w for w in warnings)


def test_kineto_steps_the_et_does_not_hold_are_said_to_be_left_out(corpus, tmp_path):
    """rtx2080_linear: an ET of one iteration beside a Kineto trace of many. The output keeps
    the ET's step; a warning counts what was left out, and the metadata keeps it (inspect)."""

    result = convert_paths([corpus / "pytorch" / "rtx2080_linear"], tmp_path, progress=False,
                           warn=lambda _: None)
    [rank] = result.ranks
    assert rank.stats["kineto_left_out_device"] > 8000 and rank.stats["kineto_left_out_host"] > 30000
    assert any("left out" in w and "outside the host ET's window" in w for w in rank.warnings)
    metadata = {a.name: value_of(a) for a in etio.read_et(tmp_path / "chakra.0.et").metadata.attr}
    assert "device events of the Kineto trace lie outside" in metadata["kineto_left_out"]
