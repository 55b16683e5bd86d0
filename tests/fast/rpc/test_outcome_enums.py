"""Every outcome a client names reaches the core as that outcome: the SDK and the
converter both take the wire's values from the generated enums, not copied numbers."""

from __future__ import annotations

import pytest

from saga_sdk.client import _encode_batch
from saga_server.core import SessionOutcome, ToolOutcome
from saga_server.rpc.convert import from_wire


def through_the_wire(kind: str, payload: tuple):
    batch, carried = _encode_batch("c", 1, [(kind, "s", 0.0, payload)])
    assert len(carried) == 1
    return from_wire(batch.events[0], 0.0)


@pytest.mark.parametrize("name", [o.value for o in ToolOutcome] + ["no-such-outcome"])
def test_each_tool_outcome_a_client_names_reaches_the_core_as_itself(name):
    expected = ToolOutcome(name) if name in {o.value for o in ToolOutcome} else ToolOutcome.OK
    assert through_the_wire("tool_call_end", ("bash", "1", name)).outcome is expected


@pytest.mark.parametrize("name", [o.value for o in SessionOutcome] + ["no-such-outcome"])
def test_each_session_outcome_a_client_names_reaches_the_core_as_itself(name):
    expected = SessionOutcome(name) if name in {o.value for o in SessionOutcome} else SessionOutcome.COMPLETED
    assert through_the_wire("session_end", (name,)).outcome is expected
