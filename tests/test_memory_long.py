"""A long conversation: 100,000 appends of mixed sizes with tool rounds, retries
and the occasional huge tool result, through each store.

After every append: the store's own counts are within both bounds and the
append's result agrees with the running totals. After every append too
(in-memory) or every 50th (SQLite, where a window read is a transaction): the
window is within both bounds by an independent recount, the pinned message is
first, and there is no orphaned tool message. The SQLite run is also compared
with an in-memory store fed the same messages: same window at every check.
"""

from __future__ import annotations

import itertools
import sqlite3

from memory import InMemoryStore, MemoryPolicy, Message, SQLiteStore
from tests.memory_support import ConversationScript, check_stats_bound, check_window

POLICY = MemoryPolicy(max_tokens=3000, max_messages=40)
SYSTEM = Message("system", "system", "You draft short, polite replies about orders. " * 5, pinned=True)
CID = "long"


_MESSAGES: list[Message] = []


def messages(count: int) -> list[Message]:
    """The same scripted conversation for every test (built once: it takes seconds)."""
    if len(_MESSAGES) < count:
        _MESSAGES[:] = itertools.islice(ConversationScript(seed=7), count)
    return _MESSAGES[:count]


class MemoCounter:
    """The policy's counter, remembered per message object, to keep 100k window checks cheap."""

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


def test_in_memory_100k_appends_stay_bounded():
    store = InMemoryStore(POLICY)
    seen = play(store, 100_000, window_every=1)
    # The script really exercised the rule.
    assert seen["evicted"] > 90_000 and seen["duplicate"] > 100 and seen["truncated"] > 10, seen


def test_sqlite_100k_appends_stay_bounded_on_disk(tmp_path):
    path = tmp_path / "memory.db"
    store = SQLiteStore(path, POLICY)
    try:
        seen = play(store, 100_000, window_every=50, twin=InMemoryStore(POLICY))
    finally:
        store.close()
    assert seen["evicted"] > 90_000, seen
    with sqlite3.connect(path) as conn:
        rows = conn.execute("SELECT COUNT(*) FROM messages").fetchone()[0]
        remembered = conn.execute("SELECT COUNT(*) FROM evicted_ids").fetchone()[0]
    assert rows <= POLICY.max_messages
    assert remembered <= POLICY.remember_evicted
