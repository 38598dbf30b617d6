"""Property tests: random sequences of appends against both stores.

After every step the store's window must equal the naive reference model's,
and must satisfy the invariants on its own: within both bounds, pinned messages
first and all present, no orphaned tool message, order preserved, and a suffix
of whole exchanges (only the oldest visible exchange may have lost blocks from
its front, and only the newest may hide an unfinished round at its end).
"""

from __future__ import annotations

import json
import random
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from durable_agents.memory import (
    InMemoryStore,
    MemoryInputError,
    MemoryPolicy,
    Message,
    SQLiteStore,
    ToolCall,
    approx_tokens,
)
from tests.memory_support import (
    ReferenceModel,
    check_stats_bound,
    check_window,
    text_of,
    with_content,
)

CID = "conv-1"


def char_counter(m: Message) -> int:
    """A second, simpler counter, to show the rule does not depend on the default one."""
    return 1 + len(m.content) // 8 + sum(2 + len(c.arguments) // 8 for c in m.tool_calls)


SIZES = st.sampled_from([0, 1, 5, 20, 60, 150, 400, 1200, 4000])
_USER = st.tuples(st.just("user"), SIZES)
_SAY = st.tuples(st.just("say"), SIZES)
_CALL = st.tuples(st.just("call"), st.integers(1, 3), st.sampled_from([0, 10, 80, 400, 4000]))
_RESULT = st.tuples(st.just("result"), st.integers(0, 5), SIZES)
# Weighted by repetition: mostly well-formed traffic, with mistakes, retries and reopens mixed in.
ACTIONS = st.one_of(
    _USER, _USER, _USER,
    _SAY, _SAY,
    _CALL, _CALL, _CALL,
    _RESULT, _RESULT, _RESULT, _RESULT, _RESULT, _RESULT,
    st.tuples(st.just("bogus"), SIZES),
    st.tuples(st.just("stale"), st.integers(0, 50), SIZES),
    st.tuples(st.just("pin"), st.sampled_from([1, 20, 100, 600])),
    st.tuples(st.just("retry"), st.integers(1, 12), st.booleans()),
    st.tuples(st.just("retry"), st.integers(1, 12), st.just(True)),
    st.tuples(st.just("reopen")),
)
POLICIES = st.builds(
    MemoryPolicy,
    max_tokens=st.integers(20, 700),
    max_messages=st.integers(2, 16),
    oversize=st.sampled_from(["truncate", "reject"]),
    token_counter=st.sampled_from([approx_tokens, char_counter]),
)


class Driver:
    """Plays actions on a store and the model side by side, checking after each."""

    def __init__(self, policy: MemoryPolicy, kind: str, directory: Path) -> None:
        self.policy = policy
        self.kind = kind
        self.path = directory / "memory.db"
        self.model = ReferenceModel(policy)
        self.abandoned: set[str] = set()
        self.store = self._open()
        self.history: list[Message] = []  # accepted, in order
        self.exchange_of: dict[str, int] = {}
        self.exchange = 0
        self.pinned_ids: list[str] = []
        self.call_ids: list[str] = []
        self.rng = random.Random(0)
        self.n = 0

    def _hook(self, event) -> None:
        if event.reason == "abandoned":
            self.abandoned.update(event.message_ids)

    def _open(self):
        if self.kind == "memory":
            return InMemoryStore(self.policy, on_evict=self._hook)
        return SQLiteStore(self.path, self.policy, on_evict=self._hook)

    def build(self, action: tuple) -> Message | None:
        self.n += 1
        n = self.n
        kind = action[0]
        if kind == "user":
            return Message(f"u{n}", "user", text_of(self.rng, action[1]))
        if kind == "say":
            return Message(f"a{n}", "assistant", text_of(self.rng, action[1]))
        if kind == "call":
            calls = tuple(ToolCall(f"c{n}.{k}", "lookup", json.dumps({"q": text_of(self.rng, action[2])}))
                          for k in range(action[1]))
            self.call_ids.extend(c.id for c in calls)
            return Message(f"a{n}", "assistant", "", calls)
        if kind == "result":
            waiting = sorted(self.model.pending | self.model.orphaned)
            if not waiting:  # nothing to answer: say something instead
                return Message(f"a{n}", "assistant", text_of(self.rng, action[2]))
            call_id = waiting[action[1] % len(waiting)]
            return Message(f"t{n}", "tool", text_of(self.rng, action[2]), tool_call_id=call_id)
        if kind == "bogus":
            return Message(f"t{n}", "tool", text_of(self.rng, action[1]), tool_call_id=f"nobody{n}")
        if kind == "stale":
            # A call made earlier: answered, abandoned, evicted, or still awaited.
            if not self.call_ids:
                return None
            call_id = self.call_ids[-1 - action[1] % len(self.call_ids)]
            return Message(f"t{n}", "tool", text_of(self.rng, action[2]), tool_call_id=call_id)
        if kind == "pin":
            return Message(f"p{n}", "system", text_of(self.rng, action[1]), pinned=True)
        if kind == "retry":
            if not self.history:
                return None
            old = self.history[-min(action[1], len(self.history))]
            return old if action[2] else with_content(old, old.content + " (different)")
        if kind == "reopen":
            if self.kind == "sqlite":
                self.store.close()
                self.store = self._open()
            return None
        raise AssertionError(kind)

    def step(self, action: tuple) -> None:
        m = self.build(action)
        if m is not None:
            self.apply(m)
        self.check()

    def apply(self, m: Message) -> None:
        try:
            expected = self.model.append(m)
        except MemoryInputError as exc:
            with pytest.raises(type(exc)):
                self.store.append(CID, m)
            return
        result = self.store.append(CID, m)
        if expected[0] == "duplicate":
            assert result.duplicate and not result.added, result
            assert result.conflict == expected[1], (result, m)
            return
        assert result.added and not result.duplicate, result
        assert list(result.evicted_ids) == expected[1], (result.evicted_ids, expected[1])
        assert result.evicted_messages == len(result.evicted_ids)
        self.history.append(m)
        if m.pinned:
            self.pinned_ids.append(m.id)
        else:
            if m.role == "user" or self.exchange == 0:
                self.exchange += 1
            self.exchange_of[m.id] = self.exchange

    def check(self) -> None:
        window = self.store.window(CID)
        assert window == self.model.window()
        check_window(window, self.policy, self.pinned_ids)
        check_stats_bound(self.store.stats(CID), self.policy)
        self.check_order_and_exchanges(window[len(self.pinned_ids) :])

    def check_order_and_exchanges(self, visible: list[Message]) -> None:
        order = [m.id for m in self.history if not m.pinned]
        position = {mid: i for i, mid in enumerate(order)}
        seen = [position[m.id] for m in visible]
        assert seen == sorted(seen), "window out of append order"
        exchanges = list(dict.fromkeys(self.exchange_of[m.id] for m in visible))
        assert exchanges == sorted(exchanges)
        for k, e in enumerate(exchanges):
            expected = [mid for mid in order if self.exchange_of[mid] == e and mid not in self.abandoned]
            shown = [m.id for m in visible if self.exchange_of[m.id] == e]
            head = expected[0] if expected and expected[0].startswith("u") else None
            if head is not None and shown and shown[0] == head:
                shown, expected = shown[1:], expected[1:]
            if not shown:
                continue
            start = expected.index(shown[0])
            assert expected[start : start + len(shown)] == shown, f"exchange {e} not contiguous: {shown} in {expected}"
            if k > 0:
                assert start == 0, f"exchange {e} lost its front but is not the oldest visible"
            if e != self.exchange:
                assert start + len(shown) == len(expected), f"older exchange {e} lost its end"
        # No exchange with something to show is skipped between the oldest visible one and the newest.
        if exchanges:
            for e in range(exchanges[0], self.exchange):
                remaining = [mid for mid in order if self.exchange_of[mid] == e and mid not in self.abandoned]
                assert not remaining or e in exchanges, f"exchange {e} skipped"

    def close(self) -> None:
        self.store.close()


def run(kind: str, policy: MemoryPolicy, actions: list[tuple]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        driver = Driver(policy, kind, Path(tmp))
        try:
            for action in actions:
                driver.step(action)
        finally:
            driver.close()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policy=POLICIES, actions=st.lists(ACTIONS, min_size=20, max_size=100))
def test_in_memory_store_matches_the_rule(policy, actions):
    run("memory", policy, actions)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policy=POLICIES, actions=st.lists(ACTIONS, min_size=10, max_size=60))
def test_sqlite_store_matches_the_rule(policy, actions):
    run("sqlite", policy, actions)


@settings(max_examples=100, deadline=None)
@given(
    content=st.text(max_size=300),
    calls=st.lists(st.tuples(st.text(min_size=1, max_size=10), st.text(max_size=100)), max_size=3,
                   unique_by=lambda c: c[0]),
)
def test_estimate_never_exceeds_the_byte_upper_bound(content, calls):
    from durable_agents.memory import upper_bound_tokens

    m = Message("m", "assistant", content, tuple(ToolCall(i, "f", a) for i, a in calls))
    assert 0 < approx_tokens(m) <= upper_bound_tokens(m) + 1 + 2 * len(calls)
