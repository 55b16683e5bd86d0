"""Recording agent traffic as `saga-trace/1`, the workload format `saga bench` replays.

`TraceBuilder` (pure, `trace`) turns one session's facts (LLM calls, tool calls,
its end; sizes and names, never text) into one task line; `JsonlSink` (`sink`)
appends lines crash-safely and rotates by size; `Recorder` (`recorder`) runs both
on a background thread behind a bounded queue, so the request path only enqueues;
`options` are the `--record` flags and the environment that carries them into an
engine process. A front door supplies the feed that reads its own events into
facts (`saga_server.proxy.recording` for `saga proxy`, `saga_server.engines.vllm.recording`
for `saga serve`).
"""

from .recorder import RecordConfig, Recorder, RecorderStats, tool_hasher
from .sink import JsonlSink
from .trace import CHARS_PER_TOKEN, TokenBlocks, TraceBuilder, block_hashes

__all__ = ["CHARS_PER_TOKEN", "JsonlSink", "RecordConfig", "Recorder", "RecorderStats", "TokenBlocks",
           "TraceBuilder", "block_hashes", "tool_hasher"]
