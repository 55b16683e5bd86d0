"""`SagaProxy`: the ASGI app behind `saga proxy`.

Every request is forwarded to the upstream OpenAI-compatible server with its
method, path, query, headers (hop-by-hop ones excepted) and body; the upstream's
status, headers and body come back unchanged, a `text/event-stream` one chunk by
chunk as it arrives. Agent requests are additionally read on the way, each by its
API's adapter: Chat Completions (`.../chat/completions`), Responses
(`.../responses`) and Anthropic Messages (`.../messages`), JSON or streamed.
`SessionTracker` names their session, the session id is added to the forwarded
request (`X-Session-ID` header; and, where the API's vLLM server reads one, the
body field `session_id`, unless the body has one or `inject_body_session_id` is
off), and hints go to the hint service through a `HintClient`, which never blocks
(`hints.send_hint`).
(The header only when the id is a valid header value: an id from the body may hold
control characters, which must not reach the upstream as a broken request.)
`/v1/completions` requests that carry an explicit session id are tracked the same
way (a bare prompt has no messages to match). Each answer is learnt before the
agent can see its end (a JSON body before it is sent, a stream before the event
that ends it: `[DONE]`, `response.completed`, `message_stop`), without holding the
stream back, so an agent that fires its next step at once still finds its session
and its tool calls. A client that goes away before its streamed answer is whole
leaves its session to end unless it comes back (`SessionTracker.fail`).

Tenants (`tenants`): given a `Tenants` (`saga proxy --api-keys FILE`), every
request but `GET /health` must carry a key of its ring, else it gets 401
(`invalid_api_key`) and nothing is forwarded; an agent request of tenant T then
goes upstream with T's session ids (`<T>/<id>`), T's `cache_salt`, and its new
sessions start as T's. Without one every caller is tenant "" and requests go as
described above.

Failure rules: the agent must not notice SAGA. Anything that goes wrong in
session inference or hinting is logged once and the request is forwarded as is.
An upstream error response is returned unchanged; a request whose connection failed
before any answer is sent once more on another; an unreachable or timed-out
upstream then gets a 502/504 with an OpenAI-style JSON error naming the proxy; a stream
the upstream cuts short is cut short for the client too (never ended as if whole);
a client that goes away closes the upstream request, and one that goes away before
its request is whole has nothing forwarded; a body the proxy cannot parse (not JSON,
invalid UTF-8, nested too deep) is forwarded untouched for the upstream to answer;
an internal error answers 500 naming the proxy. Headers are never logged, and only
session ids, tool names and call ids ever reach hints, never the caller's key.
A `recorder` (`saga proxy --record`, `saga_server.proxy.recording`) is handed the same
events; it only enqueues them, and never blocks or fails a request.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence
from urllib.parse import urlsplit

import anyio
import httpx
from starlette.responses import JSONResponse, StreamingResponse

from saga_sdk import HintClient
from saga_sdk.logs import LogOnce

from .actions import TextActions
from .chat import CHAT
from .messages import MESSAGES
from .responses import RESPONSES
from .hints import Hint, send_hint
from .sessions import Exchange, SessionTracker
from .tenants import Tenants

__all__ = ["ProxyConfig", "SagaProxy", "tracker_for"]

log = logging.getLogger("saga_server.proxy")

_KEEPALIVE_EXPIRY_S = 2.0  # under the upstream's keep-alive timeout (see `_pool`)
# Failures of a connection before the upstream answered anything (see `_send`).
_RETRIED_BEFORE_AN_ANSWER = (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)
# An HTTP field value (RFC 9110 5.5) without tabs: visible bytes, inner spaces.
_FIELD_VALUE = re.compile(rb"[\x21-\x7e\x80-\xff](?:[\x20-\x7e\x80-\xff]*[\x21-\x7e\x80-\xff])?")
_FINAL_HEADER = b"x-saga-session-final"  # what the engine reads as X-Session-ID's last-request marker
# Hop-by-hop headers (RFC 9110 7.6.1) and the ones httpx recomputes.
_REQUEST_DROP = {b"host", b"content-length", b"connection", b"keep-alive", b"proxy-connection", b"te",
                 b"trailer", b"transfer-encoding", b"upgrade", b"proxy-authorization"}
_RESPONSE_DROP = {b"connection", b"keep-alive", b"proxy-connection", b"te", b"trailer",
                  b"transfer-encoding", b"upgrade"}


@dataclass(frozen=True, slots=True)
class ProxyConfig:
    upstream: str                        # the upstream's OpenAI base URL, e.g. http://127.0.0.1:8000/v1
    inject_body_session_id: bool = True  # off for upstreams that reject unknown body fields
    max_sessions: int = 10_000
    idle_ttl_s: float = 600.0            # the longest a quiet session lasts (the learnt timeout's bound)
    idle_min_s: float = 30.0             # the shortest
    abandon_grace_s: float = 15.0        # a session whose client went away mid-answer ends this much later
    text_actions: TextActions | None = TextActions()  # None: no tool calls read from text
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 600.0
    max_body_bytes: int = 64 << 20
    max_connections: int = 1000
    # httpcore's pool does O(connections^2) work per request once many connections are
    # idle; several small pools keep that cost flat at 50+ concurrent agents.
    upstream_pools: int = 16

    def __post_init__(self) -> None:
        parts = urlsplit(self.upstream)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"upstream must be an http(s) URL, e.g. http://127.0.0.1:8000/v1; got {self.upstream!r}")


def tracker_for(config: ProxyConfig) -> SessionTracker:
    """The session tracker a proxy of `config` runs."""
    return SessionTracker(max_sessions=config.max_sessions, idle_ttl_s=config.idle_ttl_s,
                          idle_min_s=config.idle_min_s, abandon_grace_s=config.abandon_grace_s,
                          text_actions=config.text_actions)


class SagaProxy:
    """ASGI app; see the module docstring for the contract."""

    def __init__(self, config: ProxyConfig, *, hints: HintClient | None = None,
                 tracker: SessionTracker | None = None, recorder=None, tenants: Tenants | None = None,
                 on_close: Sequence[Callable[[], None]] = ()) -> None:
        """`on_close`: called in order as the proxy stops, once its sessions have
        ended (`saga proxy` writes its learnt state and closes its recorder there:
        uvicorn re-raises the SIGTERM it handled, so nothing after its run returns)."""
        self.config = config
        self.on_close = tuple(on_close)
        self.hints = hints if hints is not None else HintClient()
        self.recorder = recorder  # a `saga_server.record.Recorder`; the caller's, like `hints`
        self.tenants = tenants
        self.tracker = tracker or tracker_for(config)
        parts = urlsplit(config.upstream)
        prefix = parts.path.rstrip("/")
        if prefix.endswith("/v1"):
            prefix = prefix[:-3]
        # Origin without user info: this string appears in error bodies and logs.
        self._origin = f"{parts.scheme}://{parts.hostname}{':' + str(parts.port) if parts.port else ''}"
        self._base = f"{parts.scheme}://{parts.netloc}{prefix}"
        self._pools: list[httpx.AsyncHTTPTransport] = []
        self._timeout = httpx.Timeout(connect=config.connect_timeout_s, read=config.read_timeout_s,
                                      write=config.read_timeout_s, pool=config.connect_timeout_s).as_dict()
        self._next_pool = 0
        self._expiry: asyncio.Task | None = None
        self._log_once = LogOnce(log)
        self.errors = {"upstream_unreachable": 0, "upstream_timeout": 0, "stream_broken": 0, "internal": 0}
        self.upstream_retries = 0  # requests sent again after a connection failed unanswered (not errors)

    # -- ASGI -------------------------------------------------------------------------

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            await self._http(scope, receive, send)
        elif scope["type"] == "lifespan":
            await self._lifespan(receive, send)

    async def _lifespan(self, receive, send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self._pool()
                self._expiry = asyncio.get_running_loop().create_task(self._expire_loop())
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def aclose(self) -> None:
        """End all sessions, flush hints briefly, close the upstream pool. The ASGI
        lifespan's shutdown calls it, and so does leaving `async with proxy:` (for
        a proxy driven without a server). The `HintClient` stays open: it is the caller's."""
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        self._emit(self.tracker.close())
        for close in self.on_close:
            await asyncio.to_thread(close)
        await asyncio.to_thread(self.hints.flush, 1.0)
        pools, self._pools = self._pools, []
        for pool in pools:
            await pool.aclose()

    async def __aenter__(self) -> "SagaProxy":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    # -- one request --------------------------------------------------------------------

    async def _http(self, scope, receive, send) -> None:
        started = False

        async def tracked_send(message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self._forward(scope, receive, tracked_send)
        except UpstreamBroke:
            raise  # abort the client's connection: its stream was cut upstream
        except Exception:
            self.errors["internal"] += 1
            self._log_once("internal", "internal error while proxying a request", exc_info=True)
            if started:
                raise
            await _error(500, "saga proxy: internal error (see the proxy's log)", "proxy_internal_error")(
                scope, receive, send)

    async def _forward(self, scope, receive, send) -> None:
        method, path = scope["method"], scope["path"]
        tenant = ""
        if self.tenants is not None and (method, path) != ("GET", "/health"):
            tenant = self.tenants.tenant_of(scope["headers"])
            if tenant is None:
                self._log_once("invalid_api_key", "refusing requests without a known API key (counted)")
                await _error(401, "saga proxy: missing or unknown API key", "invalid_api_key")(scope, receive, send)
                return
        try:
            body = await self._read_body(receive)
        except ClientGone:
            return  # nobody to answer; and a cut request must not reach the upstream as if whole
        if body is None:
            await _error(413, f"saga proxy: request body over {self.config.max_body_bytes} bytes",
                         "request_too_large")(scope, receive, send)
            return
        headers = [(k, v) for k, v in scope["headers"] if k not in _REQUEST_DROP]
        exchange, api = None, _api(method, path)
        if api is not None:
            body, headers, exchange = self._observe_request(api, path, body, headers, tenant)
        target = self._base + scope.get("raw_path", path.encode()).decode("latin-1")
        if scope.get("query_string"):
            target += "?" + scope["query_string"].decode("latin-1")
        request = httpx.Request(method, target, headers=headers, content=body, extensions={"timeout": self._timeout})
        try:
            upstream = await self._send(request)
        except httpx.TimeoutException as exc:
            await self._upstream_failed(exchange, "upstream_timeout", exc)
            await _error(504, f"saga proxy: upstream {self._origin} timed out ({type(exc).__name__})",
                         "upstream_timeout")(scope, receive, send)
            return
        except httpx.HTTPError as exc:
            await self._upstream_failed(exchange, "upstream_unreachable", exc)
            await _error(502, f"saga proxy: upstream {self._origin} unreachable ({type(exc).__name__})",
                         "upstream_unreachable")(scope, receive, send)
            return
        response_headers = [(k, v) for k, v in upstream.headers.raw if k.lower() not in _RESPONSE_DROP]
        is_sse = upstream.headers.get("content-type", "").startswith("text/event-stream")
        reader = None
        if exchange is not None and upstream.status_code < 400 and \
                upstream.headers.get("content-encoding", "identity") == "identity":
            reader = api.reader(is_sse)
        if is_sse or exchange is None:
            response = StreamingResponse(self._relay(upstream, exchange, reader), status_code=upstream.status_code)
            response.raw_headers = response_headers
            await response(scope, receive, send)
            return
        # A non-streamed answer: small, read whole, sent in one piece.
        try:
            data = b"".join([chunk async for chunk in upstream.aiter_raw()])
        except httpx.HTTPError as exc:
            await upstream.aclose()
            await self._upstream_failed(exchange, "stream_broken", exc)
            await _error(502, f"saga proxy: upstream {self._origin} broke off its response "
                              f"({type(exc).__name__})", "upstream_broken")(scope, receive, send)
            return
        await upstream.aclose()
        # Learn the answer before the agent can see it (and send its next request).
        self._finish(exchange, reader, data if reader is not None else None, upstream.status_code < 400)
        await send({"type": "http.response.start", "status": upstream.status_code, "headers": response_headers})
        await send({"type": "http.response.body", "body": data})

    async def _send(self, request: httpx.Request) -> httpx.Response:
        """The upstream's response head to `request`, sent again once, on the next pool,
        when the connection failed before any answer came: a pooled connection the
        upstream closed as the request went out (a keep-alive race that a proxy whose
        loop is slowed by load cannot rule out by expiry alone) answers nothing, and
        an upstream that took the request in and then died is refused again. Timeouts
        are never retried: the upstream may still be working on the request."""
        try:
            upstream = await self._pool().handle_async_request(request)
        except _RETRIED_BEFORE_AN_ANSWER:
            self.upstream_retries += 1
            upstream = await self._pool().handle_async_request(request)
        upstream.request = request
        return upstream

    async def _relay(self, upstream: httpx.Response, exchange: Exchange | None, reader):
        """Pass the upstream body on chunk by chunk. Each chunk is read before it goes
        out, and the exchange is finished before the chunk carrying the answer's end does:
        an agent that sends its next request the moment it sees the end must find
        this answer already learnt. Runs to its `finally` however the client leaves."""
        completed = finished = broke = False
        try:
            async for chunk in upstream.aiter_raw():
                if reader is not None and not finished:
                    try:
                        reader.feed(chunk)
                    except Exception:
                        self._log_once("reader", "cannot read a streamed answer; not learning from it",
                                       exc_info=True)
                        reader = None
                    if reader is not None and reader.done:
                        finished = True
                        self._finish(exchange, reader, None, upstream.status_code < 400)
                yield chunk
            completed = True
        except httpx.HTTPError as exc:
            # Break the client's stream too: ending it cleanly would pass a cut answer off as whole.
            broke = True
            self.errors["stream_broken"] += 1
            self._log_once("broken", "upstream broke off a streamed response (%s)", type(exc).__name__)
            raise UpstreamBroke(f"upstream {self._origin} broke off its stream ({type(exc).__name__})") from None
        finally:
            with anyio.CancelScope(shield=True):
                await upstream.aclose()
            if exchange is not None and not finished:
                if completed and reader is not None and upstream.status_code < 400:
                    self._finish(exchange, reader, None, True)
                else:  # cut short: by the upstream, or by a client that went away
                    self._emit(self._safe(self.tracker.fail, exchange, abandoned=not completed and not broke))

    # -- session inference around the request ------------------------------------------

    def _observe_request(self, api, path: str, body: bytes, headers: list,
                         tenant: str) -> tuple[bytes, list, Exchange | None]:
        try:
            parsed = json.loads(body) if body else None
        except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser goes
            return body, headers, None  # the upstream answers bad JSON with its own error
        if not isinstance(parsed, dict):
            return body, headers, None
        exchange = self._begin(api, path, parsed, headers, tenant)
        if exchange is not None:
            # The id may come from the body, where anything goes: put it in a header only
            # when it is a valid header value (else the caller's own header, if any, stays).
            sid = exchange.session_id.encode("latin-1", "replace")
            in_header = _FIELD_VALUE.fullmatch(sid) is not None
            dropped = (b"x-session-id", b"accept-encoding") if in_header else (b"accept-encoding",)
            headers = [(k, v) for k, v in headers if k.lower() not in dropped + (_FINAL_HEADER,)]
            headers += ([(b"x-session-id", sid)] if in_header else []) + [(b"accept-encoding", b"identity")]
            if exchange.final and in_header:  # the engine ends it as this request finishes, as the proxy does
                headers.append((_FINAL_HEADER, b"true"))
        elif tenant:  # no session: none of the caller's own ids may reach the upstream
            headers = [(k, v) for k, v in headers if k.lower() != b"x-session-id"]
        add_session_id = api.body_session_field and self.config.inject_body_session_id
        if tenant:
            body = self.tenants.isolate(parsed, tenant, exchange and exchange.session_id,
                                        add_session_id=add_session_id)
        elif exchange is not None and add_session_id and "session_id" not in parsed:
            body = _with_field(body, "session_id", exchange.session_id)
        return body, headers, exchange

    def _begin(self, api, path: str, parsed: dict, headers: list, tenant: str) -> Exchange | None:
        """The request's exchange, its hints sent; None when it is not tracked."""
        try:
            lower = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in headers}
            request = api.read(parsed, lower)
            if path.endswith("/completions") and not path.endswith("chat/completions") and request.explicit is None:
                return None
            exchange, events = self.tracker.begin(replace(request, tenant=tenant) if tenant else request)
        except Exception:
            self.errors["internal"] += 1
            self._log_once("begin", "session inference failed; forwarding without a session", exc_info=True)
            return None
        self._emit(events)
        return exchange

    def _finish(self, exchange: Exchange, reader, data: bytes | None, ok: bool) -> None:
        if not ok or reader is None:
            self._emit(self._safe(self.tracker.fail, exchange))
            return
        try:
            if data is not None:
                reader.feed(data)
            reply = reader.result()
            events = self.tracker.finish(exchange, reply) if reply is not None else self.tracker.fail(exchange)
        except Exception:
            self.errors["internal"] += 1
            self._log_once("finish", "cannot learn from an answer", exc_info=True)
            events = self._safe(self.tracker.fail, exchange)
        self._emit(events)

    async def _upstream_failed(self, exchange: Exchange | None, kind: str, exc: Exception) -> None:
        self.errors[kind] += 1
        self._log_once(kind, "upstream %s: %s (%s)", self._origin, kind.replace("_", " "), type(exc).__name__)
        if exchange is not None:
            self._emit(self._safe(self.tracker.fail, exchange))

    def _safe(self, fn, *args, **kwargs) -> list[Hint]:
        try:
            return fn(*args, **kwargs)
        except Exception:
            self.errors["internal"] += 1
            self._log_once(fn.__name__, "session tracker failed", exc_info=True)
            return []

    def _emit(self, events: list[Hint]) -> None:
        if events and self.recorder is not None:
            self.recorder.submit(events)
        for hint in events:
            try:
                send_hint(self.hints, hint.event)
            except Exception:
                self._log_once("emit", "dropping a hint after an internal error", exc_info=True)

    # -- plumbing --------------------------------------------------------------------------

    def _pool(self) -> httpx.AsyncHTTPTransport:
        """The next upstream connection pool, round robin (made on first use).

        Transports, not `httpx.AsyncClient`s: a client would keep a cookie jar shared
        by every caller (one agent's cookies sent with another's requests), follow
        redirects and re-apply auth, none of which a proxy may do. Idle connections
        are dropped before the upstream would: vLLM's server closes them after 5 s
        (`VLLM_HTTP_TIMEOUT_KEEP_ALIVE`), httpx's default expiry, and a request sent on
        one the server is closing at that moment fails (seen with 200 agents)."""
        if not self._pools:
            c = self.config
            count = max(1, c.upstream_pools)
            ssl_context = httpx.create_ssl_context()  # one for all pools: each costs milliseconds
            self._pools = [httpx.AsyncHTTPTransport(
                verify=ssl_context, retries=0,
                limits=httpx.Limits(max_connections=max(1, c.max_connections // count),
                                    max_keepalive_connections=max(1, 200 // count),
                                    keepalive_expiry=_KEEPALIVE_EXPIRY_S))
                for _ in range(count)]
        self._next_pool = (self._next_pool + 1) % len(self._pools)
        return self._pools[self._next_pool]

    async def _read_body(self, receive) -> bytes | None:
        """The request body; None when it is over `max_body_bytes`. Raises
        `ClientGone` when the client left before sending all of it."""
        parts, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ClientGone
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.config.max_body_bytes:
                return None
            parts.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(parts)

    async def _expire_loop(self) -> None:
        while True:
            await asyncio.sleep(self.tracker.sweep_period_s)
            self._emit(self._safe(self.tracker.expire))



class UpstreamBroke(Exception):
    """Raised into the ASGI server to abort a relayed stream the upstream cut short."""


class ClientGone(Exception):
    """The client disconnected before its request body was whole."""


def _error(status: int, message: str, code: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": "saga_proxy_error", "code": code}},
                        status_code=status)


def _api(method: str, path: str):
    """The adapter for an agent request, or None for anything else (passed through only)."""
    if method != "POST":
        return None
    if path.endswith("completions"):  # chat; or legacy completions, tracked with an explicit id only
        return CHAT
    if path.endswith("/responses"):
        return RESPONSES
    if path.endswith("/messages"):
        return MESSAGES
    return None


def _with_field(body: bytes, name: str, value: Any) -> bytes:
    """Add a field to a JSON object's raw bytes without re-serialising the rest
    (the caller's bytes stay as they were, and big bodies cost nothing extra)."""
    stripped = body.lstrip()
    if not stripped.startswith(b"{"):
        return body
    rest = stripped[1:]
    field = json.dumps(name).encode() + b":" + json.dumps(value).encode()
    return b"{" + field + (b"," if rest.lstrip()[:1] != b"}" else b"") + rest
