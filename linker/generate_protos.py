"""Regenerate xspace_pb2.py and hlo_pb2.py from their .proto files (developers only; the output
is committed).

    python linker/generate_protos.py

Needs grpcio-tools. Like converter/schema/generate.py, the generated modules are patched to
register in a private descriptor pool: TensorFlow, xprof or jaxlib may register XSpace or HLO
messages in protobuf's default pool in the same process, and two definitions of one file or
message name in one pool make the second import fail.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROTOS = ("xspace", "hlo")
DEFAULT_POOL = "_descriptor_pool.Default().AddSerializedFile("
PRIVATE_POOL = "_descriptor_pool.DescriptorPool().AddSerializedFile("


def main() -> None:
    with tempfile.TemporaryDirectory() as out:
        for name in PROTOS:
            subprocess.run(
                [sys.executable, "-m", "grpc_tools.protoc", f"-I{HERE}", f"--python_out={out}",
                 f"--pyi_out={out}", str(HERE / f"{name}.proto")],
                check=True,
            )
            code = (Path(out) / f"{name}_pb2.py").read_text()
            if DEFAULT_POOL not in code:
                raise SystemExit("generated code no longer registers in the default pool; update this script")
            (HERE / f"{name}_pb2.py").write_text(code.replace(DEFAULT_POOL, PRIVATE_POOL))
            (HERE / f"{name}_pb2.pyi").write_text((Path(out) / f"{name}_pb2.pyi").read_text())


if __name__ == "__main__":
    main()
