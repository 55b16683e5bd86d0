"""`HoldLedger`: release order, pin budget and TTL, forward progress, exact accounting.

`RefPool` is a reference-counting block pool shaped like vLLM's `BlockPool` (blocks
are objects with a `ref_cnt`, free means `ref_cnt == 0`, sessions may share leading
blocks), so the ledger is tested against the semantics it meets in the engine; the
engine's own pool is covered in tests/fast/vllm.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from saga_server.core.holds import PINNED, PROTECTED, SOFT, HoldLedger


class Block:
    __slots__ = ("bid", "ref_cnt")

    def __init__(self, bid: int) -> None:
        self.bid = bid
        self.ref_cnt = 0

    def __repr__(self) -> str:
        return f"B{self.bid}"


class RefPool:
    def __init__(self, n: int) -> None:
        self.blocks = [Block(i) for i in range(n)]

    def allocate(self, n: int) -> list[Block]:
        free = [b for b in self.blocks if b.ref_cnt == 0][:n]
        assert len(free) == n, "allocation failed"
        for b in free:
            b.ref_cnt = 1
        return free

    def touch(self, session_id, blocks) -> None:
        for b in blocks:
            b.ref_cnt += 1

    def free(self, session_id, blocks) -> int:
        freed = 0
        for b in blocks:
            assert b.ref_cnt > 0
            b.ref_cnt -= 1
            freed += b.ref_cnt == 0
        return freed

    def num_free(self) -> int:
        return sum(b.ref_cnt == 0 for b in self.blocks)


def idle(pool: RefPool, ledger: HoldLedger, sid: str, n: int, key: float, *, head=(), ttl=0.0,
         tier=SOFT, now=0.0) -> list[Block]:
    """A request of `sid` over `head` (shared blocks) plus `n` new blocks finishes
    and the ledger holds its prefix, as the plugin does (hold first, then the free)."""
    pool.touch(sid, head)
    blocks = list(head) + pool.allocate(n)
    ledger.hold(sid, blocks, key=key, now=now, pin_ttl_s=ttl, tier=tier)
    pool.free(sid, blocks)
    return blocks


def released(ledger, need, **kw) -> list[tuple[str, int, int]]:
    return [(r.session_id, r.before, r.after) for r in ledger.make_room(need, **kw)]


def test_soft_holds_go_before_pins_and_pins_before_protected_each_by_key_tail_first():
    pool = RefPool(16)
    ledger = HoldLedger(pool, 16, max_pin_fraction=1.0)
    idle(pool, ledger, "protected", 3, key=-5.0, tier=PROTECTED)
    idle(pool, ledger, "pinned-late", 3, key=1.0, ttl=60)
    idle(pool, ledger, "pinned-early", 3, key=0.5, ttl=60)
    idle(pool, ledger, "soft-new", 3, key=9.0)
    old = idle(pool, ledger, "soft-old", 3, key=2.0)
    assert pool.num_free() == 1
    assert released(ledger, 3) == [("soft-old", 3, 1)]
    assert ledger.get("soft-old").blocks == old[:1]  # two blocks from the tail: the head survives
    assert released(ledger, 12) == [("soft-old", 1, 0), ("soft-new", 3, 0), ("pinned-early", 3, 0),
                                    ("pinned-late", 3, 1)]
    assert released(ledger, 14) == [("pinned-late", 1, 0), ("protected", 3, 2)]
    assert ledger.blocks_of("protected") == 2 and pool.num_free() == 14


def test_a_pin_over_the_budget_is_held_soft_and_expiry_makes_a_pin_soft():
    pool = RefPool(20)
    ledger = HoldLedger(pool, 20, max_pin_fraction=0.5)
    idle(pool, ledger, "a", 6, key=1.0, ttl=10)
    held = idle(pool, ledger, "b", 6, key=2.0, ttl=10)  # 12 > 10 pinned: refused
    assert ledger.get("a").tier == PINNED and ledger.get("b").tier == SOFT
    assert "+over_budget" in ledger.get("b").reason and ledger.pinned_blocks == 6
    assert not ledger.pin("b", 10, now=0.0) and ledger.get("b").blocks == held
    assert ledger.expire(9.9) == [] and ledger.expire(10.0) == ["a"]
    assert ledger.get("a").tier == SOFT and ledger.pinned_blocks == 0
    assert ledger.pin("b", 5, now=10.0) and ledger.expire(15.0) == ["b"]


def test_one_owner_pins_no_more_than_its_cap_and_other_owners_still_pin():
    pool = RefPool(40)
    caps = {"a": 8}
    ledger = HoldLedger(pool, 40, max_pin_fraction=1.0, owner_pin_cap=caps.get)
    for sid in ("a1", "a2"):
        pool.touch(sid, [])
        blocks = pool.allocate(5)
        ledger.hold(sid, blocks, key=1.0, now=0.0, pin_ttl_s=10, owner="a")
        pool.free(sid, blocks)
    idle(pool, ledger, "b1", 5, key=1.0, ttl=10)  # no owner: no cap
    assert [ledger.get(s).tier for s in ("a1", "a2", "b1")] == [PINNED, SOFT, PINNED]
    assert ledger.get("a2").refused == "over_owner_cap" and "+over_owner_cap" in ledger.get("a2").reason
    assert (ledger.pinned_of("a"), ledger.pinned_of(""), ledger.pinned_blocks) == (5, 5, 10)
    assert not ledger.pin("a2", 10, now=1.0)  # still over the cap: the hold stays as it was
    ledger.release("a1", "session_end")
    assert ledger.pinned_of("a") == 0 and ledger.pin("a2", 10, now=1.0) and ledger.pinned_of("a") == 5
    assert ledger.get("a2").refused == ""


def test_pressure_counts_what_cannot_be_had_on_demand_not_idle_sessions_soft_kv():
    pool = RefPool(20)
    ledger = HoldLedger(pool, 20, max_pin_fraction=1.0)
    running = pool.allocate(4)  # a request's blocks
    for i in range(4):
        idle(pool, ledger, f"idle{i}", 4, key=float(i))  # the rest of the pool: cached idle sessions
    assert pool.num_free() == 0
    assert ledger.pressure() == pytest.approx(4 / 20)  # only the running request presses
    ledger.pin("idle0", 30.0, now=0.0)
    ledger.set_key("idle1", 1.0, PROTECTED)
    assert ledger.pressure() == pytest.approx(12 / 20)
    ledger.expire(30.0)  # the pin ran out: idle0's KV is cached again
    assert ledger.pressure() == pytest.approx(8 / 20)
    pool.free("r", running)
    ledger.release("idle1", "session_end")
    assert ledger.pressure() == 0.0


def test_the_session_being_allocated_for_is_released_last():
    pool = RefPool(8)
    ledger = HoldLedger(pool, 8)
    idle(pool, ledger, "me", 4, key=0.0)  # lowest key: would go first
    idle(pool, ledger, "other", 4, key=5.0)
    assert released(ledger, 4, spare="me") == [("other", 4, 0)]
    assert released(ledger, 6, spare="me") == [("me", 4, 2)]
    assert ledger.blocks_of("me") == 2


def test_shared_blocks_free_nothing_until_their_last_holder_lets_go():
    pool = RefPool(10)
    ledger = HoldLedger(pool, 10)
    head = pool.allocate(4)  # a system prompt every session starts with
    idle(pool, ledger, "a", 2, key=1.0, head=head)
    idle(pool, ledger, "b", 2, key=2.0, head=head)
    pool.free("boot", head)
    assert pool.num_free() == 2
    # a's own tail frees 2; its head is b's too, so a goes entirely and b's tail follows
    assert released(ledger, 5) == [("a", 6, 0), ("b", 6, 5)]
    assert pool.num_free() == 5


def test_replacing_a_hold_never_frees_its_shared_blocks_in_between():
    pool = RefPool(6)
    ledger = HoldLedger(pool, 6)
    blocks = idle(pool, ledger, "a", 4, key=1.0)
    seen = []
    original_free = pool.free
    pool.free = lambda sid, bs: seen.append(pool.num_free()) or original_free(sid, bs)
    ledger.hold("a", blocks[:3], key=2.0, now=1.0)  # the next request's prefix, one block shorter
    assert seen == [2] and pool.num_free() == 3 and ledger.held_blocks == 3


def test_reasons_reach_the_release_hook():
    pool = RefPool(6)
    seen = []
    ledger = HoldLedger(pool, 6, on_release=lambda r: seen.append((r.session_id, r.reason, r.before - r.after)))
    idle(pool, ledger, "a", 2, key=1.0)
    idle(pool, ledger, "b", 2, key=0.0, ttl=5)
    ledger.make_room(4)
    ledger.release("b", "session_end")
    assert seen == [("a", "wa_lru", 2), ("b", "session_end", 2)]


def test_a_pin_is_taken_only_through_the_budget():
    ledger = HoldLedger(RefPool(4), 4)
    with pytest.raises(ValueError):
        ledger.hold("a", [Block(0)], key=0.0, now=0.0, tier=PINNED)
    with pytest.raises(ValueError):
        HoldLedger(RefPool(4), 4, max_pin_fraction=1.5)


class LedgerMachine(RuleBasedStateMachine):
    """Random request finishes (some sharing a head), re-keys, pins, queued arrivals,
    clock ticks, releases and allocations against the reference pool."""

    N = 24

    def __init__(self) -> None:
        super().__init__()
        self.pool = RefPool(self.N)
        # Even sessions belong to owner t0, which may pin 5 blocks; odd ones to t1 (no cap).
        self.ledger = HoldLedger(self.pool, self.N, max_pin_fraction=0.4,
                                 owner_pin_cap=lambda owner: 5 if owner == "t0" else None)
        self.now = 0.0
        self.head = self.pool.allocate(2)  # held by a long-lived request (the shared prefix)
        self.running: dict[str, list[Block]] = {}

    @rule(sid=st.integers(0, 7), n=st.integers(1, 6), shared=st.booleans(), key=st.floats(-10, 10),
          ttl=st.sampled_from([0.0, 0.0, 3.0, 30.0]))
    def start_and_finish(self, sid, n, shared, key, ttl):
        """A request of the session allocates what it needs (reclaiming held KV first,
        as the plugin does on a failed allocation), then finishes into a hold."""
        s = f"s{sid}"
        head = self.head if shared else []
        if not self._fits(n):
            return  # stock vLLM could not run it either
        self._allocate(n, spare=s)
        self.pool.touch(s, head)
        blocks = list(head) + self.pool.allocate(n)
        self.ledger.hold(s, blocks, key=key, now=self.now, pin_ttl_s=ttl, owner=f"t{sid % 2}")
        self.pool.free(s, blocks)

    @rule(sid=st.integers(0, 7), n=st.integers(1, 10))
    def run(self, sid, n):
        s = f"r{sid}"
        if s not in self.running and self._fits(n):
            self._allocate(n)
            self.running[s] = self.pool.allocate(n)

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def finish_running(self, data):
        s = data.draw(st.sampled_from(sorted(self.running)))
        self.pool.free(s, self.running.pop(s))

    @rule(sid=st.integers(0, 7), key=st.floats(-10, 10), protect=st.booleans())
    def rekey(self, sid, key, protect):
        self.ledger.set_key(f"s{sid}", key, PROTECTED if protect else SOFT)

    @rule(sid=st.integers(0, 7), ttl=st.floats(0.5, 30))
    def pin(self, sid, ttl):
        before = self.ledger.pinned_blocks
        if not self.ledger.pin(f"s{sid}", ttl, self.now):
            assert self.ledger.pinned_blocks == before

    @rule(dt=st.floats(0, 20))
    def tick(self, dt):
        self.now += dt
        self.ledger.expire(self.now)
        for sid in self.ledger.sessions():
            hold = self.ledger.get(sid)
            assert hold.tier != PINNED or hold.expires_at > self.now  # no pin outlives its TTL

    @rule(sid=st.integers(0, 7))
    def end(self, sid):
        self.ledger.release(f"s{sid}", "session_end")
        assert f"s{sid}" not in self.ledger  # no hold outlives its session

    @rule(n=st.integers(1, 24))
    def allocate(self, n):
        self._allocate(n)

    def _allocate(self, n: int, spare: str | None = None) -> None:
        """Stock vLLM could allocate `n` if it fits beside what requests reference;
        then, after `make_room`, SAGA can too. Released in the documented order."""
        order = []
        for r in self.ledger.make_room(n, spare=spare):
            order.append((r.session_id == spare, r.tier))
        assert order == sorted(order), order  # tiers in order, the spare last
        if self._fits(n):
            assert self.pool.num_free() >= n

    def _fits(self, n: int) -> bool:
        return n <= self.N - len({b.bid for b in self._request_blocks()})

    def _request_blocks(self) -> list[Block]:
        return [b for blocks in self.running.values() for b in blocks] + list(self.head)

    @invariant()
    def accounting_is_exact(self):
        refs = {b.bid: 0 for b in self.pool.blocks}
        for b in self._request_blocks():
            refs[b.bid] += 1
        held = pinned = soft = 0
        by_owner = {"t0": 0, "t1": 0}
        for sid in self.ledger.sessions():
            hold = self.ledger.get(sid)
            assert hold.blocks
            for b in hold.blocks:
                refs[b.bid] += 1
            held += len(hold.blocks)
            pinned += len(hold.blocks) if hold.tier == PINNED else 0
            soft += len(hold.blocks) if hold.tier == SOFT else 0
            by_owner[hold.owner] += len(hold.blocks) if hold.tier == PINNED else 0
        assert all(b.ref_cnt == refs[b.bid] for b in self.pool.blocks)
        assert (self.ledger.held_blocks, self.ledger.pinned_blocks, self.ledger.soft_blocks) == (held, pinned, soft)
        assert pinned <= self.ledger.max_pin_blocks
        assert {o: self.ledger.pinned_of(o) for o in by_owner} == by_owner and by_owner["t0"] <= 5
        assert all(self.ledger.get(s).expires_at == math.inf for s in self.ledger.sessions()
                   if self.ledger.get(s).tier != PINNED)


TestLedger = LedgerMachine.TestCase
TestLedger.settings = settings(max_examples=80, stateful_step_count=40, deadline=None)
