# Declarations for the compiled build only (setup.py; the .py runs unchanged without them):
# writing a node calls the encoder's methods directly, not through Python's method lookup.
from chakra_hooks.converter.wire cimport NodeEncoder

cpdef object round_us(object ps)
cpdef bytes _make_node(object op, object deps, str exact_unit, NodeEncoder enc, object tally)
