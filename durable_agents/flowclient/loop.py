"""Runs of the agent loop (``durable_agents.workflows.agent_loop``) from the client side: starting one, and reading it
back across its chain of runs.

- ``start_loop``: one run per RUN_ID, ever (every tool call's key derives from
  it), decided atomically by the server as ``durable_agents.flowclient.runs.start_run`` does
  (REJECT_DUPLICATE for a closed run, FAIL for an open one; either refusal
  means "attach": it returns the existing run's status). The retry rule and
  the loop's bounds (turn limit, window, history bound) go into the input, so
  a run's numbers are in its history. The workflow task timeout is the flow's
  (2 s); the execution timeout, which spans every run of the chain, is every
  possible step's budget (the turn limit times a turn and its most calls)
  plus the parking window.
- ``read_chain``: every run of the chain, newest first found and walked back
  through each run's ``continued_execution_run_id`` (each run's history, as
  long as the namespace's retention keeps it), in order: each run's input,
  its recorded turns and tool results, the prompt each turn was asked with.
  ``LoopChain.window(upto)`` derives the prompt window from *every* recorded
  turn of the chain (``durable_agents.steps.loop``'s messages, ``durable_agents.workflows.loop_state.derived_window``):
  what a run carried across continue-as-new must equal it. ``chain_turns``:
  the chain's recorded turns alone. A run id of another workflow is
  refused (``NotALoopRun``).
- ``loop_status``: the chain's status from the histories (needs no worker):
  every turn of the chain with its calls, their keys and status, in
  ``durable_agents.steps.runstate``'s words; **parked** (with ``detail``: what parked it,
  what to do) when the newest run's workflow task keeps failing, whatever
  the cause (a payload over Temporal's limit, non-determinism after a
  deploy, a bug), as ``durable_agents.flowclient.status`` reports a flow run. ``loop_progress`` asks the running
  workflow (the ``progress`` query: needs a worker; the newest turns only).
- For ``starter.py`` (``loop``, and ``status``/``watch`` of a loop run):
  ``is_loop_run`` (the workflow type, from one describe), ``wait_for_loop``
  (polls ``loop_status`` until the run completes or fails), ``loop_lines``
  (the status turn by turn, as text) and ``loop_ticker`` (a line each time a
  turn or a call changes).

Payloads are decoded with each run's serialization context (``durable_agents.flowclient.status.run_converter``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from temporalio.api.enums.v1 import EventType, PendingActivityState
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHistory
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from durable_agents.agent import Agent
from durable_agents.flowclient.connect import task_queue as default_task_queue
from durable_agents.flowclient.runs import LIVE_TIMEOUT, parking_window, retry_refusal, workflow_task_timeout
from durable_agents.flowclient.status import (
    ActivityTrace,
    TemporalRunNotFound,
    activity_traces,
    failure_text,
    parked_detail,
    read_history,
    run_converter,
)
from durable_agents.steps.approval import (
    Decision,
    Wait,
    denied_result,
    expired_result,
    not_run_after,
    overdue,
    status_lines,
)
from durable_agents.steps.controls import printable
from durable_agents.steps.limits import InputError, check_email, check_run_id, check_task
from durable_agents.steps.loop import (
    DEFAULT_MAX_TURNS,
    DEFAULT_WINDOW_MESSAGES,
    DEFAULT_WINDOW_TOKENS,
    LOOP_SYSTEM_PROMPT,
    MAX_CALLS_PER_TURN,
    Chat,
    LoopInputs,
    call_step,
    check_loop_inputs,
    parse_step,
    reached_turn_limit,
    recorded_effects,
    refused_result,
    result_message,
    system_message,
    task_message,
    tool_key,
    turn_message,
    turn_step,
)
from durable_agents.steps.models import to_jsonable
from durable_agents.steps.refund_agent import REFUND_AGENT
from durable_agents.steps.retry import RetryRule, rule_from_env, run_timeout_floor
from durable_agents.steps.runstate import RunStateName, StepStateName, iso
from durable_agents.steps.served import Served, agent_name
from durable_agents.workflows.agent_loop import (
    APPROVAL_SIGNAL,
    APPROVALS_MEMO,
    LOOP_WORKFLOW_NAME,
    MODEL_TURN,
    TOOL_CALL,
)
from durable_agents.workflows.loop_state import (
    DEFAULT_HISTORY_BOUND,
    MAX_HISTORY_BOUND,
    MIN_HISTORY_BOUND,
    LoopInput,
    LoopInstructions,
    derived_window,
    shown,
    start_tokens_of,
)

MAX_CHAIN_RUNS = 10_000
"""The most runs ``read_chain`` walks back through: a chain longer than this is refused, never looped over."""


def loop_execution_timeout(rule: RetryRule, max_turns: int, longest_wait: timedelta = timedelta(0)) -> timedelta:
    """Every step a run may have (the turn limit, each turn with its most calls) spending its whole budget,
    plus the parking window (``durable_agents.flowclient.runs.parking_window``), plus, for an agent whose tools may
    wait for a person, every call of every turn waiting the longest deadline its tools declare
    (``longest_wait``): the execution timeout, which spans the chain, so no wait a declaration allows is cut
    short by it."""
    waits = longest_wait * (max_turns * MAX_CALLS_PER_TURN)
    return timedelta(seconds=run_timeout_floor(rule, max_turns * (1 + MAX_CALLS_PER_TURN))) + parking_window() + waits


def longest_wait(agent: Agent) -> timedelta:
    """The longest a call of ``agent``'s tools may wait for a person (``durable_agents.Approval.within``)."""
    return max((t.approval.within for t in agent.tools if t.approval is not None), default=timedelta(0))


async def start_loop(
    client: Client, run_id: str, task: str, email: str = "", *, task_queue: str | None = None,
    max_turns: int | None = None, window_tokens: int | None = None,
    window_messages: int | None = None, history_bound: int = DEFAULT_HISTORY_BOUND,
    rule: RetryRule | None = None, task_timeout: timedelta | None = None,
    agent: Agent = REFUND_AGENT, params: Mapping[str, str] | None = None, agent_spec: str = "",
) -> tuple[bool, dict[str, Any] | None]:
    """Start the loop run, or attach to the existing one. Returns (created, existing status).

    ``agent``: the agent the run is run by (a worker must serve it: ``durable_agents.steps.served``), recorded by name
    with its version (``LoopInput.loop``), its instructions and its tools' specs; ``params`` the run's
    parameters it declares (the refund agent's one, its customer's address, is ``email``); ``agent_spec`` the
    import string it was loaded by, recorded for the commands that load it again (``starter.py settle``). The turn limit
    and the window's bounds are the agent's unless given. The input is checked here with the workflow's own
    rules (``InputError`` saying what to give), so a bad one is refused before a run exists; the workflow
    checks again. The retry rule comes from the environment unless given
    (``durable_agents.steps.retry.rule_from_env``)."""
    check_run_id(run_id)
    task = check_task(task)
    served = Served(agent)
    lab = agent.name == REFUND_AGENT.name
    if lab:
        email = check_email(email or dict(params or {}).get("email", ""))
        checked_params = None
    else:
        email, checked_params = "", served.check_params(params)
    max_turns, window_tokens, window_messages = check_loop_inputs(
        agent.max_turns if max_turns is None else max_turns,
        agent.window_tokens if window_tokens is None else window_tokens,
        agent.window_messages if window_messages is None else window_messages,
        start_tokens_of(task, None if lab else agent.instructions))
    if isinstance(history_bound, bool) or not isinstance(history_bound, int) or \
            not MIN_HISTORY_BOUND <= history_bound <= MAX_HISTORY_BOUND:
        raise InputError(f"history bound must be a whole number of events from {MIN_HISTORY_BOUND} to "
                         f"{MAX_HISTORY_BOUND}, got {history_bound!r}")
    rule = rule or rule_from_env()
    try:
        await client.start_workflow(
            LOOP_WORKFLOW_NAME,
            LoopInput(run_id=run_id, task=task, email=email, max_turns=max_turns, window_tokens=window_tokens,
                      window_messages=window_messages, retry=rule.to_dict(), history_bound=history_bound,
                      loop=list(served.signature),
                      instructions=LoopInstructions(agent.instructions, agent.tools.specs()),
                      agent="" if lab else agent.name, params=checked_params,
                      agent_spec="" if lab else agent_spec),
            id=run_id,
            task_queue=task_queue or default_task_queue(),
            task_timeout=task_timeout or workflow_task_timeout(),
            execution_timeout=loop_execution_timeout(rule, max_turns, longest_wait(agent)),
            # One run per RUN_ID, ever: the keys derive from it.
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
            id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
        )
    except WorkflowAlreadyStartedError:
        return False, await loop_status(client, run_id)
    return True, None


async def loop_progress(client: Client, run_id: str) -> dict[str, Any]:
    """The running workflow's own answer (its ``progress`` query; a worker must be running)."""
    return await client.get_workflow_handle(run_id).query("progress", rpc_timeout=LIVE_TIMEOUT)


# ---------------------------------------------------------------- the chain, from its histories


def step_of(trace: ActivityTrace) -> str:
    """The loop step an attempt belongs to: its activity id without the attempt (``turn-3/call-1/2``)."""
    return trace.activity_id.rpartition("/")[0] or trace.activity_id


class NotALoopRun(ValueError):
    """The run id names a workflow that is not the agent loop (an ``AgentFlow`` run, say)."""


@dataclass
class ChainRun:
    """One run of a chain, as its history recorded it. ``turns``/``results``: the recorded ``TurnResult`` and
    ``ToolResult`` dicts, by turn and by (turn, call index); ``prompts``: the window each turn was asked
    with; ``attempts``: every attempt of each step, in order."""

    temporal_run_id: str
    status: WorkflowExecutionStatus | None
    input: dict[str, Any]
    history_length: int
    turns: dict[int, dict[str, Any]] = field(default_factory=dict)
    results: dict[tuple[int, int], dict[str, Any]] = field(default_factory=dict)
    prompts: dict[int, list[Chat]] = field(default_factory=dict)
    attempts: dict[str, list[ActivityTrace]] = field(default_factory=dict)
    output: Any = None  # the completed run's result (a LoopProgress dict)
    error: str | None = None  # why the run closed without completing (not for continue-as-new)
    timer_pending: bool = False  # a backoff timer is running: the current step is retrying
    pending: dict[str, Any] = field(default_factory=dict)  # describe's pending activities, by step
    # the newest run, open: why its workflow task keeps failing (durable_agents.flowclient.status)
    parked: str | None = None
    # its waits for a person as its memo last showed them (AgentLoop._upsert), and the decisions sent to it by
    # signal (kept while no worker accepted the update), in order
    approvals: list[dict[str, Any]] = field(default_factory=list)
    kept: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class LoopChain:
    """Every run of one loop run id, oldest first (see the module docstring)."""

    run_id: str
    runs: list[ChainRun]

    @property
    def first_input(self) -> dict[str, Any]:
        return self.runs[0].input

    @property
    def latest(self) -> ChainRun:
        return self.runs[-1]

    def turns(self) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
        """Every recorded turn of the chain in order, each with its recorded tool results in call order
        (only those recorded: the newest turn's may be fewer than its calls)."""
        merged: dict[int, dict[str, Any]] = {}
        results: dict[tuple[int, int], dict[str, Any]] = {}
        for run in self.runs:
            merged.update(run.turns)
            results.update(run.results)
        out = []
        for number in sorted(merged):
            turn = merged[number]
            recorded = []
            for index in range(len(turn.get("calls") or ())):
                if (number, index) not in results:
                    break
                recorded.append(results[(number, index)])
            out.append((turn, recorded))
        return out

    def messages(self, upto_turn: int | None = None) -> list[tuple[str, Chat]]:
        """The run's messages in order (``durable_agents.steps.loop``): the system instructions, the task, then every
        recorded turn before ``upto_turn`` (None: all) and its tool results."""
        first = self.first_input
        prompt = (first.get("instructions") or {}).get("prompt") or LOOP_SYSTEM_PROMPT  # the run's, if recorded
        inputs = LoopInputs(self.run_id, first.get("task", ""), first.get("email", ""))
        out = [system_message(prompt), task_message(inputs)]
        for turn, results in self.turns():
            if upto_turn is not None and turn["turn"] >= upto_turn:
                break
            out.append(turn_message(turn))
            out.extend(result_message(turn, result) for result in results)
        return out

    def window(self, upto_turn: int | None = None) -> list[Chat]:
        """The prompt window derived from every recorded turn of the chain before ``upto_turn``, under the
        bounds the run recorded: the prompt turn ``upto_turn`` is (or was) asked with."""
        first = self.first_input
        return derived_window(first.get("window_tokens", DEFAULT_WINDOW_TOKENS),
                              first.get("window_messages", DEFAULT_WINDOW_MESSAGES), self.messages(upto_turn))

    def carried(self) -> list[tuple[int, list[Chat]]]:
        """(next turn, the window's messages as chat dicts) that each run after the first was given."""
        out = []
        for run in self.runs:
            carried = run.input.get("carried")
            if isinstance(carried, Mapping):
                out.append((carried["next_turn"], [m["chat"] for m in carried["messages"]]))
        return out


_CLOSED_WITHOUT_RESULT = {
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED, EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TIMED_OUT,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED, EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCELED,
}


async def _read_run(client: Client, run_id: str, history: WorkflowHistory,
                    status: WorkflowExecutionStatus | None, pending: Any = ()) -> tuple[ChainRun, str]:
    """One run from its history; and the Temporal run id of the run it continued (empty for the first)."""
    converter = run_converter(client, run_id)
    started = history.events[0].workflow_execution_started_event_attributes
    if started.workflow_type.name != LOOP_WORKFLOW_NAME:
        raise NotALoopRun(f"run {run_id!r} is a run of {started.workflow_type.name}, not of the agent loop: "
                          f"`python starter.py status {run_id}` reads it")
    values = await converter.decode(started.input.payloads) if started.input.payloads else [{}]
    run = ChainRun(temporal_run_id="", status=status, input=values[0] if values else {},
                   history_length=len(history.events))
    for ev in history.events:
        et = ev.event_type
        if et == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            a = ev.activity_task_scheduled_event_attributes
            if a.activity_type.name == MODEL_TURN:
                number = int(a.activity_id.partition("/")[0].removeprefix("turn-"))
                if number not in run.prompts and a.input.payloads:  # every attempt asks with the same prompt
                    request = (await converter.decode(a.input.payloads))[0]
                    run.prompts[number] = request.get("window", [])
        elif et == EventType.EVENT_TYPE_WORKFLOW_PROPERTIES_MODIFIED:
            memo = ev.workflow_properties_modified_event_attributes.upserted_memo.fields
            if APPROVALS_MEMO in memo:
                found = (await converter.decode([memo[APPROVALS_MEMO]]))[0]
                run.approvals = [dict(e) for e in found or () if isinstance(e, Mapping)]
        elif et == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
            signaled = ev.workflow_execution_signaled_event_attributes
            if signaled.signal_name == APPROVAL_SIGNAL and signaled.input.payloads:
                sent = (await converter.decode(signaled.input.payloads))[0]
                if isinstance(sent, Mapping):
                    run.kept.append(dict(sent))
        elif et == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED:
            values = await converter.decode(ev.workflow_execution_completed_event_attributes.result.payloads)
            run.output = values[0] if values else None
        elif et in _CLOSED_WITHOUT_RESULT:
            if et == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED:
                run.error = await failure_text(converter, ev.workflow_execution_failed_event_attributes.failure)
            elif et == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED:
                reason = ev.workflow_execution_terminated_event_attributes.reason
                run.error = f"terminated: {reason or 'no reason given'}"
            elif et == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TIMED_OUT:
                run.error = "the run timed out: it reached its execution timeout"
            else:
                run.error = "canceled"
    timers: dict[str, bool] = {}
    for ev in history.events:
        if ev.event_type == EventType.EVENT_TYPE_TIMER_STARTED:
            timers[ev.timer_started_event_attributes.timer_id] = True
        elif ev.event_type == EventType.EVENT_TYPE_TIMER_FIRED:
            timers[ev.timer_fired_event_attributes.timer_id] = False
        elif ev.event_type == EventType.EVENT_TYPE_TIMER_CANCELED:
            timers[ev.timer_canceled_event_attributes.timer_id] = False
    # A call waiting for a person runs its deadline's timer: not a backoff.
    run.timer_pending = any(timers.values()) and not any(e.get("state") == "waiting" for e in run.approvals)
    for trace in (await activity_traces(client, history)).values():
        step = step_of(trace)
        run.attempts.setdefault(step, []).append(trace)
        if trace.outcome != "completed" or not isinstance(trace.output, Mapping):
            continue
        if trace.step == MODEL_TURN:
            run.turns[int(trace.output["turn"])] = dict(trace.output)
        elif trace.step == TOOL_CALL:
            run.results[(int(trace.output["turn"]), int(trace.output["index"]))] = dict(trace.output)
    for p in pending:
        run.pending[p.activity_id.rpartition("/")[0]] = p
    # A call a person denied, or whose wait expired, was refused in workflow code (no activity): its result as
    # the workflow recorded it in the window, rebuilt from the memo with the same words.
    # And every call after it in the turn, refused in workflow code too (``not_run_after``).
    for entry in run.approvals:
        if entry.get("state") in ("denied", "expired") and entry.get("call"):
            turn, index = parse_step(str(entry["call"]))
            if index is None or (turn, index) in run.results:
                continue
            reason = (denied_result(Decision.from_json(entry["decision"])) if entry["state"] == "denied"
                      else expired_result(Wait.from_json(entry)))
            refused = [refused_result(turn, index, str(entry.get("tool")), reason)]
            calls = (run.turns.get(turn) or {}).get("calls") or []
            after = not_run_after(str(entry["call"]))
            refused += [refused_result(turn, later, str(calls[later].get("name", "")), after)
                        for later in range(index + 1, len(calls))]
            for result in refused:
                run.results[(turn, result.index)] = dict(to_jsonable(result))  # type: ignore[arg-type]
    return run, started.continued_execution_run_id


async def read_chain(client: Client, run_id: str) -> LoopChain:
    """Every run of the loop run ``run_id``, oldest first (``TemporalRunNotFound`` if there is none)."""
    description, history = await read_history(client, run_id)
    latest, previous = await _read_run(client, run_id, history, description.status,
                                       description.raw_description.pending_activities)
    latest.temporal_run_id = description.run_id
    if description.status == WorkflowExecutionStatus.RUNNING:
        latest.parked = await parked_detail(client, description, history)
    runs = [latest]
    while previous:
        if len(runs) >= MAX_CHAIN_RUNS:
            raise RuntimeError(f"run {run_id} has more than {MAX_CHAIN_RUNS} runs in its chain; not read")
        handle = client.get_workflow_handle(run_id, run_id=previous)
        earlier, before = await _read_run(client, run_id, await handle.fetch_history(), None)
        earlier.temporal_run_id = previous
        runs.append(earlier)
        previous = before
    runs.reverse()
    return LoopChain(run_id, runs)


async def chain_turns(client: Client, run_id: str) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """Every recorded turn of the chain, each with its recorded tool results (``LoopChain.turns``)."""
    return (await read_chain(client, run_id)).turns()


# ---------------------------------------------------------------- status


def _step_status(attempts: list[ActivityTrace], *, effect: bool, run: ChainRun, closed: bool) -> StepStateName:
    """A step's status in ``durable_agents.steps.runstate``'s words, from its attempts in one run."""
    last = attempts[-1]
    if last.outcome == "completed":
        return "completed"
    doubtful = effect and any(t.in_doubt or t.crashed or t.outcome == "running" for t in attempts)
    if closed:
        return "in_doubt" if doubtful else "failed"
    if last.outcome == "running":
        p = run.pending.get(step_of(last))
        started = p is not None and p.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED
        return "running" if started else "waiting"
    return "retrying" if run.timer_pending else "waiting"


def _entry(step: str, run: ChainRun, place: int, *, effect: bool, closed: bool) -> dict[str, Any]:
    attempts = run.attempts.get(step, [])
    errors = [t.failure for t in attempts if t.outcome in ("failed", "timed_out", "canceled")]
    return {"status": _step_status(attempts, effect=effect, run=run, closed=closed) if attempts else "pending",
            "attempts": len(attempts), "crashes": sum(t.crashed for t in attempts),
            "last_error": errors[-1] if errors else None, "run": place}


async def loop_status(client: Client, run_id: str) -> dict[str, Any]:
    """The chain's status from its histories (no worker needed): ``run_id``, ``agent`` (the name of the agent
    the run is run by) and ``agent_spec`` (its import string, if the run recorded one), ``status``, ``error``,
    ``answer``, ``turn`` (the newest), ``max_turns``, ``runs`` (the Temporal run ids, oldest first),
    ``counts``, ``detail`` (a parked run's account, else None), and ``turns``: every turn of the chain with
    ``reused`` (true: a run before a reset recorded it and this chain read that record back, the model not
    asked again: ``durable_agents.activities.recorded_turns``) and its calls (index, tool, key, status, attempts,
    crashes, outcome, effect id, the arguments asked and the result recorded, each cut to ``SHOWN_CHARS``),
    each with ``run``, the place in ``runs`` of the run that recorded it. What ``starter.py status --json``
    prints for a loop run (docs/commands.md shows it)."""
    chain = await read_chain(client, run_id)
    latest = chain.latest
    closed = latest.status not in (WorkflowExecutionStatus.RUNNING, WorkflowExecutionStatus.COMPLETED)
    turns: list[dict[str, Any]] = []
    counts = {"turns": 0, "tool_calls": 0, "effects": 0, "refused": 0}
    effects = recorded_effects(chain.first_input.get("loop"))  # the run's agent's tools, as it recorded them
    for place, run in enumerate(chain.runs):
        ended = closed and run is latest
        numbers = sorted({int(step.removeprefix("turn-")) for step in run.attempts
                          if "/" not in step and step.removeprefix("turn-").isdigit()})
        for number in numbers:
            recorded = run.turns.get(number)
            entry = {"turn": number, **_entry(turn_step(number), run, place, effect=False, closed=ended),
                     "answer": shown(recorded["content"]) if recorded else None,
                     "reused": bool(recorded.get("reused")) if recorded else False, "calls": []}
            if turns and turns[-1]["turn"] == number:
                # The run before continued as new within this turn's retries: one turn, its attempts in both.
                before = turns.pop()
                entry["attempts"] += before["attempts"]
                entry["crashes"] += before["crashes"]
                entry["last_error"] = entry["last_error"] or before["last_error"]
            if recorded is not None:
                counts["turns"] += 1
            for index, call in enumerate((recorded or {}).get("calls") or ()):
                name = str(call.get("name", ""))[:64]
                effect = name in effects
                result = run.results.get((number, index))
                call_entry = {"index": index, "name": name,
                              "key": tool_key(run_id, number, index, call["id"]) if effect else None,
                              **_entry(call_step(number, index), run, place, effect=effect, closed=ended),
                              "outcome": result["status"] if result else None,
                              "effect_id": result.get("effect_id") if result else None,
                              "replayed": bool(result.get("replayed")) if result else False,
                              "arguments": shown(str(call.get("arguments", ""))),
                              "result": shown(str(result.get("content", ""))) if result else None}
                if result is not None and call_entry["status"] == "pending":
                    call_entry["status"] = "completed"  # refused in workflow code (a person's denial, a deadline)
                if result is not None:
                    counts["tool_calls"] += 1
                    counts["effects"] += result["status"] == "ok" and result.get("kind") is not None
                    counts["refused"] += result["status"] == "refused"
                entry["calls"].append(call_entry)
            turns.append(entry)
    status: RunStateName
    if latest.status == WorkflowExecutionStatus.COMPLETED:
        status = "completed"
    elif latest.status == WorkflowExecutionStatus.RUNNING:
        status = "parked" if latest.parked else "running"
    else:
        status = "failed"
    output = latest.output if isinstance(latest.output, Mapping) else {}
    found = {
        "run_id": run_id, "agent": agent_name(chain.first_input.get("agent")),
        "agent_spec": str(chain.first_input.get("agent_spec") or ""), "status": status,
        "error": latest.error, "answer": output.get("answer"), "detail": latest.parked,
        "turn": turns[-1]["turn"] if turns else 1,
        "max_turns": chain.first_input.get("max_turns", DEFAULT_MAX_TURNS),
        "runs": [run.temporal_run_id for run in chain.runs], "counts": counts, "turns": turns,
    }
    approvals = approval_entries(chain)
    if approvals:
        found["approvals"] = approvals
        waiting = next((w for w in approvals if w["state"] == "waiting"), None)
        if waiting is not None and status == "running":
            kept = [w for w in approvals if w["state"] == "kept" and w["call"] == waiting["call"]]
            found["detail"] = found["detail"] or (
                f"{waiting['call']} waits for a person's decision on {waiting['tool']} until {waiting['until']}: "
                f"`python starter.py approve {run_id} {waiting['call']} --by NAME` (or deny)"
                + ("; a decision is kept in history until a worker runs" if kept else ""))
    return found


def approval_entries(chain: LoopChain) -> list[dict[str, Any]]:
    """The chain's waits for a person (``status --json``'s ``approvals``, the same shape on every engine): each
    call that waited, its tool, arguments, key, digest, since and until (ISO), its ``state`` (``waiting``,
    ``approved``, ``denied``, ``expired``) and the decision taken; then each decision the run refused
    (``refused``, with the reason) and, while its call waits, each sent by signal that no worker has judged
    yet (``kept``)."""
    out: list[dict[str, Any]] = []
    judged: set[str] = set()
    for run in chain.runs:
        for entry in run.approvals:
            shown_entry = dict(entry)
            if isinstance(entry.get("until"), (int, float)):
                overdue(shown_entry, float(entry["until"]), time.time())
            for stamp in ("since", "until"):
                if isinstance(shown_entry.get(stamp), (int, float)):
                    shown_entry[stamp] = iso(shown_entry[stamp])
            decision = shown_entry.get("decision")
            if isinstance(decision, Mapping):
                judged.add(str(decision.get("id")))
                if isinstance(decision.get("at"), (int, float)):
                    shown_entry["decision"] = {**decision, "at": iso(decision["at"]) if decision["at"] else None}
            out.append(shown_entry)
    waiting = {str(e.get("call")) for e in out if e.get("state") == "waiting"}
    for run in chain.runs:
        for sent in run.kept:  # judged by a worker once the call no longer waits (taken, the same again, refused)
            if str(sent.get("id")) not in judged and str(sent.get("call")) in waiting:
                out.append({"call": sent.get("call"), "state": "kept", "decision": sent,
                            "reason": "sent while no worker accepted it: kept in history, taken when a worker runs"})
    return out


# ---------------------------------------------------------------- for the command line (starter.py)


async def is_loop_run(client: Client, run_id: str) -> bool:
    """Whether ``run_id`` is a run of the agent loop (its workflow type ``AgentLoop``), from one describe;
    ``TemporalRunNotFound`` (durable_agents.flowclient.status) when there is no such run."""
    handle = client.get_workflow_handle(run_id)
    try:
        description = await handle.describe()
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            raise TemporalRunNotFound(
                f"no run with id {run_id!r} in namespace {client.namespace!r}. Start one with: python starter.py "
                f"start {run_id} \"TASK\" --email ADDR (the flow), or python starter.py loop {run_id} \"TASK\" "
                "--email ADDR (the agent loop)") from err
        raise
    return description.workflow_type == LOOP_WORKFLOW_NAME


async def wait_for_loop(client: Client, run_id: str, on_change: Callable[[dict[str, Any]], Any] | None = None, *,
                        poll: float = 0.25, timeout: float | None = None) -> dict[str, Any]:
    """Poll ``loop_status`` until the run is no longer running (completed, failed or parked: its code, not
    its steps, stopped it, and it waits for an operator); ``on_change`` sees each
    new status on the way. Past ``timeout`` seconds, ``TimeoutError`` with the last status seen."""
    deadline = None if timeout is None else time.monotonic() + timeout
    last: dict[str, Any] | None = None
    while True:
        status = await loop_status(client, run_id)
        if on_change is not None and status != last:
            on_change(status)
        last = status
        if status["status"] != "running":
            return status
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"loop run {run_id} still running after {timeout:.0f} s; last status: {status}")
        await asyncio.sleep(poll)


REUSED_NOTE = "reused: recorded by a run before a reset, read back, the model not asked again"
"""What a turn's line says after what it asked for when ``reused`` (``loop_lines``, ``loop_ticker``)."""


def _asked(turn: Mapping[str, Any]) -> str:
    calls = turn.get("calls") or []
    if turn.get("status") != "completed":
        return ""
    asked = f"asked for {', '.join(str(c['name']) for c in calls)}" if calls else "the final answer (no tool)"
    return f"{asked} ({REUSED_NOTE})" if turn.get("reused") else asked


def _tries(step: Mapping[str, Any]) -> str:
    attempts, crashes = step.get("attempts") or 0, step.get("crashes") or 0
    if attempts <= 1 and not crashes:
        return ""
    return f", attempt {attempts}" + (f" ({crashes} crash{'es' if crashes > 1 else ''})" if crashes else "")


def loop_lines(status: Mapping[str, Any]) -> list[str]:
    """A loop run turn by turn, as ``starter.py status`` prints it: each turn's status and the tools it asked
    for; each call's arguments, key (an effect's), status, attempts and recorded result; the answer, the
    error, the counts and the Temporal runs of the chain. Takes ``loop_status``'s dict or the ``progress``
    query's (which carries the newest turns only). Every line escaped for a terminal: they quote run data."""
    turn, limit = status.get("turn"), status.get("max_turns")
    lines = [f"loop run {status['run_id']}: {status['status']}, turn {turn} of at most {limit}"]
    if status.get("earlier_turns"):
        lines.append(f"  ({status['earlier_turns']} earlier turn(s) not carried by the query: drop --live to "
                     "read every turn from the histories)")
    for entry in status.get("turns") or []:
        asked = _asked(entry)
        lines.append(f"  turn {entry['turn']}: {entry['status']}{_tries(entry)}" + (f": {asked}" if asked else ""))
        if entry.get("status") not in ("completed", "pending") and entry.get("last_error"):
            lines.append(f"    last error: {entry['last_error']}")
        for call in entry.get("calls") or []:
            arguments = f" {call['arguments']}" if call.get("arguments") else ""
            lines.append(f"    call {call['index']} {call['name']}{arguments}")
            lines.append(f"      key {call['key']}" if call.get("key") else "      no key: no effect (read-only)")
            outcome = call.get("outcome")
            shown_result = ""
            if outcome:
                shown_result = f": {outcome}" + (" (answered from its service's store)" if call.get("replayed") else "")
                if call.get("result"):
                    shown_result += f" {call['result']}"
                elif call.get("note"):
                    shown_result += f" {call['note']}"
            lines.append(f"      {call['status']}{_tries(call)}{shown_result}")
            if call.get("status") not in ("completed", "pending") and call.get("last_error"):
                lines.append(f"      last error: {call['last_error']}")
    lines.extend(status_lines(status.get("approvals") or []))
    if status.get("status") == "running" and status.get("detail"):
        lines.append(f"  {status['detail']}")
    if status.get("status") == "parked" and status.get("detail"):
        lines.append(f"  parked: {status['detail']}")
    if status.get("answer") is not None:
        lines.append(f"  answer: {status['answer']}")
    if status.get("error"):
        lines.append(f"  error: {status['error']}")
    counts = status.get("counts") or {}
    if counts:
        lines.append(f"  {counts.get('turns', 0)} turn(s), {counts.get('tool_calls', 0)} tool call(s), "
                     f"{counts.get('effects', 0)} effect(s), {counts.get('refused', 0)} refused")
        if counts.get("refused"):
            lines.append("  a refused call applied nothing and its reason went back to the model (each call's result "
                         "above); an order the provider does not keep is refused: give it with --orders ORDER=CENTS")
    runs = status.get("runs")
    if runs:
        lines.append(f"  Temporal runs of the chain ({len(runs)}; a new one at each continue-as-new, the run id "
                     "and every key the same):")
        lines.extend(f"    {place}. {temporal_run}" for place, temporal_run in enumerate(runs, 1))
    elif status.get("run_in_chain"):
        lines.append(f"  run {status['run_in_chain']} of the chain (the workflow's own answer)")
    return [printable(line) for line in lines]


def loop_ticker(indent: str = "  ", out: Callable[[str], Any] = print) -> Callable[[Mapping[str, Any]], None]:
    """An ``on_change`` callback for ``wait_for_loop``: one line each time a turn or a call changes status or
    attempt (a turn's line, once recorded, names the tools it asked for). Run data escaped.

    A reset while it follows (the chain's runs are then not the ones seen before, extended: a reset run
    replaced them) gets a line of its own, and every turn and call of the reset run is told from the start,
    the turns it reused first."""
    seen: dict[str, tuple[str, int]] = {}
    runs: list[str] = []

    def say(name: str, step: Mapping[str, Any], after: str) -> None:
        now = (str(step["status"]), int(step.get("attempts") or 0))
        if seen.get(name) == now or step["status"] == "pending":
            return
        seen[name] = now
        out(printable(f"{indent}{time.strftime('%H:%M:%S')} {name}: {step['status']} (attempt {now[1]}){after}"))

    def tick(status: Mapping[str, Any]) -> None:
        now = [str(r) for r in status.get("runs") or []]
        if runs and now[:len(runs)] != runs:
            seen.clear()
            out(printable(f"{indent}{time.strftime('%H:%M:%S')} reset: run {runs[-1]} was closed by a reset; "
                          f"following run {now[-1] if now else '?'} of the same id from here (its turns below, "
                          "those the reset reused marked so)"))
        runs[:] = now
        for entry in status.get("turns") or []:
            asked = _asked(entry)
            say(turn_step(entry["turn"]), entry, f": {asked}" if asked else "")
            for call in entry.get("calls") or []:
                outcome = f" -> {call['outcome']}" if call.get("outcome") else ""
                say(f"{call_step(entry['turn'], call['index'])} {call['name']}", call, outcome)

    return tick


def loop_retry_refusal(run_id: str, state: str, error: str | None) -> str | None:
    """Why ``starter.py retry`` refuses a loop run whose status (``loop_status``'s word) is ``state`` and whose
    error is ``error``, or None: it restarts the run at its unfinished step. What ``restart_failed_loop``
    refuses with, and what ``starter.py settle`` tells of a retry before one is tried."""
    error = error or ""
    refused = retry_refusal(run_id, state, error, input_refused="input refused" in error)
    if refused is not None:
        return refused
    if reached_turn_limit(error):
        return (f"run {run_id} reached its turn limit ({shown(error)}); a retry would ask that turn again under "
                "the same limit. Start a new RUN_ID with a higher --max-turns.")
    return None


async def restart_failed_loop(client: Client, run_id: str) -> tuple[str, int, str]:
    """``starter.py retry`` for a loop run: reset the chain's last run to the workflow task that first
    scheduled its unfinished step (a turn or a call), which then gets a fresh budget; recorded turns are not
    asked again and the keys stay. Returns (step, reset event id, new Temporal run id); ``RestartRefused``
    saying why for a run that is open, completed, refused its input or reached its turn limit (the same turn
    under the same limit would fail again)."""
    from durable_agents.flowclient.runs import RestartRefused, reset_to

    chain = await read_chain(client, run_id)
    latest = chain.latest
    error = latest.error or ""
    state = ("completed" if latest.status == WorkflowExecutionStatus.COMPLETED
             else "running" if latest.status == WorkflowExecutionStatus.RUNNING else "failed")
    refused = loop_retry_refusal(run_id, state, error)
    if refused is not None:
        raise RestartRefused(refused)
    unfinished = [(step, attempts) for step, attempts in latest.attempts.items()
                  if attempts and attempts[-1].outcome != "completed"]
    if not unfinished:
        raise RestartRefused(f"run {run_id} closed ({error or latest.status}) with no unfinished step to restart; "
                             "start a new RUN_ID")
    step, attempts = unfinished[-1]
    point = attempts[0].workflow_task_completed_event_id
    new_run = await reset_to(client, run_id, latest.temporal_run_id, point,
                             f"starter.py retry: restart the loop at step {step} ({error or 'closed'})")
    return step, point, new_run
