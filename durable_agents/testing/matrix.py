"""The kill matrix: an agent of yours killed at every crash point its run reaches, on each engine, and judged
from outside the killed process.

    report = KillMatrix("myagent.agent:AGENT", "Book a room on 2027-01-12", params={"attendee": "ana@x.org"},
                        engines=("temporal", "runrecord"), env={"SCHEDULER_URL": url},
                        temporal_address=server.address).run()
    report.assert_ok()  # AssertionError naming the point, the engine and what went wrong

(The pytest plugin's ``kill_matrix`` fixture makes one with a dev server of its own: docs/your-agent.md.)

How, per engine:

1. **An unkilled run** of the task, with ``CRASH_TRACE`` set: every crash point the run reaches is written
   down in order. That is the matrix: each point at each time it was reached (``tool:book_room:after_effect@1``,
   ``turn:after_answer@3``), which covers after each turn's answer, after each call of each tool (an effect's
   ``after_effect``, a read-only call's ``after_call``), between calls, between turns and at continue-as-new:
   whatever the run reached (docs/crashpoints.md names them).
2. **Per point**, a run of its own (a run id, a task queue or a record of its own), its process started with
   ``CRASH_AT=<point>@<time>``: the process kills itself by SIGKILL there. Then the run is taken over as a
   user's would be: a standby worker on Temporal; ``resume RUN_ID`` on the run record and DBOS. Points run one
   after the other, or side by side (``parallel``), each in its own processes.
3. **The verdict**, from outside the killed process:

   - the run ends as the unkilled run ended (its status word: completed, or failed);
   - each call with an effect was applied under its key: asked through its tool's lookup by key (the engine's
     ``settle --json``), a call recorded done whose key its service does not hold is a **failure** (the handler
     did not send the key it was given, or sent something else with it); a call whose tool declares no lookup
     is **not judged**, never passed, unless a ``probe`` is given;
   - ``probe`` (optional): ``probe(run_id) -> {label: count}``, what your service applied for that run, read
     by your code; each label's count must be the unkilled run's (more: applied twice; fewer: lost). It is how
     an effect the adapter cannot see (a tool declared read-only that writes) is counted;
   - no recorded turn asked again: when the agent's model is a ``ScriptedModel``, the engines ask it through
     the model stand-in (``AGENT_MODEL=worker``, ``durable_agents.testing.standin``), which counts the
     requests per run and turn in its own process: each turn once, except the turn whose answer the kill
     lost (a kill at ``turn:after_answer@N``: turn N may be asked twice, and the row says so).

   A point the process never reached (a model that varies its answers) is **not reached**, not passed.

Nothing is downloaded: Temporal is the dev server the caller gives (``temporal_address``); the engines are
this package's commands (``python -m durable_agents.worker``, ``.starter``, ``.runrecord``, ``.dbosflow``) run
with this interpreter in ``cwd`` (the folder the agent's import string is imported from).

**An engine that is not this package's** (``ForeignEngine``): an agent written with another framework, run by
its own workers, can be given to random mode as an entry of ``engines=``, and to the point matrix at the
points its workers arm (``points=``, its ``run_at``). It says how its runs are run under
kills and how each ended; the matrix draws the kills, runs its unkilled reference run, and judges each run as
it judges its own: the end against the reference's, the effects by ``probe`` (a foreign engine has no lookup
by key, so with no probe every row is **not judged**, never passed), the turns at a model stand-in the caller
names (``standin_url``).
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from durable_agents.testing.processes import Proc, run_in_thread

__all__ = ["ENGINES", "ForeignEngine", "KillMatrix", "Killed", "MatrixError", "Report", "Row", "points_of"]

ENGINES = ("temporal", "runrecord", "dbos")
Probe = Callable[[str], Mapping[str, int]]


class MatrixError(RuntimeError):
    """The matrix could not be run (the unkilled run did not end, an engine not known): says what to do."""


@dataclass
class Row:
    """One point on one engine: what was seen and the verdict (``passed``, ``failed``, ``not judged``,
    ``not reached``), with the reasons a person reads."""

    engine: str
    point: str
    verdict: str
    run_id: str
    status: str = ""
    reasons: list[str] = field(default_factory=list)
    effects: list[dict[str, Any]] = field(default_factory=list)
    turns: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    probe: dict[str, int] = field(default_factory=dict)
    """A foreign engine's run: what the probe counted (its effects are not asked by key, so this is the column)."""

    def effects_text(self) -> str:
        if not self.effects and self.probe:
            return "probe: " + ", ".join(f"{label} {n}" for label, n in sorted(self.probe.items()))
        states = Counter(e["state"] for e in self.effects)
        return ", ".join(f"{n} {state}" for state, n in sorted(states.items())) or "-"

    def turns_text(self) -> str:
        return " ".join(f"{t}:{n}" for t, n in self.turns.items()) or "-"


@dataclass
class Killed:
    """What a hook (``at_kill``, ``at_end``) is shown of one killed run: the engine, the point, the run, the
    run's environment (``RUNRECORD_DB``, ``DBOSFLOW_DB``, ``TASK_QUEUE``: where its record is), what the killed
    process printed and, at the end, what the processes that took it over printed. ``status()`` is the
    engine's ``status --json`` of the run now; ``turns()`` the model's requests per turn counted so far (empty
    when the matrix does not count them)."""

    engine: str
    point: str
    run_id: str
    env: Mapping[str, str]
    killed_output: str
    takeover_output: str = ""
    standin_url: str | None = None
    """The model stand-in's API root, when the matrix counts turns through it."""
    _matrix: KillMatrix | None = field(default=None, repr=False)
    _engine: _Engine | None = field(default=None, repr=False)

    def status(self) -> dict[str, Any]:
        assert self._engine is not None
        return self._engine.status(self.run_id, self.env)

    def turns(self) -> dict[str, int]:
        assert self._matrix is not None
        return self._matrix._turns(self.run_id)


Hook = Callable[[Killed], None]


@dataclass
class Report:
    """A matrix's rows, and its unkilled runs (``reference``: per engine, status, trace and probe)."""

    agent: str
    task: str
    rows: list[Row]
    reference: dict[str, dict[str, Any]]
    seconds: float

    @property
    def failed(self) -> list[Row]:
        return [r for r in self.rows if r.verdict in ("failed", "not reached")]

    @property
    def findings(self) -> list[str]:
        """What the unkilled runs already show wrong (an effect its service does not hold under its key)."""
        return [f"{engine}, unkilled (run {ref['run_id']}): {said}" for engine, ref in self.reference.items()
                for said in ref.get("findings", [])]

    @property
    def ok(self) -> bool:
        return not self.failed and not self.findings

    def table(self) -> str:
        """The matrix as a person reads it: a line per point and engine."""
        width = max([len(r.point) for r in self.rows] + [5])
        wide = max([len(r.effects_text()) for r in self.rows] + [7])
        named = max([len(r.engine) for r in self.rows] + [9])  # a foreign engine's name may be longer
        lines = [f"kill matrix of {self.agent}: {len(self.rows)} run(s) judged in {self.seconds:.1f} s"]
        lines += [f"  random mode on {engine}: {ref['kills_landed']} kill(s) landed on a process with a run open"
                  for engine, ref in self.reference.items() if "kills_landed" in ref]
        lines.append(f"  {'point':<{width}}  {'engine':<{named}}  {'verdict':<11}  {'effects':<{wide}}  turns asked")
        for r in self.rows:
            lines.append(f"  {r.point:<{width}}  {r.engine:<{named}}  {r.verdict:<11}  {r.effects_text():<{wide}}  "
                         f"{r.turns_text()}")
        return "\n".join(lines)

    def explain(self) -> str:
        """What the unkilled runs show, then each row that did not pass, with its reasons."""
        out = [f"{said}" for said in self.findings]
        for r in self.rows:
            if r.verdict != "passed":
                out.append(f"{r.engine}, killed at {r.point} (run {r.run_id}): {r.verdict}")
                out.extend(f"  - {reason}" for reason in r.reasons)
        return "\n".join(out)

    def to_json(self) -> dict[str, Any]:
        return {"agent": self.agent, "task": self.task, "seconds": round(self.seconds, 2), "ok": self.ok,
                "reference": self.reference, "rows": [asdict(r) for r in self.rows]}

    def assert_ok(self) -> None:
        """``AssertionError`` with the table and every failing row explained, unless every kill passed (and the
        unkilled runs showed nothing wrong)."""
        if not self.ok:
            unjudged = sum(r.verdict == "not judged" for r in self.rows)
            head = f"{len(self.failed)} of {len(self.rows)} kill(s) failed" + (
                f", {unjudged} not judged" if unjudged else "")
            if self.findings:  # the cause, whatever the kills showed: first
                head = f"the unkilled run(s) already show {len(self.findings)} mistake(s); {head}"
            raise AssertionError(f"{head}\n{self.explain()}\n{self.table()}")


def points_of(trace: Sequence[str]) -> list[str]:
    """The points of an unkilled run's trace, each at each time it was reached: ``name@K``."""
    seen: Counter[str] = Counter()
    out = []
    for name in trace:
        seen[name] += 1
        out.append(f"{name}@{seen[name]}")
    return out


# ---------------------------------------------------------------- an engine that is not this package's


class ForeignEngine:
    """An engine the matrix does not know: another framework's agent run by its own workers, given to random
    mode (``KillMatrix(..., engines=[MyEngine(...)]).run_random(...)``) so its runs are killed and judged by
    the same tool, and its rows stand in the same report beside the adapter's engines.

    Subclass it and give ``name`` and the two methods below (``recorded_turns`` and ``close`` if you can).
    The matrix owns the randomness and the verdict; the engine owns its processes:

    - ``chaos`` runs runs to their end while kills land. The matrix calls it once with one run and no kills
      (the unkilled reference run: what each killed run's end and probe must equal), then once with every run
      of random mode;
    - ``status`` says how a run ended, as one word: ``"completed"``, ``"failed"``, ``"terminated"`` (one the
      engine stopped past its deadline: say so, never leave it running), ``"running"`` while it is open;
    - there is no settle: the matrix cannot ask your services by key, so effects are judged by the matrix's
      ``probe`` (``probe(run_id) -> {label: count}``, against the reference run's); without a probe every row
      is **not judged**;
    - turns are counted at the model stand-in the matrix is given (``standin_url``): your workers' model
      requests must reach it naming the run (``X-Lab-Run``; ``durable_agents.testing.standin``).

    The agent string the matrix is given is only the report's label here: the matrix loads nothing and
    starts no engine process of its own for a foreign engine. The point matrix (``KillMatrix.run``) takes it
    too when it gives ``run_at`` (its workers armed with ``CRASH_AT``, as ``durable_agents.steps.crashpoints``
    reads it) and the matrix is given ``points=``, the names its workers reach."""

    name: str = ""
    """The engine column of the report's rows; unique in one matrix, and not one of ``ENGINES``."""

    active_seconds: float | None = None
    """How long a run of the task runs once its processes are up (seconds): random mode draws the moments of
    its kills over it. Set it during the reference run (the first ``chaos``) if start-up is slow; None: the
    matrix takes the reference run's wall time."""

    def chaos(self, tasks: Mapping[str, str], kills: int, rng: random.Random, wait: tuple[float, float],
              on_kill: Callable[[str, float], None], parallel: int) -> None:
        """Run every run of ``tasks`` (run id -> the task's text) to its end, ``parallel`` at a time at most,
        while ``kills`` SIGKILLs land on processes running an open run, each after a wait drawn from ``wait``
        (``rng.uniform(*wait)`` seconds) and on a run chosen with ``rng``, so the seed decides both. Call
        ``on_kill(run_id, seconds since chaos began)`` once per run a kill caught open, once the killed
        process is dead and before the run is taken over; then take the run over as your deployment would
        (a replacement worker). Return when every run has ended: a run past your deadline is stopped and
        reads ``"terminated"``. Leave no process running, whatever happens (kill in ``finally``)."""
        raise NotImplementedError(f"{type(self).__name__} gives no chaos(): a ForeignEngine must say how its "
                                  "runs are run under kills")

    def status(self, run_id: str) -> str:
        """How ``run_id`` ended, one word (``"completed"``, ``"failed"``, ``"terminated"``; ``"running"`` while
        open; ``""`` when the engine knows no such run)."""
        raise NotImplementedError(f"{type(self).__name__} gives no status(): a ForeignEngine must say how a run "
                                  "ended")

    def recorded_turns(self, run_id: str) -> set[str] | None:
        """The turns ``run_id`` has recorded (their model answers kept: ``{"1", "2"}``), read while a kill has
        it open, or None when the engine cannot say: then only the bound of random mode holds its turns (each
        asked at most once more than the kills that caught its run), not "a recorded turn is never asked
        after the kill"."""
        return None

    def run_at(self, run_id: str, task: str, crash_at: str) -> bool:
        """The point matrix (``KillMatrix.run`` with ``points=``): run ``run_id`` of ``task`` with its worker armed
        with ``CRASH_AT=crash_at`` (``durable_agents.steps.crashpoints``: ``name@K``, its K-th reach), the worker
        SIGKILLed there, then the run taken over as your deployment would (a replacement worker, unarmed) and
        followed to its end. True if the armed worker died there; False if the run ended without reaching the
        point. Optional: without it the engine runs in random mode only."""
        raise NotImplementedError(f"{type(self).__name__} gives no run_at(): it runs in random mode only")

    def close(self) -> None:
        """Release what the engine holds (called once random mode is done with it, whatever happened)."""


# ---------------------------------------------------------------- the engines, by their commands


class _Engine:
    """How one engine starts a run (in a process that may be killed), takes it over, and reports on it."""

    module = ""
    settles = True  # its calls with an effect are asked by key (``settle``); a foreign engine's are not

    def __init__(self, matrix: KillMatrix, state: Path) -> None:
        self.m = matrix
        self.state = state
        self._prepared: dict[str, tuple[threading.Thread, list[Proc]]] = {}
        self.active_seconds = 1.0  # how long the last run ran, its process's start left out

    def env(self, run_id: str, **more: str) -> dict[str, str]:
        return {**self.m.env, **self.m.model_env, "MEMORY_DB": str(self.state / f"memory-{run_id}.db"),
                "PYTHONUNBUFFERED": "1", **more}

    def cli(self, args: Sequence[str], env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", self.module, *args], cwd=self.m.cwd, env={**os.environ, **env},
                              capture_output=True, text=True, timeout=self.m.timeout)

    def json_of(self, args: Sequence[str], env: Mapping[str, str]) -> dict[str, Any]:
        done = self.cli([*args, "--json"], env)
        try:
            return dict(json.loads(done.stdout))
        except ValueError:
            raise MatrixError(f"`python -m {self.module} {' '.join(args)} --json` printed no JSON (exit "
                              f"{done.returncode}): {done.stdout[-500:]}{done.stderr[-1500:]}") from None

    def run_args(self, run_id: str) -> list[str]:
        params = [a for name, value in self.m.params.items() for a in ("--param", f"{name}={value}")]
        return [run_id, self.m.task_of(run_id), "--agent", self.m.agent, *params]

    def status(self, run_id: str, env: Mapping[str, str]) -> dict[str, Any]:
        return self.json_of(["status", run_id], env)

    def settle(self, run_id: str, env: Mapping[str, str]) -> dict[str, Any]:
        return self.json_of(["settle", run_id], env)

    def close(self) -> None:
        """Kill what ``prepare`` started and no run took (a matrix that stopped early)."""
        for thread, started in self._prepared.values():
            thread.join(self.m.timeout)
            for proc in started:
                proc.kill()
        self._prepared.clear()

    def prepare(self, run_id: str, crash_at: str) -> None:
        """Start in the background what ``run`` of this run will need first, while another run is judged (a
        worker on the run's own queue, where it takes nothing of another run). Nothing, but on Temporal."""

    def run(self, run_id: str, crash_at: str, env: Mapping[str, str], procs: list[Proc],
            at_kill: Callable[[Proc], None] | None = None) -> bool:
        """Run ``run_id`` to its end; armed with ``crash_at`` (one point), killed there and taken over. True if
        the armed process died by SIGKILL (False: it never reached the point). ``at_kill(the killed process)``:
        called once it is dead, before the run is taken over."""
        raise NotImplementedError

    def recorded_turns(self, run_id: str, env: Mapping[str, str]) -> set[str] | None:
        """The turns ``run_id`` has recorded (their answers kept), or None while it cannot be read (not begun)."""
        try:
            status = self.status(run_id, env)
        except Exception:  # noqa: BLE001 - a run a kill caught before it was created reads as not begun
            return None
        if status.get("status") is None:
            return None
        return _recorded_turns(status)

    def chaos(self, ids: Sequence[str], kills: int, rng: random.Random, wait: tuple[float, float],
              on_kill: Callable[[str, float], None], procs: list[Proc], parallel: int) -> dict[str, dict[str, str]]:
        """Run every run of ``ids`` to its end while ``kills`` SIGKILLs land, each after a wait drawn from
        ``wait`` (seconds), on a process running an open run; ``on_kill(run_id, at)`` once per run a kill
        caught open (its process dead by then); at most ``parallel`` runs at a time where each run is a
        process. Each run's environment, by run id."""
        raise NotImplementedError


class _Foreign(_Engine):
    """A ``ForeignEngine`` behind the shape the matrix's own engines have."""

    settles = False

    def __init__(self, matrix: KillMatrix, state: Path, engine: ForeignEngine) -> None:
        super().__init__(matrix, state)
        self.foreign = engine

    def env(self, run_id: str, **more: str) -> dict[str, str]:
        return {}  # its runs' environments are its own

    def run(self, run_id: str, crash_at: str, env: Mapping[str, str], procs: list[Proc],
            at_kill: Callable[[Proc], None] | None = None) -> bool:
        """Armed (``crash_at``): the engine's ``run_at`` (the hooks see nothing: its processes are its own).
        Unarmed: the unkilled reference run, through its ``chaos`` with no kill."""
        if crash_at:
            return bool(self.foreign.run_at(run_id, self.m.task_of(run_id), crash_at))
        began = time.monotonic()
        self.foreign.chaos({run_id: self.m.task_of(run_id)}, 0, random.Random(0), (0.0, 0.0),
                           lambda rid, at: None, 1)
        self.active_seconds = self.foreign.active_seconds or time.monotonic() - began
        return False

    def chaos(self, ids: Sequence[str], kills: int, rng: random.Random, wait: tuple[float, float],
              on_kill: Callable[[str, float], None], procs: list[Proc], parallel: int) -> dict[str, dict[str, str]]:
        self.foreign.chaos({rid: self.m.task_of(rid) for rid in ids}, kills, rng, wait, on_kill, parallel)
        return {rid: {} for rid in ids}

    def status(self, run_id: str, env: Mapping[str, str]) -> dict[str, Any]:
        word = self.foreign.status(run_id)
        if not isinstance(word, str):
            raise MatrixError(f"{self.foreign.name}: status({run_id!r}) answered {word!r}, not a status word "
                              "(completed, failed, terminated, running)")
        return {"status": word or None}

    def settle(self, run_id: str, env: Mapping[str, str]) -> dict[str, Any]:
        return {"run_id": run_id, "steps": []}  # no lookup by key: the probe judges the effects

    def recorded_turns(self, run_id: str, env: Mapping[str, str]) -> set[str] | None:
        return self.foreign.recorded_turns(run_id)

    def close(self) -> None:
        self.foreign.close()


class _CliEngine(_Engine):
    """The run record and DBOS: one process runs a run to its end; ``resume RUN_ID`` takes a killed one over."""

    def run(self, run_id: str, crash_at: str, env: Mapping[str, str], procs: list[Proc],
            at_kill: Callable[[Proc], None] | None = None) -> bool:
        first = Proc(f"{self.module}-{run_id}", [sys.executable, "-m", self.module, "loop", *self.run_args(run_id)],
                     env={**env, "CRASH_AT": crash_at}, cwd=self.m.cwd)
        procs.append(first)
        code = first.wait(self.m.timeout)
        # From its first line (the run begun, the interpreter's start behind it) to its end: random mode's scale.
        self.active_seconds = time.time() - (first.arrived[0] if first.arrived else first.started_at)
        if code != -9:
            return False
        if at_kill is not None:
            at_kill(first)
        again = Proc(f"{self.module}-resume-{run_id}", [sys.executable, "-m", self.module, "resume", run_id],
                     env={**env, "CRASH_AT": ""}, cwd=self.m.cwd)
        procs.append(again)
        again.wait(self.m.timeout)
        return True


    def chaos(self, ids: Sequence[str], kills: int, rng: random.Random, wait: tuple[float, float],
              on_kill: Callable[[str, float], None], procs: list[Proc], parallel: int) -> dict[str, dict[str, str]]:
        envs = {rid: self.env(rid) for rid in ids}
        pending, live = list(ids), {}
        began, deadline = time.monotonic(), time.monotonic() + self.m.timeout * max(1, len(ids))
        landed = 0

        def launch(rid: str, verb: str) -> None:
            args = ["loop", *self.run_args(rid)] if verb == "loop" else ["resume", rid]
            live[rid] = Proc(f"{self.module}-{verb}-{rid}", [sys.executable, "-m", self.module, *args],
                             env={**envs[rid], "CRASH_AT": ""}, cwd=self.m.cwd)
            procs.append(live[rid])

        next_kill = time.monotonic() + rng.uniform(*wait)
        while pending or live:
            if time.monotonic() > deadline:
                raise MatrixError(f"the runs {sorted(live)} did not end within {deadline - began:.0f} s")
            while pending and len(live) < parallel:
                launch(pending.pop(0), "loop")
            for rid, proc in list(live.items()):
                if not proc.alive():
                    del live[rid]
            begun = sorted(rid for rid, proc in live.items() if proc.lines)  # its interpreter up, its run begun
            if landed < kills and begun and time.monotonic() >= next_kill:
                rid = rng.choice(begun)
                proc = live.pop(rid)
                proc.kill()
                proc.wait(self.m.timeout)
                landed += 1
                on_kill(rid, time.monotonic() - began)
                # Taken over by run id as a user's would be; a run the kill caught before it was created starts.
                launch(rid, "resume" if self.recorded_turns(rid, envs[rid]) is not None else "loop")
                next_kill = time.monotonic() + rng.uniform(*wait)
            time.sleep(0.05)
        return envs


class _RunRecord(_CliEngine):
    """Its status and its settle are read here, from the record (read only: the matrix records nothing)."""

    module = "durable_agents.runrecord"

    def env(self, run_id: str, **more: str) -> dict[str, str]:
        return super().env(run_id, RUNRECORD_DB=str(self.state / f"record-{run_id}.db"), **more)

    def status(self, run_id: str, env: Mapping[str, str]) -> dict[str, Any]:
        from durable_agents.runrecord import RunRecord
        from durable_agents.runrecord.status import status_of

        with RunRecord(Path(env["RUNRECORD_DB"])) as record:
            return dict(status_of(record.load(run_id)))

    def settle(self, run_id: str, env: Mapping[str, str]) -> dict[str, Any]:
        from durable_agents.runrecord import RunRecord
        from durable_agents.runrecord.status import loop_effect_calls
        from durable_agents.wiring.settle import settle_loop_calls

        with RunRecord(Path(env["RUNRECORD_DB"])) as record:
            calls = loop_effect_calls(record.load(run_id))
        with _environment(self.m.env):
            return {"run_id": run_id, "steps": run_in_thread(settle_loop_calls(calls, self.m.loaded))}


class _Dbos(_CliEngine):
    module = "durable_agents.dbosflow"

    def env(self, run_id: str, **more: str) -> dict[str, str]:
        # A system database per run: a DBOS process recovers every pending run of its version it finds there.
        return super().env(run_id, DBOSFLOW_DB=str(self.state / f"dbos-{run_id}.db"), **more)


class _Temporal(_Engine):
    """A worker armed with the point serves the run's own task queue; after its death a standby worker takes
    the run over, as another machine's worker would."""

    def env(self, run_id: str, **more: str) -> dict[str, str]:
        if not self.m.temporal_address:
            raise MatrixError("the temporal engine needs a Temporal server: give temporal_address (the pytest "
                              "plugin's kill_matrix fixture starts a dev server of its own)")
        return super().env(run_id, TEMPORAL_ADDRESS=self.m.temporal_address, TEMPORAL_NAMESPACE="default",
                           TASK_QUEUE=f"km-{run_id}", **more)

    def worker(self, name: str, env: Mapping[str, str], crash_at: str, procs: list[Proc]) -> Proc:
        proc = Proc(name, [sys.executable, "-m", "durable_agents.worker", "--agent", self.m.agent],
                    env={**env, "CRASH_AT": crash_at}, cwd=self.m.cwd)
        procs.append(proc)
        proc.wait_for_line("worker ready", timeout=self.m.timeout)
        return proc

    def prepare(self, run_id: str, crash_at: str) -> None:
        started: list[Proc] = []
        thread = threading.Thread(target=self.worker, args=(f"worker-{run_id}", self.env(run_id), crash_at, started),
                                  daemon=True)
        thread.start()
        self._prepared[run_id] = (thread, started)

    def run(self, run_id: str, crash_at: str, env: Mapping[str, str], procs: list[Proc],
            at_kill: Callable[[Proc], None] | None = None) -> bool:
        prepared = self._prepared.pop(run_id, None)
        if prepared is not None:  # started while the previous run was judged
            thread, started = prepared
            thread.join(self.m.timeout)
            procs += started
            if not started or not started[0].alive():
                raise MatrixError(f"the worker of run {run_id} did not start:\n"
                                  f"{started[0].last_lines() if started else ''}")
            first = started[0]
        else:
            first = self.worker(f"worker-{run_id}", env, crash_at, procs)
        run_began = time.monotonic()
        self.m.temporal.start(run_id, self.m.task_of(run_id), env["TASK_QUEUE"], self.m.loaded, self.m.agent,
                              self.m.params, self.m.temporal_start)
        self._until(lambda: not first.alive() or self._ended(run_id, env), run_id)
        self.active_seconds = time.monotonic() - run_began
        if first.alive():  # the run ended, the point never reached
            first.stop()
            return False
        code = first.wait(5)
        if code != -9:
            raise MatrixError(f"the worker of run {run_id} exited {code}:\n{first.last_lines()}")
        if at_kill is not None:
            at_kill(first)
        standby = self.worker(f"standby-{run_id}", env, "", procs)
        self._until(lambda: self._ended(run_id, env), run_id)
        standby.kill()  # the run has ended: nothing of it left for the worker to finish
        return True

    def chaos(self, ids: Sequence[str], kills: int, rng: random.Random, wait: tuple[float, float],
              on_kill: Callable[[str, float], None], procs: list[Proc], parallel: int) -> dict[str, dict[str, str]]:
        """Every run on one task queue, served by one worker; a kill lands on the worker while a run is open,
        and a new worker replaces it (what a deployment's supervisor does)."""
        group = f"rand-{uuid.uuid4().hex[:8]}"
        env = self.env(group)
        began = time.monotonic()
        worker = self.worker(f"worker-{group}-0", env, "", procs)
        for rid in ids:
            self.m.temporal.start(rid, self.m.task_of(rid), env["TASK_QUEUE"], self.m.loaded, self.m.agent,
                                  self.m.params, self.m.temporal_start)
        landed = 0
        while landed < kills:
            time.sleep(rng.uniform(*wait))
            open_runs = [rid for rid in ids if not self._ended(rid, env)]
            if not open_runs:
                break
            worker.kill()
            worker.wait(self.m.timeout)
            landed += 1
            at = time.monotonic() - began
            for rid in open_runs:
                on_kill(rid, at)
            worker = self.worker(f"worker-{group}-{landed}", env, "", procs)
        self._until(lambda: all(self._ended(rid, env) for rid in ids), ", ".join(ids))
        worker.kill()
        return {rid: env for rid in ids}

    def status(self, run_id: str, env: Mapping[str, str]) -> dict[str, Any]:
        return self.m.temporal.status(run_id) or {"status": None}

    def settle(self, run_id: str, env: Mapping[str, str]) -> dict[str, Any]:
        with _environment(self.m.env):  # the agent's services read where their service is from it
            return self.m.temporal.settle(run_id, self.m.loaded)

    def _ended(self, run_id: str, env: Mapping[str, str]) -> bool:
        status = self.m.temporal.status(run_id)
        return status is not None and status.get("status") not in ("running", None)

    def _until(self, done: Callable[[], bool], run_id: str) -> bool:
        deadline = time.monotonic() + self.m.timeout
        while not done():
            if time.monotonic() > deadline:
                raise MatrixError(f"run {run_id} did not end within {self.m.timeout:g} s")
            time.sleep(0.2)
        return True


class _TemporalReader:
    """One client of the server on an event loop of its own thread: the matrix polls a run's status often, and
    a command per poll would start an interpreter each time. Reads only (``loop_status``: the run's
    histories), as ``starter status --json`` does."""

    def __init__(self, address: str) -> None:
        import asyncio

        self.address = address
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="kill-matrix-temporal")
        self.thread.start()
        self.client: Any = None

    def _call(self, coro: Any) -> Any:
        import asyncio

        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=60)

    def status(self, run_id: str) -> dict[str, Any] | None:
        from temporalio.service import RPCError

        from durable_agents.flowclient.loop import loop_status

        async def read() -> dict[str, Any] | None:
            await self._connected()
            try:
                return await loop_status(self.client, run_id)
            except RPCError:  # not started yet
                return None

        return self._call(read())

    def start(self, run_id: str, task: str, queue: str, agent: Any, spec: str, params: Mapping[str, str],
              options: Mapping[str, Any]) -> None:
        from durable_agents.flowclient.loop import start_loop

        async def start() -> None:
            await self._connected()
            await start_loop(self.client, run_id, task, task_queue=queue, agent=agent, params=params,
                             agent_spec=spec, **options)

        self._call(start())

    def settle(self, run_id: str, agent: Any) -> dict[str, Any]:
        """What ``starter settle RUN_ID --json`` answers for a loop run: each call with an effect asked through
        its tool's lookup, with services built in this process."""
        from durable_agents.flowclient.loop import loop_status
        from durable_agents.wiring.settle import settle_loop_calls

        async def settle() -> dict[str, Any]:
            await self._connected()
            found = await loop_status(self.client, run_id)
            calls = {f"turn-{turn['turn']}/call-{call['index']}": (call["name"], call["key"])
                     for turn in found["turns"] for call in turn["calls"] if call["key"]}
            return {"run_id": run_id, "steps": await settle_loop_calls(calls, agent)}

        return dict(self._call(settle()))

    async def _connected(self) -> None:
        from durable_agents.flowclient.connect import connect

        if self.client is None:
            self.client = await connect({"TEMPORAL_ADDRESS": self.address, "TEMPORAL_NAMESPACE": "default"})

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


_ENGINE_CLASSES: dict[str, type[_Engine]] = {"temporal": _Temporal, "runrecord": _RunRecord, "dbos": _Dbos}


# ---------------------------------------------------------------- the matrix


class KillMatrix:
    """The matrix of one agent, one task and its parameters (the module docstring says what it does).

    ``agent``: the import string (``package.module:ATTR``) the engines load it by, from ``cwd`` (default this
    process's directory); ``task``: its text, or a function of the run id answering it (each run a task of its
    own, what it names seeded at your service first: runs that would contend for one thing, a room, an order,
    each have their own); ``env``: what the agent's services read (their URLs), given to every process;
    ``engines``: of ``ENGINES``; ``temporal_address``: a Temporal server for ``temporal``; ``probe``: see the
    module docstring; ``count_turns``: ask a ``ScriptedModel`` through the stand-in and count (default: when
    the agent's model is one; an agent that declares no model, asked the worker's, is then asked the
    package's scripted refund model there); ``parallel``: points run at once (1 by default: runs side by side share your
service, and one run's effects may change another's path, a room booked by both); ``timeout``: seconds for
each run to end; ``points``: only these (``name`` or ``name@K``), of those the unkilled run reached.

    ``engines`` may hold, beside the names, ``ForeignEngine`` instances: another framework's agent, in random
    mode only (``ForeignEngine``); ``agent`` is then only the report's label when every engine is foreign.
    ``standin_url``: a model stand-in already running (``durable_agents.testing.standin``) to count the turns
    at, instead of one the matrix starts: a foreign engine's workers must be pointed at it by their caller;
    the matrix's own engines are pointed at it (``AGENT_MODEL=worker``, ``LLM_BASE_URL``), so it must play
    the agent's script (``start_model_standin(agent=...)``, or none for an agent that declares no model), and
    ``vary`` is what it was started with. With foreign engines only and no ``standin_url``, no turn is counted.

    A look inside, for what only your record or service can show: ``at_kill(killed)`` is called once the armed
    process is dead, before the run is taken over (what the record holds at the kill); ``at_end(killed)`` once
    the run has ended and been judged (what the processes that took it over printed). Each gets a ``Killed``;
    an exception it raises (an ``assert``) fails the point's row with its message, the run still taken over
    and ended. ``temporal_start``: more keywords for ``start_loop`` on Temporal (``history_bound=20``: a run
    continues as new after its first turns, so ``temporal:loop:continue_as_new`` is reached)."""

    def __init__(self, agent: str, task: str | Callable[[str], str], *, params: Mapping[str, str] | None = None,
                 engines: Sequence[str] = ("temporal", "runrecord"), env: Mapping[str, str] | None = None,
                 cwd: Path | str | None = None, temporal_address: str | None = None, probe: Probe | None = None,
                 count_turns: bool | None = None, parallel: int = 1, timeout: float = 120.0,
                 points: Sequence[str] | None = None, at_kill: Hook | None = None, at_end: Hook | None = None,
                 temporal_start: Mapping[str, Any] | None = None, standin_url: str | None = None) -> None:
        if isinstance(engines, (str, ForeignEngine)):
            engines = (engines,)  # one engine given bare, not in a sequence
        self._foreign: dict[str, ForeignEngine] = {}
        names: list[str] = []
        for entry in engines:
            if isinstance(entry, ForeignEngine):
                name = entry.name
                if not isinstance(name, str) or not name.strip() or name in _ENGINE_CLASSES:
                    raise MatrixError(f"a ForeignEngine needs a name of its own for the report's rows (not one of "
                                      f"{', '.join(ENGINES)}), {type(entry).__name__} has {name!r}")
                self._foreign[name] = entry
            elif isinstance(entry, type) and issubclass(entry, ForeignEngine):
                raise MatrixError(f"give an instance of {entry.__name__}, not the class: {entry.__name__}(...)")
            elif not isinstance(entry, str):
                raise MatrixError(f"an engine is a name ({', '.join(ENGINES)}) or a ForeignEngine instance, not "
                                  f"{type(entry).__name__} {entry!r}")
            else:
                name = entry
            if name in names:
                raise MatrixError(f"the engine {name!r} is given twice: each engine's rows need a name of their own")
            names.append(name)
        unknown = [e for e in names if e not in _ENGINE_CLASSES and e not in self._foreign]
        if unknown or not names:
            raise MatrixError(f"unknown engines {unknown or '(none given)'}: choose from {', '.join(ENGINES)}, or "
                              "give a ForeignEngine instance")
        if standin_url is not None and not (isinstance(standin_url, str)
                                            and standin_url.startswith(("http://", "https://"))):
            raise MatrixError(f"standin_url is a model stand-in's API root (http://host:port/v1), not {standin_url!r}")
        if standin_url is not None and count_turns is False:
            raise MatrixError("standin_url is where turns are counted: it cannot go with count_turns=False")
        self.agent, self.task = agent, task
        self._tasks: dict[str, str] = {}
        self.params = {str(k): str(v) for k, v in (params or {}).items()}
        self.engines = tuple(names)
        self.env = {str(k): str(v) for k, v in (env or {}).items()}
        self.cwd = Path(cwd) if cwd is not None else Path.cwd()
        self.temporal_address = temporal_address
        self.probe = probe
        self.count_turns = count_turns
        self.parallel = max(1, parallel)
        self.timeout = timeout
        self.only = set(points) if points is not None else None
        self._points_given = list(points) if points is not None else []  # their order, for a foreign engine
        self.at_kill, self.at_end = at_kill, at_end
        self.temporal_start = dict(temporal_start or {})
        self.model_env: dict[str, str] = {}
        self.standin_url: str | None = None
        self._given_standin = standin_url.rstrip("/") if standin_url else None
        self._temporal: _TemporalReader | None = None
        self._loaded: Any = None

    def task_of(self, run_id: str) -> str:
        """The task of ``run_id``: the one task, or what the task function answered for it (asked once a run,
        before it starts: where a test seeds what the run's task names at its service)."""
        if run_id not in self._tasks:
            self._tasks[run_id] = self.task if isinstance(self.task, str) else str(self.task(run_id))
        return self._tasks[run_id]

    @property
    def _task_text(self) -> str:
        return self.task if isinstance(self.task, str) else f"{getattr(self.task, '__name__', 'task')}(run_id)"

    @property
    def temporal(self) -> _TemporalReader:
        if self._temporal is None:
            if not self.temporal_address:
                raise MatrixError("the temporal engine needs a Temporal server: give temporal_address")
            self._temporal = _TemporalReader(self.temporal_address)
        return self._temporal

    @property
    def loaded(self) -> Any:
        """The agent itself, loaded in this process from ``cwd`` (to start Temporal runs and ask its lookups)."""
        if self._loaded is None:
            from durable_agents.agent import load_agent

            if str(self.cwd) not in sys.path:
                sys.path.append(str(self.cwd))
            self._loaded = load_agent(self.agent)
        return self._loaded

    def _scripted(self) -> bool:
        if self.count_turns is not None:
            return self.count_turns
        from durable_agents.agent import ScriptedModel

        return isinstance(self.loaded.model, ScriptedModel)

    def _engine(self, name: str, state: Path) -> _Engine:
        if name in self._foreign:
            return _Foreign(self, state, self._foreign[name])
        return _ENGINE_CLASSES[name](self, state)

    @property
    def _own_engines(self) -> bool:
        return any(name not in self._foreign for name in self.engines)

    @contextmanager
    def _standin(self, vary: bool = False) -> Iterator[None]:
        if self._given_standin is not None:  # the caller's: counted there, asked there by the matrix's own engines
            self.standin_url = self._given_standin
            if self._own_engines:
                self.model_env = {"AGENT_MODEL": "worker", "LLM_BASE_URL": self._given_standin,
                                  "LLM_MODEL": "scripted"}
            yield
            return
        if not self._own_engines or not self._scripted():  # a foreign engine's agent is not loaded here
            yield
            return
        from durable_agents.testing.standin import start_model_standin

        # An agent that declares no model is asked the worker's own, offline the package's scripted refund model:
        # the stand-in's own script.
        own = self.loaded.model is not None
        proc, url = start_model_standin(agent=self.agent if own else None, env=self.env, cwd=self.cwd, vary=vary)
        self.standin_url = url
        self.model_env = {"AGENT_MODEL": "worker", "LLM_BASE_URL": url, "LLM_MODEL": "scripted"}
        try:
            yield
        finally:
            proc.stop()

    def run(self) -> Report:
        """The matrix: each crash point of the unkilled run, on each engine, a run killed there (the module
        docstring). A ``ForeignEngine`` takes part when it can arm a point (its ``run_at``), at the points given
        (``points=``: its workers' crash point names; no trace says which its run reaches)."""
        unarmed = [name for name, e in self._foreign.items() if type(e).run_at is ForeignEngine.run_at]
        if unarmed:
            raise MatrixError(f"{', '.join(unarmed)}: this ForeignEngine gives no run_at(), so it runs in random mode "
                              "only (run_random); give run_at() to kill its runs at named crash points")
        if self._foreign and self.only is None:
            raise MatrixError(f"{', '.join(self._foreign)}: give points= (the crash points its workers arm, e.g. "
                              "'tool:send_email:after_effect'): a foreign engine's unkilled run leaves no trace of "
                              "the points it reached")
        began = time.monotonic()
        rows: list[Row] = []
        reference: dict[str, dict[str, Any]] = {}
        with tempfile.TemporaryDirectory(prefix="kill-matrix-") as tmp, self._standin():
            state = Path(tmp)
            for name in self.engines:
                engine = self._engine(name, state)
                reference[name] = self._reference(engine, name, state)
                points = [p for p in reference[name]["points"] if self.only is None or p in self.only
                          or p.partition("@")[0] in self.only]
                if name in self._foreign:  # the points given, in their order, each at its first reach unless told
                    points = [p if "@" in p else f"{p}@1" for p in self._points_given]
                ids = [f"km-{_slug(name)}-{uuid.uuid4().hex[:10]}" for _ in points]
                if self.parallel == 1:
                    try:
                        for i, point in enumerate(points):
                            if i + 1 < len(points):
                                engine.prepare(ids[i + 1], points[i + 1])
                            rows.append(self._one(engine, name, point, reference[name], ids[i]))
                    finally:
                        engine.close()
                else:
                    with ThreadPoolExecutor(self.parallel) as pool:
                        rows += list(pool.map(lambda p, r, e=engine, n=name: self._one(e, n, p, reference[n], r),
                                              points, ids))
        self._close_reader()
        return Report(self.agent, self._task_text, rows, reference, time.monotonic() - began)

    def run_random(self, *, runs: int = 4, kills: int = 3, seed: int = 0, vary: bool = True,
                   parallel: int = 2) -> Report:
        """Random mode: per engine, an unkilled run, then ``runs`` runs of the task while ``kills`` SIGKILLs land
        at random moments (seeded by ``seed``: the waits, and which process; what each kill catches still
        depends on the machine), each killed run taken over (a new worker on Temporal; ``resume RUN_ID`` on
        the run record and DBOS, ``parallel`` runs at a time there). ``vary``: the model (a ``ScriptedModel``,
        through the stand-in) words each answer differently and gives each call a random id, as a real model,
        so a turn asked again would choose other keys. A row per run, judged as a point's is (its end, each
        effect once, the probe), and its turns: none recorded when a kill landed is asked after it, none asked
        more than once more than the kills that caught its run. A ``ForeignEngine`` among the engines runs its
        unkilled run and its runs under the kills its own way (its ``chaos``), with the same seed's draws."""
        if not (isinstance(runs, int) and runs >= 1 and isinstance(kills, int) and kills >= 0):
            raise MatrixError(f"random mode needs runs >= 1 and kills >= 0, got runs={runs!r} kills={kills!r}")
        began = time.monotonic()
        rng = random.Random(seed)
        rows: list[Row] = []
        reference: dict[str, dict[str, Any]] = {}
        with tempfile.TemporaryDirectory(prefix="kill-matrix-") as tmp, self._standin(vary=vary):
            state = Path(tmp)
            for name in self.engines:
                engine = self._engine(name, state)
                try:
                    rows += self._random_runs(engine, name, state, reference, runs, kills, seed, rng, parallel)
                finally:
                    engine.close()
        self._close_reader()
        return Report(self.agent, self._task_text, rows, reference, time.monotonic() - began)

    def _random_runs(self, engine: _Engine, name: str, state: Path, reference: dict[str, dict[str, Any]],
                     runs: int, kills: int, seed: int, rng: random.Random, parallel: int) -> list[Row]:
        """One engine's part of random mode: its reference run, its runs under the kills, a row per run."""
        rows: list[Row] = []
        reference[name] = ref = self._reference(engine, name, state)
        ids = [f"km-{_slug(name)}-r{i + 1}-{uuid.uuid4().hex[:8]}" for i in range(runs)]
        caught: dict[str, list[_Kill]] = {rid: [] for rid in ids}

        def on_kill(rid: str, at: float) -> None:
            turns = engine.recorded_turns(rid, engine.env(rid)) or set()
            asked = self._turns(rid)
            caught[rid].append(_Kill(round(at, 2), {t: asked.get(t, 0) for t in sorted(turns)}))

        procs: list[Proc] = []
        wait = (0.05, max(0.2, engine.active_seconds))  # the moments a run of the task is running
        try:
            envs = engine.chaos(ids, kills, rng, wait, on_kill, procs, max(1, parallel))
        finally:
            for proc in procs:
                proc.kill()
        ref["kills_landed"] = len({k.at for found in caught.values() for k in found})
        for i, rid in enumerate(ids):
            at = "; ".join(f"{k.at:.2f} s (turns recorded: {', '.join(k.recorded) or 'none'})"
                           for k in caught[rid]) or "none"
            row = Row(name, f"random #{i + 1}: {len(caught[rid])} kill(s)", "passed", rid)
            row.reasons.append(f"kills that caught it open (seed {seed}): {at}")
            try:
                self._judge(row, engine, envs[rid], ref, kills=caught[rid])
            except MatrixError as err:
                row.verdict = "failed"
                row.reasons.insert(0, str(err))
            rows.append(row)
        return rows

    def _close_reader(self) -> None:
        if self._temporal is not None:
            self._temporal.close()
            self._temporal = None

    def _reference(self, engine: _Engine, name: str, state: Path) -> dict[str, Any]:
        run_id = f"km-ref-{_slug(name)}-{uuid.uuid4().hex[:8]}"
        trace = state / f"trace-{run_id}.txt"
        env = engine.env(run_id, CRASH_TRACE=str(trace))
        procs: list[Proc] = []
        began = time.monotonic()
        try:
            engine.run(run_id, "", env, procs)
        finally:
            for proc in procs:
                proc.kill()
        seconds = time.monotonic() - began
        status = engine.status(run_id, env)
        if status.get("status") in (None, "running"):
            raise MatrixError(f"the unkilled run on {name} did not end: {json.dumps(status)[:1500]}")
        reached = trace.read_text().split() if trace.exists() else []
        effects = engine.settle(run_id, env).get("steps", [])
        refused = _refused_calls(status)
        findings = [_not_under_key(e) for e in effects if e["state"] not in ("applied", "cannot ask")
                    and e["step"] not in refused]
        return {"run_id": run_id, "status": status["status"], "points": points_of(reached), "effects": effects,
                "findings": findings, "seconds": round(seconds, 2),
                "probe": dict(self.probe(run_id)) if self.probe is not None else None,
                "turns": self._turns(run_id)}

    def _turns(self, run_id: str) -> dict[str, int]:
        if self.standin_url is None:
            return {}
        from durable_agents.testing.standin import turns_asked

        return turns_asked(self.standin_url, run_id)

    def _one(self, engine: _Engine, name: str, point: str, reference: Mapping[str, Any], run_id: str) -> Row:
        began = time.monotonic()
        env = engine.env(run_id)
        procs: list[Proc] = []
        row = Row(name, point, "passed", run_id)
        looked: list[str] = []  # what the hooks raised
        killed = Killed(name, point, run_id, env, "", standin_url=self.standin_url, _matrix=self, _engine=engine)

        def look(hook: Hook | None, which: str) -> None:
            if hook is not None:
                try:
                    hook(killed)
                except Exception as err:  # noqa: BLE001 - the user's hook: its failure is the row's
                    looked.append(f"{which}: {type(err).__name__}: {err}")

        dead: list[Proc] = []

        def at_kill(proc: Proc) -> None:
            dead.append(proc)
            killed.killed_output = proc.output()
            look(self.at_kill, "at_kill")

        try:
            if not engine.run(run_id, point, env, procs, at_kill):
                row.verdict = "not reached"
                row.reasons.append(f"the process armed with CRASH_AT={point} ended without reaching it (a model "
                                   "that answers differently from the unkilled run takes another path)")
                return row
            self._judge(row, engine, env, reference)
            after = procs[procs.index(dead[0]) + 1:] if dead else []
            killed.takeover_output = "\n".join(p.output() for p in after)
            look(self.at_end, "at_end")
            if looked:
                row.verdict = "failed"
                row.reasons = looked + row.reasons
        except (MatrixError, TimeoutError, subprocess.TimeoutExpired) as err:
            row.verdict = "failed"
            row.reasons.append(str(err))
            row.reasons += [f"{p.name} printed last:\n{p.last_lines(8)}" for p in procs]
        finally:
            for proc in procs:
                proc.kill()
            row.seconds = round(time.monotonic() - began, 2)
        return row

    def _judge(self, row: Row, engine: _Engine, env: Mapping[str, str], reference: Mapping[str, Any],
               kills: Sequence[_Kill] | None = None) -> None:
        """The verdict of ``row`` (see the module docstring). ``kills``: in random mode, the kills that caught
        the run open, each with the turns it had recorded then and their counts."""
        status = engine.status(row.run_id, env)
        row.status = str(status.get("status"))
        failures, unjudged = [], []
        if row.status != reference["status"]:
            failures.append(f"the run ended {row.status} ({status.get('error') or status.get('detail') or ''}), "
                            f"where an unkilled run of the same task ends {reference['status']}")
        row.effects = list(engine.settle(row.run_id, env).get("steps", []))
        refused = _refused_calls(status)
        # A call the unkilled run already left off its key is that run's finding (Report.findings), not this kill's.
        off_key = {e["step"] for e in reference["effects"] if e["state"] not in ("applied", "cannot ask")}
        for e in row.effects:
            if e["step"] in refused:
                e["state"] = "refused"  # the run recorded the call refused: nothing applied, nothing to find
            if e["state"] in ("applied", "refused"):
                continue
            if e["step"] in off_key:  # the unkilled run's finding; a lookup by the given key cannot count it here
                unjudged.append(f"{e.get('tool')} ({e['step']}, key {e['key']}): not judged: its service holds "
                                "nothing under the key it was given (as in the unkilled run), so its lookup "
                                "cannot tell whether it applied twice: give a probe")
            elif e["state"] == "cannot ask":
                unjudged.append(f"{e.get('tool')} ({e['step']}, key {e['key']}): not judged: "
                                f"{e.get('reason') or 'its tool declares no lookup by key'}")
            else:
                failures.append(_not_under_key(e) + " after this kill (the unkilled run's is)")
        if not engine.settles:
            unjudged.append("effects: not judged: this engine's calls cannot be asked by key (a ForeignEngine has "
                            "no settle): give probe=, what your service applied for the run")
        if len(row.effects) != len(reference["effects"]):
            failures.append(f"{len(row.effects)} call(s) with an effect recorded, {len(reference['effects'])} in "
                            "the unkilled run")
        if self.probe is not None:
            seen, want = dict(self.probe(row.run_id)), dict(reference["probe"] or {})
            if not engine.settles:
                row.probe = seen
            for label in sorted(set(seen) | set(want)):
                got, expected = seen.get(label, 0), want.get(label, 0)
                if got > expected:
                    failures.append(f"{label}: applied {got} times, {expected} in the unkilled run (the probe): "
                                    "an effect applied again")
                elif got < expected:
                    failures.append(f"{label}: applied {got} times, {expected} in the unkilled run (the probe): "
                                    "an effect lost")
            unjudged = []  # the probe judged every effect
        row.turns = self._turns(row.run_id)
        if self.standin_url is not None:
            if kills is None:
                killed_turn = _killed_turn(row.point)
                for turn, n in row.turns.items():
                    if n == 2 and turn == killed_turn:
                        row.reasons.append(f"turn {turn} asked twice: its answer died with the process (allowed)")
                    elif n > 1:
                        failures.append(f"turn {turn} asked {n} times: a recorded turn was asked again")
            else:
                failures += _asked_again(row, kills)
        if failures:
            row.verdict = "failed"
        elif unjudged:
            row.verdict = "not judged"
        row.reasons = failures + unjudged + row.reasons


@dataclass
class _Kill:
    """A kill that caught a run open (random mode): when, and the turns the run had recorded by then with the
    times each had been asked."""

    at: float
    recorded: dict[str, int]


def _recorded_turns(status: Mapping[str, Any]) -> set[str]:
    """The turns a status shows recorded: Temporal's ``turns`` (``starter status --json``), or the run
    record's and DBOS's ``turn-N`` steps, completed."""
    out = {str(t["turn"]) for t in status.get("turns") or [] if t.get("status") == "completed"}
    for step in status.get("steps") or []:
        name = str(step.get("name"))
        if name.startswith("turn-") and "/" not in name and step.get("status") == "completed":
            out.add(name.removeprefix("turn-"))
    return out


def _asked_again(row: Row, kills: Sequence[_Kill]) -> list[str]:
    """Random mode's rule for the turns (``row.turns``: each turn's requests at the stand-in at the end): a turn
    recorded when a kill landed is never asked after it; each turn is asked at most once more than the kills
    that caught its run open (a kill may take an answer not yet recorded with it)."""
    failures = []
    for kill in kills:
        for turn, then in kill.recorded.items():
            if row.turns.get(turn, 0) > then:
                failures.append(f"turn {turn} was recorded when the kill at {kill.at:.2f} s landed, asked {then} "
                                f"time(s) by then and {row.turns[turn]} at the end: a recorded turn asked again")
    for turn, n in row.turns.items():
        if n > 1 + len(kills):
            failures.append(f"turn {turn} asked {n} times with {len(kills)} kill(s) of its run: more than once "
                            "per kill")
        elif n > 1:
            row.reasons.append(f"turn {turn} asked {n} times: its answer died with a process {n - 1} time(s) "
                               "(allowed)")
    return failures


_ENV_LOCK = threading.Lock()


@contextmanager
def _environment(env: Mapping[str, str]) -> Iterator[None]:
    """``env`` in this process's environment for the block (one block at a time), as it was after."""
    with _ENV_LOCK:
        before = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            yield
        finally:
            for k, v in before.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def _not_under_key(e: Mapping[str, Any]) -> str:
    return (f"{e.get('tool')} ({e['step']}, key {e['key']}): its service holds nothing applied under the key "
            f"({e['state']}): the handler did not send the key it was given (ctx.key), or "
            "changed it (an attempt added, an id of its own); a retry then applies the effect again under another "
            "key")


def _refused_calls(status: Mapping[str, Any]) -> set[str]:
    """The calls a run's status shows refused (nothing applied: the model's arguments, or the service said
    no), as ``turn-N/call-I``: from Temporal's turns, or the run record's and DBOS's steps."""
    out = {f"turn-{t['turn']}/call-{c['index']}" for t in status.get("turns") or [] for c in t.get("calls") or []
           if c.get("outcome") == "refused"}
    for step in status.get("steps") or []:
        result = step.get("result")
        if "/" in str(step.get("name")) and isinstance(result, dict) and result.get("status") == "refused":
            out.add(step["name"])
    return out


def _slug(name: str) -> str:
    """``name`` as a run id may hold it (a foreign engine's name may have spaces, slashes)."""
    return "-".join(part for part in re.split(r"[^A-Za-z0-9_.]+", name) if part)[:40] or "engine"


def _killed_turn(point: str) -> str | None:
    name, _, times = point.partition("@")
    return times if name == "turn:after_answer" else None

