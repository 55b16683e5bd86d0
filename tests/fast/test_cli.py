"""The `saga` command: dispatch, errors, and `saga status` against a live hint service."""

from __future__ import annotations

from saga_sdk import HintClient
from saga_server import cli


def test_help_lists_every_subcommand(capsys):
    assert cli.main([]) == 0
    out = capsys.readouterr().out
    assert all(f"  {name}" in out for name in cli.SUBCOMMANDS)


def test_unknown_command_is_a_clear_error(capsys):
    assert cli.main(["frobnicate"]) == 2
    assert "unknown command 'frobnicate'" in capsys.readouterr().err


def test_status_shows_sessions_and_open_tools(hint_server, capsys):
    client = HintClient(endpoint=hint_server.endpoint)
    client.session_start("status-demo", tenant="acme")
    client.llm_call_start("status-demo", step=1, node="plan")
    client.tool_call_start("status-demo", "pytest", call_id="t1")
    assert client.flush(5)
    client.close()
    assert cli.main(["status", "--hints", hint_server.endpoint]) == 0
    out = capsys.readouterr().out
    assert "1 live sessions, 1 open tool calls" in out
    row = next(line for line in out.splitlines() if line.startswith("status-demo"))
    assert row.split()[:5] == ["status-demo", "acme", "tool", "1", "1"]
    assert row.endswith("plan / pytest")


def test_status_header_and_table_count_the_same_sessions(capsys):
    """The header counts live sessions; the table lists those (ended ones, which the
    service remembers a while, are left out), and says how many of how many."""
    from saga_server.core import WorkflowCore
    from saga_server.rpc import HintServer

    core = WorkflowCore()
    with HintServer(core, "127.0.0.1:0") as server:
        client = HintClient(endpoint=server.endpoint)
        for sid in ("live-1", "live-2", "live-3", "done-1", "done-2"):
            client.session_start(sid, tenant="acme")
            client.llm_call_start(sid, step=1, node="plan")
            if sid.startswith("done"):
                client.session_end(sid)
        assert client.flush(5)
        client.close()
        assert cli.main(["status", "--hints", server.endpoint, "--sessions", "2"]) == 0
    out = capsys.readouterr().out
    assert "3 live sessions" in out
    assert "live sessions, most recently active first (2 of 3):" in out
    rows = [line.split()[0] for line in out.splitlines() if line.startswith(("done-", "live-"))]
    assert rows == ["live-3", "live-2"]


def test_status_without_a_service_says_so(capsys):
    assert cli.main(["status", "--hints", "127.0.0.1:9"]) == 1
    assert "hint service not reachable" in capsys.readouterr().err


def test_status_shows_the_tokens_served_per_tenant(capsys):
    from saga_server.core import WorkflowCore
    from saga_server.rpc import HintServer

    core = WorkflowCore()
    core.record_service("acme", 120)
    with HintServer(core, "127.0.0.1:0") as server:
        assert cli.main(["status", "--hints", server.endpoint]) == 0
    assert "tokens served: acme=120" in capsys.readouterr().out


def test_status_has_an_admission_line_when_the_engine_reports_it():
    from saga_server.status import render

    stats = {"sessions_live": 5, "engine_admission_active": 3, "engine_admission_parked": 1,
             "engine_admission_waiting": 1, "engine_admission_limit_tokens": 5530, "engine_admission_wait_s": 12.5}
    out = render(stats, [])
    assert "admission: 3 active, 1 parked, 1 waiting sessions; limit 5530 tokens, 12.5 s waited" in out
    assert "engine_admission_active=" not in out  # not repeated in the raw stats line
