"""The structs a Kineto trace's events are decoded into (read by linker/pytorch/kineto.py).

They live apart from the reader so that compiled modules, the reader included, can read and
write a :class:`KEvent`'s fields directly in C (linker/pytorch/layouts.pxd declares its memory layout:
a msgspec struct keeps its fields in fixed slots, like ``__slots__``); a module cannot declare
the layout of a class it defines itself.
"""

from __future__ import annotations

import msgspec


def _internal(name: str) -> object:
    """A struct field no JSON key can fill (filled by the reader or the linker)."""
    return msgspec.field(default=None, name="chakra_hooks.internal." + name)


class KArgs(msgspec.Struct, frozen=True, gc=False):
    """The ``args`` keys the linker reads; every other key is skipped by the decoder.

    ``get`` takes the key as Kineto spells it, so callers read ``args.get("External id")``.
    Values are typed ``object``: a file with an odd type for one key must not fail to load.
    """

    correlation: object = None
    external_id: object = msgspec.field(default=None, name="External id")
    record_function_id: object = msgspec.field(default=None, name="Record function id")
    stream: object = None
    device: object = None
    bytes: object = None
    bandwidth: object = msgspec.field(default=None, name="memory bandwidth (GB/s)")
    kind: object = None
    collective_name: object = msgspec.field(default=None, name="Collective name")
    in_msg_nelems: object = msgspec.field(default=None, name="In msg nelems")
    out_msg_nelems: object = msgspec.field(default=None, name="Out msg nelems")
    dtype: object = None
    pg_name: object = msgspec.field(default=None, name="Process Group Name")
    pg_ranks: object = msgspec.field(default=None, name="Process Group Ranks")
    in_split: object = msgspec.field(default=None, name="In split size")
    out_split: object = msgspec.field(default=None, name="Out split size")
    input_dims: object = msgspec.field(default=None, name="Input Dims")
    input_type: object = msgspec.field(default=None, name="Input type")
    sequence_number: object = msgspec.field(default=None, name="Sequence number")
    # cuda_sync records (profiler option enable_cuda_sync_events): who waited on what.
    wait_on_stream: object = None
    wait_on_record: object = msgspec.field(default=None, name="wait_on_cuda_event_record_corr_id")

    def get(self, key: str, default: object = None) -> object:
        value = getattr(self, _ARG_ATTR.get(key, "\x00"), None)
        return default if value is None else value


_ARG_ATTR = {f.encode_name: f.name for f in msgspec.structs.fields(KArgs)}
NO_ARGS = KArgs()


class CommonArgs(msgspec.Struct, frozen=True, gc=False):
    """The ``args`` of a kept event that needs no more than the common keys (nearly every
    event), in a third of KArgs' memory; the other KArgs attributes are class attributes,
    all None, so both read alike.

    Events that may need more get a full :class:`KArgs` instead (see
    ``kineto.wants_full_args``): device events, ``cuda_sync`` records, and host
    ranges that carry collective metadata. A linker rule reading another key from another
    event must extend that rule.
    """

    correlation: object = None
    external_id: object = msgspec.field(default=None, name="External id")
    record_function_id: object = msgspec.field(default=None, name="Record function id")
    sequence_number: object = msgspec.field(default=None, name="Sequence number")
    stream: object = None
    device: object = None

    get = KArgs.get


_COMMON = frozenset(f.name for f in msgspec.structs.fields(CommonArgs))
for _name in (f.name for f in msgspec.structs.fields(KArgs) if f.name not in _COMMON):
    setattr(CommonArgs, _name, None)


class KEvent(msgspec.Struct, gc=False):
    """One Kineto complete event (phase ``X``) as decoded; kept ones get ``start`` / ``dur``
    in integer ns. (The phase is the tag the reader decodes by: :class:`KEventAnyPhase` holds
    it where the reader reads events of any phase.)

    ``start`` / ``dur`` hold the file's ``ts`` / ``dur`` (float or int microseconds) while
    decoding and are replaced by integer nanoseconds by the reader: one slot each, so no
    float outlives the reader. ``parent`` (host ranges: the enclosing range on the same
    thread), ``op`` (uid of the linked-trace op this range became, -1 if none) and ``et``
    (the id of the matched host ET node) are filled in by the linker.
    """

    name: str = ""
    cat: str = ""
    pid: object = None
    tid: object = None
    start: object = msgspec.field(default=None, name="ts")
    dur: object = None  # a file's event without one: the reader records it unknown, as 0
    # Decoded as raw JSON (a dropped event with odd args must not fail the file, and most
    # events' args are never read); the reader replaces a kept event's by its CommonArgs or
    # KArgs (an object or null; anything else is an error).
    args: msgspec.Raw = NO_ARGS  # type: ignore[assignment]
    id: object = None
    parent: object = _internal("parent")
    op: int = msgspec.field(default=-1, name="chakra_hooks.internal.op")
    et: object = _internal("et")

    @property
    def end(self) -> int:
        return self.start + self.dur


class KEventAnyPhase(KEvent, gc=False):
    """A Kineto event of any phase, with its phase: what the reader decodes where the phases
    are not all known ones (linker/pytorch/kineto.py), and the ``ac2g`` flow ends."""

    ph: str = ""

