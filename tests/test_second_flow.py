"""The house is ready for a second flow: one that exists only in the tests
(``tests/refund_flow.py``: four steps, one of them a refund) runs on the run
record and on DBOS, driven by the lab's engine driver (``lab.engines``),
killed with its refund applied and not recorded, resumed; it is drawn by the
timeline (``lesson.lanes``, ``timeline``) and counted by the effects table
(``lesson.effects``), each from the plan alone. No engine's or tool's file
names it: ``LAB_FLOW`` does (``durable_agents.steps.plan.flow_from_env``).

And a change of flow reaches runs in flight as docs/architecture.md says: the
run record refuses a run whose recorded steps are not the code's (exit 6);
DBOS runs each flow under its own application version, so a run of one flow
is parked for a process of the other, and launching it under the other's
flow is refused before DBOS could dispatch it into the wrong steps.
"""

from __future__ import annotations

import ast
import json
import os
import re
import sqlite3
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from durable_agents.providerclient import fetch_effects, seed_orders
from durable_agents.runrecord.compare import record_side
from durable_agents.runrecord.store import RunRecord
from durable_agents.steps.limits import InputError
from durable_agents.steps.params import parse_params
from durable_agents.steps.plan import FLOW, effect_kinds, kind_of_step, plan_signature
from lab.engines import driver_for, started_steps
from lab.processes import REPO
from lesson.effects import per_step, provider_side
from lesson.lanes import dbos_lane, record_lane
from tests.refund_flow import REFUND_FLOW, SPEC
from tests.support import EMAIL, TASK, parse_page, worktree_of
from timeline import Effect, Lane, render_page

PARAMS = ("--param", "order_id=A-1234", "--param", "amount=1250")
ORDER = {"A-1234": 2 * 1250}
"""The order the refunds are taken from, seeded before a test's runs (the provider refunds only the orders it
keeps, up to their total): room for the two runs a test starts."""
NAMES = [step.name for step in REFUND_FLOW]
KILLED_AT = "issue_refund:after_effect"  # the refund applied at the provider, its step not recorded
PREVIOUS = "bae0eb859c01b077f2c721010e847f13a7e3113d"
"""Main before the kind of effect went into the plan (issue 30, item 2), pinned: its DBOS runs carry the
version label alone (``agentlab-flow-1``) and no flow in their inputs; its run record is at schema 2."""


def _env(tmp_path: Path, provider, **more: str) -> dict[str, str]:
    return {"PROVIDER_URL": provider.url, "RUNRECORD_DB": str(tmp_path / "runrecord.db"),
            "DBOSFLOW_DB": str(tmp_path / "dbosflow.db"), "MEMORY_DB": str(tmp_path / "memory.db"), **more}


def _run_id(engine: str) -> str:
    return f"refund-{engine}-{uuid.uuid4().hex[:8]}"


@pytest.mark.parametrize("engine", ["runrecord", "dbos"])
async def test_a_second_flow_runs_resumes_is_drawn_and_counted_from_its_plan_alone(engine, provider, tmp_path):
    run_id = _run_id(engine)
    seed_orders(provider.url, ORDER)
    with driver_for(engine, _env(tmp_path, provider, LAB_FLOW=SPEC)) as driver:
        first = await driver.start(run_id, TASK, EMAIL, crash_at=KILLED_AT, args=PARAMS)
        await driver.killed(first)
        assert started_steps(first) == NAMES[:2], first.output()
        settled = await driver.resume(run_id)
        assert settled.completed, settled.proc.output()
        # The refund's step ran again (its outcome was never recorded); the draft, recorded, did not.
        assert started_steps(settled.proc) == NAMES[1:], settled.proc.output()
        assert settled.status is not None and [s["name"] for s in settled.status["steps"]] == NAMES
        assert settled.status["steps"][1]["result"]["refund_id"].startswith("rfd_"), settled.status
        side = (record_side(RunRecord(tmp_path / "runrecord.db"), run_id) if engine == "runrecord"
                else await driver.steps(run_id))

    # Counted: each effect step once, the refund's second request replayed by the provider.
    counted = per_step(fetch_effects(provider.url, run_id=run_id), REFUND_FLOW)
    assert {step: c["applied"] for step, c in counted.items()} == {name: 1 for name in kind_of_step(REFUND_FLOW)}
    assert counted["issue_refund"]["requests"] == 2, counted

    # Drawn: a row per step, a row per kind of effect the flow has, the refund on its own row, once.
    assert side is not None
    lane = (record_lane if engine == "runrecord" else dbos_lane)(side, provider_side(provider.url, run_id),
                                                                  flow=REFUND_FLOW)
    assert lane.rows == NAMES and lane.effect_kinds() == ["refund", "email", "ticket"]
    assert "1 refund" in str(lane.verdict) and not lane.bad, lane.verdict
    page = parse_page(render_page("a second flow", "its plan alone", [lane]))
    labels = [t.text() for t in page.all("text", cls="row")]
    assert [label for label in labels if label.startswith("provider: ")] == [
        "provider: refunds", "provider: emails", "provider: tickets"], labels
    assert [f"{i} {name}" for i, name in enumerate(NAMES, 1)] == [lbl for lbl in labels if lbl[:1].isdigit()]
    refunds = page.all("g", cls="effect-mark", data_kind="refund")
    assert len(refunds) == 1 and "applied" in refunds[0].classes, [r.attrs for r in refunds]
    assert "a refund / an email / a ticket applied by the provider" in page.all("ul", cls="legend")[0].text()


async def test_a_flow_change_reaches_runs_in_flight_as_each_engine_says(provider, tmp_path):
    """Started by the refund flow, killed mid-way, then met by a process of the lab's flow: the run record
    refuses (exit 6: its recorded steps are not the code's); DBOS parks it (another application version,
    derived from the flow), refuses to resume it, and refuses to launch it under its own label with the
    wrong flow (exit 6, the run still pending, not ended in DBOSUnexpectedStepError); the refund flow then
    finishes both, each effect once."""
    record_id, dbos_id = _run_id("record-change"), _run_id("dbos-change")
    seed_orders(provider.url, ORDER)
    refund_env, lab_env = _env(tmp_path, provider, LAB_FLOW=SPEC), _env(tmp_path, provider)
    with driver_for("runrecord", refund_env) as old, driver_for("runrecord", lab_env) as new:
        await old.killed(await old.start(record_id, TASK, EMAIL, crash_at="runrecord:issue_refund:after_record",
                                         args=PARAMS))
        refused = await new.resume(record_id)
        assert refused.code == 6 and "position 2 is 'issue_refund' in the record" in refused.proc.output(), (
            refused.proc.output())
        assert (await new.status(record_id) or {})["status"] == "parked"
        assert (await old.resume(record_id)).completed
    with driver_for("dbos", refund_env) as old, driver_for("dbos", lab_env) as new:
        await old.killed(await old.start(dbos_id, TASK, EMAIL, crash_at="dbos:issue_refund:after_record",
                                         args=PARAMS))
        parked = await new.status(dbos_id)
        assert parked is not None and parked["status"] == "parked", parked
        assert [s["name"] for s in parked["steps"]] == NAMES  # the run's own steps, as its inputs recorded them
        version = re.search(r"started under application version '([^']+)'", parked["detail"])
        assert version is not None and version[1] != "agentlab-flow-1", parked["detail"]
        assert "resume it with the code, or the LAB_FLOW, that started it" in parked["detail"], parked["detail"]
        refused = await new.resume(dbos_id)
        assert refused.code == 6 and started_steps(refused.proc) == [], refused.proc.output()
        # Its own label, the lab's flow: DBOS would dispatch it into the wrong steps; nothing is launched.
        with driver_for("dbos", {**lab_env, "DBOSFLOW_APP_VERSION": version[1]}) as wrong:
            launched = await wrong.resume(dbos_id)
            assert launched.code == 6 and "nothing was launched" in launched.proc.output(), launched.proc.output()
            assert started_steps(launched.proc) == []
        still = await old.status(dbos_id)
        assert still is not None and still["status"] == "running", still
        assert (await old.resume(dbos_id)).completed
    for run_id in (record_id, dbos_id):
        counted = per_step(fetch_effects(provider.url, run_id=run_id), REFUND_FLOW)
        assert {step: c["applied"] for step, c in counted.items()} == {n: 1 for n in kind_of_step(REFUND_FLOW)}


def test_a_run_must_be_given_the_parameters_its_flow_reads(provider, tmp_path):
    """A step that reads a run's parameter declares it (``FlowStep.params``): a start without it is refused
    before anything is recorded, naming what to give."""
    for module in ("durable_agents.runrecord", "durable_agents.dbosflow"):
        done = subprocess.run([sys.executable, "-m", module, "start", _run_id(module), TASK, "--email", EMAIL],
                              cwd=REPO, env={**os.environ, **_env(tmp_path, provider, LAB_FLOW=SPEC)},
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 2, done.stdout + done.stderr
        assert "--param order_id=VALUE --param amount=VALUE" in done.stderr, done.stderr
    with sqlite3.connect(tmp_path / "runrecord.db") as con:
        assert con.execute("SELECT count(*) FROM runs").fetchone()[0] == 0


def test_a_runs_parameters_are_json_scalars_or_text_and_are_checked():
    assert parse_params(["amount=1250", "order_id=A-1234", "gift=true", 'note="12"', "rate=0.5"]) == {
        "amount": 1250, "gift": True, "note": "12", "order_id": "A-1234", "rate": 0.5}
    for pairs, words in ((["amount"], "NAME=VALUE"), (["Amount=1"], "not allowed"), (["a=1", "a=2"], "twice"),
                         (["t=a\x1bb"], "U\\+001B"), ([f"t={'x' * 201}"], "limit is 200"),
                         ([f"p{i}=1" for i in range(11)], "at most 10"), (["x=NaN"], "finite")):
        with pytest.raises(InputError, match=words):
            parse_params(pairs)


def test_the_timeline_draws_a_row_for_every_kind_of_effect_its_lane_carries():
    """The page knows no kind by name: a lane's rows are the kinds its builder gave (its flow's), then any
    other kind the provider counted for the run; each kind looks the same in every lane of the page."""
    def effect(key: str, kind: str, at: float) -> Effect:
        return Effect(key=key, kind=kind, requests=1, applied=1, first_seen=at, last_seen=at)

    first = Lane(engine="a", title="a", start=0.0, rows=["s"], effect_rows=["email"],
                 effects=[effect("k1", "sms", 1.0), effect("k2", "email", 2.0)])
    second = Lane(engine="b", title="b", start=0.0, rows=["s"], effects=[effect("k3", "email", 1.0)])
    assert first.effect_kinds() == ["email", "sms"] and second.effect_kinds() == ["email"]
    page = parse_page(render_page("t", "l", [first, second]))
    labels = [t.text() for t in page.all("text", cls="row") if t.text().startswith("provider: ")]
    assert labels == ["provider: emails", "provider: sms", "provider: emails"], labels
    emails = [m.all("circle")[0].attrs["fill"] for m in page.all("g", cls="effect-mark", data_kind="email")]
    assert len(emails) == 2 and len(set(emails)) == 1, emails


def test_the_second_flow_is_built_from_the_plan_alone():
    """Its module imports only the core (``durable_agents.steps``) and nothing else of the project; no file
    outside the tests names it; its shape differs from the lab's, so every derived list differs with it."""
    tree = ast.parse((REPO / "tests" / "refund_flow.py").read_text())
    imported = {".".join(node.module.split(".")[:2]) if node.module.startswith("durable_agents.")
                else node.module.split(".")[0] for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) and node.module and node.module != "__future__"}
    assert imported <= {"durable_agents.steps", "collections", "dataclasses", "typing"}, imported
    naming = [str(path.relative_to(REPO)) for path in REPO.rglob("*.py")
              if not path.relative_to(REPO).parts[0].startswith((".", "tests"))
              and re.search(r"refund_flow|REFUND_FLOW", path.read_text())]
    assert not naming, f"files outside tests/ name the second flow: {naming}"
    assert plan_signature(REFUND_FLOW) == ("draft", "issue_refund:refund", "send_confirmation:email",
                                           "record_outcome:ticket")
    assert effect_kinds(FLOW) == ("email", "ticket") and effect_kinds(REFUND_FLOW) == ("refund", "email", "ticket")
    json.dumps(plan_signature(REFUND_FLOW))  # recorded as JSON by DBOS


@pytest.fixture(scope="module")
def previous_checkout(tmp_path_factory):
    """A worktree of ``PREVIOUS``, removed after the module's tests (pass or fail)."""
    where = tmp_path_factory.mktemp("previous") / f"main-{PREVIOUS[:12]}"
    with worktree_of(PREVIOUS, where, "the code before the plan's effect kinds") as checkout:
        yield checkout


async def test_runs_of_the_previous_code_resume_and_the_dbos_refusals_hint_works(previous_checkout, provider,
                                                                                  tmp_path):
    """Runs in flight across this change: a run record run of the previous code (schema 2) is resumed by
    this code; a DBOS run of the previous code (label ``agentlab-flow-1``, no flow in its inputs) is parked
    for this code's version, ``resume`` refuses with a hint, and the hint, followed with this code, finishes
    it; followed with another flow, it is refused before launch and the run stays pending."""
    env = _env(tmp_path, provider)
    record_id, dbos_id = _run_id("record-prev"), _run_id("dbos-prev")
    with driver_for("runrecord", env, code=previous_checkout) as old, driver_for("runrecord", env) as new:
        await old.killed(await old.start(record_id, TASK, EMAIL, crash_at="runrecord:send_confirmation:after_record"))
        resumed = await new.resume(record_id)
        assert resumed.completed and started_steps(resumed.proc) == ["record_outcome"], resumed.proc.output()
    with driver_for("dbos", env, code=previous_checkout) as old, driver_for("dbos", env) as new:
        await old.killed(await old.start(dbos_id, TASK, EMAIL, crash_at="record_outcome:before"))
        parked = await new.status(dbos_id)
        assert parked is not None and parked["status"] == "parked", parked
        refused = await new.resume(dbos_id)
        hint = re.search(r"`(DBOSFLOW_APP_VERSION=(\S+) python -m durable_agents.dbosflow resume \S+)`",
                         refused.proc.output())
        assert refused.code == 6 and hint is not None and hint[2] == "agentlab-flow-1", refused.proc.output()
        with driver_for("dbos", {**env, "LAB_FLOW": SPEC, "DBOSFLOW_APP_VERSION": hint[2]}) as other_flow:
            wrong = await other_flow.resume(dbos_id)
            assert wrong.code == 6 and "nothing was launched" in wrong.proc.output(), wrong.proc.output()
        with driver_for("dbos", {**env, "DBOSFLOW_APP_VERSION": hint[2]}) as hinted:
            done = await hinted.resume(dbos_id)
            assert done.completed and started_steps(done.proc) == ["record_outcome"], done.proc.output()
    for run_id in (record_id, dbos_id):
        counted = per_step(fetch_effects(provider.url, run_id=run_id))
        assert {step: c["applied"] for step, c in counted.items()} == {n: 1 for n in kind_of_step(FLOW)}
