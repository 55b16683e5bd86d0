"""The checked-in generated code imports and works under the newest protobuf too,
not only under the 5.29 line that autogen-core pins (the venv's version)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.real

PROBE = """
import google.protobuf, sys
from saga_proto import hints_pb2 as pb, hints_pb2_grpc
b = pb.HintBatch(client_id="c", sequence=1)
b.events.add(session_id="s", tool_call_start=pb.ToolCallStart(tool="bash"))
assert pb.HintBatch.FromString(b.SerializeToString()).events[0].tool_call_start.tool == "bash"
print(google.protobuf.__version__)
"""


def test_generated_code_imports_under_the_newest_protobuf(tmp_path):
    target = tmp_path / "site"
    install = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target",
                              str(target), "protobuf>=6.33.5"], capture_output=True, text=True)
    assert install.returncode == 0, install.stderr[-2000:]
    probe = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                           env={"PYTHONPATH": f"{target}:{ROOT / 'sdk'}", "PATH": "/usr/bin:/bin"})
    assert probe.returncode == 0, probe.stderr[-2000:]
    major = int(probe.stdout.strip().split(".")[0])
    assert major >= 6, f"expected a protobuf >= 6 to be under test, got {probe.stdout.strip()}"


def test_generated_code_imports_under_protobuf_5_29():
    import google.protobuf

    assert google.protobuf.__version__.startswith("5.29."), "the venv should pin protobuf 5.29.x (autogen-core)"
    from saga_proto import hints_pb2  # noqa: F401
