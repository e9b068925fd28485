"""The compiled build's reading of tensor ids from an ET value's JSON text
(et_nodes._scan_tensor_ids) against decoding the text and walking it (collect_tensor_ids, the
reference): the same ids in the same order, or None (then the text is decoded)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import msgspec
import pytest

from chakra_hooks._compiled import compiled_status, is_compiled
from chakra_hooks.linker.pytorch import et_nodes
from chakra_hooks.linker.pytorch.et import read_host_et
from chakra_hooks.linker.pytorch.et_nodes import _scan_tensor_ids, collect_tensor_ids

pytestmark = pytest.mark.skipif(not is_compiled(et_nodes),
                                reason=f"the compiled build's scan ({compiled_status()})")

def _reference(text: bytes) -> list[int]:
    found: list[int] = []
    collect_tensor_ids(msgspec.json.decode(text), found)
    return found


def _value(rng: random.Random, depth: int) -> object:
    choice = rng.random()
    if depth < 5 and choice < 0.3:  # a tensor, or something nearly one
        items = [rng.choice([rng.randrange(-5, 10**6), 10**20, 1.5, "7", True, None]),
                 rng.randrange(100), 0, rng.choice([4, 4.0, "4", [1]]), 4,
                 rng.choice(["cuda:0", "cpu", 1, "é", 'a"b\\c'])]
        if rng.random() < 0.2:
            items.insert(rng.randrange(7), _value(rng, depth + 1))
        if rng.random() < 0.2:
            items[rng.randrange(len(items))] = _value(rng, depth + 1)
        return items
    if depth < 5 and choice < 0.55:
        return [_value(rng, depth + 1) for _ in range(rng.randrange(8))]
    if depth < 5 and choice < 0.62:
        return {rng.choice(["a", "values", "\\u00e9"]): _value(rng, depth + 1)
                for _ in range(rng.randrange(3))}
    return rng.choice([0, -1, 7, 10**18 - 1, 10**18, -(10**19), 2.5, 1e300, -0.0, "", "x",
                       "tab\\there", True, False, None])


def _text(rng: random.Random, value: object) -> bytes:
    """JSON as torch writes it (", " separators), compact, or with blanks anywhere allowed."""
    style = rng.randrange(3)
    if style == 0:
        return json.dumps(value, ensure_ascii=rng.random() < 0.5).encode()
    if style == 1:
        return json.dumps(value, separators=(",", ":")).encode()
    return json.dumps(value, indent=rng.choice([None, 1]), separators=(" , ", " : ")).encode()


def test_scan_reads_what_the_walk_finds_or_declines() -> None:
    rng = random.Random(3)
    read = 0
    for _ in range(4000):
        value = [_value(rng, 1) for _ in range(rng.randrange(6))]
        text = _text(rng, value)
        found = _scan_tensor_ids(text)
        if found is not None:
            read += 1
            assert found == _reference(text), text
    assert read > 2000  # declining is for the odd text (here: non-ASCII, long ids), not the usual


@pytest.mark.parametrize(("text", "ids"), [
    (b'[[1, [2, 0, 0, 4, 4, "cpu"], 0, 4, 4, "cpu"]]', [1]),  # the walk stops at a tensor
    (b'[[1, [2, 0, 0, 4, 4, "cpu"], 0, 4.0, 4, "cpu"]]', [2]),  # not a tensor: inside it is
    (b'[{"t": [3, 0, 0, 4, 4, "cpu"]}, [5, 0, 0, 4, 4, "c\\"u"]]', [5]),  # no walk into objects
    (b'[7, 0, 0, 4, 4, "cpu"]', [7]), (b'[-7, 0, 0, 4, 4, ""]', [-7]),  # the value itself
    (b'[true, 0, 0, 4, 4, "cpu"]', []), (b'[[8, 0, 0, 4, 4, "cpu", 1]]', []),
    (b' [ [ 9 , 0 , 0 , 4 , 4 , "cpu" ] , [] , [ [ ] ] ] ', [9]),
])
def test_known_texts(text: bytes, ids: list[int]) -> None:
    assert _reference(text) == ids
    assert _scan_tensor_ids(text) == ids


# (not invalid JSON in general: the ET's decoder has checked the text's syntax, not its UTF-8)
@pytest.mark.parametrize("text", [b"{}", b"7", b'"x"', b"[1] [2]", b"[1, 2", b"]",
                                  b'[[1, 2, 3, 4, 5, "\xc3\xa9"]]', b"[" * 70 + b"]" * 70,
                                  b'[[1234567890123456789, 0, 0, 4, 4, "cpu"]]', b"[-]"])
def test_odd_texts_are_declined(text: bytes) -> None:
    assert _scan_tensor_ids(text) is None


def test_torch_values_are_read(corpus: Path) -> None:
    """The input and output values texts of the corpus's torch ET are read, not declined,
    with the walk's ids."""
    nodes = read_host_et(corpus / "pytorch/a100_resnet_nccl/host_et.json.gz").nodes
    texts = [node.io_text(outputs)[0] for node in nodes[:3000] for outputs in (False, True)]
    assert sum(len(_reference(text)) for text in texts) > 1000
    for text in texts:
        assert _scan_tensor_ids(text) == _reference(text), text
