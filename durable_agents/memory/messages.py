"""Messages as the memory stores them, and their OpenAI chat-format form.

A :class:`Message` is checked when it is built, so a message that exists can be
stored and sent: a ``tool`` message always names the call it answers, only an
``assistant`` message carries tool calls, their ids are unique within the
message, and a pinned message is never part of a tool exchange (pinning one half
of a call/result pair would let eviction orphan the other half).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from durable_agents.memory.errors import MemoryInputError

__all__ = ["ROLES", "Message", "Role", "ToolCall", "stable_digest"]

Role = Literal["system", "user", "assistant", "tool"]
ROLES: frozenset[str] = frozenset(("system", "user", "assistant", "tool"))


def _need_text(what: str, value: Any, *, empty_ok: bool) -> None:
    if not isinstance(value, str):
        raise MemoryInputError(f"{what} must be a string, got {type(value).__name__}")
    if not empty_ok and not value:
        raise MemoryInputError(f"{what} is empty")


@dataclass(frozen=True)
class ToolCall:
    """One function call requested by an assistant message.

    ``arguments`` is the JSON text exactly as the model produced it (it is not
    parsed: models sometimes emit invalid JSON, and the provider expects the
    string back verbatim).
    """

    id: str
    name: str
    arguments: str = "{}"

    def __post_init__(self) -> None:
        _need_text("tool call id", self.id, empty_ok=False)
        _need_text(f"tool call {self.id!r} name", self.name, empty_ok=False)
        if not isinstance(self.arguments, str):
            raise MemoryInputError(
                f"tool call {self.id!r} arguments must be a JSON string, got "
                f"{type(self.arguments).__name__}: pass json.dumps(arguments)"
            )

    def to_chat(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True)
class Message:
    """One conversation message, identified by ``id`` within its conversation.

    ``id`` is what makes an append idempotent: derive it from something stable
    across retries (for example the run id and the step name), not from a clock
    or a random number.
    """

    id: str
    role: Role
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    pinned: bool = False

    def __post_init__(self) -> None:
        _need_text("message id", self.id, empty_ok=False)
        if self.role not in ROLES:
            raise MemoryInputError(f"message {self.id!r}: role must be one of system, user, assistant, tool; "
                                   f"got {self.role!r}")
        _need_text(f"message {self.id!r} content", self.content, empty_ok=True)
        calls = self.tool_calls
        if not isinstance(calls, tuple):
            if isinstance(calls, (str, bytes, Mapping)) or not hasattr(calls, "__iter__"):
                raise MemoryInputError(f"message {self.id!r}: tool_calls must be a sequence of ToolCall")
            calls = tuple(calls)
            object.__setattr__(self, "tool_calls", calls)
        if calls:
            if self.role != "assistant":
                raise MemoryInputError(f"message {self.id!r}: only an assistant message may carry tool_calls "
                                       f"(role is {self.role!r})")
            seen: set[str] = set()
            for call in calls:
                if not isinstance(call, ToolCall):
                    raise MemoryInputError(f"message {self.id!r}: tool_calls must hold ToolCall objects, "
                                           f"got {type(call).__name__}")
                if call.id in seen:
                    raise MemoryInputError(f"message {self.id!r}: tool call id {call.id!r} appears twice; "
                                           "ids must be unique")
                seen.add(call.id)
        if self.role == "tool":
            if not isinstance(self.tool_call_id, str) or not self.tool_call_id:
                raise MemoryInputError(f"tool message {self.id!r} needs tool_call_id: the id of the call it answers")
        elif self.tool_call_id is not None:
            raise MemoryInputError(f"message {self.id!r}: only a tool message has a tool_call_id "
                                   f"(role is {self.role!r})")
        if not isinstance(self.pinned, bool):
            raise MemoryInputError(f"message {self.id!r}: pinned must be True or False")
        if self.pinned and (self.role == "tool" or calls):
            raise MemoryInputError(
                f"message {self.id!r}: a tool call or tool result cannot be pinned, since eviction "
                "could then separate it from its other half; pin the system instructions instead"
            )

    def to_chat(self) -> dict[str, Any]:
        """This message in OpenAI chat format (no memory-only fields such as ``id``)."""
        if self.role == "tool":
            return {"role": "tool", "tool_call_id": self.tool_call_id, "content": self.content}
        if self.tool_calls:
            return {
                "role": "assistant",
                # OpenAI itself returns null content beside tool calls.
                "content": self.content or None,
                "tool_calls": [c.to_chat() for c in self.tool_calls],
            }
        return {"role": self.role, "content": self.content}

    @classmethod
    def from_chat(cls, data: Mapping[str, Any], *, id: str, pinned: bool = False) -> Message:
        """Build a Message from an OpenAI chat-format dict (as :meth:`to_chat` returns)."""
        if not isinstance(data, Mapping):
            raise MemoryInputError(f"a chat message must be a mapping, got {type(data).__name__}")
        calls = []
        for raw in data.get("tool_calls") or ():
            fn = raw.get("function") or {}
            # Any: whatever the mapping holds; ToolCall and Message check it and say what is wrong.
            call_id: Any = raw.get("id")
            name: Any = fn.get("name")
            calls.append(ToolCall(id=call_id, name=name, arguments=fn.get("arguments", "{}")))
        content = data.get("content")
        role: Any = data.get("role")
        return cls(
            id=id,
            role=role,
            content="" if content is None else content,
            tool_calls=tuple(calls),
            tool_call_id=data.get("tool_call_id"),
            pinned=pinned,
        )


def stable_digest(message: Message) -> str:
    """A digest of everything but ``pinned`` that is the same in every process.

    Used to tell "the same message appended again" from "a different message
    reusing an id" (Python's ``hash`` is salted per process, so it cannot be
    stored).
    """
    payload = json.dumps(
        [
            message.role,
            message.content,
            [[c.id, c.name, c.arguments] for c in message.tool_calls],
            message.tool_call_id,
        ],
        ensure_ascii=False,
        separators=(",", ":"),
    )
    return hashlib.blake2b(payload.encode("utf-8"), digest_size=16).hexdigest()
