"""The crash matrix: every named crash point (docs/crashpoints.md), on every
durable engine (Temporal, the run record, and DBOS when its extra is
installed). For each: a process armed with CRASH_AT dies there by SIGKILL; a
fresh process (a new Temporal worker, ``python -m durable_agents.runrecord resume``, or
``python -m durable_agents.dbosflow resume``, i.e. DBOS's recovery on launch)
finishes the run. Asserted, from the processes' own output and the
provider's own counts:

- the run completes;
- it resumed at the right step: a step whose completion was recorded before
  the crash is not executed again, every later step runs exactly once in the
  second process (counted from the ``step <name> started:`` lines both
  engines print);
- each effect is applied exactly once at the provider; the effect that was
  accepted just before the crash is requested twice (at-least-once execution,
  idempotent receiver), every other one once.

Every case runs twice: with the deterministic offline model, and with one
that words every answer differently (``LLM_OFFLINE_VARY=1``), as a real model
does; a re-run draft then differs from the first, and nothing may change.

DBOS's cases run on its SQLite system database, and on PostgreSQL (the
project's own server, ``lab.postgres``; ``DBOSFLOW_DB`` a URL): one case by
default (an effect accepted, the process killed before DBOS recorded it),
every case with ``LAB_DBOS_POSTGRES=all``.
"""

from __future__ import annotations

import importlib.util
import os
import uuid
from dataclasses import dataclass

import pytest

from durable_agents.providerclient import fetch_effects
from durable_agents.runrecord import RunRecord
from durable_agents.runrecord.status import run_status as record_status
from durable_agents.steps.keys import idempotency_key
from durable_agents.steps.plan import EFFECT_STEPS, FLOW, STEP_NAMES, step_points
from lab.processes import Proc
from lab.registry import engine_points
from tests.support import EMAIL, TASK, executions, wait_closed, wait_exit


@dataclass(frozen=True)
class Case:
    engine: str  # "temporal" | "runrecord" | "dbos"
    point: str
    model: str = "deterministic"  # | "varying"

    @property
    def env(self) -> dict[str, str]:
        return {"LLM_OFFLINE_VARY": "1" if self.model == "varying" else "0"}

    @property
    def id(self) -> str:
        return f"{self.point.replace(':', '.')}-{self.model}"

    @property
    def step(self) -> str:
        """The step during (or after) which the process dies."""
        return next(s for s in STEP_NAMES if f"{s}:" in self.point)

    @property
    def index(self) -> int:
        return STEP_NAMES.index(self.step)

    @property
    def recorded(self) -> bool:
        """The dying step's completion was recorded: resume must not run it again."""
        return self.point.endswith(":after_record")

    @property
    def effect_sent(self) -> bool:
        """The provider accepted the dying step's request: resume repeats it, same key."""
        return self.point.endswith(":after_effect")

    @property
    def started_line_before_death(self) -> bool:
        # Temporal's activity wrapper logs before calling the step; the runner
        # logs after committing the attempt and its intent (its own points).
        return not (self.point.endswith(":after_start") or self.point.endswith(":after_intent"))

    def expected_first(self, step: str) -> int:
        i = STEP_NAMES.index(step)
        if i < self.index:
            return 1
        if i == self.index:
            return int(self.started_line_before_death)
        return 0

    def expected_second(self, step: str) -> int:
        i = STEP_NAMES.index(step)
        if i < self.index:
            return 0
        if i == self.index:
            return 0 if self.recorded else 1
        return 1


# The steps' points (durable_agents.steps.plan), then each engine's own (its registration's, from the flow). DBOS
# records nothing when a step starts, so its only own point is after it recorded a step's output; the steps' points are
# the rest of its matrix.
POINTS = step_points(FLOW)
ENGINE_POINTS = engine_points(FLOW)
HAVE_DBOS = importlib.util.find_spec("dbos") is not None

CASES = [Case(engine, point, model) for engine in ("temporal", "runrecord") for model in ("deterministic", "varying")
         for point in (*POINTS, *ENGINE_POINTS[engine])]
DBOS_CASES = [Case("dbos", point, model) for model in ("deterministic", "varying")
              for point in (*POINTS, *ENGINE_POINTS["dbos"])]
# On PostgreSQL: the case that exercises most (the effect accepted, its step not recorded: resume repeats it
# under the same key), or all of them when asked.
PG_DEFAULT = Case("dbos", "send_confirmation:after_effect")
PG_CASES = DBOS_CASES if os.environ.get("LAB_DBOS_POSTGRES") == "all" else [PG_DEFAULT]


def new_run_id(case: Case) -> str:
    return f"cm-{case.engine[:4]}-{case.point.replace(':', '.')}-{uuid.uuid4().hex[:6]}"


def check_resume(case: Case, first: Proc, second: Proc, status: dict, provider_url: str, run_id: str) -> None:
    where = f"{case.engine} at {case.point} ({case.model} model)"
    assert status["status"] == "completed", (where, status, second.output())
    assert status["steps"][0]["result"]["model"] == ("offline-varying" if case.model == "varying" else "offline")
    for step in STEP_NAMES:
        assert executions(first, step) == case.expected_first(step), (where, step, first.output())
        assert executions(second, step) == case.expected_second(step), (where, step, second.output())
    # The dying step's crashed attempt counts; a recorded step keeps its attempt 1.
    attempts = {s["name"]: s["attempts"] for s in status["steps"]}
    assert attempts[case.step] == (1 if case.recorded else 2), (where, status)
    for step in STEP_NAMES[: case.index]:
        assert attempts[step] == 1, (where, status)
    effects = {e.key: e for e in fetch_effects(provider_url, run_id=run_id)}
    assert len(effects) == 2, (where, effects)
    for step in EFFECT_STEPS:
        effect = effects[idempotency_key(run_id, step)]
        requests = 2 if (step == case.step and case.effect_sent) else 1
        assert (effect.requests, effect.effects_applied) == (requests, 1), (where, step, effect)


@pytest.mark.parametrize("case", [c for c in CASES if c.engine == "temporal"], ids=lambda c: c.id)
async def test_temporal_resumes_at_the_right_step(case: Case, client, workers, provider, task_queue):
    from durable_agents.flowclient.runs import start_run
    from durable_agents.flowclient.status import run_status

    run_id = new_run_id(case)
    first = workers(crash_at=case.point, extra_env=case.env)
    created, _ = await start_run(client, run_id, TASK, EMAIL, queue=task_queue)
    assert created
    assert wait_exit(first, timeout=90) == -9, first.output()
    assert f"CRASH_AT={case.point}" in first.output()

    before = await run_status(client, run_id)
    assert before["status"] == "running", before
    completed_before = [s["name"] for s in before["steps"] if s["status"] == "completed"]
    assert completed_before == list(STEP_NAMES[: case.index + case.recorded]), (case.point, before)

    second = workers(extra_env=case.env)

    status = await wait_closed(client, run_id, timeout=120)
    check_resume(case, first, second, status, provider.url, run_id)
    # Results recorded before the crash are the results the run ends with.
    for before_step, after_step in zip(before["steps"], status["steps"], strict=True):
        if before_step["status"] == "completed":
            assert after_step["result"] == before_step["result"]


@pytest.mark.parametrize("case", [c for c in CASES if c.engine == "runrecord"], ids=lambda c: c.id)
async def test_runrecord_resumes_at_the_right_step(case: Case, runrecord, db, provider):
    run_id = new_run_id(case)
    # The default lease (10 s): the resume below starts at once, so it must take
    # over the dead holder's lease before expiry (durable_agents.runrecord.lease), not wait it out.
    env = {**case.env, "RUNRECORD_LEASE_SECONDS": "10"}
    first = runrecord("start", run_id, TASK, "--email", EMAIL, env={**env, "CRASH_AT": case.point})
    assert wait_exit(first, timeout=90) == -9, first.output()
    assert f"CRASH_AT={case.point}" in first.output()

    with RunRecord(db) as record:
        before = record_status(record, run_id)
    completed_before = [s["name"] for s in before["steps"] if s["status"] == "completed"]
    assert completed_before == list(STEP_NAMES[: case.index + case.recorded]), (case.point, before)

    second = runrecord("resume", run_id, env=env)
    assert wait_exit(second, timeout=120) == 0, second.output()
    with RunRecord(db) as record:
        status = record_status(record, run_id)
    check_resume(case, first, second, status, provider.url, run_id)
    for before_step, after_step in zip(before["steps"], status["steps"], strict=True):
        if before_step["status"] == "completed":
            assert after_step["result"] == before_step["result"]


@pytest.mark.skipif(not HAVE_DBOS, reason="DBOS Transact is an optional extra: pip install -e '.[dbos]' "
                                          "(make test installs it)")
@pytest.mark.parametrize("case", DBOS_CASES, ids=lambda c: c.id)
async def test_dbos_resumes_at_the_right_step(case: Case, dbos_procs, provider):
    check_dbos_case(case, dbos_procs, provider, new_run_id(case), dbos_procs.db)


@pytest.mark.skipif(not HAVE_DBOS, reason="DBOS Transact is an optional extra: pip install -e '.[dbos]' "
                                          "(make test installs it)")
@pytest.mark.parametrize("case", PG_CASES, ids=lambda c: c.id)
async def test_dbos_on_postgres_resumes_at_the_right_step(case: Case, dbos_procs, provider, postgres):
    from durable_agents.dbosflow.compare import dbos_side
    from lab.postgres import database_name

    run_id = new_run_id(case)
    db = postgres.url(database_name("cm", run_id))
    check_dbos_case(case, dbos_procs, provider, run_id, db)
    # The rows the lab reads outside DBOS (durable_agents.dbosflow.sysdb), read on PostgreSQL: one per step, sized, and
    # the dispatch each was recorded in (DBOS's recovery_attempts, read by the workflow itself).
    side = dbos_side(db, run_id)
    assert side["totals"]["operation_outputs_rows"] == len(STEP_NAMES) and side["totals"]["bytes"] > 0, side
    dispatches = {r["name"]: r["dispatch"] for r in side["rows"]}
    assert dispatches == {s: 1 if s in STEP_NAMES[: case.index + case.recorded] else 2 for s in STEP_NAMES}, side


def check_dbos_case(case: Case, dbos_procs, provider, run_id: str, db) -> None:
    """One DBOS case on ``db`` (a SQLite path, or a PostgreSQL URL given to the processes as DBOSFLOW_DB)."""
    from durable_agents.dbosflow import status as dbos_status

    where = {"DBOSFLOW_DB": str(db)}
    first = dbos_procs("start", run_id, TASK, "--email", EMAIL, crash_at=case.point, env={**case.env, **where})
    assert wait_exit(first, timeout=90) == -9, first.output()
    assert f"CRASH_AT={case.point}" in first.output()

    before = dbos_status.status_of(dbos_status.read(db, run_id))
    assert before["status"] == "running", before
    completed_before = [s["name"] for s in before["steps"] if s["status"] == "completed"]
    assert completed_before == list(STEP_NAMES[: case.index + case.recorded]), (case.point, before)

    second = dbos_procs("resume", run_id, env={**case.env, **where})
    assert wait_exit(second, timeout=120) == 0, second.output()
    status = dbos_status.status_of(dbos_status.read(db, run_id))
    check_resume(case, first, second, status, provider.url, run_id)
    for before_step, after_step in zip(before["steps"], status["steps"], strict=True):
        if before_step["status"] == "completed":
            assert after_step["result"] == before_step["result"]
