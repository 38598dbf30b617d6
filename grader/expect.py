"""What the record-track checks (exercises 1-5) expect alike: the exercises' flow as their files spell it,
a process killed where it was meant to be or completed, the record's position after a kill, and results
that are the very ones the model or the provider gave. Each check module (``grader/check_*.py``) uses
them; the checks drive the learner's program through real processes and real SIGKILLs, then compare what
the learner's record says with what the outside world saw (``grader.evidence``). A check returns what it
showed (for the report) or raises ``Failed`` (expected, seen, where to look) or ``CouldNotRun`` (the
learner's own exception)."""

from __future__ import annotations

from grader.evidence import KIND_OF_STEP, WORDS, Record, Witnesses
from grader.harness import Failed, Harness, Outcome, Run
from grader.todos import todo

# The exercises' flow, as their files spell it (exercises/*/flow.py, STEPS): the grader judges that flow,
# so it names it itself rather than taking the lab's plan (durable_agents/steps/plan.py), which may grow steps.
STEPS = ("draft", "send_confirmation", "record_outcome")
EFFECT_STEPS = ("send_confirmation", "record_outcome")




# ---------------------------------------------------------------- shared expectations


def expect_killed(h: Harness, outcome: Outcome, where: str) -> None:
    """The process must have died by the kill the grader armed, not of its own accord."""
    if outcome.killed:
        return
    h.raise_could_not_run(outcome)
    raise Failed(
        f"`{' '.join(outcome.argv[:3])}` ended (exit {outcome.code}) before it reached {where}",
        expected=f"the process to be killed {where}",
        seen=f"it exited {outcome.code}; its last lines: {outcome.last_lines()}",
        look_at="that the program runs the three steps in order (compare with the exercise's README)")


def expect_completed(h: Harness, outcome: Outcome, what: str) -> None:
    if outcome.code == 0:
        return
    h.raise_could_not_run(outcome)
    raise Failed(f"{what} exited {outcome.code} instead of completing the run",
                 expected="exit 0 and the run completed",
                 seen=f"exit {outcome.code}; its last lines: {outcome.last_lines()}",
                 look_at="the program's output above")


def next_step(step: str) -> str | None:
    i = STEPS.index(step) + 1
    return STEPS[i] if i < len(STEPS) else None


def expect_position(record: Record, run: Run, done: tuple[str, ...], why: str) -> None:
    """The record holds ``run`` with exactly ``done`` completed and the step after them current."""
    current = STEPS[len(done)] if len(done) < len(STEPS) else None
    if record.run is None:
        raise Failed(
            f"the record holds no run {run.run_id} {why}",
            expected=f"a row in `runs` for {run.run_id}: status 'running', current_step {current!r}",
            seen=record.describe(),
            look_at=todo(1, "create the run's row, committed, before its first step runs"))
    status = "completed" if current is None else "running"
    have = tuple(s for s in STEPS if s in record.steps)
    if have != done or record.run.get("current_step") != current or record.run.get("status") != status:
        raise Failed(
            f"the record of run {run.run_id} is not where the run got to {why}",
            expected=(f"results of {list(done) or 'no step'} in `steps`; in `runs`, current_step {current!r} "
                      f"and status {status!r}"),
            seen=record.describe(),
            look_at=todo(2, "record each step's result and move current_step on, in one transaction"))
    for step in done:
        if record.result(step) is None:
            raise Failed(f"the recorded result of {step} for run {run.run_id} is not a JSON object",
                         expected=f"`steps.result` of {step}: the step's result as JSON, e.g. json.dumps(result)",
                         seen=f"{record.steps[step][:200]!r}",
                         look_at=todo(2, "the row keeps the result the step returned, readable back as it was"))


def expect_results_true(h: Harness, run: Run, record: Record) -> None:
    """Each recorded result is what the model or the provider really gave."""
    drafted = record.result("draft")
    if drafted is not None:
        calls = h.model.calls(run.task)
        if not any(drafted.get("body") == c.body and drafted.get("subject") == c.subject for c in calls):
            raise Failed(
                f"the draft recorded for run {run.run_id} is not one the model wrote",
                expected=f"`steps.result` of draft: the draft step's result ({len(calls)} draft(s) written)",
                seen=f"subject {drafted.get('subject')!r}", look_at=todo(2, "record the step's own result"))
    for step, field in (("send_confirmation", "message_id"), ("record_outcome", "ticket_id")):
        mine = record.result(step)
        if mine is None:
            continue
        applied = [e.response.get(field) for e in h.effects(run) if e.applied and e.response
                   and e.kind == KIND_OF_STEP[step]]
        if mine.get(field) not in applied:
            raise Failed(
                f"the {field} recorded for {step} of run {run.run_id} is not one the provider gave",
                expected=f"the provider's {field}: {applied or 'none applied'}",
                seen=f"{mine.get(field)!r}", look_at=todo(2, "record the step's own result"))


def expect_consistent(h: Harness, run: Run, record: Record, commit: int) -> None:
    if record.run is None:
        return  # killed before the run's row was committed: nothing recorded, nothing sent (checked below)
    current = record.run.get("current_step")
    done = STEPS[:STEPS.index(current)] if current in STEPS else STEPS
    have = tuple(s for s in STEPS if s in record.steps)
    where = f"killed right after the program's commit #{commit}"
    if have != done:
        missing = [s for s in done if s not in have]
        ahead = [s for s in have if s not in done]
        raise Failed(
            (f"{where}, the record says run {run.run_id} is at step {current!r} but holds no result for "
             f"{', '.join(missing)}: the run advanced before the step's result was recorded"
             if missing else
             f"{where}, the record holds the result of {', '.join(ahead)} but still says run {run.run_id} is at "
             f"step {current!r}: the result was recorded without moving the run on"),
            expected="current_step is the first step without a result, at every commit",
            seen=record.describe(),
            look_at=todo(2, "record the result and move current_step on in ONE transaction"))
    for step in EFFECT_STEPS:
        applied = h.witnesses(run).applied(step)
        if applied and step not in record.steps and not record.intents_of(step):
            raise Failed(f"{where}, the provider had applied {WORDS[step]} of run {run.run_id} but the record "
                         f"holds neither its intent nor its result",
                         expected="the record to cover every effect that went out", seen=record.describe(),
                         look_at=todo(2, "record each step's result as soon as it returns"))


def expect_done(h: Harness, run: Run) -> None:
    record = h.record(run)
    expect_position(record, run, STEPS, "after its last resume")
    expect_results_true(h, run, record)
    seen = h.witnesses(run)
    for step in EFFECT_STEPS:
        if len(seen.applied(step)) != 1:
            raise Failed(f"{WORDS[step]} of run {run.run_id} was applied {len(seen.applied(step))} times",
                         expected="once", seen=str([e.key for e in seen.applied(step)]),
                         look_at=todo(3, "one key per step of a run"))
    if seen.drafts != 1:
        raise Failed(f"the model drafted {seen.drafts} times for run {run.run_id}", expected="once",
                     seen=f"{seen.drafts} draft calls", look_at=todo(6, "go on at the step the record says is next"))


def executions(before: Witnesses, after: Witnesses) -> str:
    return (f"draft calls at the model {before.drafts} -> {after.drafts}; requests at the provider: email "
            f"{before.requests('send_confirmation')} -> {after.requests('send_confirmation')}, ticket "
            f"{before.requests('record_outcome')} -> {after.requests('record_outcome')}")
