"""Check 2. **Each effect recorded before the step advances** (exercise 2): killed
right after the provider accepted the email, and the ticket: the record
holds the attempt's intent (the key the provider got, the request it
applied), not a completed step, and not nothing.
"""

from __future__ import annotations

import json
from functools import partial

from grader.check import Check
from grader.evidence import KIND_OF_STEP, WORDS, Record
from grader.expect import (
    EFFECT_STEPS,
    expect_killed,
)
from grader.harness import Failed, Harness, Run
from grader.todos import todo


def check_intents(h: Harness) -> list[str]:
    def intent_kept(step: str) -> str:
        run = h.new_run("g2")
        expect_killed(h, h.start(run, crash_at=f"{step}:after_effect"), f"right after the provider applied {step}")
        applied = h.witnesses(run).applied(step)
        record = h.record(run)
        if not record.intents_of(step) and applied:
            explain_missing_intent(h, run, step, applied[0].key, record)
        expect_intent(run, record, step, applied)
        return (f"killed right after the provider applied {WORDS[step]}: the record holds its intent "
                f"(key {applied[0].key}), not a completed step")

    return h.side_by_side(*(partial(intent_kept, step) for step in EFFECT_STEPS))


def explain_missing_intent(h: Harness, run: Run, step: str, key: str, record: Record) -> None:
    """No intent right after the send: tell "never recorded" from "recorded only after sending" by a
    run left to finish, whose record shows whether the program writes intents at all."""
    whole = h.new_run("g2")
    h.start(whole)
    later = h.record(whole).intents_of(step)
    words = WORDS[step]
    first = (f"the provider applied {words} for run {run.run_id} (key {key}), but the record holds no intent "
             f"for {step}")
    if later:
        raise Failed(
            f"{first}: your program records the intent only after the request went out (run {whole.run_id}, "
            "left to finish, has one), so a crash in between loses it",
            expected=f"the intent for {step} committed BEFORE the step sends its request",
            seen=f"killed right after the send: {record.describe()}",
            look_at=todo(4, "move the intent's transaction before the call to the step"))
    raise Failed(
        f"{first}: a crash right after the send leaves no trace that it may have gone out",
        expected=f"a row in `intents` for {step}, committed BEFORE the request was sent",
        seen=record.describe(),
        look_at=todo(4, "commit the intent (key and request) before calling the step"))


def expect_intent(run: Run, record: Record, step: str, applied: list) -> None:
    words = WORDS[step]
    if len(applied) != 1:
        raise Failed(f"the provider holds {len(applied)} applied {KIND_OF_STEP[step]}(s) for run {run.run_id}",
                     expected=f"one: {words}, sent once before the kill", seen=str([e.key for e in applied]),
                     look_at=todo(3, "one key per step of a run"))
    effect = applied[0]
    current = record.run.get("current_step") if record.run else None
    if record.run is not None and current != step and step not in record.steps:
        raise Failed(
            f"the record says run {run.run_id} is at step {current!r}, but holds no result for {step}: "
            "the run advanced before the effect was recorded",
            expected=f"current_step {step!r} until {step}'s result is recorded, in the same transaction",
            seen=record.describe(),
            look_at=todo(2, "move current_step on in the transaction that records the result, after the step ran"))
    intents = record.intents_of(step)
    if not any(i["idempotency_key"] == effect.key for i in intents):
        raise Failed(
            f"the intent recorded for {step} of run {run.run_id} names another key than the one sent",
            expected=f"the key the provider got: {effect.key}",
            seen=", ".join(i["idempotency_key"] for i in intents),
            look_at=todo(4, "record the key of the request you send"))
    sent = next(i for i in intents if i["idempotency_key"] == effect.key)
    try:
        request = json.loads(sent["request"])
    except (TypeError, ValueError):
        request = None
    fields = ("to", "subject", "body") if step == "send_confirmation" else ("summary", "email_message_id")
    applied_body = effect.request or {}
    if not isinstance(request, dict) or any(request.get(f) != applied_body.get(f) for f in fields):
        raise Failed(
            f"the intent recorded for {step} of run {run.run_id} is not the request the provider applied",
            expected=f"`intents.request`: the request as JSON, with {', '.join(fields)} as sent",
            seen=f"{str(sent['request'])[:200]!r}",
            look_at=todo(4, "the intent keeps the whole request the step sends, its key included"))
    if step in record.steps:
        raise Failed(f"the record holds a result for {step} although the process died before the step returned",
                     expected="no result until the step returned", seen=record.describe(),
                     look_at=todo(2, "record the result only after the step returned it"))




CHECK = Check(2, "each effect recorded before the step advances", check_intents)
