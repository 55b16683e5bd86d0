"""What a request's `nvext.agent_hints` (NVIDIA Dynamo's request extension) asks of the
scheduler: `AgentHints`.

- `priority` (higher = more important, Dynamo's polarity; its older alias
  `latency_sensitivity`, in seconds): the request is queued as if it had arrived
  that many seconds earlier. Negative values count as 0, as in Dynamo: a hint never
  pushes a request behind others. SAGA applies it within the request's tenant only
  (`core.fairshare`: a tenant's share is not for a client to buy) and caps it at
  `FairShareConfig.max_priority_jump_s`.
- `osl`: the output tokens the request expects to generate. Session admission
  counts a request's KV need as its prompt plus the smaller of `osl` and
  `max_tokens` (a client's `max_tokens` is often a ceiling far above what it
  writes, and admission would park sessions for room nobody uses).
- `speculative_prefill` (Dynamo prefills the next request's prompt after a response)
  is read and not acted on separately: the session's hold keeps the prefix the
  next request continues, prompt and answer, and SAGA's own prefetch brings it back
  before a predicted return.

The engine port hands these to the engine as `vllm_xargs.priority_jump_s` and
`vllm_xargs.osl`. Unreadable values are ignored: a request never fails on them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

__all__ = ["AgentHints", "agent_hints", "MAX_OSL"]

MAX_OSL = 1 << 24  # past any context window: a larger `osl` is not a prediction


@dataclass(frozen=True, slots=True)
class AgentHints:
    priority_jump_s: float | None = None  # queued as if it arrived this much earlier
    osl: int | None = None  # expected output tokens

    def __bool__(self) -> bool:
        return self.priority_jump_s is not None or self.osl is not None


def agent_hints(body: Mapping[str, Any]) -> AgentHints:
    """The request body's `nvext.agent_hints` (module docstring); empty when none."""
    nvext = body.get("nvext") if isinstance(body, Mapping) else None
    hints = nvext.get("agent_hints") if isinstance(nvext, Mapping) else None
    if not isinstance(hints, Mapping):
        return AgentHints()
    jump = _finite(hints.get("priority"))
    if jump is None:
        jump = _finite(hints.get("latency_sensitivity"))
    osl = _finite(hints.get("osl"))
    return AgentHints(None if jump is None else max(jump, 0.0),
                      int(osl) if osl is not None and 1 <= osl <= MAX_OSL else None)


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None
