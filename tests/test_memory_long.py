"""A long conversation: 20,000 appends of mixed sizes with tool rounds, retries
and the occasional huge tool result, through each store (a soak: tests/tiers.py).

20,000 is the size that proves both bounds: the window's (40 messages) is
passed about 500 times over, and the evicted ids remembered (10,000) about
twice, so their own pruning runs too. A longer run proves nothing more and
costs minutes; ``SOAK_APPENDS=100000`` runs it at the size it was first
written for (about 60 s on 2 cores), and bench/bench_memory.py measures the
stores' speed at that size.

After every append: the store's own counts are within both bounds and the
append's result agrees with the running totals. After every append too
(in-memory) or every 50th (SQLite, where a window read is a transaction): the
window is within both bounds by an independent recount, the pinned message is
first, and there is no orphaned tool message. The SQLite run is also compared
with an in-memory store fed the same messages: same window at every check.
"""

from __future__ import annotations

import itertools
import os
import sqlite3

import pytest

from durable_agents.memory import InMemoryStore, MemoryPolicy, Message, SQLiteStore
from tests.memory_support import ConversationScript, check_stats_bound, check_window

POLICY = MemoryPolicy(max_tokens=3000, max_messages=40)
SYSTEM = Message("system", "system", "You draft short, polite replies about orders. " * 5, pinned=True)
CID = "long"
APPENDS = int(os.environ.get("SOAK_APPENDS", "20000"))
assert APPENDS >= 2 * POLICY.remember_evicted, "too short a soak to pass the remembered ids' bound"

pytestmark = pytest.mark.soak


_MESSAGES: list[Message] = []


def messages(count: int) -> list[Message]:
    """The same scripted conversation for every test (built once: it takes seconds)."""
    if len(_MESSAGES) < count:
        _MESSAGES[:] = itertools.islice(ConversationScript(seed=7), count)
    return _MESSAGES[:count]


class MemoCounter:
    """The policy's counter, remembered per message object, to keep every window check cheap."""

    def __init__(self) -> None:
        self.memo: dict[int, tuple[Message, int]] = {}

    def __call__(self, m: Message) -> int:
        hit = self.memo.get(id(m))
        if hit is None or hit[0] is not m:
            hit = self.memo[id(m)] = (m, POLICY.token_counter(m))
        return hit[1]


def play(store, count: int, *, window_every: int, twin: InMemoryStore | None = None) -> dict[str, int]:
    store.pin(CID, SYSTEM)
    if twin is not None:
        twin.pin(CID, SYSTEM)
    seen = {"added": 0, "duplicate": 0, "evicted": 0, "truncated": 0}
    counter = MemoCounter()
    for i, message in enumerate(messages(count)):
        result = store.append(CID, message)
        stats = store.stats(CID) if twin is None or i % window_every == 0 else None
        if stats is not None:
            check_stats_bound(stats, POLICY)
        seen["added"] += result.added
        seen["duplicate"] += result.duplicate
        seen["evicted"] += result.evicted_messages
        seen["truncated"] += result.truncated
        if twin is not None:
            assert twin.append(CID, message) == result, (i, message.id)
        if i % window_every == 0:
            window = store.window(CID)
            check_window(window, POLICY, ["system"], counter)
            if twin is not None:
                assert window == twin.window(CID), i
    stats = store.stats(CID)
    check_stats_bound(stats, POLICY)
    assert stats.appended == seen["added"] + 1  # + the pinned message
    assert stats.duplicates == seen["duplicate"]
    assert stats.evicted_messages == seen["evicted"]
    assert stats.truncated == seen["truncated"]
    window = store.window(CID)
    check_window(window, POLICY, ["system"])
    assert window[0] == SYSTEM
    return seen


def test_in_memory_appends_stay_bounded():
    store = InMemoryStore(POLICY)
    seen = play(store, APPENDS, window_every=1)
    # The script really exercised the rule (at 20,000: 19,802 evicted, 161 duplicates, 19 truncated).
    assert seen["evicted"] > 0.9 * APPENDS and seen["duplicate"] > APPENDS / 1000 and seen["truncated"] > 10, seen


def test_sqlite_appends_stay_bounded_on_disk(tmp_path):
    path = tmp_path / "memory.db"
    store = SQLiteStore(path, POLICY)
    try:
        seen = play(store, APPENDS, window_every=50, twin=InMemoryStore(POLICY))
    finally:
        store.close()
    assert seen["evicted"] > max(0.9 * APPENDS, POLICY.remember_evicted), seen
    with sqlite3.connect(path) as conn:
        rows = conn.execute("SELECT COUNT(*) FROM messages").fetchone()[0]
        remembered = conn.execute("SELECT COUNT(*) FROM evicted_ids").fetchone()[0]
    assert rows <= POLICY.max_messages
    assert remembered <= POLICY.remember_evicted
