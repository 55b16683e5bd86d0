"""Discrete-event simulator of a cluster of vLLM-like workers (see `cluster`).

It runs the same workflow core as the real server (through `SagaPolicy`), next to
baselines and an offline optimum, on replayed agent traces. It imports no vLLM,
torch or gRPC.
"""

from .cache import Eviction, PrefixCache
from .host import HostTier
from .cluster import Simulator
from .results import SimConfig, SimResult, TaskRecord, unloaded_time_s
from .hardware import GPUS, MODELS, CostModel, GpuSpec, ModelSpec, make_cost_model
from .offline import replay_accesses
from .policy import (ApcLru, ApcLruOffload, Belady, ContinuumTtl, Infinite, KvFlow, SimPolicy, ThunderAgent,
                     Vanilla)
from .tasks import StepSpec, TaskInstance, TaskSpec, ToolSpec

__all__ = [
    "ApcLru", "ApcLruOffload", "Belady", "ContinuumTtl", "CostModel", "Eviction", "GPUS", "GpuSpec",
    "HostTier", "Infinite", "KvFlow", "ThunderAgent", "MODELS", "ModelSpec", "PrefixCache", "SimConfig",
    "SimPolicy", "SimResult", "Simulator", "StepSpec", "TaskInstance", "TaskRecord",
    "TaskSpec", "ToolSpec", "Vanilla", "make_cost_model", "replay_accesses",
    "unloaded_time_s",
]
