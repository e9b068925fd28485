# The memory layout of the msgspec structs the per-event and per-node loops read and write,
# for the compiled build only (setup.py; Python never reads this file). A module that
# cimports a class from here and declares a local of it (its own .pxd, @cython.locals) reads
# and writes that local's fields as C struct members, where plain attribute access on a
# msgspec struct costs a type lookup and a descriptor call each time (~140 instructions a
# read, ~200 a write: a sixth of all instructions of a convert, before this).
#
# A msgspec struct stores each field in a fixed slot, like ``__slots__``, and CPython lays a
# class's slots out in the sorted order of their names, right after the object header, so
# the attributes below are listed in sorted order. ``check_size error`` makes importing a
# module that cimports a class fail when the class gained or lost a field and this file was
# not changed with it; tests/linker/test_layouts.py holds the order to the offsets CPython
# gave each field. Only gc=False structs belong here: a write that bypasses msgspec's
# ``__setattr__`` also bypasses its garbage-collector tracking of gc=True structs.

cdef extern class chakra_hooks.linker.pytorch.kineto_events.KEvent [check_size error]:
    cdef object args
    cdef object cat
    cdef object dur
    cdef object et
    cdef object id
    cdef str name  # always a str (msgspec checks it when decoding): startswith is a C call
    cdef object op
    cdef object parent
    cdef object pid
    cdef object start
    cdef object tid


cdef extern class chakra_hooks.linker.pytorch.et_nodes.EtNode [check_size error]:
    cdef object attr_raw
    cdef object attrs
    cdef object cached_in
    cdef object cached_out
    cdef object cached_text
    cdef object cat
    cdef object children
    cdef object ctrl_deps
    cdef object id
    cdef object inclusive_dur
    cdef object input_shapes
    cdef object input_types
    cdef str name  # always a str (msgspec checks it when decoding): startswith is a C call
    cdef object output_shapes
    cdef object output_types
    cdef object parent
    cdef object raw_inputs
    cdef object raw_outputs
    cdef object rf_id
    cdef object scope
    cdef object seq_id
    cdef object stream
    cdef object tid
    cdef object ts


# The standard ET attrs that carry a value (et_nodes.py), read once per node by et.py's
# _set_std_attrs.
cdef extern class chakra_hooks.linker.pytorch.et_nodes.StdRfId [check_size error]:
    cdef object value


cdef extern class chakra_hooks.linker.pytorch.et_nodes.StdSeqId [check_size error]:
    cdef object value


cdef extern class chakra_hooks.linker.pytorch.et_nodes.StdScope [check_size error]:
    cdef object value


cdef extern class chakra_hooks.linker.pytorch.et_nodes.StdTid [check_size error]:
    cdef object value
