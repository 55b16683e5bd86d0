"""`saga run` and its sitecustomize, in real child processes; and the example agent,
run once directly and once under `saga run` behind the proxy."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from saga_sdk.launcher import BOOTSTRAP_DIR, PLACEHOLDER_KEY, build_parser, child_environment
from saga_server.proxy import MatchRule

ROOT = Path(__file__).resolve().parents[3]
PY = sys.executable


def saga_run(args: list[str], code: str | None = None, *, env: dict | None = None, command: list[str] | None = None,
             timeout: float = 120) -> subprocess.CompletedProcess:
    command = command if command is not None else [PY, "-c", code]
    base = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "SAGA_"))}
    base["PYTHONPATH"] = os.pathsep.join([str(ROOT / "sdk"), str(ROOT / "server")])
    base.update(env or {})
    return subprocess.run([PY, "-m", "saga_server.cli", "run", *args, "--", *command], env=base, cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def parse(argv: list[str]) -> argparse.Namespace:
    return build_parser().parse_args(argv + ["--", "true"])


# -- the environment it builds --------------------------------------------------------------

def test_proxy_mode_points_the_sdk_at_the_proxy_and_leaves_hints_to_it():
    env = child_environment(parse(["--proxy", "http://p/v1"]), {"PYTHONPATH": f"a{os.pathsep}{BOOTSTRAP_DIR}"})
    assert env["PYTHONPATH"].split(os.pathsep) == [str(BOOTSTRAP_DIR), "a"]
    assert env["OPENAI_BASE_URL"] == env["OPENAI_API_BASE"] == "http://p/v1"
    assert env["OPENAI_API_KEY"] == PLACEHOLDER_KEY
    assert env["SAGA_ENABLED"] == "0" and env["SAGA_LANGCHAIN"] == "1"


def test_server_mode_keeps_the_users_key_and_agent_hints():
    env = child_environment(parse(["--server", "http://s/v1", "--endpoint", "h:1"]), {"OPENAI_API_KEY": "k"})
    assert (env["OPENAI_BASE_URL"], env["OPENAI_API_KEY"], env["SAGA_ENDPOINT"]) == ("http://s/v1", "k", "h:1")
    assert "SAGA_ENABLED" not in env
    bare = child_environment(parse(["--no-integrations"]), {"OPENAI_BASE_URL": "mine"})
    assert bare["OPENAI_BASE_URL"] == "mine" and bare["SAGA_INTEGRATIONS"] == "0" and "SAGA_LANGCHAIN" not in bare


# -- real child processes ---------------------------------------------------------------------

def test_the_child_runs_with_the_environment_and_its_exit_status():
    r = saga_run(["--proxy", "http://127.0.0.1:1/v1"],
                 "import os, sys; print(os.environ['OPENAI_BASE_URL']); sys.exit(3)")
    assert r.returncode == 3 and r.stdout.strip() == "http://127.0.0.1:1/v1"


def test_integrations_switch_on_when_their_framework_is_imported_and_not_before():
    code = ("import sys\n"
            "print('openai' in sys.modules)\n"
            "import openai\n"
            "from saga_sdk.integrations import openai as o\n"
            "from importlib import resources\n"
            "print(o.is_instrumented(), openai.__spec__.loader.__class__.__name__,\n"
            "      resources.files('openai').joinpath('py.typed').is_file())\n")
    r = saga_run(["--proxy", "http://x/v1"], code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "True", "SourceFileLoader", "True"]
    off = saga_run(["--no-integrations"], "import openai\nfrom saga_sdk.integrations import openai as o\n"
                                          "print(o.is_instrumented())")
    assert off.stdout.strip() == "False"


def test_langchain_and_autogen_hooks_activate():
    code = ("import sys, langchain_core, autogen_core\n"
            "from saga_sdk.integrations import autogen\n"
            "print('saga_sdk.integrations.langchain' in sys.modules, autogen.is_instrumented())")
    r = saga_run([], code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "True"]


def test_an_existing_sitecustomize_still_runs_and_a_broken_one_cannot_stop_the_child(tmp_path):
    good, bad = tmp_path / "good", tmp_path / "bad"
    good.mkdir()
    bad.mkdir()
    (good / "sitecustomize.py").write_text("import builtins\nbuiltins.SITE_MARK = 'from the user'\n")
    (bad / "sitecustomize.py").write_text("raise RuntimeError('broken site')\n")
    path = os.pathsep.join([str(ROOT / "sdk"), str(ROOT / "server")])
    r = saga_run([], "print(SITE_MARK)", env={"PYTHONPATH": f"{path}{os.pathsep}{good}"})
    assert (r.returncode, r.stdout.strip()) == (0, "from the user")
    r = saga_run([], "import openai; print('alive')", env={"PYTHONPATH": f"{path}{os.pathsep}{bad}"})
    assert (r.returncode, r.stdout.strip()) == (0, "alive")


def test_an_interpreter_without_the_sdks_dependencies_still_runs(tmp_path):
    """A second interpreter (no grpc): the hook for a stand-in `openai` fires, cannot load
    the SDK, says so under SAGA_DEBUG, and the program runs on."""
    other = Path("/usr/bin/python3")
    if not other.exists():
        pytest.skip("no second interpreter here")
    (tmp_path / "openai.py").write_text("VALUE = 42\n")
    path = os.pathsep.join([str(ROOT / "sdk"), str(tmp_path)])
    r = saga_run([], None, command=[str(other), "-c", "import openai; print(openai.VALUE)"],
                 env={"SAGA_DEBUG": "1", "PYTHONPATH": path})
    assert (r.returncode, r.stdout.strip()) == (0, "42")
    assert "openai integration not activated" in r.stderr


def test_usage_errors():
    assert saga_run([], None, command=[]).returncode == 2
    missing = saga_run([], None, command=["no-such-command-xyz"])
    assert missing.returncode == 127 and "command not found" in missing.stderr


# -- the example, directly and under saga run ----------------------------------------------------

def test_example_agent_directly_and_under_saga_run(upstream, proxy, registry):
    example = [PY, str(ROOT / "examples" / "openai_agent.py")]
    plain_env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "SAGA_", "PYTHONPATH"))}
    direct = subprocess.run(example, env={**plain_env, "OPENAI_BASE_URL": upstream.url + "/v1", "OPENAI_API_KEY": "none"},
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert direct.returncode == 0, direct.stderr
    assert json.loads(direct.stdout.splitlines()[-1]) == {"llm_calls": 3, "tools": ["get_user_details", "search_flights"]}
    assert all("x-session-id" not in r["headers"] for r in upstream.app.state.requests)
    upstream.app.state.requests.clear()

    wrapped = saga_run(["--proxy", proxy.url + "/v1"], None, command=example)
    assert wrapped.returncode == 0, wrapped.stderr
    assert wrapped.stdout == direct.stdout
    ids = {r["headers"].get("x-session-id") for r in upstream.app.state.requests}
    assert len(ids) == 1 and None not in ids
    assert proxy.app.hints.flush(5)
    history = [(h.kind, h.detail) for h in registry.session(ids.pop()).history if h.kind.startswith("tool")]
    assert history == [("tool_call_start", "get_user_details"), ("tool_call_end", "get_user_details"),
                       ("tool_call_start", "search_flights"), ("tool_call_end", "search_flights")]


LANGCHAIN_AGENT = '''
from langchain.agents import create_agent
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI


@tool
def lookup(user: str) -> str:
    """Look a customer up."""
    return "gold member"


agent = create_agent(ChatOpenAI(model="scripted", max_retries=0), [lookup])  # URL and key from the environment
for run in range(2):
    out = agent.invoke({"messages": [("user", f"run {run}: plan: tools lookup | answer")]})
    print(out["messages"][-1].content)
'''


def test_langchain_agent_under_saga_run_keeps_its_own_sessions(upstream, proxy, registry, tmp_path):
    """The LangChain integration makes each run a session and tags its requests; the
    proxy honours those ids and is the only one sending hints (no duplicates)."""
    script = tmp_path / "lc_agent.py"
    script.write_text(LANGCHAIN_AGENT)
    r = saga_run(["--proxy", proxy.url + "/v1"], None, command=[PY, str(script)])
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["done", "after", "1", "steps"] * 2
    ids = [req["headers"].get("x-session-id") for req in upstream.app.state.requests]
    assert len(ids) == 4 and ids[0] == ids[1] != ids[2] == ids[3]
    assert not ids[0].startswith("px-")  # the integration's id, not one the proxy inferred
    assert proxy.app.tracker.stats().by_rule[MatchRule.EXPLICIT] == 4
    assert proxy.app.hints.flush(5)
    for sid in (ids[0], ids[2]):
        assert [(h.kind, h.detail) for h in registry.session(sid).history][1:] == [
            ("llm_call_start", "llm"), ("llm_call_end", "llm"), ("tool_call_start", "lookup"),
            ("tool_call_end", "lookup"), ("llm_call_start", "llm"), ("llm_call_end", "llm")]
        assert [h.kind for h in registry.session(sid).history].count("session_start") == 1
