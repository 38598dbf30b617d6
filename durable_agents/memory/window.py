"""One conversation's window: the eviction rule, in memory, O(1) amortised.

Both stores keep a :class:`Conversation` per conversation id and differ only in
where they persist it, so the rule in the package docstring is implemented
exactly once, here.

Shape: pinned messages in pin order, then a deque of *exchanges*, each a deque
of *blocks*, each a list of entries. A block is the unit that can never be
split: one user message, one assistant or system message, or an assistant
message with tool calls together with the tool results that answer them.
Running totals of tokens and messages are kept for the whole window only; the
size of what is evicted is summed while evicting it. So an append does a
constant amount of work plus one step per entry it evicts, and each entry is
evicted at most once: O(1) amortised.

Every method that can refuse its input checks everything before it changes
anything, so a refused append leaves the conversation as it was.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Container, Iterable
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from durable_agents.memory.errors import OversizeMessageError, PinnedTooLargeError, PolicyError, UnknownToolCallError
from durable_agents.memory.messages import Message
from durable_agents.memory.policy import MemoryPolicy, OversizeRule
from durable_agents.memory.tokens import TokenCounter

__all__ = [
    "TRUNCATION_MARKER",
    "AppendResult",
    "Conversation",
    "EvictionEvent",
    "MemoryStats",
    "truncate_to_fit",
]

TRUNCATION_MARKER = "\n[truncated by memory: {removed} of {total} characters removed]"
"""Appended to the content of a message cut by the ``truncate`` rule, so the
model (and a person reading the prompt) can see that text is missing."""


class AppendResult(NamedTuple):
    """What one ``append`` (or ``pin``) did.

    ``added`` is False only for a duplicate. A message can be added and evicted
    by the same append (its whole tool round no longer fits, or its call was
    evicted before it arrived): then its id is in ``evicted_ids``.
    """

    added: bool
    duplicate: bool
    evicted_messages: int = 0
    evicted_tokens: int = 0
    evicted_ids: tuple[str, ...] = ()
    truncated: bool = False
    conflict: bool = False
    """A duplicate id whose content differs from what is stored (the stored one wins)."""
    tokens: int = 0
    """Tokens counted for the message as stored (after truncation)."""


@dataclass(frozen=True)
class MemoryStats:
    """A conversation's window and its cumulative counters since creation or ``clear``."""

    messages: int
    tokens: int
    pinned_messages: int
    pinned_tokens: int
    appended: int
    duplicates: int
    conflicts: int
    truncated: int
    evicted_messages: int
    evicted_tokens: int
    evictions: int
    abandoned_messages: int


@dataclass(frozen=True)
class EvictionEvent:
    """Passed to a store's ``on_evict`` hook, once per cause per append.

    ``reason`` is ``"budget"`` (over ``max_tokens`` or ``max_messages``, or a
    tool result whose call had been evicted) or ``"abandoned"`` (an unfinished
    tool round closed by the next user or assistant message).
    """

    conversation_id: str
    reason: str
    message_ids: tuple[str, ...]
    messages: int
    tokens: int


class _Entry:
    __slots__ = ("seq", "message", "tokens", "digest", "block")

    def __init__(self, seq: int, message: Message, tokens: int, digest: Any, block: _Block | None) -> None:
        self.seq = seq
        self.message = message
        self.tokens = tokens
        self.digest = digest
        self.block = block


class _Block:
    __slots__ = ("first_seq", "exchange", "is_user", "entries", "pending")

    def __init__(self, first_seq: int, exchange: int, is_user: bool) -> None:
        self.first_seq = first_seq
        self.exchange = exchange
        self.is_user = is_user
        self.entries: list[_Entry] = []
        self.pending: set[str] | None = None


class _Exchange:
    __slots__ = ("number", "blocks")

    def __init__(self, number: int) -> None:
        self.number = number
        self.blocks: deque[_Block] = deque()


class Outcome(NamedTuple):
    """What a mutation did, in the detail a store needs to persist it."""

    entry: _Entry | None  # the stored entry, None if dropped on arrival
    dropped: _Entry | None  # a tool result whose call had been evicted
    evicted: list[_Entry]  # evicted for the budget, in eviction order
    abandoned: list[_Entry]  # an unfinished tool round closed by this message
    truncated: bool
    tokens: int


_NOTHING: list[_Entry] = []
_new_tuple = tuple.__new__  # builds a NamedTuple without its Python-level __new__ (hot path)

COUNTER_FIELDS = (
    "appended",
    "duplicates",
    "conflicts",
    "truncated",
    "evicted_messages",
    "evicted_tokens",
    "evictions",
    "abandoned_messages",
)


def count_tokens(counter: TokenCounter, message: Message) -> int:
    n = counter(message)
    if n.__class__ is not int or n < 0:
        raise PolicyError(f"token_counter returned {n!r} for message {message.id!r}; it must return an int >= 0")
    return n


def truncate_to_fit(message: Message, room: int, counter: TokenCounter) -> tuple[Message, int]:
    """The longest prefix of ``message.content`` that, with the marker, fits ``room`` tokens.

    Raises :class:`OversizeMessageError` when even an empty prefix does not fit
    (tool-call arguments are never cut: a cut JSON argument is not a call).
    """
    content = message.content
    total = len(content)

    def attempt(keep: int) -> tuple[Message, int]:
        text = content[:keep] + TRUNCATION_MARKER.format(removed=total - keep, total=total)
        cut = replace(message, content=text)
        return cut, count_tokens(counter, cut)

    best = attempt(0)
    if best[1] > room:
        raise OversizeMessageError(
            f"message {message.id!r} does not fit the {room} tokens the budget leaves after the pinned "
            f"messages even with its content cut to nothing ({best[1]} tokens remain: role, tool calls and "
            "marker). Raise MemoryPolicy.max_tokens or send less in the tool calls."
        )
    lo, hi = 0, total - 1  # keeping everything cannot fit: the message was over the room already
    while lo < hi:
        mid = (lo + hi + 1) // 2
        candidate = attempt(mid)
        if candidate[1] <= room:
            lo, best = mid, candidate
        else:
            hi = mid - 1
    return best


class Conversation:
    """The window of one conversation (see the module docstring)."""

    def __init__(self, conversation_id: str, policy: MemoryPolicy) -> None:
        self.conversation_id = conversation_id
        self.policy = policy
        self.pinned: dict[str, _Entry] = {}
        self.pinned_tokens = 0
        self.exchanges: deque[_Exchange] = deque()
        self.tokens = 0  # non-pinned, including an open tool round
        self.count = 0
        self.index: dict[str, _Entry] = {}  # every stored entry, pinned or not, by message id
        self.open_block: _Block | None = None
        self.orphaned_calls: set[str] = set()  # calls of an evicted open round, still awaiting results
        self.next_seq = 1
        self.exchange_number = 0
        # Cumulative counters (COUNTER_FIELDS), and what the stores keep beside them.
        self.appended = 0
        self.duplicates = 0
        self.conflicts = 0
        self.truncated = 0
        self.evicted_messages = 0
        self.evicted_tokens = 0
        self.evictions = 0
        self.abandoned_messages = 0
        self.version = 0  # SQLite: which committed state this copy reflects
        self.ledger_n = 0  # SQLite: how many ids were ever written to the evicted-id ledger

    # ---- reading ---------------------------------------------------------------

    def window(self, include_pinned: bool = True, hide: Container[str] | None = None) -> list[Message]:
        """Pinned messages, then the rest in order, without an unfinished tool round.

        ``hide``: message ids to leave out (the stores' ``as_of`` cut-off). A
        block with a hidden message is left out whole, so a tool call never
        shows without its results, nor a result without its call."""
        out = [e.message for e in self.pinned.values()] if include_pinned else []
        if hide:
            out = [m for m in out if m.id not in hide]
        hidden = self.open_block
        for exchange in self.exchanges:
            for block in exchange.blocks:
                if block is hidden:
                    continue
                if hide and any(e.message.id in hide for e in block.entries):
                    continue
                out.extend([e.message for e in block.entries])
        return out

    def stats(self) -> MemoryStats:
        return MemoryStats(
            messages=self.count + len(self.pinned),
            tokens=self.tokens + self.pinned_tokens,
            pinned_messages=len(self.pinned),
            pinned_tokens=self.pinned_tokens,
            appended=self.appended,
            duplicates=self.duplicates,
            conflicts=self.conflicts,
            truncated=self.truncated,
            evicted_messages=self.evicted_messages,
            evicted_tokens=self.evicted_tokens,
            evictions=self.evictions,
            abandoned_messages=self.abandoned_messages,
        )

    def counters(self) -> tuple[int, ...]:
        return tuple(getattr(self, name) for name in COUNTER_FIELDS)

    # ---- changing ----------------------------------------------------------------

    def append(self, message: Message, digest: Any) -> Outcome:
        """Store a non-pinned message and evict down to the bounds.

        The message is fitted to the budget first (``_fit``: counted, cut or
        refused). A tool result then joins the round awaiting it
        (``_round_for``), or is dropped on arrival when that round was evicted;
        any other message closes an unfinished round and starts a block of its
        own (``_new_block``). Then it is stored, and the oldest go (``_evict``)."""
        message, tokens, truncated = self._fit(message)
        abandoned = _NOTHING
        if message.role == "tool":
            block = self._round_for(message)
            if block is None:
                return self._drop_on_arrival(message, tokens, digest, truncated)
        else:
            if self.open_block is not None:
                abandoned = self._abandon_open_block()
            block = self._new_block(message)

        seq = self.next_seq
        self.next_seq = seq + 1
        entry = _Entry(seq, message, tokens, digest, block)
        block.entries.append(entry)
        self.tokens += tokens
        self.count += 1
        self.index[message.id] = entry
        self.appended += 1
        if truncated:
            self.truncated += 1
        policy = self.policy
        if (self.tokens + self.pinned_tokens <= policy.max_tokens
                and self.count + len(self.pinned) <= policy.max_messages):
            return _new_tuple(Outcome, (entry, None, _NOTHING, abandoned, truncated, tokens))
        return _new_tuple(Outcome, (entry, None, self._evict(), abandoned, truncated, tokens))

    def _fit(self, message: Message) -> tuple[Message, int, bool]:
        """The message as it will be stored, its tokens, and whether it was cut to
        fit the room the pinned messages leave (``OversizeRule.TRUNCATE``).
        Refuses, changing nothing, a message over the room under
        ``OversizeRule.REJECT``, and any message when the pinned leave no room."""
        policy = self.policy
        tokens = policy.token_counter(message)
        if tokens.__class__ is not int or tokens < 0:
            tokens = count_tokens(policy.token_counter, message)  # raises with the explanation
        room = policy.max_tokens - self.pinned_tokens
        if room <= 0 or len(self.pinned) >= policy.max_messages:
            raise PinnedTooLargeError(
                f"conversation {self.conversation_id!r}: the pinned messages ({len(self.pinned)} messages, "
                f"{self.pinned_tokens} tokens) leave no room under max_tokens={policy.max_tokens}, "
                f"max_messages={policy.max_messages}; unpin some or raise the limits"
            )
        if tokens <= room:
            return message, tokens, False
        if policy.oversize is OversizeRule.REJECT:
            raise OversizeMessageError(
                f"message {message.id!r} counts {tokens} tokens, more than the {room} tokens the budget "
                f"(max_tokens={policy.max_tokens}) leaves after {self.pinned_tokens} pinned tokens. "
                "Shorten or summarise it before appending, or use MemoryPolicy(oversize='truncate')."
            )
        message, tokens = truncate_to_fit(message, room, policy.token_counter)
        return message, tokens, True

    def _round_for(self, result: Message) -> _Block | None:
        """The open round awaiting this tool result (which then no longer awaits it),
        or None when its call was evicted with its unfinished round. Refuses,
        changing nothing, a result that no stored message awaits."""
        call_id = result.tool_call_id
        block = self.open_block
        if block is not None and block.pending and call_id in block.pending:
            block.pending.discard(call_id)
            if not block.pending:
                self.open_block = None
            return block
        if call_id in self.orphaned_calls:
            self.orphaned_calls.discard(call_id)
            return None
        awaiting = sorted(block.pending or ()) if block is not None else []
        raise UnknownToolCallError(
            f"conversation {self.conversation_id!r}: tool result {result.id!r} answers tool call "
            f"{call_id!r}, which no stored assistant message is awaiting "
            f"(awaiting: {', '.join(map(repr, awaiting)) or 'none'}). Append the assistant message "
            "that makes the call first, and each result once."
        )

    def _drop_on_arrival(self, result: Message, tokens: int, digest: Any, truncated: bool) -> Outcome:
        """A tool result whose call was evicted: keeping it would orphan it, so it
        is counted as appended and evicted at once, and never stored."""
        dropped = _Entry(self._take_seq(), result, tokens, digest, None)
        self.appended += 1
        self.truncated += truncated
        self.evicted_messages += 1
        self.evicted_tokens += tokens
        self.evictions += 1
        return Outcome(None, dropped, _NOTHING, _NOTHING, truncated, tokens)

    def _new_block(self, message: Message) -> _Block:
        """The block a message that is not a tool result starts: in a new exchange
        for a user turn, else in the current one. A message with tool calls
        opens a round that awaits their results. Results of an evicted round
        are no longer awaited once the conversation moves on."""
        if self.orphaned_calls:
            self.orphaned_calls = set()
        exchanges = self.exchanges
        if message.role == "user":
            self.exchange_number += 1
            exchange = _Exchange(self.exchange_number)
            exchanges.append(exchange)
        else:
            if self.exchange_number == 0:
                self.exchange_number = 1  # the conversation opens without a user turn
            if exchanges and exchanges[-1].number == self.exchange_number:
                exchange = exchanges[-1]
            else:
                exchange = _Exchange(self.exchange_number)
                exchanges.append(exchange)
        block = _Block(self.next_seq, exchange.number, message.role == "user")
        if message.tool_calls:
            block.pending = {call.id for call in message.tool_calls}
            self.open_block = block
        exchange.blocks.append(block)
        return block

    def pin(self, message: Message, digest: Any) -> Outcome:
        """Store a pinned message (never evicted) and evict the rest down to the bounds."""
        if not message.pinned:
            message = replace(message, pinned=True)
        policy = self.policy
        tokens = count_tokens(policy.token_counter, message)
        total_tokens = self.pinned_tokens + tokens
        total_messages = len(self.pinned) + 1
        if total_tokens >= policy.max_tokens or total_messages >= policy.max_messages:
            raise PinnedTooLargeError(
                f"conversation {self.conversation_id!r}: pinning {message.id!r} ({tokens} tokens) would make "
                f"the pinned messages {total_messages} messages and {total_tokens} tokens; they must stay "
                f"below max_tokens={policy.max_tokens} and max_messages={policy.max_messages} so that "
                "the conversation itself still fits. Shorten the instructions or raise the limits."
            )
        entry = _Entry(self._take_seq(), message, tokens, digest, None)
        self.pinned[message.id] = entry
        self.pinned_tokens += tokens
        self.index[message.id] = entry
        self.appended += 1
        return Outcome(entry, None, self._evict(), _NOTHING, False, tokens)

    def unpin(self, message_id: str) -> _Entry | None:
        entry = self.pinned.pop(message_id, None)
        if entry is not None:
            self.pinned_tokens -= entry.tokens
            del self.index[message_id]
        return entry

    def _take_seq(self) -> int:
        seq = self.next_seq
        self.next_seq = seq + 1
        return seq

    def _abandon_open_block(self) -> list[_Entry]:
        block = self.open_block
        assert block is not None
        exchange = self.exchanges[-1]
        exchange.blocks.pop()  # the open round is always the newest block
        if not exchange.blocks:
            self.exchanges.pop()
        n = len(block.entries)
        tokens = 0
        for e in block.entries:
            tokens += e.tokens
            del self.index[e.message.id]
        self.tokens -= tokens
        self.count -= n
        self.open_block = None
        self.abandoned_messages += n
        self.evicted_messages += n
        self.evicted_tokens += tokens
        self.evictions += 1
        return block.entries

    def _evict(self) -> list[_Entry]:
        policy = self.policy
        max_tokens = policy.max_tokens - self.pinned_tokens
        max_count = policy.max_messages - len(self.pinned)
        if self.tokens <= max_tokens and self.count <= max_count:
            return _NOTHING
        victims: list[_Entry] = []
        index = self.index
        exchanges = self.exchanges
        tokens, count = self.tokens, self.count
        while exchanges and (tokens > max_tokens or count > max_count):
            if len(exchanges) > 1:
                # Rule 1: the oldest whole exchange.
                gone = [e for block in exchanges.popleft().blocks for e in block.entries]
            else:
                # Rule 2: only the newest exchange is left. Its oldest block goes,
                # except that its opening user turn stays while anything else can go.
                blocks = exchanges[0].blocks
                if len(blocks) > 2 and blocks[0].is_user:
                    block = blocks[1]
                    del blocks[1]
                else:
                    block = blocks.popleft()
                if not blocks:
                    exchanges.popleft()
                if block is self.open_block:
                    # An unfinished round that alone exceeds the room: its results
                    # still to come are evicted on arrival (see append).
                    self.orphaned_calls = set(block.pending or ())
                    self.open_block = None
                gone = block.entries
            for e in gone:
                tokens -= e.tokens
                del index[e.message.id]
            count -= len(gone)
            victims.extend(gone)
        self.evicted_tokens += self.tokens - tokens
        self.evicted_messages += self.count - count
        self.tokens, self.count = tokens, count
        self.evictions += 1
        return victims

    # ---- persistence -------------------------------------------------------------

    @classmethod
    def restore(
        cls,
        conversation_id: str,
        policy: MemoryPolicy,
        rows: Iterable[tuple[int, Message, int, Any, int, int]],
        *,
        next_seq: int = 1,
        exchange_number: int = 0,
        orphaned_calls: Iterable[str] = (),
        counters: Iterable[int] = (),
    ) -> Conversation:
        """Rebuild a conversation from stored rows ``(seq, message, tokens, digest, exchange, block)``.

        Rows must come in ``seq`` order. Nothing is evicted here: bounds are
        enforced on the next append, so a store reopened with a smaller policy
        shrinks at its next append.
        """
        conv = cls(conversation_id, policy)
        last_seq = 0
        for seq, message, tokens, digest, exchange_no, block_seq in rows:
            last_seq = seq
            if message.pinned:
                entry = _Entry(seq, message, tokens, digest, None)
                conv.pinned[message.id] = entry
                conv.pinned_tokens += tokens
            else:
                exchanges = conv.exchanges
                if not exchanges or exchanges[-1].number != exchange_no:
                    exchanges.append(_Exchange(exchange_no))
                exchange = exchanges[-1]
                if not exchange.blocks or exchange.blocks[-1].first_seq != block_seq:
                    exchange.blocks.append(_Block(block_seq, exchange_no, message.role == "user"))
                block = exchange.blocks[-1]
                entry = _Entry(seq, message, tokens, digest, block)
                block.entries.append(entry)
                conv.tokens += tokens
                conv.count += 1
            conv.index[message.id] = entry
        if conv.exchanges:
            last = conv.exchanges[-1].blocks[-1]
            head = last.entries[0].message
            if head.tool_calls:
                answered = {e.message.tool_call_id for e in last.entries[1:]}
                pending = {c.id for c in head.tool_calls} - answered
                if pending:
                    last.pending = pending
                    conv.open_block = last
        conv.next_seq = max(next_seq, last_seq + 1)
        conv.exchange_number = max(exchange_number, conv.exchanges[-1].number if conv.exchanges else 0)
        conv.orphaned_calls = set(orphaned_calls)
        values = tuple(counters)  # () for a conversation whose counters were never stored: they stay 0
        if values:
            for name, value in zip(COUNTER_FIELDS, values, strict=True):
                setattr(conv, name, value)
        return conv
