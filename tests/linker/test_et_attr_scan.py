"""The standard attrs' values read from the attrs lists' text (et._scan_std_chunk, what the
compiled build reads an ET with) agree with decoding the lists (_decode_std_chunk and
_set_std_attrs, the reference), or decline the chunk, which is then decoded."""

from __future__ import annotations

import json

import msgspec
import pytest

from chakra_hooks.linker.pytorch import et
from chakra_hooks.linker.pytorch.et_nodes import EtNode

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

TORCH_ORDER = ["rf_id", "fw_parent", "seq_id", "scope", "tid", "fw_tid", "op_schema"]
TYPES = {"op_schema": "string", "kernel_backend": "string", "kernel_file": "string",
         "tensor_range": "string", "seq_id": "int64"}
NAMES = sorted(et._STANDARD_ATTRS) + ["pg_name", "rf_i", "tid "]
VALUES = st.one_of(st.integers(-10**20, 10**20), st.sampled_from([0, -1, 1, 10**18 - 1, 10**18]),
                   st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=8),
                   st.none(), st.booleans(), st.lists(st.integers(), max_size=2))


def reference(raws: list[msgspec.Raw]) -> list[tuple] | None:
    """What decoding the lists sets: (rf_id, seq_id, scope, tid) per list, or None where the
    lists are not of standard attrs only (another decoder reads those)."""
    lists = et._decode_std_chunk(raws)
    if lists is None:
        return None
    out = []
    for attr_list in lists:
        node = EtNode(id=0, name="")
        et._set_std_attrs(node, attr_list)
        out.append((node.rf_id, node.seq_id, node.scope, node.tid))
    return out


def scanned(raws: list[msgspec.Raw]) -> list[tuple] | None:
    values = et._scan_std_chunk(raws)
    return None if values is None else [tuple(values[i:i + 4]) for i in range(0, len(values), 4)]


def attr(name: str, value: object) -> dict:
    return {"name": name, "type": TYPES.get(name, "uint64"), "value": value}


def torch_list(rf_id: int, seq_id: int, tid: int, schema: str = "aten::add(Tensor self)") -> list:
    values = {"rf_id": rf_id, "fw_parent": 0, "seq_id": seq_id, "scope": 0, "tid": tid,
              "fw_tid": 0, "op_schema": schema}
    return [attr(name, values[name]) for name in TORCH_ORDER]


def test_torch_lists_are_read_from_their_text() -> None:
    """The lists torch writes (both lengths, either separator style, escapes in a schema) are
    read, not declined: the scan is what the compiled build runs on every usual ET."""
    ten = torch_list(3, 2, 1) + [attr("kernel_backend", ""), attr("kernel_file", ""),
                                 attr("tensor_range", '{"a": "\\\\"}')]
    lists = [torch_list(7, -1, 1), torch_list(2**40, 12, 5, 'aten::x(str s="\\"") -> "y"'), ten,
             [], [attr("rf_id", 4)]]
    for dumps in (lambda v: json.dumps(v), lambda v: json.dumps(v, separators=(",", ":")),
                  lambda v: json.dumps(v, indent=2)):
        raws = [msgspec.Raw(dumps(item).encode()) for item in lists]
        assert scanned(raws) == reference(raws) == [
            (7, -1, 0, 1), (2**40, 12, 0, 5), (3, 2, 0, 1), (0, -1, 0, 0), (4, -1, 0, 0)]


@pytest.mark.parametrize("name", sorted(et._STANDARD_ATTRS))
@pytest.mark.parametrize("dumps", [json.dumps, lambda v: json.dumps(v, separators=(",", ":"))])
def test_every_standard_attr_is_known_to_the_scan(name: str, dumps) -> None:
    """The scan tells the standard names apart by their bytes (et._std_code): each name of
    _STANDARD_ATTRS, the decoder's list, is read, in either spelling."""
    raws = [msgspec.Raw(dumps([attr(name, 3)]).encode())]
    assert scanned(raws) == reference(raws) is not None


@pytest.mark.parametrize("text", [
    b'[{"name": "rf_id", "type": "uint64", "value": 1.0}]',  # a float
    b'[{"name": "rf_id", "type": "uint64", "value": 1234567890123456789}]',  # 19 digits
    b'[{"name": "rf_id", "type": "uint64", "value": "3"}]',
    b'[{"name": "rf_id", "type": "uint64", "value": null}]',
    b'[{"name": "rf_id", "type": "uint64"}]',  # no value
    b'[{"name": "rf_id", "value": 3}]',  # no type
    b'[{"name": "rf_id", "type": "uint64", "value": 3, "value": 4}]',  # a key twice
    b'[{"name": "rf_id", "type": "uint64", "value": 3, "extra": 1}]',
    b'[{"name": "r\\u0066_id", "type": "uint64", "value": 3}]',  # an escaped name
    b'[{"name": "pg_name", "type": "string", "value": "0"}]',  # not a standard attr
    b'null',
])
def test_lists_outside_the_plain_form_are_declined(text: bytes) -> None:
    """What the scan does not read exactly as the decoder does, it leaves to the decoder."""
    good = msgspec.Raw(json.dumps(torch_list(1, 2, 3)).encode())
    assert scanned([good, msgspec.Raw(text)]) is None
    assert scanned([good]) == [(1, 2, 0, 3)]


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.lists(st.lists(st.one_of(
    st.builds(attr, st.sampled_from(NAMES), VALUES),
    st.builds(attr, st.sampled_from(["rf_id", "seq_id", "scope", "tid"]),
              st.integers(-10**19, 10**19)),
    st.builds(lambda name, value: {"value": value, "name": name, "type": "x"},
              st.sampled_from(NAMES), st.integers(-5, 5))), max_size=11), min_size=1, max_size=4),
    st.sampled_from([(", ", ": "), (",", ":"), (" ,\n", " :\t")]))
def test_any_lists_read_as_decoded_or_declined(lists: list, separators: tuple) -> None:
    raws = [msgspec.Raw(json.dumps(item, separators=separators).encode()) for item in lists]
    expected, got = reference(raws), scanned(raws)
    if got is not None:
        assert got == expected


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.integers(0, 2**62), st.integers(-2**62, 2**62),
                          st.integers(0, 2**31)), min_size=1, max_size=5),
       st.booleans())
def test_torch_lists_with_any_values_are_read(values: list, ten: bool) -> None:
    """Integers up to 18 digits are read; longer ones decline the chunk."""
    tail = [attr("kernel_backend", ""), attr("kernel_file", ""), attr("tensor_range", "")]
    lists = [torch_list(*v) + (tail if ten else []) for v in values]
    raws = [msgspec.Raw(json.dumps(item).encode()) for item in lists]
    expected = reference(raws)
    assert expected == [(rf, seq, 0, tid) for rf, seq, tid in values]
    fits = all(abs(number) < 10**18 for v in values for number in v)
    assert scanned(raws) == (expected if fits else None)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.lists(st.lists(VALUES, min_size=7, max_size=7), min_size=1, max_size=4),
       st.lists(st.sampled_from(["uint64", "int64", "string"]), min_size=7, max_size=7),
       st.booleans(), st.sampled_from([(", ", ": "), (",", ":"), (" ,", ":")]))
def test_torch_order_with_any_values_reads_as_decoded(values: list, types: list, own_types: bool,
                                                     separators: tuple) -> None:
    """Each attr at its place in torch's order is compared whole up to its value
    (et._torch_attr_at): with any value, any type, in either spelling (or neither), the
    scan reads what decoding reads, or declines."""
    lists = []
    for row in values:
        items = [attr(name, value) for name, value in zip(TORCH_ORDER, row)]
        if not own_types:
            for item, kind in zip(items, types):
                item["type"] = kind
        lists.append(items)
    raws = [msgspec.Raw(json.dumps(item, separators=separators).encode()) for item in lists]
    expected, got = reference(raws), scanned(raws)
    if got is not None:
        assert got == expected


@pytest.mark.parametrize("other", ["x", "", None, True, False, 5, -3, 10**17])
@pytest.mark.parametrize("separators", [(", ", ": "), (",", ":")])
def test_torch_lists_are_read_whatever_their_other_values(other, separators) -> None:
    """fw_parent, fw_tid and op_schema may hold any string, short integer or literal: a list
    in torch's order and spelling is read (not declined), as decoding reads it."""
    rows = [(7, 0, -1, 0, 1, 0, "aten::mm(Tensor self)"), (9, other, 4, 2, 3, other, other)]
    lists = [[attr(name, value) for name, value in zip(TORCH_ORDER, row)] for row in rows]
    for item in lists[1]:
        item["type"] = TYPES.get(item["name"], "uint64")
    raws = [msgspec.Raw(json.dumps(item, separators=separators).encode()) for item in lists]
    assert scanned(raws) == reference(raws) == [(7, -1, 0, 1), (9, 4, 2, 3)]
