"""PrefixCache and the timeless replay on hand-checkable cases, and Belady's optimality."""

from __future__ import annotations

import random

import pytest

from saga_server.engines.sim import HostTier, PrefixCache, replay_accesses
from saga_server.engines.sim.cache import PINNED, PROTECTED, SOFT
from saga_server.engines.sim.offline import ORDERS


def idle(cache: PrefixCache, sid: str, blocks: int, key: float, tier: int = SOFT) -> None:
    """A request of `sid` ran on `blocks` and left them held in `tier` (as the KV policy would)."""
    cache.admit(sid, 0, blocks)
    cache.ledger.release(sid, "arrival")
    hold = cache.ledger.hold(sid, cache.request_blocks(sid, blocks * cache.block_tokens), key=key, now=0.0,
                             tier=SOFT if tier == PINNED else tier, pin_ttl_s=1e9 if tier == PINNED else 0.0)
    assert hold.tier == tier
    cache.unreserve(sid)


def make_room(cache: PrefixCache, blocks: int, **kw):
    return cache.evictions(cache.ledger.make_room(blocks, **kw))


def test_lru_evicts_the_least_recent_entry_first_and_tail_first():
    cache = PrefixCache(10, block_tokens=16)
    idle(cache, "a", 4, key=1.0)
    idle(cache, "b", 4, key=2.0)
    assert cache.free_blocks == 2
    evs = cache.admit("c", 0, 5)  # needs 3 more blocks than free: all from a, the oldest
    assert [(e.session_id, e.from_blocks, e.to_blocks) for e in evs] == [("a", 4, 1)]
    assert cache.cached("a") == 1 and cache.cached("b") == 4  # a keeps its head block
    evs = cache.admit("d", 0, 2)  # takes a's last block, then one from b's tail
    assert [(e.session_id, e.to_blocks) for e in evs] == [("a", 0), ("b", 3)]


def test_pinned_entries_go_only_when_nothing_unpinned_is_left():
    cache = PrefixCache(8, block_tokens=1)
    idle(cache, "pinned-old", 4, key=0.0, tier=PINNED)
    idle(cache, "new", 4, key=9.0)
    cache.admit("x", 0, 4)
    assert cache.cached("pinned-old") == 4 and cache.cached("new") == 0
    cache.ledger.set_key("pinned-old", 0.0, SOFT)
    cache.keep("x", 4, key=5.0)
    cache.admit("y", 0, 4)
    assert cache.cached("pinned-old") == 0 and cache.cached("x") == 4


def test_queued_sessions_keep_their_kv_after_pins_and_the_back_of_the_queue_goes_first():
    cache = PrefixCache(12, block_tokens=1)
    idle(cache, "queued-head", 3, key=-1.0, tier=PROTECTED)  # arrived at t=1
    idle(cache, "queued-back", 3, key=-5.0, tier=PROTECTED)  # arrived at t=5
    idle(cache, "pinned", 3, key=0.0, tier=PINNED)
    idle(cache, "soft", 3, key=100.0)
    evs = cache.admit("new", 0, 9)
    assert [e.session_id for e in evs] == ["soft", "pinned", "queued-back"]
    assert cache.cached("queued-head") == 3 and cache.tier("queued-head") == PROTECTED


def test_admit_keeps_the_requested_prefix_and_refuses_what_cannot_fit():
    cache = PrefixCache(10, block_tokens=1)
    idle(cache, "s", 6, key=1.0)
    assert cache.can_admit("s", 6, 10)
    assert not cache.can_admit("s", 6, 11)
    cache.admit("s", 4, 9)
    cache.ledger.release("s", "arrival")  # the request references its prefix now
    assert cache.active_blocks == 9 and cache.cached_blocks == 0 and cache.free_blocks == 1
    cache.admit("t", 0, 1)
    assert not cache.can_admit("u", 0, 1)  # all the rest is active


def test_useful_blocks_integrate_over_time_until_a_session_ends():
    now = [0.0]
    cache = PrefixCache(10, block_tokens=1, clock=lambda: now[0])
    idle(cache, "a", 4, key=1.0)
    now[0] = 2.0
    cache.flush_time()  # 4 useful blocks for 2 s
    cache.ledger.release("a", "session_end")
    now[0] = 5.0
    cache.flush_time()  # then 0 useful blocks for 3 s
    assert cache.useful_block_seconds == pytest.approx(8.0)
    assert cache.useful_blocks == 0


def test_host_tier_drops_the_lowest_key_tail_first_beyond_capacity():
    host = HostTier(10)
    host.offload("a", 4, key=1.0)
    host.offload("b", 5, key=2.0)
    host.offload("a", 6, key=3.0)  # a grows and is re-keyed: b is now the lowest
    assert host.end("a") == 6 and host.end("b") == 4  # one block over: b's tail block goes
    host.offload("c", 9, key=0.5)  # nine over, and c has the lowest key: all of c goes
    assert host.end("c") == 0 and host.end("a") == 6 and host.end("b") == 4


def test_what_the_host_tier_takes_is_written_to_its_disk_tier_too_which_drops_in_the_same_order():
    host = HostTier(10, disk_blocks=20)
    host.offload("a", 6, key=1.0)
    assert host.disk_end("a") == 6  # written through
    host.offload("b", 6, key=2.0)  # two over: a (lowest key) loses its last two blocks
    assert host.end("a") == 4 and host.disk_end("a") == 6  # the disk keeps a's whole copy
    assert host.reach("a") == 6
    host.offload("c", 9, key=3.0)  # nine over here: the rest of a, then five of b; one over on disk
    assert (host.end("a"), host.end("b"), host.end("c")) == (0, 1, 9)
    assert (host.disk_end("a"), host.disk_end("b"), host.disk_end("c")) == (5, 6, 9)  # a's tail first
    host.offload("d", 8, key=0.1)  # d has the lowest key: both tiers drop all of it first
    assert host.end("d") == host.disk_end("d") == 0
    host.drop("a")  # a session forgotten: both copies go
    assert host.end("a") == host.disk_end("a") == 0
    assert HostTier(10).disk_end("a") == 0  # no disk tier: nothing below


def test_replay_lru_on_a_cyclic_pattern_misses_every_time_and_belady_keeps_one():
    # Three sessions of 4 tokens in turn, capacity 8: LRU always evicts the next one.
    acc = [(s, 4) for _ in range(4) for s in "abc"]
    assert replay_accesses(acc, 8, "lru") == 9 * 4  # every revisit is a full miss
    # Belady evicts the one used farthest ahead: it misses one in two revisits.
    assert replay_accesses(acc, 8, "belady") < replay_accesses(acc, 8, "lru")


def test_replay_counts_partial_hits_of_a_growing_prefix():
    # a grows from 4 to 6 tokens; b (3 tokens) forces 1 block of a's tail out.
    acc = [("a", 4), ("b", 3), ("a", 6)]
    assert replay_accesses(acc, 7, "lru") == 0  # all fit: a's 4 old tokens hit
    assert replay_accesses(acc, 6, "lru") == 1  # a lost its 4th token: recomputed


@pytest.mark.parametrize("seed", range(40))
def test_belady_recomputes_no_more_than_any_online_order(seed):
    rng = random.Random(seed)
    sessions = [f"s{i}" for i in range(rng.randint(2, 6))]
    length = {s: rng.randint(1, 4) for s in sessions}
    acc = []
    for _ in range(rng.randint(5, 40)):
        s = rng.choice(sessions)
        length[s] += rng.randint(0, 3)  # append-only growth
        acc.append((s, length[s]))
    cap = max(t for _, t in acc) + rng.randint(0, 10)
    best = replay_accesses(acc, cap, "belady")
    keys = dict(ORDERS)
    r = random.Random(seed + 1000)
    keys["random"] = lambda s, i, nxt: r.random()
    keys["size"] = lambda s, i, nxt: -length[s]
    for name, key in keys.items():
        assert best <= replay_accesses(acc, cap, key), name


def test_a_reused_entry_is_ordered_by_its_new_key_not_a_stale_heap_item():
    cache = PrefixCache(10, block_tokens=1)
    idle(cache, "a", 3, key=1.0)  # a's first entry leaves a heap item at key 1
    cache.admit("a", 3, 3)  # a runs again ...
    cache.keep("a", 3, 5.0)  # ... and is idle again, now the most recent
    idle(cache, "b", 3, key=3.0)
    evs = make_room(cache, 7)
    assert [e.session_id for e in evs] == ["b"]  # LRU: b (3) before a (5)
    assert cache.cached("a") == 3


def test_a_move_frees_an_entry_at_once_without_counting_an_eviction():
    cache = PrefixCache(10, block_tokens=1)
    idle(cache, "a", 4, key=1.0)
    assert cache.holds("a") and cache.ledger.release("a", "moved") == 4
    assert not cache.holds("a") and cache.free_blocks == 10 and cache.evicted_blocks == 0
    assert cache.ledger.release("a", "moved") == 0
    idle(cache, "a", 2, key=9.0)  # a later entry of the same session is not hit by old heap items
    idle(cache, "b", 2, key=2.0)
    assert [e.session_id for e in make_room(cache, 8)] == ["b"]


def test_make_room_up_to_a_tier_leaves_pins_alone():
    cache = PrefixCache(10, block_tokens=1)
    idle(cache, "soft", 3, key=5.0)
    idle(cache, "pinned", 5, key=1.0, tier=PINNED)
    evs = make_room(cache, 8, max_tier=SOFT)
    assert [(e.session_id, e.to_blocks) for e in evs] == [("soft", 0)]
    assert cache.free_blocks == 5 and cache.cached("pinned") == 5
    assert [e.session_id for e in make_room(cache, 8)] == ["pinned"]  # without the limit it goes
