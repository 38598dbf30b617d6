"""An agent is declared data: a name, its instructions, its tools, its model, its services, its bounds.

The contract:

- **One ``Agent`` object serves every engine.** A Temporal worker serves it through
  ``durable_agents.flowclient.agents.AgentPlugin`` (or the lab's ``worker.py --agent pkg.mod:attr``), the run record
  and DBOS through their commands' ``--agent``; a run names its agent when it starts (``name``) and every
  engine runs that run with that agent's tools only.
- **Its version** is the digest of what decides what a recorded call means: the loop's shape and, per tool,
  its name, argument schema and effect kind (``Toolbox.signature``). It is recorded with each run; a worker
  whose agent of that name has another version refuses the run's tasks, naming both versions, until a worker
  of the run's version runs it (deploy the new version beside the old one, as for the flow). The
  instructions and the tools' descriptions are not in it: a run records them at its start and every turn of
  it is asked with them, so a deploy that rewords them changes new runs only.
- **The model** is anything with a ``name`` and ``async turn(messages, tools, *, labels=None)`` answering an
  object with ``content`` and ``tool_calls`` (each ``id``, ``name``, ``arguments`` as JSON text):
  ``ScriptedModel`` for tests (turns as a function of the window), ``FunctionModel`` around an async
  function of the user's, or None: the worker's own model (the lab's: its OpenAI-compatible client at
  ``LLM_BASE_URL``, ``LLM_MODEL``; offline, the lab's scripted refund model). ``AGENT_MODEL=worker`` has a
  process ask the worker's model for every agent (the lab's stand-in can then serve the agent's own script
  and count its turns from outside: ``durable_agents.testing.standin --agent``).
- **Services** is a zero-argument factory of what the tools' handlers reach the world through
  (``ToolContext.services``: a client of the user's service); built once per worker process. None: the
  worker's own (the lab's ``StepDeps``).
- **Parameters** (``params``): the names of the values a run is started with and the tools read from
  ``ToolContext.params`` (what must not come from the model: an address to write to). Each is required,
  a line of text (``check_params``); no other name is accepted.

Nothing here imports the lab.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from durable_agents.tools import _NAME_CHARS, MAX_NAME_CHARS, Toolbox

__all__ = ["Agent", "Call", "FunctionModel", "Model", "Reply", "ScriptedModel", "load_agent"]

MAX_PARAM_CHARS = 1000
"""A run parameter's value: a line of at most 1,000 characters."""


@dataclass(frozen=True)
class Call:
    """A tool call as a model answers it: its ``id`` (the model's), the tool's ``name``, its ``arguments``
    as the JSON text the model wrote."""

    id: str
    name: str
    arguments: str = "{}"


@dataclass(frozen=True)
class Reply:
    """A model's answer to one turn: its text and the calls it asks for, in order (none: the final answer)."""

    content: str = ""
    tool_calls: tuple[Call, ...] = ()


class Model(Protocol):
    """What a turn asks of a model (the lab's ``durable_agents.steps.ports.ToolModel``)."""

    name: str

    async def turn(self, messages: list[dict], tools: list[dict], *,
                   labels: Mapping[str, str] | None = None) -> Any: ...


Script = Callable[[list[dict]], Any]
"""A scripted model's turns: the window in; a ``Reply``, a text, or ``(tool name, arguments)`` pairs out."""


class ScriptedModel:
    """A model written as data, for tests and examples: ``script(messages)`` is called with the turn's
    window (chat messages, system first) and answers a ``Reply``, a text (the final answer), or a list of
    ``(tool name, arguments dict)`` (calls, ids ``t<turn>-<place>``, the turn counted from the window's
    assistant messages). Deterministic when the script is: a turn asked again answers alike."""

    def __init__(self, script: Script, name: str = "scripted") -> None:
        self.script = script
        self.name = name

    async def turn(self, messages: list[dict], tools: list[dict], *,
                   labels: Mapping[str, str] | None = None) -> Reply:
        said = self.script(messages)
        if isinstance(said, Reply):
            return said
        if isinstance(said, str):
            return Reply(said)
        turn = 1 + sum(m.get("role") == "assistant" for m in messages)
        return Reply("", tuple(Call(f"t{turn}-{i}", name, json.dumps(dict(args)))
                               for i, (name, args) in enumerate(said)))


class FunctionModel:
    """A model of the user's own: ``ask(messages, tools)`` an async function answering a ``Reply`` (or
    anything with ``content`` and ``tool_calls``). Whatever it raises, the engine retries the turn under the
    run's retry rule (the turn is not recorded until it answers)."""

    def __init__(self, ask: Callable[[list[dict], list[dict]], Awaitable[Any]], name: str = "function") -> None:
        self.ask = ask
        self.name = name

    async def turn(self, messages: list[dict], tools: list[dict], *,
                   labels: Mapping[str, str] | None = None) -> Any:
        return await self.ask(messages, tools)


@dataclass(frozen=True)
class Agent:
    """An agent, declared (see the module docstring). ``ValueError`` for a declaration that breaks its rules,
    when it is made."""

    name: str
    instructions: str
    tools: Toolbox
    model: Model | None = None
    services: Callable[[], Any] | None = None
    params: tuple[str, ...] = ()
    max_turns: int = 20
    window_tokens: int = 2000
    window_messages: int = 40

    def __post_init__(self) -> None:
        if not (isinstance(self.name, str) and 1 <= len(self.name) <= MAX_NAME_CHARS
                and set(self.name) <= _NAME_CHARS):
            raise ValueError(f"an agent's name is 1-{MAX_NAME_CHARS} letters, digits, '_' and '-'; got "
                             f"{self.name!r}")
        if not isinstance(self.instructions, str) or not self.instructions.strip():
            raise ValueError(f"agent {self.name}: its instructions are a non-empty text")
        if not isinstance(self.tools, Toolbox) or not len(self.tools):
            raise ValueError(f"agent {self.name}: its tools are a durable_agents.Toolbox of at least one Tool")
        if self.model is not None and not callable(getattr(self.model, "turn", None)):
            raise ValueError(f"agent {self.name}: its model needs an async turn(messages, tools) (e.g. "
                             "durable_agents.ScriptedModel), or None for the worker's model")
        if self.services is not None and not callable(self.services):
            raise ValueError(f"agent {self.name}: services is a zero-argument factory of what its tools reach "
                             "the world through, or None")
        if not isinstance(self.params, tuple) or any(not (isinstance(p, str) and p and set(p) <= _NAME_CHARS)
                                                     for p in self.params):
            raise ValueError(f"agent {self.name}: params is a tuple of names (letters, digits, '_', '-')")
        for what, value, low in (("max_turns", self.max_turns, 1), ("window_tokens", self.window_tokens, 311),
                                 ("window_messages", self.window_messages, 4)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"agent {self.name}: {what} is a whole number from {low}, got {value!r}")

    def check_params(self, given: Mapping[str, Any] | None) -> dict[str, str]:
        """The run's parameters, checked: each of ``params`` given once as a line of text, no other;
        ``ValueError`` saying what to give."""
        given = dict(given or {})
        unknown = sorted(set(given) - set(self.params))
        if unknown:
            wanted = ", ".join(self.params) or "none"
            raise ValueError(f"agent {self.name} takes no parameter {', '.join(map(repr, unknown))}; it takes: "
                             f"{wanted}")
        missing = [p for p in self.params if p not in given]
        if missing:
            raise ValueError(f"agent {self.name} needs the run parameter{'s' if len(missing) > 1 else ''} "
                             f"{', '.join(missing)}: give --param NAME=VALUE")
        for name, value in given.items():
            if not isinstance(value, str) or not value.strip() or len(value) > MAX_PARAM_CHARS \
                    or not value.isprintable():
                raise ValueError(f"run parameter {name} must be a line of 1-{MAX_PARAM_CHARS} printable "
                                 f"characters, got {str(value)[:40]!r}")
        return given


def load_agent(spec: str) -> Agent:
    """The ``Agent`` an import string names: ``package.module:attribute`` (as uvicorn takes an app).
    ``ValueError`` saying what is wrong: the form, a module that does not import, no such attribute, or an
    attribute that is not an ``Agent``."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr or not attr.isidentifier():
        raise ValueError(f"an agent is named as package.module:attribute (e.g. examples.scheduler.agent:AGENT), "
                         f"got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"cannot import {module_name!r} for agent {spec!r}: {err}; is it on PYTHONPATH?") from None
    agent = getattr(module, attr, None)
    if not isinstance(agent, Agent):
        raise ValueError(f"{spec!r} is {'missing' if agent is None else type(agent).__name__}: it must name a "
                         "durable_agents.Agent")
    return agent
