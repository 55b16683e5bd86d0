"""`SagaScheduler`: vLLM's v1 `Scheduler` with SAGA plugged in.

Load it with `--scheduler-cls saga_server.engines.vllm.SagaScheduler` (CPU builds,
where async scheduling is off) or `saga_server.engines.vllm.SagaAsyncScheduler`
(GPU builds with async scheduling on); `saga serve` picks the right one.

The subclass only wires SAGA in, through vLLM's own seams; what SAGA does is
`plugin.SagaPlugin`:
- its public hooks (`add_request`, `schedule`, `update_from_output`,
  `reset_prefix_cache`, `shutdown`) call the plugin and then vLLM;
- the KV cache manager is vLLM's, wrapped (`kv_manager.HoldingKVCacheManager`) so a
  finished request's prefix can be held and a failed allocation can reclaim held KV;
- the waiting queue is a `RequestQueue` of SAGA's (`queue.RankedRequestQueue`), in
  Agent Fair Share order (vLLM's priority policy keeps its own queue);
- each step's token budget (`max_num_scheduled_tokens`, this scheduler's own attribute)
  is vLLM's configured one unless the deadline rule thins it for that step.
"""

from __future__ import annotations

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.request_queue import SchedulingPolicy
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request

from saga_server.core import WorkflowCore

from .kv_manager import HoldingKVCacheManager
from .plugin import SagaPlugin
from .queue import RankedRequestQueue

__all__ = ["SagaScheduler", "SagaAsyncScheduler", "SagaSchedulerMixin"]


class SagaSchedulerMixin:
    """The wiring; mixed in front of vLLM's `Scheduler` or `AsyncScheduler`."""

    def __init__(self, *args, core: WorkflowCore | None = None, clock=None, start_hints: bool = True,
                 tenant_limits=None, settings=None, **kwargs) -> None:
        """`core`, `clock`, `start_hints`, `tenant_limits` and `settings` are test seams (see `SagaPlugin`)."""
        super().__init__(*args, **kwargs)
        self.saga = SagaPlugin(self, core=core, clock=clock, start_hints=start_hints, tenant_limits=tenant_limits,
                               settings=settings)
        self._full_token_budget = self.max_num_scheduled_tokens
        self.kv_cache_manager = HoldingKVCacheManager(self.kv_cache_manager, self.saga)
        if self.policy == SchedulingPolicy.FCFS:
            self.waiting = RankedRequestQueue(self.saga.may_schedule)

    def add_request(self, request: Request) -> None:
        self.saga.on_arrival(request)
        super().add_request(request)

    def schedule(self, *args, **kwargs):
        self.saga.before_schedule()
        # The step's budget: vLLM's own, or the deadline rule's (`SagaPlugin.step_token_budget`).
        budget = self.saga.step_token_budget(self._full_token_budget)
        self.max_num_scheduled_tokens = self._full_token_budget if budget is None else budget
        output = super().schedule(*args, **kwargs)
        self.saga.after_schedule(output)
        return output

    def update_from_output(self, scheduler_output, model_runner_output):
        return self.saga.filter_outputs(super().update_from_output(scheduler_output, model_runner_output))

    def reset_prefix_cache(self, *args, **kwargs) -> bool:
        self.saga.on_reset()
        return super().reset_prefix_cache(*args, **kwargs)

    def shutdown(self) -> None:
        self.saga.close()
        super().shutdown()


class SagaScheduler(SagaSchedulerMixin, Scheduler):
    """CPU builds and `--no-async-scheduling`: SAGA on vLLM's synchronous scheduler."""


class SagaAsyncScheduler(SagaSchedulerMixin, AsyncScheduler):
    """GPU builds with async scheduling: same behaviour on vLLM's `AsyncScheduler`."""
