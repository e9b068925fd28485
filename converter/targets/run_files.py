"""Rewriting staged ETs after the rules across ranks (a target's ``finish_run``): the plan is
made in the main process from the communication nodes the workers handed over, and each rank's
file is rewritten by a task of the conversion's runner (:func:`rewrite_collectives`), which
replaces those records and copies every other one as written. Only the communication nodes
travel, never whole ETs."""

from __future__ import annotations

from pathlib import Path

from chakra_hooks import storage


def rewrite_run(staging: str, results: list, nodes: dict, options, runner) -> None:
    """Write each rank's ``nodes`` (its handed-over communication nodes, changed, in the order
    handed over) back into its staged ET, and set its summary anew. Empties ``nodes``."""
    tasks = []
    for result in results:
        bodies = [(index, node.SerializeToString())
                  for (index, _), node in zip(result.collectives, nodes.pop(result.rank))]
        tasks.append((f"{staging}/{result.files[0]}",
                      f"{staging}/{result.files[1]}" if options.write_json else None,
                      bodies, result.others_tally))
    for result, summary in zip(results, runner.map(rewrite_collectives, tasks)):
        result.summary = summary


def append_attrs(path: str, json_path: str | None, additions: list[tuple[int, bytes]]) -> int:
    """Append attributes to nodes of the ET at ``path`` (``additions``: place among the file's
    nodes, serialised AttributeProto) and rewrite its JSON twin; returns how many of them say
    ``peer_wait_unknown`` (for the summary). Only the frames touched change; nothing is
    decoded unless the JSON twin is rewritten. Runs in a worker."""
    from chakra_hooks.converter import etio
    from chakra_hooks.converter.wire import encode_varint

    if not additions:
        return 0
    added: dict[int, list[bytes]] = {}  # frame place -> its attributes, in the order given
    for index, attr in additions:
        added.setdefault(index + 1, []).append(attr)
    with storage.local_copy(path) as local:
        buf, compressed = etio.read_bytes(local)
        starts = etio.frame_starts(buf, local)
        replaced = []
        for place in sorted(added):
            body = etio.frame_body(buf[starts[place]:starts[place + 1]]) + b"".join(
                _NODE_ATTR_KEY + encode_varint(len(attr)) + attr for attr in added[place])
            replaced.append((place, encode_varint(len(body)) + body))
        pieces = etio.rewrite_staged(local, buf, starts, replaced, compressed)
    if json_path is not None:
        with storage.local_copy(json_path) as local_json:
            etio.write_workload_json(local_json, etio.decode_et(b"".join(pieces), path)[1])
    return sum(1 for _, attr in additions if _UNKNOWN_NAME in attr)


_NODE_ATTR_KEY = bytes([10 << 3 | 2])  # Node.attr (field 10, length-delimited): appended = added
_UNKNOWN_NAME = b"peer_wait_unknown"


def rewrite_collectives(path: str, json_path: str | None, bodies: list[tuple[int, bytes]],
                        others_tally) -> dict[str, object]:
    """Put a rank's new collective records (``bodies``: place among the file's nodes, record)
    in place of the old ones in the ET at ``path`` (and its JSON twin); returns the file's
    summary: ``others_tally`` (the worker's count of every other node) plus the new records.
    One file is in memory at a time. Runs in a worker."""
    from chakra_hooks.converter import etio, summary
    from chakra_hooks.converter.schema import GlobalMetadata, Node
    from chakra_hooks.converter.wire import encode_varint

    name = Path(path).name
    with storage.local_copy(path) as local:
        buf, compressed = etio.read_bytes(local)
        starts = etio.frame_starts(buf, local)
        tally = summary.Tally()
        tally.merge(others_tally)
        for index, body in bodies:
            tally.add_node(Node.FromString(body), name, index, check=False)
        new_frames = {index + 1: encode_varint(len(body)) + body for index, body in bodies}
        pieces = etio.rewrite_staged(local, buf, starts, sorted(new_frames.items()), compressed)
    metadata = GlobalMetadata.FromString(etio.frame_body(buf[starts[0]:starts[1]]))
    if json_path is not None:
        with storage.local_copy(json_path) as local_json:
            etio.write_workload_json(local_json, etio.decode_et(b"".join(pieces), path)[1])
    return tally.summary(name, metadata.version, summary.metadata_values(metadata)).to_json()
