"""A run's status from the record, in exactly the shape ``starter.py status
--json`` prints from Temporal's history, with the words of ``durable_agents.steps.runstate``.

How the record's rows map onto them:

- a step row ``completed`` whose result carries ``adopted`` is **adopted**;
- a step row ``failed`` with ``in_doubt`` set is **in_doubt**;
- a ``running`` step is **running** while a live process holds the run's
  lease, **retrying** while its ``next_try_at`` is ahead, and **waiting** when
  no process holds the run (a crash, or nobody resumed it): a lease that has
  expired, or whose holder is a process on this host that is provably gone
  (``durable_agents.runrecord.lease.check_holder``: at once after a kill, not a lease later);
- the run is **parked** when the code reading it has another flow than the
  recorded one (``resume`` refuses it, exit 6, until the right code runs).

What only the record knows (intents, the lease) is shown by ``render`` below
the table, never added to the JSON, so one parser reads both engines. A run
of the agent loop (``durable_agents.steps.loop``) has a row per turn and per call, shown in
the table like any step (a turn's or a call's recorded result in the JSON);
``render`` adds the loop turn by turn: the calls each turn asked for, each
call's key (an effect's, from its recorded turn: ``durable_agents.steps.loop.tool_key``),
status and result, and the final answer. Its
lines quote run data (a provider's refusal, a holder's name) and are escaped
for the terminal like the table's (``durable_agents.steps.controls.printable``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence

from durable_agents.runrecord.lease import check_holder
from durable_agents.runrecord.store import IntentRow, RunRow, StepRow
from durable_agents.steps import loop
from durable_agents.steps.approval import Decision, Wait, mark_waiting_steps, status_lines
from durable_agents.steps.approval import status_entries as approval_entries
from durable_agents.steps.controls import printable
from durable_agents.steps.runstate import RunEntry, StepEntry, describe_step, iso, run_entry, run_state, step_entry
from durable_agents.steps.runview import render_table
from durable_agents.steps.settle import answer_text


def _step(run: RunRow, s: StepRow, live: bool, now: float) -> StepEntry:
    last_error = s.last_error if s.status != "completed" else None
    if s.status == "completed":
        adopted = s.result.get("adopted") if isinstance(s.result, dict) else None
        return step_entry(s.name, "adopted" if adopted else "completed", s.attempts, s.result, crashes=s.crashes,
                          note=adopted.get("reason") if adopted else None)
    if s.status == "failed":
        note = (f"an attempt's outcome is unknown: the effect may have been applied; "
                f"`python -m durable_agents.runrecord settle {run.run_id}` asks the provider") if s.in_doubt else None
        return step_entry(s.name, "in_doubt" if s.in_doubt else "failed", s.attempts, crashes=s.crashes,
                          last_error=last_error, note=note)
    if s.status == "pending":
        return step_entry(s.name)
    if not live:
        why = (f"the process running attempt {s.attempts} died" if s.attempt_open
               else "no process holds the run")
        return step_entry(s.name, "waiting", s.attempts, crashes=s.crashes, last_error=last_error,
                          note=f"{why}: `python -m durable_agents.runrecord resume {run.run_id}` continues it")
    if s.next_try_at is not None and s.next_try_at > now and not s.attempt_open:
        return step_entry(s.name, "retrying", s.attempts, crashes=s.crashes, last_error=last_error,
                          next_try_at=iso(s.next_try_at))
    return step_entry(s.name, "running", s.attempts, crashes=s.crashes, last_error=last_error)


def status_of(run: RunRow, now: float | None = None, flow_changed: str | None = None,
              approvals: Sequence[tuple[Wait, Decision | None, str | None]] = ()) -> RunEntry:
    """The status JSON of ``run``. ``flow_changed``: the reason the reading
    code's flow differs from the recorded one (then the run is parked); ``approvals``: the run's waits for a
    person (``RunRecord.approvals``), shown as ``approvals`` when there are any."""
    now = time.time() if now is None else now
    holder = run.lease_holder
    live = bool(holder) and (run.lease_expires_at or 0) > now and not check_holder(holder or "").dead
    steps = [_step(run, s, live, now) for s in run.steps]
    waits = approval_entries(approvals, now)
    mark_waiting_steps(steps, waits)  # type: ignore[arg-type]
    if run.status in ("completed", "failed"):
        entry = run_entry(run.run_id, run_state(run.status), steps, error=run.error)
    elif flow_changed:
        entry = run_entry(run.run_id, "parked", steps, detail=flow_changed)
    else:
        active = next((s for s in steps if s["status"] in ("running", "waiting", "retrying")), None)
        detail = describe_step(active, waiting_for="a resume") if active else None
        waiting = next((w for w in waits if w["state"] == "waiting"), None)
        if waiting is not None:
            detail = (f"{waiting['call']} waits for a person's decision on {waiting['tool']} until "
                      f"{waiting['until']}: `python -m durable_agents.runrecord approve {run.run_id} "
                      f"{waiting['call']} --by NAME` (or deny)" + ("" if live else "; no process is running the "
                                                                    "run: resume it to act on the decision"))
        entry = run_entry(run.run_id, "running", steps, detail=detail)
    if waits:
        entry["approvals"] = waits  # type: ignore[typeddict-unknown-key]
    return entry


def run_status(record, run_id: str) -> RunEntry:
    """The status JSON for ``run_id`` in an open ``RunRecord``; ``RecordRunNotFound`` if there is none."""
    return status_of(record.load(run_id), approvals=record.approvals(run_id))


WHY_ERRORS_ARE_DOUBTFUL = ("a 5xx may come from a gateway or proxy after the provider applied the request, "
                           "a timeout or a broken connection after it was sent, an unreadable 2xx after it was "
                           "applied, an unexpected error that does not say whether it was sent")
"""Why an intent whose attempt ended in an error is still in doubt: the client
never takes a 5xx, a timeout, a broken connection or an unreadable 2xx to mean
"not applied" (docs/provider-contract.md, "How the client reads the answers"),
and an unexpected exception in a step with an effect says nothing either way."""


def why_in_doubt(run: RunRow, intent: IntentRow) -> str:
    """Why an ``in_doubt`` intent is in doubt, in words true for how it got there
    (``status`` shows it; the runner says it before repeating the request).

    A step's first intent is written by the previous step's commit
    (``RunRecord.complete_step``: one commit per step), so right after step n
    is recorded, step n+1's intent is in doubt although step n+1 may not have
    started: the same commit time on both rows says that is how it came."""
    if (intent.outcome or {}).get("error"):
        return "ended in an error that does not say whether it was applied"
    before = run.steps[intent.position - 1] if 0 < intent.position <= len(run.steps) else None
    if before is not None and before.completed_at == intent.recorded_at:
        return (f"recorded ahead with step {before.position + 1} ({before.name})'s commit; not sent yet, or sent "
                "and unanswered: in doubt until an answer is recorded")
    return "recorded before sending, no answer recorded"


def attempts_text(attempts: Sequence[int]) -> str:
    """``attempt 3`` or ``attempts 1, 2, 3``."""
    return f"attempt{'s' if len(attempts) > 1 else ''} {', '.join(str(a) for a in attempts)}"


def in_doubt(intents: list[IntentRow]) -> list[IntentRow]:
    return [i for i in intents if i.state == "in_doubt"]


def render(run: RunRow, intents: Sequence[IntentRow], now: float | None = None,
           flow_changed: str | None = None, approvals: Sequence[tuple[Wait, Decision | None, str | None]] = ()) -> str:
    """The starter's table, plus the waits for a person, the intents and the lease."""
    now = time.time() if now is None else now
    status = status_of(run, now, flow_changed, approvals)
    lines: list[str] = loop_lines(run, status["steps"]) if run.loop is not None else []
    lines += status_lines(approval_entries(approvals))
    for i in intents:
        outcome = i.outcome or {}
        note = {
            "in_doubt": f"IN DOUBT: {why_in_doubt(run, i)}"
                        + (f" ({WHY_ERRORS_ARE_DOUBTFUL}): {outcome['error']}" if outcome.get("error") else "")
                        + ("; settle asks the provider" if run.status == "failed"
                           else "; the next attempt repeats it with the same key"),
            "answered": "answered",
            "error": f"error: {outcome.get('error', '')}",
            "settled": (f"was in doubt; `settle` recorded the provider's answer at {iso(i.settled_at)}: "
                        f"{answer_text(outcome['settled_by_provider'])}" if "settled_by_provider" in outcome
                        else f"was in doubt; settled by attempt {outcome.get('settled_by_attempt')}"),
        }[i.state]
        lines.append(f"  intent {i.step} attempt {i.attempt} key {i.idempotency_key}: {note}")
    if run.lease_holder:
        left = (run.lease_expires_at or 0) - now
        verdict = check_holder(run.lease_holder)
        if verdict.dead:
            state = f"held by a process that is gone ({verdict.reason}): resume takes it at once"
        elif left > 0:
            state = f"expires in {left:.1f} s"
        else:
            state = f"expired {-left:.1f} s ago: resume may take it"
        lines.append(f"  lease: {run.lease_holder}, {state}")
    elif run.status == "running":
        lines.append("  lease: none (no process is running it): resume it to continue")
    return "\n".join([render_table(status), *(printable(line) for line in lines)])


def loop_effect_calls(run: RunRow) -> dict[str, tuple[str, str]]:
    """Each call with an effect of a loop run's recorded turns, by step name: its tool and its idempotency key."""
    calls: dict[str, tuple[str, str]] = {}
    effects = loop.recorded_effects((run.loop or {}).get("signature"))  # the run's agent's, as it recorded them
    for s in run.steps:
        turn, index = loop.parse_step(s.name)
        if index is None and s.status == "completed":
            for i, call in enumerate(loop.as_call(c) for c in s.result.get("calls") or ()):
                if call.name in effects:
                    calls[loop.call_step(turn, i)] = (call.name, loop.tool_key(run.run_id, turn, i, call.id))
    return calls


def loop_call_keys(run: RunRow) -> dict[str, str]:
    """Each call with an effect of a loop run's recorded turns, by step name, and its idempotency key."""
    return {step: key for step, (_, key) in loop_effect_calls(run).items()}


def _clip(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def loop_lines(run: RunRow, entries: Sequence[StepEntry]) -> list[str]:
    """A loop run turn by turn: what each turn asked for, each call's arguments, key, status and result
    (a recorded call's result as the model got it back), and the final answer. Run data: the caller
    escapes each line for the terminal."""
    numbers = run.loop or {}
    keys = loop_call_keys(run)
    lines = [f"  the agent loop: at most {numbers.get('max_turns')} turns; window of at most "
             f"{numbers.get('window_tokens')} tokens and {numbers.get('window_messages')} messages, derived from "
             "the record for each turn"]
    calls: list[loop.AskedCall] = []
    for s, entry in zip(run.steps, entries, strict=True):
        turn, index = loop.parse_step(s.name)
        if index is None:
            if s.status != "completed":
                lines.append(f"  turn {turn}: {entry['status']}" + (f" (attempt {s.attempts})" if s.attempts else ""))
                continue
            calls = [loop.as_call(c) for c in s.result.get("calls") or ()]
            asked = ", ".join(c.name for c in calls) if calls else "no tool: the final answer"
            lines.append(f"  turn {turn}: asked for {asked}")
            continue
        call = calls[index]
        lines.append(f"    call {index} {call.name} {_clip(call.arguments, 100)}")
        key = keys.get(s.name)
        lines.append(f"      key {key}" if key else "      no key: no effect (read-only, or not a tool)")
        shown = f"{entry['status']}" + (f", attempt {s.attempts}" if s.attempts > 1 else "")
        if s.status == "completed":
            shown += f": {s.result.get('status')} {_clip(str(s.result.get('content')))}"
        lines.append(f"      {shown}")
    answer = loop.LoopPlan.final_answer(run.results())
    if answer is not None:
        lines.append(f"  final answer: {_clip(answer, 400)}")
    return lines


def dumps(status: RunEntry) -> str:
    return json.dumps(status, indent=2)
