"""`saga router` configuration (pure: no Ray, no engine started)."""

from __future__ import annotations

import json

import pytest

from saga_server.router import cli
from saga_server.rpc import KeysFileError


def _opts(*argv):
    return cli._parser().parse_args(list(argv))


def test_saga_router_config_has_the_saga_engine_and_router():
    cfg = cli.build_llm_config(_opts("--replicas", "3", "--port", "8123", "--kv-blocks", "128"), "/m", True)
    eng = cfg["engine_kwargs"]
    assert eng["scheduler_cls"].startswith("saga_server.engines.vllm.")
    assert eng["enable_prefix_caching"] and eng["num_gpu_blocks_override"] == 128
    dep = cfg["deployment_config"]
    assert dep["num_replicas"] == 3
    rr = dep["request_router_config"]
    assert rr["request_router_class"] == cli.ROUTERS["saga"]
    assert rr["request_router_kwargs"]["ingress_url"] == "http://127.0.0.1:8123"
    assert cfg["server_cls"] == "saga_server.router.replica:SagaLLMServer"
    paths = cfg["runtime_env"]["env_vars"]["PYTHONPATH"].split(":")
    assert all(p.startswith("/") for p in paths)  # replicas run elsewhere: no relative paths
    json.dumps(cfg)  # plain data: printable and picklable


def test_the_replicas_serve_the_default_model_as_saga_serve_does(monkeypatch):
    """In float32 on an x86 CPU without AVX-512 (`saga_server.host_cpu`), never a user's model."""
    from saga_server import host_cpu as cpu
    from saga_server.serve import cli as serve_cli

    monkeypatch.setattr(serve_cli, "is_gpu_build", lambda: False)
    monkeypatch.setattr(cpu, "cpu_flags", lambda: ["sse2", "avx2"])
    assert cli.build_llm_config(_opts(), "/m", True)["engine_kwargs"]["dtype"] == "float32"
    assert "dtype" not in cli.build_llm_config(_opts(), "/m", False)["engine_kwargs"]
    monkeypatch.setattr(cpu, "cpu_flags", lambda: ["sse2", "avx2", "avx512f"])
    assert "dtype" not in cli.build_llm_config(_opts(), "/m", True)["engine_kwargs"]


def test_baseline_routers_and_stock_engine():
    cfg = cli.build_llm_config(_opts("--router", "prefix", "--no-saga-engine"), "/m", False)
    rr = cfg["deployment_config"]["request_router_config"]
    assert rr["request_router_class"] == cli.ROUTERS["prefix"] and "request_router_kwargs" not in rr
    assert "scheduler_cls" not in cfg["engine_kwargs"]
    assert "chat_template" not in cfg["engine_kwargs"]  # only for the default model


def test_bad_replica_count_is_refused(capsys):
    assert cli.main(["--replicas", "0"]) == 2
    assert "--replicas" in capsys.readouterr().err


def test_the_saga_router_gets_the_retrying_ingress_and_baselines_the_stock_one():
    saga = cli.build_app_config(_opts(), llm_config="cfg")
    assert saga["ingress_cls_config"]["ingress_cls"] == cli.INGRESS_CLS
    assert "ingress_cls_config" not in cli.build_app_config(_opts("--router", "pow2"), llm_config="cfg")


def test_only_sessions_in_a_tool_call_move_unless_asked():
    kwargs = cli.build_llm_config(_opts(), "/m", True)["deployment_config"]["request_router_config"]
    assert kwargs["request_router_kwargs"]["steal_only_in_tool"] is True
    kwargs = cli.build_llm_config(_opts("--steal-any"), "/m", True)["deployment_config"]["request_router_config"]
    assert kwargs["request_router_kwargs"]["steal_only_in_tool"] is False


def test_a_taken_port_fails_at_once_before_ray_starts(tmp_path, monkeypatch, capsys):
    """The hint and metrics ports are reserved before Ray starts (a minute, many
    processes that could take a port chosen for the router meanwhile); a taken one
    ends the command with a clear error, Ray never started, the other port freed."""
    import socket

    ray = pytest.importorskip("ray")
    pytest.importorskip("ray.serve.llm")

    def ray_must_not_start(*args, **kwargs):
        raise AssertionError("ray.init called although a port was taken")

    monkeypatch.setattr(ray, "init", ray_must_not_start)
    (tmp_path / "config.json").write_text("{}")
    with socket.socket() as taken, socket.socket() as probe:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        probe.bind(("127.0.0.1", 0))
        hint_port = probe.getsockname()[1]
        probe.close()
        argv = ["--model", str(tmp_path), "--host", "127.0.0.1", "--hint-port", str(hint_port),
                "--metrics-port", str(taken.getsockname()[1])]
        assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "cannot listen" in err and "--metrics-port" in err
    with socket.socket() as again:  # the hint server was stopped, its port is free
        again.bind(("127.0.0.1", hint_port))


KEY_A, KEY_ROUTER = "key-team-a-0001", "key-router-0001"
KEYS = f"{KEY_A} team-a agent\n{KEY_ROUTER} ops admin\n"


def test_saga_router_needs_an_admin_key_and_gives_the_file_to_its_engines(tmp_path, monkeypatch):
    monkeypatch.delenv("SAGA_API_KEYS", raising=False)
    monkeypatch.delenv("SAGA_API_KEY", raising=False)
    keys_file = tmp_path / "keys"
    keys_file.write_text(KEYS)
    opts = _opts("--api-keys", str(keys_file))
    assert cli.load_keys(opts).admin_key() == KEY_ROUTER
    env = cli.build_llm_config(opts, "/m", True)["runtime_env"]["env_vars"]
    assert env["SAGA_API_KEYS"] == str(keys_file.resolve())
    agents_only = tmp_path / "agents"
    agents_only.write_text(f"{KEY_A} team-a agent\n")
    with pytest.raises(KeysFileError, match="no admin key"):
        cli.load_keys(_opts("--api-keys", str(agents_only)))


def test_saga_router_refuses_a_malformed_keys_file_before_starting_anything(tmp_path, capsys):
    bad = tmp_path / "keys"
    bad.write_text(f"{KEY_A} team-a agent\n{KEY_ROUTER} ops boss\n")
    assert cli.main(["--api-keys", str(bad), "--dry-run"]) == 2
    assert f"{bad}:2: role" in capsys.readouterr().err


def test_kv_transfer_nixl_gives_every_replica_the_connector_and_the_router_pulls():
    from saga_server.serve.cli import nixl_transfer_config

    cfg = cli.build_llm_config(_opts("--kv-transfer", "nixl"), "/m", True)
    eng = cfg["engine_kwargs"]
    assert eng["kv_transfer_config"] == nixl_transfer_config(False) and eng["disable_hybrid_kv_cache_manager"]
    assert cfg["deployment_config"]["request_router_config"]["request_router_kwargs"]["kv_transfer"] == "nixl"
    plain = cli.build_llm_config(_opts(), "/m", True)
    assert "kv_transfer_config" not in plain["engine_kwargs"]
    assert plain["deployment_config"]["request_router_config"]["request_router_kwargs"]["kv_transfer"] is None
