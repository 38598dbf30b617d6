"""The agent loop (``durable_agents.steps.loop``) as a Temporal workflow: deterministic, no I/O.

Workflow name ``AgentLoop``; input ``durable_agents.workflows.loop_state.LoopInput``; result
and ``progress`` query ``LoopProgress``. The run's id must be its workflow id:
every tool call's key derives from it.

**The loop.** Turn n is an activity (``model_turn``) on the prompt window;
its completion in history *is* the record of the turn, written before any of
its calls is scheduled, and never asked for again (a replay reads the
recorded answer). Then each call of the turn, in the model's order, is an
activity (``tool_call``) whose request ``durable_agents.steps.loop.tool_request`` builds from
the recorded turn: the key is ``tool_key(run id, n, place, digest of the
call's id)``, the same on every attempt, resume and replay of that call. A
turn with no call ends the run completed, its text the answer; a turn the
model step refuses (the turn limit, a malformed answer: a ``PermanentError``)
ends the run FAILED with that message, naming the step.

Activity ids: ``turn-<n>/<attempt>`` and ``turn-<n>/call-<i>/<attempt>``.

**The prompt** is memory's window derived from the record: a
``durable_agents.memory.DerivedWindow`` under the run's bounds (``window_tokens``,
``window_messages``), built as the run goes: the system instructions
(pinned), the task, then every recorded turn (``durable_agents.steps.loop.turn_message``)
and tool result (``result_message``), in order. Replays rebuild it from the
recorded results, so every replay asks with the prompt the first execution
built. Memory is never read to decide anything: what happened is the history.

**Retries** are decided here, as ``durable_agents.workflows.agent_flow`` decides them and by
the same rules (``durable_agents.steps.retry``: a ``StepLedger`` per step under the run's
rule; ``durable_agents.workflows.attempts.StepAttempts`` runs the attempts, the flow's loop): each activity is
scheduled for one attempt; a heartbeat timeout is a crash, retried at once
within the death limit; a transient error waits out its backoff on a durable
timer within the step's budget; a permanent one ends the run FAILED naming the
step; every step has at most the rule's attempts. A turn's attempt may take
the rule's model timeout (its ``draft`` timeout), a call's the provider's (its
``send_confirmation`` timeout). A call of a tool with an effect is scheduled
with ``WAIT_CANCELLATION_COMPLETED`` and is in doubt when an attempt's outcome
is unknown. A cancel ends the run canceled wherever it lands; a reset starts
the current step's budget again (``_on_reset``, as in ``AgentFlow``).

**A reset** re-runs the run from a workflow task as a new run, and the turns its base recorded after that
point are not in the new run's history. Every turn request carries ``started_as`` (``LOOP_RESET_PATCH``):
the id of the run the record began with, which a reset keeps. Asked in another run, ``model_turn`` first
reads the turn back from the runs before (``durable_agents.activities.recorded_turns``) and answers with that record
(``reused``), so its calls keep their recorded keys; the first turn no run recorded is asked of the model. A
reset run that continues as new while still reusing hands its own id on (``LoopCarried.started_as``).

**Continue-as-new.** Once a turn's calls are all recorded, if the history
holds more than ``history_bound`` events (``DEFAULT_HISTORY_BOUND``, 1,000,
``durable_agents.workflows.loop_state`` says why) or the server suggests it, the run
continues as new with a ``LoopCarried``: the next turn, the window's messages
exactly as held (the new run rebuilds its window from them, in order, and
asks with the same prompt the old run would have), the chain's start id, the
counts and the newest turn summaries. The workflow id, and so every key,
stays; the Temporal run id changes. ``start_id`` (the provider's metadata,
``durable_agents.steps.adoption``) is the first run's ``original_execution_run_id``, carried:
kept by a reset, the same across the chain.

**A call that waits for a person** (its recorded turn marks it ``approval``: ``durable_agents.steps.approval``):
before its first attempt the workflow records the wait in the run's memo (``approvals``, upserted: a
``WorkflowPropertiesModified`` event, read with no worker by ``status`` and shown in the UI's run details) and
waits on a durable timer until the deadline for a decision. A decision comes as the update ``approval``
(``APPROVAL_UPDATE``: its validator runs ``judge`` and refuses what it refuses, leaving no trace; accepted, it is
in history before the sender hears) or, when no worker accepts the update, as the signal ``approval_kept``
(``APPROVAL_SIGNAL``: in history at once with no worker; judged when a worker runs, a refused one recorded in
the memo). An approved call runs as any call; a denied one, or one whose deadline passed, is refused back to
the model with nothing applied (or, if its tool says so, the run fails naming it), and so is every call after
it in the same turn (``not_run_after``: the model asked for them together). The memo is upserted at
each change. Runs recorded before approvals never take this path: no call of theirs records ``approval``.

Crash points (tests only; workflow code, never on replay, each inside
``sandbox_unrestricted`` since it may ``os.kill``; they add no command):

=================================  ==============================================
``temporal:loop:between_calls``    a call's completion is in history and another
                                   call of the same turn follows, not scheduled
``temporal:loop:after_turn``       a turn's last call is recorded; the next
                                   turn not scheduled
``temporal:loop:continue_as_new``  the run is about to continue as new
``approval:waiting``               a call's wait is recorded, no decision yet
``approval:decided``               its decision (or its expiry) is taken, the
                                   call not yet run
=================================  ==============================================

Workflow-task failures park the run, as for ``AgentFlow``; only
``ApplicationError`` fails it from here: refused input, a step that gave up,
a model answer memory cannot hold in the window.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any, NoReturn, TypeVar

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    # Re-exported: history readers (durable_agents.flowclient.loop) name the activities by them without importing
    # activities.
    from durable_agents.activities.loop import MODEL_TURN as MODEL_TURN
    from durable_agents.activities.loop import TOOL_CALL as TOOL_CALL
    from durable_agents.activities.loop import LoopActivities
    from durable_agents.memory.derived import DerivedWindow, chat_tokens
    from durable_agents.memory.errors import MemoryInputError
    from durable_agents.steps.approval import (
        EXPIRY_FAILS,
        REJECTED,
        TAKEN,
        Decision,
        Wait,
        denied_result,
        expired_result,
        judge,
        new_wait,
        not_run_after,
    )
    from durable_agents.steps.crashpoints import crash_point
    from durable_agents.steps.limits import InputError, check_email, check_run_id, check_task
    from durable_agents.steps.loop import (
        MAX_INSTRUCTIONS_CHARS,
        MAX_WINDOW_TOKENS,
        MIN_WINDOW_TOKENS_BEFORE,
        WINDOW_TOKENS_BEFORE_CAP,
        AskedCall,
        Chat,
        LoopInputs,
        TurnRequest,
        call_step,
        check_loop_inputs,
        checked_arguments,
        loop_changed,
        refused_call,
        result_message,
        same_error_limit,
        start_tokens,
        system_message,
        task_message,
        tool_request,
        turn_message,
        turn_step,
    )
    from durable_agents.steps.models import to_jsonable
    from durable_agents.steps.retry import RULE_VERSION, RetryRule, StepLedger
    from durable_agents.steps.runstate import RunStateName
    from durable_agents.steps.served import REFUND, Served, agent_name, served_names, served_on
    from durable_agents.workflows.attempts import Ending, StepAttempts
    from durable_agents.workflows.loop_state import (
        HISTORY_BYTES_BOUND,
        KEPT_TURNS,
        MAX_HISTORY_BOUND,
        MIN_HISTORY_BOUND,
        CallState,
        CarriedMessage,
        LoopCarried,
        LoopCounts,
        LoopInput,
        LoopProgress,
        TurnState,
        details_text,
        shown,
        window_policy,
    )

LOOP_WORKFLOW_NAME = "AgentLoop"
APPROVAL_UPDATE = "approval"
APPROVAL_SIGNAL = "approval_kept"
APPROVALS_MEMO = "approvals"


class LoopChanged(RuntimeError):
    """This code's loop is not the one a run started under (``durable_agents.steps.loop.loop_changed``): raised in
    workflow code, so the workflow task fails and the run is parked, visibly, instead of run by another loop."""

LOOP_RESET_PATCH = "loop-reset-reuses-turns"
"""The marker of runs whose turns carry ``TurnRequest.started_as``: asked in a run a reset made, a turn the
runs before it recorded is read back and reused, never asked again (``durable_agents.activities.recorded_turns``). A
reset copies the marker with its base's history, so a reset of a run started under it reuses; a run
recorded without it (a reset of one included) asks every turn after the reset point again, as it did."""

LOOP_BOUNDS_PATCH = "loop-bounds"
"""The marker of runs under the loop's bounds: a turn is sent the run's window bound
(``durable_agents.steps.loop.recorded_calls`` refuses a call that would not fit it); the first run of a chain refuses a
window that cannot hold the system instructions, the task and one round; a turn gives up on the same error
``durable_agents.steps.retry.SAME_ERROR_LIMIT`` times in a row. Runs recorded without it keep deciding as they did."""

TURN_TIMEOUT_OF = "draft"
TOOL_TIMEOUT_OF = "send_confirmation"
"""Whose attempt timeout in the run's rule a turn's and a call's attempts take (``RetryRule.attempt_timeout_for``):
a turn is a model call, as the draft is; a call is a provider request, as the email is."""

RequestT = TypeVar("RequestT")
ResultT = TypeVar("ResultT")
LoopActivity = Callable[[LoopActivities, RequestT], Awaitable[ResultT]]


@workflow.defn(name=LOOP_WORKFLOW_NAME)
class AgentLoop:
    @workflow.init
    def __init__(self, inp: LoopInput) -> None:
        carried = inp.carried
        self._run_id = inp.run_id
        self._max_turns = inp.max_turns
        self._status: RunStateName = "running"
        self._error: str | None = None
        self._answer: str | None = None
        self._turn = carried.next_turn if carried else 1
        self._counts = dataclasses.replace(carried.counts) if carried else LoopCounts()
        self._kept: list[TurnState] = list(carried.turns) if carried else []  # earlier runs' newest turns
        self._turns: list[TurnState] = []  # this run's
        self._run_in_chain = carried.runs + 1 if carried else 1
        self._window: DerivedWindow | None = None
        self._bounded = False  # under LOOP_BOUNDS_PATCH (run)
        self._input = inp
        self._inputs: LoopInputs | None = None
        self._carried_step = carried.step if carried else None
        # The step being attempted: a reset starts its budget again (_on_reset). Earlier steps are done.
        self._ledger: StepLedger | None = None
        self._started_as: str | None = None  # TurnRequest.started_as (LOOP_RESET_PATCH)
        # Whether reuse after a reset is over (a turn asked of the model after one reused, or in a run that
        # carried the reuse on): then the run it continues as new into does not look for records. A fresh turn
        # before any reused one may be the base's own (before the reset point):
        # durable_agents.activities.recorded_turns, which reads the histories, decides then.
        self._reuse_carried = carried is not None and carried.started_as is not None
        self._reused_any = self._reuse_ended = False
        # This run's waits for a person (durable_agents.steps.approval), by call; their memo entries, in order.
        self._waits: dict[str, Wait] = {}
        self._decided: dict[str, Decision] = {}
        self._expired: set[str] = set()
        self._approvals: list[dict[str, object]] = []
        workflow.register_random_seed_callback(self._on_reset)

    def _on_reset(self, _seed: int) -> None:
        """Temporal reseeds a run's randomness at a reset point, and only there; from it the step being
        attempted starts its budget, death count and attempt limit again (``AgentFlow._on_reset``)."""
        if self._ledger is not None:
            self._ledger.afresh()

    @workflow.query(name="progress")
    def progress(self) -> LoopProgress:
        return self._snapshot()

    # ------------------------------------------------------------ a person's decision

    def _judge(self, decision: Decision) -> tuple[str, str]:
        return judge(self._waits.get(decision.call), self._decided.get(decision.call), decision,
                     expired=decision.call in self._expired)

    @workflow.update(name=APPROVAL_UPDATE)
    def approval(self, decision: dict[str, Any]) -> str:
        """A decision on a waiting call; what it was taken as (the validator refused what ``judge`` refuses)."""
        taken = Decision.from_json(decision)
        verdict, said = self._judge(taken)
        if verdict == REJECTED:  # another decision came between the validator and here
            raise ApplicationError(said, type="DecisionRefused", non_retryable=True)
        if verdict == TAKEN:
            self._take(taken)
        return said

    @approval.validator
    def _approval_valid(self, decision: dict[str, Any]) -> None:
        try:
            taken = Decision.from_json(decision)
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"not a decision ({err}): send it with `starter.py approve|deny RUN_ID CALL`") from None
        verdict, said = self._judge(taken)
        if verdict == REJECTED:
            raise ValueError(said)

    @workflow.signal(name=APPROVAL_SIGNAL)
    def approval_kept(self, decision: dict[str, Any]) -> None:
        """A decision sent while no worker accepted the update: kept in history, judged here; a refused one is
        shown in the memo with its reason (its sender heard only that it was kept)."""
        try:
            taken = Decision.from_json(decision)
        except (KeyError, TypeError, ValueError) as err:
            self._approvals.append({"call": "?", "state": "refused", "reason": f"not a decision: {err}"})
            self._upsert()
            return
        verdict, said = self._judge(taken)
        if verdict == TAKEN:
            self._take(taken)
        elif verdict == REJECTED:
            self._approvals.append({"call": taken.call, "state": "refused", "reason": said,
                                    "decision": taken.to_json()})
            self._upsert()

    def _take(self, decision: Decision) -> None:
        decision = dataclasses.replace(decision, at=workflow.now().timestamp())
        self._decided[decision.call] = decision
        self._mark(decision.call, "approved" if decision.verdict == "approve" else "denied", decision.to_json())

    def _mark(self, call: str, state: str, decision: dict[str, object] | None = None) -> None:
        for entry in self._approvals:
            if entry.get("call") == call and entry.get("state") == "waiting":
                entry["state"], entry["decision"] = state, decision
        self._upsert()

    def _upsert(self) -> None:
        """The run's waits as the memo shows them (``status``, the UI), at every change."""
        workflow.upsert_memo({APPROVALS_MEMO: self._approvals})

    async def _await_decision(self, inputs: LoopInputs, turn: int, index: int, call: AskedCall, served: Served,
                              state: CallState) -> tuple[str, str | None]:
        """Wait for a person's decision on a call its turn marked ``approval``: (its outcome, the refusal the model
        is given unless approved). The wait is recorded first (the memo); the deadline is a durable timer."""
        request = tool_request(inputs, turn, index, call)
        checked = checked_arguments(call, served.agent.tools)
        wait = new_wait(inputs.run_id, call_step(turn, index), call.name, checked if isinstance(checked, dict) else {},
                        request.idempotency_key, call.approval or {}, workflow.now().timestamp())
        self._waits[wait.call] = wait
        self._approvals.append({**wait.to_json(), "state": "waiting", "decision": None})
        state.note = f"waits for a person's decision (digest {wait.digest[:12]})"
        self._upsert()
        self._show()
        self._crash_point("approval:waiting")
        try:
            await workflow.wait_condition(lambda: wait.call in self._decided,
                                          timeout=timedelta(seconds=max(wait.until - wait.since, 0.001)))
        except TimeoutError:
            if wait.call not in self._decided:
                self._expired.add(wait.call)
                self._mark(wait.call, "expired")
        self._crash_point("approval:decided")
        decided = self._decided.get(wait.call)
        state.note = decided.said() if decided is not None else "no decision by its deadline"
        if decided is not None and decided.verdict == "approve":
            return "approved", None
        if decided is not None:
            return "denied", denied_result(decided)
        return "expired", expired_result(wait)

    def _snapshot(self) -> LoopProgress:
        turns = self._kept + self._turns
        if self._bounded:  # the newest only: a run's result and its query stay within a payload
            turns = turns[-KEPT_TURNS:]
        stats = self._window.stats() if self._window is not None else None
        return LoopProgress(
            run_id=self._run_id, status=self._status, turn=self._turn, max_turns=self._max_turns,
            counts=dataclasses.replace(self._counts), turns=turns,
            earlier_turns=max(self._counts.turns - sum(t.status == "completed" for t in turns), 0),
            run_in_chain=self._run_in_chain, answer=self._answer, error=self._error,
            window_messages=stats.messages if stats else 0, window_tokens=stats.tokens if stats else 0,
        )

    def _show(self) -> None:
        """What the Temporal UI shows for this run."""
        workflow.set_current_details(details_text(self._snapshot()))

    @workflow.run
    async def run(self, inp: LoopInput) -> LoopProgress:
        # First, before the input checks, which it decides: a run recorded without it asks and decides as it
        # did (a turn asked again asks exactly as recorded: tests/test_replay_inputs.py).
        self._bounded = workflow.patched(LOOP_BOUNDS_PATCH)
        # Where the run's record began (the first run's id, which a reset keeps): a turn is asked in another
        # run only after a reset, and that run reuses what its base recorded. Continued as new from a reset
        # run still reusing: that run's id, carried.
        info = workflow.info()
        carried_from = inp.carried.started_as if inp.carried else None
        self._started_as = ((carried_from or info.original_execution_run_id)
                            if workflow.patched(LOOP_RESET_PATCH) else None)
        served = self._served(inp)
        effects = served.agent.tools.effects
        changed = (loop_changed(inp.loop, served.agent.tools, "" if served.name == REFUND.name else served.name)
                   if self._bounded else None)
        if changed is not None:
            # Not a failure of the run: this code is not the loop it started under. The workflow task fails,
            # again at each try, and the run waits, parked, for code of its own loop.
            raise LoopChanged(f"{changed}. Deploy code of the run's own loop (or roll back): the run resumes "
                              "by itself; or terminate it and start a new run under this code")
        inputs, rule = self._checked(inp)
        self._inputs = inputs
        window_bound = inputs.window_tokens if self._bounded else None
        window = self._window = self._first_window(inputs, inp)
        while True:
            turn = self._turn
            state = TurnState(turn)
            self._turns.append(state)
            request = TurnRequest(inputs.run_id, turn, window.prompt(), inputs.max_turns, window_bound, inputs.tools,
                                  started_as=self._started_as, agent=inputs.agent)
            answer = await self._attempts(turn_step(turn), LoopActivities.model_turn, request, rule, state,
                                          effect=False, timeout_of=TURN_TIMEOUT_OF)
            # Recorded (ActivityTaskCompleted): from here this turn is read from history, never asked again.
            self._add(window, turn_message(answer), state)
            self._counts.turns += 1
            if answer.reused:
                self._reused_any = True
            elif self._reused_any or self._reuse_carried:
                self._reuse_ended = True  # asked of the model after the reset: the base's records no longer follow
            state.answer = shown(answer.content)
            state.calls = [CallState(i, c.name[:64], tool_request(inputs, turn, i, c).idempotency_key
                                     if c.name in effects else None)
                           for i, c in enumerate(answer.calls)]
            if not answer.calls:
                self._answer, self._status = answer.content, "completed"
                self._show()
                return self._snapshot()
            stopped_by = None  # a call of this turn a person did not approve: none after it runs
            for index, call in enumerate(answer.calls):
                call_state = state.calls[index]
                refusal = not_run_after(stopped_by) if stopped_by is not None else None
                if refusal is None and call.approval is not None:  # a person decides first (the module docstring)
                    outcome, refusal = await self._await_decision(inputs, turn, index, call, served, call_state)
                    if outcome == "expired" and call.approval.get("on_expiry") == "fail":
                        self._end_failed(call_state, f"step {call_step(turn, index)} ({call.name}) failed: "
                                                     f"{refusal} ({EXPIRY_FAILS})", "ApprovalExpired")
                    if refusal is not None:
                        stopped_by = call_step(turn, index)
                if refusal is not None:  # denied, expired, or after one: refused back to the model, nothing applied
                    result = refused_call(tool_request(inputs, turn, index, call), refusal)
                    call_state.status = "completed"
                else:
                    result = await self._attempts(call_step(turn, index), LoopActivities.tool_call,
                                                  tool_request(inputs, turn, index, call), rule, call_state,
                                                  effect=call.name in effects, timeout_of=TOOL_TIMEOUT_OF)
                self._add(window, result_message(answer, result), state)
                call_state.outcome, call_state.effect_id, call_state.replayed = (result.status, result.effect_id,
                                                                                 result.replayed)
                if result.status == "refused":
                    call_state.note = shown(result.content)
                self._counts.tool_calls += 1
                self._counts.effects += result.status == "ok" and result.kind is not None
                self._counts.refused += result.status == "refused"
                self._show()
                if index + 1 < len(answer.calls):
                    self._crash_point("temporal:loop:between_calls")
            self._crash_point("temporal:loop:after_turn")
            self._turn = turn + 1
            if self._past_bound(inp):
                self._crash_point("temporal:loop:continue_as_new")
                workflow.continue_as_new(dataclasses.replace(inp, carried=self._carried(inputs, window)))

    # ------------------------------------------------------------ input, window, carry

    @staticmethod
    def _served(inp: LoopInput) -> Served:
        """The run's agent as this worker serves it (``durable_agents.steps.served``). None served: not a failure of the
        run but of this worker's deploy; the workflow task fails, naming the agent and what this worker
        serves, again at each try, and the run waits, parked, for a worker that serves it."""
        queue = workflow.info().task_queue
        served = served_on(queue, inp.agent)
        if served is None:
            raise LoopChanged(f"this worker (task queue {queue}) does not serve agent {agent_name(inp.agent)!r}, "
                              f"which run {inp.run_id} names; it serves: {', '.join(served_names(queue))}. Start a "
                              "worker with that agent (worker.py --agent package.module:attribute, or "
                              "durable_agents.flowclient.agents.AgentPlugin): the run resumes by itself")
        return served

    def _checked(self, inp: LoopInput) -> tuple[LoopInputs, RetryRule]:
        """The run's inputs and rule, checked (the same words as every entry point), or the run FAILED
        with the refusal. The start id is the chain's first run's, carried."""
        info = workflow.info()
        try:
            check_run_id(inp.run_id)
            if inp.run_id != info.workflow_id:
                # Keys derive from the run id; it must be the workflow id, the one identity that survives
                # resets and continue-as-new.
                raise InputError(f"run id {inp.run_id!r} differs from the workflow id {info.workflow_id!r}; "
                                 "start loop runs with durable_agents.flowclient.loop.start_loop")
            task = check_task(inp.task)
            served = self._served(inp)
            # The refund agent's one parameter is the email field, as its runs always recorded it.
            lab = served.name == REFUND.name
            email = check_email(inp.email) if lab else ""
            params = None if lab else served.check_params(inp.params)
            # The chain's first run checks that its window can hold the start; the runs it continues as go on
            # under the bounds it was started with.
            told = inp.instructions if self._bounded else None
            if told is not None and (not isinstance(told.prompt, str) or not told.prompt.strip()
                                     or not isinstance(told.tools, list)
                                     or len(told.prompt) + len(str(told.tools)) > MAX_INSTRUCTIONS_CHARS):
                raise InputError(f"the run's instructions must be a prompt and a list of tools of at most "
                                 f"{MAX_INSTRUCTIONS_CHARS} characters; start loop runs with "
                                 "durable_agents.flowclient.loop.start_loop")
            prompt = told.prompt if told is not None else served.agent.instructions
            start = start_tokens(task, chat_tokens, prompt) if self._bounded and inp.carried is None else None
            most = MAX_WINDOW_TOKENS if self._bounded else WINDOW_TOKENS_BEFORE_CAP
            # The floor as it always was: the start check refuses what the clients' floor does, and a floor
            # that followed this code's prompt could refuse a recorded run on replay (MIN_WINDOW_TOKENS_BEFORE).
            max_turns, window_tokens, window_messages = check_loop_inputs(inp.max_turns, inp.window_tokens,
                                                                          inp.window_messages, start, most,
                                                                          MIN_WINDOW_TOKENS_BEFORE)
            bound = inp.history_bound
            if isinstance(bound, bool) or not isinstance(bound, int) or \
                    not MIN_HISTORY_BOUND <= bound <= MAX_HISTORY_BOUND:
                raise InputError(f"history bound must be a whole number of events from {MIN_HISTORY_BOUND} "
                                 f"to {MAX_HISTORY_BOUND}, got {bound!r}")
            if inp.retry is None:
                raise InputError("the run records no retry rule; "
                                 "start loop runs with durable_agents.flowclient.loop.start_loop")
            try:
                rule = RetryRule.from_dict(inp.retry)
            except (TypeError, ValueError) as err:
                raise InputError(f"retry rule {inp.retry!r} is unusable: {err}") from None
            if rule.version < RULE_VERSION:
                raise InputError(f"the agent loop runs under a version {RULE_VERSION} retry rule, not version "
                                 f"{rule.version}")
            carried = inp.carried
            # A run continued as new within a turn's retries may carry turn 1, still to be recorded.
            if carried is not None and (carried.next_turn < (1 if carried.step else 2) or not carried.messages
                                        or carried.messages[0].id != system_message()[0]):
                raise InputError("the carried state is unusable: it needs the next turn (2 or more) and the "
                                 "window's messages, the system instructions first")
        except InputError as err:
            self._status = "failed"
            self._error = f"input refused: {err}"
            raise ApplicationError(self._error, type="InputError", non_retryable=True) from err
        start_id = carried.start_id if carried is not None else info.original_execution_run_id
        inputs = LoopInputs(inp.run_id, task, email, max_turns, window_tokens, window_messages, start_id,
                            agent=inp.agent, params=params)
        if told is not None:  # what the model is told: the run's own (LoopInput.instructions)
            inputs = dataclasses.replace(inputs, prompt=told.prompt, tools=told.tools)
        elif inputs.prompt != served.agent.instructions:  # none recorded: its agent's, as this worker has them
            inputs = dataclasses.replace(inputs, prompt=served.agent.instructions)
        return inputs, rule

    def _first_window(self, inputs: LoopInputs, inp: LoopInput) -> DerivedWindow:
        """The window this run starts from: the system instructions (pinned) and the task; or, continued
        as new, the carried messages in their order, the first (the system instructions) pinned. Either
        way the window the previous run held: a prefix of a window is within its bounds, so nothing is
        evicted while it is rebuilt, and what comes next is evicted as it would have been there."""
        window = DerivedWindow(window_policy(inputs.window_tokens, inputs.window_messages))
        messages: list[tuple[str, Chat]] = ([(m.id, m.chat) for m in inp.carried.messages] if inp.carried
                                            else [system_message(inputs.prompt), task_message(inputs)])
        for place, message in enumerate(messages):
            self._add(window, message, None, pin=place == 0)
        self._show()
        return window

    def _add(self, window: DerivedWindow, message: tuple[str, Chat], state: TurnState | None,
             *, pin: bool = False) -> None:
        """Append one message to the window; a message memory refuses (a model's tool-call arguments larger
        than the whole window) ends the run FAILED, saying which and what to do. Deterministic: a replay
        refuses it at the same place."""
        try:
            window.add(message[0], message[1], pin=pin)
        except MemoryInputError as err:
            self._end_failed(state, f"{message[0]} cannot enter the prompt window: {err}. Start the run with a "
                                    "larger window (window_tokens)", "WindowRefused")

    def _end_failed(self, state: TurnState | CallState | None, error: str, kind: str) -> NoReturn:
        """End the run FAILED from workflow code (no step gave up: a message memory refuses, a wait's deadline),
        ``error`` saying why: the step marked failed, the UI shown it, the snapshot the failure's details."""
        if state is not None:
            state.status = "failed"
        self._status = "failed"
        self._error = error
        self._show()
        raise ApplicationError(error, to_jsonable(self._snapshot()), type=kind, non_retryable=True) from None

    def _past_bound(self, inp: LoopInput) -> bool:
        """Whether the history is past its bound (events; under LOOP_BOUNDS_PATCH, bytes too) or the server
        suggests continuing as new."""
        info = workflow.info()
        return (info.get_current_history_length() > inp.history_bound or info.is_continue_as_new_suggested()
                or (self._bounded and info.get_current_history_size() > HISTORY_BYTES_BOUND))

    def _carried(self, inputs: LoopInputs, window: DerivedWindow, step: StepLedger | None = None,
                 unfinished: TurnState | None = None) -> LoopCarried:
        """What the next run of the chain starts from; ``step``/``unfinished``: the turn whose retries it
        continues (its summary is the next run's to show, its spent counts carried)."""
        messages = [CarriedMessage(i, chat) for i, chat in zip(window.ids(), window.prompt(), strict=True)]
        turns = [t for t in self._kept + self._turns if t is not unfinished][-KEPT_TURNS:]
        spent = None
        if step is not None:
            spent = {f.name: getattr(step, f.name) for f in dataclasses.fields(step) if f.name != "rule"}
        info = workflow.info()
        # A reset run (its id is not the one its record began with) still reusing its base's turns: the next
        # run looks for them too, from this run back (durable_agents.activities.recorded_turns).
        reusing = self._started_as is not None and self._started_as != info.run_id and not self._reuse_ended
        return LoopCarried(next_turn=self._turn, messages=messages, start_id=inputs.start_id,
                           counts=dataclasses.replace(self._counts), turns=turns, runs=self._run_in_chain, step=spent,
                           started_as=info.run_id if reusing else None)

    @staticmethod
    def _crash_point(name: str) -> None:
        """Tests only (docs/crashpoints.md): never on replay, so a resuming worker passes through."""
        if not workflow.unsafe.is_replaying():
            with workflow.unsafe.sandbox_unrestricted():
                crash_point(name)

    # ------------------------------------------------------------ attempts

    async def _attempts(self, step: str, activity: LoopActivity[RequestT, ResultT], request: RequestT,
                        rule: RetryRule, state: TurnState | CallState, *, effect: bool, timeout_of: str) -> ResultT:
        """Attempts of one step (a turn or a call) until it succeeds or the rules give up
        (``durable_agents.steps.retry``)."""
        # A turn asks with the same window on every attempt: an error it gets word for word again and again is
        # the answer to that window, not an outage (StepLedger.after_error; the same rule on every engine).
        repeats = same_error_limit(step) if self._bounded else None
        ledger = self._ledger = StepLedger(step, rule, effect=effect, same_error_limit=repeats)
        spent = self._carried_step
        if spent is not None and spent.get("name") == step:  # continued as new within this turn's retries
            self._carried_step = None
            for name, value in spent.items():
                if name not in ("name", "rule", "same_error_limit") and hasattr(ledger, name):
                    setattr(ledger, name, value)
        attempts = StepAttempts(step, ledger, state, timedelta(seconds=rule.attempt_timeout_for(timeout_of)),
                                timedelta(seconds=rule.heartbeat_timeout_seconds()), self._show,
                                error_text=shown if self._bounded else str)

        def completed(_result: ResultT) -> None:
            state.status = "completed"

        def retrying() -> None:
            if self._bounded and isinstance(state, TurnState) and self._past_bound(self._input):
                # Each attempt records the whole window: the history bound holds within a turn's retries
                # too. The turn is not recorded; the next run asks it, its spending carried.
                assert self._window is not None and self._inputs is not None
                self._crash_point("temporal:loop:continue_as_new")
                workflow.continue_as_new(dataclasses.replace(
                    self._input, carried=self._carried(self._inputs, self._window, ledger, state)))

        return await attempts.run(activity, request, completed=completed, retrying=retrying,
                                  cancelled=lambda ending: self._cancelled(attempts, ending),
                                  failed=lambda err: self._fail(attempts, err))

    def _in_doubt_note(self, state: TurnState | CallState) -> str:
        key = getattr(state, "key", None)
        return ("an attempt's outcome is unknown: the effect may have been applied; the provider answers what "
                f"it applied under key {key} (durable_agents.providerclient.ProviderClient.lookup)")

    def _cancelled(self, attempts: StepAttempts, ending: Ending | None) -> NoReturn:
        """End the run canceled at the step: always raises (``StepAttempts.stopped``)."""
        self._status = "failed"
        self._error = attempts.stopped(ending, self._in_doubt_note(attempts.state))
        self._show()
        raise asyncio.CancelledError(self._error)

    def _fail(self, attempts: StepAttempts, err: ActivityError) -> NoReturn:
        """End the run FAILED (or in doubt) at the step, as its ledger explains: always raises."""
        self._status = "failed"
        self._error = attempts.given_up(self._in_doubt_note(attempts.state))
        self._show()
        raise ApplicationError(self._error, to_jsonable(self._snapshot()), type="StepFailed",
                               non_retryable=True) from err
