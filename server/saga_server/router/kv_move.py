"""Move a session's prefix KV from one engine to another: pulled over NIXL where both
run the NIXL connector (`saga serve --kv-transfer nixl`), re-prefilled otherwise.

    move = move_prefix("http://10.0.0.1:8000", "http://10.0.0.2:8000", model, prompt_ids)
    move.pulled     # True: the target read the source's blocks; False: it recomputed them
    move.fallback   # why not pulled ("" when pulled)

    # any one-token request body and API path, through a front that routes by header:
    move = move_kv(Endpoint(ingress, {"X-Session-ID": to_source}), Endpoint(ingress, {"X-Session-ID": to_target}),
                   chat_body, path="/v1/chat/completions")

Contract: after `move_prefix` returns with `move.warm`, the target's prefix cache
holds the prompt's full blocks, so the session's next request there (this prompt
plus what came since) computes only the new tokens. Both ways go through the
engines' OpenAI API (`/v1/completions`, one output token):

1. the source gets the prompt with `kv_transfer_params: {"do_remote_decode": true}`:
   it hits its own cache, holds the blocks for the pull (until the pull is done or
   the connector's lease ends) and answers with the transfer handle;
2. the target gets the same prompt with that handle: it pulls the blocks, computes
   the last token only and caches what it pulled.

Any failure on the way (no handle: the source is gone or runs without NIXL; a pull
the target reports failed) falls back to re-prefilling the prompt on the target, as
before NIXL; only when that fails too is the move not warm. Nothing raises: a move
is the router's background work and must never fail an agent's request.

vLLM reports `cached_tokens` 0 for a pulled request (the KV arrives on its load
path, not from its prefix cache), so `PrefixMove.pulled_tokens` is the count to use.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Mapping

import httpx

__all__ = ["Endpoint", "PrefixMove", "move_kv", "move_prefix"]


@dataclass(frozen=True, slots=True)
class Endpoint:
    url: str  # an engine's (or a routing front's) base URL, e.g. http://127.0.0.1:8000
    headers: Mapping[str, str] = field(default_factory=dict)  # e.g. the session id a front routes by


@dataclass(frozen=True, slots=True)
class PrefixMove:
    prompt_tokens: int  # the prefix moved (as the target counted it; 0 when unknown)
    pulled: bool  # read from the source over NIXL (False: re-prefilled, or nothing)
    warm: bool  # the target holds the prefix now
    seconds: float  # handle + pull, or handle attempt + re-prefill
    fallback: str = ""  # why it was not pulled

    @property
    def pulled_tokens(self) -> int:
        return self.prompt_tokens if self.pulled else 0


def move_prefix(source: str, target: str, model: str, prompt: list[int] | str, *,
                timeout_s: float = 120.0, client: httpx.Client | None = None) -> PrefixMove:
    """Move `prompt`'s KV from the engine at `source` to the one at `target` (base
    URLs, e.g. http://127.0.0.1:8000); see the module docstring."""
    body = {"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0.0}
    return move_kv(Endpoint(source), Endpoint(target), body, timeout_s=timeout_s, client=client)


def move_kv(source: Endpoint, target: Endpoint, body: dict, *, path: str = "/v1/completions",
            timeout_s: float = 120.0, client: httpx.Client | None = None) -> PrefixMove:
    """`move_prefix` for any one-token request `body` (its prompt or messages are the
    prefix; `max_tokens` 1, not streamed) to `path` of both endpoints."""
    own = client is None
    client = client or httpx.Client(timeout=timeout_s)
    started = time.perf_counter()
    try:
        handle, why = _transfer_handle(client, source, path, body)
        if handle is not None:
            tokens, why = _complete(client, target, path, {**body, "kv_transfer_params": handle})
            if tokens is not None:
                return PrefixMove(tokens, True, True, time.perf_counter() - started)
        tokens, failed = _complete(client, target, path, body)
        return PrefixMove(tokens or 0, False, tokens is not None, time.perf_counter() - started,
                          why if tokens is not None else f"{why}; re-prefill failed too: {failed}")
    finally:
        if own:
            client.close()


def _transfer_handle(client: httpx.Client, source: Endpoint, path: str, body: dict) -> tuple[dict | None, str]:
    """The source's `kv_transfer_params` for the prompt, or (None, why not)."""
    try:
        response = client.post(source.url.rstrip("/") + path, headers=dict(source.headers),
                               json={**body, "kv_transfer_params": {"do_remote_decode": True}})
    except httpx.HTTPError as exc:
        return None, f"source unreachable ({type(exc).__name__})"
    if response.status_code != 200:
        return None, f"source answered HTTP {response.status_code}"
    try:
        handle = response.json().get("kv_transfer_params")
    except ValueError:
        return None, "source answered no JSON"
    if not isinstance(handle, dict) or not handle.get("remote_block_ids"):
        return None, "source gave no transfer handle (it runs without the NIXL connector)"
    return handle, ""


def _complete(client: httpx.Client, target: Endpoint, path: str, body: dict) -> tuple[int | None, str]:
    """One-token completion on the target: its prompt tokens, or (None, why not)."""
    try:
        response = client.post(target.url.rstrip("/") + path, headers=dict(target.headers), json=body)
    except httpx.HTTPError as exc:
        return None, f"target unreachable ({type(exc).__name__})"
    if response.status_code != 200:
        return None, f"{'pull' if 'kv_transfer_params' in body else 're-prefill'} failed (HTTP {response.status_code})"
    try:
        return int(response.json()["usage"]["prompt_tokens"]), ""
    except (ValueError, KeyError, TypeError):
        return None, "target answered no usage"
