"""linker/pytorch/layouts.pxd against the structs it describes.

The compiled build reads and writes the fields of the structs declared there as C struct
members at fixed offsets. Importing a compiled module fails when a struct's size no longer
matches its declaration (``check_size error``); these tests hold the rest: the declared
fields are exactly the struct's fields, in the order of the offsets CPython gave them.
"""

from __future__ import annotations

import ctypes
import importlib
import re
import sys
from pathlib import Path

import msgspec
import pytest

LAYOUTS = Path(__file__).resolve().parents[2] / "linker" / "pytorch/layouts.pxd"
_CLASS = re.compile(r"^cdef extern class ([\w.]+)\.(\w+) \[check_size error\]:\n"
                    r"((?:    cdef (?:object|str) \w+(?:  #.*)?\n)+)", re.MULTILINE)
_FIELD = re.compile(r"cdef (object|str) (\w+)")


def _declared() -> list[tuple[str, str, list[str]]]:
    text = LAYOUTS.read_text()
    found = [(module, name, [field for _, field in _FIELD.findall(body)])
             for module, name, body in _CLASS.findall(text)]
    assert len(found) == text.count("cdef extern class"), "a declaration this test cannot read"
    return found


def _slot_offset(descriptor: object) -> int:
    """The offset CPython stores for a slot (a member descriptor's PyMemberDef.offset)."""
    # PyMemberDescrObject: PyObject_HEAD, d_type, d_name, d_qualname, then d_member;
    # PyMemberDef: name, type (int, padded), offset.
    member = ctypes.c_void_p.from_address(id(descriptor) + 5 * ctypes.sizeof(ctypes.c_void_p)).value
    return ctypes.c_ssize_t.from_address(member + 2 * ctypes.sizeof(ctypes.c_void_p)).value


def _slots(cls: type) -> dict[str, int]:
    out = {}
    for klass in reversed(cls.__mro__):
        for name, value in vars(klass).items():
            if type(value).__name__ == "member_descriptor":
                out[name] = _slot_offset(value)
    return out


@pytest.mark.skipif(sys.implementation.name != "cpython", reason="CPython's object layout")
@pytest.mark.parametrize("module, name, fields", _declared(), ids=lambda v: v if isinstance(v, str) else "")
def test_declared_fields_are_the_slots_in_offset_order(module: str, name: str, fields: list[str]) -> None:
    cls = getattr(importlib.import_module(module), name)
    slots = _slots(cls)
    assert sorted(slots, key=slots.get) == fields
    header = object.__basicsize__
    pointer = ctypes.sizeof(ctypes.c_void_p)
    assert [slots[f] for f in fields] == [header + i * pointer for i in range(len(fields))]
    assert cls.__basicsize__ == header + len(fields) * pointer
    assert set(fields) == set(cls.__struct_fields__)  # every field, and nothing but fields
    assert cls.__struct_config__.gc is False  # see pytorch/layouts.pxd: direct writes skip GC tracking


def test_the_structs_are_declared() -> None:
    assert {name for _, name, _ in _declared()} == {"KEvent", "EtNode", "StdRfId", "StdSeqId",
                                                    "StdScope", "StdTid"}


def _declared_str() -> list[tuple[str, str, str]]:
    text = LAYOUTS.read_text()
    return [(module, name, field) for module, name, body in _CLASS.findall(text)
            for kind, field in _FIELD.findall(body) if kind == "str"]


@pytest.mark.parametrize("module, name, field", _declared_str(), ids=lambda v: v if isinstance(v, str) else "")
def test_a_field_declared_str_is_one_msgspec_checks_as_str(module: str, name: str, field: str) -> None:
    # Compiled code trusts a field declared str (it reads it without a type check), so the
    # struct must hold nothing else: msgspec rejects any other JSON value there when decoding.
    cls = getattr(importlib.import_module(module), name)
    assert msgspec.structs.fields(cls)[cls.__struct_fields__.index(field)].type is str
