"""`OwnEngine`: a `saga serve` a real-tier test starts for itself (its own flags, its own
ports), beside the tier's shared one, with the few calls such tests make.

    engine = OwnEngine("source", tmp_path, ["--num-gpu-blocks-override", "80"])
    engine.wait_ready(time.monotonic() + 600)
    engine.complete(model, prompt_ids)
    engine.stop()

Its compute threads are unbound and it runs one OpenMP thread: two engines bound by
default share one core of this 2-core machine.
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
from pathlib import Path

from saga_server.serve.status import parse_metrics
from tests.support.http import REQUEST_TIMEOUT_S, free_port
from tests.support.serve import launch_saga_serve, stop_saga_serve

__all__ = ["OwnEngine"]


class OwnEngine:
    def __init__(self, name: str, tmp: Path, args: list[str], *, port: int | None = None,
                 hint_port: int | None = None) -> None:
        """`port`, `hint_port`: the same again for a restart (default: free ones)."""
        self.port = port or free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = tmp / f"{name}.log"
        self.hint_addr = f"127.0.0.1:{hint_port or free_port()}"
        argv = ["--fast-start", "--port", str(self.port), "--hint-port", self.hint_addr.rpartition(":")[2], *args]
        os.environ.update(VLLM_CPU_OMP_THREADS_BIND="nobind", OMP_NUM_THREADS="1")
        try:
            self.proc = launch_saga_serve(argv, self.log)
        finally:
            del os.environ["VLLM_CPU_OMP_THREADS_BIND"], os.environ["OMP_NUM_THREADS"]

    def wait_ready(self, deadline: float) -> None:
        while b"[saga] ready in" not in self.log.read_bytes():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"saga serve did not start:\n{self.log.read_text()[-3000:]}")
            time.sleep(1)

    def stop(self) -> None:
        stop_saga_serve(self.proc)

    def metrics(self, *prefixes: str) -> dict[str, float]:
        with urllib.request.urlopen(self.base + "/metrics", timeout=10) as resp:
            return parse_metrics(resp.read().decode(), ("vllm:iteration_tokens_total", *prefixes))

    def computed_tokens(self) -> float:
        """Tokens the engine has run through the model so far (prefill and decode)."""
        return self.metrics()["vllm:iteration_tokens_total_sum"]

    def complete(self, model: str, prompt: list[int], max_tokens: int = 12) -> dict:
        return self.post("/v1/completions", {"model": model, "prompt": prompt, "max_tokens": max_tokens,
                                             "ignore_eos": True, "temperature": 0.0, "seed": 0,
                                             "return_token_ids": True})

    def post(self, path: str, body: dict, headers: dict[str, str] | None = None) -> dict:
        req = urllib.request.Request(self.base + path, json.dumps(body).encode(),
                                     {"Content-Type": "application/json", **(headers or {})})
        with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_S) as resp:
            return json.loads(resp.read())
