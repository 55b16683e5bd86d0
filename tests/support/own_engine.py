"""`OwnEngine`: a `saga serve` a real-tier test starts for itself (its own flags, its own
ports), beside the tier's shared one, with the few calls such tests make.

    engine = OwnEngine("source", tmp_path, ["--num-gpu-blocks-override", "80"])
    engine.wait_ready(600)
    engine.complete(model, prompt_ids)
    engine.stop()

Its compute threads are unbound and it runs one OpenMP thread: two engines bound by
default share one core of this 2-core machine.
"""

from __future__ import annotations

import urllib.request
from pathlib import Path

from saga_server.serve.status import parse_metrics
from saga_server.serve_child import ServeChild
from tests.support.http import REQUEST_TIMEOUT_S
from tests.support.serve import ROOT

__all__ = ["OwnEngine"]


class OwnEngine(ServeChild):
    request_timeout_s = REQUEST_TIMEOUT_S

    def __init__(self, name: str, tmp: Path, args: list[str], *, port: int | None = None,
                 hint_port: int | None = None) -> None:
        """`port`, `hint_port`: the same again for a restart (default: free ones)."""
        super().__init__(["--fast-start", *args], tmp / f"{name}.log", port=port, hint_port=hint_port,
                         checkout=ROOT, env={"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1"})

    def metrics(self, *prefixes: str) -> dict[str, float]:
        with urllib.request.urlopen(self.base_url + "/metrics", timeout=10) as resp:
            return parse_metrics(resp.read().decode(), ("vllm:iteration_tokens_total", *prefixes))

    def computed_tokens(self) -> float:
        """Tokens the engine has run through the model so far (prefill and decode)."""
        return self.metrics()["vllm:iteration_tokens_total_sum"]

    def complete(self, model: str, prompt: list[int], max_tokens: int = 12) -> dict:
        return self.post("/v1/completions", {"model": model, "prompt": prompt, "max_tokens": max_tokens,
                                             "ignore_eos": True, "temperature": 0.0, "seed": 0,
                                             "return_token_ids": True})
