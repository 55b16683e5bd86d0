"""`TraceBuilder`: facts in, saga-trace/1 task lines out (no threads, no files)."""

from __future__ import annotations

import random

import pytest

from saga_server.bench.workload import materialize
from saga_server.record import TokenBlocks, TraceBuilder, block_hashes


def agent(b: TraceBuilder, sid: str = "s", steps: int = 3, t: float = 0.0, *, tool_s: float = 2.0,
          end: str | None = "submit") -> float:
    """A tool-calling session: each step 1 s of LLM, then a `bash` call of `tool_s`."""
    b.session_start(sid, t, workflow="wf")
    for k in range(1, steps + 1):
        b.llm_start(sid, t, step=k, extends="answer" if k > 1 else "", model="m")
        t += 1.0
        b.llm_end(sid, t, step=k, prompt_tokens=1000 * k, output_tokens=50, cached_tokens=900 * k - 900)
        if k < steps:
            b.tool_start(sid, t, name="bash", call_id=f"c{k}", category="test")
            t += tool_s
            b.tool_end(sid, t, call_id=f"c{k}")
    if end is not None:
        b.session_end(sid, t, reason=end)
    return t


def test_a_session_becomes_one_task_with_its_steps_tokens_and_tool_gaps():
    b = TraceBuilder(source="test", wall=lambda: 1000.0)
    agent(b, steps=3, tool_s=2.5)
    [task] = b.take()
    assert (task["format"], task["task_id"], task["run"], task["model"]) == ("saga-trace/1", "s", "wf", "m")
    assert (task["end_reason"], task["truncated"], task["started_unix_s"]) == ("submit", False, 1000.0)
    assert task["duration_s"] == pytest.approx(3 * 1.0 + 2 * 2.5)
    steps = task["steps"]
    assert [(s["prompt_tokens"], s["output_tokens"]) for s in steps] == [(1000, 50), (2000, 50), (3000, 50)]
    assert [s["reused_prefix_tokens"] for s in steps] == [0, 1050, 2050]  # previous prompt + answer
    assert [s["provider_cached_tokens"] for s in steps] == [0, 900, 1800]
    assert [s["llm_latency_s"] for s in steps] == [1.0, 1.0, 1.0]
    assert steps[0]["tools"] == [{"name": "bash", "category": "test", "duration_s": 2.5}]
    assert steps[2]["tools"] == [] and "idle_s" not in steps[2]
    assert b.take() == [] and b.open_sessions == 0


def test_the_loader_reads_a_built_task():
    b = TraceBuilder()
    agent(b, steps=3)
    spec = materialize(b.take()[0], random.Random(0))
    assert [s.prompt_tokens for s in spec.steps] == [1000, 2000, 3000]
    assert [s.reused_tokens for s in spec.steps] == [0, 1050, 2050]
    assert spec.steps[0].tools[0].duration_s == 2.0 and spec.steps[0].tools[0].from_trace


def test_reuse_follows_what_the_history_continues_and_a_retry_repeats_the_failed_call():
    b = TraceBuilder()
    b.session_start("s", 0, workflow="wf")
    b.llm_start("s", 0, step=1)
    b.llm_end("s", 1, step=1, prompt_tokens=100, output_tokens=10)
    b.llm_start("s", 2, step=2, extends="request")       # the answer was rewritten: the prompt only
    b.llm_end("s", 3, step=2, prompt_tokens=200, output_tokens=10)
    b.llm_start("s", 4, step=3, extends="answer")
    b.llm_end("s", 5, step=3, failed=True)                # left out, counted
    b.llm_start("s", 6, step=4, extends="request")       # its identical retry
    b.llm_end("s", 7, step=4, prompt_tokens=300, output_tokens=10)
    b.llm_start("s", 8, step=5)                           # continues nothing known
    b.llm_end("s", 9, step=5, prompt_tokens=50, output_tokens=10)
    b.session_end("s", 9, reason="final")
    [task] = b.take()
    assert [s["reused_prefix_tokens"] for s in task["steps"]] == [0, 100, 210, 0]
    assert task["failed_calls"] == 1 and "incomplete" not in task


def test_reuse_never_exceeds_the_prompt_and_user_turns_keep_their_gap():
    b = TraceBuilder()
    b.session_start("s", 0, workflow="wf")
    b.llm_start("s", 0, step=1)
    b.llm_end("s", 1, step=1, prompt_tokens=100, output_tokens=40)
    b.llm_start("s", 8.5, step=2, extends="answer")      # no tool between: a user's turn of 7.5 s
    b.llm_end("s", 9, step=2, prompt_tokens=120, output_tokens=5)
    b.session_end("s", 9, reason="idle")
    [task] = b.take()
    assert task["steps"][1]["reused_prefix_tokens"] == 120
    assert task["steps"][0]["idle_s"] == 7.5
    assert task["truncated"] is True and task["end_reason"] == "idle"
    assert materialize(task, random.Random(0)).steps[0].idle_s == 7.5


def test_missing_usage_is_estimated_from_characters_and_said_so():
    b = TraceBuilder()
    b.session_start("s", 0, workflow="wf")
    b.llm_start("s", 0, step=1, prompt_chars=3360)
    b.llm_end("s", 1, step=1, output_chars=336)
    b.session_end("s", 1, reason="submit")
    [task] = b.take()
    assert (task["steps"][0]["prompt_tokens"], task["steps"][0]["output_tokens"]) == (1000, 100)
    assert task["tokens_estimated"] is True


def test_a_tool_the_session_ended_on_has_no_duration():
    b = TraceBuilder()
    b.session_start("s", 0, workflow="wf")
    b.llm_start("s", 0, step=1)
    b.llm_end("s", 1, step=1, prompt_tokens=10, output_tokens=1)
    b.tool_start("s", 1, name="get_user", call_id="a")
    b.tool_end("s", 601, call_id="a")                    # cancelled by the idle end, not answered
    b.session_end("s", 601, reason="idle")
    [task] = b.take()
    assert task["steps"][0]["tools"] == [{"name": "get_user", "category": "api", "duration_s": None}]


def test_tool_names_may_be_hashed_and_categories_come_from_the_real_name():
    b = TraceBuilder(tool_name=lambda n: f"tool-{len(n)}")
    b.session_start("s", 0, workflow="wf")
    b.llm_start("s", 0, step=1)
    b.llm_end("s", 1, step=1, prompt_tokens=10, output_tokens=1)
    b.tool_start("s", 1, name="pytest", call_id="a")
    b.session_end("s", 2, reason="submit")
    assert b.take()[0]["steps"][0]["tools"][0] == {"name": "tool-6", "category": "test", "duration_s": None}


def test_memory_is_bounded_by_sessions_and_steps():
    b = TraceBuilder(max_sessions=2, max_steps=2)
    for sid in ("a", "b"):
        b.session_start(sid, 0, workflow="wf")
        b.llm_start(sid, 0, step=1)
        b.llm_end(sid, 1, step=1, prompt_tokens=10, output_tokens=1)
    b.session_start("c", 2, workflow="wf")              # "a" was quiet longest: it goes
    [gone] = b.take()
    assert (gone["task_id"], gone["end_reason"], gone["truncated"]) == ("a", "recorder_full", True)
    assert b.open_sessions == 2
    t = agent(b, "d", steps=4, t=3, end=None)
    b.session_end("d", t, reason="submit")
    evicted, long = b.take()
    assert evicted["task_id"] == "b"
    assert len(long["steps"]) == 2 and long["dropped_steps"] == 2 and long["truncated"] is True


def test_a_session_whose_end_never_comes_is_written_after_idle_s():
    b = TraceBuilder(idle_s=60)
    agent(b, "x", steps=2, end=None)
    b.expire(30)
    assert b.take() == []
    b.expire(100)
    [task] = b.take()
    assert (task["end_reason"], task["truncated"]) == ("recorder_idle", True)


def test_a_call_slower_than_idle_s_does_not_end_its_session():
    b = TraceBuilder(idle_s=4)
    b.session_start("s", 100.0, restart=False)
    step = b.llm_start("s", 100.0)
    b.expire(106.0)  # its answer takes 6 s: the session waits on it, it is not silent
    b.llm_end("s", 106.5, step=step, prompt_tokens=200, output_tokens=8)
    b.session_end("s", 107.0, reason="completed")
    [task] = b.take()
    assert [s["prompt_tokens"] for s in task["steps"]] == [200] and "incomplete" not in task


def test_facts_that_went_missing_mark_the_task_incomplete():
    b = TraceBuilder()
    b.llm_start("late", 0, step=3)                       # its start and two steps were never seen
    b.llm_end("late", 1, step=3, prompt_tokens=10, output_tokens=1)
    b.session_end("late", 1, reason="submit")
    assert b.take()[0]["incomplete"] is True
    agent(b, "fine", steps=2)
    assert "incomplete" not in b.take()[0]
    b.session_start("gap", 0, workflow="wf")
    for step in (1, 3):                                  # step 2 never arrived
        b.llm_start("gap", step, step=step)
        b.llm_end("gap", step + 0.5, step=step, prompt_tokens=10, output_tokens=1)
    b.session_end("gap", 4, reason="submit")
    assert b.take()[0]["incomplete"] is True
    b.session_start("lossy", 0, workflow="wf")
    b.lost = 1                                           # the owner dropped a batch meanwhile
    b.llm_start("lossy", 1, step=1)
    b.llm_end("lossy", 2, step=1, prompt_tokens=10, output_tokens=1)
    b.session_end("lossy", 2, reason="submit")
    assert b.take()[0]["incomplete"] is True


def test_close_writes_every_open_session_and_sessions_without_steps_are_left_out():
    b = TraceBuilder()
    agent(b, "open", steps=2, end=None)
    b.session_start("empty", 0, workflow="wf")
    b.close()
    [task] = b.take()
    assert (task["task_id"], task["end_reason"]) == ("open", "closed")


def test_a_revived_session_is_a_second_task_and_not_incomplete():
    b = TraceBuilder()
    t = agent(b, "s", steps=2, end="final")
    b.session_start("s", t + 5, workflow="wf")         # the proxy ended it too early: it came back
    b.llm_start("s", t + 5, step=3, extends="answer")   # its steps number on
    b.llm_end("s", t + 6, step=3, prompt_tokens=4000, output_tokens=9)
    b.session_end("s", t + 6, reason="submit")
    first, second = b.take()
    assert (len(first["steps"]), len(second["steps"])) == (2, 1)
    assert "incomplete" not in second and second["steps"][0]["reused_prefix_tokens"] == 0


# -- what an engine tells: tokens, its own step numbers, hints that race requests ----------

def seen(ids: list[int], size: int = 4) -> TokenBlocks:
    return TokenBlocks(ids, block_hashes(ids, size), size)


def engine_call(b: TraceBuilder, sid: str, t: float, prompt: list[int], answer: list[int]) -> int:
    step = b.llm_start(sid, t, tokens=seen(prompt))
    b.llm_end(sid, t + 1, step=step, prompt_tokens=len(prompt), output_tokens=len(answer),
              tokens=seen(prompt + answer))
    return step


def test_given_the_tokens_reuse_is_what_the_prompt_shares_with_the_last_prompt_and_answer():
    b = TraceBuilder()
    b.session_start("s", 0)
    p1, a1 = list(range(10)), [50, 51, 52]                 # 13 tokens: 3 whole blocks of 4, 1 past them
    p2 = p1 + a1 + [60, 61, 62, 63, 64]                   # continues the answer
    p3 = p2 + [70, 71] + [80] * 6                         # keeps only part of its answer
    p4 = p1[:6] + [99] * 10                               # breaks off inside a block
    steps = [engine_call(b, "s", k * 10, p, a) for k, (p, a) in enumerate(
        [(p1, a1), (p2, [70, 71, 72]), (p3, [1]), (p4, [2])])]
    b.session_end("s", 50, reason="completed")
    [task] = b.take()
    assert steps == [1, 2, 3, 4] and "incomplete" not in task    # the builder numbered the calls
    assert [st["reused_prefix_tokens"] for st in task["steps"]] == [0, 13, 20, 4]  # the last: to its block
    assert (task["end_reason"], task["truncated"]) == ("completed", False)  # the agent's own end


def test_a_call_shorter_than_a_block_is_compared_token_by_token():
    b = TraceBuilder()
    engine_call(b, "s", 0, [1, 2], [3])                   # no whole block of 4
    engine_call(b, "s", 2, [1, 2, 3, 9, 9, 9, 9, 9], [4])
    b.close()
    assert [st["reused_prefix_tokens"] for st in b.take()[0]["steps"]] == [0, 3]


def test_an_engine_start_joins_the_task_its_first_request_opened_and_the_tenant_is_written():
    b = TraceBuilder()
    b.session_start("s", 0, tenant="from-request", restart=False)  # the first request came first
    b.llm_start("s", 0)
    b.llm_end("s", 1, step=1, prompt_tokens=10, output_tokens=1)
    b.session_start("s", 1.5, workflow="wf", tenant="from-hint", restart=False)
    b.session_end("s", 2, reason="completed")
    [task] = b.take()
    assert (task["run"], task["tenant"], len(task["steps"])) == ("wf", "from-request", 1)
    assert "incomplete" not in task
    agent(b, "plain")
    assert "tenant" not in b.take()[0]                   # none said: no field (older files have none)


def test_a_tool_lasts_from_the_answer_to_the_next_request_whenever_its_hints_came():
    b = TraceBuilder()
    b.session_start("s", 0)
    b.llm_start("s", 0, step=1)
    b.llm_end("s", 1, step=1, prompt_tokens=10, output_tokens=1)
    b.tool_start("s", 1.2, name="pytest")                # no call id: known by its name
    b.tool_end("s", 3.0, name="pytest")
    b.llm_start("s", 3.5, step=2)                        # the gap: 2.5 s
    b.tool_start("s", 3.6, name="grep", call_id="g")     # told after the request that followed it
    b.llm_end("s", 4, step=2, prompt_tokens=20, output_tokens=1)
    b.tool_end("s", 4, call_id="g")
    b.session_end("s", 4, reason="completed")
    [task] = b.take()
    assert [t["duration_s"] for t in task["steps"][0]["tools"]] == [2.5, 2.5]
    assert "incomplete" not in task
    b.session_start("x", 0)
    b.llm_start("x", 0, step=1)
    b.llm_end("x", 1, step=1, prompt_tokens=10, output_tokens=1)
    b.tool_end("x", 2, name="never-started")
    b.session_end("x", 2, reason="completed")
    assert b.take()[0]["incomplete"] is True


def test_a_recorded_subagent_names_its_parent_and_replays_nested_in_the_step_that_spawned_it():
    from saga_server.bench.workload import nest_subagents

    b = TraceBuilder()
    b.session_start("lead", 0.0, workflow="wf")
    b.llm_start("lead", 0.0, step=1, model="m")
    b.llm_end("lead", 1.0, step=1, prompt_tokens=1000, output_tokens=50)
    b.tool_start("lead", 1.0, name="Task", call_id="t1")
    b.session_start("lead:kid", 1.0, workflow="wf", parent="lead")  # after the lead's first step
    for k in (1, 2):
        b.llm_start("lead:kid", 1.0 + k, step=k, extends="answer" if k > 1 else "", model="m")
        b.llm_end("lead:kid", 2.0 + k, step=k, prompt_tokens=800 * k, output_tokens=20)
    b.session_start("lead:kid", 4.0, parent="other", restart=False)  # the same session: its parent is kept
    b.session_end("lead:kid", 4.0, reason="submit")
    b.session_start("lone", 1.0, parent="nobody")
    b.llm_start("lone", 1.0, step=1, model="m")
    b.llm_end("lone", 2.0, step=1, prompt_tokens=500, output_tokens=5)
    b.session_end("lone", 2.0, reason="submit")
    b.tool_end("lead", 6.0, call_id="t1")
    for k in (2, 3):
        b.llm_start("lead", 5.0 + k, step=k, extends="answer", model="m")
        b.llm_end("lead", 6.0 + k, step=k, prompt_tokens=1000 * k, output_tokens=50)
    b.session_end("lead", 9.0, reason="submit")
    tasks = {t["task_id"]: t for t in b.take()}
    assert "parent_session_id" not in tasks["lead"]
    assert (tasks["lead:kid"]["parent_session_id"], tasks["lead:kid"]["parent_step"]) == ("lead", 0)
    assert (tasks["lone"]["parent_session_id"], tasks["lone"]["parent_step"]) == ("nobody", -1)
    roots = nest_subagents(list(tasks.values()))
    assert sorted(t["task_id"] for t in roots) == ["lead", "lone"]  # the kid runs inside the lead's tree
    lead = materialize(next(t for t in roots if t["task_id"] == "lead"), random.Random(0))
    assert [len(st.spawns) for st in lead.steps] == [1, 0, 0] and len(lead.steps[0].spawns[0].steps) == 2
    assert "spawns" not in tasks["lead"]["steps"][0]  # the input is left as it was
