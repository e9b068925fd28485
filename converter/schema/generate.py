"""Regenerate the committed protobuf modules from our .proto files (developers only).

    python converter/schema/generate.py

Covers converter/schema/et_def.proto (the Chakra ET) and linker/xspace.proto, linker/hlo.proto
(the XProf profile and XLA HLO). Needs grpcio-tools. Each generated module is patched to
register in a private descriptor pool: the MLCommons tools register the same Chakra message
names (ChakraProtoMsg.Node, ...), and TensorFlow, xprof or jaxlib may register XSpace or HLO
messages, in protobuf's default pool; two definitions of one name in one pool make the second
import fail. With private pools, ours and theirs live in one process (our tests read our ETs
with the reference reader).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROTOS = (
    REPO / "converter" / "schema" / "et_def.proto",
    REPO / "linker" / "xspace.proto",
    REPO / "linker" / "hlo.proto",
)
DEFAULT_POOL = "_descriptor_pool.Default().AddSerializedFile("
PRIVATE_POOL = "_descriptor_pool.DescriptorPool().AddSerializedFile("


def generate(proto: Path, out: Path) -> None:
    """protoc ``proto`` into ``out``, then write its patched module and stub beside it."""
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", f"-I{proto.parent}", f"--python_out={out}",
         f"--pyi_out={out}", str(proto)],
        check=True,
    )
    module = f"{proto.stem}_pb2"
    code = (out / f"{module}.py").read_text()
    if DEFAULT_POOL not in code:
        raise SystemExit(f"{module}.py no longer registers in the default pool; update generate.py")
    (proto.parent / f"{module}.py").write_text(code.replace(DEFAULT_POOL, PRIVATE_POOL))
    (proto.parent / f"{module}.pyi").write_text((out / f"{module}.pyi").read_text())


def main() -> None:
    with tempfile.TemporaryDirectory() as out:
        for proto in PROTOS:
            generate(proto, Path(out))


if __name__ == "__main__":
    main()
