"""Damage for the fuzz tests: hostile values, JSON mutations, byte damage, and the property
every reader must keep (a success, or one TraceFormatError line and no output left behind).

Shared by tests/test_fuzz_readers.py (corpus files, our torch capture), the JAX collector's
tests (HLO text dumps) and the vLLM collector's tests (KV sidecars of a real capture).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from chakra_hooks.convert import convert_paths
from chakra_hooks.common.errors import TraceFormatError

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "25"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=EXAMPLES <= 25,
                suppress_health_check=list(HealthCheck))
HOSTILE = st.sampled_from([None, "x", "", -1, -(10**15), 10**30, 1.5e300, math.nan, math.inf,
                           [], {}, True, "\u00e9\u4e2d\U0001f600", 2**63, [1, 2], {"a": 1}])


def convert_property(folder: Path, out: Path) -> None:
    """The property: success, or a one-line TraceFormatError and no output left."""
    try:
        convert_paths([folder], out, progress=False, warn=lambda _: None, overwrite=True)
    except TraceFormatError as exc:
        assert "\n" not in str(exc)
        assert not out.exists() or not any(out.glob("*.et"))


def mutate_records(records: list, data) -> None:
    """Drop or duplicate one record, or set one of its fields (or args) to a hostile value."""
    action = data.draw(st.sampled_from(["field", "drop", "duplicate", "args"]))
    if not records:
        return
    i = data.draw(st.integers(0, len(records) - 1))
    record = records[i]
    if action == "drop":
        del records[i]
    elif action == "duplicate":
        records.insert(i, json.loads(json.dumps(record)))
    elif isinstance(record, dict):
        target = record.get("args") if action == "args" and isinstance(record.get("args"), dict) \
            else record
        fields = sorted(target) or ["ts"]
        target[data.draw(st.sampled_from(fields))] = data.draw(HOSTILE)


def mutate_tree(value, data):
    """One hostile change somewhere inside a JSON value (a dict, list or scalar)."""
    if isinstance(value, dict) and value:
        key = data.draw(st.sampled_from(sorted(value)))
        if data.draw(st.booleans()):
            value[key] = data.draw(HOSTILE)
        else:
            value[key] = mutate_tree(value[key], data)
        return value
    if isinstance(value, list) and value:
        i = data.draw(st.integers(0, len(value) - 1))
        action = data.draw(st.sampled_from(["set", "drop", "dig"]))
        if action == "drop":
            del value[i]
        elif action == "set":
            value[i] = data.draw(HOSTILE)
        else:
            value[i] = mutate_tree(value[i], data)
        return value
    return data.draw(HOSTILE)


def damage_bytes(raw: bytes, data) -> bytes:
    """The bytes cut short at a drawn offset, or one byte there flipped."""
    how = data.draw(st.sampled_from(["truncate", "flip"]))
    at = data.draw(st.integers(0, max(len(raw) - 1, 0)))
    if how == "truncate":
        return raw[:at]
    return raw[:at] + bytes([raw[at] ^ data.draw(st.integers(1, 255))]) + raw[at + 1:]


def damage_lines(text: str, data) -> str:
    """A line dropped, duplicated or cut, or a word in it replaced: text formats (HLO)."""
    lines = text.splitlines()
    if not lines:
        return text
    i = data.draw(st.integers(0, len(lines) - 1))
    action = data.draw(st.sampled_from(["drop", "duplicate", "cut", "word"]))
    if action == "drop":
        del lines[i]
    elif action == "duplicate":
        lines.insert(i, lines[i])
    elif action == "cut":
        lines[i] = lines[i][:data.draw(st.integers(0, len(lines[i])))]
    else:
        words = lines[i].split(" ")
        j = data.draw(st.integers(0, len(words) - 1))
        words[j] = data.draw(st.sampled_from(["", "(", ")", "{", "}", "[", "]", ",", "=", '"',
                                              "f32[]", "s32[99999999999999999999]", "x",
                                              "\u00e9\u4e2d", "-1", "replica_groups={{0,0}}"]))
        lines[i] = " ".join(words)
    return "\n".join(lines) + "\n"
