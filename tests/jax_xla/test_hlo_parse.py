"""HLO reader: text as XLA prints it, TPU event-name instructions, HloProto bytes."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

np = pytest.importorskip("numpy")

from chakra_hooks.linker.xla import hlo, xspace

# Printed by jax 0.10.2 (CPU, 4 forced devices) for a shard_map with psum / all_gather /
# psum_scatter / all_to_all / ppermute: `jit(f).lower(x).compile().as_text()` (trimmed).
CPU_MODULE = """\
HloModule jit_body, is_scheduled=true, entry_computation_layout={(f32[4,8]{1,0})->f32[4,8]{1,0}}, num_partitions=4

FileNames
1 "/tmp/run1.py"

StackFrames
1 {file_location_id=1 parent_frame_id=1}

%region_0.0 (psum_invariant.0: f32[], psum_invariant.1: f32[]) -> f32[] {
  %psum_invariant.0 = f32[] parameter(0), metadata={op_name="psum_invariant"}
  %psum_invariant.1 = f32[] parameter(1), metadata={op_name="psum_invariant"}
  ROOT %add.0 = f32[] add(%psum_invariant.0, %psum_invariant.1), metadata={op_name="add" stack_frame_id=3}
}

%wrapped_slice_computation (param_0.2: f32[4,8]) -> f32[1,8] {
  %param_0.2 = f32[4,8]{1,0} parameter(0)
  ROOT %slice.4 = f32[1,8]{1,0} slice(%param_0.2), slice={[0:1], [0:8]}, metadata={op_name="jit(body)/shard_map/all_to_all" stack_frame_id=16}
}

ENTRY %main.0_spmd (param.1: f32[4,8]) -> f32[4,8] {
  %param.1 = f32[4,8]{1,0} parameter(0), sharding={devices=[4,1]<=[4]}, metadata={op_name="a"}
  %wrapped_slice = f32[1,8]{1,0} fusion(%param.1), kind=kLoop, calls=%wrapped_slice_computation, metadata={op_name="jit(body)/shard_map/all_to_all" stack_frame_id=16}
  %ppermute.3 = f32[4,8]{1,0} collective-permute(%param.1), channel_id=1, source_target_pairs={{0,1},{1,2},{2,3},{3,0}}, metadata={op_name="jit(body)/shard_map/ppermute" stack_frame_id=17}
  %psum_invariant.7 = f32[4,8]{1,0} all-reduce(%param.1), channel_id=1, replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=%region_0.0, metadata={op_name="jit(body)/shard_map/psum_invariant" stack_frame_id=11}
  %bitcast = f32[1,4,8]{2,1,0} bitcast(%param.1)
  %all_gather.7 = f32[4,4,8]{2,1,0} all-gather(%bitcast), channel_id=1, replica_groups={{0,1,2,3}}, dimensions={0}, use_global_device_ids=true
  %all-to-all = (f32[1,8]{1,0}, f32[1,8]{1,0}) all-to-all(%wrapped_slice, %wrapped_slice), channel_id=1, replica_groups={{0,1},{2,3}}
  %get-tuple-element = f32[1,8]{1,0} get-tuple-element(%all-to-all), index=0
  ROOT %add_add_fusion = f32[4,8]{1,0} fusion(%ppermute.3, %get-tuple-element, /*index=2*/%psum_invariant.7), kind=kLoop, calls=%region_0.0
}
"""

# Short form printed by jaxlib's XlaComputation.as_hlo_text() (no '%', no signatures).
SHORT_MODULE = """\
HloModule jit_body, is_scheduled=true

region_0.0 {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT add.0 = f32[] add(a, b)
}

ENTRY main.0_spmd {
  param.1 = f32[4,8]{1,0} parameter(0), sharding={devices=[4,1]<=[4]}
  ar-start = f32[4,8]{1,0} all-reduce-start(param.1), channel_id=2, replica_groups=[2,2]<=[4], to_apply=region_0.0
  ROOT ar-done = f32[4,8]{1,0} all-reduce-done(ar-start)
}
"""


def test_text_module_structure() -> None:
    m = hlo.parse_hlo_text(CPU_MODULE)
    assert m.name == "jit_body" and m.entry == "main.0_spmd"
    assert set(m.computations) == {"region_0.0", "wrapped_slice_computation", "main.0_spmd"}
    fusion = m.instruction("add_add_fusion")
    assert fusion.is_root and fusion.opcode == "fusion" and fusion.called == ["region_0.0"]
    assert fusion.operands == ["ppermute.3", "get-tuple-element", "psum_invariant.7"]
    assert m.instruction("param.1").operands == []


def test_shapes_and_byte_sizes() -> None:
    m = hlo.parse_hlo_text(CPU_MODULE)
    a2a = m.instruction("all-to-all")
    assert a2a.shape.is_tuple and a2a.shape.nbytes == 2 * 8 * 4
    assert m.instruction("all_gather.7").shape.dims == (4, 4, 8)
    shape, _ = hlo.parse_shape("(bf16[3,5]{1,0}, s4[3], pred[], token[])")
    assert [e.nbytes for e in shape.elements] == [30, 2, 1, 0]
    shape, _ = hlo.parse_shape("f32[5,1024,1024,256]{3,2,1,0:T(8,128)S(5)}")
    assert shape.memory_space == 5 and shape.nbytes == 5 * 1024 * 1024 * 256 * 4


def test_collectives_sizes_and_groups() -> None:
    m = hlo.parse_hlo_text(CPU_MODULE)
    ar = hlo.collective_of(m, m.instruction("psum_invariant.7"))
    assert (ar.kind, ar.size_bytes, ar.replica_groups) == ("all-reduce", 128, [[0, 1, 2, 3]])
    ag = hlo.collective_of(m, m.instruction("all_gather.7"))
    assert ag.size_bytes == 128  # operand (the local shard), not the gathered result
    a2a = hlo.collective_of(m, m.instruction("all-to-all"))
    assert (a2a.size_bytes, a2a.replica_groups) == (64, [[0, 1], [2, 3]])
    cp = hlo.collective_of(m, m.instruction("ppermute.3"))
    assert cp.source_target_pairs == [(0, 1), (1, 2), (2, 3), (3, 0)]
    assert hlo.collective_of(m, m.instruction("wrapped_slice")) is None


def test_short_form_async_pair_and_iota_groups() -> None:
    m = hlo.parse_hlo_text(SHORT_MODULE)
    start, done = m.instruction("ar-start"), m.instruction("ar-done")
    assert hlo.async_start_of(done) == "ar-start"
    coll = hlo.collective_of(m, start)
    assert coll.kind == "all-reduce" and coll.replica_groups == [[0, 1], [2, 3]]
    assert hlo.collective_of(m, done) is None  # the wait is not a second collective


def _iota_oracle(groups: int, size: int, dims: list[int], perm: list[int]) -> list[list[int]]:
    return np.arange(int(np.prod(dims))).reshape(dims).transpose(perm).reshape(groups, size).tolist()


@pytest.mark.parametrize("dims", [[8], [2, 4], [4, 2], [2, 3, 4], [2, 2, 2, 2]])
def test_iota_replica_groups_match_numpy(dims: list[int]) -> None:
    total = int(np.prod(dims))
    for perm in itertools.permutations(range(len(dims))):
        for size in (1, 2, total):
            if total % size:
                continue
            text = f"[{total // size},{size}]<=[{','.join(map(str, dims))}]T({','.join(map(str, perm))})"
            assert hlo.parse_replica_groups(text) == _iota_oracle(total // size, size, dims, list(perm)), text


def test_replica_group_forms() -> None:
    assert hlo.parse_replica_groups("[4,2]<=[2,4]T(1,0)") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert hlo.parse_replica_groups("[2,4]<=[8]") == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert hlo.parse_replica_groups("{{0,2},{1,3}}") == [[0, 2], [1, 3]]
    assert hlo.parse_replica_groups("{}") == []


def test_tpu_event_names_are_instructions(corpus: Path) -> None:
    """Every TPU op's event name parses, and operands carry their shapes inline."""
    space = xspace.read_xspace(corpus / "jax_xla/tpu_inference_2.xplane.pb")
    view = xspace.find_plane(space, "/device:TPU:0")
    parsed = {}
    for md in view.plane.event_metadata.values():
        if md.name.startswith("%"):
            inst = hlo.parse_instruction(md.name)
            # Async XLA Ops transfers are shown as "async-copy" but named by their copy-start
            assert inst.name == md.display_name or md.display_name == "async-copy"
            parsed[inst.name] = inst
    ar = parsed["all-reduce"]
    assert ar.operands == ["bitcast"] and ar.operand_shapes[0].dims == (5, 1024, 1024, 256)
    assert ar.replica_groups == [[0, 4], [1, 5], [2, 6], [3, 7]] and ar.channel_id == 1
    module = hlo.HloModule("events")
    module.add(hlo.Computation("c", list(parsed.values())))
    assert hlo.collective_of(module, ar).size_bytes == 5 * 1024 * 1024 * 256 * 4
    loads = [n for n, i in parsed.items() if hlo.host_offload_direction(module, i) == "load"]
    stores = [n for n, i in parsed.items() if hlo.host_offload_direction(module, i) == "store"]
    assert sorted(loads) == ["copy-start", "copy-start.2", "copy-start.4"]
    assert sorted(stores) == ["copy-start.1", "copy-start.3", "copy-start.5"]


def test_hlo_proto_from_the_metadata_plane(corpus: Path) -> None:
    """The `Hlo Proto` stat decodes with our schema and agrees with the TPU event texts."""
    space = xspace.read_xspace(corpus / "jax_xla/tpu_inference_2.xplane.pb")
    meta = xspace.find_plane(space, "/host:metadata")
    protos = {md.name: st.bytes_value for md in meta.plane.event_metadata.values()
              for st in md.stats if st.metadata_id == meta.stat_ids["Hlo Proto"]}
    psum = hlo.parse_hlo_proto(protos["jit__psum(9646411105960254074)"])
    ar = psum.instruction("all-reduce")
    assert ar.opcode == "all-reduce" and ar.replica_groups == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert hlo.collective_of(psum, ar).size_bytes == 5 * 1024 * 1024 * 256 * 4
    f = hlo.parse_hlo_proto(protos["jit_f(12190760917235803885)"])
    assert f.entry and f.instruction("copy-done").operands == ["copy-start"]
    assert hlo.host_offload_direction(f, f.instruction("copy-start")) == "load"
    assert hlo.host_offload_direction(f, f.instruction("copy-start.1")) == "store"


def test_not_hlo_is_an_error() -> None:
    with pytest.raises(hlo.HloParseError):
        hlo.parse_hlo_text("this is not HLO\n")
    with pytest.raises(hlo.HloParseError):
        hlo.parse_instruction("%x = f32[4] add(%a, %b")
