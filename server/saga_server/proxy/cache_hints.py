"""How long a request asks for its prompt to stay cached, in the words of the API it
speaks: `cache_ttl_s`.

- Anthropic Messages: `cache_control: {"type": "ephemeral", "ttl": "5m" | "1h"}`
  on content blocks (system, messages, tools) or on the request itself; a marker
  without `ttl` means 5 minutes, the API's default.
- OpenAI: `prompt_cache_retention` (`"in_memory"`: the API keeps a prefix 5 to 10
  minutes, so 5; `"24h"`), and its successor `prompt_cache_options.ttl` (`"30m"`).
- Any: a duration SAGA reads as `<n>s`, `<n>m`, `<n>h` or `<n>d`.

The request's TTL is the longest it asks for anywhere (the prefix up to its last
marker stays at least that long). The engine port hands it to the engine as
`vllm_xargs.cache_ttl_s`, where it becomes a floor on the session's hold
(`core.pinning`: what wins when it disagrees with what SAGA learnt). Unreadable
values are ignored: a request never fails on them.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

__all__ = ["DEFAULT_EPHEMERAL_S", "MAX_SCAN_ITEMS", "cache_ttl_s", "duration_s"]

DEFAULT_EPHEMERAL_S = 300.0  # Anthropic's `ephemeral` without a ttl; OpenAI's in-memory retention
MAX_SCAN_ITEMS = 4096  # content blocks looked at per request: a huge history costs bounded time
_RETENTION_S = {"in_memory": DEFAULT_EPHEMERAL_S, "in-memory": DEFAULT_EPHEMERAL_S, "24h": 86400.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd])\s*$")
_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def duration_s(value: Any) -> float | None:
    """`"5m"` -> 300.0; None for anything else than a positive `<n><unit>`."""
    if not isinstance(value, str):
        return None
    m = _DURATION.match(value)
    if not m:
        return None
    seconds = float(m.group(1)) * _UNIT_S[m.group(2)]
    return seconds if seconds > 0 else None


def cache_ttl_s(body: Mapping[str, Any]) -> float | None:
    """The longest cache TTL the request body asks for (module docstring); None: none."""
    if not isinstance(body, Mapping):
        return None
    found = [_marker_s(body.get("cache_control")), _RETENTION_S.get(body.get("prompt_cache_retention"))]
    options = body.get("prompt_cache_options")
    if isinstance(options, Mapping):
        found.append(duration_s(options.get("ttl")))
    budget = [MAX_SCAN_ITEMS]
    for field in ("system", "tools", "messages"):
        found.append(_longest_marker(body.get(field), budget))
    found = [s for s in found if s is not None]
    return max(found) if found else None


def _marker_s(marker: Any) -> float | None:
    if not isinstance(marker, Mapping) or marker.get("type") != "ephemeral":
        return None
    return duration_s(marker["ttl"]) if "ttl" in marker else DEFAULT_EPHEMERAL_S


def _longest_marker(node: Any, budget: list[int]) -> float | None:
    """The longest `cache_control` TTL among `node`'s blocks (a list of blocks, or of
    messages whose `content` is a list of blocks), looking at `budget` items at most."""
    if not isinstance(node, list):
        return None
    best = None
    for item in node:
        budget[0] -= 1
        if budget[0] < 0:
            break
        if not isinstance(item, Mapping):
            continue
        ttl = _marker_s(item.get("cache_control"))
        inner = item.get("content")
        if isinstance(inner, list):
            nested = _longest_marker(inner, budget)
            ttl = nested if ttl is None or (nested is not None and nested > ttl) else ttl
        if ttl is not None and (best is None or ttl > best):
            best = ttl
    return best
