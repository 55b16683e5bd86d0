"""The engine's typed settings: read from the environment once, written back by `saga
serve`, a bad value logged and its default kept, and docs/OPERATING.md's table made
from them."""

from __future__ import annotations

import logging
from dataclasses import fields
from pathlib import Path

import pytest

from saga_server.core.mechanisms import Mechanism, parse_mechanisms
from saga_server.settings import KINDS, EngineSettings, HintServiceSettings, ProxySettings, RouterSettings, knob_table

ROOT = Path(__file__).resolve().parents[2]


def test_every_knob_is_read_from_its_variable():
    env = {"SAGA_HINT_ADDR": "127.0.0.1:5", "SAGA_SCOPED_SESSION_IDS": "1", "SAGA_API_KEYS": "/etc/saga/keys",
           "SAGA_API_KEY": "a-shared-key", "SAGA_OFF": "admit, shape",
           "SAGA_PIN_MAX_FRACTION": "0.25", "SAGA_SENIORITY_WINDOW_S": "0", "SAGA_MAX_SESSIONS": "7",
           "SAGA_SESSION_IDLE_S": "2.5", "SAGA_METRICS_PORT": "9464", "SAGA_METRICS_HOST": "0.0.0.0",
           "SAGA_NIXL_KEEP_PINNING": "1", "SAGA_NIXL_PROGRESS_THREAD": "0"}
    s = EngineSettings.from_env(env)
    assert s == EngineSettings(hint_addr="127.0.0.1:5", scoped_session_ids=True, api_keys="/etc/saga/keys",
                               api_key="a-shared-key",
                               off=frozenset({Mechanism.ADMIT, Mechanism.SHAPE}), pin_max_fraction=0.25,
                               seniority_window_s=0.0, max_sessions=7, session_idle_s=2.5, metrics_port=9464,
                               metrics_host="0.0.0.0", nixl_keep_pinning=True, nixl_progress_thread=False)
    assert {f.metadata["knob"].env for f in fields(EngineSettings)} == set(env)
    assert not s.on(Mechanism.ADMIT) and s.on(Mechanism.TTL)


def test_the_routers_replicas_read_their_host_and_the_ingress_its_retries():
    env = {"SAGA_HINT_HOST": "10.0.0.2", "SAGA_INGRESS_RETRIES": "5"}
    assert RouterSettings.from_env(env) == RouterSettings(hint_host="10.0.0.2", ingress_retries=5)
    assert {f.metadata["knob"].env for f in fields(RouterSettings)} == set(env)
    assert RouterSettings.from_env({"SAGA_INGRESS_RETRIES": "11"}).ingress_retries == 3  # beyond its range


@pytest.mark.parametrize("env, value", [
    ("SAGA_PIN_MAX_FRACTION", "1.5"), ("SAGA_PIN_MAX_FRACTION", "nan"), ("SAGA_PIN_MAX_FRACTION", "lots"),
    ("SAGA_SENIORITY_WINDOW_S", "-1"), ("SAGA_MAX_SESSIONS", "2.5"), ("SAGA_MAX_SESSIONS", "0"),
    ("SAGA_SCOPED_SESSION_IDS", "yes"), ("SAGA_OFF", "admit,steal"), ("SAGA_OFF", "lru"),
    ("SAGA_METRICS_PORT", "0"), ("SAGA_METRICS_PORT", "http")])
def test_a_bad_value_is_logged_and_its_default_kept(env, value, caplog):
    with caplog.at_level(logging.WARNING, logger="saga.settings"):
        assert EngineSettings.from_env({env: value}) == EngineSettings()
    assert env in caplog.text and repr(value) in caplog.text


def test_what_saga_serve_writes_reads_back_the_same_and_overrides_what_it_inherited():
    s = EngineSettings(hint_addr="h:1", off=frozenset({Mechanism.WALRU}), pin_max_fraction=0.75)
    env = {"SAGA_PIN_MAX_FRACTION": "0.1", "SAGA_SESSION_IDLE_S": "5", "PATH": "/bin"}
    EngineSettings.from_env(env).with_(hint_addr="h:1", off=s.off, pin_max_fraction=0.75).write(env)
    assert EngineSettings.from_env(env) == s.with_(session_idle_s=5.0)
    EngineSettings().write(env)
    assert env == {"PATH": "/bin"}  # defaults are not written, inherited ones are dropped


def test_settings_outside_their_range_cannot_be_built():
    with pytest.raises(ValueError, match="pin_max_fraction"):
        EngineSettings(pin_max_fraction=2.0)
    with pytest.raises(ValueError, match="steal"):
        parse_mechanisms("steal", frozenset(Mechanism) - {Mechanism.STEAL})


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_operating_guide_holds_each_kinds_generated_table(kind):
    text = (ROOT / "docs" / "OPERATING.md").read_text()
    start = text.index(f"<!-- {kind}-settings")
    block = text[text.index("\n", start) + 1:text.index(f"<!-- /{kind}-settings -->")]
    assert block == knob_table(KINDS[kind]), f"regenerate it: python -m saga_server.settings {kind}"


def test_the_hint_service_and_the_proxy_take_their_flags_defaults_from_their_settings(monkeypatch):
    from saga_server.proxy.cli import build_parser

    monkeypatch.setenv("SAGA_UPSTREAM", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("SAGA_API_KEYS", "/etc/saga/keys")
    args = build_parser().parse_args([])
    assert (args.upstream, args.api_keys) == ("http://127.0.0.1:9/v1", "/etc/saga/keys")
    assert ProxySettings.from_env().with_(upstream=None).to_env() == {"SAGA_API_KEYS": "/etc/saga/keys"}
    assert HintServiceSettings.from_env() == HintServiceSettings(api_keys="/etc/saga/keys")


def test_a_number_written_for_the_engine_reads_back_exactly():
    s = EngineSettings(session_idle_s=1234567.5, seniority_window_s=0.1, pin_max_fraction=1 / 3)
    assert EngineSettings.from_env(s.to_env()) == s
