"""Generate the Python code for proto/saga/v1/hints.proto into sdk/saga_proto
(the `saga_proto` package, shipped with the SDK and imported by SDK and server).

    python scripts/gen_proto.py          # write the files
    python scripts/gen_proto.py --check  # exit 1 if the checked-in files differ

Needs grpcio-tools==1.70.0 (the `dev` extra): its output imports under protobuf
5.29 (which autogen-core pins) as well as under newer protobuf releases.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
PROTO = "saga/v1/hints.proto"
OUT = ROOT / "sdk" / "saga_proto"
GENERATED = ("hints_pb2.py", "hints_pb2.pyi", "hints_pb2_grpc.py")


def generate() -> dict[str, str]:
    """Return {file name: contents} as protoc generates them, imports made relative."""
    from grpc_tools import protoc

    with tempfile.TemporaryDirectory() as tmp:
        args = ["protoc", f"-I{PROTO_ROOT}", f"--python_out={tmp}", f"--pyi_out={tmp}",
                f"--grpc_python_out={tmp}", PROTO]
        if protoc.main(args) != 0:
            raise SystemExit(f"protoc failed on {PROTO}")
        out = {}
        for name in GENERATED:
            text = (Path(tmp) / "saga" / "v1" / name).read_text()
            # The package is `saga_proto`, not `saga.v1`: imports within it are relative.
            out[name] = re.sub(r"^from saga\.v1 import ", "from . import ", text, flags=re.M)
        return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    args = parser.parse_args()
    stale = []
    for name, text in generate().items():
        path = OUT / name
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
    if stale:
        print(f"stale generated code: {', '.join(stale)}; run python scripts/gen_proto.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
