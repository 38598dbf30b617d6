"""One driver per engine: how the lab, the lessons and the tests start a run, kill it, resume it and read it.

The engines are the registry's (``lab.registry``: each engine's package
registers a row naming its driver here; ``driver_for(name)`` makes it), and the
in-memory flow is a lane beside them (``LANES``). All run the same flow
(``durable_agents.steps.plan``), each in processes of its own. What it takes to drive each is
written here and nowhere else:

=============  ===============================================  ==============================================
engine         ``start``: the process that dies at ``crash_at``  ``resume``: followed until the run stops
=============  ===============================================  ==============================================
``in_memory``  ``python -m lesson.in_memory RUN_ID TASK``        the same command again: nothing was recorded
``runrecord``  ``python -m durable_agents.runrecord start RUN_ID TASK``         ``python -m durable_agents.runrecord
resume RUN_ID``, asked
                                                                 again while the dead runner's lease holds
``temporal``   a worker (``worker.py``) on the driver's queue,   a new worker, until the run's status is no
               then the run, started on the driver's server     longer running (the worker serves on)
``dbos``       ``python -m durable_agents.dbosflow start RUN_ID TASK``          ``python -m durable_agents.dbosflow
resume RUN_ID`` (DBOS's
                                                                 recovery on launch)
=============  ===============================================  ==============================================

One interface, ``EngineDriver``, the engine protocol:

- ``start(run_id, task, email, crash_at=...)`` returns the process that runs
  the run, armed with ``CRASH_AT`` (``durable_agents.steps.crashpoints``; docs/crashpoints.md
  names every point); ``killed(proc)`` waits for it to die there by SIGKILL;
- ``resume(run_id)`` starts a fresh process and follows the run until it
  stops running: a ``Settled`` (the process, its exit code, the run's status,
  the restarts refused first);
- ``status(run_id)`` is the shared shape of ``durable_agents.steps.runstate``, read the way
  a user reads it (``python -m durable_agents.runrecord status --json``, ``python -m durable_agents.dbosflow
  status --json``, and for Temporal ``durable_agents.flowclient.status``, which ``starter.py
  status`` prints), or None when the engine holds no such run. The in-memory
  engine never holds one: it keeps no record;
- ``started_steps(proc)``: the steps a process began executing, from its
  ``step <name> started`` lines (``durable_agents.steps.startedline``);
- ``processes()``: what a power cut takes, the engine's processes alive now
  (Temporal's include its dev server); ``close()`` kills what the driver
  started, never the dev server, which belongs to whoever started it.

The agent loop (``durable_agents.steps.loop``: the model chooses its tools turn after turn)
has three more, on the engines that run it (the others raise
``NotImplementedError`` naming the engine):

=================  ==========================================================================================
``start_loop``     ``start_loop(run_id, task, email, *, crash_at="", max_turns=20, window_tokens=2000,
                   window_messages=40, history_bound=None) -> Proc``: the process that runs a loop run, armed
                   with ``CRASH_AT``: ``python -m durable_agents.runrecord loop ...``; on Temporal a worker, then the
                   run (``durable_agents.flowclient.loop.start_loop``). ``history_bound`` (events; None: the workflow's
                   1,000) is Temporal's continue-as-new bound: an engine with no history ignores it
``resume``         ``resume(run_id) -> Settled``, as for a run of the flow: ``python -m durable_agents.runrecord
resume``; a
                   new Temporal worker, followed until the run stops running
``loop_status``    ``loop_status(run_id) -> LoopStatus | None``: the loop run in one shape for every engine,
                   read the way a user reads it (``python -m durable_agents.runrecord status --json``; for Temporal
                   ``durable_agents.flowclient.loop.loop_status``, what ``starter.py status --json`` prints); None when
                   the engine holds no such run
=================  ==========================================================================================

``loop_status``'s shape (``LoopStatus``), the same words as ``durable_agents.steps.runstate``:

- ``run_id``; ``status``: ``running`` | ``completed`` | ``failed`` (a run
  its engine cannot go on with, parked, is still ``running``); ``answer``:
  the final answer's text once completed, else None; ``error``: why it
  failed, else None;
- ``turns``: every turn asked, in order (a turn not yet asked is left out):
  ``{"turn": n, "status", "attempts", "final", "calls"}``, ``final`` true for
  the recorded turn that asked for no tool (its text is the answer);
- each call of a recorded turn, in the model's order, recorded or not:
  ``{"index", "name", "key", "status", "attempts", "outcome", "effect_id"}``:
  ``key`` the call's idempotency key (``durable_agents.steps.loop.tool_key``; None for
  ``lookup_order``, which applies nothing), ``outcome`` ``ok`` | ``refused``
  once recorded, ``effect_id`` the provider's id of what it applied.

``loop_status_of(status)`` builds it from a loop run's status in the shared
steps shape, as ``python -m durable_agents.runrecord status --json`` prints it.

The orders a task names are the caller's to seed at the provider
(``durable_agents.providerclient.seed_orders``), and the model is the caller's too:
``LLM_BASE_URL`` in ``env`` (``durable_agents.testing.standin``, which counts every turn
asked), else the workers' scripted offline model. On Temporal, ``status``
of a loop run is the shared shape too, its steps the loop's (``turn-<n>``,
``turn-<n>/call-<i>``), as the run record's ``status --json`` gives them.

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
import functools
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
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Self, TypedDict

from durable_agents.dbosflow.sides import DbosSide
from durable_agents.steps import startedline
from durable_agents.steps.engine_row import Engine
from durable_agents.steps.loop import (
    DEFAULT_MAX_TURNS,
    DEFAULT_WINDOW_MESSAGES,
    DEFAULT_WINDOW_TOKENS,
    EFFECT_OF_TOOL,
    as_call,
    call_step,
    parse_step,
    tool_key,
    turn_step,
)
from durable_agents.steps.runstate import RunEntry, RunStateName, StepEntry, StepStateName, run_entry, step_entry
from lab import registry
from lab.processes import REPO, BaseProc, DevServer, Proc

if TYPE_CHECKING:
    from temporalio.client import Client

Status = RunEntry
"""A run's status in the shape every engine prints (``durable_agents.steps.runstate``)."""

DEFAULT_TIMEOUT = 120.0  # seconds for one process or one run: generous on a busy 2-core machine


class EngineError(RuntimeError):
    """A process did not die or end as the driver was told to expect; the message shows what it printed."""


class LoopCall(TypedDict):
    """One tool call of a recorded turn (the module docstring)."""

    index: int
    name: str
    key: str | None
    status: StepStateName
    attempts: int
    outcome: Literal["ok", "refused"] | None
    effect_id: str | None


class LoopTurn(TypedDict):
    """One turn asked (the module docstring)."""

    turn: int
    status: StepStateName
    attempts: int
    final: bool
    calls: list[LoopCall]


class LoopStatus(TypedDict):
    """A loop run in one shape for every engine (the module docstring)."""

    run_id: str
    status: Literal["running", "completed", "failed"]
    turns: list[LoopTurn]
    answer: str | None
    error: str | None


def _loop_state(word: RunStateName) -> Literal["running", "completed", "failed"]:
    return "completed" if word == "completed" else "failed" if word == "failed" else "running"


def loop_status_of(status: Status) -> LoopStatus:
    """``LoopStatus`` from a loop run's status in the shared steps shape (``durable_agents.steps.runstate``: steps named
    ``turn-<n>`` and ``turn-<n>/call-<i>``, each recorded result as the run record keeps it), as ``python -m
    durable_agents.runrecord status --json`` prints it. ``EngineError`` for a run of the flow."""
    run_id = status["run_id"]
    turns: list[LoopTurn] = []
    asked: list[Any] = []
    answer: str | None = None
    for step in status["steps"]:
        try:
            number, index = parse_step(step["name"])
        except ValueError:
            raise EngineError(f"run {run_id} is a run of the flow (step {step['name']}), not of the agent loop; "
                              "status(run_id) reads it") from None
        recorded = step["result"]
        result: dict[str, Any] | None = (recorded if step["status"] == "completed" and isinstance(recorded, dict)
                                         else None)
        if index is None:
            if step["status"] == "pending" and not step["attempts"]:
                continue  # planned, not asked yet
            asked = list(result.get("calls") or []) if result is not None else []
            final = result is not None and not asked
            if final and result is not None:
                answer = result.get("content")
            turns.append({"turn": number, "status": step["status"], "attempts": step["attempts"], "final": final,
                          "calls": []})
            continue
        call = as_call(asked[index])
        name = call.name[:64]
        turns[-1]["calls"].append({
            "index": index, "name": name,
            "key": tool_key(run_id, number, index, call.id) if name in EFFECT_OF_TOOL else None,
            "status": step["status"], "attempts": step["attempts"],
            "outcome": result.get("status") if result is not None else None,
            "effect_id": result.get("effect_id") if result is not None else None})
    state = _loop_state(status["status"])
    return {"run_id": run_id, "status": state, "turns": turns, "answer": answer if state == "completed" else None,
            "error": status["error"]}


def _loop_of_temporal(found: dict[str, Any]) -> LoopStatus:
    """``LoopStatus`` from ``durable_agents.flowclient.loop.loop_status``'s dict (what ``starter.py status --json``
    prints)."""
    turns: list[LoopTurn] = [{
        "turn": t["turn"], "status": t["status"], "attempts": t["attempts"],
        "final": t["status"] == "completed" and not t["calls"],
        "calls": [{"index": c["index"], "name": c["name"], "key": c["key"], "status": c["status"],
                   "attempts": c["attempts"], "outcome": c["outcome"], "effect_id": c["effect_id"]}
                  for c in t["calls"]]} for t in found["turns"]]
    return {"run_id": found["run_id"], "status": _loop_state(found["status"]), "turns": turns,
            "answer": found["answer"], "error": found["error"]}


def _entry_of_temporal_loop(found: dict[str, Any]) -> Status:
    """The shared steps shape of a loop run on Temporal (``durable_agents.flowclient.loop.loop_status``'s dict): a step
    per turn and per call, their results as the history recorded them (text cut as the status cuts it)."""
    steps: list[StepEntry] = []
    for t in found["turns"]:
        recorded = t["status"] == "completed"
        turn_result = ({"turn": t["turn"], "content": t["answer"],
                        "calls": [{"name": c["name"], "arguments": c.get("arguments")} for c in t["calls"]]}
                       if recorded else None)
        steps.append(step_entry(turn_step(t["turn"]), t["status"], t["attempts"], turn_result, crashes=t["crashes"],
                                last_error=None if recorded else t["last_error"]))
        for c in t["calls"]:
            done = c["status"] == "completed"
            result = ({"status": c["outcome"], "content": c.get("result"), "idempotency_key": c["key"],
                       "effect_id": c["effect_id"], "replayed": c["replayed"]} if done else None)
            steps.append(step_entry(call_step(t["turn"], c["index"]), c["status"], c["attempts"], result,
                                    crashes=c["crashes"], last_error=None if done else c["last_error"]))
    return run_entry(found["run_id"], found["status"], steps, error=found["error"])


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
    """The engine protocol, and the part every driver shares: the processes it started, their environment,
    the deadlines. An engine's registration (``lab.registry``) names its driver; a lane's driver (not an
    engine: the in-memory flow) names itself, ``lane``."""

    lane: ClassVar[str | None] = None
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

    @classmethod
    def made(cls, env: Mapping[str, str] | None = None, *, server: DevServer | None = None,
             **options: Any) -> EngineDriver:
        """The driver, as ``driver_for`` makes it: ``server`` is for the engines whose record is a server's
        (``Engine.needs_server``), which override this."""
        return cls(env, **options)

    @functools.cached_property
    def registration(self) -> Engine:
        """The engine's row in the registry (looked up once a driver: its name and CLI are read for every
        process it starts); ``EngineError`` for a lane's driver, which has none."""
        found = registry.of_driver(type(self))
        if found is None:
            raise EngineError(f"{type(self).__name__} is no registered engine's driver (lab.registry)")
        return found

    @property
    def name(self) -> str:
        """The engine's name (its registration's), or the lane's."""
        return self.lane or self.registration.name

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

    async def start_loop(self, run_id: str, task: str, email: str, *, crash_at: str = "",
                         max_turns: int = DEFAULT_MAX_TURNS, window_tokens: int = DEFAULT_WINDOW_TOKENS,
                         window_messages: int = DEFAULT_WINDOW_MESSAGES, history_bound: int | None = None) -> Proc:
        """Start a run of the agent loop; the process returned runs it, and dies at ``crash_at`` if it gets
        there (the module docstring)."""
        raise NotImplementedError(f"the {self.name} engine's driver does not run the agent loop "
                                  f"({type(self).__name__}.start_loop is not written)")

    async def loop_status(self, run_id: str) -> LoopStatus | None:
        """The loop run in the shape every engine shares (``LoopStatus``), or None if the engine holds no
        such run."""
        raise NotImplementedError(f"the {self.name} engine's driver does not read the agent loop "
                                  f"({type(self).__name__}.loop_status is not written)")

    async def retry(self, run_id: str, timeout: float | None = None) -> Status | None:
        """Run a failed run again from the step that failed, to its end; its status then."""
        raise EngineError(f"the {self.name} engine has no retry of a failed run")

    def processes(self) -> list[BaseProc]:
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

    lane = "in_memory"

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
    """An engine whose CLI runs a run to its end in one process: ``start``, ``resume``, ``status --json``;
    ``python -m`` runs its registration's ``cli``."""

    @property
    def module(self) -> str:
        cli = self.registration.cli
        if cli is None:
            raise EngineError(f"the {self.name} engine registers no CLI (Engine.cli)")
        # A checkout from before the adapter was one package (durable_agents 0.2.0) has its engines at the top.
        top = cli.rpartition(".")[2]
        if not (self.code / Path(*cli.split("."))).is_dir() and (self.code / top).is_dir():
            return top
        return cli

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

    async def start_loop(self, run_id: str, task: str, email: str, *, crash_at: str = "",
                         max_turns: int = DEFAULT_MAX_TURNS, window_tokens: int = DEFAULT_WINDOW_TOKENS,
                         window_messages: int = DEFAULT_WINDOW_MESSAGES, history_bound: int | None = None) -> Proc:
        """``python -m MODULE loop RUN_ID TASK``, which runs the loop to its end in that process (on DBOS each
        turn and each call a DBOS step); ``resume`` is the engine's, as for the flow. Neither the run record nor
        DBOS keeps a history to bound: ``history_bound`` is Temporal's, ignored here."""
        argv = ["-m", self.module, "loop", run_id, task, "--email", email, "--max-turns", str(max_turns),
                "--window-tokens", str(window_tokens), "--window-messages", str(window_messages)]
        return self.spawn(f"{self.module}-loop", argv, crash_at=crash_at)

    async def loop_status(self, run_id: str) -> LoopStatus | None:
        """``python -m MODULE status RUN_ID --json``, read turn by turn."""
        found = await self.status(run_id)
        return None if found is None else loop_status_of(found)

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
    """The hand-rolled SQLite run record (``python -m durable_agents.runrecord``)."""

    knew = "read the record of run"
    # ``durable_agents.runrecord.cli.EXIT_LEASE_HELD``, read as a user reads it: the exit code
    LEASE_HELD: ClassVar[int] = 5

    async def resume(self, run_id: str, *, args: Sequence[str] = (), name: str | None = None,
                     timeout: float | None = None) -> Settled:
        """As the CLI engines do, asked again while the run's lease is held (exit 5): a dead runner on this
        host is taken over at once (``durable_agents.runrecord.lease``); one the record cannot prove dead holds the run
        until its lease expires."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        refused = 0
        while True:
            proc = self.spawn(name or f"{self.module}-resume", ["-m", self.module, "resume", run_id, *args])
            code = await self.exit_code(proc, max(1.0, deadline - time.monotonic()))
            if code != self.LEASE_HELD or time.monotonic() > deadline:
                break
            refused += 1
            await asyncio.sleep(0.2)  # a poll, with the deadline above: the lease expires on its own clock
        return Settled(proc, code, await self.status(run_id), refused)

    async def retry(self, run_id: str, timeout: float | None = None) -> Status | None:
        """``python -m durable_agents.runrecord retry RUN_ID``: the failed step again, with a fresh budget, to the
        run's end."""
        await self.exit_code(self.spawn(f"{self.module}-retry", ["-m", self.module, "retry", run_id]), timeout)
        return await self.status(run_id)


class DbosDriver(_CliDriver):
    """The flow and the agent loop on DBOS Transact (``python -m durable_agents.dbosflow``; the optional ``dbos``
    extra)."""

    knew = "launched DBOS"

    async def steps(self, run_id: str) -> DbosSide | None:
        """DBOS's own rows for the run (``python -m durable_agents.dbosflow steps --json``): this process imports no
        DBOS."""
        side: DbosSide | None = await self.cli_json("steps", run_id)
        return side


class TemporalDriver(EngineDriver):
    """Temporal: worker processes on one task queue of ``server`` (a ``DevServer`` its caller started), and
    the runs started there as ``starter.py`` starts them (``durable_agents.flowclient.runs``)."""

    knew = "history events of run"

    @classmethod
    def made(cls, env: Mapping[str, str] | None = None, *, server: DevServer | None = None,
             **options: Any) -> EngineDriver:
        if server is None:
            raise ValueError("the Temporal driver needs a dev server: pass server=DevServer(...).start()")
        return cls(server, env, **options)

    def __init__(self, server: DevServer, env: Mapping[str, str] | None = None, *, queue: str | None = None,
                 code: Path = REPO, timeout: float = DEFAULT_TIMEOUT, poll: float = 0.1) -> None:
        super().__init__(env, code=code, timeout=timeout)
        self.server = server  # replace it after a restart of the server (a power cut): the client follows
        self.queue = queue or f"lab-{uuid.uuid4().hex[:10]}"
        self.poll = poll
        self._client: Client | None = None
        self._client_of: BaseProc | None = None
        self._loops: dict[str, bool] = {}  # run id -> a run of the agent loop: a run id's workflow never changes

    async def client(self) -> Client:
        """A client of the server, with this process's environment and the driver's (a payload codec key
        included, as the workers have it); connected again once the server is another process."""
        if self._client is None or self._client_of is not self.server.proc:
            from durable_agents.flowclient.connect import connect

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
        ``durable_agents.steps.retry.RetryRule``; by default the one the driver's environment gives, as a CLI
        engine's."""
        from durable_agents.flowclient.runs import start_run
        from durable_agents.steps.retry import rule_from_env

        created, _ = await start_run(await self.client(), run_id, task, email, conversation, queue=self.queue,
                                     rule=rule or rule_from_env({**os.environ, **self.env}))
        return created

    async def start(self, run_id: str, task: str, email: str, *, crash_at: str = "",
                    conversation: str | None = None, args: Sequence[str] = (), name: str | None = None) -> Proc:
        """A worker armed with ``crash_at``, then the run: the worker is ready before the run's first task."""
        worker = await self.start_worker(crash_at=crash_at, args=args, name=name)
        await self.submit(run_id, task, email, conversation=conversation)
        return worker

    async def submit_loop(self, run_id: str, task: str, email: str, *, max_turns: int = DEFAULT_MAX_TURNS,
                          window_tokens: int = DEFAULT_WINDOW_TOKENS, window_messages: int = DEFAULT_WINDOW_MESSAGES,
                          history_bound: int | None = None, rule: Any = None) -> bool:
        """Start a loop run on the queue (True), or find it started already (False), as ``starter.py loop``
        does (``durable_agents.flowclient.loop.start_loop``); ``rule`` as for ``submit``."""
        from durable_agents.flowclient.loop import DEFAULT_HISTORY_BOUND, start_loop
        from durable_agents.steps.retry import rule_from_env

        created, _ = await start_loop(await self.client(), run_id, task, email, task_queue=self.queue,
                                      max_turns=max_turns, window_tokens=window_tokens,
                                      window_messages=window_messages,
                                      history_bound=DEFAULT_HISTORY_BOUND if history_bound is None else history_bound,
                                      rule=rule or rule_from_env({**os.environ, **self.env}))
        self._loops[run_id] = True
        return created

    async def start_loop(self, run_id: str, task: str, email: str, *, crash_at: str = "",
                         max_turns: int = DEFAULT_MAX_TURNS, window_tokens: int = DEFAULT_WINDOW_TOKENS,
                         window_messages: int = DEFAULT_WINDOW_MESSAGES, history_bound: int | None = None) -> Proc:
        """A worker armed with ``crash_at``, then the loop run (``submit_loop``)."""
        worker = await self.start_worker(crash_at=crash_at)
        await self.submit_loop(run_id, task, email, max_turns=max_turns, window_tokens=window_tokens,
                               window_messages=window_messages, history_bound=history_bound)
        return worker

    async def _is_loop(self, run_id: str) -> bool:
        """Whether ``run_id`` is a loop run (``TemporalRunNotFound`` if there is none), asked once per run id."""
        if run_id not in self._loops:
            from durable_agents.flowclient.loop import is_loop_run

            self._loops[run_id] = await is_loop_run(await self.client(), run_id)
        return self._loops[run_id]

    async def loop_status(self, run_id: str) -> LoopStatus | None:
        """``durable_agents.flowclient.loop.loop_status`` (what ``starter.py status --json`` prints), in the shared
        shape."""
        from durable_agents.flowclient.loop import NotALoopRun, loop_status
        from durable_agents.flowclient.status import TemporalRunNotFound

        try:
            found = await loop_status(await self.client(), run_id)
        except TemporalRunNotFound:
            return None
        except NotALoopRun as err:
            raise EngineError(str(err)) from None
        return _loop_of_temporal(found)

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
        from durable_agents.flowclient.runs import wait_for_status

        timeout = self.timeout if timeout is None else timeout
        if not await self._is_loop(run_id):
            found: Status = await wait_for_status(await self.client(), run_id, until, on_change, poll=self.poll,
                                                  timeout=timeout)
            return found
        deadline = time.monotonic() + timeout
        last = None
        while True:
            status = await self._loop_entry(run_id)
            if on_change is not None and status != last:
                on_change(status)
            last = status
            if until(status):
                return status
            if time.monotonic() > deadline:
                raise TimeoutError(f"run {run_id} did not get there in {timeout:.0f} s; last status: {status}")
            await asyncio.sleep(self.poll)

    async def _loop_entry(self, run_id: str) -> Status:
        from durable_agents.flowclient.loop import loop_status

        return _entry_of_temporal_loop(await loop_status(await self.client(), run_id))

    async def status(self, run_id: str) -> Status | None:
        """The run's status (``durable_agents.flowclient.status``); a loop run's with the loop's steps (the module
        docstring)."""
        from durable_agents.flowclient.status import TemporalRunNotFound, run_status

        try:
            if await self._is_loop(run_id):
                return await self._loop_entry(run_id)
            found: Status = await run_status(await self.client(), run_id)
        except TemporalRunNotFound:
            return None
        return found

    async def retry(self, run_id: str, timeout: float | None = None) -> Status | None:
        """A reset to the workflow task that scheduled the failed step (``durable_agents.flowclient.runs``), to the
        run's end."""
        from durable_agents.flowclient.runs import restart_failed_run

        await restart_failed_run(await self.client(), run_id)
        return await self.wait_for(run_id, lambda s: s["status"] != "running", timeout=timeout)

    def processes(self) -> list[BaseProc]:
        server = self.server.proc
        return [*super().processes(), *([server] if server is not None and server.alive() else [])]

    def how_it_knew(self, proc: Proc) -> str:
        """The worker's replay line, without the log record's prefix."""
        return super().how_it_knew(proc).split("temporalio.workflow: ", 1)[-1]


LANES: dict[str, type[EngineDriver]] = {d.lane: d for d in (InMemoryDriver,) if d.lane}
"""The drivers of lanes that are not engines, by the name each gives itself."""


def engine_names() -> tuple[str, ...]:
    """What ``driver_for`` drives: the lanes, then every registered engine (``lab.registry``)."""
    return (*LANES, *registry.names())


def driver_for(engine: str, env: Mapping[str, str] | None = None, *, server: DevServer | None = None,
               **options: Any) -> EngineDriver:
    """The driver of ``engine`` (one of ``engine_names()``); a server's engine (Temporal) needs the ``server``."""
    if engine in LANES:
        return LANES[engine](env, **options)
    try:
        cls: type[EngineDriver] = registry.driver_class(engine)
    except registry.UnknownEngine:
        raise registry.UnknownEngine(f"no engine {engine!r}: choose from {', '.join(engine_names())}") from None
    return cls.made(env, server=server, **options)
