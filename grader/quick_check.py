"""The answer to exercise 3's quick check, printed where the learner grades exercise 3, with the evidence of the
learner's own runs (check 3 keeps them in ``Harness.evidence_runs``)."""

from __future__ import annotations

from typing import TextIO

from durable_agents.steps.keys import idempotency_key
from grader.harness import Harness


def quick_check_answer(h: Harness, out: TextIO) -> None:
    run = h.evidence_runs.get("scenario")
    chain = h.evidence_runs.get("every_kill")
    if run is None:
        return
    seen = h.witnesses(run)
    record = h.record(run)
    email = next(e for e in seen.applied("send_confirmation"))
    sent = record.result("send_confirmation") or {}
    lines = [
        "",
        'Quick check (exercise 3\'s README): "A four-step job crashes after step two, which sent an email.',
        'What must resuming not do?"',
        "  Answer: it must not send the email again, nor run steps 1 and 2 again. It continues at step three,",
        "  with step two's recorded result (the email's message id, which the ticket cites) read from the record.",
        f"  Your run {run.run_id} showed it, killed between step 2 and step 3 and resumed:",
        f"    - the model wrote {seen.drafts} draft in all: the resume asked for none;",
        f"    - the email's key {email.key}: {email.requests} request, {email.applied} applied: the resume sent none;",
        f"    - the ticket cites message id {sent.get('message_id')}, read from your record's send_confirmation row.",
    ]
    if chain is not None:
        key = idempotency_key(chain.run_id, "send_confirmation")
        again = next((e for e in h.witnesses(chain).applied("send_confirmation")), None)
        if again is not None:
            lines += [
                "  An effect left in doubt (sent, not yet recorded) may be repeated only with the same key: your run",
                f"  {chain.run_id}, killed right after the provider accepted its email, sent it again on resume "
                f"under {again.key if again.key != key else 'the same key'}: {again.requests} requests, "
                f"{again.applied} applied."]
    print("\n".join(lines), file=out)
