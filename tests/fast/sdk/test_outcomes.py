"""The one exception -> outcome rule (`saga_sdk.outcomes`), and a session scope using it."""

from __future__ import annotations

import asyncio
import concurrent.futures

import pytest

from saga_sdk.outcomes import outcome_of, session_outcome_of


class _MyCancel(asyncio.CancelledError):
    pass


@pytest.mark.parametrize("exc, tool, session", [
    (None, "ok", "completed"),
    (asyncio.CancelledError(), "cancelled", "cancelled"),
    (concurrent.futures.CancelledError(), "cancelled", "cancelled"),
    (_MyCancel(), "cancelled", "cancelled"),
    (KeyboardInterrupt(), "cancelled", "cancelled"),
    (GeneratorExit(), "cancelled", "cancelled"),
    (TimeoutError(), "error", "failed"),  # the wire has no timeout outcome
    (SystemExit(1), "error", "failed"),
    (ValueError("x"), "error", "failed"),
])
def test_every_exception_maps_to_one_tool_and_one_session_outcome(exc, tool, session):
    assert outcome_of(exc) == tool
    assert session_outcome_of(exc) == session


def test_a_session_scope_ends_with_the_outcome_of_what_left_it(hint_server, registry):
    from saga_sdk import HintClient

    client = HintClient(endpoint=hint_server.endpoint)
    with client.session("fine"):
        pass
    with pytest.raises(KeyboardInterrupt), client.session("stopped"):
        raise KeyboardInterrupt
    with pytest.raises(TimeoutError), client.session("broken"):
        raise TimeoutError
    assert client.flush(5)
    client.close()
    ends = {sid: registry.session(sid).history[-1] for sid in ("fine", "stopped", "broken")}
    assert {e.kind for e in ends.values()} == {"session_end"}
    assert {sid: e.detail for sid, e in ends.items()} == {"fine": "completed", "stopped": "cancelled",
                                                          "broken": "failed"}
