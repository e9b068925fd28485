"""Errors shared by every reader and writer."""

from __future__ import annotations


def json_kind(value: object) -> str:
    """How a value that should have been something else reads to the user in an error:
    ``null``, ``a string ('x')``, ``an array`` ... (a value of the right kind but out of
    range: its text)."""
    if value is None:
        return "null"
    if isinstance(value, str):
        return f"a string ({value[:20]!r})"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return repr(value)[:24]


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

    def __reduce__(self):
        # Raised in convert's worker processes and re-raised in the parent: pickle by the
        # constructor's own arguments (the default would pass only the message).
        return (type(self), (self.path, self.where, self.expected))
