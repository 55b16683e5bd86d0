from saga_sdk import SagaConfig


def test_reads_every_variable():
    cfg = SagaConfig.from_env({
        "SAGA_ENABLED": "false", "SAGA_ENDPOINT": "grpc://host:7000", "SAGA_API_KEY": "k",
        "SAGA_TENANT": "team", "SAGA_QUEUE_SIZE": "5", "SAGA_BATCH_SIZE": "7",
        "SAGA_FLUSH_INTERVAL_MS": "2", "SAGA_RPC_TIMEOUT_MS": "300", "SAGA_EXIT_FLUSH_MS": "50",
        "SAGA_MAX_EVENT_AGE_S": "9", "SAGA_SAMPLE_RATE": "0.25",
    })
    assert cfg == SagaConfig(enabled=False, endpoint="host:7000", api_key="k", tenant="team", queue_size=5,
                             batch_size=7, flush_interval_s=0.002, rpc_timeout_s=0.3, exit_flush_s=0.05,
                             max_event_age_s=9.0, sample_rate=0.25)


def test_malformed_values_keep_defaults_and_warn(caplog):
    cfg = SagaConfig.from_env({"SAGA_QUEUE_SIZE": "-3", "SAGA_ENDPOINT": "no-port", "SAGA_SAMPLE_RATE": "2"})
    assert (cfg.queue_size, cfg.endpoint, cfg.sample_rate) == (10_000, "127.0.0.1:50051", 1.0)
    assert {"SAGA_QUEUE_SIZE", "SAGA_ENDPOINT", "SAGA_SAMPLE_RATE"} <= {
        r.getMessage().split("=")[0].split()[-1] for r in caplog.records}


def test_overrides_win_over_the_environment():
    assert SagaConfig.from_env({"SAGA_ENDPOINT": "a:1"}, endpoint="b:2").endpoint == "b:2"
