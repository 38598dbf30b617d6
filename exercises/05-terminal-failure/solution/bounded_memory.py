"""Exercise 4, solution: a conversation memory bounded by a token budget.

The rule (README.md states it; the grader checks it after every append):

1. the window (the pinned system message and every kept message) counts at
   most ``max_tokens``, each message counted by ``durable_agents.memory.tokens.approx_tokens``;
2. a pinned system message stays first and is never evicted; a later one
   replaces it (the old one leaves, its id returned), evicting blocks as
   rule 4 says; one that would leave no room for anything else is refused
   (``ValueError``), the memory left as it was;
3. a tool call and the results that answer it are one block, kept or evicted
   whole; every other message is a block of its own;
4. to get back within the budget, whole blocks go, oldest first; nothing else;
   a result arriving after its round went goes on arrival;
5. a block too large to keep on its own goes at once (also when a result
   pushes its round over), and nothing older goes for it; results of its
   calls that arrive later go on arrival;
6. an id appended before, kept or evicted, is ignored when appended again.

``context`` and ``remember`` below plug a saved window into the flow's draft
step (``durable_agents.steps.ports``: ``MemoryContext``, ``MemoryWriter``). Memory informs
prompts; the run record, not memory, says what was done.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable

from durable_agents.memory.messages import Message
from durable_agents.memory.tokens import approx_tokens

MEMORY_FILE = os.environ.get("MEMORY_FILE", ".state/exercise-memory.json")
MAX_TOKENS = int(os.environ.get("MEMORY_MAX_TOKENS", "2000"))


class BoundedMemory:
    """One conversation's window: the pinned system message, then the newest blocks that fit."""

    def __init__(self, max_tokens: int, count: Callable[[Message], int] = approx_tokens) -> None:
        self.max_tokens = max_tokens
        self.count = count
        self.system: Message | None = None
        self.blocks: list[list[Message]] = []  # kept, oldest first; a block is never split
        self.seen: set[str] = set()  # every id appended, kept or evicted
        self.dropped_calls: set[str] = set()  # calls evicted with their round: their late results go on arrival

    def append(self, message: Message) -> list[str]:
        """Add ``message``; return the ids this append evicted (the message itself when it cannot stay)."""
        if message.id in self.seen:
            return []
        if message.pinned and self.count(message) >= self.max_tokens:  # no room left: refused, nothing changed
            raise ValueError(f"pinned message {message.id!r} counts {self.count(message)} tokens and would leave no "
                             f"room under the budget of {self.max_tokens}: shorten it or raise the budget")
        self.seen.add(message.id)
        evicted: list[str] = []
        if message.pinned:
            if self.system is not None:  # replaced: the old one leaves the window
                evicted.append(self.system.id)
            self.system = message
            block: list[Message] = []  # in no block: it is never evicted
        elif message.role == "tool":
            if message.tool_call_id in self.dropped_calls:
                return [message.id]
            blocks = [b for b in self.blocks if message.tool_call_id in {c.id for c in b[0].tool_calls}]
            if not blocks:
                raise ValueError(f"tool result {message.id!r} answers no call of this conversation")
            block = blocks[0]
            block.append(message)
        else:
            block = [message]
            self.blocks.append(block)
        room = self.max_tokens - (self.count(self.system) if self.system else 0)
        if sum(self.count(m) for m in block) > room:  # too large to keep on its own
            self.blocks.remove(block)
            self.dropped_calls.update(c.id for c in block[0].tool_calls)
            return [m.id for m in block]
        while self.tokens() > self.max_tokens:
            oldest = self.blocks.pop(0)
            self.dropped_calls.update(c.id for c in oldest[0].tool_calls)
            evicted += [m.id for m in oldest]
        return evicted

    def window(self) -> list[Message]:
        """What a prompt gets: the system message, then the kept blocks, oldest first."""
        return ([self.system] if self.system else []) + [m for block in self.blocks for m in block]

    def tokens(self) -> int:
        return sum(self.count(m) for m in self.window())


# ---------------------------------------------------------------- the window kept between processes


def _saved() -> dict[str, list[dict]]:
    try:
        with open(MEMORY_FILE) as f:
            return json.load(f)
    except FileNotFoundError:
        return {}


def load(conversation_id: str) -> BoundedMemory:
    """The conversation's window as last saved (empty when nothing was)."""
    memory = BoundedMemory(MAX_TOKENS)
    for saved in _saved().get(conversation_id, []):
        memory.append(Message.from_chat(saved["chat"], id=saved["id"], pinned=saved["pinned"]))
    return memory


def save(conversation_id: str, memory: BoundedMemory) -> None:
    """Write the window, replacing the file in one rename, so a crash leaves the old one or the new one."""
    everything = _saved()
    everything[conversation_id] = [{"id": m.id, "pinned": m.pinned, "chat": m.to_chat()} for m in memory.window()]
    os.makedirs(os.path.dirname(MEMORY_FILE) or ".", exist_ok=True)
    with open(MEMORY_FILE + ".tmp", "w") as f:
        json.dump(everything, f)
    os.replace(MEMORY_FILE + ".tmp", MEMORY_FILE)


def context(conversation_id: str, as_of: float | None = None) -> list[dict]:
    """The draft step's ``MemoryContext``: the earlier messages of the conversation, chat format."""
    return [m.to_chat() for m in load(conversation_id).window() if not m.pinned]


def remember(conversation_id: str, messages: list[tuple[str, str, str]]) -> int:
    """The draft step's ``MemoryWriter``: append (id, role, content) messages; how many were new."""
    memory = load(conversation_id)
    kept = {m.id for m in memory.window()}
    new = [Message(id=i, role=role, content=content) for i, role, content in messages if i not in kept]
    for message in new:
        memory.append(message)
    save(conversation_id, memory)
    return len(new)
