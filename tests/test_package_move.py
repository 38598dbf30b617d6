"""Runs in flight survive the move of the adapter into one package (durable_agents 0.2.0): runs started by
the code before it (``PRE_MOVE``, checked out as a git worktree, its modules at the top of the tree) and killed
mid-run are finished by this checkout's, on every engine, each effect once.

Nothing a run records names a module path: Temporal's workflow and activity names are the classes' and
functions' names; DBOS recovers a run by its workflow's name (``agent_flow``, ``agent_loop``) and by an
application version derived from the flow's or the agent's shape, never from where the code lives; the run
record's rows hold JSON. DBOS pickles what a run records, and a pickled exception names its class's module:
a run the old code failed is read by this code too (its error is recorded as text)."""

from __future__ import annotations

import uuid
from collections import Counter
from pathlib import Path

import pytest

from durable_agents.providerclient import fetch_effects, seed_orders
from lab.engines import driver_for, started_steps
from tests.loop_support import ORDERS, assert_each_effect_once
from tests.loop_support import TASK as LOOP_TASK
from tests.support import EMAIL, TASK, worktree_of

pytestmark = pytest.mark.process

PRE_MOVE = "98dd6a72799ee3d15d62d5187e01267a26b65ae8"
"""Main before the adapter became one package: ``steps``, ``workflows``, ``runrecord``, ``dbosflow``... at the
top of the tree, run as ``python -m dbosflow``, ``python -m runrecord``, ``worker.py``."""

ENGINES = ("temporal", "runrecord", "dbos")
FLOW_POINT = "send_confirmation:after_effect"  # the email applied, its step not recorded
LOOP_POINT = "tool:issue_refund:after_effect"  # the refund applied, its call's result not recorded


@pytest.fixture(scope="module")
def pre_move(tmp_path_factory):
    where = tmp_path_factory.mktemp("pre-move") / f"main-{PRE_MOVE[:12]}"
    with worktree_of(PRE_MOVE, where, "the code before the adapter was one package") as checkout:
        assert (checkout / "dbosflow" / "engine.py").exists() and not (checkout / "durable_agents" / "steps").exists()
        yield checkout


def _env(tmp_path: Path, provider) -> dict[str, str]:
    return {"PROVIDER_URL": provider.url, "RUNRECORD_DB": str(tmp_path / "runrecord.db"),
            "DBOSFLOW_DB": str(tmp_path / "dbosflow.db"), "MEMORY_DB": str(tmp_path / "memory.db")}


def _drivers(engine: str, env: dict[str, str], dev_server, pre_move: Path):
    old = driver_for(engine, env, server=dev_server, code=pre_move)
    same_queue = {"queue": old.queue} if engine == "temporal" else {}
    return old, driver_for(engine, env, server=dev_server, **same_queue)


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_flow_run_the_old_code_died_in_is_finished_by_the_new(engine, pre_move, dev_server, provider,
                                                                      tmp_path):
    run_id = f"move-flow-{engine}-{uuid.uuid4().hex[:8]}"
    old, new = _drivers(engine, _env(tmp_path, provider), dev_server, pre_move)
    with old, new:
        await old.killed(await old.start(run_id, TASK, EMAIL, crash_at=FLOW_POINT))
        done = await new.resume(run_id)
        assert done.completed, done.proc.output()
        assert "draft" not in started_steps(done.proc), done.proc.output()
    effects = fetch_effects(provider.url, run_id=run_id)
    assert Counter(e.kind for e in effects) == {"email": 1, "ticket": 1}, effects
    assert all(e.effects_applied == 1 for e in effects), effects


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_loop_run_the_old_code_died_in_is_finished_by_the_new(engine, pre_move, dev_server, provider,
                                                                      tmp_path):
    run_id = f"move-loop-{engine}-{uuid.uuid4().hex[:8]}"
    seed_orders(provider.url, ORDERS)
    old, new = _drivers(engine, _env(tmp_path, provider), dev_server, pre_move)
    with old, new:
        await old.killed(await old.start_loop(run_id, LOOP_TASK, EMAIL, crash_at=LOOP_POINT))
        done = await new.resume(run_id)
        assert done.completed, done.proc.output()
        status = await new.loop_status(run_id)
    assert status is not None and status["status"] == "completed", status
    assert_each_effect_once(provider.url, run_id)


async def test_a_dbos_run_the_old_code_failed_reads_failed_naming_the_step(pre_move, dev_server, provider, tmp_path):
    """DBOS pickled the old code's error; this code reads the run as failed, naming the step and the reason."""
    run_id = f"move-failed-{uuid.uuid4().hex[:8]}"
    old, new = _drivers("dbos", _env(tmp_path, provider), dev_server, pre_move)
    with old, new:
        refused = await old.start(run_id, TASK, "nobody@mailbox.invalid")
        assert await old.exit_code(refused) == 1, refused.output()
        status = await new.status(run_id)
    assert status is not None and status["status"] == "failed", status
    assert status["error"].startswith("step send_confirmation failed after 1 attempt(s): the provider refused"), status
