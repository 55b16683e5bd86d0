"""A session's prefix KV moves between two real engines over NIXL (`saga serve
--kv-transfer nixl`, UCX in DRAM on this CPU): the target pulls the source's blocks,
computes only the last token, and the session's next request there hits its prefix
cache and answers as the source would at temperature 0. With the source gone the
move falls back to re-prefilling on the target, and nothing fails. NIXL's CPU pinning
of the engine worker is undone, and an idle engine spins no core for NIXL
(`engines/vllm/nixl.py`).

STARTS ITS OWN ENGINES: two `saga serve --kv-transfer nixl` (80 KV blocks, 2
sequences each) with the compute threads unbound (`VLLM_CPU_OMP_THREADS_BIND=nobind`,
one OpenMP thread: two engines bound by default share one core), beside the tier's
shared one, which it still takes so that the model is prepared. Run it alone:

    .venv/bin/python -m pytest tests/real/serve/test_kv_move_real.py -q
"""

from __future__ import annotations

import importlib.util
import os
import random
import subprocess
import time
from pathlib import Path

import pytest

from saga_server.router.kv_move import move_prefix
from saga_server.serve_child import free_port
from tests.support.http import REQUEST_TIMEOUT_S
from tests.support.own_engine import OwnEngine

# Not imported here: NIXL's native libraries in the test process crash grpc_tools' protoc
# (tests/fast/test_proto.py), and the engines load it themselves.
pytestmark = pytest.mark.skipif(importlib.util.find_spec("nixl") is None,
                                reason="the ray extra installs NIXL (scripts/setup.sh)")

READY_TIMEOUT_S = 600  # two cold engine starts side by side on a busy 2-core machine
BLOCK = 32
PREFIX = 1000  # tokens: 31 full blocks move, the partial last one is recomputed


def nixl_engine(name: str, tmp: Path) -> OwnEngine:
    return OwnEngine(name, tmp, ["--kv-transfer", "nixl", "--nixl-port", str(free_port()),
                                 "--num-gpu-blocks-override", "80", "--max-num-seqs", "2", "--max-model-len", "2048"])


@pytest.fixture(scope="module")
def engines(saga_server, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("kv-move-real")
    pair = [nixl_engine("source", tmp), nixl_engine("target", tmp)]
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        for engine in pair:
            engine.wait_ready(max(0.0, deadline - time.monotonic()))
        yield pair
    finally:
        for engine in pair:
            engine.stop()


def prompt_of(seed: int, n: int) -> list[int]:
    rnd = random.Random(seed)
    return [rnd.randrange(1000, 40000) for _ in range(n)]


def worker_pids(serve_pid: int) -> list[int]:
    """The engine worker processes under `serve_pid`."""
    out = subprocess.run(["pgrep", "-f", "VLLM::Worker"], capture_output=True, text=True).stdout.split()
    pids = []
    for pid in map(int, out):
        parent = pid
        while parent > 1 and parent != serve_pid:
            parent = int(Path(f"/proc/{parent}/stat").read_text().rsplit(")", 1)[1].split()[1])
        if parent == serve_pid:
            pids.append(pid)
    return pids


def worker_affinities(serve_pid: int) -> list[str]:
    """Cpus_allowed_list of every thread of the engine workers under `serve_pid`."""
    lists = []
    for pid in worker_pids(serve_pid):
        for task in Path(f"/proc/{pid}/task").iterdir():
            for line in (task / "status").read_text().splitlines():
                if line.startswith("Cpus_allowed_list:"):
                    lists.append(line.split(":", 1)[1].strip())
    return lists


def worker_cpu_s(serve_pid: int) -> float:
    """CPU seconds the engine workers under `serve_pid` have used, all threads."""
    ticks = 0
    for pid in worker_pids(serve_pid):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


def test_a_moved_prefix_is_pulled_and_the_next_request_computes_only_the_new_tokens(engines, saga_server):
    source, target = engines
    model = saga_server.model
    prefix = prompt_of(1, PREFIX)
    following = prefix + prompt_of(2, 20)  # the session's next request: the prefix and a tool's output
    # What the source answers for the next request (computed there first, so the source has
    # the prefix cached as a session's home engine would).
    expected = source.complete(model, following)["choices"][0]["token_ids"]

    before, counted = target.computed_tokens(), target.metrics("saga_kv_pull")
    move = move_prefix(source.base_url, target.base_url, model, prefix, timeout_s=REQUEST_TIMEOUT_S)
    assert move.pulled and move.warm and move.fallback == "", move
    assert move.pulled_tokens == PREFIX
    assert target.computed_tokens() - before <= 1 + 1  # the last prompt token (and its output), nothing else
    # The engine's own count of what it pulled (vLLM reports such tokens as computed, not cached).
    now = target.metrics("saga_kv_pull")
    pulled = now["saga_kv_pulled_tokens_total"] - counted.get("saga_kv_pulled_tokens_total", 0.0)
    assert PREFIX // BLOCK * BLOCK <= pulled <= PREFIX
    assert now["saga_kv_pulls_total{outcome=ok}"] - counted.get("saga_kv_pulls_total{outcome=ok}", 0.0) == 1

    before = target.computed_tokens()
    out = target.complete(model, following)
    cached = out["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached == PREFIX // BLOCK * BLOCK  # every full block of the prefix, pulled
    assert out["choices"][0]["token_ids"] == expected  # the pulled KV is the source's
    assert target.computed_tokens() - before <= len(following) - cached + 12


def test_with_the_source_gone_the_move_re_prefills_on_the_target_without_error(engines, saga_server):
    source, target = engines
    model = saga_server.model
    prefix = prompt_of(3, PREFIX)
    source.complete(model, prefix, max_tokens=1)
    # The source hands out its blocks for a pull, then dies before the target reads them.
    handle = source.post("/v1/completions", {"model": model, "prompt": prefix, "max_tokens": 1,
                                             "kv_transfer_params": {"do_remote_decode": True}})["kv_transfer_params"]
    assert handle and handle.get("remote_block_ids"), handle
    source.stop()

    counted = target.metrics("saga_kv_pull")
    started = time.monotonic()
    out = target.post("/v1/completions", {"model": model, "prompt": prefix, "max_tokens": 1, "temperature": 0.0,
                                          "kv_transfer_params": handle})
    took = time.monotonic() - started
    assert out["choices"][0]["finish_reason"] == "length"  # answered: the failed read was recomputed
    now = target.metrics("saga_kv_pull")
    failed = "saga_kv_pulls_total{outcome=failed}"
    assert now.get(failed, 0.0) - counted.get(failed, 0.0) == 1, now
    assert now.get("saga_kv_pulled_tokens_total", 0.0) == counted.get("saga_kv_pulled_tokens_total", 0.0)
    print(f"pull from a dead source: answered in {took:.2f} s after recomputing")

    # A move started now finds no source and re-prefills.
    prefix = prompt_of(5, PREFIX)
    move = move_prefix(source.base_url, target.base_url, model, prefix, timeout_s=REQUEST_TIMEOUT_S)
    assert not move.pulled and move.warm and "source unreachable" in move.fallback
    assert move.pulled_tokens == 0
    out = target.complete(model, prefix + prompt_of(4, 20))
    assert out["usage"]["prompt_tokens_details"]["cached_tokens"] == PREFIX // BLOCK * BLOCK  # re-prefilled


def test_nixl_no_longer_pins_the_engine_worker_to_one_core(engines):
    cores = os.sched_getaffinity(0)
    if len(cores) < 2:
        pytest.skip("one core: nothing to pin away from")
    target = engines[1]
    lists = worker_affinities(target.proc.pid)
    assert lists, "no engine worker threads found"
    # NIXL pins the worker's main thread to the last core; SAGA's connector puts it back.
    single = [cpus for cpus in lists if "-" not in cpus and "," not in cpus]
    assert single == [], f"threads pinned to one core: {single}"


def test_an_idle_engine_with_nixl_spins_no_core(engines):
    # NIXL's progress thread polls with a zero delay: a whole core per idle engine.
    # SAGA's connector runs the agent without it on CPU builds (engines/vllm/nixl.py).
    target = engines[1]
    assert worker_pids(target.proc.pid), "no engine worker found"
    time.sleep(2)  # let the previous test's requests settle
    window_s = 6.0
    before = worker_cpu_s(target.proc.pid)
    time.sleep(window_s)
    busy = (worker_cpu_s(target.proc.pid) - before) / window_s
    assert busy < 0.25, f"an idle engine's worker used {busy:.0%} of a core"
