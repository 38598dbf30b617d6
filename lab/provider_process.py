"""The provider (``python -m provider``) as a real OS process: the one harness
the tests, the lab and the benchmarks start it with.

    provider = start_provider(work / "provider.db")      # listening when it returns
    provider.url                                          # give this to workers
    provider.kill()                                       # SIGKILL: a crash, or an outage
    provider.restart()                                    # same store, same port: the URL stays valid
    provider.stop()                                       # SIGTERM; returns the exit code

or ``with ProviderProcess(db) as provider:``, which kills it when the block
ends. The process is ``sys.executable -m provider`` from the repository root
(its stdout and stderr captured by ``lab.processes.Proc``); it is ready once
it prints its "listening" line, and a start that fails raises with what it
printed. The first start picks a free port unless one is given; every later
start (``restart``, or ``start`` after ``kill``) takes the same port and the
same database file, which is what an outage of a real API looks like to its
clients. Whatever is still running at interpreter exit is killed: nothing
leaves a provider behind.
"""

from __future__ import annotations

import atexit
import re
import sys
from collections.abc import Mapping
from pathlib import Path

from lab.processes import REPO, Proc

STARTUP_TIMEOUT = 30.0
_LISTENING = re.compile(r"provider listening on (http://\S+)")
# A wildcard address is announced as such; clients on this machine reach it on loopback.
_CONNECT_HOST = {"0.0.0.0": "127.0.0.1", "[::]": "[::1]"}
_live: set[ProviderProcess] = set()


class ProviderProcess:
    """One provider process at a time, on one database file and, once started, one port."""

    def __init__(self, db: str | Path, *, port: int = 0, host: str = "127.0.0.1", verbose: bool = False,
                 env: Mapping[str, str] | None = None, echo: bool = False,
                 startup_timeout: float = STARTUP_TIMEOUT) -> None:
        self.db = Path(db)
        self.port = port  # 0 picks a free one at the first start; then the port it took
        self.host = host
        self.verbose = verbose
        self.env = dict(env or {})
        self.echo = echo
        self.startup_timeout = startup_timeout
        self.url = ""
        self._proc: Proc | None = None

    # -- lifecycle -------------------------------------------------------------

    def start(self) -> ProviderProcess:
        """Start it and wait for its "listening" line; raise with its output if that does not come."""
        if self.alive():
            raise RuntimeError(f"the provider (pid {self.pid}) is already running; stop or kill it first")
        self.db.parent.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "provider", "--host", self.host, "--port", str(self.port),
                "--db", str(self.db)]
        if self.verbose:
            argv.append("--verbose")
        self._proc = Proc("provider", argv, env={"PYTHONUNBUFFERED": "1", **self.env}, cwd=REPO, echo=self.echo)
        _live.add(self)
        try:
            line = self._proc.wait_for_line("provider listening on", timeout=self.startup_timeout)
        except BaseException:
            self.kill()
            raise
        match = _LISTENING.search(line)
        if match is None:
            self.kill()
            raise RuntimeError(f"the provider announced an address it cannot be reached at: {line!r}")
        announced = match.group(1)
        host, port = announced.split("//", 1)[1].rsplit(":", 1)
        self.port = int(port)
        self.url = f"http://{_CONNECT_HOST.get(host, host)}:{self.port}"
        return self

    def restart(self) -> ProviderProcess:
        """Start again on the same database and port (stopping it first if it runs)."""
        if self.alive():
            self.stop()
        return self.start()

    def kill(self) -> None:
        """SIGKILL, as a crash, and reap it. Nothing to do if it is not running."""
        if self._proc is not None:
            self._proc.kill()
        _live.discard(self)

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM and wait; SIGKILL past ``timeout``. Returns the exit code
        (0 for a clean shutdown, -9 if it had to be killed; None if never started)."""
        if self._proc is None:
            return None
        self._proc.stop(timeout)
        _live.discard(self)
        return self._proc.popen.returncode

    def __enter__(self) -> ProviderProcess:
        return self if self.alive() else self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.kill()

    # -- what it is ------------------------------------------------------------

    @property
    def proc(self) -> Proc:
        """The current OS process (a new one after every start)."""
        if self._proc is None:
            raise RuntimeError("the provider has not been started: call start()")
        return self._proc

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self._proc is not None and self._proc.alive()

    def output(self) -> str:
        """What the current process printed, stdout and stderr together."""
        return self._proc.output() if self._proc is not None else ""

    def __repr__(self) -> str:
        state = f"pid {self.pid}" if self.alive() else "not running"
        return f"<ProviderProcess {self.url or 'unstarted'} {state} db={self.db}>"


def start_provider(db: str | Path, *, port: int = 0, host: str = "127.0.0.1", verbose: bool = False,
                   env: Mapping[str, str] | None = None, echo: bool = False) -> ProviderProcess:
    """A provider on ``db``, listening when this returns; the caller stops or kills it."""
    return ProviderProcess(db, port=port, host=host, verbose=verbose, env=env, echo=echo).start()


@atexit.register
def _kill_leftovers() -> None:
    for provider in list(_live):
        provider.kill()
