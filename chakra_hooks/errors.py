"""Errors shared by every reader and writer."""

from __future__ import annotations


class TraceFormatError(ValueError):
    """Input that is not what its reader expects.

    The message is one line naming the file, where in it (byte offset, node id, event index)
    and what was expected, so that the CLI can print it as is.
    """

    def __init__(self, path: object, where: str, expected: str) -> None:
        self.path = str(path)
        self.where = where
        self.expected = expected
        super().__init__(f"{self.path}: {where}: {expected}")
