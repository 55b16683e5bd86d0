"""What a hint sink offers beyond `HintSink` is one of the core's Protocols, and the
hint service asks the sink for it by that Protocol: the engine's sink offers every
one, the core the tenant-wide ones, the plain session table none."""

from __future__ import annotations

import pytest

from saga_server.core import (
    EngineStatsSink,
    KvReleaseSink,
    KvResidencySink,
    PeerServiceSink,
    SessionTable,
    TenantOutcomesSink,
    WorkflowCore,
)
from saga_server.engines.vllm.intake import EngineHintSink

OPTIONAL = (EngineStatsSink, TenantOutcomesSink, PeerServiceSink, KvResidencySink, KvReleaseSink)


@pytest.mark.parametrize("make, offers", [
    (lambda: EngineHintSink(WorkflowCore()), OPTIONAL),
    (WorkflowCore, (TenantOutcomesSink, PeerServiceSink)),
    (SessionTable, ()),
])
def test_each_sink_offers_exactly_its_protocols(make, offers):
    sink = make()
    assert [p.__name__ for p in OPTIONAL if isinstance(sink, p)] == [p.__name__ for p in offers]
