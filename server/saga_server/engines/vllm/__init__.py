"""SAGA on real vLLM: the v1 scheduler plugin and its hint intake.

`SagaScheduler` (sync) / `SagaAsyncScheduler` (GPU async scheduling) are loaded by
vLLM with `--scheduler-cls`; see `scheduler` for what they change, `holds` for
the pin/WA-LRU ledger and its forward-progress rule, `intake` for how hints
reach the scheduler inside vLLM's EngineCore process, `metrics` for `/metrics`.
Importing this package imports vLLM.
"""

from .holds import Hold, SessionHolds
from .scheduler import PREFETCH_PREFIX, SagaAsyncScheduler, SagaScheduler

__all__ = ["SagaScheduler", "SagaAsyncScheduler", "SessionHolds", "Hold", "PREFETCH_PREFIX"]
