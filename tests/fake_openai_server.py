"""A scripted OpenAI-compatible chat-completions server for tests.

A real HTTP server on 127.0.0.1 (port chosen by the OS) in a background thread,
so the real ``openai`` client is exercised end to end: URL building, headers,
status-code handling and body parsing. ``POST /v1/chat/completions`` answers
with the next scripted :class:`Scripted` response, in order, and records every
request it receives. When the script runs out it answers 500 with a body that
says so, which shows up in a failing test's message.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from durable_agents.testing.loopback import LoopbackServer

CHAT_PATH = "/v1/chat/completions"


@dataclass
class Scripted:
    """One response: ``body`` is sent as JSON unless it is bytes; ``delay`` is seconds before answering."""

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: Any = None
    delay: float = 0.0


@dataclass
class Recorded:
    path: str
    headers: dict[str, str]
    body: Any


def completion(content: str | None, *, finish_reason: str = "stop", model: str = "fake-model") -> Scripted:
    """A 200 chat completion whose one choice carries ``content``."""
    return Scripted(body={
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 1700000000,
        "model": model,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": content},
            "finish_reason": finish_reason,
        }],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    })


def tool_call(name: str | None, arguments: Any = "{}", *, id: str | None = "call_1",
              type: str | None = "function") -> dict[str, Any]:
    """One entry of ``message.tool_calls``; ``None`` leaves that field out (a malformed call a server may send)."""
    function = {k: v for k, v in (("name", name), ("arguments", arguments)) if v is not None}
    call: dict[str, Any] = {"id": id, "type": type, "function": function}
    return {k: v for k, v in call.items() if v is not None}


def tool_completion(*calls: dict[str, Any], content: str | None = None,
                    finish_reason: str = "tool_calls") -> Scripted:
    """A 200 chat completion whose one choice asks for ``calls`` (``tool_call``), in that order."""
    scripted = completion(content, finish_reason=finish_reason)
    scripted.body["choices"][0]["message"]["tool_calls"] = list(calls)
    return scripted


def no_choices() -> Scripted:
    return Scripted(body={
        "id": "chatcmpl-fake", "object": "chat.completion", "created": 1700000000,
        "model": "fake-model", "choices": [],
    })


def error(status: int, message: str, headers: dict[str, str] | None = None) -> Scripted:
    """An OpenAI-shaped error body: ``{"error": {"message": ..., "type": ...}}``."""
    return Scripted(
        status=status,
        headers=dict(headers or {}),
        body={"error": {"message": message, "type": "fake_error", "code": None}},
    )


class FakeOpenAIServer(LoopbackServer):
    """Use as a context manager; ``base_url`` is the API root to give the client."""

    def __init__(self) -> None:
        self._script: deque[Scripted] = deque()
        self._lock = threading.Lock()
        self.requests: list[Recorded] = []
        super().__init__(_make_handler(self), name="fake-openai")

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def push(self, *responses: Scripted) -> None:
        with self._lock:
            self._script.extend(responses)

    @property
    def request_count(self) -> int:
        with self._lock:
            return len(self.requests)

    def _next(self, recorded: Recorded) -> Scripted:
        with self._lock:
            self.requests.append(recorded)
            if recorded.path != CHAT_PATH:
                return error(404, f"fake server: no route {recorded.path}")
            if not self._script:
                return error(500, "fake server: no scripted response left")
            return self._script.popleft()


def _make_handler(owner: FakeOpenAIServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        # HTTP/1.0: one request per connection, so no idle keep-alive thread
        # outlives the test.
        protocol_version = "HTTP/1.0"

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length)
            try:
                body: Any = json.loads(raw)
            except ValueError:
                body = raw
            scripted = owner._next(Recorded(self.path, {k.lower(): v for k, v in self.headers.items()}, body))
            if scripted.delay:
                time.sleep(scripted.delay)
            payload = scripted.body if isinstance(scripted.body, bytes) else json.dumps(scripted.body).encode()
            try:
                self.send_response(scripted.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                for name, value in scripted.headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(payload)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (a timeout test); nothing to report

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler
