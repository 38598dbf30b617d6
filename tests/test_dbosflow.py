"""The flow on DBOS Transact (``python -m durable_agents.dbosflow``), with real processes: a
real provider that counts effects, DBOS processes killed by SIGKILL, DBOS's
SQLite system database in the test's temp dir.

What DBOS does and the lab relies on, each checked here: a run completes
with every effect once; resume by run id recovers a killed run at the first
step DBOS had not recorded; a permanent error ends the run failed naming the
step, and failed is not resumed; transient errors are retried by DBOS's step
options a bounded number of times, then fail naming the step; a run started
under another application version is not recovered (parked) until a process
of its version runs; one death too many, by the limit the run recorded at
start (not the recovering process's), fails the step as on the other engines,
and DBOS's own dead letter is only the backstop behind it.

The crash matrix (tests/test_crash_matrix.py) kills DBOS at every crash point.
Skipped, saying why, when the optional extra is not installed.
"""

from __future__ import annotations

import json
import uuid
from types import SimpleNamespace

import httpx
import pytest

pytest.importorskip("dbos",
                    reason="DBOS Transact is an optional extra: pip install -e '.[dbos]' (make test installs it)")

from durable_agents.dbosflow.engine import APP_VERSION, RECOVERY_BACKSTOP, dbos_max_attempts  # noqa: E402
from durable_agents.dbosflow.status import status_of  # noqa: E402
from durable_agents.providerclient import fetch_effects  # noqa: E402
from durable_agents.steps.keys import idempotency_key  # noqa: E402
from durable_agents.steps.plan import FLOW  # noqa: E402
from durable_agents.steps.retry import MOST_WORKER_DEATHS, RetryRule, rule_from_env  # noqa: E402
from durable_agents.steps.startedline import started_in, started_steps  # noqa: E402
from tests.support import EMAIL, TASK, executions, wait_exit  # noqa: E402


def status(dbos_procs, run_id: str, env: dict | None = None) -> tuple[int, dict]:
    proc = dbos_procs("status", run_id, "--json", env=env)
    code = wait_exit(proc, timeout=60)
    return code, json.loads(proc.output()[proc.output().index("{"):])


def effects(provider, run_id: str) -> dict[str, tuple[int, int]]:
    return {e.key: (e.requests, e.effects_applied) for e in fetch_effects(provider.url, run_id=run_id)}


def new_id(name: str) -> str:
    return f"dbos-{name}-{uuid.uuid4().hex[:6]}"


def test_a_run_completes_with_each_effect_once_and_status_speaks_the_shared_vocabulary(dbos_procs, provider):
    run_id = new_id("ok")
    proc = dbos_procs("start", run_id, TASK, "--email", EMAIL)
    assert wait_exit(proc, timeout=90) == 0, proc.output()
    assert [(s.step, s.run_id, s.attempt) for s in started_in(proc.output())] == [
        (step, run_id, 1) for step in ("draft", "send_confirmation", "record_outcome")], proc.output()
    code, st = status(dbos_procs, run_id)
    assert code == 0 and st["status"] == "completed" and st["current_step"] is None, st
    assert set(st) == {"run_id", "status", "current_step", "error", "detail", "steps"}
    assert [(s["name"], s["status"], s["attempts"], s["crashes"]) for s in st["steps"]] == [
        ("draft", "completed", 1, 0), ("send_confirmation", "completed", 1, 0), ("record_outcome", "completed", 1, 0)]
    assert st["steps"][1]["result"]["idempotency_key"] == idempotency_key(run_id, "send_confirmation")
    assert effects(provider, run_id) == {idempotency_key(run_id, "send_confirmation"): (1, 1),
                                         idempotency_key(run_id, "record_outcome"): (1, 1)}
    again = dbos_procs("start", run_id, TASK, "--email", EMAIL)
    assert wait_exit(again, timeout=60) == 3 and "already exists" in again.output()
    # settle asks the provider by each effect step's key; it reads, and DBOS's record is not written.
    settled = dbos_procs("settle", run_id, "--json")
    assert wait_exit(settled, timeout=60) == 0, settled.output()
    report = json.loads(settled.output()[settled.output().index("{"):])
    assert [(e["step"], e["key"], e["state"]) for e in report["steps"]] == [
        (step, idempotency_key(run_id, step), "applied") for step in ("send_confirmation", "record_outcome")]
    assert report["run_status"] == "completed"


def test_a_permanent_error_fails_the_run_naming_the_step_and_resume_refuses_it(dbos_procs, provider):
    run_id = new_id("bounce")
    proc = dbos_procs("start", run_id, TASK, "--email", "nobody@mailbox.invalid")
    assert wait_exit(proc, timeout=90) == 1, proc.output()
    assert executions(proc, "send_confirmation") == 1, proc.output()  # not retried
    code, st = status(dbos_procs, run_id)
    assert code == 1 and st["status"] == "failed", st
    assert st["error"].startswith("step send_confirmation failed after 1 attempt(s): the provider refused"), st
    assert st["steps"][1]["status"] == "failed" and st["steps"][2]["status"] == "pending"
    resume = dbos_procs("resume", run_id)
    assert wait_exit(resume, timeout=60) == 4 and "does not run a failed workflow again" in resume.output()
    assert "step " not in resume.output().split("refused")[-1]


def test_transient_errors_are_retried_by_dbos_step_options_then_fail_naming_the_step(dbos_procs, provider):
    budget = RetryRule(budget_seconds=2)
    assert dbos_max_attempts(budget) == 4 and dbos_max_attempts(RetryRule()) == 13
    httpx.post(f"{provider.url}/admin/faults", json={"fail_next": 2, "kinds": ["email"]}).raise_for_status()
    ok = new_id("flaky")
    proc = dbos_procs("start", ok, TASK, "--email", EMAIL)
    assert wait_exit(proc, timeout=90) == 0, proc.output()
    assert [f"attempt {n}" in proc.output() for n in (1, 2, 3)] == [True] * 3, proc.output()
    code, st = status(dbos_procs, ok)
    assert st["steps"][1]["attempts"] == 3 and effects(provider, ok)[idempotency_key(ok, "send_confirmation")][1] == 1

    httpx.post(f"{provider.url}/admin/faults", json={"fail_next": 1000, "kinds": ["email"]}).raise_for_status()
    down = new_id("down")
    proc = dbos_procs("start", down, TASK, "--email", EMAIL, env={"LAB_RETRY_BUDGET_SECONDS": "2"})
    assert wait_exit(proc, timeout=90) == 1, proc.output()
    assert executions(proc, "send_confirmation") == 4, proc.output()
    code, st = status(dbos_procs, down)
    assert code == 1 and "step send_confirmation failed after 4 attempt(s): DBOS's step retries spent" in st["error"]
    assert "injected_fault" in st["error"], st
    httpx.delete(f"{provider.url}/admin/faults").raise_for_status()


def test_a_run_of_another_application_version_is_parked_until_its_version_runs(dbos_procs, provider):
    run_id = new_id("version")
    first = dbos_procs("start", run_id, TASK, "--email", EMAIL, crash_at="record_outcome:before")
    assert wait_exit(first, timeout=90) == -9, first.output()
    v2 = {"DBOSFLOW_APP_VERSION": "agentlab-flow-2"}
    code, st = status(dbos_procs, run_id, env=v2)
    assert code == 3 and st["status"] == "parked" and APP_VERSION in st["detail"], st
    refused = dbos_procs("resume", run_id, env=v2)
    assert wait_exit(refused, timeout=60) == 6 and f"DBOSFLOW_APP_VERSION={APP_VERSION}" in refused.output()
    assert executions(refused, "record_outcome") == 0
    # Resuming another run launches DBOS under v2: it recovers v2's runs only, so this one still waits.
    other = dbos_procs("start", new_id("v2"), TASK, "--email", EMAIL, env=v2)
    assert wait_exit(other, timeout=90) == 0, other.output()
    assert f"run {run_id}" not in other.output()
    code, st = status(dbos_procs, run_id)
    assert code == 0 and st["status"] == "running" and st["current_step"] == "record_outcome", st
    resumed = dbos_procs("resume", run_id)
    assert wait_exit(resumed, timeout=90) == 0, resumed.output()
    assert started_steps(resumed.output()) == ["record_outcome"], resumed.output()
    assert effects(provider, run_id)[idempotency_key(run_id, "record_outcome")] == (1, 1)


def test_a_step_that_keeps_killing_its_process_fails_at_the_limit_its_run_recorded(dbos_procs, provider):
    """The worker-death limit is the one the run recorded at start, not the recovering process's:
    the resumes run under other limits (10, then 5) and the run still fails at its own (1), before
    the step runs a third time, in the other engines' words."""
    run_id = new_id("poison")
    first = dbos_procs("start", run_id, TASK, "--email", EMAIL, crash_at="send_confirmation:before",
                       env={"LAB_MAX_WORKER_DEATHS": "1"})
    assert wait_exit(first, timeout=90) == -9, first.output()
    second = dbos_procs("resume", run_id, crash_at="send_confirmation:before", env={"LAB_MAX_WORKER_DEATHS": "10"})
    assert wait_exit(second, timeout=90) == -9, second.output()
    third = dbos_procs("resume", run_id, env={"LAB_MAX_WORKER_DEATHS": "5"})
    assert wait_exit(third, timeout=90) == 1, third.output()
    assert "step send_confirmation started" not in third.output()  # refused before running it again
    code, st = status(dbos_procs, run_id)
    assert code == 1 and st["status"] == "failed", st
    assert st["error"].startswith("step send_confirmation failed after 2 attempt(s): worker died 2 times during "
                                  "send_confirmation (the limit is 1; LAB_MAX_WORKER_DEATHS)"), st
    step = st["steps"][1]
    assert (step["status"], step["attempts"], step["crashes"]) == ("in_doubt", 2, 2), step
    assert "dispatch 2 died" in step["last_error"], step
    assert idempotency_key(run_id, "send_confirmation") not in effects(provider, run_id)


def test_dbos_own_recovery_limit_is_a_backstop_no_recorded_rule_reaches():
    """DBOS's max_recovery_attempts is fixed per process; it sits past the last dispatch the lab's
    per-step check can need (every step at the highest recordable limit, then one death more)."""
    assert rule_from_env({"LAB_MAX_WORKER_DEATHS": str(MOST_WORKER_DEATHS)}).max_worker_deaths == MOST_WORKER_DEATHS
    with pytest.raises(ValueError, match="LAB_MAX_WORKER_DEATHS"):
        rule_from_env({"LAB_MAX_WORKER_DEATHS": str(MOST_WORKER_DEATHS + 1)})
    last_dispatch_the_check_needs = 1 + len(FLOW) * MOST_WORKER_DEATHS + 1
    assert last_dispatch_the_check_needs <= RECOVERY_BACKSTOP + 1  # DBOS dead-letters past max + 1 dispatches


def test_the_backstop_dead_letter_reads_as_failed_naming_the_step():
    draft = {"function_name": "draft", "error": None,
             "output": {"dispatch": 1, "attempt": 1, "result": {"subject": "s"}}}
    wf = SimpleNamespace(workflow_id="dbos-dead", status="MAX_RECOVERY_ATTEMPTS_EXCEEDED", recovery_attempts=9,
                         app_version=APP_VERSION, error=None, executor_id="local")
    st = status_of({"workflow": wf, "steps": [draft]}, version=APP_VERSION)
    assert st["status"] == "failed" and st["current_step"] == "send_confirmation", st
    assert st["error"].startswith("step send_confirmation failed after 8 dispatch(es) died"), st
    assert "MAX_RECOVERY_ATTEMPTS_EXCEEDED" in st["error"], st
    assert st["steps"][1]["status"] == "in_doubt" and st["steps"][2]["status"] == "pending", st
