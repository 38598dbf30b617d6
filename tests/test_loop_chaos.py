"""Chaos over the agent loop (lab/loop_chaos.py), small, on every engine: loop runs whose tasks name 1-3
orders, the processes running them SIGKILLed twice mid-run (Temporal: workers of a shared queue, with a
replacement and a standby; the run record and DBOS: the run's process, then ``resume``), the model stand-in
varying every answer, the provider failing before applying and losing responses after. Every run completes;
no duplicate and no lost effect at the provider; no recorded turn asked again at the stand-in.

Then the checks themselves, fed by hand a provider state with a duplicated, a missing and a mis-recorded
effect, a turn asked again with no kill and after its record, and a failed run: each is found, and the good
run beside them is not blamed."""

from __future__ import annotations

import importlib.util
from collections import Counter
from typing import Any

import pytest

from durable_agents.providerclient import EffectRecord
from durable_agents.steps.loop import tool_key
from lab import registry
from lab.engines import LoopStatus
from lab.loop_chaos import (
    LoopChaosConfig,
    PlannedRun,
    ProviderState,
    RunFacts,
    check,
    frontier,
    run_engine,
    summary,
    turns_during,
)


@pytest.mark.process
@pytest.mark.parametrize("engine", registry.names(loop=True))
async def test_small_loop_chaos_duplicates_loses_and_asks_again_nothing(engine, request, tmp_path):
    if engine == "dbos" and importlib.util.find_spec("dbos") is None:
        pytest.skip("DBOS Transact is an optional extra: pip install -e '.[dbos]' (make test installs it)")
    server = request.getfixturevalue("dev_server") if engine == "temporal" else None
    lines: list[str] = []
    config = LoopChaosConfig(engines=(engine,), runs=3, kills=2, seed=7, max_seconds=90, model_delay=0.2,
                             parallel=3, kill_gap=(0.3, 1.0), server=server, workdir=tmp_path, say=lines.append)
    report = await run_engine(engine, config)
    text = summary([report])
    print(text)
    assert report.ok, "\n".join(lines) + "\n" + text
    assert report.kills == 2 and report.processes >= 3, text
    assert len(report.runs) >= 3 and all(r.status and r.status["status"] == "completed" for r in report.runs), text
    # Every run's task asked for 3k + 1 calls (k orders: k lookups, k refunds, k emails, a ticket) in 2k + 2 turns,
    # and the provider applied one refund and one email per order and one ticket per run: counted there.
    orders = sum(len(r.run.orders) for r in report.runs)
    assert report.turns == 2 * orders + 2 * len(report.runs) and report.calls == 3 * orders + len(report.runs), text
    assert report.effects == 2 * orders + len(report.runs), text
    assert all(n >= 1 for r in report.runs for n in r.asked.values()), text


# ---------------------------------------------------------------- the checks can fail


def _status(run_id: str, calls: dict[int, list[tuple[str, str, str | None]]], *, state: str = "completed",
            error: str | None = None) -> LoopStatus:
    """A loop run's status: ``calls`` maps each turn to its (tool, call id, effect id) in order; a final turn
    follows the last, unless the run failed."""
    turns: list[Any] = []
    for number, asked in calls.items():
        turns.append({"turn": number, "status": "completed", "attempts": 1, "final": False, "calls": [
            {"index": i, "name": name, "key": None if name == "lookup_order" else tool_key(run_id, number, i, cid),
             "status": "completed", "attempts": 1, "outcome": "ok", "effect_id": effect}
            for i, (name, cid, effect) in enumerate(asked)]})
    if state == "completed":
        turns.append({"turn": len(calls) + 1, "status": "completed", "attempts": 1, "final": True, "calls": []})
    return {"run_id": run_id, "status": state, "turns": turns, "answer": "done" if state == "completed" else None,
            "error": error}


def _one_order_run(run_id: str, order: str, *, email_id: str = "msg_", ticket_id: str = "tkt_") -> LoopStatus:
    return _status(run_id, {1: [("lookup_order", "c1", None)],
                            2: [("issue_refund", "c2", f"rfd_{run_id}"), ("send_email", "c3", email_id + run_id)],
                            3: [("create_ticket", "c4", ticket_id + run_id)]})


class _Provider:
    """A provider's store, written by hand."""

    def __init__(self) -> None:
        self.effects: list[EffectRecord] = []
        self.applied: dict[str, list[dict[str, Any]]] = {"refund": [], "email": [], "ticket": []}

    def apply(self, kind: str, key: str, run_id: str, effect_id: str, **fields: Any) -> None:
        self.effects.append(EffectRecord(key, kind, run_id, 1, 1, 200, "t", "t"))
        id_field = {"refund": "refund_id", "email": "message_id", "ticket": "ticket_id"}[kind]
        self.applied[kind].append({id_field: effect_id, "idempotency_key": key, "run_id": run_id, **fields})

    def run(self, run_id: str, order: str, amount: int, *, email: bool = True, ticket_id: str = "tkt_") -> None:
        """What a one-order run applies when all is well (the email left out when ``email`` is false)."""
        self.apply("refund", tool_key(run_id, 2, 0, "c2"), run_id, f"rfd_{run_id}", order_id=order, amount=amount)
        if email:
            self.apply("email", tool_key(run_id, 2, 1, "c3"), run_id, f"msg_{run_id}")
        self.apply("ticket", tool_key(run_id, 3, 0, "c4"), run_id, ticket_id + run_id)

    def state(self) -> ProviderState:
        return ProviderState(self.effects, self.applied)


def test_the_checks_find_a_failed_run_a_duplicate_a_lost_effect_and_a_turn_asked_again():
    provider = _Provider()
    runs: list[RunFacts] = []

    def run(run_id: str, order: str, status: LoopStatus, asked: dict[int, int] | None = None,
            kills: dict[int, int] | None = None, when_recorded: dict[int, int] | None = None) -> None:
        facts = RunFacts(PlannedRun(run_id, f"Refund order {order}", "ada@example.com", {order: 1000}), status,
                         asked or {1: 1, 2: 1, 3: 1, 4: 1}, Counter(kills or {}), when_recorded or {})
        runs.append(facts)

    # All is well, and turn 2 was asked twice: a kill landed during it.
    provider.run("good", "G-1001", 1000)
    run("good", "G-1001", _one_order_run("good", "G-1001"), asked={1: 1, 2: 2, 3: 1, 4: 1}, kills={2: 1},
        when_recorded={1: 1, 2: 2})
    # A second refund of the order, under the key of another call id: a turn asked again chose other ids.
    provider.run("dup", "D-1001", 1000)
    provider.apply("refund", tool_key("dup", 2, 0, "other"), "dup", "rfd_again", order_id="D-1001", amount=1000)
    run("dup", "D-1001", _one_order_run("dup", "D-1001"))
    # The email the run recorded was never applied, and the ticket the provider holds is another than recorded.
    provider.run("lost", "L-1001", 1000, email=False, ticket_id="tkt_other_")
    run("lost", "L-1001", _one_order_run("lost", "L-1001"))
    # Turn 2 asked twice with no kill during it; turn 1 asked again after it was seen recorded.
    provider.run("asked", "A-1001", 1000)
    run("asked", "A-1001", _one_order_run("asked", "A-1001"), asked={1: 2, 2: 2, 3: 1, 4: 1}, kills={1: 1},
        when_recorded={1: 1})
    # A run that failed at its turn limit, having applied nothing.
    run("failed", "F-1001", _status("failed", {1: [("lookup_order", "c1", None)]}, state="failed",
                                    error="turn limit of 1 reached"), asked={1: 1, 2: 1})

    found = check(runs, provider.state())
    every = "\n".join(found.all())
    assert found.failed == ["run failed is failed: turn limit of 1 reached"], every
    duplicate = "\n".join(found.duplicate)
    assert f"run dup: a refund applied under key {tool_key('dup', 2, 0, 'other')}, which no call the run " \
           "recorded holds" in duplicate, every
    assert "run dup: order D-1001 refunded 2 times ([1000, 1000])" in duplicate, every
    assert "run dup: order D-1001 refunded 2000 in all, beyond its total 1000" in duplicate, every
    assert "run dup: 2 refunds applied; its task asks for 1" in duplicate, every
    lost = "\n".join(found.lost)
    assert "run lost turn 2 call 1 (send_email) recorded email msg_lost; the provider applied nothing under its " \
           "key" in lost, every
    assert "run lost turn 3 call 0 (create_ticket) recorded ticket tkt_lost; the provider holds tkt_other_lost " \
           "under its key" in lost, every
    assert "completed run lost: 0 emails applied; its task asks for 1" in lost, every
    asked = "\n".join(found.asked_again)
    assert "run asked: turn 2 asked 2 times; at most 1 (1 + 0 kill(s) that landed during it)" in asked, every
    assert "run asked: turn 1 asked 2 times, 1 when it was seen recorded: asked again after its record" in asked
    assert "run good" not in every and not found.ok, every
    # Each finding is one of the above: nothing else is blamed.
    assert len(found.duplicate) == 4 and len(found.lost) == 3 and len(found.asked_again) == 2, every

    # The well-behaved run alone passes every check.
    assert check(runs[:1], ProviderState([e for e in provider.effects if e.run_id == "good"],
                                         {k: [i for i in v if i["run_id"] == "good"]
                                          for k, v in provider.applied.items()})).ok


def test_a_kill_counts_for_the_turns_it_may_have_landed_during():
    """The bound's bookkeeping: a run read with its process dead (one read) counts the kill for its next turn
    only if that is the next step; two reads around a kill (Temporal) count every turn between them."""
    in_turn_3 = _status("r", {1: [("lookup_order", "c1", None)], 2: [("issue_refund", "c2", "rfd_r")]},
                        state="running")
    in_call = _status("r", {1: [("lookup_order", "c1", None)]}, state="running")
    in_call["turns"][0]["calls"][0]["status"] = "running"
    assert frontier(None) == (1, True) and frontier(in_turn_3) == (3, True) and frontier(in_call) == (1, False)
    assert frontier(_one_order_run("r", "O-1001")) is None
    assert list(turns_during(in_turn_3, in_turn_3)) == [3]
    assert list(turns_during(in_call, in_call)) == []
    assert list(turns_during(in_call, in_turn_3)) == [2, 3]
    assert list(turns_during(in_turn_3, _one_order_run("r", "O-1001"))) == [3, 4]
