"""The checked-in generated code is exactly what proto/ generates."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def load_generator():
    spec = importlib.util.spec_from_file_location("gen_proto", ROOT / "scripts" / "gen_proto.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_code_matches_the_proto():
    gen = load_generator()
    fresh = gen.generate()
    for name, text in fresh.items():
        checked_in = (gen.OUT / name).read_text()
        assert checked_in == text, f"{name} is stale: run python scripts/gen_proto.py"


def test_generated_code_round_trips_an_event():
    from saga_proto import hints_pb2 as pb

    batch = pb.HintBatch(client_id="c", sequence=3)
    batch.events.add(session_id="s", tool_call_start=pb.ToolCallStart(tool="bash", call_id="1"))
    again = pb.HintBatch.FromString(batch.SerializeToString())
    assert again.events[0].WhichOneof("kind") == "tool_call_start"
    assert again.events[0].tool_call_start.tool == "bash"
