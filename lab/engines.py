"""One driver per engine: how the lab, the lessons and the tests start a run, kill it, resume it and read it.

The four engines run the same flow (``steps.plan``), each in processes of its
own. What it takes to drive each is written here and nowhere else:

=============  ===============================================  ==============================================
engine         ``start``: the process that dies at ``crash_at``  ``resume``: followed until the run stops
=============  ===============================================  ==============================================
``in_memory``  ``python -m lesson.in_memory RUN_ID TASK``        the same command again: nothing was recorded
``runrecord``  ``python -m runrecord start RUN_ID TASK``         ``python -m runrecord resume RUN_ID``, asked
                                                                 again while the dead runner's lease holds
``temporal``   a worker (``worker.py``) on the driver's queue,   a new worker, until the run's status is no
               then the run, started on the driver's server     longer running (the worker serves on)
``dbos``       ``python -m dbosflow start RUN_ID TASK``          ``python -m dbosflow resume RUN_ID`` (DBOS's
                                                                 recovery on launch)
=============  ===============================================  ==============================================

One interface, ``EngineDriver``:

- ``start(run_id, task, email, crash_at=...)`` returns the process that runs
  the run, armed with ``CRASH_AT`` (``steps.crashpoints``; docs/crashpoints.md
  names every point); ``killed(proc)`` waits for it to die there by SIGKILL;
- ``resume(run_id)`` starts a fresh process and follows the run until it
  stops running: a ``Settled`` (the process, its exit code, the run's status,
  the restarts refused first);
- ``status(run_id)`` is the shared shape of ``steps.runstate``, read the way
  a user reads it (``python -m runrecord status --json``, ``python -m dbosflow
  status --json``, and for Temporal ``flowclient.status``, which ``starter.py
  status`` prints), or None when the engine holds no such run. The in-memory
  engine never holds one: it keeps no record;
- ``started_steps(proc)``: the steps a process began executing, from its
  ``step <name> started`` lines (``steps.startedline``);
- ``processes()``: what a power cut takes, the engine's processes alive now
  (Temporal's include its dev server); ``close()`` kills what the driver
  started, never the dev server, which belongs to whoever started it.

The provider is no engine's: the caller starts it, passes its URL in ``env``
(``PROVIDER_URL``) and counts the effects there. Every process a driver starts
has this process's environment and then the driver's ``env``: processes with
another environment (another record file, another memory) are another
driver's, so that its ``status`` reads what they wrote. ``code`` runs them
from another checkout (a deploy: lesson/deploy.py).
Every wait has a deadline and fails with what the process printed last
(``lab.processes.ProcessTimeout``), or with ``EngineError`` when a process
ended otherwise than it was expected to.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Self

from lab.processes import REPO, DevServer, Proc
from steps import startedline
from steps.runstate import RunEntry
from steps.sides import DbosSide

if TYPE_CHECKING:
    from temporalio.client import Client

Status = RunEntry
"""A run's status in the shape every engine prints (``steps.runstate``)."""

ENGINES = ("in_memory", "runrecord", "temporal", "dbos")
DEFAULT_TIMEOUT = 120.0  # seconds for one process or one run: generous on a busy 2-core machine


class EngineError(RuntimeError):
    """A process did not die or end as the driver was told to expect; the message shows what it printed."""


@dataclass
class Settled:
    """A run followed until it stopped running."""

    proc: Proc  # the process that ran it to there
    code: int | None  # that process's exit code; None for a Temporal worker, which serves on
    status: Status | None  # the run's status then; None where the engine keeps no record (in memory)
    refused: int = 0  # restarts refused before this one: the dead process still held the run (run record)

    @property
    def completed(self) -> bool:
        """The run completed, as the engine says it: its status, or, when that was not read, the exit code of
        the process that ran it (0 is "completed" on every engine's CLI)."""
        return self.status["status"] == "completed" if self.status is not None else self.code == 0


def started_steps(proc: Proc) -> list[str]:
    """The steps ``proc`` began executing, in order, one entry per execution."""
    return startedline.started_steps(proc.output())


class EngineDriver(ABC):
    """The part every driver shares: the processes it started, their environment, the deadlines."""

    name: ClassVar[str]
    knew: ClassVar[str] = ""
    """Words of the line a restarted process prints once it knows what was done ("" if it never does)."""

    def __init__(self, env: Mapping[str, str] | None = None, *, code: Path = REPO,
                 timeout: float = DEFAULT_TIMEOUT) -> None:
        self.env = {"PYTHONUNBUFFERED": "1", **(env or {})}
        if code != REPO:  # only that checkout's modules, in its processes and in anything they start
            self.env.setdefault("PYTHONPATH", str(code))
        self.code = code
        self.timeout = timeout
        self.procs: list[Proc] = []

    # -- the interface ------------------------------------------------------------------------

    @abstractmethod
    async def start(self, run_id: str, task: str, email: str, *, crash_at: str = "",
                    conversation: str | None = None, args: Sequence[str] = (), name: str | None = None) -> Proc:
        """Start the run; the process returned runs it, and dies at ``crash_at`` if it gets there.
        ``args``: more arguments for that process (a CLI's options, a worker's)."""

    @abstractmethod
    async def resume(self, run_id: str, *, args: Sequence[str] = (), name: str | None = None,
                     timeout: float | None = None) -> Settled:
        """A fresh process for the run, followed until the run stops running."""

    async def settle(self, run_id: str, proc: Proc, timeout: float | None = None, *,
                     read_status: bool = True) -> Settled:
        """Follow the run ``proc`` runs until it stops running: until ``proc`` exits, by default; then its status.
        ``read_status=False``: the exit code says enough (``Settled.completed``), and no process is started
        to read the status; where the status is how the run is followed (Temporal) it is read anyway."""
        code = await self.exit_code(proc, timeout)
        return Settled(proc, code, await self.status(run_id) if read_status else None)

    @abstractmethod
    async def status(self, run_id: str) -> Status | None:
        """The run's status, or None if the engine holds no such run."""

    async def retry(self, run_id: str, timeout: float | None = None) -> Status | None:
        """Run a failed run again from the step that failed, to its end; its status then."""
        raise EngineError(f"the {self.name} engine has no retry of a failed run")

    def processes(self) -> list[Proc]:
        """The engine's processes alive now: what a power cut takes with it."""
        return [p for p in self.procs if p.alive()]

    def close(self) -> None:
        """SIGKILL whatever this driver started and is still running: nothing of it has to be handed back."""
        for proc in reversed(self.procs):
            proc.kill()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- shared helpers -----------------------------------------------------------------------

    def spawn(self, name: str, argv: Sequence[str], *, crash_at: str = "",
              env: Mapping[str, str] | None = None) -> Proc:
        """``python ARGV...`` in the driver's checkout. ``CRASH_AT`` is always set (to ``crash_at``, by default
        empty): one inherited from this process's environment never arms a process the caller did not arm."""
        proc = Proc(name, [sys.executable, *argv], env={**self.env, **(env or {}), "CRASH_AT": crash_at},
                    cwd=self.code)
        self.procs.append(proc)
        return proc

    async def exit_code(self, proc: Proc, timeout: float | None = None) -> int:
        """``proc``'s exit code once it has exited. Waited for off the event loop, so that runs driven side by
        side (``lab.outage``) wait together."""
        return await asyncio.to_thread(proc.wait, self.timeout if timeout is None else timeout)

    async def killed(self, proc: Proc, timeout: float | None = None) -> None:
        """Until ``proc`` has died by SIGKILL, as its crash point does; EngineError if it ended otherwise."""
        code = await self.exit_code(proc, timeout)
        if code != -signal.SIGKILL:
            raise EngineError(f"{proc.name} was to die by SIGKILL at its crash point but exited with {code}. "
                              f"Its output:\n{proc.output()}")

    def how_it_knew(self, proc: Proc) -> str:
        """The line in which a restarted process said what it had read or replayed ("" if none)."""
        if not self.knew:
            return ""
        return next((line for line in proc.output().splitlines() if self.knew in line), "")


class InMemoryDriver(EngineDriver):
    """The "before" (``lesson.in_memory``): one process runs the whole flow and keeps nothing."""

    name = "in_memory"

    def __init__(self, env: Mapping[str, str] | None = None, *, code: Path = REPO,
                 timeout: float = DEFAULT_TIMEOUT) -> None:
        super().__init__(env, code=code, timeout=timeout)
        self._commands: dict[str, list[str]] = {}  # run id -> its command: the only way to restart it

    async def start(self, run_id: str, task: str, email: str, *, crash_at: str = "",
                    conversation: str | None = None, args: Sequence[str] = (), name: str | None = None) -> Proc:
        argv = ["-m", "lesson.in_memory", run_id, task, "--email", email,
                *(["--conversation", conversation] if conversation else []), *args]
        self._commands[run_id] = argv
        return self.spawn(name or "in-memory-1", argv, crash_at=crash_at)

    async def resume(self, run_id: str, *, args: Sequence[str] = (), name: str | None = None,
                     timeout: float | None = None) -> Settled:
        """The same command again: this engine has no other way to continue a run."""
        if run_id not in self._commands:
            raise EngineError(f"run {run_id} was not started by this driver: its command is unknown")
        proc = self.spawn(name or "in-memory-2", [*self._commands[run_id], *args])
        return await self.settle(run_id, proc, timeout)

    async def status(self, run_id: str) -> Status | None:
        return None  # no record: what was done died with the process


class _CliDriver(EngineDriver):
    """An engine whose CLI runs a run to its end in one process: ``start``, ``resume``, ``status --json``."""

    module: ClassVar[str]

    async def start(self, run_id: str, task: str, email: str, *, crash_at: str = "",
                    conversation: str | None = None, args: Sequence[str] = (), name: str | None = None) -> Proc:
        argv = ["-m", self.module, "start", run_id, task, "--email", email,
                *(["--conversation", conversation] if conversation else []), *args]
        return self.spawn(name or f"{self.module}-start", argv, crash_at=crash_at)

    async def resume(self, run_id: str, *, args: Sequence[str] = (), name: str | None = None,
                     timeout: float | None = None) -> Settled:
        proc = self.spawn(name or f"{self.module}-resume", ["-m", self.module, "resume", run_id, *args])
        return await self.settle(run_id, proc, timeout)

    async def status(self, run_id: str) -> Status | None:
        found: Status | None = await self.cli_json("status", run_id)
        return found

    async def cli_json(self, command: str, run_id: str) -> Any:
        """``python -m MODULE COMMAND RUN_ID --json``: what it printed (the caller names its shape), or None if it
        knows no such run.
        Its exit code says the run's state (0 completed or running, 1 failed, 3 parked); 2 with "no run"
        is an unknown run; anything else is an error."""
        argv = [sys.executable, "-m", self.module, command, run_id, "--json"]
        done = await asyncio.to_thread(subprocess.run, argv, cwd=self.code, capture_output=True, text=True,
                                       env={**os.environ, **self.env, "CRASH_AT": ""}, timeout=self.timeout)
        if done.returncode == 2 and "no run" in done.stderr and "{" not in done.stdout:
            return None
        if done.returncode not in (0, 1, 3) or "{" not in done.stdout:
            raise EngineError(f"`python -m {self.module} {command} {run_id} --json` exited {done.returncode}: "
                              f"{(done.stderr or done.stdout)[-2000:]}")
        return json.loads(done.stdout[done.stdout.index("{"):])  # after any line a library logged


class RunRecordDriver(_CliDriver):
    """The hand-rolled SQLite run record (``python -m runrecord``)."""

    name = "runrecord"
    module = "runrecord"
    knew = "read the record of run"
    LEASE_HELD: ClassVar[int] = 5  # ``runrecord.cli.EXIT_LEASE_HELD``, read as a user reads it: the exit code

    async def resume(self, run_id: str, *, args: Sequence[str] = (), name: str | None = None,
                     timeout: float | None = None) -> Settled:
        """As the CLI engines do, asked again while the run's lease is held (exit 5): a dead runner on this
        host is taken over at once (``runrecord.lease``); one the record cannot prove dead holds the run until
        its lease expires."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        refused = 0
        while True:
            proc = self.spawn(name or "runrecord-resume", ["-m", "runrecord", "resume", run_id, *args])
            code = await self.exit_code(proc, max(1.0, deadline - time.monotonic()))
            if code != self.LEASE_HELD or time.monotonic() > deadline:
                break
            refused += 1
            await asyncio.sleep(0.2)  # a poll, with the deadline above: the lease expires on its own clock
        return Settled(proc, code, await self.status(run_id), refused)

    async def retry(self, run_id: str, timeout: float | None = None) -> Status | None:
        """``python -m runrecord retry RUN_ID``: the failed step again, with a fresh budget, to the run's end."""
        await self.exit_code(self.spawn("runrecord-retry", ["-m", "runrecord", "retry", run_id]), timeout)
        return await self.status(run_id)


class DbosDriver(_CliDriver):
    """The flow on DBOS Transact (``python -m dbosflow``; the optional ``dbos`` extra)."""

    name = "dbos"
    module = "dbosflow"
    knew = "launched DBOS"

    async def steps(self, run_id: str) -> DbosSide | None:
        """DBOS's own rows for the run (``python -m dbosflow steps --json``): this process imports no DBOS."""
        side: DbosSide | None = await self.cli_json("steps", run_id)
        return side


class TemporalDriver(EngineDriver):
    """Temporal: worker processes on one task queue of ``server`` (a ``DevServer`` its caller started), and
    the runs started there as ``starter.py`` starts them (``flowclient.runs``)."""

    name = "temporal"
    knew = "history events of run"

    def __init__(self, server: DevServer, env: Mapping[str, str] | None = None, *, queue: str | None = None,
                 code: Path = REPO, timeout: float = DEFAULT_TIMEOUT, poll: float = 0.1) -> None:
        super().__init__(env, code=code, timeout=timeout)
        self.server = server  # replace it after a restart of the server (a power cut): the client follows
        self.queue = queue or f"lab-{uuid.uuid4().hex[:10]}"
        self.poll = poll
        self._client: Client | None = None
        self._client_of: Proc | None = None

    async def client(self) -> Client:
        """A client of the server, with this process's environment and the driver's (a payload codec key
        included, as the workers have it); connected again once the server is another process."""
        if self._client is None or self._client_of is not self.server.proc:
            from flowclient.connect import connect

            self._client = await connect({**os.environ, **self.env, "TEMPORAL_ADDRESS": self.server.address,
                                          "TEMPORAL_NAMESPACE": "default"})
            self._client_of = self.server.proc
        return self._client

    async def start_worker(self, *, crash_at: str = "", args: Sequence[str] = (), name: str | None = None) -> Proc:
        """``python worker.py`` on the driver's queue, once it says ``worker ready``."""
        workers = sum(1 for p in self.procs if p.argv[1:2] == ["worker.py"])
        worker = self.spawn(name or f"worker{workers + 1}", ["worker.py", *args], crash_at=crash_at,
                            env={"TEMPORAL_ADDRESS": self.server.address, "TEMPORAL_NAMESPACE": "default",
                                 "TASK_QUEUE": self.queue})
        await asyncio.to_thread(worker.wait_for_line, "worker ready", 60)
        return worker

    async def submit(self, run_id: str, task: str, email: str, *, conversation: str | None = None,
                     rule: Any = None) -> bool:
        """Start the run on the queue (True), or find it started already (False). ``rule``: a
        ``steps.retry.RetryRule``; by default the one the driver's environment gives, as a CLI engine's."""
        from flowclient.runs import start_run
        from steps.retry import rule_from_env

        created, _ = await start_run(await self.client(), run_id, task, email, conversation, queue=self.queue,
                                     rule=rule or rule_from_env({**os.environ, **self.env}))
        return created

    async def start(self, run_id: str, task: str, email: str, *, crash_at: str = "",
                    conversation: str | None = None, args: Sequence[str] = (), name: str | None = None) -> Proc:
        """A worker armed with ``crash_at``, then the run: the worker is ready before the run's first task."""
        worker = await self.start_worker(crash_at=crash_at, args=args, name=name)
        await self.submit(run_id, task, email, conversation=conversation)
        return worker

    async def resume(self, run_id: str, *, args: Sequence[str] = (), name: str | None = None,
                     timeout: float | None = None) -> Settled:
        """A new worker: it replays the history and goes on from there."""
        return await self.settle(run_id, await self.start_worker(args=args, name=name), timeout)

    async def settle(self, run_id: str, proc: Proc, timeout: float | None = None, *,
                     read_status: bool = True) -> Settled:
        """Until the run's status is no longer running (completed, failed or parked); ``proc`` serves on."""
        try:
            status = await self.wait_for(run_id, lambda s: s["status"] != "running", timeout=timeout)
        except TimeoutError as err:
            raise EngineError(f"{err}\n{proc.name}'s last lines:\n{proc.last_lines()}") from None
        return Settled(proc, None, status)

    async def wait_for(self, run_id: str, until: Callable[[Status], bool],
                       on_change: Callable[[Status], Any] | None = None, timeout: float | None = None) -> Status:
        """The run's status once ``until(status)``; ``on_change`` sees every new status on the way."""
        from flowclient.runs import wait_for_status

        found: Status = await wait_for_status(await self.client(), run_id, until, on_change, poll=self.poll,
                                              timeout=self.timeout if timeout is None else timeout)
        return found

    async def status(self, run_id: str) -> Status | None:
        from flowclient.status import TemporalRunNotFound, run_status

        try:
            found: Status = await run_status(await self.client(), run_id)
        except TemporalRunNotFound:
            return None
        return found

    async def retry(self, run_id: str, timeout: float | None = None) -> Status | None:
        """A reset to the workflow task that scheduled the failed step (``flowclient.runs``), to the run's end."""
        from flowclient.runs import restart_failed_run

        await restart_failed_run(await self.client(), run_id)
        return await self.wait_for(run_id, lambda s: s["status"] != "running", timeout=timeout)

    def processes(self) -> list[Proc]:
        server = self.server.proc
        return [*super().processes(), *([server] if server is not None and server.alive() else [])]

    def how_it_knew(self, proc: Proc) -> str:
        """The worker's replay line, without the log record's prefix."""
        return super().how_it_knew(proc).split("temporalio.workflow: ", 1)[-1]


def driver_for(engine: str, env: Mapping[str, str] | None = None, *, server: DevServer | None = None,
               **options: Any) -> EngineDriver:
    """The driver of ``engine`` (one of ``ENGINES``); Temporal's needs the ``server``."""
    if engine == "temporal":
        if server is None:
            raise ValueError("the Temporal driver needs a dev server: pass server=DevServer(...).start()")
        return TemporalDriver(server, env, **options)
    drivers: dict[str, type[EngineDriver]] = {"in_memory": InMemoryDriver, "runrecord": RunRecordDriver,
                                              "dbos": DbosDriver}
    if engine not in drivers:
        raise ValueError(f"no engine {engine!r}: choose from {', '.join(ENGINES)}")
    return drivers[engine](env, **options)
