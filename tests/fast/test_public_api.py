"""The curated public API: what users may import, and nothing half-exported."""

from __future__ import annotations

import importlib

import pytest

SDK_API = {
    "ClientStats", "HintClient", "HintReader", "SagaConfig", "SagaUnavailable", "SessionContext",
    "UnknownSession", "current_session", "get_client", "new_session_id", "session_scope", "set_client",
}


def test_the_sdk_exports_exactly_its_documented_api():
    import saga_sdk

    assert set(saga_sdk.__all__) == SDK_API


@pytest.mark.parametrize("module", [
    "saga_sdk", "saga_sdk.integrations.openai", "saga_sdk.integrations.langchain",
    "saga_sdk.integrations.autogen", "saga_sdk.integrations.openai_agents", "saga_server.core", "saga_server.rpc",
    "saga_server.record",
    # public SDK modules the server and other clients share
    "saga_sdk.channel", "saga_sdk.logs", "saga_sdk.outcomes",
])
def test_every_exported_name_exists(module):
    mod = importlib.import_module(module)
    assert mod.__all__, f"{module} has no __all__"
    missing = [name for name in mod.__all__ if not hasattr(mod, name)]
    assert missing == []
    assert len(set(mod.__all__)) == len(mod.__all__), "duplicate names in __all__"


def test_private_modules_stay_out_of_the_sdk_api():
    import saga_sdk

    assert not [name for name in saga_sdk.__all__ if name.startswith("_")]
