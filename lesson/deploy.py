"""The restart that is a deploy, and the one that is a move, on every engine.

    make scenario-deploy      (or: python -m lesson.scenario --deploy [--json])

A run waits between step 2 and step 3 (its process killed there); new code
is deployed (a checkout of its own, patched, as a release would be) and
started; what happens to the waiting run is read from the processes, the
engines' records and the provider's counts. The changes:

``before``
    a step inserted *before* the waiting point (a pause before the email):
    it changes the recorded past. The run record's step-name check refuses
    to resume (exit 6; the rolled-back code resumes it). Temporal replays the
    new code against the history, meets a timer where the history has the
    email's activity, and parks the run (non-determinism, visible in
    ``starter.py status``); the rolled-back code finishes it.
``before, versioned``
    the same change behind ``workflow.patched``: the waiting run replays
    without the marker and finishes on the old path; a run started after the
    deploy records the marker and takes the new one (Temporal only: the run
    record has no versioning, its flow is one list).
``after``
    a step added *after* the waiting point (a pause between the email and the
    ticket): nothing in the recorded past changes. Temporal replays the
    recorded steps, then meets the new code beyond the history and runs it:
    the waiting run finishes through the pause. The run record refuses it
    like any change to its list of steps (its check compares the whole list,
    not the part already done; exit 6), and the rolled-back code resumes it.
``rule``
    a changed retry rule (the default budget), nothing in the recorded past:
    every engine continues. A started run keeps the rule it recorded.
``moved``
    not a code change: the run is finished by a process with another identity
    and another state directory, as after a move to another machine (a
    Temporal worker with ``--identity``; the run record's file copied and
    resumed from its new place).

The in-memory "before" has nothing to be broken: whatever the change, it
starts over at step 1 and sends the email twice.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from durable_agents.providerclient import fetch_effects
from durable_agents.steps.plan import STEP_NAMES
from lab.engines import EngineDriver, EngineError, TemporalDriver, driver_for, started_steps
from lab.processes import LAB_SERVER_CONFIG, REPO, DevServer
from lab.provider_process import ProviderProcess, start_provider
from lesson.effects import per_step

TASK = "Confirm the refund for order 1234"
EMAIL = "ada@example.com"
PACKAGES = ("durable_agents", "lab", "lesson", "provider")  # the adapter, and the lab's parts a release's processes run
TIMEOUT = 90.0

# The patches a "release" makes to a checkout: (file, old text, new text).
SEND = "        sent = await self._attempts("
RECORD = "        await self._attempts(\n            FlowActivities.record_outcome,\n"
PAUSE_STEP = ("async def _pause(request: Any, deps: Any) -> dict:\n    return {}\n\n\n"
              "def _no_request(inputs: Any, results: Any) -> None:\n    return None\n\n\n")


def _pause_release(where: str, workflow_call: str, next_step: str) -> list[tuple[str, str, str]]:
    """A release that adds a pause ``where``: on Temporal a timer before ``workflow_call``, unversioned;
    on the run record a step of the plan before ``next_step``."""
    return [
        ("durable_agents/workflows/agent_flow.py", workflow_call,
         f"        await workflow.sleep(0.01)  # the release: a pause {where}\n" + workflow_call),
        ("durable_agents/steps/plan.py", f'    FlowStep("{next_step}",',
         f'    FlowStep("pause", _pause, _no_request),  # the release: a pause {where}\n'
         f'    FlowStep("{next_step}",'),
        ("durable_agents/steps/plan.py", "FLOW: tuple[FlowStep, ...] = (",
         PAUSE_STEP + "FLOW: tuple[FlowStep, ...] = ("),
    ]


PATCHES: dict[str, list[tuple[str, str, str]]] = {
    "before": _pause_release("before the email", SEND, "send_confirmation"),
    "after": _pause_release("after the email", RECORD, "record_outcome"),
    "before, versioned": [
        ("durable_agents/workflows/agent_flow.py", SEND,
         '        if workflow.patched("pause-before-send"):  # the release, versioned\n'
         "            await workflow.sleep(0.01)\n" + SEND),
    ],
    "rule": [
        ("durable_agents/steps/retry.py", "DEFAULT_BUDGET_SECONDS = 900.0",
         "DEFAULT_BUDGET_SECONDS = 600.0  # the release"),
    ],
    "moved": [],
}
# The run record compares the whole list of steps: a step added before or after the waiting point alike.
_RECORD_REFUSES = {"with the new code": "refused: the flow changed (exit 6)",
                   "then": "rolled back: resumed at step 3 record_outcome", "email applied": 1, "ticket applied": 1}
EXPECTED: dict[tuple[str, str], dict[str, Any]] = {
    ("in_memory", "before"): {"with the new code": "started over at step 1 draft", "then": "-",
                              "email applied": 2, "ticket applied": 1},
    ("runrecord", "before"): _RECORD_REFUSES,
    ("runrecord", "after"): _RECORD_REFUSES,
    ("runrecord", "rule"): {"with the new code": "resumed at step 3 record_outcome", "then": "-",
                            "email applied": 1, "ticket applied": 1},
    ("runrecord", "moved"): {"with the new code": "resumed at step 3 record_outcome", "then": "-",
                             "email applied": 1, "ticket applied": 1},
    ("temporal", "before"): {"with the new code": "parked: NON_DETERMINISTIC_ERROR",
                             "then": "rolled back: finished at step 3 record_outcome",
                             "email applied": 1, "ticket applied": 1},
    ("temporal", "before, versioned"): {"with the new code": "finished at step 3 record_outcome, on the old path",
                                        "then": "a run started now takes the new path",
                                        "email applied": 1, "ticket applied": 1},
    ("temporal", "after"): {"with the new code": "finished at step 3 record_outcome, through the new pause",
                            "then": "-", "email applied": 1, "ticket applied": 1},
    ("temporal", "rule"): {"with the new code": "finished at step 3 record_outcome", "then": "-",
                           "email applied": 1, "ticket applied": 1},
    ("temporal", "moved"): {"with the new code": "finished at step 3 record_outcome, by worker elsewhere-1",
                            "then": "-", "email applied": 1, "ticket applied": 1},
}


class DeployError(RuntimeError):
    """The scenario could not be played as planned (a process did not start or die)."""


@dataclass
class Row:
    engine: str
    change: str
    run_id: str
    outcome: str = ""
    then: str = "-"
    ran_again: list[str] = field(default_factory=list)
    email_applied: int = 0
    ticket_applied: int = 0

    def comparable(self) -> dict[str, Any]:
        return {"with the new code": self.outcome, "then": self.then, "email applied": self.email_applied,
                "ticket applied": self.ticket_applied}

    @property
    def ok(self) -> bool:
        return self.comparable() == EXPECTED[(self.engine, self.change)]

    def to_json(self) -> dict[str, Any]:
        return {"engine": self.engine, "change": self.change, "run_id": self.run_id, **self.comparable(),
                "steps run again by the new code": self.ran_again, "expected": EXPECTED[(self.engine, self.change)],
                "ok": self.ok}


def checkout(root: Path, change: str) -> Path:
    """A copy of the code, patched as a release with ``change`` would be."""
    for package in PACKAGES:
        shutil.copytree(REPO / package, root / package, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("worker.py", "starter.py"):
        shutil.copy(REPO / name, root / name)
    for path, old, new in PATCHES[change]:
        file = root / path
        text = file.read_text()
        if text.count(old) != 1:
            raise DeployError(f"the {change!r} release no longer applies to {path}: {old.strip()!r} not found once")
        file.write_text(text.replace(old, new))
    return root


class Deploy:
    def __init__(self, work: Path, say: Callable[[str], None]) -> None:
        self.work, self.say = work, say
        self.stamp = time.strftime("%H%M%S")
        self.env: dict[str, str] = {}
        self.provider_url = ""
        self.checkouts: dict[str, Path] = {}
        self.drivers: list[EngineDriver] = []

    def code(self, change: str | None) -> Path:
        """The repository itself (None: the code the run started with), or the release's checkout."""
        if change is None:
            return REPO
        if change not in self.checkouts:
            self.checkouts[change] = checkout(self.work / f"release-{_slug(change)}", change)
        return self.checkouts[change]

    def driver(self, engine: str, change: str | None = None, *, server: DevServer | None = None,
               queue: str | None = None, env: dict[str, str] | None = None) -> EngineDriver:
        """The engine's driver, running the code of ``change`` (None: the code the run started with)."""
        options: dict[str, Any] = {"queue": queue} if queue else {}
        found = driver_for(engine, {**self.env, **(env or {})}, server=server, code=self.code(change),
                           timeout=TIMEOUT, **options)
        self.drivers.append(found)
        return found

    def effects(self, row: Row) -> Row:
        steps = per_step(fetch_effects(self.provider_url, run_id=row.run_id))
        row.email_applied = steps.get("send_confirmation", {}).get("applied", 0)
        row.ticket_applied = steps.get("record_outcome", {}).get("applied", 0)
        return row

    # -- in memory ------------------------------------------------------------

    async def in_memory(self) -> Row:
        row = Row("in_memory", "before", f"deploy-mem-{self.stamp}")
        old = self.driver("in_memory")
        await old.killed(await old.start(row.run_id, TASK, EMAIL, crash_at="in_memory:after_send_confirmation"))
        new = self.driver("in_memory", "before")  # the same command, with the new code: it starts over
        again = await new.settle(row.run_id, await new.start(row.run_id, TASK, EMAIL))
        if again.code != 0:
            raise DeployError(f"the in-memory flow did not finish:\n{again.proc.output()}")
        row.ran_again = started_steps(again.proc)
        row.outcome = f"started over at step 1 {row.ran_again[0]}" if row.ran_again else "ran nothing"
        return self.effects(row)

    # -- run record -----------------------------------------------------------

    async def runrecord(self, change: str) -> Row:
        row = Row("runrecord", change, f"deploy-rec-{_slug(change)}-{self.stamp}")
        old = self.driver("runrecord")
        await old.killed(await old.start(row.run_id, TASK, EMAIL, crash_at="runrecord:send_confirmation:after_record"))
        if change == "moved":  # the same code, the record's file copied to another directory and resumed there
            moved = self.work / "elsewhere"
            moved.mkdir(exist_ok=True)
            for suffix in ("", "-wal", "-shm"):
                src = self.work / f"runrecord.db{suffix}"
                if src.exists():
                    shutil.copy(src, moved / src.name)
            new = self.driver("runrecord", env={"RUNRECORD_DB": str(moved / "runrecord.db"),
                                               "MEMORY_DB": str(moved / "memory.db")})
        else:
            new = self.driver("runrecord", change)
        resumed = await new.resume(row.run_id)
        row.ran_again = started_steps(resumed.proc)
        if resumed.code == 6:
            row.outcome = "refused: the flow changed (exit 6)"
            back = await old.resume(row.run_id)
            if back.code != 0:
                raise DeployError(f"the rolled-back resume failed:\n{back.proc.output()}")
            row.then = f"rolled back: resumed at {self._where(started_steps(back.proc)[:1])}"
        elif resumed.code == 0:
            row.outcome = f"resumed at {self._where(row.ran_again[:1])}"
        else:
            raise DeployError(f"resume with the {change!r} release exited {resumed.code}:\n{resumed.proc.output()}")
        return self.effects(row)

    @staticmethod
    def _where(first: list[str]) -> str:
        return f"step {STEP_NAMES.index(first[0]) + 1} {first[0]}" if first and first[0] in STEP_NAMES else "nothing"

    # -- Temporal ---------------------------------------------------------------

    async def temporal(self, server: DevServer, change: str) -> Row:
        row = Row("temporal", change, f"deploy-tmp-{_slug(change)}-{self.stamp}")
        queue = f"deploy-{_slug(change)}-{self.stamp}"
        old = self.driver("temporal", server=server, queue=queue)
        assert isinstance(old, TemporalDriver)
        # Killed in the workflow task after step 2: the email's completion is in the history and step 3 is
        # not yet scheduled, so the recorded past ends exactly between step 2 and step 3.
        await old.killed(await old.start(row.run_id, TASK, EMAIL, crash_at="temporal:send_confirmation:after_record",
                                         name="worker-old"))
        if change == "moved":  # the same code, on a worker with another identity and another memory file
            new = self.driver("temporal", server=server, queue=queue,
                              env={"MEMORY_DB": str(self.work / "elsewhere-memory.db")})
            args = ["--identity", "elsewhere-1"]
        else:
            new, args = self.driver("temporal", change, server=server, queue=queue), []
        assert isinstance(new, TemporalDriver)
        settled = await new.resume(row.run_id, args=args, name="worker-new")
        status = settled.status
        assert status is not None  # Temporal's status is read from the server: there is always one
        row.ran_again = [s for s in started_steps(settled.proc) if s != "record_outcome"]
        if status["status"] == "parked":
            cause = "NON_DETERMINISTIC_ERROR" if "NON_DETERMINISTIC_ERROR" in (status["detail"] or "") else "other"
            row.outcome = f"parked: {cause}"
            settled.proc.kill()
            await old.start_worker(name="worker-rollback")
            await old.wait_for(row.run_id, lambda s: s["status"] == "completed")
            row.then = "rolled back: finished at step 3 record_outcome"
        elif status["status"] == "completed":
            row.outcome = "finished at step 3 record_outcome"
            client = await new.client()
            history = await client.get_workflow_handle(row.run_id).fetch_history()
            if change == "after":
                row.outcome += ", through the new pause" if _has_timer(history) else ", WITHOUT the new pause"
            if change == "before, versioned":
                row.outcome += ", on the old path" if not _has_timer(history) else ", on the NEW path"
                fresh = f"{row.run_id}-after"
                await new.submit(fresh, TASK, EMAIL)
                await client.get_workflow_handle(fresh).result()
                took = _has_timer(await client.get_workflow_handle(fresh).fetch_history())
                row.then = "a run started now takes the new path" if took else "a run started now takes the OLD path"
            if change == "moved":
                identities = {e.activity_task_started_event_attributes.identity for e in history.events
                              if e.HasField("activity_task_started_event_attributes")}
                row.outcome += f", by worker {'elsewhere-1' if 'elsewhere-1' in identities else '?'}"
        else:
            row.outcome = f"failed: {status['error']}"
        return self.effects(row)

    # -- all of it --------------------------------------------------------------

    def play(self) -> list[Row]:
        return asyncio.run(self._play())

    async def _play(self) -> list[Row]:
        server = DevServer(dynamic_config=LAB_SERVER_CONFIG)
        provider: ProviderProcess | None = None
        try:
            self.say("starting a provider and a Temporal dev server (in memory)")
            provider = start_provider(self.work / "provider.db")
            self.provider_url = provider.url
            self.env = {"PROVIDER_URL": self.provider_url, "MEMORY_DB": str(self.work / "memory.db"),
                        "RUNRECORD_DB": str(self.work / "runrecord.db")}
            await asyncio.to_thread(server.start)
            rows = [await self.in_memory()]
            for change in ("before", "after", "rule", "moved"):
                rows.append(await self.runrecord(change))
                self.say(_line(rows[-1]))
            for change in ("before", "before, versioned", "after", "rule", "moved"):
                rows.append(await self.temporal(server, change))
                self.say(_line(rows[-1]))
            return rows
        finally:
            for driver in reversed(self.drivers):
                driver.close()
            if provider is not None:
                provider.kill()
            server.stop()


def _slug(change: str) -> str:
    return change.replace(", ", "-").replace(" ", "-")


def _has_timer(history) -> bool:
    return any(e.HasField("timer_started_event_attributes") for e in history.events)


HEADER = (f"{'engine':<10} {'release':<18} {'the waiting run, with the new code':<58} {'then':<46} "
          f"{'email':>5} {'ticket':>6}  check")


def _line(row: Row) -> str:
    return (f"{row.engine:<10} {row.change:<18} {row.outcome:<58} {row.then:<46} {row.email_applied:>5} "
            f"{row.ticket_applied:>6}  {'as expected' if row.ok else 'NOT AS EXPECTED'}")


def render(rows: list[Row]) -> str:
    return "\n".join([HEADER, "-" * len(HEADER), *(_line(r) for r in rows)])


def main(as_json: bool = False, state_dir: str | None = None, say: Callable[[str], None] | None = None) -> int:
    say = say or (lambda text: print(text, file=sys.stderr, flush=True))
    with tempfile.TemporaryDirectory(prefix="deploy-") as tmp:
        work = Path(state_dir or tmp)
        work.mkdir(parents=True, exist_ok=True)
        try:
            rows = Deploy(work, say).play()
        except (DeployError, EngineError, TimeoutError) as err:
            print(f"error: the deploy scenario could not be played: {err}", file=sys.stderr)
            return 2
    if as_json:
        print(json.dumps({"rows": [r.to_json() for r in rows], "ok": all(r.ok for r in rows)}, indent=2))
    else:
        print(render(rows))
    return 0 if all(r.ok for r in rows) else 1
