"""What a vLLM `Request` says about its agent session: id, tenant, deadline,
parent session, whether it is the session's last request (and when the scheduler
saw it arrive, for the queue order).

The session id comes from vLLM itself (`request.session_id`, filled from the body
field `session_id`, the `X-Session-ID` header or `vllm_xargs.session_id`); tenant,
deadline, `parent_session_id`, `session_final`, `cache_ttl_s`, `priority_jump_s` and
`osl` come from `vllm_xargs`
(`sampling_params.extra_args`), where the engine port puts what an agent's own
headers say (`proxy.engine_port`). Bad values are ignored, never raised: a request
must not fail because of SAGA metadata.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["RequestMeta", "request_meta", "MAX_ID_LEN"]

MAX_ID_LEN = 256


@dataclass(frozen=True, slots=True)
class RequestMeta:
    session_id: str | None
    tenant: str
    deadline_s: float | None
    arrived_at: float = 0.0  # scheduler clock
    parent_id: str | None = None  # the session that spawned it (a subagent's parent)
    final: bool = False  # the session's last request: it ends when this one finishes
    cache_ttl_s: float | None = None  # how long it asks its prompt cached (the client's hint)
    priority_jump_s: float = 0.0  # queued as if it arrived this much earlier (`proxy.agent_hints`)
    osl: int | None = None  # the output tokens it expects to write (`proxy.agent_hints`)

    def kv_need(self, prompt_tokens: int, max_tokens: int) -> int:
        """The KV the request may need: its prompt plus its output, `osl` when it said."""
        return prompt_tokens + (min(self.osl, max_tokens) if self.osl is not None else max_tokens)


def _clean_id(value) -> str | None:
    if not isinstance(value, str):
        return None
    value = value.strip()
    if not value or len(value) > MAX_ID_LEN:
        return None
    return value


def request_meta(request, arrived_at: float = 0.0) -> RequestMeta:
    extra = getattr(getattr(request, "sampling_params", None), "extra_args", None) or {}
    if not isinstance(extra, dict):
        extra = {}
    sid = _clean_id(getattr(request, "session_id", None)) or _clean_id(extra.get("session_id"))
    tenant = _clean_id(extra.get("tenant")) or ""
    deadline = extra.get("deadline_s")
    try:
        deadline = float(deadline) if deadline is not None else None
    except (TypeError, ValueError):
        deadline = None
    if deadline is not None and not (math.isfinite(deadline) and deadline > 0):
        deadline = None
    parent = _clean_id(extra.get("parent_session_id"))
    final = extra.get("session_final") in (True, 1, "true", "1")  # 1: True as vLLM's xargs parse it
    osl = _positive(extra.get("osl"))
    return RequestMeta(sid, tenant, deadline, arrived_at, parent if parent != sid else None, final,
                       _positive(extra.get("cache_ttl_s")), _positive(extra.get("priority_jump_s")) or 0.0,
                       int(osl) if osl is not None and osl >= 1 else None)


def _positive(value) -> float | None:
    """A finite number > 0 (strings too: vLLM's xargs keep them), else None."""
    try:
        seconds = float(value) if value is not None and not isinstance(value, bool) else None
    except (TypeError, ValueError):
        return None
    return seconds if seconds is not None and math.isfinite(seconds) and seconds > 0 else None
