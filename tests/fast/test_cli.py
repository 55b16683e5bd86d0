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


def test_status_has_engine_and_admission_lines_when_the_engine_reports_them():
    from saga_server.status import render

    from saga_proto import hints_pb2 as pb

    engine = pb.EngineStats(held_sessions=4, held_blocks=120, pinned_blocks=40, kv_blocks=1000,
                            admission=pb.AdmissionStats(active=3, parked=1, waiting=1, limit_tokens=5530, wait_s=12.5))
    out = render({"sessions_live": 5}, [], engine=engine)
    assert "engine: 4 sessions hold 120 of 1000 KV blocks (40 pinned); 0 hints dropped" in out
    assert "admission: 3 active, 1 parked, 1 waiting sessions; limit 5530 tokens, 12.5 s waited" in out
    assert "admission" not in render({"sessions_live": 5}, [], engine=pb.EngineStats())  # admission off
    assert "engine:" not in render({"sessions_live": 5}, [])  # no engine's figures


def test_status_has_a_line_of_each_tenants_tasks_within_deadline():
    from saga_server.status import render

    from saga_proto import hints_pb2 as pb

    tasks = {"web": pb.TenantOutcomes(deadlines=pb.DeadlineOutcomes(met=97, missed=3, slack_used_sum=81.0)),
             "swe": pb.TenantOutcomes(deadlines=pb.DeadlineOutcomes(met=10, slack_used_sum=4.0)),
             "idle": pb.TenantOutcomes()}  # served tokens only: no line
    out = render({"sessions_live": 1}, [], tenant_outcomes=tasks)
    assert "tasks within deadline: swe 10/10 (100.0%), slack used 0.40; web 97/100 (97.0%), slack used 0.81" in out
    assert "within deadline" not in render({"sessions_live": 1}, [])
    assert "user turns" not in out and "idle" not in out
    turns = {"chat": pb.TenantOutcomes(turns=pb.DeadlineOutcomes(met=45, missed=5, slack_used_sum=30.0))}
    out = render({"sessions_live": 1}, [], tenant_outcomes=turns)
    assert "user turns within deadline: chat 45/50 (90.0%), slack used 0.60" in out
    assert "tasks within" not in out


def test_status_has_a_tenancy_line_of_what_callers_were_refused():
    from saga_server.status import render

    stats = {"denied_tenant_claim": 2, "denied_read": 1, "hints_rate_dropped": 40, "deadline_clamped": 3,
             "denied_release": 0, "hints_auth_failures": 1}
    out = render(stats, [])
    assert ("tenancy: claimed another tenant 2, read another's 1, over hint rate 40, deadline clamped 3, "
            "bad key 1") in out
    assert "denied_read=" not in out  # not repeated in the raw stats line
    assert "tenancy" not in render({"sessions_live": 1, "denied_read": 0}, [])


def test_status_reads_with_the_api_key_of_the_environment(tmp_path, monkeypatch, capsys):
    from saga_server.core import WorkflowCore
    from saga_server.rpc import HintServer, KeyRing

    keys = tmp_path / "keys"
    keys.write_text("key-ops-000001 ops admin\n")
    with HintServer(WorkflowCore(), "127.0.0.1:0", keys=KeyRing(str(keys))) as server:
        monkeypatch.setenv("SAGA_API_KEY", "key-ops-000001")
        assert cli.main(["status", "--hints", server.endpoint]) == 0
        monkeypatch.setenv("SAGA_API_KEY", "key-wrong-0001")
        assert cli.main(["status", "--hints", server.endpoint]) == 1
    out = capsys.readouterr()
    assert "hint service: 0 live sessions" in out.out and "UNAUTHENTICATED" in out.err


def test_saga_hints_refuses_a_malformed_keys_file_naming_the_line(tmp_path, capsys):
    keys = tmp_path / "keys"
    keys.write_text("key-team-a-0001 team-a agent\nkey-team-b-0001 team-b agent max_sessions=-2\n")
    assert cli.main(["hints", "--api-keys", str(keys), "--listen", "127.0.0.1:0"]) == 2
    assert f"{keys}:2: max_sessions='-2'" in capsys.readouterr().err


def test_status_shows_each_subagent_under_its_parent():
    from saga_server.status import render

    from saga_proto import hints_pb2 as pb

    def state(sid, parent="", children=0):
        return pb.SessionState(session_id=sid, state="idle", parent_session_id=parent, live_children=children)

    # most recently active first: the children ran last; "gone-parent"'s parent is not listed
    listed = [state("cc:review", "cc:explore"), state("cc:explore", "cc", 1), state("x", "gone-parent"),
              state("cc", "", 1)]
    out = render({"sessions_live": 4}, listed)
    names = [line[:28].rstrip() for line in out.splitlines()[-4:]]
    assert names == ["x", "cc", "└ cc:explore", "  └ cc:review"]
    assert "1 subagents running" in out


def test_status_watch_redraws_until_interrupted_and_waits_for_a_server_that_is_away(capsys, monkeypatch):
    import time
    from types import SimpleNamespace

    from saga_server import status
    from saga_server.core import SessionStart, WorkflowCore
    from saga_server.rpc import HintServer

    core = WorkflowCore()
    with HintServer(core, "127.0.0.1:0") as server:
        naps = []

        def nap(seconds):  # between redraws: a session starts, then the operator presses Ctrl-C
            naps.append(seconds)
            if len(naps) > 1:
                raise KeyboardInterrupt
            if core.session("watched") is None:
                core.accept(SessionStart("watched", core.now(), tenant="acme"))

        monkeypatch.setattr(status, "time", SimpleNamespace(sleep=nap, strftime=time.strftime))
        assert cli.main(["status", "--hints", server.endpoint, "--watch", "0.5"]) == 0
    frames = capsys.readouterr().out.split(status._CLEAR)[1:]
    assert naps == [0.5, 0.5] and len(frames) == 2
    assert "0 live sessions" in frames[0] and "watched" in frames[1]
    naps.clear()
    assert cli.main(["status", "--hints", "127.0.0.1:9", "--watch"]) == 0  # nobody there: it waits
    assert "waiting for the hint service" in capsys.readouterr().out and naps == [2.0, 2.0]  # the default period
