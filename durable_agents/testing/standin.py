"""The model stand-in: an OpenAI-compatible chat-completions server on loopback that plays the agent loop's
model (``durable_agents.drafting.scripted.ScriptedModel``, or an agent's own: ``agent``, below) and the flow's drafting
model (``durable_agents.drafting.OfflineModel``), and counts every request it answers. Point ``LLM_BASE_URL`` at it (any
``LLM_MODEL``) and the lab's real client, ``durable_agents.drafting.OpenAIChatModel``, talks to it over TCP as to any
server.

What it counts, and how. Every well-formed ``POST /v1/chat/completions`` (a JSON object whose ``messages``
is a non-empty list of chat messages) is counted once, under the run and the turn its headers name:
``X-Lab-Run`` and ``X-Lab-Turn``, percent-decoded (``OpenAIChatModel.turn`` sends them from the loop's
labels); a header left out counts as ``"-"`` (a draft request carries none). One fallback: a request with
``tools`` that names a run but no turn (a peer framework's, ``peers/``: its worker sends ``X-Lab-Run`` from
``LAB_PEER_RUN`` but cannot send the lab's turn) is counted under the turn its window implies, one more than
the assistant messages in it, so a peer's requests are counted per turn as the lab's are; a request with
neither header still counts as run ``"-"``, turn ``"-"``. A request is counted when it arrives, before its
answer is sent and before any ``delay``: it counts as asked whether or not the asker is still there to read
the answer (a worker killed during the request), and a test that sees the count rise knows the request is in
flight. A refused request (400, 404) is not counted.

The count is the witness of "a recorded turn is never asked again" (CONVENTIONS.md): the loop records a
turn before any of its calls runs, so after a run each turn was asked once, plus once for every attempt
whose answer was lost before it was recorded (a kill during the request, a crash at ``turn:after_answer``),
and never after it was recorded. It is counted where the model is, in another thread or process than the
loop, so the loop's code cannot make it up.

Answers:

- a request with ``tools``, with ``agent`` (``--agent package.module:attr``, a ``durable_agents.Agent``): that
  agent's own model's answer, ``await agent.model.turn(messages, tools, labels=...)`` (a ``ScriptedModel``'s
  script, or any model with ``turn``), given the messages and the tools exactly as the request carried them.
  The lab's client sends the window as the loop built it (``OpenAIChatModel.turn``: the messages "go as
  given"), and the window is JSON already (the engines record it as such), so the script reads here the
  same messages it reads in the worker's process and answers alike (tests/test_model_standin.py checks it).
  The answers are made one at a time, on one event loop of the stand-in's own. The agent's tools never run
  here, and its services are never built: only its model is asked. Then, as below, in the OpenAI shape;
- a request with ``tools`` otherwise: the scripted model's answer to its messages, as a chat completion: tool calls
  in the OpenAI shape (``message.tool_calls``, ``finish_reason`` ``"tool_calls"``), or the final text
  (``finish_reason`` ``"stop"``). ``delay`` seconds are slept before each such answer;
- a request without ``tools``: the offline model's draft of its messages as a JSON object (``subject``,
  ``body``, ``summary``) in ``content``, so the three-step flow runs against it too;
- ``vary``: both word every answer differently and the tool call ids are random, as a real model's; with
  ``agent``, its script's answers keep their tools and arguments, and each answer's text gets a number and
  each call a random id (a turn asked again then chooses other keys, as a real model's would: what the kill
  matrix's random mode asks for);
- ``fail_status`` (an HTTP status, 400 to 599): a request with ``tools`` is answered with that status and an
  OpenAI-style error body instead, the same words every time (``FAILED_WORDS``: the model side's answer to
  the request, as a model that cannot serve a prompt gives it), counted as asked; ``fail_times`` N: only the
  first N such requests of each run fail, then it answers as usual (an outage that clears); ``fail_varied``:
  each error's words carry its number, so no two are alike.

Routes: ``POST /v1/chat/completions``; ``GET /v1/counts?run=ID`` -> ``{"run": ID, "requests": n, "turns":
{"1": 2, "2": 1}}``; ``GET /v1/counts`` -> every run's; ``GET /healthz`` -> 200. A body that is not JSON,
or has no messages, gets a 400 with an OpenAI-style error body (``{"error": {"message", "type"}}``).

In this process (a test)::

    with ModelStandIn(vary=False, delay=0.0) as standin:   # standin.url: the API root, ending in /v1
        ...; standin.counts("run-1")

or as its own process, which prints one line, ``model stand-in listening on <url>``, once it serves, and
stops cleanly on SIGTERM or SIGINT::

    python -m durable_agents.testing.standin [--port N] [--vary | --agent package.module:attr] [--delay SECONDS]
                                [--fail-status STATUS [--fail-times N] [--fail-varied]]

(``--agent``: an agent that does not load, or whose model has no ``turn``, is refused with exit status 2 and
what to do. A worker asks it over HTTP, instead of in its own process, with ``AGENT_MODEL=worker`` and
``LLM_BASE_URL`` pointed here: ``durable_agents.steps.served``.)

(``start_model_standin`` starts that process and waits for the line; ``turns_asked`` reads one run's
count from either form.)
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import json
import math
import signal
import sys
import threading
import time
import uuid
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Self
from urllib.parse import parse_qs, unquote, urlsplit

from durable_agents.agent import Agent, load_agent
from durable_agents.drafting import OfflineModel, ScriptedModel
from durable_agents.steps.errors import PermanentError
from durable_agents.steps.loop import AskedCall, ModelAnswer
from durable_agents.testing.loopback import JsonHandler
from durable_agents.testing.processes import Proc

CHAT_PATH = "/v1/chat/completions"
COUNTS_PATH = "/v1/counts"
HEALTH_PATH = "/healthz"
MODEL_NAME = "lab-model-stand-in"
READY = "model stand-in listening on"
NO_LABEL = "-"
RUN_HEADER = "X-Lab-Run"
TURN_HEADER = "X-Lab-Turn"
MAX_DELAY = 600.0
STARTUP_TIMEOUT = 30.0
# A window of the loop is a few kilobytes; a body past this is a client's mistake, not a prompt.
_MAX_BODY_BYTES = 8 * 1024 * 1024


FAILED_WORDS = "the model could not serve this prompt"
"""The message of a failed answer (``fail_status``): word for word the same every time unless ``fail_varied``."""


class BadRequest(ValueError):
    """A request the stand-in refuses with a 400; the message says what was wrong."""


class Failed(Exception):
    """A request the stand-in answers with ``status`` (``fail_status``), already counted."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class ModelStandIn:
    """The stand-in in a daemon thread of this process, on 127.0.0.1 (``port`` 0: one the OS picks).

    ``durable_agents.testing.loopback.LoopbackServer``'s pattern, with a port of choice (the process form's ``--port``):
    ``start()`` (or ``with``) serves, ``stop()`` shuts down and joins; ``url`` is the API root
    (``http://127.0.0.1:<port>/v1``), what ``LLM_BASE_URL`` takes."""

    def __init__(self, *, vary: bool = False, delay: float = 0.0, port: int = 0, fail_status: int | None = None,
                 fail_times: int | None = None, fail_varied: bool = False, agent: Agent | None = None) -> None:
        if agent is not None:
            if not isinstance(agent, Agent):
                raise ValueError(f"agent must be a durable_agents.Agent, got {type(agent).__name__}")
            if not callable(getattr(agent.model, "turn", None)):
                raise ValueError(f"agent {agent.name} declares no model of its own to serve (model="
                                 f"{type(agent.model).__name__ if agent.model is not None else None}): declare it "
                                 "with one, e.g. model=durable_agents.ScriptedModel(script)")
        if isinstance(delay, bool) or not isinstance(delay, (int, float)) or not (
                math.isfinite(delay) and 0 <= delay <= MAX_DELAY):
            raise ValueError(f"delay must be a number of seconds from 0 to {MAX_DELAY:g}, got {delay!r}")
        if fail_status is not None and not (isinstance(fail_status, int) and 400 <= fail_status <= 599):
            raise ValueError(f"fail status must be an HTTP error status from 400 to 599, got {fail_status!r}")
        if fail_times is not None and not (isinstance(fail_times, int) and fail_times >= 1):
            raise ValueError(f"fail times must be a whole number from 1, got {fail_times!r}")
        if fail_status is None and (fail_times is not None or fail_varied):
            raise ValueError("fail times and fail varied need a fail status")
        self.vary = vary
        self.delay = float(delay)
        self.fail_status, self.fail_times, self.fail_varied = fail_status, fail_times, fail_varied
        self._failed: Counter[str] = Counter()  # failed answers, by run
        self.model = ScriptedModel(vary=vary)
        self.drafter = OfflineModel(vary=vary)
        self.agent = agent
        # The agent's model is async and may hold what is bound to a loop (a client): one loop of its own.
        self._agent_loop = asyncio.new_event_loop() if agent is not None else None
        self._agent_thread = threading.Thread(target=self._agent_loop.run_forever, name="model-standin-agent",
                                              daemon=True) if self._agent_loop is not None else None
        self._lock = threading.Lock()  # the counts, the answer numbers and the scripted model's own count
        self._counts: dict[str, Counter[str]] = {}
        self._answered = 0
        self._server = ThreadingHTTPServer(("127.0.0.1", port), _handler(self))
        self._server.daemon_threads = True  # a request asleep in its delay never holds up stop()
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.02},
                                        name="model-standin", daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> Self:
        if self._agent_thread is not None:
            self._agent_thread.start()
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join(timeout=5)
        self._server.server_close()
        if self._agent_loop is not None and self._agent_thread is not None:
            if self._agent_thread.is_alive():
                self._agent_loop.call_soon_threadsafe(self._agent_loop.stop)
                self._agent_thread.join(timeout=5)
            if not self._agent_thread.is_alive():
                self._agent_loop.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- the counts ------------------------------------------------------------------------------

    def count(self, run: str, turn: str) -> None:
        with self._lock:
            self._counts.setdefault(run, Counter())[turn] += 1

    def counts(self, run: str | None = None) -> dict[str, Any]:
        """One run's counts, ``{"run", "requests", "turns": {turn: n}}`` (a run never seen: 0 and none); or,
        without ``run``, ``{"requests": total, "runs": {run: {"requests", "turns"}}}``. What ``GET /v1/counts``
        answers."""
        with self._lock:
            if run is not None:
                turns = self._counts.get(run, Counter())
                return {"run": run, "requests": sum(turns.values()), "turns": _ordered(turns)}
            runs = {r: {"requests": sum(t.values()), "turns": _ordered(t)} for r, t in sorted(self._counts.items())}
        return {"requests": sum(r["requests"] for r in runs.values()), "runs": runs}

    # -- the answers -----------------------------------------------------------------------------

    def complete(self, request: Any, run: str, turn: str) -> dict[str, Any]:
        """The chat completion for ``request`` (a parsed body), counted under ``run`` and ``turn``;
        ``BadRequest`` (not counted) when the body is not one the API accepts."""
        messages, tools = _checked(request)
        if turn == NO_LABEL and run != NO_LABEL and tools:  # a peer's request (see the module docstring)
            turn = str(1 + sum(1 for m in messages if m.get("role") == "assistant"))
        self.count(run, turn)
        if tools and self.fail_status is not None:
            with self._lock:
                failing = self.fail_times is None or self._failed[run] < self.fail_times
                if failing:
                    self._failed[run] += 1
                    number = sum(self._failed.values())
            if failing:
                raise Failed(self.fail_status, f"{FAILED_WORDS} (error {number})" if self.fail_varied
                             else FAILED_WORDS)
        if tools:
            if self.delay:
                time.sleep(self.delay)  # in this request's own thread: other requests are answered meanwhile
            if self._agent_loop is not None and self.agent is not None:
                labels = {k: v for k, v in (("run", run), ("turn", turn)) if v != NO_LABEL}
                asked = self.agent.model.turn(messages, tools, labels=labels)  # type: ignore[union-attr]
                answer = asyncio.run_coroutine_threadsafe(asked, self._agent_loop).result()
                if self.vary:
                    with self._lock:
                        self._answered += 1
                        answer = _varied(answer, self._answered)
            else:
                with self._lock:
                    answer = self.model.answer(messages)
            message, finish = _tool_message(answer)
        else:
            try:
                # The offline model awaits nothing: a loop of its own in this handler thread runs it through.
                draft = asyncio.run(self.drafter.draft(messages))
            except PermanentError as err:
                raise BadRequest(str(err)) from None
            message, finish = {"role": "assistant", "content": json.dumps(draft.to_dict())}, "stop"
        with self._lock:
            self._answered += 1
            number = self._answered
        model = request.get("model")
        return {
            "id": f"chatcmpl-standin-{number}", "object": "chat.completion", "created": int(time.time()),
            "model": model if isinstance(model, str) and model else MODEL_NAME,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
        }


def _checked(request: Any) -> tuple[list[dict[str, Any]], list[Any]]:
    if not isinstance(request, dict):
        raise BadRequest("the body must be a JSON object")
    messages = request.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list of chat messages")
    for place, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise BadRequest(f"messages[{place}] must be an object with a 'role'")
        calls = message.get("tool_calls")
        if calls is not None and not (isinstance(calls, list) and all(isinstance(c, dict) for c in calls)):
            raise BadRequest(f"messages[{place}].tool_calls must be a list of objects")
    tools = request.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise BadRequest("'tools' must be a list of tool specs")
    return messages, tools or []


def _varied(answer: Any, number: int) -> ModelAnswer:
    """An agent's answer as a real model varies it: its words numbered, each call a random id; the tools and
    their arguments as the script wrote them."""
    content = str(getattr(answer, "content", "") or "")
    calls = tuple(AskedCall(f"call_{uuid.uuid4().hex[:12]}", c.name, c.arguments)
                  for c in getattr(answer, "tool_calls", None) or ())
    return ModelAnswer(f"{content} [answer {number}]" if content or not calls else "", calls)


def _tool_message(answer: ModelAnswer | Any) -> tuple[dict[str, Any], str]:
    if not answer.tool_calls:
        return {"role": "assistant", "content": answer.content}, "stop"
    return {"role": "assistant", "content": answer.content or None, "tool_calls": [
        {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
        for c in answer.tool_calls]}, "tool_calls"


def _ordered(turns: Counter[str]) -> dict[str, int]:
    """Turns in their numeric order ("2" before "10"), any other label after them."""
    return {t: turns[t] for t in sorted(turns, key=lambda t: (not t.isdigit(), int(t) if t.isdigit() else 0, t))}


def _error(message: str, kind: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "code": None}}


def _handler(owner: ModelStandIn) -> type[BaseHTTPRequestHandler]:
    class Handler(JsonHandler):
        def do_GET(self) -> None:
            parts = urlsplit(self.path)
            if parts.path == HEALTH_PATH:
                return self._send(200, {"ok": True})
            if parts.path == COUNTS_PATH:
                query = parse_qs(parts.query, keep_blank_values=True)
                return self._send(200, owner.counts(query["run"][0] if "run" in query else None))
            self._send(404, _error(f"no route GET {parts.path}", "not_found"))

        def do_POST(self) -> None:
            path = urlsplit(self.path).path
            if path != CHAT_PATH:
                return self._send(404, _error(f"no route POST {path}", "not_found"))
            try:
                length = int(self.headers.get("Content-Length") or 0)
                if not 0 < length <= _MAX_BODY_BYTES:
                    raise BadRequest(f"the body must be 1 to {_MAX_BODY_BYTES} bytes of JSON, "
                                     f"with its Content-Length")
                try:
                    request = json.loads(self.rfile.read(length))
                except ValueError:
                    raise BadRequest("the body is not JSON") from None
                completion = owner.complete(request, self._label(RUN_HEADER), self._label(TURN_HEADER))
            except ValueError as err:  # BadRequest, or a Content-Length that is not a number
                return self._send(400, _error(f"bad request: {err}", "invalid_request_error"))
            except Failed as err:
                return self._send(err.status, _error(str(err), "server_error"))
            except Exception as err:  # a bug here: say so in the answer rather than drop the connection
                return self._send(500, _error(f"the model stand-in failed: {type(err).__name__}: {err}",
                                              "server_error"))
            self._send(200, completion)

        def _label(self, header: str) -> str:
            value = self.headers.get(header)
            return unquote(value) if value else NO_LABEL

    return Handler


# ---------------------------------------------------------------- as a process


_live: set[Proc] = set()


def start_model_standin(port: int = 0, vary: bool = False, delay: float = 0.0, *, echo: bool = False,
                        fail_status: int | None = None, fail_times: int | None = None,
                        fail_varied: bool = False, agent: str | None = None,
                        env: dict[str, str] | None = None, cwd: Path | None = None) -> tuple[Proc, str]:
    """``python -m durable_agents.testing.standin`` as an OS process, serving when this returns: (the process, its API
    root for ``LLM_BASE_URL``). ``agent``: an import string (``--agent``); ``env``: added to the process's
    (what the agent's script reads); ``cwd``: where it starts (default this process's: the folder an agent's
    import string is found from). The caller stops it (``proc.stop()``: SIGTERM) or kills it; one still
    running when the interpreter exits is killed then. A start that fails raises with what it printed."""
    argv = [sys.executable, "-m", "durable_agents.testing.standin", "--port", str(port)]
    if agent:
        argv += ["--agent", agent]
    if vary:
        argv.append("--vary")
    if delay:
        argv += ["--delay", repr(float(delay))]
    if fail_status is not None:
        argv += ["--fail-status", str(fail_status)]
    if fail_times is not None:
        argv += ["--fail-times", str(fail_times)]
    if fail_varied:
        argv.append("--fail-varied")
    proc = Proc("model-standin", argv, env={**(env or {}), "PYTHONUNBUFFERED": "1"}, cwd=cwd, echo=echo)
    _live.add(proc)
    try:
        line = proc.wait_for_line(READY, timeout=STARTUP_TIMEOUT)
    except BaseException:
        proc.kill()
        _live.discard(proc)
        raise
    return proc, line.split(READY, 1)[1].strip()


@atexit.register
def _kill_leftovers() -> None:
    for proc in list(_live):
        proc.kill()


def turns_asked(url: str, run_id: str) -> dict[str, int]:
    """How many times the stand-in whose API root is ``url`` was asked each turn of ``run_id``
    (``GET /v1/counts?run=ID``): ``{"1": 1, "2": 2, ...}``, counted where the model is."""
    import httpx  # for the askers: the stand-in's own process never needs it

    answer = httpx.get(f"{url}/counts", params={"run": run_id}, timeout=5).json()
    return {str(turn): int(n) for turn, n in answer["turns"].items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m durable_agents.testing.standin",
        description="An OpenAI-compatible chat-completions server on 127.0.0.1 that plays the lab's models "
                    "(the agent loop's scripted model, the offline draft) and counts requests per run and turn.")
    parser.add_argument("--port", type=int, default=0, help="the port to listen on (default 0: one the OS picks)")
    parser.add_argument("--vary", action="store_true",
                        help="word every answer differently and give random tool call ids, as a real model")
    parser.add_argument("--agent", metavar="MODULE:ATTR", default=None,
                        help="answer tool requests with this durable_agents.Agent's own model (its script), "
                             "loaded by import string (e.g. examples.scheduler.agent:AGENT)")
    parser.add_argument("--delay", type=float, default=0.0,
                        help="seconds to wait before answering each tool request (to kill a worker during one)")
    parser.add_argument("--fail-status", type=int, default=None,
                        help="answer each tool request with this HTTP status (400-599), the same error every time")
    parser.add_argument("--fail-times", type=int, default=None,
                        help="with --fail-status: fail only the first N tool requests of each run, then answer")
    parser.add_argument("--fail-varied", action="store_true",
                        help="with --fail-status: number each error, so that no two are alike")
    args = parser.parse_args(argv)
    if not 0 <= args.port <= 65535:
        parser.error(f"--port {args.port} is not a port: give 1-65535, or 0 for one the OS picks")
    agent = None
    if args.agent is not None:
        try:
            agent = load_agent(args.agent)
        except ValueError as err:
            parser.error(f"--agent: {err}")
    try:
        standin = ModelStandIn(vary=args.vary, delay=args.delay, port=args.port, fail_status=args.fail_status,
                               fail_times=args.fail_times, fail_varied=args.fail_varied, agent=agent)
    except ValueError as err:
        parser.error(str(err))
    except OSError as err:
        print(f"model stand-in: cannot listen on 127.0.0.1:{args.port} ({err}); "
              "give another --port, or 0 for one the OS picks", file=sys.stderr)
        return 1
    stopping = threading.Event()
    # Handlers before the ready line: a SIGTERM sent the moment the line is read still stops it cleanly.
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopping.set())
    standin.start()
    print(f"{READY} {standin.url}", flush=True)
    while not stopping.wait(0.5):
        pass
    standin.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
