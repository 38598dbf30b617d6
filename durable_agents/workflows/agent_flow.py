"""The agent flow as a Temporal workflow: deterministic, no I/O.

Three steps, each an activity whose completion Temporal records in the run's
event history before the next is scheduled. After a crash, a new worker
replays that history: completed activities return their recorded results
without running again, and the flow continues at the first unfinished step.

Retries are decided here, in workflow code, by the rules of ``durable_agents.steps.retry``
(the same rules the run record applies): every activity is scheduled with a
single attempt, and the workflow reads how it ended.

- a transient error (or a live worker's start-to-close timeout) spends the
  step's time budget: the workflow waits out a capped, jittered backoff on a
  durable timer and schedules the next attempt; an error with no budget left
  ends the run FAILED naming the step, the budget and the last error;
- a heartbeat timeout (the worker died) is a *crash*: it spends no budget
  and is retried at once, up to the rule's worker-death limit (a poison pill
  still ends FAILED); a worker's graceful shutdown is retried at once too,
  and is no death;
- a permanent error ends the run FAILED at once; an idempotency conflict the
  step could not adopt (``durable_agents.steps.adoption``) is one;
- every step has at most the rule's ``attempts_per_step`` failed attempts,
  which bounds the run's history whatever its budget.

**A cancel** (``temporal workflow cancel``) ends the run canceled wherever it
lands: in a backoff, or during an attempt. An effect step's attempt is
scheduled with ``WAIT_CANCELLATION_COMPLETED``, so the workflow learns how the
attempt ended (it completed, or stopped mid-request) before it closes the
run, and the step says whether its effect is in doubt.

**A reset** replays the history before its point as it was recorded, and
from the point on every step's budget, death count and attempt limit start
again (``_on_reset``): Temporal gives a reset run a new random seed at that
point, and the SDK calls back, on every replay, at the same place.

Each request is built by ``durable_agents.steps.requests`` (the builders every engine uses)
from the run's inputs and the results so far; each attempt's timeouts come
from ``AgentFlow.attempt_timeouts``, a hook a benchmark overrides
(bench/defaults_flow.py).

Server-side activity retries cannot tell a crash from an error, which is why
the loop lives here. The cost is history: each attempt is its own activity
(id ``<step>/<attempt>``) and each backoff a timer.

Workflow-task failures (an exception in this code that is not an
``ApplicationError``: a bug, a non-determinism error after an incompatible
deploy, an input the new code cannot decode) fail the *task*, not the run:
Temporal retries it with a growing backoff and the run is **parked**, visible
in ``starter.py status``, until compatible code is deployed. The run's
execution timeout, set by the starter above the sum of the step budgets,
bounds how long a run may stay parked. Only ``ApplicationError`` fails a run
from here: the step failures and refused input below.

Runs started before these rules (no ``live-and-honest`` marker in their
history) keep the path they started on (``durable_agents.workflows.before_live``):
server-side retries, no adoption. It stays until no such run is open and
``workflow.deprecate_patch`` can retire it. Within the live path, the
decisions a run's rule names a ``version`` for (``durable_agents.steps.retry``, "What a run
records") follow the version the run recorded: a version 1 run in flight
still takes a shutdown for a death and, during an attempt, a cancel for an
error, as it did when it started.

Only this class is compiled and executed by the sandbox whenever a worker
builds a run afresh (a restart, a cache eviction; every workflow task with
``worker.py --cache 0``); its helpers are imported passed through:
``durable_agents.workflows.attempts`` (the attempt loop this workflow and the agent loop
share, ``StepAttempts``, and how an attempt ended), ``durable_agents.workflows.before_live``,
``durable_agents.workflows.state`` (the dataclasses). They hold no state between runs: a
``StepAttempts`` is made by the run, for one step.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import NoReturn, TypeVar

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from durable_agents.activities import FlowActivities, StepOutput
    from durable_agents.steps.crashpoints import crash_point
    from durable_agents.steps.limits import InputError, check_conversation_id, check_email, check_run_id, check_task
    from durable_agents.steps.models import to_jsonable
    from durable_agents.steps.plan import FLOW, STEP_NAMES
    from durable_agents.steps.requests import RunInputs, draft_request, record_request, send_request
    from durable_agents.steps.retry import RetryRule, StepLedger
    from durable_agents.steps.runstate import RunStateName, describe_step, run_entry
    from durable_agents.workflows.attempts import LIVE_PATCH, Ending, StepAttempts, old_counted_markers
    from durable_agents.workflows.before_live import run_recorded_before_live

    # The run's input and status types live in their own module: this module
    # is executed afresh whenever a worker builds the run again (every
    # workflow task with --cache 0), and building dataclasses was most of
    # that (docs/benchmarks.md, bench/bench_overhead.py).
    from durable_agents.workflows.state import FlowInput, RunStatus, StepState

WORKFLOW_NAME = "AgentFlow"

RequestT = TypeVar("RequestT")
ResultT = TypeVar("ResultT")
# A step's activity, as run() spells it: a FlowActivities method named as its step in durable_agents.steps.plan.
StepActivity = Callable[[FlowActivities, RequestT], Awaitable[StepOutput[ResultT]]]


@workflow.defn(name=WORKFLOW_NAME)
class AgentFlow:
    @workflow.init
    def __init__(self, inp: FlowInput) -> None:
        self._run_id = inp.run_id
        self._steps = [StepState(name) for name in STEP_NAMES]
        self._status: RunStateName = "running"
        self._error: str | None = None
        # What this worker replayed before it ran anything new (see _replay_seen).
        self._replayed: list[str] = []
        self._replayed_events = 0
        # Each step's ledger once it has begun: a reset starts every one afresh.
        self._ledgers: dict[str, StepLedger] = {}
        workflow.register_random_seed_callback(self._on_reset)

    def _on_reset(self, _seed: int) -> None:
        """Temporal reseeds a run's randomness at a reset point, and only there (the
        WorkflowTaskFailed event a reset writes): the SDK calls this at that point
        on the first execution and on every replay, before the code sees anything
        that came after it. The failures before it were decided as the run that
        recorded them decided (same code, same seed, same rule); from here, every
        step starts its budget, death count and attempt limit again
        (``StepLedger.afresh``). A run reset twice passes here twice."""
        for ledger in self._ledgers.values():
            ledger.afresh()

    @workflow.query(name="progress")
    def progress(self) -> RunStatus:
        return self._snapshot()

    def _snapshot(self) -> RunStatus:
        """The run's status in the shared shape, built by ``durable_agents.steps.runstate`` as on every engine."""
        steps = [s.entry() for s in self._steps]
        active = next((s for s in steps if s["status"] in ("running", "retrying")), None)
        detail = describe_step(active) if active is not None and self._status == "running" else None
        return RunStatus.from_entry(run_entry(self._run_id, self._status, steps, error=self._error, detail=detail))

    @workflow.run
    async def run(self, inp: FlowInput) -> RunStatus:
        # First, before the input checks: the marker picks the rules a run runs
        # under, the input rules included. Runs recorded without it keep the path,
        # and the input rules, they started with (durable_agents.workflows.before_live).
        if not workflow.patched(LIVE_PATCH):
            return await run_recorded_before_live(self, inp)
        task, email, conversation_id, rule = self.checked_input(inp)

        info = workflow.info()
        # Both kept by a reset: the start id tells this run's earlier effects from
        # another start of the same id; the memory cut-off keeps the prompt fixed.
        inputs = RunInputs(
            run_id=inp.run_id, task=task, email=email, conversation_id=conversation_id,
            start_id=info.original_execution_run_id, created_at=info.workflow_start_time.timestamp(),
        )

        # durable_agents.steps.plan's steps in its order (tests/test_workflow_bounds.py checks), spelled out:
        # each run's history records these calls, so a change here must be versioned.
        drafted = await self._attempts(FlowActivities.draft, draft_request(inputs, {}), rule)
        sent = await self._attempts(FlowActivities.send_confirmation, send_request(inputs, {"draft": drafted}), rule)
        # Conversation memory is written after the last effect and never read
        # here: what happened is the history above, not memory. The
        # record_outcome activity writes it once the ticket is recorded (best
        # effort), which saves a round trip. It remembers the reply that was
        # really sent, the adopted one if the email step adopted.
        await self._attempts(
            FlowActivities.record_outcome,
            record_request(inputs, {"draft": drafted, "send_confirmation": sent}, remember=True),
            rule,
        )
        self._status = "completed"
        workflow.set_current_details("completed: every step done")
        return self._snapshot()

    def checked_input(self, inp: FlowInput, *, text_rule: bool = True) -> tuple[str, str, str, RetryRule]:
        """(task, email, conversation id, retry rule) from the run's input, cleaned, or the
        run FAILED with the refusal (``durable_agents.steps.limits``: the same words as every entry
        point). ``text_rule``: refuse control characters too; the frozen path's runs
        were checked without (``durable_agents.workflows.before_live``)."""
        try:
            check_run_id(inp.run_id, text_rule=text_rule)
            if inp.run_id != workflow.info().workflow_id:
                # Keys derive from the run id; it must be the workflow id, the
                # one identity that survives resets and continue-as-new.
                raise InputError(
                    f"run id {inp.run_id!r} differs from the workflow id "
                    f"{workflow.info().workflow_id!r}; start runs with starter.py"
                )
            task = check_task(inp.task, text_rule=text_rule)
            email = check_email(inp.email, text_rule=text_rule)
            conversation_id = check_conversation_id(inp.conversation_id or inp.run_id, text_rule=text_rule)
            if inp.timeouts not in ("tuned", "defaults"):  # a compatibility field (durable_agents.workflows.state)
                raise InputError(f"timeouts must be 'tuned' or 'defaults', not {inp.timeouts!r}")
            try:
                rule = RetryRule.from_dict(inp.retry)
            except (TypeError, ValueError) as err:
                raise InputError(f"retry rule {inp.retry!r} is unusable: {err}") from None
        except InputError as err:
            self._status = "failed"
            self._error = f"input refused: {err}"
            raise ApplicationError(self._error, type="InputError", non_retryable=True) from err
        return task, email, conversation_id, rule

    def _show(self, index: int) -> None:
        """What the Temporal UI shows for this run while it is open."""
        state = self._steps[index]
        workflow.set_current_details(
            f"step {index + 1} of {len(self._steps)}, {state.name}: {state.status} (attempt {state.attempts})"
            + (f"; next try at {state.next_try_at}" if state.status == "retrying" else "")
        )

    def attempt_timeouts(self, step: str, rule: RetryRule) -> tuple[timedelta, timedelta | None]:
        """(start-to-close, heartbeat) timeout of every attempt of ``step``: both
        from the rule the run recorded (``durable_agents.steps.retry``), so a deploy that
        changes the defaults never changes a run in flight. The heartbeat
        timeout is how soon a killed worker is noticed; docs/operations.md says
        how it was chosen.

        A hook, and the only one: bench/bench_resume.py registers a subclass
        under the same workflow name, on its own task queue and worker
        (bench/defaults_worker.py), that returns Temporal's defaults instead,
        to measure what these buy. Workflow code: it must stay deterministic."""
        return timedelta(seconds=rule.attempt_timeout_for(step)), timedelta(seconds=rule.heartbeat_timeout_seconds())

    async def _attempts(self, activity: StepActivity[RequestT, ResultT], request: RequestT,
                        rule: RetryRule) -> ResultT:
        """Attempts of one step until it succeeds or the retry rules give up (durable_agents.steps.retry).

        The step is the plan's step named as ``activity`` (``durable_agents.steps.plan``; an
        activity's method is named as its step): the plan gives its position
        and whether it has an effect."""
        index = STEP_NAMES.index(activity.__name__)
        state = self._steps[index]
        ledger = self._ledgers[state.name] = StepLedger(state.name, rule, effect=FLOW[index].effect)

        def deciding(ending: Ending) -> None:
            if ending.kind != "permanent":
                self._answer_retired_markers(state.name, ledger.attempts)

        def completed(output: StepOutput[ResultT]) -> None:
            # the effects' results have it (durable_agents.steps.adoption)
            adopted = getattr(output.result, "adopted", None)
            state.status = "adopted" if adopted else "completed"
            state.result = to_jsonable(output.result)
            state.note = adopted["reason"] if adopted else None
            # Crash point (tests only, docs/crashpoints.md): the completion is in history, the next
            # activity not yet scheduled. Never on replay, so a resuming worker passes through.
            if not workflow.unsafe.is_replaying():
                with workflow.unsafe.sandbox_unrestricted():
                    crash_point(f"temporal:{state.name}:after_record")

        attempts = StepAttempts(state.name, ledger, state, *self.attempt_timeouts(state.name, rule),
                                lambda: self._show(index), seen=self._replay_seen, deciding=deciding)
        output = await attempts.run(activity, request, completed=completed,
                                    cancelled=lambda ending: self._cancelled(attempts, ending),
                                    failed=lambda err: self._fail(attempts, err))
        return output.result

    @staticmethod
    def _answer_retired_markers(step: str, attempt: int) -> None:
        """Replay the retired ``COUNTED_PATCH`` markers a reset run recorded before this
        change, one per failure it decided on itself (``durable_agents.workflows.attempts``).

        A marker in history must meet the same ``workflow.patched`` call on replay;
        asking for one the history does not hold answers False and records nothing,
        so asking is harmless, and only done while replaying: new decisions record
        no marker. The decisions themselves do not depend on the answer (a reset
        now starts the budgets afresh where Temporal reseeds the run, ``_on_reset``,
        which gives the counts the markers gave). A marker carries the id of the run
        that wrote it, which may be a run between two resets: it is found among those
        the SDK was told of (``old_counted_markers``)."""
        if not workflow.unsafe.is_replaying():
            return
        # By the markers the history holds, not by comparing run ids: a replay outside a
        # worker (the Replayer, tests/test_replay_fixtures.py) gives every run the
        # original run's id.
        for marker in old_counted_markers(step, attempt):
            workflow.patched(marker)

    def _replay_seen(self, what: str) -> None:
        """Make the replay visible. Called where the code gets an activity's outcome
        or a timer: while replaying, that outcome is the one recorded in history
        (the activity is not executed again); the first one that is not a replay
        is new, and the worker says what it replayed to get there. With the
        worker's cache that is only after the instance was lost (a restart, an
        eviction); with ``--cache 0``, every workflow task."""
        if workflow.unsafe.is_replaying():
            self._replayed.append(what)
            self._replayed_events = workflow.info().get_current_history_length()
        elif self._replayed:
            workflow.logger.info(
                "replayed %d history events of run %s: %s came from history, not executed again",
                self._replayed_events, self._run_id, ", ".join(self._replayed),
            )
            self._replayed = []

    def _cancelled(self, attempts: StepAttempts, ending: Ending | None) -> NoReturn:
        """End the run canceled at the step: always raises (``StepAttempts.stopped``)."""
        self._status = "failed"
        self._error = attempts.stopped(
            ending, "canceled during an attempt whose outcome is unknown: the effect may have been applied; "
                    f"`python starter.py settle {self._run_id}` asks the provider")
        workflow.set_current_details(self._error)
        raise asyncio.CancelledError(self._error)

    def _fail(self, attempts: StepAttempts, err: ActivityError) -> NoReturn:
        """End the run FAILED (or in doubt) at the step, as its ledger explains: always raises."""
        self._status = "failed"
        self._error = attempts.given_up("an attempt's outcome is unknown: the effect may have been applied; "
                                        f"`python starter.py settle {self._run_id}` asks the provider")
        raise ApplicationError(
            self._error, to_jsonable(self._snapshot()), type="StepFailed", non_retryable=True
        ) from err
