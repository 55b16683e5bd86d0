"""A hinted coder workflow, for tests of what a hint service learns and keeps:

    teach_coder(endpoint)                  # ten sessions: 3 steps, a test run after the first two
    coder_predictions(endpoint, "new")     # a new session just into its first test run: its metrics

Only hints are sent (no model call is needed to learn a workflow); the tool runs are
real sleeps of `tool_s`, since the service times them on its own clock.
"""

from __future__ import annotations

import time

from saga_sdk import HintClient, HintReader

__all__ = ["teach_coder", "coder_predictions"]


def teach_coder(endpoint: str, sessions: int = 10, tool_s: float = 0.05) -> None:
    with HintClient(endpoint=endpoint) as client:
        for n in range(sessions):
            sid = f"taught-{n}"
            client.session_start(sid, workflow="coder")
            for step in range(3):
                client.llm_call_start(sid, step=step)
                client.llm_call_end(sid, step=step, prompt_tokens=600 + 300 * step, output_tokens=20)
                if step < 2:
                    client.tool_call_start(sid, "pytest", call_id=f"{n}.{step}")
                    time.sleep(tool_s)
                    client.tool_call_end(sid, "pytest", call_id=f"{n}.{step}")
            client.session_end(sid)
        assert client.flush(10)


def coder_predictions(endpoint: str, sid: str) -> dict[str, float]:
    """A new coder session, its first call done, just into its test run: its metrics."""
    with HintClient(endpoint=endpoint) as client:
        client.session_start(sid, workflow="coder")
        client.llm_call_start(sid, step=0)
        client.llm_call_end(sid, step=0, prompt_tokens=600, output_tokens=20)
        client.tool_call_start(sid, "pytest", call_id="x")
        assert client.flush(10)
    with HintReader(endpoint) as reader:
        return dict(reader.session(sid).metrics)
