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


# Semantic edits: the trace stays valid JSON of the right shape, one thing in it is wrong the
# way real traces go wrong (found on traces of other projects, issue "nothing silently bent").
SEMANTIC_EDITS = ("time", "duration", "phase", "duplicate", "drop", "correlation_swap",
                  "no_device", "no_comm_kernels")
_DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def semantic_edit(events: list, data) -> str:
    """One semantic edit of a Kineto trace's events, in place; returns what was done."""
    edit = data.draw(st.sampled_from(SEMANTIC_EDITS))
    timed = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("cpu_op", *_DEVICE_CATS)]
    if edit == "no_device":
        events[:] = [e for e in events if e.get("cat") not in _DEVICE_CATS]
        return edit
    if edit == "no_comm_kernels":
        events[:] = [e for e in events if not (e.get("cat") == "kernel" and any(
            lib in e.get("name", "").lower() for lib in ("nccl", "rccl")))]
        return edit
    if edit == "correlation_swap":
        device = [e for e in timed if e["cat"] in _DEVICE_CATS and "correlation" in e.get("args", {})]
        k = data.draw(st.integers(2, max(2, len(device))))
        picked = data.draw(st.permutations(range(len(device))))[:k]
        ids = [device[i]["args"]["correlation"] for i in picked]
        for i, corr in zip(picked, ids[1:] + ids[:1]):
            device[i]["args"]["correlation"] = corr
        return f"{edit} of {k}"
    event = timed[data.draw(st.integers(0, len(timed) - 1))]
    what = f"{edit} of {event['cat']} {event['name'][:40]!r}"
    if edit == "time":
        event["ts"] = data.draw(st.sampled_from([0, -event["ts"], event["ts"] + 146 * 3.15e13,
                                                 True, event["ts"] - 5e6, 1e300]))
        what += f": ts {event['ts']}"
    elif edit == "duration":
        event["dur"] = data.draw(st.sampled_from([1e12, 1e15, -5, 0, event["dur"] * 1000]))
        what += f": dur {event['dur']}"
    elif edit == "phase":
        if data.draw(st.booleans()):
            del event["ph"]
        else:
            event["ph"] = data.draw(st.sampled_from(["B", "E", "Z", "i", "x", ""]))
    elif edit == "duplicate":
        events.append(json.loads(json.dumps(event)))
    else:
        events.remove(event)
    return what
