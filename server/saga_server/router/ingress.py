"""`SagaIngress`: Ray Serve LLM's OpenAI ingress, retrying requests a dying replica lost.

Serve does not retry a request once it has been sent to a replica; if that
replica dies (crash, OOM, node loss), the request fails. An agent's request that
has produced no output yet can be replayed safely, so this ingress retries it
(up to `RouterSettings.ingress_retries`, with a short backoff) when the replica
it went to died before the first response chunk: the SAGA request router then
re-homes the session on a live replica, which re-prefills its prefix. A stream
that already delivered chunks cannot be replayed without duplicating output; it
ends with the replica's error, as before.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import Any, AsyncGenerator

from ray.exceptions import RayActorError
from ray.llm._internal.serve.core.ingress.ingress import OpenAiIngress

from ..settings import RouterSettings

log = logging.getLogger("ray.serve")

__all__ = ["SagaIngress", "replica_lost"]


def replica_lost(exc: BaseException) -> bool:
    """The replica serving the request died or became unreachable."""
    return isinstance(exc, RayActorError) or isinstance(getattr(exc, "cause", None), RayActorError)


class SagaIngress(OpenAiIngress):
    @functools.cached_property
    def saga_settings(self) -> RouterSettings:
        return RouterSettings.from_env(logger=log)

    async def _get_response(self, **kwargs: Any) -> AsyncGenerator[Any, None]:
        retries = self.saga_settings.ingress_retries
        for attempt in range(retries + 1):
            started = False
            try:
                async for response in super()._get_response(**kwargs):
                    started = True
                    yield response
                return
            except Exception as exc:
                if started or attempt == retries or not replica_lost(exc):
                    raise
                self.saga_retries = getattr(self, "saga_retries", 0) + 1
                log.warning("SAGA ingress: replica lost before the first chunk (%s); retry %d of %d",
                            type(exc).__name__, attempt + 1, retries)
                await asyncio.sleep(0.5 * (attempt + 1))
