"""What the benchmark scripts share, so that each script is its experiment only.

- `serve`: a `saga serve` (or `--no-saga`) child per mode, its readiness time and memory
- `replay`: the agent-session trace replay against a real engine, and the simulator's
  prediction of it
- `sim`: simulator runs in parallel processes; `overload`: the overload experiment's run
  and tables, which other workloads reuse
- `deadline_tenants`, `production_agents`: generated workloads
- `overhead`: the framework-overhead template (a scripted model in a child process, a
  hint service, interleaved arms, timed callables)
- `results`: how a run is written down (JSON, JSON lines, the command that ran it)
"""
