"""One two-replica `saga router` (Ray Serve LLM + vLLM + SAGA) shared by this folder.

`ray_cluster` (module scope) yields a `RayCluster`. With `SAGA_TEST_RAY_URL`
(e.g. http://127.0.0.1:8123) and `SAGA_TEST_RAY_HINTS` set, that running
cluster is used and never stopped; otherwise ONE `saga router --replicas 2` is
started on free ports (~2 min, ~7.5 GB; with `--kv-transfer nixl` where NIXL is
installed) and stopped (Ray included) at the end.
Needs `ray[serve]==2.60.0` (see README "Many hosts"); skipped without it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from saga_server.serve_child import free_port
from tests.support.http import REQUEST_TIMEOUT_S, post_chat

ROOT = Path(__file__).resolve().parents[3]
KV_PREFIX = "saga:hint:"


@dataclass
class RayCluster:
    base_url: str
    hint_addr: str
    model: str
    metrics_url: str | None = None  # the cluster's /metrics (only for a cluster started here)
    kv_transfer: str | None = None  # "nixl": stolen sessions' KV is pulled (only for a cluster started here)

    def chat(self, messages, *, session_id: str | None = None, timeout: float = REQUEST_TIMEOUT_S, **body) -> dict:
        return post_chat(self.base_url + "/v1/chat/completions", self.model, messages, session_id=session_id,
                         timeout=timeout, **body)

    def replica_hints(self) -> dict[str, str]:
        """replica unique id -> its engine's hint endpoint (from Ray's internal KV)."""
        from ray.experimental import internal_kv

        out = {}
        for key in internal_kv._internal_kv_list(KV_PREFIX) or []:
            addr = internal_kv._internal_kv_get(key)
            k = key.decode() if isinstance(key, bytes) else key
            if addr:
                out[k[len(KV_PREFIX):]] = addr.decode() if isinstance(addr, bytes) else addr
        return out

    def router_stats(self) -> dict:
        """What the SAGA request router last published (routing counters, steals)."""
        from ray.experimental import internal_kv

        raw = internal_kv._internal_kv_get("saga:router:stats")
        return json.loads(raw) if raw else {}

    def live_replicas(self) -> list[str]:
        """The replicas the SAGA router routes to now (a replaced replica's hint
        address stays in `replica_hints`)."""
        routing = self.router_stats().get("routing", {})
        return sorted(k[len("replica_sessions{"):-1] for k in routing if k.startswith("replica_sessions{"))

    def wait_for_replicas(self, replicas: int, timeout_s: float) -> None:
        """Until `replicas` engines have registered and the router routes to them all."""
        deadline = time.monotonic() + timeout_s
        while len(self.replica_hints()) < replicas and time.monotonic() < deadline:
            time.sleep(1)
        _wait_until_the_router_sees(self, replicas, deadline)

    def resident(self) -> dict[str, set[str]]:
        """replica id -> sessions whose KV its engine holds (live, not moved away;
        unreachable replicas: skipped)."""
        from saga_sdk import HintReader

        out = {}
        for rid, addr in self.replica_hints().items():
            try:
                with HintReader(addr, timeout=2) as r:
                    out[rid] = {s.session_id for s in r.resident(1000)}
            except Exception:
                pass
        return out


def _ready(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url + "/v1/models", timeout=5) as resp:
            data = json.loads(resp.read()).get("data")
            return data[0]["id"] if data else None
    except Exception:
        return None


def _wait_until_the_router_sees(cluster: "RayCluster", replicas: int, deadline: float) -> None:
    """Serve hands the request router its replica list some time after the
    deployment is ready; a session whose first request comes before that is homed
    among fewer replicas (and rightly stays there). Session-less probes make the
    router refresh and publish its view until it holds every replica."""
    while time.monotonic() < deadline:
        try:
            cluster.chat([{"role": "user", "content": "ping"}], max_tokens=1)
        except Exception:
            pass
        seen = [k for k in cluster.router_stats().get("routing", {}) if k.startswith("replica_sessions{")]
        if len(seen) >= replicas:
            return
        time.sleep(1)
    raise TimeoutError(f"the SAGA router never saw {replicas} replicas")


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    pytest.importorskip("ray.serve.llm", reason="Ray Serve LLM not installed (pip install 'ray[serve]==2.60.0')")
    import ray

    url, hints = os.environ.get("SAGA_TEST_RAY_URL"), os.environ.get("SAGA_TEST_RAY_HINTS")
    proc = None
    metrics_url = kv_transfer = None
    if not (url and hints):
        pytest.importorskip("vllm", reason="vLLM not installed (scripts/setup.sh)")
        port, hint_port, metrics_port = free_port(), free_port(), free_port()
        metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        url, hints = f"http://127.0.0.1:{port}", f"127.0.0.1:{hint_port}"
        log_path = tmp_path_factory.mktemp("saga-router") / "router.log"
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "sdk"), str(ROOT / "server"), env.get("PYTHONPATH", "")])
        cmd = [sys.executable, "-m", "saga_server.cli", "router", "--replicas", "2", "--port", str(port),
               "--hint-port", str(hint_port), "--metrics-port", str(metrics_port),
               "--num-cpus", "2", "--kv-blocks", "256"]  # default: only sessions in a tool call move
        kv_transfer = "nixl" if importlib.util.find_spec("nixl") is not None else None
        if kv_transfer:  # the ray extra installs NIXL: moves pull the KV (re-prefill is their fallback)
            cmd += ["--kv-transfer", kv_transfer]
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                                    start_new_session=True)
    try:
        deadline = time.monotonic() + float(os.environ.get("SAGA_TEST_READY_S", "900"))
        model = None
        while model is None:
            if proc is not None and proc.poll() is not None:  # the log's end in the one line a summary shows
                tail = " | ".join(log_path.read_text(errors="replace").strip().splitlines()[-8:])
                raise RuntimeError(f"saga router exited with {proc.returncode}: {tail}")
            if time.monotonic() > deadline:
                raise TimeoutError("saga router not ready")
            # Our router's own word first: a free port picked here may have been
            # taken meanwhile by another process that answers /v1/models too.
            if proc is None or b"[saga] ready in" in log_path.read_bytes():
                model = _ready(url)
            if model is None:
                time.sleep(2)
        ray.init(address="auto", namespace="saga", log_to_driver=False)
        cluster = RayCluster(url, hints, model, metrics_url, kv_transfer)
        cluster.wait_for_replicas(2, deadline - time.monotonic())
        yield cluster
    except Exception:
        if proc is not None:
            print(log_path.read_text()[-5000:], file=sys.stderr)
        raise
    finally:
        if ray.is_initialized():
            ray.shutdown()
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # saga router shuts Serve and Ray down
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # stragglers of its group (Ray workers)
            except ProcessLookupError:
                pass
