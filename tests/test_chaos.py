"""A small chaos run (lab/chaos.py) in the suite: 12 concurrent runs, workers
SIGKILLed 3 times while runs are in flight, two workers part of the time,
the provider failing and losing responses; once with the deterministic
model, once with one that varies every answer. Every run completes; no
duplicate and no lost effect."""

from __future__ import annotations

import pytest

from durable_agents.providerclient import ProviderClient
from durable_agents.steps.keys import idempotency_key
from durable_agents.steps.plan import KIND_OF_STEP
from durable_agents.steps.runstate import run_entry, step_entry
from lab.chaos import ChaosConfig, ChaosReport, _check, run_chaos


@pytest.mark.parametrize("vary", [False, True], ids=["deterministic", "varying"])
async def test_small_chaos_run_loses_and_duplicates_nothing(dev_server, tmp_path, vary):
    lines: list[str] = []
    config = ChaosConfig(runs=12, kills=3, seed=7, max_seconds=150, pace=1.0, vary=vary,
                         temporal_address=dev_server.address, workdir=tmp_path, say=lines.append)
    report = await run_chaos(config)
    summary = report.summary()
    print(summary)
    assert report.ok, "\n".join(lines) + "\n" + summary
    assert report.kills_with_runs_in_flight >= 3, summary
    assert len(report.runs) >= 12 and report.by_status()["running"] == 0, summary
    assert report.by_status()["completed"] == len(report.runs), summary
    # The provider's own store agrees: exactly one effect of each kind per run (one email, one ticket).
    assert all(report.applied[kind] == len(report.runs) for kind in KIND_OF_STEP.values()), summary
    assert report.effects_applied == sum(report.applied.values()), summary


async def test_the_checks_find_a_lost_a_duplicated_and_a_miscited_effect(provider):
    """The checks read the plan's effect steps and the provider's record, and can fail: a run whose
    history recorded another email id than the provider applied, a ticket citing an email the run never
    recorded, an effect under a key no step of the run has, a completed run with an effect missing."""
    async with ProviderClient(provider.url) as pc:
        sent = await pc.send_email(idempotency_key=idempotency_key("good", "send_confirmation"), run_id="good",
                                   to="ada@example.com", subject="s", body="b")
        ticket = await pc.create_ticket(idempotency_key=idempotency_key("good", "record_outcome"), run_id="good",
                                        summary="s", email_message_id=sent.message_id)
        other = await pc.send_email(idempotency_key=idempotency_key("bad", "send_confirmation"), run_id="bad",
                                    to="ada@example.com", subject="s", body="b")
        await pc.create_ticket(idempotency_key=idempotency_key("bad", "record_outcome"), run_id="bad",
                               summary="s", email_message_id="msg_never_recorded")
        await pc.send_email(idempotency_key="agentlab/bad/again", run_id="bad", to="ada@example.com",
                            subject="s", body="b")

    def completed(run_id: str, message_id: str, ticket_id: str):
        return run_entry(run_id, "completed", [
            step_entry("draft", "completed", 1, {"subject": "s"}),
            step_entry("send_confirmation", "completed", 1, {"message_id": message_id}),
            step_entry("record_outcome", "completed", 1, {"ticket_id": ticket_id})])

    report = ChaosReport(ChaosConfig())
    report.runs = {"good": completed("good", sent.message_id, ticket.ticket_id),
                   "bad": completed("bad", "msg_other", "tkt_x"), "lost": completed("lost", "m", "t")}
    _check(report, provider.url)
    failures = "\n".join(report.failures)
    assert "run bad has 2 emails" in failures and "went out under key agentlab/bad/again" in failures, failures
    assert f"run bad recorded email message_id msg_other, the provider holds {other.message_id}" in failures
    assert "run bad's ticket cites email_message_id msg_never_recorded" in failures, failures
    assert "completed run lost has send_confirmation applied 0 times" in failures, failures
    assert "run good" not in failures and report.applied == {"email": 3, "ticket": 2}, failures
