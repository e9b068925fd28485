"""Benchmark: read and write Chakra ETs of 100k to 1M generated nodes.

    python benchmarks/bench_etio.py [--nodes 100000 1000000] [--reference]

Reports nodes/s, MB/s and peak memory (RSS high-water mark of a fresh child process per
measurement, so one measurement cannot inflate the next). With --reference, also times the
reference MLCommons reader (mlc-chakra's protolib, node by node) on the same file.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = r"""
import json, resource, sys, time
mode, path, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
from chakra_hooks.converter import etio
from chakra_hooks.converter.schema import GlobalMetadata
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
if mode == "write":
    sys.path.insert(0, sys.argv[4])
    from bench_etio import make_nodes
    nodes = make_nodes(n)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t = time.perf_counter()
    etio.write_et(path, GlobalMetadata(version="0.0.4"), nodes)
elif mode == "read":
    t = time.perf_counter()
    f = etio.read_et(path)
    assert len(f.nodes) == n, len(f.nodes)
else:  # reference reader, node by node
    from chakra.src.third_party.utils.protolib import openFileRd, decodeMessage
    from chakra.schema.protobuf.et_def_pb2 import GlobalMetadata as G, Node as N
    t = time.perf_counter()
    fh = openFileRd(path); decodeMessage(fh, G()); kept = []
    while True:
        node = N()
        if not decodeMessage(fh, node):
            break
        kept.append(node)
    assert len(kept) == n, len(kept)
dt = time.perf_counter() - t
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"seconds": dt, "peak_mb": peak / 1024, "extra_mb": (peak - base) / 1024}))
"""


def make_nodes(count: int) -> list:
    """Nodes shaped like a converted GPU trace: mostly COMP with deps, times and a few attrs."""
    from chakra_hooks.converter.schema import AttributeProto, IOInfo, Node, NodeType

    comp, coll = NodeType.Value("COMP_NODE"), NodeType.Value("COMM_COLL_NODE")
    nodes = []
    for i in range(1, count + 1):
        node = Node(id=i, name=f"aten::op_{i % 97}", type=coll if i % 500 == 0 else comp,
                    start_time_micros=1_000 + i * 3, duration_micros=i % 13 + 1)
        if i > 1:
            node.ctrl_deps.append(i - 1)
        if i > 10 and i % 3 == 0:
            node.data_deps.append(i - 10)
        node.inputs.CopyFrom(IOInfo(values="[[12,13,0,1024,4,\"cuda:0\"]]", shapes="[[32,32]]", types="[\"Tensor(float)\"]"))
        node.attr.append(AttributeProto(name="is_cpu_op", bool_val=i % 2 == 0))
        if node.type == coll:
            node.attr.append(AttributeProto(name="comm_type", int64_val=0))
            node.attr.append(AttributeProto(name="comm_size", int64_val=1 << 20))
        nodes.append(node)
    return nodes


def _measure(mode: str, path: Path, count: int) -> dict:
    here = str(Path(__file__).resolve().parent)
    out = subprocess.run([sys.executable, "-c", CHILD, mode, str(path), str(count), here],
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--reference", action="store_true", help="also time mlc-chakra's reader")
    args = parser.parse_args()
    print(f"{'nodes':>9} {'op':<10} {'file MB':>8} {'seconds':>8} {'nodes/s':>11} {'MB/s':>7} {'peak MB':>8} {'+MB':>7}")
    with tempfile.TemporaryDirectory() as tmp:
        for count in args.nodes:
            path = Path(tmp) / f"bench.{count}.et"
            modes = ["write", "read"] + (["reference"] if args.reference else [])
            for mode in modes:
                r = _measure(mode, path, count)
                size = os.path.getsize(path) / 1e6
                print(f"{count:>9} {mode:<10} {size:>8.1f} {r['seconds']:>8.2f} {count / r['seconds']:>11,.0f} "
                      f"{size / r['seconds']:>7.1f} {r['peak_mb']:>8.0f} {r['extra_mb']:>7.0f}")


if __name__ == "__main__":
    main()
