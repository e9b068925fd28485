"""Read and write Chakra ET files.

The file is a stream of protobuf messages, each preceded by its length as a varint: first the
``GlobalMetadata``, then one ``Node`` per message, optionally gzip-compressed (magic ``1f 8b``).

Speed: decoding node by node costs one Python call per node. Instead the reader walks the
length prefixes once, re-frames the node part as the single message ``NodeStream`` (each node
becomes field 1: the tag byte ``0x0A`` followed by the very bytes of the original length prefix
and message) and lets protobuf's C parser decode the whole file in one call. Writing goes the
other way: each node's bytes (the converter writes them itself, converter/wire.py, or
``SerializeToString`` for messages) behind a cached varint prefix.
"""

from __future__ import annotations

import gzip
import os
import tempfile
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from chakra_hooks.common.errors import TraceFormatError

from .attrs import value_of
from .wire import encode_varint

try:  # read by Cython when it compiles this module (setup.py): see _framed
    import cython
except ImportError:  # run as plain Python without Cython installed
    from chakra_hooks.common.no_cython import cython

if not cython.compiled:  # the compiled build's are wire.pxd's C writers
    from operator import iadd as _extend

    from .wire import _put_varint as _append_varint

_COMPILED = cython.compiled  # (a C constant compiled: etio.pxd; a global read in plain Python)

if TYPE_CHECKING:  # protobuf is loaded by reading an ET, not by writing one (schema/)
    from .schema import GlobalMetadata, Node

GZIP_MAGIC = b"\x1f\x8b"
NODE_TAG = b"\x0a"  # field 1, wire type 2 (length-delimited)

@dataclass(slots=True)
class EtFile:
    """A decoded ET: its metadata and its nodes, in file order."""

    path: Path
    metadata: GlobalMetadata
    nodes: Sequence[Node]
    compressed: bool
    size_bytes: int  # uncompressed stream size
    # Each node's frame (its bytes in the file, length prefix first), where read_et was asked
    # to keep them (run_model reads most nodes' column fields from them).
    frames: list[bytes] | None = None


def read_bytes(path: str | os.PathLike) -> tuple[bytes, bool]:
    """The file's bytes, gunzipped when they start with the gzip magic."""
    raw = Path(path).read_bytes()
    if not raw.startswith(GZIP_MAGIC):
        return raw, False
    try:
        return gzip.decompress(raw), True
    except (EOFError, OSError, zlib.error) as exc:
        raise TraceFormatError(path, "gzip stream", f"a complete gzip file ({exc})") from exc


def split_frames(buf: bytes, path: str | os.PathLike = "<bytes>") -> list[bytes]:
    """Split a stream into its frames, each with its own length prefix (validated as
    :func:`frame_starts` says)."""
    starts = frame_starts(buf, path)
    return [buf[starts[i]:starts[i + 1]] for i in range(len(starts) - 1)]


def frame_starts(buf: bytes, path: str | os.PathLike = "<bytes>") -> list[int]:
    """Where each frame of a stream starts, and then where the stream ends.

    Validates the framing: every prefix complete, no zero-length message, no message running
    past the end of the file. This loop runs once per node, so it is written for speed: one-
    and two-byte length prefixes (messages under 16 KiB) are decoded inline.
    """
    starts: list[int] = []
    add = starts.append
    pos, end = 0, len(buf)
    while pos < end:
        start = pos
        add(start)
        size = buf[pos]
        if size < 0x80:
            pos += 1
        elif pos + 1 < end and buf[pos + 1] < 0x80:
            size = (size & 0x7F) | (buf[pos + 1] << 7)
            pos += 2
        else:
            value, pos = _decode_long_varint(buf, start, path)
            if value > end:  # (said here: the compiled build's size is a C integer)
                raise TraceFormatError(path, f"byte {start}", _past_the_end(value, pos + value - end))
            size = value
        if size == 0:
            raise TraceFormatError(path, f"byte {start}", "a non-empty message (zero length prefix)")
        pos += size
        if pos > end:
            raise TraceFormatError(path, f"byte {start}", _past_the_end(size, pos - end))
    add(end)
    return starts


def _past_the_end(size: int, missing: int) -> str:
    return f"a message of {size} bytes, but the file ends {missing} bytes early (truncated?)"


def replace_frames(buf: bytes, starts: list[int], replaced: Iterable[tuple[int, bytes]]
                   ) -> list[bytes | memoryview]:
    """The stream ``buf`` (its frames at ``starts``: :func:`frame_starts`) with some frames
    replaced (``replaced``: frame place, new frame, in increasing place), as pieces to write:
    the stretches between the replaced frames are views of ``buf``, not copies of each frame."""
    view = memoryview(buf)
    pieces: list[bytes | memoryview] = []
    at = 0
    for place, frame in replaced:
        pieces.append(view[at:starts[place]])
        pieces.append(frame)
        at = starts[place + 1]
    pieces.append(view[at:])
    return pieces


def rewrite_staged(path: str | os.PathLike, buf: bytes, starts: list[int],
                   replaced: list[tuple[int, bytes]], compressed: bool) -> list[bytes | memoryview]:
    """Write the stream ``buf`` (read from ``path``) back to it with some frames replaced (as
    :func:`replace_frames` takes them), for a file nothing else reads yet: a conversion's staged
    ET, published whole or not at all. From the first replaced frame on, in place: a whole new
    file copied the unchanged head again and, replacing the old one, freed all of its cached
    pages (together most of the rewrite's time: 20-30 ms at 21 MB). A compressed file is
    written anew. Returns the pieces written."""
    pieces = replace_frames(buf, starts, replaced)
    if compressed or not replaced:
        atomic_write(path, pieces, compressed)
        return pieces
    with open(path, "r+b") as out:
        out.seek(starts[replaced[0][0]])  # pieces[0] is the stretch before it, left as it is
        for piece in pieces[1:]:
            out.write(piece)
        out.truncate()
    return pieces


def _decode_long_varint(buf: bytes, start: int, path: str | os.PathLike) -> tuple[int, int]:
    """Decode a varint of two or more bytes at ``start``; returns (value, next offset)."""
    value, shift, pos = 0, 0, start
    while True:
        if pos >= len(buf):
            raise TraceFormatError(path, f"byte {start}", "a complete length prefix (the file ends inside it)")
        byte = buf[pos]
        value |= (byte & 0x7F) << shift
        pos += 1
        if byte < 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise TraceFormatError(path, f"byte {start}", "a varint length prefix of at most 10 bytes")


def frame_body(frame: bytes) -> bytes:
    """The message bytes of a frame: skip its length prefix."""
    pos = 0
    while frame[pos] & 0x80:
        pos += 1
    return frame[pos + 1:]


def decode_et(buf: bytes, path: str | os.PathLike = "<bytes>") -> tuple[GlobalMetadata, Sequence[Node]]:
    """Decode an uncompressed ET stream; raises TraceFormatError naming the bad record.

    Node types outside the schema's enum are not rejected here (protobuf enums are open);
    ``validate`` and ``inspect`` report them with the node id.
    """
    return decode_frames(split_frames(buf, path), path)


def decode_frames(frames: list[bytes], path: str | os.PathLike) -> tuple[GlobalMetadata, Sequence[Node]]:
    """Decode split frames. Consumes ``frames`` (emptied to free memory before the parse)."""
    from google.protobuf.message import DecodeError

    from .schema import GlobalMetadata, NodeStream

    if not frames:
        raise TraceFormatError(path, "byte 0", "a GlobalMetadata message first (the file is empty)")
    metadata = GlobalMetadata()
    try:
        metadata.ParseFromString(frame_body(frames[0]))
    except DecodeError as exc:
        raise TraceFormatError(path, "byte 0", f"a GlobalMetadata message first, not a Node or other data ({exc})") from exc
    stream = NodeStream()
    if len(frames) > 1:
        # Tag every frame as field 1 of NodeStream: one C-level parse for the whole file.
        metadata_len, frames[0] = len(frames[0]), b""
        joined = NODE_TAG.join(frames)
        frames.clear()
        try:
            stream.ParseFromString(joined)
        except DecodeError:
            _raise_first_bad_node(joined, metadata_len, path)
            raise
    return metadata, stream.nodes


def decode_bodies(bodies: Iterable[bytes]) -> Sequence[Node]:
    """Serialised Node messages -> Node messages, in one protobuf parse."""
    from .schema import NodeStream

    stream = NodeStream()
    stream.ParseFromString(b"".join(NODE_TAG + encode_varint(len(body)) + body for body in bodies))
    return stream.nodes


def _raise_first_bad_node(joined: bytes, metadata_len: int, path: str | os.PathLike) -> None:
    """Slow path, only after a failed bulk decode: find the node that does not decode.

    ``joined`` holds the node frames, each behind one tag byte; node #k therefore starts at
    (its place in ``joined``) - (k + 1) + ``metadata_len`` in the original file.
    """
    from google.protobuf.message import DecodeError

    from .schema import Node

    pos, index = 0, 0
    while pos < len(joined):
        prefix = pos + 1  # skip the tag byte
        if joined[prefix] & 0x80:
            size, body = _decode_long_varint(joined, prefix, path)
        else:
            size, body = joined[prefix], prefix + 1
        try:
            Node.FromString(joined[body:body + size])
        except DecodeError as exc:
            where = f"node #{index} at byte {prefix - (index + 1) + metadata_len}"
            raise TraceFormatError(path, where, f"a Chakra Node message ({exc})") from exc
        pos, index = body + size, index + 1


def read_et(path: str | os.PathLike, keep_frames: bool = False) -> EtFile:
    """Read a whole ET file (plain or gzip-compressed); ``keep_frames``: with each node's
    frame too (EtFile.frames)."""
    buf, compressed = read_bytes(path)
    size, head = len(buf), buf[:256]
    try:
        frames = split_frames(buf, path)
        del buf  # the frames hold a copy; keep at most two copies of the file alive at once
        node_frames = frames[1:] if keep_frames else None
        metadata, nodes = decode_frames(frames, path)
    except TraceFormatError:
        other = what_else(path, head)
        if other is not None:  # not an ET at all: say what it is, not where its bytes broke
            raise TraceFormatError(path, "file", f"a Chakra ET, but this is {other}") from None
        raise
    return EtFile(Path(path), metadata, nodes, compressed, size, node_frames)


def name_and_rank(path: str | os.PathLike) -> tuple[str, int | None]:
    """``<prefix>.<rank>.et`` (or ``.et.gz``) -> (prefix, rank); (stem, None) for a name
    without a rank."""
    stem = Path(path).name.removesuffix(".gz").removesuffix(".et")
    prefix, _, rank = stem.rpartition(".")
    return (prefix, int(rank)) if rank.isdigit() else (stem, None)


def what_else(path: str | os.PathLike, head: bytes) -> str | None:
    """What a file that is not a Chakra ET is, from its name and first bytes, with the command
    that reads it; None when it may be a damaged ET."""
    name = Path(path).name.lower()
    if name.endswith((".xplane.pb", ".xspace.pb")):
        return "an XSpace profile (JAX / XLA): `chakra-hooks convert` reads it"
    start = head[:64].lstrip()  # (the first 256 bytes are enough)
    if start[:1] in (b"{", b"["):
        return ("a JSON file (a Kineto trace or a PyTorch host ET?): `chakra-hooks convert` reads "
                "traces")
    if head[:256] and all(32 <= b < 127 or b in (9, 10, 13) for b in head[:256]):
        return "a text file"
    return None


def encode_et(metadata: GlobalMetadata | bytes | None, nodes: Iterable[Node | bytes]
              ) -> Iterable[bytes]:
    """The framed stream, piece by piece (metadata first). ``metadata`` and ``nodes`` are
    messages or their serialised bodies; metadata None: the nodes' frames alone."""
    if metadata is not None:
        body = metadata if type(metadata) is bytes else metadata.SerializeToString()
        yield encode_varint(len(body))
        yield body
    for node in nodes:
        body = node if type(node) is bytes else node.SerializeToString()
        if not body:
            # An empty message would end the reference reader early; a node always has an id or name.
            raise ValueError("refusing to write an empty Node message (id 0, no fields)")
        yield encode_varint(len(body))
        yield body


_FRAME_CHUNK = 4096  # nodes framed into one piece (about 1 MB: atomic_write writes it as it is)


def _framed_stream(metadata: GlobalMetadata | bytes, nodes: list[Node | bytes]) -> Iterable[bytes]:
    """encode_et's bytes, each chunk of nodes framed into one buffer by :func:`_framed`; a
    chunk it declines (a message, an empty body) goes through encode_et."""
    yield from encode_et(metadata, ())
    for lo in range(0, len(nodes), _FRAME_CHUNK):
        chunk = nodes[lo:lo + _FRAME_CHUNK]
        framed = _framed(chunk)
        if framed is None:
            yield from encode_et(None, chunk)
        else:
            yield framed


def _framed(bodies: list[bytes]) -> bytearray | None:
    """Node bodies framed, each behind its length as a varint, in one buffer; None where one is
    not a non-empty bytes object. The compiled build's writer (wire.pxd's C varint and copy),
    where encode_et makes a varint and yields two pieces a node for atomic_write to join."""
    buf = bytearray()
    for body in bodies:
        if type(body) is not bytes or not body:
            return None
        _append_varint(buf, len(body))
        _extend(buf, body)
    return buf


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _current_umask()
_WRITE_WHOLE = 1 << 20  # atomic_write writes a piece this long as it is, not joined first


def atomic_write(path: str | os.PathLike, pieces: Iterable[bytes], compress: bool | None = None,
                 compresslevel: int = 6) -> int:
    """Write pieces to ``path`` through a temporary file in the same folder, then rename.

    ``compress`` defaults to whether the name ends in ``.gz``. Returns bytes written (before
    compression). On any error the temporary file is removed and ``path`` is left untouched.
    """
    target = Path(path)
    if compress is None:
        compress = target.suffix == ".gz"
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    written = 0
    try:
        with os.fdopen(fd, "wb") as raw:
            # mtime=0 keeps compressed output reproducible byte for byte.
            out = gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=compresslevel,
                                mtime=0) if compress else raw
            batch: list[bytes] = []
            for piece in pieces:
                if len(piece) >= _WRITE_WHOLE:  # a long stretch of a file: not copied first
                    chunk = b"".join(batch)
                    out.write(chunk)
                    out.write(piece)
                    written += len(chunk) + len(piece)
                    batch.clear()
                    continue
                batch.append(piece)
                if len(batch) >= 8192:
                    chunk = b"".join(batch)
                    out.write(chunk)
                    written += len(chunk)
                    batch.clear()
            chunk = b"".join(batch)
            out.write(chunk)
            written += len(chunk)
            if compress:
                out.close()
        # mkstemp makes the file 0600; give it the mode any other new file would get (readers
        # such as ASTRA-sim run as other users, and open ETs for writing).
        os.chmod(tmp, 0o666 & ~_UMASK)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return written


def write_et(path: str | os.PathLike, metadata: GlobalMetadata | bytes, nodes: Iterable[Node | bytes],
             compress: bool | None = None) -> int:
    """Write an ET atomically; ``.gz`` names are gzip-compressed. Returns the stream size."""
    if _COMPILED and type(nodes) is list:
        return atomic_write(path, _framed_stream(metadata, nodes), compress)
    return atomic_write(path, encode_et(metadata, nodes), compress)


# Keys of ASTRA-sim's JSON workload format, by the attribute names they come from.
_WORKLOAD_ATTRS = ("tensor_size", "comm_type", "comm_priority", "comm_size", "comm_src", "comm_dst", "comm_tag")


def workload_entry(node: Node) -> dict[str, object]:
    """One node as an entry of ASTRA-sim's JSON workload format.

    The format has a single dependency list, so ``data_deps`` carries both dependency kinds.
    """
    attrs = {attr.name: attr for attr in node.attr}
    entry: dict[str, object] = {
        "Id": node.id,
        "Name": node.name,
        "NodeType": node.type,
        "is_cpu_op": bool(attrs["is_cpu_op"].bool_val) if "is_cpu_op" in attrs else False,
        "runtime": node.duration_micros,
        "data_deps": list(dict.fromkeys([*node.data_deps, *node.ctrl_deps])),
    }
    for key in _WORKLOAD_ATTRS:
        if key in attrs:
            entry[key] = value_of(attrs[key])
    return entry


def write_workload_json(path: str | os.PathLike, nodes: Iterable[Node]) -> int:
    """Write ASTRA-sim's ``{"workload_graph": [...]}`` JSON twin of an ET, atomically."""
    document = {"workload_graph": [workload_entry(node) for node in nodes]}
    return atomic_write(path, [orjson.dumps(document)])
