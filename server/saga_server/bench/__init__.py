"""`saga bench`: trace-driven cluster benchmark of scheduling policies.

Workload from `saga-trace/1` files (`workload`), a scenario from flags or TOML
(`scenario`), policies by name (`policies`), runs side by side (`runner`), metrics
(`metrics`) and a JSON + Markdown + PNG report (`report`); `whatif` answers
"what would SAGA do for this recorded workload". The engine is
`saga_server.engines.sim`.
"""

from .metrics import summarize
from .policies import DEFAULT_POLICIES, make_policy, policy_names
from .runner import BenchResult, run_policies, run_scenario
from .scenario import Scenario, load_scenario
from .workload import FALLBACK_DURATIONS, TenantSpec, build_instances, load_trace

__all__ = [
    "BenchResult", "DEFAULT_POLICIES", "FALLBACK_DURATIONS", "Scenario", "TenantSpec",
    "build_instances", "load_scenario", "load_trace", "make_policy", "policy_names",
    "run_policies", "run_scenario", "summarize",
]
