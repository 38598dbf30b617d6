"""Run the provider as a real OS process in tests.

    from provider_process import running_provider

    @pytest.fixture
    def provider(tmp_path):
        with running_provider(tmp_path / "provider.db") as proc:
            yield proc          # proc.url, proc.pid, proc.db_path

    proc.kill()                 # SIGKILL, as a crash
    proc.restart()              # same db, same port: PROVIDER_URL stays valid

The process is started with ``sys.executable -m provider --port 0`` from the
repository root, and is ready once it prints its "listening" line. Its stderr
goes to ``<db>.stderr.log`` and is quoted in every startup failure. Leaving
the ``with`` block (or interpreter exit, as a last resort) kills whatever is
still running: no test leaves a provider behind.
"""

from __future__ import annotations

import atexit
import os
import re
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

REPO_ROOT = Path(__file__).resolve().parent.parent
STARTUP_TIMEOUT = 15.0
_LISTENING = re.compile(r"provider listening on (http://\S+)")
_live: set[ProviderProcess] = set()

T = TypeVar("T")


class ProviderStartError(RuntimeError):
    """The provider did not report that it was listening."""


class ProviderProcess:
    """One provider OS process at a time, on one database file."""

    def __init__(
        self,
        db_path: str | Path,
        *,
        port: int = 0,
        host: str = "127.0.0.1",
        verbose: bool = False,
        env: Mapping[str, str] | None = None,
        startup_timeout: float = STARTUP_TIMEOUT,
    ) -> None:
        self.db_path = Path(db_path)
        self.log_path = self.db_path.with_name(self.db_path.name + ".stderr.log")
        self.host = host
        self.port = port  # the requested port until started, then the actual one
        self.verbose = verbose
        self.extra_env = dict(env or {})
        self.startup_timeout = startup_timeout
        self.url = ""
        self.proc: subprocess.Popen[bytes] | None = None

    # -- lifecycle -------------------------------------------------------------

    def start(self) -> ProviderProcess:
        if self.running:
            raise RuntimeError(f"provider pid {self.pid} is already running")
        self.db_path.parent.mkdir(parents=True, exist_ok=True)
        args = [sys.executable, "-m", "provider", "--host", self.host, "--port", str(self.port),
                "--db", str(self.db_path)]
        if self.verbose:
            args.append("--verbose")
        env = {k: v for k, v in os.environ.items() if not k.startswith("PROVIDER_")}
        env.update(self.extra_env)
        env["PYTHONUNBUFFERED"] = "1"
        log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                args, cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log
            )
        _live.add(self)
        try:
            line = self._read_listening_line()
        except BaseException:
            self.kill()
            raise
        match = _LISTENING.fullmatch(line)
        if match is None:
            self.kill()
            raise ProviderStartError(f"unexpected first line from the provider: {line!r}\n"
                                     f"{self._stderr_since(log_offset)}")
        announced = match.group(1)
        self.port = int(announced.rsplit(":", 1)[1])
        connect_host = {"0.0.0.0": "127.0.0.1", "[::]": "[::1]"}.get(announced.split("//", 1)[1].rsplit(":", 1)[0])
        self.url = f"http://{connect_host}:{self.port}" if connect_host else announced
        return self

    def _read_listening_line(self) -> str:
        assert self.proc is not None and self.proc.stdout is not None
        deadline = time.monotonic() + self.startup_timeout
        fd = self.proc.stdout.fileno()
        buffer = b""
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_READ)
            while b"\n" not in buffer:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise ProviderStartError(
                        f"the provider printed no 'listening' line within {self.startup_timeout:g}s "
                        f"(stdout so far {buffer!r})\n{self.stderr_text()}"
                    )
                if not selector.select(remaining):
                    continue
                chunk = os.read(fd, 4096)
                if not chunk:
                    code = self.proc.wait(timeout=5)
                    raise ProviderStartError(
                        f"the provider exited with code {code} before listening (stdout {buffer!r})\n"
                        f"{self.stderr_text()}"
                    )
                buffer += chunk
        return buffer.split(b"\n", 1)[0].decode(errors="replace").strip()

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise RuntimeError("the provider has not been started")
        return self.proc.pid

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL, as a crash, and reap it."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)
        self._release()

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM and wait; returns the exit code. Escalates to SIGKILL on timeout."""
        if self.proc is None:
            raise RuntimeError("the provider has not been started")
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                raise AssertionError(f"the provider ignored SIGTERM for {timeout:g}s; killed it\n"
                                     f"{self.stderr_text()}") from None
        code = self.proc.returncode
        self._release()
        return code

    def restart(self, *, same_port: bool = True) -> ProviderProcess:
        """Start again on the same database (after kill() or stop(); stops it first if running).

        With ``same_port`` the URL is unchanged, so clients configured with it keep working.
        """
        if self.running:
            self.stop()
        if not same_port:
            self.port = 0
        return self.start()

    def close(self) -> None:
        """Make sure nothing is left running. Idempotent."""
        self.kill()

    def _release(self) -> None:
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()
        _live.discard(self)

    def __enter__(self) -> ProviderProcess:
        if self.proc is None:
            self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- diagnostics -----------------------------------------------------------

    def stderr_text(self) -> str:
        return "provider stderr:\n" + self._stderr_since(0)

    def _stderr_since(self, offset: int) -> str:
        try:
            with open(self.log_path, "rb") as log:
                log.seek(offset)
                return log.read().decode(errors="replace")[-8000:]
        except FileNotFoundError:
            return "(no stderr captured)"

    def __repr__(self) -> str:
        state = f"pid {self.proc.pid}" if self.running and self.proc else "not running"
        return f"<ProviderProcess {self.url or 'unstarted'} {state} db={self.db_path}>"


def start_provider(db_path: str | Path, **options: Any) -> ProviderProcess:
    """Start a provider and return it once it listens. The caller must close() it."""
    return ProviderProcess(db_path, **options).start()


@contextmanager
def running_provider(db_path: str | Path, **options: Any) -> Iterator[ProviderProcess]:
    """A started provider that is killed when the block ends, however it ends."""
    proc = ProviderProcess(db_path, **options)
    try:
        proc.start()
        yield proc
    finally:
        proc.close()


def poll_until(check: Callable[[], T | None], *, timeout: float, describe: Callable[[], str],
               interval: float = 0.05) -> T:
    """Call ``check`` until it returns something truthy; fail with what was seen."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise AssertionError(f"gave up after {timeout:g}s; last seen: {describe()}")
        time.sleep(interval)


@atexit.register
def _kill_leftovers() -> None:
    for proc in list(_live):
        proc.kill()
