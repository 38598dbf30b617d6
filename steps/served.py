"""The agents a process serves, each with what its tools reach the world through; and, per task queue, the
agents a Temporal worker serves (which its workflow code reads).

A run names its agent (``steps.loop.LoopInputs.agent``; "" for a run recorded before agents had names: the
lab's refund agent). Every engine looks the name up among the agents it serves and runs that run with that
agent's tools only. No agent of that name: the run is refused, visibly, and not run by another agent; an
agent of that name whose version is not the run's (``steps.loop.loop_changed``): refused likewise, naming
both versions.

On Temporal the workflow code reads ``served_on(task queue, name)``: this module is imported through the
sandbox (``workflows.agent_loop``), so its table is the worker process's. A queue nothing was registered on
serves the lab's refund agent alone (a worker built directly with the lab's ``LoopActivities``, and the
replay tests).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from durable_agents.agent import Agent
from steps.limits import InputError
from steps.loop import MAX_INSTRUCTIONS_CHARS, instructions, loop_digest, loop_signature
from steps.refund_agent import REFUND_AGENT

__all__ = ["REFUND", "Served", "agent_name", "close_services", "find", "serve", "serve_on", "served_names", "served_on"]


def agent_name(recorded: str | None) -> str:
    """The agent a run names: its recorded name; "" (recorded before agents had names) is the refund agent."""
    return recorded or REFUND_AGENT.name


@dataclass(frozen=True)
class Served:
    """An agent as one process serves it: with ``services``, what its tools' handlers are given
    (``ToolContext.services``), built once in the process. ``signature`` and ``version`` are the agent's
    (``steps.loop.loop_signature`` of its tools; its digest)."""

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
process's ``steps.flow.StepDeps``)."""


def serve(agents: Iterable[Agent], default_services: Any = None) -> list[Served]:
    """``agents`` as this process serves them: each with its own services built (``Agent.services()``), or
    ``default_services`` (the worker's ``StepDeps``) when it declares none. ``ValueError`` for two agents of
    one name."""
    out: dict[str, Served] = {}
    for agent in agents:
        if agent.name in out:
            if out[agent.name].agent is agent:
                continue
            raise ValueError(f"two agents are named {agent.name!r}: a run names the agent it is run by")
        services = agent.services() if agent.services is not None else default_services
        out[agent.name] = Served(agent, services)
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
