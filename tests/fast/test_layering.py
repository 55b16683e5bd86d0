"""Imports point down only (docs/ARCHITECTURE.md, "Layering"). A stray import fails here, not in review."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STDLIB = set(sys.stdlib_module_names)


def imported_modules(package_dir: Path):
    """(file, absolute module name) for every import under package_dir."""
    for path in sorted(package_dir.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    yield path, alias.name
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                yield path, node.module


def offenders(package_dir: Path, allowed) -> list[str]:
    return [f"{path.relative_to(ROOT)} imports {name}"
            for path, name in imported_modules(package_dir) if not allowed(name)]


def test_core_imports_only_the_standard_library():
    core = ROOT / "server" / "saga_server" / "core"
    assert list(core.glob("*.py")), "core package not found"
    assert offenders(core, lambda m: m.split(".")[0] in STDLIB or m.startswith("saga_server.core")) == []


def test_sdk_never_imports_the_server():
    sdk = ROOT / "sdk" / "saga_sdk"
    assert offenders(sdk, lambda m: not m.startswith("saga_server")) == []


def test_the_generated_wire_code_imports_only_grpc_and_protobuf():
    proto = ROOT / "sdk" / "saga_proto"
    assert list(proto.glob("*_pb2.py")), "generated code not found"
    assert offenders(proto, lambda m: m.split(".")[0] in STDLIB or m.startswith(("grpc", "google.protobuf"))) == []


def private_sdk_imports(package_dir: Path) -> list[str]:
    """Imports of a private SDK module (`saga_sdk._x`), in either import form."""
    found = []
    for path in sorted(package_dir.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
            found += [f"{shown} imports {n}" for n in names
                      if n.startswith("saga_sdk.") and any(p.startswith("_") for p in n.split(".")[1:])]
    return found


def test_the_server_uses_only_the_public_sdk():
    """The wire code is `saga_proto`, shared plumbing is in public SDK modules."""
    assert private_sdk_imports(ROOT / "server" / "saga_server") == []


def test_the_private_import_check_sees_both_forms(tmp_path):
    (tmp_path / "bad.py").write_text("from saga_sdk import _bootstrap\nimport saga_sdk._x.y\n"
                                     "from saga_sdk.client import HintClient\n")
    assert len(private_sdk_imports(tmp_path)) == 2


@pytest.mark.parametrize("package", ["engines/sim", "bench"])
def test_simulator_imports_no_engine_or_transport(package):
    folder = ROOT / "server" / "saga_server" / package
    if not folder.exists():
        pytest.skip(f"{package} not in this build")
    banned = ("vllm", "torch", "grpc", "google.protobuf", "saga_server.engines.vllm", "saga_server.rpc",
              "httpx", "ray")
    assert offenders(folder, lambda m: not m.startswith(banned)) == []


def test_the_recorder_imports_only_the_core_and_sdk_plumbing():
    """So that every front door can record (the proxy in its process, the vLLM plugin in the engine's)."""
    folder = ROOT / "server" / "saga_server" / "record"
    assert list(folder.glob("*.py")), "record package not found"
    assert offenders(folder, lambda m: m.split(".")[0] in STDLIB or m.startswith(
        ("saga_server.core", "saga_server.record", "saga_sdk.logs"))) == []


def test_the_checker_catches_a_bad_import(tmp_path):
    (tmp_path / "bad.py").write_text("import vllm\nfrom saga_server.rpc import HintServer\n")
    found = [name for _, name in imported_modules(tmp_path)]
    assert found == ["vllm", "saga_server.rpc"]
