"""Generate large PyTorch inputs by tiling the real ``a100_resnet_nccl`` pair K times.

    python benchmarks/tile_resnet.py K OUTDIR [--corpus ../shared/corpus]

Writes ``OUTDIR/host_et.json`` and ``OUTDIR/kineto.json`` (plain JSON: the benchmark's MB are
raw input bytes). Tile k is the recorded run again, shifted:

- ET: node ids and tensor / storage ids (they share one counter) + k * stride, ``rf_id`` +
  k * rf stride; the process and thread roots are written once and every tile hangs under them.
- Kineto: ``ts`` + k * (the trace's span + 1 ms), computed in integer ns and written back as
  microseconds with 3 decimals; ``External id``, ``Record function id``, ``correlation`` and
  flow ids + k * their strides; metadata events written once.

About 18.3 MB per tile: K=6 ~ 110 MB, K=55 ~ 1 GB. Each tile is serialised with one orjson
call, so generating 1 GB takes well under a minute and little memory beyond one tile.
"""

from __future__ import annotations

import argparse
import gzip
from pathlib import Path

import orjson

CORPUS = Path(__file__).resolve().parents[2] / "shared" / "corpus"
PAIR = "pytorch/a100_resnet_nccl"
KINETO_ID_ARGS = ("External id", "Record function id", "correlation")


def _shift_tensors(value: object, delta: int) -> object:
    """Shift tensor and storage ids in an ET value (tensor = [id, storage, off, n, size, dev])."""
    if not isinstance(value, list):
        return value
    if len(value) == 6 and type(value[0]) is int and type(value[3]) is int \
            and isinstance(value[5], str):
        return [value[0] + delta, value[1] + delta, *value[2:]]
    return [_shift_tensors(v, delta) for v in value]


def _et_tile(nodes: list[dict], roots: set[int], k: int, id_stride: int, rf_stride: int
             ) -> list[dict]:
    out = []
    d_id, d_rf = k * id_stride, k * rf_stride
    for n in nodes:
        m = dict(n)
        m["id"] = n["id"] + d_id
        parent = n["ctrl_deps"]
        m["ctrl_deps"] = parent if parent in roots else parent + d_id
        for io in ("inputs", "outputs"):
            m[io] = dict(n[io], values=_shift_tensors(n[io]["values"], d_id))
        m["attrs"] = [dict(a, value=a["value"] + d_rf) if a["name"] == "rf_id" and a["value"]
                      else a for a in n["attrs"]]
        out.append(m)
    return out


def write_et(src: Path, dst: Path, k_tiles: int) -> int:
    doc = orjson.loads(gzip.decompress(src.read_bytes()))
    nodes = doc["nodes"]
    roots = {n["id"] for n in nodes if n["name"].startswith("[pytorch|profiler|execution_")}
    body = [n for n in nodes if n["id"] not in roots]
    root_nodes = [n for n in nodes if n["id"] in roots]
    # Tensor and storage ids share the node counter: the stride must clear both.
    id_stride = max(max(n["id"] for n in nodes), _max_tensor_id(nodes)) + 1000
    rf_stride = max(a["value"] for n in nodes for a in n["attrs"] if a["name"] == "rf_id") + 1000
    with open(dst, "wb") as fh:
        head = {k: v for k, v in doc.items() if k not in ("nodes", "finish_ts")}
        fh.write(orjson.dumps(head)[:-1] + b',"nodes":[')
        for k in range(k_tiles):
            chunk = orjson.dumps(_et_tile(body, roots, k, id_stride, rf_stride))[1:-1]
            fh.write(chunk + b",")
        fh.write(orjson.dumps(root_nodes)[1:-1])
        fh.write(b'],"finish_ts":' + orjson.dumps(doc.get("finish_ts", 0)) + b"}")
    return dst.stat().st_size


def _max_tensor_id(nodes: list[dict]) -> int:
    best = 0
    stack = [n[io]["values"] for n in nodes for io in ("inputs", "outputs")]
    while stack:
        v = stack.pop()
        if isinstance(v, list):
            if len(v) == 6 and type(v[0]) is int and isinstance(v[5], str):
                best = max(best, v[0], v[1])
            else:
                stack.extend(v)
    return best


def _kineto_tile(events: list[dict], k: int, span_ns: int, strides: dict[str, int]) -> list[dict]:
    out = []
    d_ns = k * span_ns
    flow = strides["flow"] * k
    for ev in events:
        m = dict(ev)
        ts = ev.get("ts")
        if ts is not None:
            m["ts"] = (round(ts * 1000) + d_ns) / 1000
        args = ev.get("args")
        if args:
            m["args"] = dict(args)
            for key in KINETO_ID_ARGS:
                v = args.get(key)
                if type(v) is int and v:
                    m["args"][key] = v + strides[key] * k
        if ev.get("ph") in ("s", "f") and type(ev.get("id")) is int:
            m["id"] = ev["id"] + flow
        out.append(m)
    return out


def write_kineto(src: Path, dst: Path, k_tiles: int) -> int:
    doc = orjson.loads(gzip.decompress(src.read_bytes()))
    events = doc["traceEvents"]
    once = [e for e in events if e.get("ph") in ("M", "i") or e.get("cat") == "Trace"]
    body = [e for e in events if not (e.get("ph") in ("M", "i") or e.get("cat") == "Trace")]
    starts = [round(e["ts"] * 1000) for e in body]
    ends = [round((e["ts"] + e.get("dur", 0)) * 1000) for e in body]
    span_ns = max(ends) - min(starts) + 1_000_000
    strides = {key: max((e.get("args", {}).get(key) or 0 for e in body), default=0) + 1000
               for key in KINETO_ID_ARGS}
    strides["flow"] = max((e["id"] for e in body if type(e.get("id")) is int), default=0) + 1000
    with open(dst, "wb") as fh:
        head = {k: v for k, v in doc.items() if k != "traceEvents"}
        fh.write(orjson.dumps(head)[:-1] + b',"traceEvents":[')
        for k in range(k_tiles):
            fh.write(orjson.dumps(_kineto_tile(body, k, span_ns, strides))[1:-1] + b",")
        fh.write(orjson.dumps(once)[1:-1] + b"]}")
    return dst.stat().st_size


def tile(k_tiles: int, outdir: Path, corpus: Path = CORPUS) -> int:
    """Write the K-times tiled pair into ``outdir``; returns the raw bytes written."""
    outdir.mkdir(parents=True, exist_ok=True)
    src = corpus / PAIR
    return (write_et(src / "host_et.json.gz", outdir / "host_et.json", k_tiles)
            + write_kineto(src / "kineto.json.gz", outdir / "kineto.json", k_tiles))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("k", type=int, help="number of tiles (K=1 is the recorded pair)")
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--corpus", type=Path, default=CORPUS)
    args = parser.parse_args()
    size = tile(args.k, args.outdir, args.corpus)
    print(f"{args.outdir}: {size / 1e6:.1f} MB raw (K={args.k})")


if __name__ == "__main__":
    main()
