"""The failure on purpose, on every engine: "the process is restarted between
step two and step three".

    make scenario        (or: python -m lesson.scenario [--json] [--html PATH] [--state-dir DIR] [--task TASK])
    make scenario-deploy (or: python -m lesson.scenario --deploy [--json]): the
                          restart that is a deploy, and a move (lesson/deploy.py)

Starts what it needs (one provider process with its own database, a Temporal
dev server in memory on free ports, workers), stops all of it at the end, and
plays the same restart on every engine, each under its own run id and through
its driver (``lab.engines``):

==============  =========================================  =================================
engine          killed (SIGKILL, by a crash point)         restarted with
==============  =========================================  =================================
in memory       ``in_memory:after_send_confirmation``      the same ``python -m lesson.in_memory`` command
run record      ``runrecord:send_confirmation:after_record``  ``python -m durable_agents.runrecord resume RUN_ID``
Temporal        worker with ``record_outcome:before``      a new worker process
DBOS            ``dbos:send_confirmation:after_record``    ``python -m durable_agents.dbosflow resume RUN_ID``
                                                           (DBOS's recovery on launch)
==============  =========================================  =================================

The DBOS row needs the optional extra (``pip install -e '.[dbos]'``; ``make
scenario`` installs it); without it the row is left out, saying so. Its system
database is SQLite, or PostgreSQL with ``--dbos-on postgres`` (Debian's server,
started and stopped by the scenario: ``lab.postgres``).

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
module observed (``lesson.lanes`` says which is which); the records are
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
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import IO, Protocol, TypeVar

from durable_agents.providerclient import fetch_effects
from durable_agents.runrecord.compare import record_side
from durable_agents.runrecord.store import RunRecord
from durable_agents.steps.controls import printable
from durable_agents.steps.limits import InputError, check_task
from lab.engines import (
    DbosDriver,
    EngineDriver,
    InMemoryDriver,
    RunRecordDriver,
    Settled,
    TemporalDriver,
    started_steps,
)
from lab.processes import LAB_SERVER_CONFIG, DevServer, Proc
from lab.provider_process import ProviderProcess, start_provider
from lesson.effects import effect_entries, per_step
from lesson.in_memory import completed_steps
from lesson.observed import CRASH, EXPECTED, Observed, summary
from lesson.sides import EngineSide

TASK = "Confirm the refund for order 1234"
EMAIL = "ada@example.com"
HAVE_DBOS = importlib.util.find_spec("dbos") is not None
PROCESS_TIMEOUT = 120.0  # generous: a busy 2-core machine; a healthy run takes seconds
START_ARGS = {
    # A short lease, so a resume the record cannot prove dead need not wait out the default 10 s after the SIGKILL.
    "runrecord": ("--lease-seconds", "1"),
}
# What the scenario says as it plays each engine: as the run starts, once the first process is dead (``done``:
# what the record, or the dead process's log, says was completed), and what the restarted process said it knew.
NARRATION = {
    "in_memory": ("in memory: python -m lesson.in_memory {run} ... with CRASH_AT={crash}",
                  "  killed after {done}; starting the same command again", ""),
    "runrecord": ("run record: python -m durable_agents.runrecord start {run} ... with CRASH_AT={crash}",
                  "  killed; the record says completed: {done}; python -m durable_agents.runrecord resume {run}",
                  "  {how}"),
    "temporal": ("Temporal: worker 1 with CRASH_AT={crash}; starting run {run}",
                 "  worker 1 killed; history says completed: {done}; starting worker 2", "  worker 2 {how}"),
    "dbos": ("DBOS: python -m durable_agents.dbosflow start {run} ... with CRASH_AT={crash}",
             "  killed; DBOS's step rows say completed: {done}; python -m durable_agents.dbosflow resume {run}",
             "  {how}"),
}


DBOS_LEFT_OUT = "DBOS: left out, the optional extra is not installed (pip install -e '.[dbos]')"


class ScenarioError(RuntimeError):
    """The scenario could not be played as planned (not: the table differs)."""


# ---------------------------------------------------------------- what this scenario and lesson.loop_scenario share


@asynccontextmanager
async def dev_server_meanwhile() -> AsyncIterator[Callable[[], Awaitable[DevServer]]]:
    """A Temporal dev server (in memory, free ports) starting in a thread while the block starts the rest:
    it takes a few seconds. The block awaits the function it is given for the server once it needs it
    (``ScenarioError`` if it did not start). Stopped when the block ends, however it ends; not while still
    starting."""
    server = DevServer(dynamic_config=LAB_SERVER_CONFIG)
    server_up = asyncio.ensure_future(asyncio.to_thread(server.start))

    async def started() -> DevServer:
        try:
            await server_up
        except Exception as err:  # noqa: BLE001 - said once, as the scenario's own error
            raise ScenarioError(f"the Temporal dev server did not start: {err}") from None
        return server

    try:
        yield started
    finally:
        try:
            await server_up  # not stopped while still starting
        except BaseException:  # noqa: BLE001 - reported by started(), or the scenario is ending anyway
            pass
        server.stop()


async def resume_to_the_end(driver: EngineDriver, run_id: str) -> Settled:
    """The restart: ``driver.resume``, whose process must end with 0 (``ScenarioError`` with its output if
    not). A Temporal worker would serve on once the run is done: it is stopped."""
    resumed = await driver.resume(run_id)
    if resumed.code not in (0, None):
        raise ScenarioError(f"{resumed.proc.name} exited with {resumed.code}, not 0. "
                            f"Its output:\n{resumed.proc.output()}")
    if isinstance(driver, TemporalDriver):
        resumed.proc.stop()  # the run is done; the worker would serve on
    return resumed


def progress(out: IO[str]) -> Callable[[str], None]:
    """How a scenario says what it is doing: ``==>`` lines on ``out`` (stderr with ``--json``)."""
    def say(text: str) -> None:
        print(printable(f"==> {text}"), file=out, flush=True)

    return say


def html_writable(html: Path | None) -> bool:
    """``--html PATH``'s directory made before the work, not after; False, said on stderr, if it cannot be."""
    if html:
        try:
            html.parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            print(printable(f"error: cannot write --html {html}: {err.strerror or err}"), file=sys.stderr)
            return False
    return True


def state_and_stamp(state_dir: Path | None, prefix: str) -> tuple[Path, str]:
    """The directory of the processes' files (``--state-dir``, or a temporary one) and the stamp of the run
    ids."""
    state = state_dir or Path(tempfile.mkdtemp(prefix=prefix))
    state.mkdir(parents=True, exist_ok=True)
    return state, f"{time.strftime('%H%M%S')}-{uuid.uuid4().hex[:6]}"


class Played(Protocol):
    """What a scenario observed of one engine."""

    @property
    def ok(self) -> bool: ...

    def to_json(self) -> object: ...


P = TypeVar("P", bound=Played)


def play_and_show(play: Callable[[], list[P]], *, state: Path, keep_state: bool, as_json: bool, out: IO[str],
                  render: Callable[[list[P]], str], html: Path | None, page: Callable[[list[P]], str]) -> int:
    """Play the scenario, then show what it observed: its table (or JSON) and, with ``--html``, its page.
    The exit code: 0 if every engine's row is the expected one, 1 if not, 2 if it could not be played (or
    the page not written), 130 if interrupted. A temporary state directory is removed."""
    try:
        results = play()
    except (ScenarioError, TimeoutError, RuntimeError, ConnectionError) as err:
        print(printable(f"error: the scenario could not be played: {err}", multiline=True), file=sys.stderr,
              flush=True)
        return 2
    except KeyboardInterrupt:
        print("interrupted; everything the scenario started was stopped", file=sys.stderr, flush=True)
        return 130
    finally:
        if not keep_state:
            shutil.rmtree(state, ignore_errors=True)
    ok = all(obs.ok for obs in results)
    if as_json:
        print(json.dumps({"engines": [obs.to_json() for obs in results], "ok": ok}, indent=2), flush=True)
    else:
        print("", flush=True)
        print(render(results), flush=True)
    if html:
        try:
            html.write_text(page(results))
        except OSError as err:
            print(printable(f"error: cannot write --html {html}: {err.strerror or err}; give a path in a "
                            "writable directory"), file=sys.stderr, flush=True)
            return 2
        print(f"\n{printable(f'the picture of it: {html} (open it in a browser)')}", file=out, flush=True)
    return 0 if ok else 1


# ---------------------------------------------------------------- this scenario


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
    def __init__(self, state: Path, say: Callable[[str], None], stamp: str, task: str = TASK, *,
                 dbos_on: str = "sqlite") -> None:
        self.state = state
        self.dbos_on = dbos_on  # DBOS's system database: its SQLite file, or "postgres" (lab.postgres's server)
        self.say = say
        self.stamp = stamp
        self.task = task
        self.provider_url = ""
        self.env: dict[str, str] = {}

    def run_id(self, engine: str) -> str:
        return f"scenario-{engine.replace('_', '-')}-{self.stamp}"

    def observe_effects(self, obs: Observed) -> None:
        effects = fetch_effects(self.provider_url, run_id=obs.run_id)
        obs.effects = per_step(effects)
        obs.provider = effect_entries(effects)
        obs.keys = [{"key": e.key, "kind": e.kind, "requests": e.requests, "applied": e.effects_applied}
                    for e in effects]

    # -- one engine ------------------------------------------------------------

    async def restart(self, driver: EngineDriver) -> Observed:
        """The run killed at the engine's crash point between step 2 and step 3, then restarted."""
        engine = driver.name
        obs = Observed(engine, self.run_id(engine))
        began, killed, knew = NARRATION[engine]
        words = {"run": obs.run_id, "crash": CRASH[engine]}
        self.say(began.format(**words))
        first = await driver.start(obs.run_id, self.task, EMAIL, crash_at=CRASH[engine],
                                   args=START_ARGS.get(engine, ()))
        await driver.killed(first)
        killed_at = time.time()
        status = await driver.status(obs.run_id)
        if status is None:  # in memory: no record survives; the only witness is the dead process's own log
            obs.completed_before = completed_steps(first.output())
        else:
            obs.completed_before = [s["name"] for s in status["steps"] if s["status"] == "completed"]
        self.say(killed.format(done=", ".join(obs.completed_before), **words))
        resumed = await resume_to_the_end(driver, obs.run_id)
        second = resumed.proc
        if isinstance(driver, TemporalDriver):
            obs.watched.names = ("worker 1", "worker 2")
        watch(obs, first, second, killed_at, driver.knew)
        obs.watched.ended_at, obs.watched.refused_restarts = time.time(), resumed.refused
        obs.record = await self.engine_record(driver, obs.run_id)
        obs.restarted_executed = started_steps(second)
        obs.how_it_knew = driver.how_it_knew(second)
        if knew:
            self.say(knew.format(how=obs.how_it_knew))
        obs.final_status = resumed.status["status"] if resumed.status is not None else "completed"
        return obs

    async def engine_record(self, driver: EngineDriver, run_id: str) -> EngineSide | None:
        """The engine's own record of the run, which its lane is drawn from (read while its server runs)."""
        if isinstance(driver, RunRecordDriver):
            with RunRecord(self.state / "runrecord.db") as record:
                return record_side(record, run_id)
        if isinstance(driver, TemporalDriver):
            from durable_agents.flowclient.compare import temporal_side

            return await temporal_side(await driver.client(), run_id)
        if isinstance(driver, DbosDriver):
            return await driver.steps(run_id)  # DBOS's step rows, as compare --dbos reads them
        return None  # in memory: nothing was recorded

    # -- all of it -------------------------------------------------------------

    def play(self) -> list[Observed]:
        return asyncio.run(self._play())

    async def _play(self) -> list[Observed]:
        provider: ProviderProcess | None = None
        drivers: list[EngineDriver] = []
        postgres = None
        self.say("starting the provider (counts effects per idempotency key) and a Temporal dev server (in memory)")
        # The dev server takes a few seconds to come up: it starts while the first two engines play.
        async with dev_server_meanwhile() as server_started:
            try:
                provider = start_provider(self.state / "provider.db")
                self.provider_url = provider.url
                self.env = {
                    "PROVIDER_URL": self.provider_url,
                    "MEMORY_DB": str(self.state / "memory.db"),
                    "RUNRECORD_DB": str(self.state / "runrecord.db"),
                    "DBOSFLOW_DB": str(self.state / "dbosflow.db"),
                    "PYTHONUNBUFFERED": "1",
                }
                drivers += [InMemoryDriver(self.env, timeout=PROCESS_TIMEOUT),
                            RunRecordDriver(self.env, timeout=PROCESS_TIMEOUT)]
                results = [await self.restart(driver) for driver in drivers]
                drivers.append(TemporalDriver(await server_started(), self.env, queue=f"lesson-scenario-{self.stamp}",
                                              timeout=PROCESS_TIMEOUT))
                results.append(await self.restart(drivers[-1]))
                if HAVE_DBOS:
                    dbos_env = self.env
                    if self.dbos_on == "postgres":  # the project's own server (.state/postgres), stopped below
                        from lab.postgres import Postgres

                        self.say("starting PostgreSQL (lab.postgres) for DBOS's system database")
                        postgres = Postgres().start()
                        dbos_env = {**self.env, "DBOSFLOW_DB": postgres.url("lesson_scenario")}
                    drivers.append(DbosDriver(dbos_env, timeout=PROCESS_TIMEOUT))
                    results.append(await self.restart(drivers[-1]))
                else:
                    self.say(DBOS_LEFT_OUT)
                for obs in results:
                    self.observe_effects(obs)
                return results
            finally:
                for driver in reversed(drivers):
                    driver.close()  # workers and runners: nothing to hand back
                if provider is not None:
                    provider.kill()
                if postgres is not None:
                    postgres.stop()


def render(results: list[Observed]) -> str:
    head, *rows = summary(results)
    widths = (24, 22, 26, 31, 31)

    def row_text(cells: list[str]) -> str:
        return " ".join(f"{cell:<{width}}" for cell, width in zip(cells, widths, strict=False)) + " " + cells[-1]

    lines = [row_text(head), "-" * len(row_text(head))]
    lines += [row_text(row) for row in rows]
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
    parser.add_argument("--dbos-on", choices=("sqlite", "postgres"), default="sqlite",
                        help="DBOS's system database: its SQLite file (default), or PostgreSQL, Debian's server "
                             "started and stopped by the scenario (lab.postgres; data in .state/postgres)")
    args = parser.parse_args(argv)

    out = sys.stderr if args.json else sys.stdout
    say = progress(out)

    if args.deploy:
        from lesson.deploy import main as deploy_main

        return deploy_main(as_json=args.json, state_dir=str(args.state_dir) if args.state_dir else None, say=say)

    if not html_writable(args.html):  # before minutes of work, not after
        return 2
    state, stamp = state_and_stamp(args.state_dir, "lesson-scenario-")
    try:
        task = check_task(args.task)
    except InputError as err:
        print(printable(f"error: {err}"), file=sys.stderr, flush=True)
        return 2

    if args.dbos_on == "postgres":  # the DBOS row and lane name their database (this process draws them all)
        from lesson import lanes, observed

        observed.LABELS["dbos"] = lanes.TITLES["dbos"] = "DBOS (PostgreSQL)"

    def page(results: list[Observed]) -> str:
        from lesson.scenario_page import scenario_page

        return scenario_page(results, task)

    return play_and_show(lambda: Scenario(state, say, stamp, task, dbos_on=args.dbos_on).play(), state=state,
                         keep_state=args.state_dir is not None, as_json=args.json, out=out, render=render,
                         html=args.html, page=page)


if __name__ == "__main__":
    from durable_agents.flowclient.connect import exit_now

    exit_now(main())
