"""The failure on purpose, on every engine: "the process is restarted between
step two and step three".

    make scenario        (or: python -m lesson.scenario [--json] [--html PATH] [--state-dir DIR] [--task TASK])
    make scenario-deploy (or: python -m lesson.scenario --deploy [--json]): the
                          restart that is a deploy, and a move (lesson/deploy.py)

Starts what it needs (one provider process with its own database, a Temporal
dev server in memory on free ports, workers), stops all of it at the end, and
plays the same restart on every engine, each under its own run id:

==============  =========================================  =================================
engine          killed (SIGKILL, by a crash point)         restarted with
==============  =========================================  =================================
in memory       ``in_memory:after_send_confirmation``      the same ``python -m lesson.in_memory`` command
run record      ``runrecord:send_confirmation:after_record``  ``python -m runrecord resume RUN_ID``
Temporal        worker with ``record_outcome:before``      a new worker process
DBOS            ``dbos:send_confirmation:after_record``    ``python -m dbosflow resume RUN_ID``
                                                           (DBOS's recovery on launch)
==============  =========================================  =================================

The DBOS row needs the optional extra (``pip install -e '.[dbos]'``; ``make
scenario`` installs it); without it the row is left out, saying so.

Then one table: per engine, where the run resumed (the first step the
restarted process executed, from its ``step <name> started`` lines), which
steps executed again (executed by the restarted process although they had
completed before the restart: per the run record / Temporal history, or, for
the in-memory engine which has none, per its own log), and the effects per
step as the provider counted them (keys, requests, effects applied).

With ``--html PATH`` (``make scenario`` writes ``.state/scenario.html``) it also
draws the restart as one page (``lesson.scenario_page``): a lane per engine on
its own time axis, the attempts, the kill and the restart, what was read or
replayed, and the provider's effects under each lane. Times from the
engines' records (and the provider's) are drawn apart from the ones this
module observed (``runrecord.picture`` says which is which); the records are
read before the dev server stops.

Expected: the in-memory engine resumes at step 1, runs steps 1 and 2 again and
the email is applied twice (two random keys, one effect each); the run record,
Temporal and DBOS resume at step 3, run nothing again, and apply every effect once.
Exit code 0 if the observed table is the expected one, 1 if not, 2 if the
scenario could not be played (a process did not start or die as planned).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lab.processes import LAB_SERVER_CONFIG, REPO, DevServer, Proc, start_worker
from lab.provider_process import start_provider
from lesson.effects import describe, per_step
from providerclient import fetch_effects
from runrecord.compare import effect_entries, record_side
from runrecord.picture import Watched
from runrecord.store import RunRecord
from steps.controls import printable
from steps.limits import InputError, check_task
from steps.plan import STEP_NAMES

TASK = "Confirm the refund for order 1234"
EMAIL = "ada@example.com"
ENGINES = ("in_memory", "runrecord", "temporal", "dbos")
LABELS = {
    "in_memory": "in memory (the before)",
    "runrecord": "run record (SQLite)",
    "temporal": "Temporal",
    "dbos": "DBOS (SQLite)",
}
HAVE_DBOS = importlib.util.find_spec("dbos") is not None
CRASH = {
    "in_memory": "in_memory:after_send_confirmation",
    "runrecord": "runrecord:send_confirmation:after_record",
    "temporal": "record_outcome:before",
    "dbos": "dbos:send_confirmation:after_record",
}
EXPECTED: dict[str, dict[str, Any]] = {
    "in_memory": {"resumed_at": "draft", "executed_again": ["draft", "send_confirmation"],
                  "applied": {"send_confirmation": 2, "record_outcome": 1}},
    "runrecord": {"resumed_at": "record_outcome", "executed_again": [],
                  "applied": {"send_confirmation": 1, "record_outcome": 1}},
    "temporal": {"resumed_at": "record_outcome", "executed_again": [],
                 "applied": {"send_confirmation": 1, "record_outcome": 1}},
    "dbos": {"resumed_at": "record_outcome", "executed_again": [],
             "applied": {"send_confirmation": 1, "record_outcome": 1}},
}
PROCESS_TIMEOUT = 120.0  # generous: a busy 2-core machine; a healthy run takes seconds


class ScenarioError(RuntimeError):
    """The scenario could not be played as planned (not: the table differs)."""


@dataclass
class Observed:
    engine: str
    run_id: str
    completed_before: list[str] = field(default_factory=list)
    restarted_executed: list[str] = field(default_factory=list)
    final_status: str = ""
    effects: dict[str, dict[str, int]] = field(default_factory=dict)
    keys: list[dict[str, Any]] = field(default_factory=list)
    # How the restarted process knew what was done: what it read (run record) or replayed (Temporal).
    how_it_knew: str = ""
    # For the picture: what the scenario saw, the engine's own record of the run, the provider's count with times.
    watched: Watched = field(default_factory=Watched)
    record: dict[str, Any] | None = None
    provider: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def resumed_at(self) -> str | None:
        return self.restarted_executed[0] if self.restarted_executed else None

    @property
    def executed_again(self) -> list[str]:
        return [s for s in STEP_NAMES if s in self.completed_before and s in self.restarted_executed]

    def comparable(self) -> dict[str, Any]:
        return {"resumed_at": self.resumed_at, "executed_again": self.executed_again,
                "applied": {step: counts["applied"] for step, counts in self.effects.items()}}

    @property
    def ok(self) -> bool:
        return self.comparable() == EXPECTED[self.engine] and self.final_status == "completed"

    def to_json(self) -> dict[str, Any]:
        return {
            "engine": self.engine, "label": LABELS[self.engine], "run_id": self.run_id,
            "crash_at": CRASH[self.engine], "completed_before_restart": self.completed_before,
            "how_it_knew": self.how_it_knew,
            "resumed_at": self.resumed_at,
            "resumed_at_position": STEP_NAMES.index(self.resumed_at) + 1 if self.resumed_at else None,
            "restarted_process_executed": self.restarted_executed, "executed_again": self.executed_again,
            "final_status": self.final_status, "effects": self.effects, "keys": self.keys,
            "expected": EXPECTED[self.engine], "ok": self.ok,
        }


def executed(text: str) -> list[str]:
    """Steps in the order a process began executing them (its ``step <name> started`` lines)."""
    out = []
    for line in text.splitlines():
        for step in STEP_NAMES:
            if f"step {step} started:" in line:
                out.append(step)
    return out


def wait_exit(proc: Proc, timeout: float = PROCESS_TIMEOUT) -> int:
    try:
        return proc.popen.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise ScenarioError(f"{proc.name} did not exit within {timeout:.0f} s. Its output:\n{proc.output()}") from None


def expect_killed(proc: Proc) -> None:
    code = wait_exit(proc)
    if code != -9:
        raise ScenarioError(f"{proc.name} was to die by SIGKILL at its crash point but exited with {code}. "
                            f"Its output:\n{proc.output()}")


def expect_exit(proc: Proc, wanted: int = 0) -> None:
    code = wait_exit(proc)
    if code != wanted:
        raise ScenarioError(f"{proc.name} exited with {code}, not {wanted}. Its output:\n{proc.output()}")


def knew_at(proc: Proc, needle: str) -> float | None:
    """When ``proc`` printed its first line holding ``needle`` (observed)."""
    return next((at for at, line in proc.stamped() if needle in line), None)


def watch(obs: Observed, first: Proc, second: Proc, killed_at: float, needle: str) -> None:
    """What the scenario saw of the two processes of a run, for the picture."""
    seen = obs.watched
    seen.began_at, seen.killed_at, seen.killed_in = first.started_at, killed_at, CRASH[obs.engine]
    seen.restarted_at, seen.knew_at = second.started_at, knew_at(second, needle) if needle else None
    seen.lines = [(1, at, line) for at, line in first.stamped()] + [(2, at, line) for at, line in second.stamped()]


class Scenario:
    def __init__(self, state: Path, say: Callable[[str], None], stamp: str, task: str = TASK) -> None:
        self.state = state
        self.say = say
        self.stamp = stamp
        self.task = task
        self.procs: list[Proc] = []
        self.provider_url = ""
        self.env: dict[str, str] = {}

    def run_id(self, engine: str) -> str:
        return f"scenario-{engine.replace('_', '-')}-{self.stamp}"

    def spawn(self, name: str, args: list[str], crash_at: str = "") -> Proc:
        proc = Proc(name, [sys.executable, *args], env={**self.env, "CRASH_AT": crash_at})
        self.procs.append(proc)
        return proc

    def observe_effects(self, obs: Observed) -> None:
        effects = fetch_effects(self.provider_url, run_id=obs.run_id)
        obs.effects = per_step(effects)
        obs.provider = effect_entries(effects)
        obs.keys = [{"key": e.key, "kind": e.kind, "requests": e.requests, "applied": e.effects_applied}
                    for e in effects]

    # -- the four engines ----------------------------------------------------

    def in_memory(self) -> Observed:
        obs = Observed("in_memory", self.run_id("in_memory"))
        argv = ["-m", "lesson.in_memory", obs.run_id, self.task, "--email", EMAIL]
        self.say(f"in memory: python -m lesson.in_memory {obs.run_id} ... with CRASH_AT={CRASH['in_memory']}")
        first = self.spawn("in-memory-1", argv, CRASH["in_memory"])
        expect_killed(first)
        killed_at = time.time()
        # No record survives: the only witness of what was done is the dead process's own log.
        obs.completed_before = [s for s in STEP_NAMES if f"step {s} completed:" in first.output()]
        self.say(f"  killed after {', '.join(obs.completed_before)}; starting the same command again")
        second = self.spawn("in-memory-2", argv)
        expect_exit(second, 0)
        watch(obs, first, second, killed_at, "")
        obs.watched.ended_at = time.time()
        obs.restarted_executed = executed(second.output())
        obs.final_status = "completed"
        return obs

    def runrecord(self) -> Observed:
        obs = Observed("runrecord", self.run_id("runrecord"))
        self.say(f"run record: python -m runrecord start {obs.run_id} ... with CRASH_AT={CRASH['runrecord']}")
        # A short lease, so the resume below need not wait out the default 10 s after the SIGKILL.
        first = self.spawn("runrecord-start", ["-m", "runrecord", "start", obs.run_id, self.task, "--email", EMAIL,
                                               "--lease-seconds", "1"], CRASH["runrecord"])
        expect_killed(first)
        killed_at = time.time()
        status = self._record_status(obs.run_id)
        obs.completed_before = [s["name"] for s in status["steps"] if s["status"] == "completed"]
        self.say(f"  killed; the record says completed: {', '.join(obs.completed_before)}; "
                 f"python -m runrecord resume {obs.run_id}")
        deadline = time.monotonic() + PROCESS_TIMEOUT
        while True:
            resumer = self.spawn("runrecord-resume", ["-m", "runrecord", "resume", obs.run_id])
            code = wait_exit(resumer)
            if code != 5 or time.monotonic() > deadline:  # 5: the dead process's lease has not expired yet
                break
            obs.watched.refused_restarts += 1
            time.sleep(0.2)
        if code != 0:
            raise ScenarioError(f"runrecord resume exited with {code}. Its output:\n{resumer.output()}")
        watch(obs, first, resumer, killed_at, "read the record of run")
        obs.watched.ended_at = time.time()
        obs.restarted_executed = executed(resumer.output())
        obs.how_it_knew = next((line for line in resumer.output().splitlines() if "read the record of run" in line), "")
        self.say(f"  {obs.how_it_knew}")
        obs.final_status = self._record_status(obs.run_id)["status"]
        with RunRecord(self.state / "runrecord.db") as record:
            obs.record = record_side(record, obs.run_id)
        return obs

    def _record_status(self, run_id: str) -> dict[str, Any]:
        done = subprocess.run([sys.executable, "-m", "runrecord", "status", run_id, "--json"], cwd=REPO,
                              env={**os.environ, **self.env}, capture_output=True, text=True,
                              timeout=PROCESS_TIMEOUT)
        if done.returncode not in (0, 1):
            raise ScenarioError(f"runrecord status exited with {done.returncode}: {done.stderr}")
        return json.loads(done.stdout)

    async def temporal(self, server: DevServer) -> Observed:
        from flowclient.connect import connect
        from flowclient.runs import start_run
        from flowclient.status import run_status
        from runrecord.compare import temporal_side

        obs = Observed("temporal", self.run_id("temporal"))
        queue = f"lesson-scenario-{self.stamp}"
        env = {**self.env, "CRASH_AT": CRASH["temporal"]}
        self.say(f"Temporal: worker 1 with CRASH_AT={CRASH['temporal']}; starting run {obs.run_id}")
        first = start_worker(server.address, self.provider_url, queue, env, name="worker1")
        self.procs.append(first)
        client = await connect({**os.environ, "TEMPORAL_ADDRESS": server.address, "TEMPORAL_NAMESPACE": "default"})
        await start_run(client, obs.run_id, self.task, EMAIL, queue=queue)
        expect_killed(first)
        killed_at = time.time()
        status = await run_status(client, obs.run_id)
        obs.completed_before = [s["name"] for s in status["steps"] if s["status"] == "completed"]
        self.say(f"  worker 1 killed; history says completed: {', '.join(obs.completed_before)}; starting worker 2")
        second = start_worker(server.address, self.provider_url, queue, {**self.env, "CRASH_AT": ""}, name="worker2")
        self.procs.append(second)
        deadline = time.monotonic() + PROCESS_TIMEOUT
        while status["status"] == "running":
            if time.monotonic() > deadline:
                raise ScenarioError(f"run {obs.run_id} still running after {PROCESS_TIMEOUT:.0f} s: {status}\n"
                                    f"worker 2 output:\n{second.output()}")
            await asyncio.sleep(0.1)
            status = await run_status(client, obs.run_id)
        second.stop()
        watch(obs, first, second, killed_at, "history events of run")
        obs.watched.ended_at, obs.watched.names = time.time(), ("worker 1", "worker 2")
        obs.record = await temporal_side(client, obs.run_id)  # while the dev server still runs
        obs.restarted_executed = executed(second.output())
        replayed = [line for line in second.output().splitlines() if "history events of run" in line]
        obs.how_it_knew = replayed[0].split("temporalio.workflow: ", 1)[-1] if replayed else ""
        self.say(f"  worker 2 {obs.how_it_knew}")
        obs.final_status = status["status"]
        return obs

    def dbos(self) -> Observed:
        obs = Observed("dbos", self.run_id("dbos"))
        self.say(f"DBOS: python -m dbosflow start {obs.run_id} ... with CRASH_AT={CRASH['dbos']}")
        first = self.spawn("dbosflow-start", ["-m", "dbosflow", "start", obs.run_id, self.task, "--email", EMAIL],
                           CRASH["dbos"])
        expect_killed(first)
        killed_at = time.time()
        status = self._dbosflow("status", obs.run_id)
        obs.completed_before = [s["name"] for s in status["steps"] if s["status"] == "completed"]
        self.say(f"  killed; DBOS's step rows say completed: {', '.join(obs.completed_before)}; "
                 f"python -m dbosflow resume {obs.run_id}")
        resumer = self.spawn("dbosflow-resume", ["-m", "dbosflow", "resume", obs.run_id])
        expect_exit(resumer, 0)
        watch(obs, first, resumer, killed_at, "launched DBOS")
        obs.watched.ended_at = time.time()
        obs.restarted_executed = executed(resumer.output())
        obs.how_it_knew = next((line for line in resumer.output().splitlines() if "launched DBOS" in line), "")
        self.say(f"  {obs.how_it_knew}")
        obs.final_status = self._dbosflow("status", obs.run_id)["status"]
        obs.record = self._dbosflow("steps", obs.run_id)  # DBOS's step rows, as compare --dbos reads them
        return obs

    def _dbosflow(self, command: str, run_id: str) -> dict[str, Any]:
        """``python -m dbosflow COMMAND RUN_ID --json`` (status, steps): this module imports no DBOS."""
        done = subprocess.run([sys.executable, "-m", "dbosflow", command, run_id, "--json"], cwd=REPO,
                              env={**os.environ, **self.env}, capture_output=True, text=True,
                              timeout=PROCESS_TIMEOUT)
        if done.returncode not in (0, 1):
            raise ScenarioError(f"dbosflow {command} exited with {done.returncode}: {done.stderr}")
        return json.loads(done.stdout)

    # -- all of it -------------------------------------------------------------

    def play(self) -> list[Observed]:
        server = DevServer(dynamic_config=LAB_SERVER_CONFIG)  # in memory, free ports
        # The dev server takes a few seconds to come up: start it while the first two engines play.
        failure: list[BaseException] = []

        def start_server() -> None:
            try:
                server.start()
            except BaseException as err:  # handed to the main thread below
                failure.append(err)

        starter = threading.Thread(target=start_server, daemon=True)
        try:
            self.say("starting the provider (counts effects per idempotency key) and a Temporal dev server (in memory)")
            starter.start()
            provider = start_provider(self.state / "provider.db")
            self.provider_url = provider.url
            self.procs.append(provider.proc)
            self.env = {
                "PROVIDER_URL": self.provider_url,
                "MEMORY_DB": str(self.state / "memory.db"),
                "RUNRECORD_DB": str(self.state / "runrecord.db"),
                "DBOSFLOW_DB": str(self.state / "dbosflow.db"),
                "PYTHONUNBUFFERED": "1",
            }
            results = [self.in_memory(), self.runrecord()]
            starter.join()
            if failure:
                raise ScenarioError(f"the Temporal dev server did not start: {failure[0]}")
            results.append(asyncio.run(self.temporal(server)))
            if HAVE_DBOS:
                results.append(self.dbos())
            else:
                self.say("DBOS: left out, the optional extra is not installed (pip install -e '.[dbos]')")
            for obs in results:
                self.observe_effects(obs)
            return results
        finally:
            starter.join()
            for proc in reversed(self.procs):
                if proc.alive():
                    proc.kill()  # workers and runners: nothing to hand back
            server.stop()


def render(results: list[Observed]) -> str:
    head = (f"{'engine':<24} {'resumed at':<22} {'executed again':<26} "
            f"{'email (send_confirmation)':<31} {'ticket (record_outcome)':<31} check")
    lines = [head, "-" * len(head)]
    for obs in results:
        where = f"step {STEP_NAMES.index(obs.resumed_at) + 1} {obs.resumed_at}" if obs.resumed_at else "-"
        again = ", ".join(obs.executed_again) or "none"
        email, ticket = (describe(obs.effects[s]) for s in ("send_confirmation", "record_outcome"))
        lines.append(f"{LABELS[obs.engine]:<24} {where:<22} {again:<26} {email:<31} {ticket:<31} "
                     f"{'as expected' if obs.ok else 'NOT AS EXPECTED'}")
    lines.append("")
    lines.append("expected: in memory resumes at step 1 and the email is applied twice (a fresh random key per")
    lines.append("execution, so the provider cannot tell the repeat); the run record and Temporal resume at step 3,")
    lines.append("run nothing again and apply every effect once" + (", and so does DBOS." if HAVE_DBOS else
                 ". (DBOS: not installed, pip install -e '.[dbos]'.)"))
    for obs in results:
        if not obs.ok:
            lines.append(f"{obs.engine}: observed {obs.comparable()} (run {obs.final_status}), "
                         f"expected {EXPECTED[obs.engine]}")
    return "\n".join(printable(line) for line in lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lesson.scenario",
                                     description="Restart between step 2 and step 3 on every engine; one table.")
    parser.add_argument("--json", action="store_true", help="print the observations as JSON (progress goes to stderr)")
    parser.add_argument("--state-dir", type=Path, default=None,
                        help="keep the provider's, record's and memory's files here (default: a temp dir, removed)")
    parser.add_argument("--html", type=Path, default=None, metavar="PATH",
                        help="also draw the restart as one page: a lane per engine, written to PATH")
    parser.add_argument("--task", default=TASK, help=f"the task every engine runs (default: {TASK!r})")
    parser.add_argument("--deploy", action="store_true",
                        help="the restart that is a deploy (and a move), on every engine (lesson/deploy.py)")
    args = parser.parse_args(argv)

    out = sys.stderr if args.json else sys.stdout

    def say(text: str) -> None:
        print(printable(f"==> {text}"), file=out, flush=True)

    if args.deploy:
        from lesson.deploy import main as deploy_main

        return deploy_main(as_json=args.json, state_dir=str(args.state_dir) if args.state_dir else None, say=say)

    if args.html:
        try:  # before minutes of work, not after
            args.html.parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            print(printable(f"error: cannot write --html {args.html}: {err.strerror or err}"), file=sys.stderr)
            return 2
    state = args.state_dir or Path(tempfile.mkdtemp(prefix="lesson-scenario-"))
    state.mkdir(parents=True, exist_ok=True)
    stamp = f"{time.strftime('%H%M%S')}-{uuid.uuid4().hex[:6]}"
    try:
        task = check_task(args.task)
    except InputError as err:
        print(printable(f"error: {err}"), file=sys.stderr, flush=True)
        return 2
    try:
        results = Scenario(state, say, stamp, task).play()
    except (ScenarioError, TimeoutError, RuntimeError, ConnectionError) as err:
        print(printable(f"error: the scenario could not be played: {err}", multiline=True), file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:
        print("interrupted; everything the scenario started was stopped", file=sys.stderr, flush=True)
        return 130
    finally:
        if args.state_dir is None:
            shutil.rmtree(state, ignore_errors=True)
    ok = all(obs.ok for obs in results)
    if args.json:
        print(json.dumps({"engines": [obs.to_json() for obs in results], "ok": ok}, indent=2), flush=True)
    else:
        print("", flush=True)
        print(render(results), flush=True)
    if args.html:
        from lesson.scenario_page import scenario_page

        try:
            args.html.write_text(scenario_page(results, task))
        except OSError as err:
            print(printable(f"error: cannot write --html {args.html}: {err.strerror or err}; give a path in a "
                            "writable directory"), file=sys.stderr, flush=True)
            return 2
        print(f"\n{printable(f'the picture of it: {args.html} (open it in a browser)')}", file=out, flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    from flowclient.connect import exit_now

    exit_now(main())
