"""`Prefetcher`: brings a paused session's evicted KV back before its next request.

When the core plans it (`WorkflowCore.plan_prefetch`) for a session whose hold lost
blocks, and the engine has spare capacity (nothing waiting, few running, no other
prefetch in flight), the session's last known tokens are re-prefilled as an internal
one-token request whose output never leaves the engine; its prefix is then held
(soft) until the session's next request hits it. While requests run, a prefetch
starts when the plan says (just before the predicted resume); on an idle engine at
once, since idle capacity costs nothing. vLLM's EngineCore steps once more after its
last request finishes (to report it); that step sees the idle engine and issues the
prefetch, and each prefetch's own finish gives the next step, so due prefetches chain.
A prefetch that only becomes due later waits for the next request.

The prefetch is an ordinary request to vLLM, so with a CPU offload tier
(`--kv-offloading-size`, vLLM's `OffloadingConnector`) its prefix is loaded from the
tier instead of recomputed. It never displaces held KV (`SagaPlugin.allocate`).
"""

from __future__ import annotations

import collections

from vllm.sampling_params import SamplingParams
from vllm.v1.request import Request, RequestStatus

from saga_server.core import PrefetchCandidate

__all__ = ["Prefetcher", "PREFETCH_PREFIX", "is_prefetch"]

PREFETCH_PREFIX = "saga-prefetch-"
_KNOWN_TOKENS_SESSIONS = 4096  # sessions whose last token ids are remembered


def is_prefetch(request_id: str) -> bool:
    return request_id.startswith(PREFETCH_PREFIX)


class Prefetcher:
    def __init__(self, scheduler, core, kv, counters, clock) -> None:
        """`kv`: the engine's `SessionKvPolicy` (what a prefetched prefix becomes is its rule)."""
        self.scheduler = scheduler
        self.clock = clock
        self.core = core
        self.kv = kv
        self.ledger = kv.ledger
        self.counters = counters
        self.block_size = scheduler.block_size
        self.block_hasher = None  # vLLM's, taken from the first session request
        self._known: collections.OrderedDict[str, list[int]] = collections.OrderedDict()
        self._in_flight: dict[str, str] = {}  # session -> internal request id
        self._ready: set[str] = set()  # sessions whose prefetched KV awaits use
        self._seq = 0

    @property
    def ever_issued(self) -> bool:
        return self._seq > 0

    def remember(self, session_id: str, request: Request) -> None:
        """The session's request finished: its tokens are what a prefetch recomputes."""
        known = self._known
        known[session_id] = list(request.all_token_ids)
        known.move_to_end(session_id)
        while len(known) > _KNOWN_TOKENS_SESSIONS:
            known.popitem(last=False)

    def table_sizes(self) -> dict[str, int]:
        """Entries of its per-session tables (each bounded or forgotten with the session)."""
        return {"prefetch_known": len(self._known), "prefetch_in_flight": len(self._in_flight),
                "prefetch_ready": len(self._ready)}

    def forget(self, session_id: str, *, ended: bool) -> None:
        """The session ended (`ended`) or left this engine (moved, idled out, evicted
        from the core's table): told by the policy's lifecycle (`on_forget`)."""
        self._known.pop(session_id, None)
        if session_id in self._ready:
            self._ready.discard(session_id)
            if ended:
                self.counters.count("prefetch", "wasted")

    def on_scheduled(self, session_id: str, hit_tokens: int) -> None:
        """The session's next request was scheduled with this prefix hit."""
        if session_id in self._ready:
            self._ready.discard(session_id)
            self.counters.count("prefetch", "used" if hit_tokens else "wasted")

    def maybe_issue(self, now: float) -> None:
        sid = self._next(now)
        if sid is not None:
            self._issue(sid)

    def on_finished(self, request: Request, blocks: list) -> None:
        """An internal request finished: hold its prefix for the session's next request."""
        sid = request.session_id
        if sid is None:
            return
        self._in_flight.pop(sid, None)
        if request.status == RequestStatus.FINISHED_ABORTED or not blocks:
            return
        self.kv.loaded(sid, self.clock(), blocks=blocks)
        self._ready.add(sid)

    def hide(self, outputs):
        """Internal requests have no client: drop their outputs before they leave."""
        for eco in outputs.values():
            if eco.outputs:
                eco.outputs = [o for o in eco.outputs if not is_prefetch(o.request_id)]
            if eco.finished_requests:
                eco.finished_requests = {r for r in eco.finished_requests if not is_prefetch(r)}
        return outputs

    def _next(self, now: float) -> str | None:
        """The session to re-prefill now, if any (one at a time, spare capacity only)."""
        sched = self.scheduler
        if self.block_hasher is None or sched.waiting or sched.kv_holding_waiting:
            return None
        if len(sched.running) >= max(1, sched.max_num_running_reqs // 4):
            return None
        if any(is_prefetch(r.request_id) for r in sched.running):
            return None  # one at a time: prefetch must never crowd out real work
        idle = not sched.running
        bs = self.block_size
        candidates = []
        for sid, tokens in self._known.items():
            if sid in self._ready or sid in self._in_flight:
                continue
            missing = (len(tokens) - 1) // bs * bs - self.ledger.blocks_of(sid) * bs
            if missing >= bs * 2:
                candidates.append(PrefetchCandidate(sid, len(tokens), 0.0))
        if not candidates:
            return None
        free_tokens = self.ledger.pool.num_free() * bs
        for action in self.core.plan_prefetch(candidates, free_tokens)[:1]:
            if idle or action.start_at <= now:
                return action.session_id
        return None

    def _issue(self, sid: str) -> None:
        tokens = self._known.get(sid)
        if not tokens:
            return
        self._seq += 1
        rid = f"{PREFETCH_PREFIX}{self._seq}"
        req = Request(rid, list(tokens), SamplingParams(max_tokens=1), None, block_hasher=self.block_hasher,
                      session_id=sid)
        self._in_flight[sid] = rid
        self.scheduler.add_request(req)  # the plugin's arrival hook skips internal requests
        self.counters.count("prefetch", "issued")
