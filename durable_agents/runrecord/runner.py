"""The runner: drives a run's steps in order against the run record.

A run's steps are what its plan says (``durable_agents.runrecord.plans``): the fixed flow
(every step known at start), or the agent loop (``durable_agents.steps.loop``: the plan
grows as turns are recorded, each recorded turn adding its tool calls and the
next turn). The plan only says what comes next; everything below is one
machinery for both.

One loop, whatever brought us here (start, or resume after a SIGKILL):

1. read the run; take (or hold) its lease; check the recorded step names
   against the plan's (the flow's; a loop run's ``LoopPlan.names`` of its
   recorded results);
2. at the current position, start an attempt: its number and, for an
   effectful step, its *intent* (idempotency key and request) are committed
   before the step function can send anything. On the happy path this commit
   is the previous step's commit (see ``RunRecord.complete_step``); after a
   crash, a new attempt is committed first. An attempt recorded as started
   with no outcome (``attempt_open``) is a *crash*: it spends no error budget
   and counts toward the worker-death limit (``durable_agents.steps.retry``);
3. call the step function (``durable_agents.steps.flow``, shared with Temporal), logging
   ``step <name> started: run <id> attempt <n>`` (``durable_agents.steps.startedline``);
4. success: result + intent outcome + the steps the result adds to the plan
   (a loop turn: its calls and the next turn, as step rows) + advance (+ next
   attempt and intent) in ONE transaction, so a turn is recorded before any of
   its calls runs and a call's intent before its request can be sent.
   Transient failure: record it with the step's ledger (the
   budget spent, whether the outcome is in doubt, when the next try is due),
   wait the backoff, next attempt. Non-retryable (``PermanentError``,
   ``InputError``), budget spent, a death too many, or (a loop's turn) the
   same error on ``SAME_ERROR_LIMIT`` attempts in a row: the run becomes
   failed, naming the step, the attempts and the reason. Nothing loops.

Crash points: the plan's (``durable_agents.runrecord.plans``), reached here around each
step: for the fixed flow ``runrecord:S:after_start`` / ``after_intent``
before a step and ``runrecord:S:after_record`` after its commit; for the
agent loop ``runrecord:loop:between_calls`` and ``runrecord:loop:after_turn``
after a call's commit. ``runrecord`` (the package) has the table.

The rules and numbers are ``durable_agents.steps.retry``'s, the same as the Temporal
workflow's; the rule is read from the environment at ``start`` and recorded
with the run, so a resume runs under the numbers the run started with.

At-least-once, plus the provider's idempotency, gives each effect exactly
once: an intent left ``in_doubt`` by a crash is settled by repeating the
request with the same key; the provider replays its first answer.

The lease (``RunRecord.acquire_lease``) keeps two processes from driving one
run: holder ``host:pid:start:random``, an expiry renewed by every commit and
by a heartbeat thread every third of the lease. A holder that is a dead
process of this host (``durable_agents.runrecord.lease``) is taken over at once; any other
is refused, or waited out with ``resume(wait=True)``. It is a liveness
device, not a fence for the provider: a process paused longer than its lease
can have its in-flight request overlap the new holder's; the idempotency key
keeps that to one effect, and the holder check on every commit keeps the
stale process from writing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import random
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from durable_agents.memory import chat_tokens
from durable_agents.runrecord.lease import new_holder_id
from durable_agents.runrecord.plans import (
    FLOW_WORDS,
    LOOP_NUMBERS,
    LoopRunPlan,
    PlannedStep,
    RunPlan,
    flow_inputs,
    plan_for,
)
from durable_agents.runrecord.status import attempts_text, why_in_doubt
from durable_agents.runrecord.store import (
    Intent,
    LeaseHeld,
    LeaseLost,
    NextAttempt,
    RecordError,
    RecordRunNotFound,
    RunEnded,
    RunRecord,
    RunRow,
    StepRow,
)
from durable_agents.steps import approval as approvals
from durable_agents.steps import loop
from durable_agents.steps.controls import printable
from durable_agents.steps.crashpoints import crash_point
from durable_agents.steps.errors import PermanentError, StepError, TransientError
from durable_agents.steps.limits import InputError, check_conversation_id, check_email, check_run_id, check_task
from durable_agents.steps.models import to_jsonable
from durable_agents.steps.params import check_params
from durable_agents.steps.plan import FLOW, FlowStep, missing_params
from durable_agents.steps.requests import RunInputs
from durable_agents.steps.retry import RetryRule, StepLedger, rule_from_env
from durable_agents.steps.served import REFUND, Served, find
from durable_agents.steps.settle import answer_text, what_retry_does
from durable_agents.steps.startedline import started_line

DEFAULT_FLOW: tuple[FlowStep, ...] = FLOW
"""The flow a ``Runner`` drives unless given another: ``durable_agents.steps.plan``'s, the one
every engine runs (``python -m durable_agents.runrecord`` runs ``LAB_FLOW``'s if set:
``durable_agents.steps.plan.flow_from_env``). Each step's function, request builder and
effect kind are looked up in the flow given, never named here. Requests are
built by ``durable_agents.steps.requests`` from the run's inputs (its parameters included)
and the recorded results of earlier steps, never from memory, so a resumed
process sends exactly what the crashed one would have sent."""
DEFAULT_LEASE_SECONDS = 10.0
DEFAULT_WAIT_LIMIT = 600.0  # resume --wait: at most this long behind a holder that keeps renewing
APPROVAL_POLL_SECONDS = 0.25  # how often a waiting call reads the record for its decision
_WAIT_POLL = 0.1  # a dead local holder is noticed within this; each look is one short transaction


class FlowChanged(RecordError):
    """The record was written by a different flow definition than the code's."""


class LeaseWaitTimedOut(LeaseHeld):
    """``resume --wait`` gave up: the holder kept its lease for the whole wait limit."""

    def __init__(self, held: LeaseHeld, waited: float) -> None:
        RecordError.__init__(
            self,
            f"gave up after waiting {waited:.0f} s (the wait limit): run {held.run_id} is still held by "
            f"{held.holder}" + (f" ({held.why})" if held.why else "") + f", its lease now until "
            f"{_at(held.expires_at)}. A holder that keeps renewing is alive and running: see "
            f"`python -m durable_agents.runrecord status {held.run_id}`, "
            "or wait longer with --wait --wait-limit SECONDS.",
        )
        self.run_id, self.holder, self.expires_at, self.why = held.run_id, held.holder, held.expires_at, held.why


class RunTerminal(RecordError):
    """The run failed; failed is terminal, so it is not resumed."""

    def __init__(self, run_id: str, error: str | None) -> None:
        super().__init__(
            f"run {run_id} failed and failed is terminal, so it is not resumed: {error}. "
            f"Once the cause is fixed, `python -m durable_agents.runrecord retry {run_id}` "
            "restarts it at the failed step "
            "(same keys, nothing completed runs again)."
        )
        self.error = error


@dataclass(frozen=True)
class StartedAttempt:
    """An attempt the record holds as started (intent and all), with the request to send.

    The commit that completes a step starts the next step's first attempt
    (``RunRecord.complete_step``: one commit per step), as ``start``'s creation
    of the run starts the first; the loop then runs that attempt as it is, with
    the very request its intent holds: no second start, no request built again."""

    position: int
    attempt: int
    request: Any  # None: a step without an effect, its request built when it runs (``_one_step``)

    def is_current(self, position: int, row: StepRow) -> bool:
        """True while the record still says this is the step's current attempt."""
        return self.position == position and self.attempt == row.attempts and row.status == "running"


def lease_seconds_from_env(env: Mapping[str, str] | None = None) -> float:
    env = os.environ if env is None else env
    raw = env.get("RUNRECORD_LEASE_SECONDS") or str(DEFAULT_LEASE_SECONDS)
    return check_lease_seconds(raw, "RUNRECORD_LEASE_SECONDS")


def check_lease_seconds(raw: Any, name: str = "--lease-seconds") -> float:
    try:
        value = float(raw)
        if not 0.2 <= value <= 3600:
            raise ValueError
    except (TypeError, ValueError):
        raise InputError(f"{name}={raw!r} must be a number of seconds between 0.2 and 3600") from None
    return value


def check_flow(run: RunRow, flow: Sequence[FlowStep]) -> None:
    """Refuse (``FlowChanged``) a flow run whose recorded step names are not ``flow``'s."""
    check_names(run, [s.name for s in flow], FLOW_WORDS)


def check_plan(run: RunRow, plan: RunPlan) -> None:
    """Refuse (``FlowChanged``) a run whose recorded step names are not the ones its plan expects from the
    recorded results: a flow run's, the flow's; a loop run's, ``LoopPlan.names`` of its recorded results;
    and a loop run started under another loop (``durable_agents.steps.loop.loop_changed``)."""
    check_names(run, plan.expected(run.results()), plan.words)
    changed = None
    if isinstance(plan, LoopRunPlan):
        served = plan.served
        changed = loop.loop_changed((run.loop or {}).get("signature"), served.agent.tools,
                                    "" if served.name == REFUND.name else served.name)
    if changed is not None:
        raise FlowChanged(f"run {run.run_id} was not resumed: {changed}. Resuming would run it under another "
                          "loop, so nothing was done. Resume it with the code that started it, or start a new "
                          "run id with this code.")


def check_names(run: RunRow, expected: Sequence[str], words: str) -> None:
    """``words``: how the refusal says what the record holds and what the code expects, with ``{recorded}``
    and ``{code}`` for the two lists (``durable_agents.runrecord.plans``)."""
    recorded = [s.name for s in run.steps]
    code = list(expected)
    if recorded == code:
        return
    where = next((i for i, (a, b) in enumerate(zip(recorded, code, strict=False)) if a != b),
                 min(len(recorded), len(code)))
    at = (
        f"position {where + 1} is {recorded[where] if where < len(recorded) else 'absent'!r} in the record "
        f"but {code[where] if where < len(code) else 'absent'!r} in the code"
    )
    raise FlowChanged(
        f"run {run.run_id} {words.format(recorded=recorded, code=code)} ({at}). "
        "Resuming would run the wrong step, so nothing was done. Resume it with the code that started it, "
        "or start a new run id with this code."
    )


class _Heartbeat(threading.Thread):
    """Renews the lease every third of its duration, on its own connection."""

    def __init__(self, path: Path, run_id: str, holder: str, lease_seconds: float) -> None:
        super().__init__(name=f"lease-heartbeat-{run_id}", daemon=True)
        self.path, self.run_id, self.holder, self.lease_seconds = path, run_id, holder, lease_seconds
        self.lost = False
        self._halt = threading.Event()

    def run(self) -> None:
        record = RunRecord(self.path)
        try:
            while not self._halt.wait(self.lease_seconds / 3):
                try:
                    if not record.renew_lease(self.run_id, self.holder, self.lease_seconds):
                        self.lost = True
                        return
                except sqlite3.OperationalError:
                    continue  # busy for 5 s: the runner is committing, which renews too
        finally:
            record.close()

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=10)


def _clock() -> str:
    return time.strftime("%H:%M:%S")


def _at(ts: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ts))


class Runner:
    """Drives runs of ``flow`` recorded in the SQLite file at ``path``.

    ``deps`` is the steps' ``StepDeps`` (built by the caller, e.g. ``durable_agents.wiring.deps_from_env()``).
    ``say`` receives one line per event (default: print, flushed).
    """

    def __init__(
        self,
        path: str | os.PathLike,
        deps: Any,
        *,
        flow: Sequence[FlowStep] = DEFAULT_FLOW,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        holder: str | None = None,
        say: Callable[[str], None] | None = None,
        sleep: Callable[[float], Any] = asyncio.sleep,
        heartbeat: bool = True,
        rule: RetryRule | None = None,
        agents: Sequence[Served] = (),
    ) -> None:
        self.path = Path(path)
        self.deps = deps
        # The agents a loop run may name (durable_agents.steps.served): the refund agent, its tools given deps, and
        # these.
        self.served = {REFUND.name: REFUND, **{s.name: s for s in agents}}
        self.flow = tuple(flow)
        self.lease_seconds = lease_seconds
        self.holder = holder or new_holder_id()
        # Lines quote run data (errors, adopted reasons): escaped for the terminal.
        self.say = say or (lambda line: print(printable(line), flush=True))
        self.sleep = sleep
        self.heartbeat = heartbeat
        self.rule = rule  # for new runs; None: from the environment at start
        self.record = RunRecord(self.path)

    def close(self) -> None:
        self.record.close()

    # ------------------------------------------------------------ entry points

    async def start(self, run_id: str, task: str, email: str, conversation_id: str | None = None, *,
                    params: Mapping[str, Any] | None = None) -> RunRow:
        """Create the run (``RunExists`` if the id is taken) and drive it to the end. ``params``: the run's
        parameters (``durable_agents.steps.params``), recorded with it for the steps that read them."""
        run_id = check_run_id(run_id)
        inputs = RunInputs(
            run_id=run_id,
            task=check_task(task),
            email=check_email(email),
            conversation_id=check_conversation_id(conversation_id or run_id),
            params=check_params(params),
        )
        missing = missing_params(self.flow, inputs.params)
        if missing is not None:
            raise InputError(f"run {run_id} was not started: {missing}")
        rule = self.rule or rule_from_env()
        start_id = secrets.token_hex(8)
        first = self.flow[0]
        # The creation time is fixed by the record's clock in create_run; the
        # first request is rebuilt from the row so it carries exactly that.
        probe = first.request(inputs, {})
        nxt = NextAttempt(0, 1, self._intent(first, probe))
        self.record.create_run(
            run_id, inputs.task, inputs.email, inputs.conversation_id,
            [s.name for s in self.flow], self.holder, self.lease_seconds, nxt,
            start_id=start_id, retry_rule=rule.to_dict(), params=inputs.params,
        )
        request = first.request(self._inputs(self.record.load(run_id)), {})
        self.say(f"run {run_id} created in {self.path}; lease held by {self.holder}")
        return await self._drive(run_id, ahead=StartedAttempt(0, 1, request))

    async def start_loop(self, run_id: str, task: str, email: str = "", *, max_turns: int | None = None,
                         window_tokens: int | None = None, window_messages: int | None = None,
                         agent: str = "", params: Mapping[str, str] | None = None, agent_spec: str = "") -> RunRow:
        """Create a run of the agent loop (``durable_agents.steps.loop``; ``RunExists`` if the id is taken) and drive it
        to the end. ``agent``: the name of the agent it is run by, one this runner serves ("": the refund agent,
        whose one parameter is ``email``); ``params`` the run's parameters that agent declares; ``agent_spec``
        its import string, recorded so that a resume can load it. Its numbers (the turn limit, the window's
        bounds; the agent's unless given) are recorded with it (``runs.loop``), so a resume decides and derives
        its windows under the numbers it started with. Bad input is an ``InputError`` and nothing is recorded."""
        run_id = check_run_id(run_id)
        task = check_task(task)
        served = find(self.served, agent, "this process")
        lab = served.name == REFUND.name
        if lab:
            email, checked_params = check_email(email), None
        else:
            email, checked_params = "", served.check_params(params)
        decl = served.agent
        checked = loop.check_loop_inputs(
            decl.max_turns if max_turns is None else max_turns,
            decl.window_tokens if window_tokens is None else window_tokens,
            decl.window_messages if window_messages is None else window_messages,
            loop.start_tokens(task, chat_tokens, decl.instructions))
        # With the numbers, what decides the run's behaviour: the loop's shape, checked on every resume, and
        # what the model is told, which every turn is asked with (durable_agents.steps.loop.loop_signature); for an
        # agent of the user's, its name, parameters and import string.
        numbers: dict[str, Any] = {**dict(zip(LOOP_NUMBERS, checked, strict=True)),
                                   "signature": list(served.signature), "instructions": loop.instructions(decl)}
        if not lab:
            numbers.update(agent=served.name, params=checked_params, agent_spec=agent_spec)
        rule = self.rule or rule_from_env()
        # The model's first turn has no effect: no intent; its request (the window) is built when it runs.
        self.record.create_run(
            run_id, task, email, run_id, [loop.LoopPlan.first()], self.holder, self.lease_seconds,
            NextAttempt(0, 1, None), start_id=secrets.token_hex(8), retry_rule=rule.to_dict(), loop=numbers,
        )
        self.say(f"loop run {run_id} created in {self.path} (at most {numbers['max_turns']} turns); "
                 f"lease held by {self.holder}")
        return await self._drive(run_id, ahead=StartedAttempt(0, 1, None))

    async def resume(self, run_id: str, *, wait: bool = False, wait_limit: float = DEFAULT_WAIT_LIMIT) -> RunRow:
        """Continue a run at its recorded step. A completed run is returned as is.

        A dead holder of this host is taken over at once (``durable_agents.runrecord.lease``).
        With ``wait``, any other holder is waited out: until it releases the
        lease, lets it expire or dies, for at most ``wait_limit`` seconds.
        Raises ``RecordRunNotFound``, ``RunTerminal`` (failed run), ``FlowChanged``,
        ``LeaseHeld`` (another process that may be alive runs it; with
        ``wait``, ``LeaseWaitTimedOut``) or ``LeaseLost``.
        """
        run = self.record.load(check_run_id(run_id))
        if run.status == "completed":
            # A crash after the last commit may have skipped the memory append; it is idempotent.
            await self._remember(run)
            return run
        if run.status == "failed":
            raise RunTerminal(run_id, run.error)
        check_plan(run, self._plan(run))
        try:
            await self._take_lease(run_id, wait, wait_limit)
        except RunEnded as ended:
            # It completed (or failed) after we read it: take no lease; answer as for an ended run.
            self.say(f"run {run_id} became {ended.status} before this resume could take its lease; no step to run")
            return await self.resume(run_id)
        self.say(f"resuming run {run_id} at step {run.steps[run.position].name}; lease held by {self.holder}")
        self.say(self._what_was_read(run))
        return await self._continue(run_id)

    @staticmethod
    def _what_was_read(run: RunRow) -> str:
        """Resuming is reading: the rows this resume read, and what it takes from them."""
        rows = []
        for s in run.steps:
            if s.status == "completed":
                rows.append(f"{s.name} completed (its recorded result is used; it is not run again)")
            elif s.status == "running":
                rows.append(f"{s.name} running, attempt {s.attempts}"
                            + (" with no outcome recorded (its process died)" if s.attempt_open else ""))
            else:
                rows.append(f"{s.name} {s.status}")
        return (f"read the record of run {run.run_id}: the run row (position {run.position}) and its step rows: "
                + "; ".join(rows))

    async def restart_failed(self, run_id: str) -> RunRow:
        """Restart a failed run at its failed step (``python -m durable_agents.runrecord retry``):
        fresh error budget and crash count, the same keys (what was applied is
        replayed or adopted), nothing completed run again. ``RunNotFailed`` if
        the run did not fail."""
        run = self.record.load(check_run_id(run_id))
        if run.loop is not None and loop.reached_turn_limit(run.error):
            raise InputError(f"run {run_id} reached its turn limit ({run.error}); a retry would ask that turn again "
                             "under the same limit. Start a new RUN_ID with a higher --max-turns.")
        check_plan(run, self._plan(run))
        position = self.record.reopen_failed(run_id, self.holder, self.lease_seconds)
        self.say(f"retrying run {run_id} at step {run.steps[position].name} (it failed: {run.error}); "
                 f"lease held by {self.holder}")
        return await self._continue(run_id)

    async def _continue(self, run_id: str) -> RunRow:
        run = self.record.load(run_id)
        intents = self.record.intents(run_id)
        for intent in intents:
            if intent.state == "in_doubt":
                self.say(
                    f"intent in doubt: {intent.step} attempt {intent.attempt} (Idempotency-Key "
                    f"{intent.idempotency_key}): {why_in_doubt(run, intent)}; repeating it with the same key"
                    + (" (its tool asks its lookup first: an effect applied under the key is taken, not sent again)"
                       if run.loop is not None else "")
                )
        # The step about to run, settled by `settle` while the run was failed: say what the provider answered.
        answered = [i for i in intents if i.position == run.position and "settled_by_provider" in (i.outcome or {})]
        if answered:
            answer = answered[-1].outcome["settled_by_provider"]
            self.say(f"settled by `settle`: {answered[-1].step} {attempts_text([i.attempt for i in answered])} "
                     f"(Idempotency-Key {answered[-1].idempotency_key}): the provider said {answer_text(answer)}; "
                     f"{what_retry_does(answer)}")
        return await self._drive(run_id, ahead=None)

    async def _take_lease(self, run_id: str, wait: bool, wait_limit: float) -> None:
        """Take the lease; with ``wait``, poll until it can be taken, for at most ``wait_limit`` seconds.

        Each poll is one short transaction (``acquire_lease``) every
        ``_WAIT_POLL`` seconds, so a release, an expiry or the holder's death
        is acted on within that. The holder's expiry is the expected end of
        the wait; it moves only while the holder renews it, i.e. is alive and
        working, and ``wait_limit`` bounds that.
        """
        started = time.monotonic()
        seen: LeaseHeld | None = None  # the first sight of the current holder
        renewed = False
        while True:
            try:
                taken = self.record.acquire_lease(run_id, self.holder, self.lease_seconds)
            except LeaseHeld as held:
                waited = time.monotonic() - started
                if not wait:
                    raise
                if waited >= wait_limit:
                    raise LeaseWaitTimedOut(held, waited) from None
                if seen is None or seen.holder != held.holder:
                    seen, renewed = held, False
                    self.say(f"waiting: run {run_id} is held by {held.holder} ({held.why}); its lease expires at "
                             f"{_at(held.expires_at)}; taking over when it ends, expires or its process dies")
                elif not renewed and held.expires_at > seen.expires_at:
                    renewed = True
                    self.say(f"  {held.holder} renewed its lease (now until {_at(held.expires_at)}): it is alive "
                             f"and running; waiting for it at most until {_at(time.time() + wait_limit - waited)}")
                await asyncio.sleep(min(_WAIT_POLL, wait_limit - waited))
                continue
            except sqlite3.OperationalError:
                # Locked past busy_timeout: a writer is stuck (paused) mid-transaction. Waiting is what --wait asks.
                if not wait or time.monotonic() - started >= wait_limit:
                    raise
                await asyncio.sleep(_WAIT_POLL)
                continue
            if taken is not None:
                self.say(f"took over the lease of {taken.holder} before its expiry: {taken.reason}")
            elif seen is not None:
                self.say(f"the lease of {seen.holder} was released or expired; waited "
                         f"{time.monotonic() - started:.1f} s")
            return

    # ------------------------------------------------------------ the loop

    def _plan(self, run: RunRow) -> RunPlan:
        """What comes next in ``run`` (``durable_agents.runrecord.plans``): a loop run's plan if its row says it is one,
        else this runner's flow."""
        return plan_for(run, self.flow, self.served)

    async def _remember(self, run: RunRow) -> None:
        """After completion, what the plan does once a run is done: a flow run's exchange goes to
        conversation memory (as on Temporal). Best effort and idempotent by message id; memory is never
        read to decide what has been done, so nothing here touches the record."""
        await self._plan(run).finished(run, self.deps)

    @staticmethod
    def _intent(step: PlannedStep | FlowStep, request: Any) -> Intent | None:
        return Intent(request.idempotency_key, to_jsonable(request)) if step.effect else None

    async def _drive(self, run_id: str, ahead: StartedAttempt | None) -> RunRow:
        beat = _Heartbeat(self.path, run_id, self.holder, self.lease_seconds) if self.heartbeat else None
        if beat:
            beat.start()
        try:
            while True:
                run = self.record.load(run_id)
                if run.status == "completed":
                    await self._remember(run)
                if run.status != "running":
                    return run
                ahead = await self._one_step(run, ahead, beat)
        except BaseException as err:
            # Graceful exits (Ctrl-C, SIGTERM, a bug) hand the lease back at once;
            # SIGKILL cannot, and the lease then frees itself at expiry.
            if not isinstance(err, LeaseLost):
                try:
                    self.record.release_lease(run_id, self.holder)
                except sqlite3.Error:
                    pass
            raise
        finally:
            if beat:
                beat.stop()

    @staticmethod
    def _inputs(run: RunRow) -> RunInputs:
        return flow_inputs(run)

    async def _one_step(self, run: RunRow, ahead: StartedAttempt | None,
                        beat: _Heartbeat | None) -> StartedAttempt | None:
        """One attempt of the run's current step, to its recorded outcome. Returns the next
        step's first attempt when this one's commit started it, else None (the loop reads
        the record again)."""
        plan, row, results = self._plan(run), run.steps[run.position], run.results()
        step = plan.step(row.name, results)
        ledger = self._ledger(run, step, row)
        refusal = self._after_a_refusal(run, step.name, results)
        if refusal is None and step.approval is not None:
            # A call that waits for a person: its decision (read, or waited for) before its first attempt, and
            # on every attempt after it (a denied call killed mid-refusal is refused again, never run).
            outcome, refusal = await self._decided(run, plan, step, results, beat)
            if outcome == "expired" and step.approval.get("on_expiry") == "fail":
                ledger.after_permanent(f"{refusal} ({approvals.EXPIRY_FAILS})")
                self._fail(run.run_id, step, run.position, ledger)
                return None
            if refusal is not None:
                step = dataclasses.replace(step, kind=None)  # refused: no request, so no intent to record
        attempt = ahead if ahead is not None and ahead.is_current(run.position, row) else None
        if attempt is None:
            attempt = await self._open_attempt(run, plan, step, row, ledger)
            if attempt is None:
                return None  # a death too many: the run failed
        ledger.attempts = attempt.attempt
        if beat is not None and beat.lost:
            raise LeaseLost(run.run_id, self.holder)
        point = plan.point_before(step)
        if point:
            crash_point(point)
        self.say(started_line(step.name, run.run_id, attempt.attempt))
        began = time.monotonic()
        try:
            # A step without an effect has no intent to carry its request: it is built now, from the record
            # (a loop turn's window, derived; a turn that cannot be built fails here, naming why).
            request = attempt.request if attempt.request is not None else plan.request(step.name, results)
            if refusal is not None:  # denied, or no decision by the deadline: refused, nothing applied
                result = loop.refused_call(request, refusal)
            else:
                result = await self._call(step, request, ledger.rule.attempt_timeout_for(step.name),
                                          attempt.attempt)
        except (PermanentError, InputError) as err:
            ledger.after_permanent(str(err))
            self._fail(run.run_id, step, run.position, ledger)
            return None
        except Exception as err:  # TransientError, and anything unexpected: retried within the budget
            await self._after_error(run, step, ledger, err, time.monotonic() - began)
            return None
        return self._complete(run, plan, step, attempt.attempt, to_jsonable(result))

    def _after_a_refusal(self, run: RunRow, name: str, results: Mapping[str, Any]) -> str | None:
        """The refusal of a loop call after one of its turn a person did not approve (denied, or its deadline
        passed): ``durable_agents.steps.approval.not_run_after``; None for any other step. The record is read
        only when an earlier call of the turn waited (its recorded turn says so): not on every call."""
        if run.loop is None or "/" not in name:
            return None
        turn, index = loop.parse_step(name)
        calls = (results.get(loop.turn_step(turn)) or {}).get("calls") or []
        if index is None or not any(loop.as_call(c).approval for c in calls[:index]):
            return None
        for wait, _, outcome in self.record.approvals(run.run_id):
            earlier_turn, earlier = loop.parse_step(wait.call)
            if earlier_turn == turn and earlier is not None and earlier < index and outcome in ("denied", "expired"):
                return approvals.not_run_after(wait.call)
        return None

    async def _decided(self, run: RunRow, plan: RunPlan, step: PlannedStep, results: Mapping[str, Any],
                       beat: _Heartbeat | None) -> tuple[str, str | None]:
        """A waiting call's outcome (``approved``, ``denied``, ``expired``) and, unless approved, the refusal the
        model is given. The wait is recorded once (its deadline kept across resumes); a decision is taken by
        ``decide`` (``approve``/``deny`` on the command line), from any process, and read here every
        ``APPROVAL_POLL_SECONDS``; at the deadline with none, the wait expires."""
        wait, decided, outcome = self.record.approval(run.run_id, step.name)
        assert step.approval is not None
        if outcome is None:
            if wait is None:
                request = plan.request(step.name, results)
                tools = getattr(getattr(plan, "served", None), "agent", None)
                checked = loop.checked_arguments(request.call, tools.tools) if tools is not None else {}
                wait = self.record.open_wait(run.run_id, approvals.new_wait(
                    run.run_id, step.name, request.call.name, checked if isinstance(checked, dict) else {},
                    request.idempotency_key, step.approval, time.time()))
            self.say(f"  {_clock()} {step.name}: waits for a person's decision on {wait.tool} until "
                     f"{_at(wait.until)} (key {wait.key}): python -m durable_agents.runrecord approve "
                     f"{run.run_id} {step.name} --by NAME (or deny ... --reason TEXT)")
            crash_point("approval:waiting")
            while outcome is None:
                if beat is not None and beat.lost:
                    raise LeaseLost(run.run_id, self.holder)
                left = wait.until - time.time()
                if left <= 0:
                    self.record.expire(run.run_id, step.name)
                else:
                    await asyncio.sleep(min(APPROVAL_POLL_SECONDS, left))
                _, decided, outcome = self.record.approval(run.run_id, step.name)
            self.say(f"  {_clock()} {step.name}: {decided.said() if decided else 'no decision by the deadline'}")
            crash_point("approval:decided")
        assert wait is not None
        if outcome == "approved":
            return outcome, None
        if outcome == "denied" and decided is not None:
            return outcome, approvals.denied_result(decided)
        return "expired", approvals.expired_result(wait)

    @staticmethod
    def _ledger(run: RunRow, step: PlannedStep, row: StepRow) -> StepLedger:
        """The step's ledger as the record holds it, under the rule the run recorded at start; a loop turn's
        with its row of the same error (``durable_agents.steps.loop.same_error_limit``, as on the other engines)."""
        return StepLedger(
            step.name, RetryRule.from_dict(run.retry_rule), effect=step.effect, attempts=row.attempts,
            error_attempts=row.error_attempts, error_seconds=row.error_seconds, crashes=row.crashes,
            failed_attempts=row.error_attempts + row.crashes,  # the record has no resets to start it again
            in_doubt=row.in_doubt, last_error=row.last_error,
            same_error_limit=loop.same_error_limit(step.name) if run.loop is not None else None,
            same_errors=row.same_errors, same_error=row.same_error,
        )

    async def _open_attempt(self, run: RunRow, plan: RunPlan, step: PlannedStep, row: StepRow,
                            ledger: StepLedger) -> StartedAttempt | None:
        """Commit a new attempt of the step (and, for a step with an effect, its intent) before anything
        is sent.

        First what the record says of the attempt before: one still open died
        with its process (a crash: None if it was one too many, and the run
        failed); a backoff a death interrupted is waited out, as the rule says."""
        request = plan.request(step.name, run.results()) if step.effect else None
        crashes = None
        if row.attempt_open and row.attempts > 0:
            died = f"the process running attempt {row.attempts} died before recording its outcome"
            if not ledger.after_crash(died):
                self._fail(run.run_id, step, run.position, ledger, answered=False)
                return None
            crashes = ledger.crashes
        elif row.next_try_at is not None and row.next_try_at > time.time():
            # A process died during the backoff: the wait is part of the rule, not skipped.
            await self.sleep(row.next_try_at - time.time())
        started = StartedAttempt(run.position, row.attempts + 1, request)
        self.record.begin_attempt(run.run_id, step.name,
                                  NextAttempt(started.position, started.attempt, self._intent(step, request), crashes),
                                  self.holder, self.lease_seconds)
        return started

    async def _call(self, step: PlannedStep, request: Any, limit: float, attempt: int) -> Any:
        """The step function, given ``limit`` seconds (the attempt timeout), told its ``attempt`` number (a
        loop call's retry asks its tool's lookup first: ``durable_agents.steps.loop.CALL_ATTEMPT``). An attempt still
        running then may have sent its request: a transient error, in doubt."""
        loop.CALL_ATTEMPT.set(attempt)
        try:
            return await asyncio.wait_for(step.run(request, self.deps), limit)
        except TimeoutError:
            raise TransientError(f"timed out after {limit:g} s (the attempt timeout)", in_doubt=True) from None

    async def _after_error(self, run: RunRow, step: PlannedStep, ledger: StepLedger, err: Exception,
                           seconds: float) -> None:
        """A retryable failure: the run fails if the ledger says the budget is spent; else
        the error is recorded with the ledger and the backoff waited."""
        reason = err.message if isinstance(err, StepError) else f"{type(err).__name__}: {err}"
        # An unexpected exception says nothing of an effect's request: it may have been applied.
        doubtful = err.in_doubt if isinstance(err, StepError) else step.effect
        delay = ledger.after_error(reason, seconds, retry_after=getattr(err, "retry_after", None),
                                   in_doubt=doubtful, u=random.random(), outage=getattr(err, "outage", False))
        if delay is None:
            self._fail(run.run_id, step, run.position, ledger, answered=not doubtful, doubtful=doubtful)
            return
        self.record.record_attempt_error(
            run.run_id, run.position, ledger.attempts, reason, self.holder, self.lease_seconds,
            error_attempts=ledger.error_attempts, error_seconds=ledger.error_seconds, in_doubt=ledger.in_doubt,
            next_try_at=time.time() + delay, doubtful=doubtful, same_errors=ledger.same_errors,
            same_error=ledger.same_error)
        self.say(f"  {_clock()} {step.name}: attempt {ledger.attempts} failed ({reason}); retrying in {delay:.2f} s "
                 f"(budget {ledger.rule.budget_seconds - ledger.error_seconds:.0f} s left)")
        await self.sleep(delay)

    def _complete(self, run: RunRow, plan: RunPlan, step: PlannedStep, attempt: int,
                  value: Any) -> StartedAttempt | None:
        """The step's result, the steps it adds to the plan (``plan.after``: a loop turn's calls and the
        next turn) and the advance in one commit, which also starts the next step's first attempt (with its
        intent, for a step with an effect); returns that attempt, or None after the last step."""
        pos = run.position
        names = [s.name for s in run.steps]
        added = plan.after(step.name, value)
        names += added
        nxt, next_name, ahead = None, None, None
        if pos + 1 < len(names):
            next_name = names[pos + 1]
            results = {**run.results(), step.name: value}
            following = plan.step(next_name, results)
            # A step with an effect records its intent (key and request) in this commit, before it can send.
            next_request = plan.request(next_name, results) if following.effect else None
            attempts = run.steps[pos + 1].attempts if pos + 1 < len(run.steps) else 0
            ahead = StartedAttempt(pos + 1, attempts + 1, next_request)
            nxt = NextAttempt(ahead.position, ahead.attempt, self._intent(following, next_request))
            if following.approval is not None:
                ahead = None  # it waits for a person first: its attempt starts once decided (_decided)
        self.record.complete_step(run.run_id, pos, attempt, value, self.holder, self.lease_seconds,
                                  effect=step.effect, next_name=next_name, nxt=nxt,
                                  added=[(len(run.steps) + i, name) for i, name in enumerate(added)],
                                  start_next=ahead is not None or nxt is None)
        if isinstance(value, dict) and value.get("adopted"):
            self.say(f"  {_clock()} {step.name}: adopted (attempt {attempt}): {value['adopted']['reason']}")
        else:
            said = plan.outcome(step.name, value)
            self.say(f"  {_clock()} {step.name}: completed (attempt {attempt})" + (f": {said}" if said else ""))
        point = plan.point_after(step.name, next_name)
        if point:
            crash_point(point)
        return ahead

    def _fail(self, run_id: str, step: PlannedStep, pos: int, ledger: StepLedger, answered: bool = True,
              doubtful: bool = False) -> None:
        error = ledger.failure or f"step {step.name} failed after {ledger.attempts} attempt(s)"
        self.record.fail_run(run_id, pos, ledger.attempts, error, ledger.last_error or error, self.holder,
                             self.lease_seconds, answered=answered, doubtful=doubtful, in_doubt=ledger.in_doubt,
                             crashes=ledger.crashes)
        state = "in doubt" if ledger.in_doubt else "failed"
        self.say(f"  {_clock()} {step.name}: {state} (attempt {ledger.attempts}): {ledger.last_error}")


__all__ = [
    "DEFAULT_LEASE_SECONDS",
    "DEFAULT_WAIT_LIMIT",
    "FlowChanged",
    "LeaseWaitTimedOut",
    "RecordRunNotFound",
    "Runner",
    "RunTerminal",
    "check_flow",
    "check_plan",
    "lease_seconds_from_env",
    "new_holder_id",
]
