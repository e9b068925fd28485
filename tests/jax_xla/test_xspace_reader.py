"""XSpace reader: real TPU and GPU profiles from the corpus, plus files built with our schema."""

from __future__ import annotations

from pathlib import Path

import pytest

from chakra_hooks.errors import TraceFormatError
from chakra_hooks.linker import xspace, xspace_pb2

TPU = "jax_xla/tpu_inference_2.xplane.pb"
GPU = "jax_xla/mi300x_jax_conv.xplane.pb"


def test_tpu_planes_and_op_counts(corpus: Path) -> None:
    space = xspace.read_xspace(corpus / TPU)
    names = [p.name for p in space.planes]
    for n in range(4):
        assert f"/device:TPU:{n}" in names
    assert "/host:CPU" in names and "Task Environment" in names
    counts = []
    for n in range(4):
        view = xspace.find_plane(space, f"/device:TPU:{n}")
        counts.append(sum(1 for _ in view.events(view.line("XLA Ops"))))
    assert counts == [1504, 1503, 1503, 1503]


def test_event_time_is_integer_line_timestamp_plus_offset(corpus: Path) -> None:
    space = xspace.read_xspace(corpus / GPU)
    view = xspace.find_plane(space, "/device:GPU:0")
    line = view.plane.lines[0]
    events = list(view.events(line))
    raw = line.events[0]
    assert events[0][1] == line.timestamp_ns * 1000 + raw.offset_ps
    assert all(isinstance(start, int) and isinstance(dur, int) for _, start, dur, _ in events)


def test_ref_values_resolve_to_stat_metadata_names(corpus: Path) -> None:
    space = xspace.read_xspace(corpus / GPU)
    view = xspace.find_plane(space, "/device:GPU:1")
    hlo_op_id = view.stat_ids["hlo_op"]
    seen = False
    for _, _, _, stats in view.events(view.plane.lines[0]):
        refs = [st for st in stats if st.metadata_id == hlo_op_id]
        if refs:
            assert refs[0].WhichOneof("value") == "ref_value"
            resolved = view.stats(stats)
            assert resolved["hlo_op"] == view.stat_names[refs[0].ref_value]
            assert isinstance(resolved["hlo_op"], str) and resolved["hlo_op"]
            seen = True
    assert seen


def test_tpu_metadata_stats_and_device_clock_offset(corpus: Path) -> None:
    space = xspace.read_xspace(corpus / TPU)
    view = xspace.find_plane(space, "/device:TPU:0")
    line = view.line("XLA Ops")
    mid = line.events[0].metadata_id
    meta = view.metadata_stats(mid)
    assert {"flops", "bytes_accessed", "program_id"} <= set(meta)
    offset = xspace.device_clock_offset(view, line)
    diffs = sorted(
        line.timestamp_ns * 1000 + ev.offset_ps
        - xspace.int_stat(ev.stats, view.stat_ids["device_offset_ps"]) for ev in line.events)
    assert offset == diffs[len(diffs) // 2]


def test_profile_start_time(corpus: Path) -> None:
    assert xspace.profile_start_ns(xspace.read_xspace(corpus / TPU)) == 1741722099081044120


def _space_with_big_times() -> xspace_pb2.XSpace:
    space = xspace_pb2.XSpace(hostnames=["h"])
    plane = space.planes.add(id=1, name="/device:GPU:0")
    plane.stat_metadata[1].name = "hlo_op"
    plane.stat_metadata[2].name = "fusion.7"
    plane.stat_metadata[3].name = "flops"
    plane.event_metadata[5].name = "kernel"
    line = plane.lines.add(id=1, name="Stream #1(Kernel)", timestamp_ns=1_795_307_354_765_663_656)
    ev = line.events.add(metadata_id=5, offset_ps=123_456_789_012_345, duration_ps=7)
    ev.stats.add(metadata_id=1, ref_value=2)
    ev.stats.add(metadata_id=3, int64_value=42)
    return space


def test_picoseconds_stay_exact_beyond_float_precision() -> None:
    space = xspace.parse_xspace(_space_with_big_times().SerializeToString())
    view = xspace.PlaneView(space.planes[0])
    [(mid, start, dur, stats)] = list(view.events(view.plane.lines[0]))
    assert start == 1_795_307_354_765_663_656 * 1000 + 123_456_789_012_345
    assert float(start) != start  # would have been rounded as a float
    assert dur == 7 and view.event_name(mid) == "kernel"
    assert view.stats(stats) == {"hlo_op": "fusion.7", "flops": 42}


def test_truncated_file_is_a_one_line_error(corpus: Path, tmp_path: Path) -> None:
    data = (corpus / TPU).read_bytes()
    bad = tmp_path / "cut.xplane.pb"
    bad.write_bytes(data[: len(data) // 2])
    with pytest.raises(TraceFormatError) as err:
        xspace.read_xspace(bad)
    message = str(err.value)
    assert "\n" not in message and str(bad) in message and "truncated" in message


@pytest.mark.parametrize("payload", [b"", b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", b"not a profile at all"])
def test_foreign_or_empty_file_is_a_one_line_error(tmp_path: Path, payload: bytes) -> None:
    bad = tmp_path / "bad.xplane.pb"
    bad.write_bytes(payload)
    with pytest.raises(TraceFormatError) as err:
        xspace.read_xspace(bad)
    assert "\n" not in str(err.value) and str(bad) in str(err.value)


def test_missing_file_is_a_one_line_error(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError):
        xspace.read_xspace(tmp_path / "absent.xplane.pb")


def test_private_descriptor_pool() -> None:
    from google.protobuf import descriptor_pool

    with pytest.raises(KeyError):
        descriptor_pool.Default().FindMessageTypeByName("chakra_hooks.xspace.XSpace")
