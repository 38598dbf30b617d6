"""Helpers for the memory tests: invariant checks, a naive reference model of
the eviction rule, and a generator of realistic conversations.

The reference model is written differently on purpose (flat lists, rescans
everything on every append, O(n^2)): if it and the stores agree on every
window of random sequences, the incremental bookkeeping in durable_agents/memory/window.py is
right, or both are wrong in the same way, which the independent invariant
checks below would catch.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field, replace

from durable_agents.memory import (
    MemoryPolicy,
    Message,
    OversizeMessageError,
    OversizeRule,
    PinnedTooLargeError,
    ToolCall,
    UnknownToolCallError,
)
from durable_agents.memory.window import truncate_to_fit

# ---------------------------------------------------------------------------
# Invariants that must hold for any window, whatever the history.
# ---------------------------------------------------------------------------


def check_no_orphans(window: list[Message]) -> None:
    """Every tool call is followed by its results, every result follows its call."""
    i = 0
    while i < len(window):
        m = window[i]
        if m.role == "tool":
            raise AssertionError(f"orphan tool result {m.id} (call {m.tool_call_id}) at {i}: {[w.id for w in window]}")
        if m.tool_calls:
            wanted = {c.id for c in m.tool_calls}
            j = i + 1
            while j < len(window) and window[j].role == "tool":
                assert window[j].tool_call_id in wanted, f"result {window[j].id} answers a call not in {m.id}"
                wanted.discard(window[j].tool_call_id)
                j += 1
            assert not wanted, f"assistant {m.id} has calls without results in the window: {sorted(wanted)}"
            i = j
        else:
            i += 1


def check_window(window: list[Message], policy: MemoryPolicy, pinned_ids: list[str], counter=None) -> None:
    """Bounds, pinned first and all present, no orphans, no repeated ids."""
    tokens = sum(map(counter or policy.token_counter, window))
    assert tokens <= policy.max_tokens, f"window counts {tokens} tokens > {policy.max_tokens}"
    assert len(window) <= policy.max_messages, f"window holds {len(window)} > {policy.max_messages}"
    ids = [m.id for m in window]
    assert len(ids) == len(set(ids)), f"repeated ids in window: {ids}"
    assert ids[: len(pinned_ids)] == pinned_ids, f"pinned {pinned_ids} not first: {ids}"
    assert all(not m.pinned for m in window[len(pinned_ids) :])
    check_no_orphans(window[len(pinned_ids) :])


def check_stats_bound(stats, policy: MemoryPolicy) -> None:
    assert stats.tokens <= policy.max_tokens, stats
    assert stats.messages <= policy.max_messages, stats


# ---------------------------------------------------------------------------
# The reference model.
# ---------------------------------------------------------------------------


@dataclass
class _Item:
    message: Message
    tokens: int
    exchange: int
    block: int


@dataclass
class ReferenceModel:
    policy: MemoryPolicy
    pinned: list[_Item] = field(default_factory=list)
    items: list[_Item] = field(default_factory=list)
    evicted_digests: dict[str, tuple] = field(default_factory=dict)
    exchange: int = 0
    seq: int = 0
    open_block: int | None = None
    pending: set[str] = field(default_factory=set)
    orphaned: set[str] = field(default_factory=set)
    _orig: dict[str, tuple] = field(default_factory=dict)  # id -> content as appended (before truncation)

    @staticmethod
    def _key(m: Message) -> tuple:
        return (m.role, m.content, m.tool_calls, m.tool_call_id)

    def append(self, m: Message) -> tuple[str, object]:
        """Returns ("duplicate", conflict) | ("added", evicted ids list); raises like the stores."""
        for it in self.pinned + self.items:
            if it.message.id == m.id:
                return "duplicate", self._orig[m.id] != self._key(m)
        if m.id in self.evicted_digests:
            return "duplicate", self.evicted_digests[m.id] != self._key(m)
        counter = self.policy.token_counter
        if m.pinned:
            t = counter(m)
            if (sum(i.tokens for i in self.pinned) + t >= self.policy.max_tokens
                    or len(self.pinned) + 1 >= self.policy.max_messages):
                raise PinnedTooLargeError("model")
            self.seq += 1
            self.pinned.append(_Item(m, t, 0, 0))
            self._orig[m.id] = self._key(m)
            return "added", self._evict()
        original = m
        t = counter(m)
        room = self.policy.max_tokens - sum(i.tokens for i in self.pinned)
        if t > room:
            if self.policy.oversize is OversizeRule.REJECT:
                raise OversizeMessageError("model")
            m, t = truncate_to_fit(m, room, counter)
        gone: list[str] = []
        if m.role == "tool":
            if self.open_block is not None and m.tool_call_id in self.pending:
                block = self.open_block
                self.pending.discard(m.tool_call_id)
                if not self.pending:
                    self.open_block = None
            elif m.tool_call_id in self.orphaned:
                self.orphaned.discard(m.tool_call_id)
                self.seq += 1
                self.evicted_digests[m.id] = self._key(original)
                return "added", [m.id]
            else:
                raise UnknownToolCallError("model")
        else:
            if self.open_block is not None:
                ob = self.open_block
                for it in [i for i in self.items if i.block == ob]:
                    gone.append(it.message.id)
                    self.evicted_digests[it.message.id] = self._orig[it.message.id]
                self.items = [i for i in self.items if i.block != ob]
                self.open_block = None
                self.pending = set()
            self.orphaned = set()
            if m.role == "user" or self.exchange == 0:
                self.exchange += 1
            block = self.seq + 1
            if m.tool_calls:
                self.open_block = block
                self.pending = {c.id for c in m.tool_calls}
        self.seq += 1
        self.items.append(_Item(m, t, self.exchange, block))
        self._orig[m.id] = self._key(original)
        return "added", gone + self._evict()

    def _over(self) -> bool:
        p = self.policy
        tokens = sum(i.tokens for i in self.pinned + self.items)
        return tokens > p.max_tokens or len(self.pinned) + len(self.items) > p.max_messages

    def _evict(self) -> list[str]:
        gone: list[str] = []
        while self.items and self._over():
            exchanges = sorted({i.exchange for i in self.items})
            if len(exchanges) > 1:
                victim = [i for i in self.items if i.exchange == exchanges[0]]
            else:
                blocks = list(dict.fromkeys(i.block for i in self.items))
                first = next(i for i in self.items if i.block == blocks[0])
                pick = blocks[1] if len(blocks) > 2 and first.message.role == "user" else blocks[0]
                victim = [i for i in self.items if i.block == pick]
                if pick == self.open_block:
                    self.orphaned = set(self.pending)
                    self.open_block = None
                    self.pending = set()
            for it in victim:
                gone.append(it.message.id)
                self.evicted_digests[it.message.id] = self._orig[it.message.id]
            ids = {id(i) for i in victim}
            self.items = [i for i in self.items if id(i) not in ids]
        return gone

    def window(self) -> list[Message]:
        return [i.message for i in self.pinned] + [i.message for i in self.items if i.block != self.open_block]


# ---------------------------------------------------------------------------
# A generator of realistic conversations, with retries and mistakes mixed in.
# ---------------------------------------------------------------------------


def text_of(rng: random.Random, size: int) -> str:
    words = ("order", "refund", "the", "customer", "email", "ticket", "please", "confirm", "status", "{", '"id":',
             "42,")
    out = []
    n = 0
    while n < size:
        w = rng.choice(words)
        out.append(w)
        n += len(w) + 1
    return " ".join(out)[:size]


@dataclass
class ConversationScript:
    """Yields messages for a plausible agent conversation, deterministic per seed."""

    seed: int
    sizes: tuple[int, ...] = (0, 10, 40, 120, 400, 1500)
    big_every: int = 500
    retry_every: int = 23
    sent: list[Message] = field(default_factory=list)

    def __iter__(self):
        rng = random.Random(self.seed)
        n = 0

        def size() -> int:
            return rng.choice(self.sizes)

        while True:
            n += 1
            yield self._keep(Message(f"u{n}", "user", text_of(rng, size() or 5)))
            for r in range(rng.choice((0, 0, 1, 1, 2, 3))):
                calls = tuple(
                    ToolCall(f"c{n}.{r}.{k}", rng.choice(("lookup_order", "send_email", "open_ticket")),
                             json.dumps({"order": rng.randint(1, 9999),
                                         "note": text_of(rng, rng.choice((0, 20, 200)))}))
                    for k in range(rng.choice((1, 1, 2, 3)))
                )
                yield self._keep(Message(f"a{n}.{r}", "assistant", text_of(rng, rng.choice((0, 0, 30))), calls))
                for call in calls:
                    big = rng.randrange(self.big_every) == 0
                    yield self._keep(Message(f"t{call.id}", "tool", text_of(rng, 50_000 if big else size()),
                                             tool_call_id=call.id))
            yield self._keep(Message(f"a{n}", "assistant", text_of(rng, size() or 3)))
            if self.retry_every and rng.randrange(self.retry_every) == 0 and self.sent:
                # An activity retried after a crash appends a recent message again.
                yield rng.choice(self.sent[-8:])

    def _keep(self, m: Message) -> Message:
        self.sent.append(m)
        if len(self.sent) > 64:
            del self.sent[:32]
        return m


def with_content(m: Message, content: str) -> Message:
    return replace(m, content=content)
