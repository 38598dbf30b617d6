"""What comes next in a run, for the runner: the plan of a run, chosen from its row.

The runner (``durable_agents.runrecord.runner``) has one driving loop and one attempt, ledger,
lease and intent machinery for every run. What differs between a run of the
fixed flow and a run of the agent loop is only what its plan says:

- **the steps**: which a run has when it is created (``initial``) and which a
  recorded result adds (``after``). The fixed flow knows all its steps at
  start and adds none; the loop starts with ``turn-1`` and each recorded turn
  adds its calls and the next turn (``durable_agents.steps.loop.LoopPlan.after``), inserted
  as step rows in the very commit that records the turn;
- **each step**: its function, the kind of its effect (so the runner records
  an intent, key and request, before its request can be sent) and its
  request, built from the run's inputs (its row) and the recorded results,
  never from anything held in memory;
- **the names the record must hold** (``expected``): the flow's, or
  ``LoopPlan.names(recorded results)``; a resume that finds others is refused
  (``durable_agents.runrecord.runner.FlowChanged``), never resumed at the wrong step;
- **the crash points** the runner reaches around a step (``point_before``,
  ``point_after``);
- **what follows completion** (``finished``): a flow run's exchange goes to
  conversation memory; a loop run's window is derived from the record, so
  nothing.

A loop run is recognised from its row (``runs.loop``, its numbers: turn limit
and window bounds); every other run is a run of the fixed flow the runner is
given. The window a loop turn's prompt carries is derived from the record on
every request (``durable_agents.memory.derive_window`` under the run's recorded bounds): the
record keeps every turn, the window is never stored and never read to decide
anything, and a resumed process derives the same window again.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from durable_agents.memory import MemoryInputError, MemoryPolicy, derive_window
from durable_agents.runrecord.store import RunRow
from durable_agents.steps import flow as flow_steps
from durable_agents.steps import loop
from durable_agents.steps.errors import PermanentError
from durable_agents.steps.limits import InputError
from durable_agents.steps.plan import FlowStep
from durable_agents.steps.requests import RunInputs, remember_request
from durable_agents.steps.served import REFUND, Served, find

StepFunction = Callable[[Any, Any], Awaitable[Any]]


@dataclass(frozen=True)
class PlannedStep:
    """One step as the runner drives it: its ``name`` (recorded at its position), its function, and the
    provider's ``kind`` of its effect (None: no effect, so no intent); ``approval``: a loop call that waits for
    a person's decision before its first attempt (what its turn recorded: ``AskedCall.approval``), or None."""

    name: str
    run: StepFunction
    kind: str | None = None
    approval: dict[str, Any] | None = None

    @property
    def effect(self) -> bool:
        return self.kind is not None


class RunPlan(Protocol):
    """What the runner asks a run's plan (the module docstring)."""

    words: str
    """How a refusal says what the record holds and what the code expects (``{recorded}``, ``{code}``)."""

    def initial(self) -> list[str]: ...

    def expected(self, results: Mapping[str, Any]) -> list[str]: ...

    def step(self, name: str, results: Mapping[str, Any]) -> PlannedStep: ...

    def request(self, name: str, results: Mapping[str, Any]) -> Any: ...

    def after(self, name: str, result: Any) -> list[str]: ...

    def point_before(self, step: PlannedStep) -> str | None: ...

    def point_after(self, name: str, following: str | None) -> str | None: ...

    def outcome(self, name: str, result: Any) -> str: ...

    async def finished(self, run: RunRow, deps: Any) -> None: ...


# ---------------------------------------------------------------- the fixed flow


class AgentNotServed(InputError):
    """A loop run names an agent this process was not given: nothing is run; the message says how to give it."""


def flow_inputs(run: RunRow) -> RunInputs:
    """A flow run's inputs, as its row holds them."""
    return RunInputs(run.run_id, run.task, run.email, run.conversation_id,
                     start_id=run.start_id or "", created_at=run.created_at if run.start_id else None,
                     params=run.params or {})


FLOW_WORDS = "was started with steps {recorded}, but this code's flow is {code}"
LOOP_WORDS = ("records the steps {recorded}, but this code's agent loop (durable_agents.steps.loop.LoopPlan) "
              "decides {code} "
              "from the recorded results")


class FlowPlan:
    """The fixed flow (``durable_agents.steps.plan.FLOW``, or the one given): every step known at start, none added."""

    words = FLOW_WORDS

    def __init__(self, flow: Sequence[FlowStep], inputs: RunInputs) -> None:
        self.flow = tuple(flow)
        self.inputs = inputs
        self._steps = {s.name: s for s in self.flow}

    def initial(self) -> list[str]:
        return [s.name for s in self.flow]

    def expected(self, results: Mapping[str, Any]) -> list[str]:
        return self.initial()

    def step(self, name: str, results: Mapping[str, Any]) -> PlannedStep:
        s = self._steps[name]
        return PlannedStep(s.name, s.run, s.kind)

    def request(self, name: str, results: Mapping[str, Any]) -> Any:
        return self._steps[name].request(self.inputs, results)

    def after(self, name: str, result: Any) -> list[str]:
        return []

    def point_before(self, step: PlannedStep) -> str | None:
        return f"runrecord:{step.name}:{'after_intent' if step.effect else 'after_start'}"

    def point_after(self, name: str, following: str | None) -> str | None:
        return f"runrecord:{name}:after_record"

    def outcome(self, name: str, result: Any) -> str:
        return ""

    async def finished(self, run: RunRow, deps: Any) -> None:
        """The exchange goes to conversation memory (as on Temporal). Best effort and idempotent by message
        id; memory is never read to decide what has been done, so nothing here touches the record."""
        await flow_steps.remember_exchange(remember_request(self.inputs, run.results()), deps)


# ---------------------------------------------------------------- the agent loop


LOOP_NUMBERS = ("max_turns", "window_tokens", "window_messages")
"""What ``runs.loop`` holds: the ``durable_agents.steps.loop.LoopInputs`` numbers a loop run was started with."""


def loop_inputs(run: RunRow) -> loop.LoopInputs:
    """A loop run's inputs, as its row holds them (``runs.loop``: its numbers; the start id)."""
    numbers = run.loop or {}
    inputs = loop.LoopInputs(run.run_id, run.task, run.email, start_id=run.start_id or "",
                             max_turns=int(numbers.get("max_turns", loop.DEFAULT_MAX_TURNS)),
                             window_tokens=int(numbers.get("window_tokens", loop.DEFAULT_WINDOW_TOKENS)),
                             window_messages=int(numbers.get("window_messages", loop.DEFAULT_WINDOW_MESSAGES)),
                             agent=str(numbers.get("agent") or ""), params=numbers.get("params") or None)
    return loop.with_instructions(inputs, numbers.get("instructions"))


def derived_window(inputs: loop.LoopInputs, messages: Sequence[tuple[str, loop.Chat]]) -> list[loop.Chat]:
    """The prompt: memory's window of the run's messages (the system instructions pinned) under the run's
    recorded bounds. Messages memory cannot take (one that cannot fit at all) fail the turn, naming why:
    the same record would give the same refusal on every attempt."""
    policy = MemoryPolicy(max_tokens=inputs.window_tokens, max_messages=inputs.window_messages)
    try:
        return derive_window(policy, messages)
    except MemoryInputError as err:
        raise PermanentError(f"the window of the next turn cannot be built from the record: {err}. Start the "
                             "run again with larger --window-tokens / --window-messages") from None


class LoopRunPlan:
    """The agent loop (``durable_agents.steps.loop.LoopPlan``): the plan grows as turns are recorded.

    A turn is a step without an effect (the model is asked; nothing applied); a call's effect is its tool's
    in the run's agent (``served``; the refund agent's: refund, email, ticket; ``lookup_order`` and a tool the
    model made up have none), read from the recorded turn, never from the step's name."""

    words = LOOP_WORDS

    def __init__(self, inputs: loop.LoopInputs, served: Served = REFUND) -> None:
        self.inputs = inputs
        self.served = served
        self.plan = loop.LoopPlan(inputs, derived_window)

    def initial(self) -> list[str]:
        return [self.plan.first()]

    def expected(self, results: Mapping[str, Any]) -> list[str]:
        return self.plan.names(results)

    def step(self, name: str, results: Mapping[str, Any]) -> PlannedStep:
        turn, index = loop.parse_step(name)
        agent, services = self.served.agent, self.served.services
        if index is None:
            return PlannedStep(name, lambda req, deps: loop.model_turn(req, deps, agent))
        call = loop.as_call(results[loop.turn_step(turn)]["calls"][index])
        return PlannedStep(name, lambda req, deps: loop.run_tool(req, deps, agent, services),
                           agent.tools.effects.get(call.name), call.approval)

    def request(self, name: str, results: Mapping[str, Any]) -> Any:
        return self.plan.request(name, results)

    def after(self, name: str, result: Any) -> list[str]:
        return self.plan.after(name, result)

    def point_before(self, step: PlannedStep) -> str | None:
        return None

    def point_after(self, name: str, following: str | None) -> str | None:
        """``runrecord:loop:between_calls`` after a call another call of its turn follows;
        ``runrecord:loop:after_turn`` after a turn's last call (the next turn not asked). None after a turn:
        its calls were recorded with it, and the first call's own points follow."""
        turn, index = loop.parse_step(name)
        if index is None:
            return None
        if following is not None and loop.parse_step(following)[1] is not None:
            return "runrecord:loop:between_calls"
        return "runrecord:loop:after_turn"

    def outcome(self, name: str, result: Any) -> str:
        """A few words on what the step recorded, for the runner's line: what a turn asks for (or that it
        is the final answer); a call's status."""
        if loop.parse_step(name)[1] is None:
            calls = [loop.as_call(c).name[:64] for c in result.get("calls") or ()]
            return f"asks for {', '.join(calls)}" if calls else "the final answer"
        return f"{result.get('name', '')[:64]} {result.get('status')}"

    async def finished(self, run: RunRow, deps: Any) -> None:
        """Nothing: the loop's conversation is the record, its window derived from it."""


def plan_for(run: RunRow, flow: Sequence[FlowStep], served: Mapping[str, Served] | None = None) -> RunPlan:
    """The plan of ``run``: the agent loop's if its row says so (``runs.loop``), run by the agent it names
    among ``served`` (by name; None: the refund agent alone; ``AgentNotServed`` when it is not among them),
    else the fixed ``flow``."""
    if run.loop is not None:
        inputs = loop_inputs(run)
        try:
            agent = find(served if served is not None else {REFUND.name: REFUND}, inputs.agent, "this process")
        except InputError as err:
            raise AgentNotServed(f"run {run.run_id}: {err}") from None
        return LoopRunPlan(inputs, agent)
    return FlowPlan(flow, flow_inputs(run))


__all__ = [
    "FLOW_WORDS",
    "LOOP_NUMBERS",
    "LOOP_WORDS",
    "FlowPlan",
    "AgentNotServed",
    "LoopRunPlan",
    "PlannedStep",
    "RunPlan",
    "derived_window",
    "flow_inputs",
    "loop_inputs",
    "plan_for",
]
