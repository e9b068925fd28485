"""chakra-hooks: record ML training and inference runs and convert them to Chakra execution traces.

The package is assembled from the repository's top-level folders (see pyproject.toml):
``chakra_hooks.collectors`` (hooks that run inside the user's job), ``chakra_hooks.linker``
(readers and clock normalisation: raw files -> one linked trace per rank) and
``chakra_hooks.converter`` (linked trace -> Chakra graph -> writers).
"""

__version__ = "0.1.0"

from chakra_hooks import _compiled

# Compiled modules whose source changed since (or all, if asked) are imported from source.
_compiled.install()
