"""Many hosts: SAGA on Ray Serve LLM (`saga router`).

- `replica.SagaLLMServer`: Ray's `LLMServer` with a per-replica SAGA hint
  service inside its vLLM engine and a routing report (`report.ReplicaReport`:
  sessions held, sessions in a tool call, KV held, service per tenant) for the
  request router.
- `request_router.SagaRequestRouter`: Ray Serve `RequestRouter` applying
  `saga_server.core.routing` (affinity, deterministic homes, work stealing with
  speculative re-prefill on the target).
- `kv_move`: a session's prefix KV pulled from one engine into another over
  NIXL, re-prefilled when it cannot be (engines' HTTP API only; no Ray).
- `hints.FanOutSink`: one hint endpoint for the whole cluster.
- `cli`: `saga router` deploys it all.

Modules import Ray only when used (`saga router --help` works without it).
"""

__all__: list[str] = []
