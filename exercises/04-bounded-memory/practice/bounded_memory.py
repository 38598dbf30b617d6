"""Exercise 4, practice: a conversation memory bounded by a token budget.

Today ``BoundedMemory`` keeps every message: a long conversation grows the
prompt without end. Make it keep the rule below (README.md states it; the
grader checks it after every append), in ``append`` (TODO 7, TODO 8):

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
step (flow.py, TODO 9 and 10). Import what you need from ``durable_agents.memory.messages``
and ``durable_agents.memory.tokens`` only: the rest of ``memory`` is the lab's finished
answer, and the grader refuses a memory built on it.
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
        # TODO 7 (exercise 4): where the message goes (rules 2 and 3). A pinned system message is the
        #   window's first message and never leaves; a later one replaces it (the old one leaves the window
        #   and counts as evicted), and one that would leave no room under the budget for anything else is
        #   refused with a ValueError, the memory left as it was (the lab's rule: durable_agents/memory/window.py,
        # `pin`). A tool result belongs to the block of the message that holds its call, and a result whose call
        #   was already evicted never enters the window (it counts as evicted at once). Every other message
        #   starts a block of its own. Every id that gets in is remembered, for rule 6.
        self.seen.add(message.id)
        block = [message]
        self.blocks.append(block)
        # END TODO 7
        # TODO 8 (exercise 4): after every append the window fits its token budget, and what leaves
        #   is whole blocks, oldest first (rule 4), their ids returned. The system message counts and
        #   stays: a larger one arriving makes older blocks leave. A block that could not fit even alone
        #   leaves at once, and nothing older leaves for it. A departing block's calls are remembered, so
        #   that their late results leave too.
        return []
        # END TODO 8

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
