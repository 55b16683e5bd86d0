"""Imports point down only (docs/ARCHITECTURE.md, "Layering"). A stray import fails here, not in review.

Every module of the server, the SDK and the wire code belongs to a room (the longest
prefix of its module name in `ROOMS`). A room's rules are data: the SAGA modules and the
third-party packages it may import (the standard library is always allowed), and what
it must never import, whatever its allow-list says. Both absolute and relative imports
(`from ..engines import vllm`, `from . import x`) are resolved to the module they load
and checked the same way. The allow-lists are as tight as the code is: a new arrow
between rooms is a decision, made here and drawn in docs/ARCHITECTURE.md.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STDLIB = set(sys.stdlib_module_names)
SOURCE_ROOTS = (ROOT / "server", ROOT / "sdk")
PACKAGES = (ROOT / "server" / "saga_server", ROOT / "sdk" / "saga_sdk", ROOT / "sdk" / "saga_proto")
# The server's package root holds only its version: loading it is loading nothing.
ALWAYS = ("saga_server",)

ENGINES_AND_FRONT_DOORS = ("saga_server.engines", "saga_server.rpc", "saga_server.router", "saga_server.serve",
                           "saga_server.proxy", "saga_server.bench")
FRAMEWORKS = ("langchain*", "langgraph", "autogen*", "agents", "openai")
HEAVY = ("vllm", "torch", "ray")
# A leaf module every process may load: standard library only, no SAGA room.
LEAF_NEVER = ("saga_server.engines", "saga_server.core", "saga_server.rpc", "saga_server.router", "saga_server.serve",
              "saga_server.proxy", "saga_server.bench", "saga_server.record", "grpc") + HEAVY + FRAMEWORKS


@dataclass(frozen=True)
class Room:
    why: str
    saga: tuple[str, ...] = ()         # SAGA modules it may import, besides its own
    third_party: tuple[str, ...] = ()  # packages beyond the standard library
    never: tuple[str, ...] = ()        # the design rule: no allow-list may grant these


ROOMS: dict[str, Room] = {
    "saga_server.core": Room(
        "the workflow core runs inside vLLM, inside the hint service and on simulated time: "
        "standard library only",
        never=ENGINES_AND_FRONT_DOORS + ("saga_server.record", "saga_sdk", "saga_proto", "grpc", "google.protobuf",
                                         "httpx") + HEAVY + FRAMEWORKS),
    "saga_server.rpc": Room(
        "the hint service: gRPC in, validated core events out; `saga hints` keeps what its core learnt",
        saga=("saga_server.core", "saga_proto", "saga_server.settings", "saga_server.state_file"),
        third_party=("grpc",),
        never=("saga_server.engines", "saga_server.router", "saga_server.serve", "saga_server.proxy",
               "saga_server.record", "saga_server.bench") + HEAVY + FRAMEWORKS),
    "saga_server.record": Room(
        "every front door can record (the proxy in its process, the vLLM plugin in the engine's)",
        saga=("saga_server.core.categories", "saga_sdk.logs"),
        never=ENGINES_AND_FRONT_DOORS + ("grpc", "saga_proto") + HEAVY + FRAMEWORKS),
    "saga_server.engines.vllm": Room(
        "SAGA inside vLLM's scheduler: the core's rules over vLLM's blocks, its own hint service and recorder; "
        "on a CPU engine the host tier's copies (torch, numpy: vLLM's own)",
        saga=("saga_server.core", "saga_server.record", "saga_server.rpc", "saga_server.settings",
              "saga_server.state_file", "saga_server.metrics_schema"),
        third_party=("vllm", "prometheus_client", "torch", "numpy"),
        never=("saga_server.engines.sim", "saga_server.router", "saga_server.serve", "saga_server.proxy",
               "saga_server.bench", "ray", "httpx") + FRAMEWORKS),
    "saga_server.engines.sim": Room(
        "the simulator: the core on simulated time, no engine or transport",
        saga=("saga_server.core",),
        never=("saga_server.engines.vllm", "saga_server.rpc", "saga_server.router", "saga_server.serve",
               "saga_server.proxy", "saga_server.record", "saga_proto", "grpc", "google.protobuf", "httpx")
        + HEAVY + FRAMEWORKS),
    "saga_server.bench": Room(
        "`saga bench`: the simulator's driver, no engine or transport either; `saga calibrate` "
        "starts its engine as a `saga serve` child",
        saga=("saga_server.core", "saga_server.engines.sim", "saga_server.serve_child", "saga_server.host_cpu"),
        third_party=("matplotlib", "tqdm", "numpy"),
        never=("saga_server.engines.vllm", "saga_server.rpc", "saga_server.router", "saga_server.serve",
               "saga_server.proxy", "saga_proto", "grpc", "google.protobuf", "httpx") + HEAVY + FRAMEWORKS),
    "saga_server.serve": Room(
        "`saga serve` runs vLLM as a child process and names SAGA's classes to it as strings; "
        "it checks the keys, the identity headers and the record file before vLLM starts and prepares the model",
        saga=("saga_server.record", "saga_server.rpc.keys", "saga_server.rpc.reload", "saga_server.core.identity",
              "saga_server.core.mechanisms", "saga_server.serve_child", "saga_server.settings",
              "saga_server.state_file", "saga_server.host_cpu"),
        third_party=("torch", "transformers"),
        never=("saga_server.engines", "saga_server.router", "saga_server.proxy", "saga_server.bench",
               "saga_server.rpc.service", "vllm", "ray") + FRAMEWORKS),
    "saga_server.proxy": Room(
        "the zero-code front door: an HTTP proxy that sends hints through the SDK's client; "
        "its hints are the core's event dataclasses; it shares the keys file and the recorder, "
        "never an engine or the core's scheduler; its tenant rules also guard the engine's own port "
        "(vLLM loads that middleware by name)",
        saga=("saga_server.core.categories", "saga_server.core.events", "saga_server.core.identity", "saga_server.settings",
              "saga_server.core.scopes", "saga_server.record",
              "saga_server.rpc.keys", "saga_server.rpc.reload", "saga_server.state_file", "saga_sdk"),
        third_party=("httpx", "starlette", "uvicorn", "anyio"),
        never=("saga_server.engines", "saga_server.router", "saga_server.serve", "saga_server.bench",
               "saga_server.core.workflow", "saga_server.rpc.service", "saga_proto", "grpc") + HEAVY + FRAMEWORKS),
    "saga_server.router": Room(
        "`saga router`: Ray Serve replicas running `saga serve`'s engine; session placement from the core's "
        "routing, hints fanned out over the wire contract",
        saga=("saga_server.core.routing", "saga_server.core.cluster_share", "saga_server.rpc",
              "saga_server.serve.cli", "saga_server.serve.model", "saga_server.serve_child", "saga_server.settings",
              "saga_server.host_cpu", "saga_proto", "saga_sdk"),
        third_party=("ray", "httpx", "grpc", "prometheus_client"),
        never=("saga_server.engines.sim", "saga_server.proxy", "saga_server.bench", "saga_server.core.workflow",
               "vllm", "torch") + FRAMEWORKS),
    "saga_server.settings": Room(
        "the typed settings of SAGA's processes: read once, written by the front doors; the core's defaults, "
        "no engine or transport",
        saga=("saga_server.core.fairshare", "saga_server.core.mechanisms", "saga_server.core.sessions"),
        never=ENGINES_AND_FRONT_DOORS + ("saga_server.record", "saga_sdk", "saga_proto", "grpc") + HEAVY
        + FRAMEWORKS),
    "saga_server.state_file": Room(
        "what a process learnt, on disk across restarts: standard library only, handed the state to keep",
        never=LEAF_NEVER),
    "saga_server.metrics_schema": Room(
        "every metric an engine reports, declared once (pure data): the engine's Prometheus objects, its "
        "GetStats counts and `saga status`'s lines are made from it; standard library only",
        never=("saga_server.engines", "saga_server.core", "saga_server.rpc", "saga_server.router",
               "saga_server.serve", "saga_server.proxy", "saga_server.bench", "saga_server.record",
               "prometheus_client", "grpc") + HEAVY + FRAMEWORKS),
    "saga_server.host_cpu": Room(
        "what the host CPU is and the dtype the default model is served in on it, for `saga serve`, `saga router`, "
        "`saga calibrate` and the benchmarks: standard library only",
        never=LEAF_NEVER),
    "saga_server.serve_child": Room(
        "`saga serve` as a child process and free local ports, for `saga calibrate`, the benchmarks and the "
        "tests: standard library only",
        never=LEAF_NEVER),
    "saga_server": Room(
        "`saga` and `saga status`: subcommands imported by name only when used, so `saga status` never "
        "pays for vLLM",
        saga=("saga_server.serve.status", "saga_server.metrics_schema", "saga_sdk"),
        never=("saga_server.engines", "saga_server.core", "grpc") + HEAVY + FRAMEWORKS),
    "saga_sdk": Room(
        "agents install the SDK alone (grpcio and protobuf); it never imports the server; "
        "`saga run`'s bootstrap loads the integrations",
        saga=("saga_proto", "saga_sdk.integrations"), third_party=("grpc",),
        never=("saga_server",) + HEAVY + FRAMEWORKS),
    "saga_sdk.integrations": Room(
        "one module per agent framework, over the SDK's public client",
        saga=("saga_sdk",),
        third_party=("agents", "autogen_agentchat", "autogen_core", "autogen_ext", "langchain_core", "langgraph",
                     "pydantic"),
        never=("saga_server",) + HEAVY),
    "saga_proto": Room(
        "the generated wire code: grpc and protobuf only",
        third_party=("grpc", "google.protobuf"),
        never=("saga_server", "saga_sdk") + HEAVY + FRAMEWORKS),
}


def matches(name: str, prefix: str) -> bool:
    """`name` is `prefix` or inside it; `prefix*` also matches any name starting so (`autogen*`)."""
    if prefix.endswith("*"):
        return name.startswith(prefix[:-1])
    return name == prefix or name.startswith(prefix + ".")


def module_name(path: Path, source_root: Path) -> tuple[str, bool]:
    """A file's module name under its source root, and whether it is a package's `__init__`."""
    parts = list(path.relative_to(source_root).with_suffix("").parts)
    is_package = parts[-1] == "__init__"
    return ".".join(parts[:-1] if is_package else parts), is_package


def is_module(name: str, source_root: Path) -> bool:
    base = source_root.joinpath(*name.split("."))
    return base.with_suffix(".py").is_file() or base.is_dir()


def resolve(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The absolute module a `from` import names: relative levels counted from the file's package."""
    if node.level == 0:
        return node.module or ""
    package = module.split(".") if is_package else module.split(".")[:-1]
    if node.level - 1 >= len(package):
        return "." * node.level + (node.module or "") + " (beyond the top-level package)"
    base = package[:len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imported_modules(package_dir: Path, source_root: Path | None = None):
    """(file, module, line) for every import under package_dir, relative ones resolved.

    `from M import a` names `M.a` when that is a module of the source tree, else `M`.
    """
    for path in sorted(package_dir.rglob("*.py")):
        root = source_root or next(r for r in SOURCE_ROOTS if path.is_relative_to(r))
        module, is_package = module_name(path, root)
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    yield path, alias.name, node.lineno
            elif isinstance(node, ast.ImportFrom):
                target = resolve(node, module, is_package)
                subs = [f"{target}.{a.name}" for a in node.names if is_module(f"{target}.{a.name}", root)]
                for name in subs or [target]:
                    yield path, name, node.lineno
                if subs and len(subs) < len(node.names):
                    yield path, target, node.lineno


def room_of(module: str) -> str | None:
    found = [r for r in ROOMS if matches(module, r)]
    return max(found, key=len) if found else None


def verdict(room: str, name: str) -> str | None:
    """Why `room` may not import `name`, or None when it may."""
    rules = ROOMS[room]
    if any(matches(name, n) for n in rules.never):
        return "never allowed"
    if name.split(".")[0] in STDLIB or name in ALWAYS or room_of(name) == room:
        return None
    if any(matches(name, a) for a in rules.saga + rules.third_party):
        return None
    return "not in its rules"


def refusals(package_dir: Path, room: str | None = None, source_root: Path | None = None):
    """(room, "file:line imports module (why)") for each import its room's rules refuse.

    Each file is judged by its own room, or by `room` when given.
    """
    for path, name, line in imported_modules(package_dir, source_root):
        root = source_root or next(r for r in SOURCE_ROOTS if path.is_relative_to(r))
        home = room or room_of(module_name(path, root)[0])
        why = verdict(home, name) if home else "in no room"
        if why:
            shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
            yield home, f"{shown}:{line} imports {name} ({home}: {why})"


def offenders(package_dir: Path, room: str | None = None, source_root: Path | None = None) -> list[str]:
    return [message for _, message in refusals(package_dir, room, source_root)]


@pytest.fixture(scope="module")
def violations() -> dict[str | None, list[str]]:
    by_room: dict[str | None, list[str]] = {room: [] for room in ROOMS}
    for package in PACKAGES:
        for room, message in refusals(package):
            by_room.setdefault(room, []).append(message)
    return by_room


@pytest.mark.parametrize("room", sorted(ROOMS))
def test_each_room_imports_only_what_its_rules_allow(room, violations):
    assert violations[room] == [], ROOMS[room].why


def test_every_module_is_in_a_room_and_every_room_has_modules():
    modules = {module_name(p, r)[0] for pkg in PACKAGES for p in pkg.rglob("*.py")
               for r in SOURCE_ROOTS if p.is_relative_to(r)}
    assert modules, "no packages found"
    # A package of the server is a room of its own, not the command-line modules' room.
    homeless = sorted(m for m in modules if room_of(m) is None
                      or (room_of(m) == "saga_server" and m.count(".") >= 2))
    assert homeless == []
    assert sorted(r for r in ROOMS if not any(room_of(m) == r for m in modules)) == []


def test_no_rule_allows_what_it_forbids():
    clashes = [f"{room}: {a} vs never {n}" for room, rules in ROOMS.items()
               for a in rules.saga + rules.third_party for n in rules.never
               if matches(a, n) or matches(n, a)]
    assert clashes == []


def test_every_room_named_in_a_rule_exists():
    named = set(ROOMS) | {a for rules in ROOMS.values() for a in rules.saga + rules.never if a.startswith("saga")}
    assert sorted(n for n in named if not any(is_module(n, r) for r in SOURCE_ROOTS)) == []


def test_the_server_package_root_holds_no_imports():
    """What `ALWAYS` relies on: loading `saga_server` itself loads nothing."""
    assert [n for p, n, _ in imported_modules(ROOT / "server" / "saga_server")
            if p == ROOT / "server" / "saga_server" / "__init__.py"] == []


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


def test_the_checker_catches_a_bad_import(tmp_path):
    (tmp_path / "bad.py").write_text("import vllm\nfrom saga_server.rpc import HintServer\n")
    found = [name for _, name, _ in imported_modules(tmp_path, tmp_path)]
    assert found == ["vllm", "saga_server.rpc"]


def fake_tree(tmp_path: Path, files: dict[str, str]) -> Path:
    """A source tree shaped like the server's (saga_server/engines without an `__init__`)."""
    for name, text in {"saga_server/__init__.py": "", "saga_server/core/__init__.py": "",
                       "saga_server/core/holds.py": "", "saga_server/engines/vllm/__init__.py": "",
                       "saga_server/engines/vllm/plugin.py": "", "saga_server/rpc/__init__.py": "",
                       "saga_server/rpc/keys.py": "", **files}.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


def test_relative_imports_resolve_to_absolute_modules(tmp_path):
    root = fake_tree(tmp_path, {
        "saga_server/core/bad.py": "from ..engines import vllm\nfrom . import holds\nfrom .holds import X\n"
                                   "from .. import core\nfrom ..rpc import keys, Thing\nfrom ... import x\n",
        "saga_server/core/__init__.py": "from .holds import HoldLedger\nfrom . import holds\n",
        "saga_server/engines/vllm/plugin.py": "from ...core import holds\nfrom ..vllm import plugin\n"})
    found = {(p.relative_to(root).as_posix(), n) for p, n, _ in imported_modules(root / "saga_server", root)}
    assert {(f, n) for f, n in found if f == "saga_server/core/bad.py"} == {
        ("saga_server/core/bad.py", n) for n in (
            "saga_server.engines.vllm", "saga_server.core.holds", "saga_server.core",
            "saga_server.rpc.keys", "saga_server.rpc", "... (beyond the top-level package)")}
    assert ("saga_server/core/__init__.py", "saga_server.core.holds") in found
    assert ("saga_server/engines/vllm/plugin.py", "saga_server.core.holds") in found
    assert ("saga_server/engines/vllm/plugin.py", "saga_server.engines.vllm.plugin") in found


def test_the_checker_catches_a_bad_relative_import(tmp_path):
    root = fake_tree(tmp_path, {"saga_server/core/bad.py": "from ..engines import vllm\nfrom . import holds\n"})
    assert offenders(root / "saga_server", source_root=root) == [
        f"{root / 'saga_server/core/bad.py'}:1 imports saga_server.engines.vllm "
        "(saga_server.core: never allowed)"]


def test_a_submodule_rule_is_not_a_package_rule(tmp_path):
    """The proxy may use the keys file, not the hint service's package as a whole."""
    root = fake_tree(tmp_path, {"saga_server/proxy/__init__.py": "",
                                "saga_server/proxy/ok.py": "from ..rpc.keys import KeyRing\nfrom ..rpc import keys\n",
                                "saga_server/proxy/bad.py": "from ..rpc import KeyRing\n"})
    assert [line.split(" imports ")[1] for line in offenders(root / "saga_server", source_root=root)] == [
        "saga_server.rpc (saga_server.proxy: not in its rules)"]
