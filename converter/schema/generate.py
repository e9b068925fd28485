"""Regenerate et_def_pb2.py from et_def.proto (developers only; the output is committed).

    python converter/schema/generate.py

Needs grpcio-tools. The generated module is patched to register the schema in a private
descriptor pool: the MLCommons tools register the same message names (ChakraProtoMsg.Node, ...)
in protobuf's default pool, and two definitions of one name in one pool make the second import
fail. With a private pool, our classes and theirs can live in one process (our tests read our
files with theirs).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_POOL = "_descriptor_pool.Default().AddSerializedFile("
PRIVATE_POOL = "_descriptor_pool.DescriptorPool().AddSerializedFile("


def main() -> None:
    with tempfile.TemporaryDirectory() as out:
        subprocess.run(
            [sys.executable, "-m", "grpc_tools.protoc", f"-I{HERE}", f"--python_out={out}",
             f"--pyi_out={out}", str(HERE / "et_def.proto")],
            check=True,
        )
        code = (Path(out) / "et_def_pb2.py").read_text()
        if DEFAULT_POOL not in code:
            raise SystemExit("generated code no longer registers in the default pool; update generate.py")
        (HERE / "et_def_pb2.py").write_text(code.replace(DEFAULT_POOL, PRIVATE_POOL))
        (HERE / "et_def_pb2.pyi").write_text((Path(out) / "et_def_pb2.pyi").read_text())


if __name__ == "__main__":
    main()
