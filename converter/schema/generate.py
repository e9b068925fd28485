"""Regenerate the committed protobuf modules from our .proto files (developers only).

    python converter/schema/generate.py

Covers converter/schema/et_def.proto (the Chakra ET) and linker/xla/xspace.proto, linker/xla/hlo.proto
(the XProf profile and XLA HLO). Needs grpcio-tools. Each generated module is patched to
register in a private descriptor pool: the MLCommons tools register the same Chakra message
names (ChakraProtoMsg.Node, ...), and TensorFlow, xprof or jaxlib may register XSpace or HLO
messages, in protobuf's default pool; two definitions of one name in one pool make the second
import fail. With private pools, ours and theirs live in one process (our tests read our ETs
with the reference reader).
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROTOS = (
    REPO / "converter" / "schema" / "et_def.proto",
    REPO / "linker" / "xla" / "xspace.proto",
    REPO / "linker" / "xla" / "hlo.proto",
)
DEFAULT_POOL = "_descriptor_pool.Default().AddSerializedFile("
PRIVATE_POOL = "_descriptor_pool.DescriptorPool().AddSerializedFile("
# protoc's gencode refuses a runtime of another major version than its own, but this code (a
# serialized descriptor and the builder calls) runs unchanged on protobuf 5.29 to 7.x, which
# the test suites check (the main one on 7, the NeMo session on NeMo's pinned 5.29). Without
# the check, chakra-hooks installs beside NeMo 2.7.3 (protobuf~=5.29.5) and beside the rest.
VERSION_CHECK = re.compile(r"_runtime_version\.ValidateProtobufRuntimeVersion\([^)]*\)\n")
VERSION_IMPORT = "from google.protobuf import runtime_version as _runtime_version\n"
VERSION_NOTE = ("# chakra-hooks: no runtime version check (runs on protobuf 5.29 to 7.x; see "
                "converter/schema/generate.py)\n")


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
    code, checks = VERSION_CHECK.subn(VERSION_NOTE, code.replace(VERSION_IMPORT, ""))
    if checks != 1:
        raise SystemExit(f"{module}.py: found {checks} runtime version checks; update generate.py")
    (proto.parent / f"{module}.py").write_text(code.replace(DEFAULT_POOL, PRIVATE_POOL))
    (proto.parent / f"{module}.pyi").write_text((out / f"{module}.pyi").read_text())


def main() -> None:
    with tempfile.TemporaryDirectory() as out:
        for proto in PROTOS:
            generate(proto, Path(out))


if __name__ == "__main__":
    main()
