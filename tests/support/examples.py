"""`load_example`: import one of the `examples/*.py` scripts as a module (they are
scripts, not a package), freshly, under a name of its own in `sys.modules`."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

__all__ = ["EXAMPLES", "load_example"]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def load_example(name: str) -> ModuleType:
    """`load_example("langchain_agent")` runs examples/langchain_agent.py as the
    module `saga_example_langchain_agent` and returns it."""
    spec = importlib.util.spec_from_file_location(f"saga_example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
