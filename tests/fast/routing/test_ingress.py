"""`SagaIngress` retries a request whose replica died before its first chunk.

The replica stream is a stand-in for Serve's handle call (a dying actor cannot
be produced without a cluster; tests/real/ray kills a real one)."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("ray.llm._internal.serve.core.ingress.ingress", reason="Ray Serve LLM not installed")

from ray.exceptions import ActorDiedError, RayTaskError  # noqa: E402
from ray.llm._internal.serve.core.ingress.ingress import OpenAiIngress  # noqa: E402

from saga_server.router.ingress import SagaIngress, replica_lost  # noqa: E402


def _ingress(monkeypatch, script):
    """`script`: one list per attempt of items to yield; an exception item is raised."""
    calls = []

    async def fake(self, **kwargs):
        items = script[len(calls)]
        calls.append(kwargs)
        for item in items:
            if isinstance(item, BaseException):
                raise item
            yield item

    monkeypatch.setattr(OpenAiIngress, "_get_response", fake)
    monkeypatch.setenv("SAGA_INGRESS_RETRIES", "2")
    return object.__new__(SagaIngress), calls


async def _collect(ingress):
    return [r async for r in ingress._get_response(body="b", call_method="chat", raw_request=None)]


def test_a_request_lost_before_its_first_chunk_is_retried(monkeypatch):
    ingress, calls = _ingress(monkeypatch, [[ActorDiedError()], ["whole answer"]])
    assert asyncio.run(_collect(ingress)) == ["whole answer"]
    assert len(calls) == 2 and ingress.saga_retries == 1


def test_a_stream_that_already_answered_is_not_replayed(monkeypatch):
    ingress, calls = _ingress(monkeypatch, [["chunk 1", ActorDiedError()], ["never"]])
    with pytest.raises(ActorDiedError):
        asyncio.run(_collect(ingress))
    assert len(calls) == 1


def test_other_errors_and_exhausted_retries_reach_the_client(monkeypatch):
    ingress, calls = _ingress(monkeypatch, [[ValueError("bad request")]])
    with pytest.raises(ValueError):
        asyncio.run(_collect(ingress))
    ingress, calls = _ingress(monkeypatch, [[ActorDiedError()]] * 3)
    with pytest.raises(ActorDiedError):
        asyncio.run(_collect(ingress))
    assert len(calls) == 3


def test_a_wrapped_actor_death_counts_as_a_lost_replica():
    wrapped = RayTaskError("chat", "traceback", ActorDiedError())
    assert replica_lost(ActorDiedError()) and not replica_lost(ValueError())
    assert replica_lost(wrapped)


def test_a_malformed_retry_count_keeps_the_default_and_says_so(monkeypatch, caplog):
    ingress, calls = _ingress(monkeypatch, [[ActorDiedError()]] * 3 + [["whole answer"]])
    monkeypatch.setenv("SAGA_INGRESS_RETRIES", "three")
    with caplog.at_level("WARNING"):
        assert asyncio.run(_collect(ingress)) == ["whole answer"]
    assert len(calls) == 4 and "SAGA_INGRESS_RETRIES" in caplog.text
