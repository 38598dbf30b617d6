"""The agents a process serves, each with what its tools reach the world through; and, per task queue, the
agents a Temporal worker serves (which its workflow code reads).

A run names its agent (``durable_agents.steps.loop.LoopInputs.agent``; "" for a run recorded before agents had names:
the lab's refund agent). Every engine looks the name up among the agents it serves and runs that run with that
agent's tools only. No agent of that name: the run is refused, visibly, and not run by another agent; an
agent of that name whose version is not the run's (``durable_agents.steps.loop.loop_changed``): refused likewise, naming
both versions.

On Temporal the workflow code reads ``served_on(task queue, name)``: this module is imported through the
sandbox (``durable_agents.workflows.agent_loop``), so its table is the worker process's. A queue nothing was registered
on serves the lab's refund agent alone (a worker built directly with the lab's ``LoopActivities``, and the
replay tests).

Which model asks an agent's turns is the process's choice, read once by ``serve`` from ``AGENT_MODEL``:
``own`` (the default) asks each agent its declared model, or the process's own model (``StepDeps.agent``)
when it declares none; ``worker`` asks the process's own model for every agent, its client of
``LLM_BASE_URL``, so that the requests are made over HTTP and counted where the model is (the lab's
``python -m durable_agents.testing.standin --agent`` serves an agent's script there). The agent is served as
``dataclasses.replace(agent, model=None)``: the model is not in the agent's version (``Served.version``), so a
run keeps its version whichever model asks it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from durable_agents.agent import Agent
from durable_agents.steps.limits import InputError
from durable_agents.steps.loop import MAX_INSTRUCTIONS_CHARS, instructions, loop_digest, loop_signature
from durable_agents.steps.refund_agent import REFUND_AGENT

__all__ = ["AGENT_MODEL", "AGENT_MODELS", "REFUND", "Served", "agent_model", "agent_name", "close_services", "find",
           "serve", "serve_on", "served_names", "served_on", "unreached_points", "warn_unreached_points"]

AGENT_MODEL = "AGENT_MODEL"
"""The environment variable that chooses which model asks an agent's turns (the module docstring)."""

AGENT_MODELS = ("own", "worker")


def agent_name(recorded: str | None) -> str:
    """The agent a run names: its recorded name; "" (recorded before agents had names) is the refund agent."""
    return recorded or REFUND_AGENT.name


@dataclass(frozen=True)
class Served:
    """An agent as one process serves it: with ``services``, what its tools' handlers are given
    (``ToolContext.services``), built once in the process. ``signature`` and ``version`` are the agent's
    (``durable_agents.steps.loop.loop_signature`` of its tools; its digest)."""

    agent: Agent
    services: Any = None
    signature: tuple[str, ...] = field(init=False, compare=False)
    version: str = field(init=False, compare=False)

    def __post_init__(self) -> None:
        signature = loop_signature(self.agent.tools)
        object.__setattr__(self, "signature", signature)
        object.__setattr__(self, "version", loop_digest(signature))
        told = instructions(self.agent)
        size = len(told["prompt"]) + len(str(told["tools"]))
        if size > MAX_INSTRUCTIONS_CHARS:
            raise ValueError(f"agent {self.agent.name}: its instructions and its tools' specs take {size} "
                             f"characters; at most {MAX_INSTRUCTIONS_CHARS} (each run records them): shorten "
                             "the instructions or the tools' descriptions")

    @property
    def name(self) -> str:
        return self.agent.name

    def shown(self) -> str:
        return f"{self.agent.name} (version {self.version})"

    def check_params(self, given: Mapping[str, Any] | None) -> dict[str, str]:
        """The run's parameters, checked by the agent's declaration (``InputError`` saying what to give)."""
        try:
            return self.agent.check_params(given)
        except ValueError as err:
            raise InputError(str(err)) from None


REFUND = Served(REFUND_AGENT)
"""The lab's refund agent, as a process with no services of its own serves it (its tools are given the
process's ``durable_agents.steps.flow.StepDeps``)."""


def agent_model(env: Mapping[str, str] | None = None) -> str:
    """``AGENT_MODEL`` from ``env`` (default: this process's environment): ``own`` (unset or empty) or
    ``worker``; ``InputError`` (a ``ValueError``) naming the allowed values otherwise."""
    env = os.environ if env is None else env
    value = (env.get(AGENT_MODEL) or "").strip() or "own"
    if value not in AGENT_MODELS:
        raise InputError(f"{AGENT_MODEL}={value!r} is not a choice: give 'own' (the default: each agent's declared "
                         "model, the worker's when it declares none) or 'worker' (the worker's model, its client "
                         "of LLM_BASE_URL, for every agent)")
    return value


def serve(agents: Iterable[Agent], default_services: Any = None, *, model: str | None = None) -> list[Served]:
    """``agents`` as this process serves them: each with its own services built (``Agent.services()``), or
    ``default_services`` (the worker's ``StepDeps``) when it declares none; each asked by its own model, or
    with ``model`` ``"worker"`` by the process's (default: ``agent_model()``, from ``AGENT_MODEL``).
    ``ValueError`` for two agents of one name; ``InputError`` (a ``ValueError`` too, which every engine's
    command prints as a refusal) for a bad ``AGENT_MODEL``, or ``AGENT_MODEL=worker`` for an agent
    that declares a model while ``LLM_BASE_URL`` is unset: the process's own model is then the lab's refund
    script, which knows none of another agent's tools. (A caller giving ``model`` gives its own
    ``default_services``' model, which may be any.)"""
    agents = list(agents)
    from_env = model is None
    model = agent_model(None if model is None else {AGENT_MODEL: model})
    declared = [a.name for a in agents if a.model is not None]
    if from_env and model == "worker" and declared and not os.environ.get("LLM_BASE_URL", "").strip():
        raise InputError(f"{AGENT_MODEL}=worker asks the worker's model for agent {declared[0]}, its client of "
                         "LLM_BASE_URL, which is not set: point LLM_BASE_URL at an OpenAI-compatible server "
                         "(python -m durable_agents.testing.standin --agent package.module:attr serves an agent's "
                         "own script), or unset AGENT_MODEL")
    given: dict[str, Agent] = {}
    out: dict[str, Served] = {}
    for agent in agents:
        if agent.name in out:
            if given[agent.name] is agent:
                continue
            raise ValueError(f"two agents are named {agent.name!r}: a run names the agent it is run by")
        given[agent.name] = agent
        services = agent.services() if agent.services is not None else default_services
        # The model is not in the version (loop_signature reads the tools): a run keeps its version.
        asked = replace(agent, model=None) if model == "worker" and agent.model is not None else agent
        out[agent.name] = Served(asked, services)
    return list(out.values())


async def close_services(served: Iterable[Served], default_services: Any = None) -> None:
    """Close what ``serve`` built for each agent (its ``aclose()`` or ``close()``, when it has one); not the
    process's own (``default_services``), which its owner closes."""
    for one in served:
        services = one.services
        if services is None or services is default_services:
            continue
        closing = getattr(services, "aclose", None) or getattr(services, "close", None)
        if closing is not None:
            done = closing()
            if hasattr(done, "__await__"):
                await done


_ON_QUEUE: dict[str, dict[str, Served]] = {}


def serve_on(queue: str, served: Iterable[Served]) -> None:
    """Register the agents a worker of ``queue`` serves (its workflow code reads them: ``served_on``)."""
    table = _ON_QUEUE.setdefault(queue, {})
    for one in served:
        table[one.name] = one


def served_on(queue: str, name: str) -> Served | None:
    """The agent ``name`` as the worker of ``queue`` in this process serves it, or None."""
    table = _ON_QUEUE.get(queue)
    if table is None:
        return REFUND if agent_name(name) == REFUND.name else None
    return table.get(agent_name(name))


def served_names(queue: str) -> list[str]:
    table = _ON_QUEUE.get(queue)
    return [s.shown() for s in table.values()] if table is not None else [REFUND.shown()]


def find(served: Mapping[str, Served], name: str, where: str) -> Served:
    """The agent ``name`` among ``served`` (by name); ``InputError`` naming what is served otherwise."""
    found = served.get(agent_name(name))
    if found is None:
        have = ", ".join(s.shown() for s in served.values()) or "none"
        raise InputError(f"{where} does not serve agent {agent_name(name)!r} (it serves: {have}); run it with "
                         f"--agent naming that agent's import string (package.module:attribute)")
    return found


def unreached_points(armed: Iterable[str], served: Iterable[Served]) -> list[str]:
    """The crash points armed (``CRASH_AT``) that no code of a process serving ``served`` can reach, each said
    with why: a ``tool:<name>:...`` point whose tool none of the agents declares (the lab's refund agent
    included, which every engine serves), or a name that is no ``place:moment`` at all. Other points (a step's,
    an engine's) are not checked here: their names are the engines' own (docs/crashpoints.md)."""
    agents = {s.name: s for s in [REFUND, *served]}
    tools = sorted({name for s in agents.values() for name in s.agent.tools.names})
    said = []
    for point in sorted(armed):
        parts = point.split(":")
        if len(parts) < 2 or not all(parts):
            said.append(f"CRASH_AT names {point!r}, which is no crash point (a point is place:moment, e.g. "
                        "tool:<your tool>:after_effect or turn:after_answer; docs/crashpoints.md)")
        elif parts[0] == "tool" and parts[1] not in tools:
            said.append(f"CRASH_AT names {point!r}, but no agent served here has a tool {parts[1]!r} (its tools: "
                        f"{', '.join(tools)}): nothing will be killed there; a tool point names the tool, not its "
                        "effect kind")
    return said


def warn_unreached_points(served: Iterable[Served]) -> None:
    """Print ``unreached_points`` of this process's ``CRASH_AT`` to stderr, one warning a line: a kill test that
    arms a point no code reaches would otherwise pass with nothing killed."""
    from durable_agents.steps.crashpoints import armed

    for line in unreached_points(armed(), served):
        print(f"warning: {line}", file=sys.stderr, flush=True)
