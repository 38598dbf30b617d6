"""The model stand-in the grader runs: an OpenAI-compatible chat-completions
endpoint on loopback, in a thread of the grader's own process, that counts
every draft request it answers. The learner's program reaches it through
``LLM_BASE_URL`` like any model (``durable_agents.drafting.OpenAIChatModel``), so the count
is a witness the learner's code cannot forge: how often the draft step
really called the model.

Like a real model, it never writes the same words twice: each answer is
numbered ("draft 2 of ..."), so a request built from a fresh draft instead of
the recorded one is visible in what the provider applied.

A call belongs to the task in its last user message; the grader gives every
run a task of its own, so calls are counted per run.

A request with ``tools`` is a turn of exercise 7's agent loop: the answer is
the lab's scripted model's (``durable_agents.drafting.scripted``: a lookup, then a refund
and its email in one turn, then a ticket, then the final answer), with call
ids as hostile as a real model's (``loop_call_id``: a space, which no
idempotency key may carry, and one id for every call of every turn). Turns are
counted per task and per turn number, the turn being one more than the
assistant messages in the prompt: a turn asked again is counted again.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from durable_agents.drafting.scripted import ScriptedModel
from durable_agents.testing.loopback import JsonHandler, LoopbackServer

CHAT_PATH = "/v1/chat/completions"
MODEL_NAME = "grader-model-stand-in"


def loop_call_id(index: int) -> str:
    """The id the stand-in gives the ``index``-th tool call of every turn: ``"call 1"`` for every call, so
    the ids repeat across turns and within one (the refund and its email share theirs), as real models' ids
    may, and hold a space; trusted raw as a key, the provider refuses it, and a key that leaves out the turn
    or the call's place in it sends two calls under one key."""
    del index  # every call gets the same id: the key must not rely on ids being unique anywhere
    return "call 1"


@dataclass(frozen=True)
class Drafted:
    """One answer the stand-in gave: its number for that task and its words."""

    number: int
    subject: str
    body: str
    summary: str
    messages: list[dict[str, Any]] = field(default_factory=list)  # the prompt, as received


def _task_of(messages: list[Any]) -> str:
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            return content if isinstance(content, str) else json.dumps(content)
    return ""


def words_for(task: str, number: int) -> tuple[str, str, str]:
    """Subject, body and summary of the ``number``-th draft for ``task``."""
    line = " ".join(task.split())
    subject = f"Re: {line} (draft {number})"
    body = (f"Hello,\n\nThank you for your message:\n\n> {line}\n\nIt is in hand; we will follow up shortly.\n"
            f"(Draft {number} of the grader's model stand-in: a real model never writes the same words twice.)\n\n"
            "Kind regards,\nThe support team")
    summary = f"Replied to: {line} (draft {number})"
    return subject[:200], body, summary[:500]


class ModelStandIn(LoopbackServer):
    """Start with ``start()`` (or ``with``); ``base_url`` goes into ``LLM_BASE_URL``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: dict[str, list[Drafted]] = {}
        self._turns: dict[str, Counter[int]] = {}
        super().__init__(_handler(self), name="grader-model")

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def turns(self, task: str) -> Counter[int]:
        """How often each turn of the loop run with ``task`` was asked for."""
        with self._lock:
            return Counter(self._turns.get(task, Counter()))

    def loop_answer(self, messages: list[Any]) -> dict[str, Any]:
        """The scripted model's answer to a loop turn, as a chat-completions message; the turn counted."""
        task = next((m.get("content") for m in messages if isinstance(m, dict) and m.get("role") == "user"), "")
        turn = 1 + sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "assistant")
        with self._lock:
            self._turns.setdefault(str(task), Counter())[turn] += 1
        answer = ScriptedModel().answer([m for m in messages if isinstance(m, dict)])
        if not answer.tool_calls:
            return {"role": "assistant", "content": answer.content}
        return {"role": "assistant", "content": None, "tool_calls": [
            {"id": loop_call_id(i), "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for i, c in enumerate(answer.tool_calls)]}

    def calls(self, task: str) -> list[Drafted]:
        """Every draft answered for ``task``, in order."""
        with self._lock:
            return list(self._calls.get(task, ()))

    def answer(self, messages: list[Any]) -> Drafted:
        task = _task_of(messages)
        with self._lock:
            drafts = self._calls.setdefault(task, [])
            subject, body, summary = words_for(task, len(drafts) + 1)
            drafted = Drafted(len(drafts) + 1, subject, body, summary, [m for m in messages if isinstance(m, dict)])
            drafts.append(drafted)
        return drafted


def _handler(owner: ModelStandIn) -> type[BaseHTTPRequestHandler]:
    class Handler(JsonHandler):
        def do_POST(self) -> None:
            if self.path != CHAT_PATH:
                return self._send(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})
            try:
                request = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                messages = request["messages"]
                if not isinstance(messages, list):
                    raise TypeError("messages is not a list")
            except (ValueError, KeyError, TypeError) as err:
                return self._send(400, {"error": {"message": f"bad request: {err}", "type": "invalid_request"}})
            if request.get("tools"):
                message = owner.loop_answer(messages)
                return self._send(200, {
                    "id": "grader-turn", "object": "chat.completion", "created": 0, "model": MODEL_NAME,
                    "choices": [{"index": 0, "message": message,
                                 "finish_reason": "tool_calls" if message.get("tool_calls") else "stop"}],
                    "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
                })
            drafted = owner.answer(messages)
            content = json.dumps({"subject": drafted.subject, "body": drafted.body, "summary": drafted.summary})
            self._send(200, {
                "id": f"grader-{drafted.number}", "object": "chat.completion", "created": 0, "model": MODEL_NAME,
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": content}}],
                "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
            })

    return Handler
