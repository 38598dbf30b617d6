"""The agent loop (``durable_agents.steps.loop``) as a DBOS workflow: each turn a DBOS step, each tool call a DBOS step.

What the run record and Temporal do for the loop, DBOS does here with its own
record, the rows of ``operation_outputs``:

- **One workflow per run** (``agent_loop``), DBOS workflow id = RUN_ID. Its
  inputs, recorded by DBOS with the workflow: the task, the customer's
  address, the start id, the run's retry rule (``durable_agents.steps.retry``), its numbers
  (the turn limit, the window's bounds: ``durable_agents.steps.loop.LoopInputs``) and the
  loop's signature (``loop_signature``).
- **Each turn is a step** named ``turn-<n>`` running ``durable_agents.steps.loop.model_turn``,
  and **each tool call a step** named ``turn-<n>/call-<i>`` running
  ``durable_agents.steps.loop.run_tool``, in the model's order, one after the other. DBOS
  writes a step's output after it returns, so a turn's answer is recorded
  before any of its calls starts; the steps that follow are decided from the
  recorded outputs by ``durable_agents.steps.loop.LoopPlan.after`` (a turn adds its calls,
  then the next turn; a turn without calls ends the run: its text is the
  answer). A call's request is ``durable_agents.steps.loop.tool_request`` of the recorded
  turn: its key comes from the run id, the turn, the call's place and a
  digest of the call's id (``durable_agents.steps.loop.tool_key``).
- **DBOS's recorded outputs are the truth on recovery.** A recovered workflow
  walks the loop again from the top (``LoopWalk``): every step with a row
  returns its recorded output without running, so a recorded turn is never
  asked again and a recorded call never runs again, and the walk reaches the
  first step without a row with the same requests the first dispatch built.
  DBOS checks the recorded name at every position against the walk's: a
  recorded turn can only be followed by the steps it decided.
- **The prompt is derived, never stored.** Each turn's window is memory's
  window (``durable_agents.memory.DerivedWindow``) of the run's messages in order (the system
  instructions, pinned; the task; every recorded turn and tool result:
  ``durable_agents.steps.loop.turn_message``, ``result_message``) under the bounds the run
  recorded. ``LoopWalk`` appends each recorded output's message as the walk
  passes it, so the window of turn n is the one ``LoopPlan.request`` derives
  from the outputs before it (tests/test_loop_dbos.py checks it), without
  deriving the whole conversation again for every turn of a replay. DBOS
  keeps no window: a recovery derives the same windows from the same rows.
- **Retries as for the flow's steps** (``durable_agents.dbosflow.engine.step_options``): the
  run's recorded rule gives DBOS's attempt count and backoff; a
  ``PermanentError`` fails at once; a turn's attempt may take the rule's model
  timeout (the draft's), a call's the provider's (the email's). A turn the
  model step refuses (the turn limit, naming itself; a malformed answer), a
  turn whose model answers the same error word for word on
  ``SAME_ERROR_LIMIT`` attempts in a row (``durable_agents.steps.loop.same_error_limit``,
  ``durable_agents.dbosflow.engine.SameError``: the rule of every engine; counted across
  DBOS's retries within one dispatch, as DBOS records no failed attempt) or a
  step whose retries are spent ends the run in ERROR (``StepFailed``, naming
  the step): terminal, as on the other engines. A step whose dispatches died
  more often than the run's rule allows fails as a flow's step does
  (``durable_agents.dbosflow.engine.WorkerDeaths``).
- **An application version of the loop's own** (``loop_version_of``:
  ``LOOP_VERSION_LABEL`` + ``+`` + a digest of ``loop_signature``, how the
  loop names and orders its steps, derives its keys, and which tools it has
  with their effects and fields; ``DBOSFLOW_LOOP_APP_VERSION`` overrides it).
  An agent of the user's (``durable_agents.steps.served``, ``--agent``) has its own:
  ``agentlab-loop-1-<name>+<its version>`` (``loop_app_version``), so a DBOS
  process serves one agent (``serve_agent``) and recovers that agent's runs.
  A changed loop is another version: DBOS recovers its runs only in a process
  of their version, and ``python -m durable_agents.dbosflow`` shows them parked and refuses
  to resume them (exit 6). The flow's runs keep the flow's version
  (``durable_agents.dbosflow.engine.app_version``): a process launches under one version, so
  ``loop`` and ``resume`` of a loop run recover pending loop runs, ``start``
  and ``resume`` of a flow run pending flow runs. A dispatch whose recorded
  signature differs from this code's (under an overridden version) fails
  before any step.

Crash points (``CRASH_AT``), besides the step functions' ``turn:after_answer``
and ``tool:<name>:after_effect``, each reached only by a step this dispatch
ran (never while it walks recorded outputs):

=========================  ===========================================================
``dbos:loop:between_calls``  a call's output is written and another call of the same
                             turn follows, not started
``dbos:loop:after_turn``     a turn's last call's output is written; the next turn
                             not asked
=========================  ===========================================================
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from dbos import DBOS, SetWorkflowID
from dbos import error as dbos_errors

from durable_agents.dbosflow.engine import (
    _SAY,
    StepFailed,
    _attempt,
    _failure,
    dispatch_of,
    step_options,
)
from durable_agents.memory import DerivedWindow, MemoryInputError, MemoryPolicy
from durable_agents.steps import approval as approvals
from durable_agents.steps import loop
from durable_agents.steps.controls import printable
from durable_agents.steps.crashpoints import crash_point
from durable_agents.steps.errors import PermanentError
from durable_agents.steps.limits import InputError
from durable_agents.steps.loop import (
    loop_changed as loop_changed,  # re-exported: durable_agents.dbosflow.status and the CLI read it here
)
from durable_agents.steps.loop import loop_digest, loop_signature
from durable_agents.steps.retry import MOST_WORKER_DEATHS, RetryRule, StepLedger
from durable_agents.steps.served import REFUND, Served, agent_name

LOOP_WORKFLOW_NAME = "agent_loop"
LOOP_VERSION_LABEL = "agentlab-loop-1"
"""The loop's application version's label: the digest of ``loop_signature`` follows it (``loop_version_of``)."""
LOOP_VERSION_ENV = "DBOSFLOW_LOOP_APP_VERSION"
WAIT_STEP, DECISION_STEP = "wait", "decision"
"""A call that waits for a person has two steps of its own before it: ``<call>/wait`` and ``<call>/decision``."""
TURN_TIMEOUT_OF = "draft"
TOOL_TIMEOUT_OF = "send_confirmation"
"""Whose attempt timeout in the run's rule a turn's and a call's attempts take (as on Temporal,
``durable_agents.workflows.agent_loop``): a turn is a model call, as the draft is; a call is a provider request."""
MOST_LOOP_STEPS = loop.MAX_TURNS_LIMIT * (1 + loop.MAX_CALLS_PER_TURN)
LOOP_RECOVERY_BACKSTOP = MOST_LOOP_STEPS * MOST_WORKER_DEATHS + 1
"""DBOS's own ``max_recovery_attempts`` for loop runs (fixed per process, so not a run's number): above the
most dispatches any recorded rule lets a loop run reach (every step of the longest loop at the highest death
limit, then one death more). The run's own per-step limit always decides first; every dispatch is a launch
someone ran, so nothing recovers forever."""


# ------------------------------------------------------------------ the loop's shape and version


def no_window(inputs: loop.LoopInputs, messages: Any) -> list[loop.Chat]:
    """A ``durable_agents.steps.loop.WindowOf`` for a plan asked only which steps it decides (``LoopPlan.names``), never
    a turn's request."""
    return []


def loop_version_of(signature: tuple[str, ...] | None = None) -> str:
    """The application version of the loop of ``signature`` (this code's by default)."""
    return f"{LOOP_VERSION_LABEL}+{loop_digest(signature)}"


LOOP_APP_VERSION = loop_version_of()
"""This code's loop's application version."""


_SERVING: list[Served] = [REFUND]


def serve_agent(served: Served) -> None:
    """The agent this process runs loop runs of (one: DBOS launches a process under one application version,
    and a loop process's version is its agent's). The refund agent unless told."""
    _SERVING[0] = served


def serving() -> Served:
    return _SERVING[0]


def loop_app_version(env: Mapping[str, str] | None = None, served: Served | None = None) -> str:
    """The version a process that runs loop runs of ``served`` (this process's agent) launches under:
    ``DBOSFLOW_LOOP_APP_VERSION`` if set; else, for the refund agent, ``LOOP_APP_VERSION`` (as always); for
    another agent, ``agentlab-loop-1-<name>+<its version>``. So a DBOS process serves one agent, and recovers
    the runs of that agent's version only: a changed agent is another version, whose runs wait for a process
    of theirs; several agents are several processes."""
    env = os.environ if env is None else env
    served = served or serving()
    given = (env.get(LOOP_VERSION_ENV) or "").strip()
    if given:
        return given
    return LOOP_APP_VERSION if served.name == REFUND.name else f"{LOOP_VERSION_LABEL}-{served.name}+{served.version}"


def new_loop_inputs(run_id: str, task: str, email: str, start_id: str, rule: RetryRule, *, max_turns: int,
                    window_tokens: int, window_messages: int, created_at: float | None = None,
                    served: Served = REFUND, params: Mapping[str, str] | None = None,
                    agent_spec: str = "") -> dict[str, Any]:
    """A new loop run's inputs, as DBOS records them (numbers and parameters checked by the caller:
    ``durable_agents.steps.loop.check_loop_inputs``, the agent's ``check_params``); for an agent of the user's, its
    name, parameters and import string too."""
    raw = {"run_id": run_id, "task": task, "email": email, "start_id": start_id,
           "created_at": time.time() if created_at is None else created_at, "retry_rule": rule.to_dict(),
           "max_turns": max_turns, "window_tokens": window_tokens, "window_messages": window_messages,
           "loop": list(served.signature), "instructions": loop.instructions(served.agent)}
    if served.name != REFUND.name:
        raw.update(agent=served.name, params=dict(params or {}), agent_spec=agent_spec)
    return raw


def loop_inputs(raw: Mapping[str, Any]) -> loop.LoopInputs:
    """The ``durable_agents.steps.loop.LoopInputs`` of a loop run's recorded inputs."""
    inputs = loop.LoopInputs(raw["run_id"], raw["task"], raw["email"], int(raw["max_turns"]),
                             int(raw["window_tokens"]), int(raw["window_messages"]), raw.get("start_id", ""),
                             agent=str(raw.get("agent") or ""), params=raw.get("params") or None)
    return loop.with_instructions(inputs, raw.get("instructions"))  # what the model is told: the run's own


# ------------------------------------------------------------------ the walk


@dataclass(frozen=True)
class LoopStep:
    """A step of the loop as ``durable_agents.dbosflow.engine._attempt`` runs it: its name, function and whether it has
    an external effect (a call of a tool with one, read from the recorded turn, never from the name)."""

    name: str
    run: Callable[[Any, Any], Awaitable[Any]]
    effect: bool = False
    approval: dict[str, Any] | None = None  # a call that waits for a person first (AskedCall.approval)


class LoopWalk:
    """The loop's steps in order, decided from their recorded outputs (``LoopPlan.after``), each step's
    request built from the inputs and the outputs before it, the window appended to as outputs are passed.

    Pure: no clock, no I/O. The workflow asks ``next_step``, ``request``, then ``record``s the step's output
    (DBOS's recorded one, or the one it has just written) and asks again until ``next_step`` is None."""

    def __init__(self, inputs: loop.LoopInputs, served: Served = REFUND) -> None:
        self.inputs = inputs
        self.served = served
        self.results: dict[str, Any] = {}
        self._ahead: list[str] = [loop.LoopPlan.first()]
        self._window = DerivedWindow(MemoryPolicy(max_tokens=inputs.window_tokens,
                                                  max_messages=inputs.window_messages))
        self._broken: str | None = None
        self._turn: Any = None  # the newest recorded turn's output
        self._add(loop.system_message(inputs.prompt), pin=True)
        self._add(loop.task_message(inputs))

    def _add(self, message: tuple[str, loop.Chat], *, pin: bool = False) -> None:
        if self._broken is not None:
            return
        try:
            self._window.add(message[0], message[1], pin=pin)
        except MemoryInputError as err:
            # The same outputs give the same refusal on every dispatch: the next turn fails, naming why.
            self._broken = (f"the window of the next turn cannot be built from the record: {err}. Start the run "
                            "again with larger --window-tokens / --window-messages")

    def next_step(self) -> str | None:
        return self._ahead[0] if self._ahead else None

    def step(self, name: str) -> LoopStep:
        turn, index = loop.parse_step(name)
        agent, services = self.served.agent, self.served.services
        if index is None:
            return LoopStep(name, lambda req, deps: loop.model_turn(req, deps, agent))
        call = loop.as_call(self.results[loop.turn_step(turn)]["calls"][index])
        return LoopStep(name, lambda req, deps: loop.run_tool(req, deps, agent, services),
                        call.name in agent.tools.effects, call.approval)

    def request(self, name: str) -> loop.TurnRequest | loop.ToolRequest:
        """Step ``name``'s request; a turn whose window memory could not take is a ``PermanentError``."""
        turn, index = loop.parse_step(name)
        if index is None:
            if self._broken is not None:
                raise PermanentError(self._broken)
            return loop.TurnRequest(self.inputs.run_id, turn, self._window.prompt(), self.inputs.max_turns,
                                    self.inputs.window_tokens, self.inputs.tools, agent=self.inputs.agent)
        return loop.tool_request(self.inputs, turn, index, loop.as_call(self._turn["calls"][index]))

    def record(self, name: str, result: Any) -> None:
        """Step ``name``'s output: its message joins the window, the steps it decides join the walk."""
        if name != self.next_step():
            raise ValueError(f"the walk is at {self.next_step()!r}, not {name!r}")
        self._ahead.pop(0)
        self.results[name] = result
        turn, index = loop.parse_step(name)
        if index is None:
            self._turn = result
            self._add(loop.turn_message(result))
        else:
            self._add(loop.result_message(self._turn, result))
        self._ahead.extend(loop.LoopPlan.after(name, result))

    def point_after(self, name: str) -> str | None:
        """The engine's crash point once ``name``'s output is written (``record``ed): ``dbos:loop:between_calls``
        when another call of its turn follows, ``dbos:loop:after_turn`` after a turn's last call; None after a
        turn (its first call's own points follow)."""
        if loop.parse_step(name)[1] is None:
            return None
        following = self.next_step()
        if following is not None and loop.parse_step(following)[1] is not None:
            return "dbos:loop:between_calls"
        return "dbos:loop:after_turn"

    @property
    def answer(self) -> str | None:
        return loop.LoopPlan.final_answer(self.results)


def outcome(name: str, result: Any) -> str:
    """A few words on what a step recorded, for its line: what a turn asks for, or a call's status."""
    if loop.parse_step(name)[1] is None:
        calls = [loop.as_call(c).name[:64] for c in result.get("calls") or ()]
        return f"asks for {', '.join(calls)}" if calls else "the final answer"
    return f"{str(result.get('name', ''))[:64]} {result.get('status')}"


# ------------------------------------------------------------------ the workflow


@DBOS.workflow(name=LOOP_WORKFLOW_NAME, max_recovery_attempts=LOOP_RECOVERY_BACKSTOP)
async def agent_loop(raw: dict[str, Any]) -> dict[str, Any]:
    """Walk the loop to its end; returns ``{"answer", "turns", "steps"}``. See the module docstring."""
    run_id = raw["run_id"]
    served = serving()
    if agent_name(raw.get("agent")) != served.name:
        # Not reached under DBOS's versions (a loop process's version is its agent's), but never another's tools.
        raise StepFailed(f"run {run_id} names agent {agent_name(raw.get('agent'))!r}; this process runs "
                         f"{served.shown()}: resume it with --agent naming its agent")
    changed = loop_changed(raw.get("loop"), served.agent.tools, "" if served.name == REFUND.name else served.name)
    if changed is not None:
        # Before any step: walking another loop's steps against this run's rows would mis-resume it.
        raise StepFailed(f"run {run_id} was not resumed: {changed}. Resume it with the code that started it")
    inputs = loop_inputs(raw)
    rule = RetryRule.from_dict(raw.get("retry_rule"))
    dispatch = await asyncio.to_thread(dispatch_of, run_id)
    walk = LoopWalk(inputs, served)
    previous_dispatch = 1
    stopped: dict[int, str] = {}  # by turn: its call a person did not approve (decided again on every walk)
    while (name := walk.next_step()) is not None:
        step = walk.step(name)
        ran = {"attempts": 0}
        try:
            request = walk.request(name)
        except PermanentError as err:
            raise StepFailed(f"step {name} failed before its first attempt: {err.message}") from None
        turn = loop.parse_step(name)[0]
        refusal = approvals.not_run_after(stopped[turn]) if turn in stopped and "/" in name else None
        if refusal is None and step.approval is not None and isinstance(request, loop.ToolRequest):
            # A person decides first (docs/approvals.md).
            decided_as, refusal, previous_dispatch = await _decided(name, request, step.approval, served, run_id,
                                                                    dispatch, previous_dispatch)
            if decided_as == "expired" and step.approval.get("on_expiry") == "fail":
                raise StepFailed(f"step {name} ({request.call.name}) failed: {refusal} ({approvals.EXPIRY_FAILS})")
            if refusal is not None:
                stopped[turn] = name  # none after it in its turn runs (the model asked for them together)
        if refusal is not None:  # denied, expired, or after one: the call's output is its refusal, nothing applied
            step = LoopStep(name, _refusing(refusal), step.effect)
        try:
            options = step_options(name, rule, timeout_of=TOOL_TIMEOUT_OF if "/" in name else TURN_TIMEOUT_OF)
            limit = loop.same_error_limit(name)  # a turn's: the same rule as on the other engines
            repeats = StepLedger(name, rule, same_error_limit=limit) if limit is not None else None
            recorded = await DBOS.run_step_async(options, _attempt, step, request, run_id, rule, dispatch,
                                                 previous_dispatch, ran, repeats)
        except (PermanentError, InputError, dbos_errors.DBOSMaxStepRetriesExceeded) as err:
            # The step's own failure, recorded by DBOS in the step's row. DBOS's errors about the workflow
            # itself (a recorded step name that differs, a cancellation) pass.
            raise StepFailed(_failure(name, err, ran["attempts"] + dispatch - previous_dispatch)) from None
        result = recorded["result"]
        walk.record(name, result)
        previous_dispatch = recorded["dispatch"]
        if ran["attempts"]:  # executed in this dispatch, not read back from DBOS's record
            _SAY[0](printable(f"  {time.strftime('%H:%M:%S')} {name}: completed (attempt {recorded['attempt']}): "
                              f"{outcome(name, result)}"))
            point = walk.point_after(name)
            if point is not None:
                crash_point(point)
    turns = sum(1 for n in walk.results if "/" not in n)
    return {"answer": walk.answer, "turns": turns, "steps": len(walk.results)}


def _refusing(reason: str) -> Callable[[Any, Any], Awaitable[Any]]:
    async def refuse(request: Any, _deps: Any) -> Any:
        return loop.refused_call(request, reason)

    return refuse


async def _decided(name: str, request: loop.ToolRequest, approval: dict[str, Any], served: Served, run_id: str,
                   dispatch: int, previous_dispatch: int) -> tuple[str, str | None, int]:
    """A call that waits for a person: (its outcome, the refusal the model is given unless approved, the dispatch
    that recorded the decision). Its wait is a step (``<call>/wait``: recorded once, its deadline kept across
    dispatches); a decision is a DBOS message on the call's topic (``approve``/``deny`` send it, kept in the
    system database with no process running), taken with ``DBOS.recv`` (a durable sleep until the deadline)
    and judged (``durable_agents.steps.approval.judge``: one of another digest is passed over); the outcome
    is a step (``<call>/decision``), recorded before the call runs. A kill during the wait is not a death of
    the call: its attempts count from the decision's dispatch."""
    checked = loop.checked_arguments(request.call, served.agent.tools)

    async def record_wait() -> dict[str, Any]:
        wait = approvals.new_wait(run_id, name, request.call.name, checked if isinstance(checked, dict) else {},
                                  request.idempotency_key, approval, time.time())
        return {"result": wait.to_json(), "dispatch": dispatch, "attempt": 1}

    recorded = await DBOS.run_step_async({"name": f"{name}/{WAIT_STEP}"}, record_wait)
    wait = approvals.Wait.from_json(recorded["result"])
    if recorded["dispatch"] == dispatch:
        _SAY[0](printable(f"  {time.strftime('%H:%M:%S')} {name}: waits for a person's decision on {wait.tool} "
                          f"until {time.strftime('%H:%M:%S', time.localtime(wait.until))} (key {wait.key}): "
                          f"python -m durable_agents.dbosflow approve {run_id} {name} --by NAME (or deny)"))
        crash_point("approval:waiting")
    taken: approvals.Decision | None = None
    while taken is None:
        message = await DBOS.recv_async(topic=name, timeout_seconds=max(wait.until - time.time(), 0.0))
        if message is None:  # the deadline, with no decision
            break
        try:
            sent = approvals.Decision.from_json(message)
        except (KeyError, TypeError, ValueError):
            continue
        if approvals.judge(wait, None, sent)[0] == approvals.TAKEN:
            taken = sent

    async def record_decision() -> dict[str, Any]:
        decision = None if taken is None else dataclasses.replace(taken, at=time.time()).to_json()
        outcome = "expired" if taken is None else ("approved" if taken.verdict == "approve" else "denied")
        return {"result": {"outcome": outcome, "decision": decision}, "dispatch": dispatch, "attempt": 1}

    decided = await DBOS.run_step_async({"name": f"{name}/{DECISION_STEP}"}, record_decision)
    outcome = decided["result"]["outcome"]
    decision = (approvals.Decision.from_json(decided["result"]["decision"]) if decided["result"]["decision"]
                else None)
    if decided["dispatch"] == dispatch:
        _SAY[0](printable(f"  {time.strftime('%H:%M:%S')} {name}: "
                          f"{decision.said() if decision else 'no decision by the deadline'}"))
        crash_point("approval:decided")
    if outcome == "approved":
        return outcome, None, decided["dispatch"]
    if outcome == "denied" and decision is not None:
        return outcome, approvals.denied_result(decision), decided["dispatch"]
    return "expired", approvals.expired_result(wait), decided["dispatch"]


async def start_loop_run(run_id: str, raw: dict[str, Any]) -> Any:
    """Start the loop workflow under ``run_id`` (DBOS's workflow id); a handle."""
    with SetWorkflowID(run_id):
        return await DBOS.start_workflow_async(agent_loop, raw)


__all__ = [
    "LOOP_APP_VERSION",
    "LOOP_RECOVERY_BACKSTOP",
    "LOOP_VERSION_ENV",
    "LOOP_VERSION_LABEL",
    "LOOP_WORKFLOW_NAME",
    "LoopStep",
    "LoopWalk",
    "agent_loop",
    "loop_app_version",
    "loop_changed",
    "loop_inputs",
    "loop_signature",
    "loop_version_of",
    "new_loop_inputs",
    "serve_agent",
    "serving",
    "no_window",
    "start_loop_run",
]
