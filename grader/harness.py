"""Running a learner's program as real processes, and the failures a check reports.

The learner's ``flow.py`` runs as its own OS process (``grader.launch``),
with the record at ``RECORD_DB`` in the grader's own work folder, the real
provider (``python -m provider``) at ``PROVIDER_URL`` and the model stand-in
at ``LLM_BASE_URL``. Its working directory is that work folder and it writes
no bytecode, so grading never writes into the learner's files. Kills are real
SIGKILLs: at a crash point of the step functions (``CRASH_AT``), or right
after the k-th commit (``GRADER_KILL_AFTER_COMMIT``).
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx

from grader.evidence import Effect, Record, Witnesses, effects, read_record
from grader.model import MODEL_NAME, ModelStandIn
from lab.processes import Proc, ProcessTimeout

T = TypeVar("T")
PROCESS_TIMEOUT = float(os.environ.get("GRADER_PROCESS_SECONDS") or 30)
"""How long one process of the learner's program may run before it counts as hung (tests shorten it)."""
TASK = "Confirm the refund for order 1234"


class Failed(Exception):
    """A check saw behaviour the lesson rules out: what, what was expected, what was seen, where to look."""

    def __init__(self, headline: str, *, expected: str, seen: str, look_at: str) -> None:
        super().__init__(headline)
        self.headline, self.expected, self.seen, self.look_at = headline, expected, seen, look_at


class Stopped(Exception):
    """The grading is being stopped (Ctrl-C, SIGTERM): a probe still running starts nothing more."""


class Hung(Failed):
    """A process of the learner's program ran past its time and was killed: a failure that carries how it ended
    (what it printed), for a check that judges what the hung process left behind before failing it."""

    def __init__(self, headline: str, *, expected: str, seen: str, look_at: str, outcome: Outcome) -> None:
        super().__init__(headline, expected=expected, seen=seen, look_at=look_at)
        self.outcome = outcome


class Skipped(Exception):
    """The check cannot run on this machine (e.g. no FUSE for a power cut): its reason is printed and reported
    as ``skipped``; the grading goes on and its exit code does not change."""


class CouldNotRun(Exception):
    """The learner's program died of an exception the lesson does not explain (a bug, a typo)."""

    def __init__(self, what: str, traceback: str) -> None:
        super().__init__(what)
        self.what, self.traceback = what, traceback


@dataclass
class Outcome:
    """How one process of the learner's program ended."""

    argv: list[str]
    code: int  # negative: killed by that signal
    output: str
    seconds: float

    @property
    def killed(self) -> bool:
        return self.code == -signal.SIGKILL

    def last_lines(self, n: int = 3) -> str:
        return last_lines(self.output, n)


def last_lines(output: str, n: int = 3) -> str:
    """A process's last ``n`` non-blank lines on one line, each cut at 200 characters, for a failure message."""
    lines = [line if len(line) <= 200 else line[:197] + "..." for line in output.splitlines() if line.strip()]
    return " | ".join(lines[-n:]) if lines else "(it printed nothing)"


@dataclass
class Run:
    """One run the grader starts: its id and its task (unique, so the model's calls are counted per run)."""

    run_id: str
    task: str
    email: str = "ada@example.com"
    outcomes: list[Outcome] = field(default_factory=list)
    record_db: Path | None = None  # its record, when not the harness's: on a power-cut mount (grader.power_cuts)


class Harness:
    """The grader's side of one grading: the learner's folder, a work folder, the provider and the model."""

    def __init__(self, impl: Path, work: Path, provider_url: str, model: ModelStandIn,
                 main_file: str = "flow.py") -> None:
        self.impl = impl
        self.flow = impl / main_file
        self.work = work
        self.record_db = work / "record.db"
        self.memory_file = work / "memory.json"
        # An empty database in WAL mode before any learner process opens it: two processes switching a
        # brand-new file to WAL at the same instant can make SQLite refuse one of them at once ("database is
        # locked", without waiting), a race of SQLite's, not of the lesson, and the checks run two at a time.
        with closing(sqlite3.connect(self.record_db)) as conn:
            conn.execute("PRAGMA journal_mode=WAL")
        self.provider_url = provider_url
        self.model = model
        self.deadline = float("inf")  # of the check being run
        self.processes = 0
        self._live: list[Proc] = []
        # Set by stop_all: a probe still running in another thread (side_by_side) when the
        # grading is stopped starts no new process, so nothing is left behind the cleanup.
        self._stopping = False
        self._live_lock = threading.Lock()
        self.evidence_runs: dict[str, Run] = {}  # runs a report quotes, by name

    # -- runs and processes -------------------------------------------------------

    def new_run(self, label: str) -> Run:
        run_id = f"{label}-{uuid.uuid4().hex[:6]}"
        return Run(run_id, f"{TASK} (run {run_id})")

    def start(self, run: Run, **how: Any) -> Outcome:
        """``python flow.py start``; ``how``: see ``_run``."""
        return self._run(run, ["start", run.run_id, run.task, "--email", run.email], **how)

    def resume(self, run: Run, **how: Any) -> Outcome:
        return self._run(run, ["resume", run.run_id], **how)

    def _run(self, run: Run, args: list[str], *, crash_at: str = "", kill_after_commit: int = 0,
             env: dict[str, str] | None = None, timeout: float = PROCESS_TIMEOUT,
             hung: tuple[str, str] | None = None) -> Outcome:
        """One process of the learner's program. ``crash_at``: a crash point to SIGKILL it at;
        ``kill_after_commit``: SIGKILL it right after that commit; ``env``: more environment;
        ``timeout`` and ``hung`` (headline, where to look): how long it may run, and what a hang means."""
        env = {
            "RECORD_DB": str(run.record_db or self.record_db),
            "PROVIDER_URL": self.provider_url,
            "LLM_BASE_URL": self.model.base_url,
            "LLM_MODEL": MODEL_NAME,
            "LLM_TIMEOUT": "10",
            "MEMORY_DB": "off",
            "MEMORY_FILE": str(self.memory_file),
            "MEMORY_MAX_TOKENS": "2000",
            "CRASH_AT": crash_at,
            "GRADER_KILL_AFTER_COMMIT": str(kill_after_commit or ""),
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONUNBUFFERED": "1",
            **(env or {}),
        }
        argv = [sys.executable, "-m", "grader.launch", str(self.flow), *args]
        shown = ["python", self.flow.name, *args]
        timeout = min(timeout, self.deadline - time.monotonic())
        if timeout <= 0:
            raise Failed("the check ran out of time before its next process could start",
                         expected="the check's processes to finish within its deadline",
                         seen=f"{self.processes} processes run so far", look_at="a program that is slow or waits")
        began = time.monotonic()
        # Ctrl-C or SIGTERM waits until the process is listed, so the grader's cleanup always finds it.
        masked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            with self._live_lock:
                if self._stopping:
                    raise Stopped("the grading was stopped: no new process")
                proc = Proc("learner", argv, env=env, cwd=self.work)
                self._live.append(proc)
                self.processes += 1
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, masked)
        try:
            try:
                proc.wait(timeout)  # and every line it printed read, for the outcome below
            except ProcessTimeout:
                _kill_group(proc)
                outcome = Outcome(shown, proc.popen.returncode, proc.output(), time.monotonic() - began)
                headline, look_at = hung or ("", "a loop that never ends, or a wait for something that never comes")
                raise Hung(
                    f"`{' '.join(shown[:3])} {run.run_id}` was still running after {timeout:.0f} s (killed)"
                    + (f": {headline}" if headline else ""),
                    expected="the process to finish, or to be killed at its crash point, well within that time",
                    seen=f"it was still running; its last lines: {outcome.last_lines()}",
                    look_at=look_at, outcome=outcome) from None
        finally:
            _kill_group(proc)
            with self._live_lock:
                if proc in self._live:
                    self._live.remove(proc)
        outcome = Outcome(shown, proc.popen.returncode, proc.output(), time.monotonic() - began)
        run.outcomes.append(outcome)
        return outcome

    def side_by_side(self, *probes: Callable[[], T]) -> list[T]:
        """Run independent probes (each its own runs) two at a time, the machine's cores; their results in
        order, or the failure of the first probe that failed, so a report reads the same every time."""
        with ThreadPoolExecutor(max_workers=2) as pool:
            futures = [pool.submit(probe) for probe in probes]
        return [future.result() for future in futures]

    @property
    def stopping(self) -> bool:
        """The grading is being stopped (``stop_all``): a probe starts nothing more, a mount included."""
        return self._stopping

    def stop_all(self) -> None:
        with self._live_lock:
            self._stopping = True
            live, self._live = list(self._live), []
        for proc in live:
            _kill_group(proc)

    # -- evidence -----------------------------------------------------------------

    def record(self, run: Run) -> Record:
        return read_record(run.record_db or self.record_db, run.run_id)

    def witnesses(self, run: Run) -> Witnesses:
        return Witnesses(len(self.model.calls(run.task)), tuple(effects(self.provider_url, run.run_id)))

    def effects(self, run: Run) -> list[Effect]:
        return list(effects(self.provider_url, run.run_id))

    @contextmanager
    def faults(self, **spec: Any) -> Iterator[None]:
        """The provider's injected faults (``provider.faults``) for the block, cleared after it."""
        with httpx.Client(timeout=5.0) as http:
            http.post(f"{self.provider_url}/admin/faults", json=spec).raise_for_status()
            try:
                yield
            finally:
                http.delete(f"{self.provider_url}/admin/faults").raise_for_status()

    def saved_memory(self, conversation_id: str) -> list[str]:
        """The message ids the learner's memory file keeps for a conversation (its given format)."""
        try:
            saved = json.loads(self.memory_file.read_text())
        except (OSError, ValueError):
            return []
        kept = saved.get(conversation_id) if isinstance(saved, dict) else None
        return [str(m.get("id")) for m in kept if isinstance(m, dict)] if isinstance(kept, list) else []

    def wipe_memory(self) -> None:
        self.memory_file.unlink(missing_ok=True)

    def probe_memory(self, budget: int, appends: int) -> dict:
        """Exercise 4's long exchange against the learner's BoundedMemory, in a process of its own."""
        path = self.impl / "bounded_memory.py"
        if not path.is_file():
            raise Failed("there is no bounded_memory.py beside flow.py", expected=f"{path}",
                         seen="no such file", look_at="exercise 4's practice/ folder holds the file to start from")
        argv = [sys.executable, "-m", "grader.memory_probe", str(path), "--max-tokens", str(budget),
                "--appends", str(appends)]
        proc = Proc("memory-probe", argv, env={"PYTHONDONTWRITEBYTECODE": "1"}, cwd=self.work)
        self.processes += 1
        try:
            proc.wait(timeout=max(1.0, min(60.0, self.deadline - time.monotonic())))
        except ProcessTimeout:  # the learner's append never returns
            raise Failed("the long exchange did not finish within a minute", expected="3,000 appends in seconds",
                         seen="BoundedMemory.append or window still running",
                         look_at="a loop in append that never ends (TODO 8)") from None
        finally:
            _kill_group(proc)
        output = proc.drained()
        try:
            return json.loads(output.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise CouldNotRun("the long exchange could not run", output[-3000:]) from None

    # -- outcomes ---------------------------------------------------------------

    def could_not_run(self, outcome: Outcome) -> CouldNotRun | None:
        """The process's own exception, trimmed to the learner's files, if it died of one."""
        if outcome.code in (0, -signal.SIGKILL) or "Traceback (most recent call last)" not in outcome.output:
            return None
        return CouldNotRun(f"`{' '.join(outcome.argv)}` exited {outcome.code} with an exception",
                           trim_traceback(outcome.output, self.impl))

    def raise_could_not_run(self, outcome: Outcome) -> None:
        """Raise ``CouldNotRun`` if the process died of its own exception; return if it did not."""
        crashed = self.could_not_run(outcome)
        if crashed is not None:
            raise crashed


def _kill_group(proc: Proc) -> None:
    """SIGKILL the process and anything it started (it leads a session of its own), and reap it."""
    try:
        os.killpg(proc.popen.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.popen.wait(timeout=10)
    except Exception:  # noqa: BLE001 - reaping is best effort; the kill was sent
        pass


_FRAME = re.compile(r'^  File "(?P<path>[^"]+)", line \d+')


def trim_traceback(output: str, impl: Path) -> str:
    """The last traceback in ``output``, with only the frames in the learner's folder (all of them if none is)."""
    text = output[output.rindex("Traceback (most recent call last)"):]
    lines = text.splitlines()
    frames: list[list[str]] = []
    tail: list[str] = []
    for line in lines[1:]:
        if _FRAME.match(line):
            frames.append([line])
        elif line.startswith("    ") and frames and not tail:
            frames[-1].append(line)
        elif line.strip():
            tail.append(line)
    root = str(impl.resolve())
    mine = [f for f in frames if str(Path(_FRAME.match(f[0])["path"]).resolve()).startswith(root)]  # type: ignore[index]
    kept = mine or frames[-2:]
    body = [line for frame in kept for line in frame]
    return "\n".join(["Traceback (most recent call last):", *body, *tail[-6:]])
