"""Test tiers: a test's tier is what it starts, marked from the fixtures it takes.

Tiers (markers, registered below; a test may carry several):

- ``process``: a child process of any kind (the dev server, a provider, a worker, the run record's or DBOS's
  CLI, the model stand-in, the grader, a lab command run as a subprocess, git);
- ``fuse``: a FUSE mount (``lab.powercut``: the power cut);
- ``postgres``: the project's own PostgreSQL (``lab.postgres``);
- ``browser``: headless Chromium;
- ``soak``: a long property run (its large sizes belong to ``bench/``).

A test with none of them is in the fast tier and is marked ``fast``: ``make test-fast`` runs ``-m fast``.
Tiers come from the fixtures a test takes, the whole closure (``client`` brings ``dev_server``): conftest's
in ``FIXTURE_TIERS``, a module's own declared with ``@starts(...)``; from a module's ``pytestmark`` where
every test of it starts something itself (with only ``tmp_path``, as tests/test_demo.py does); and from a
test's own ``@pytest.mark.process`` where only some do.

The guard: a fast test that starts a child process fails, naming the program, so the tier cannot drift. It
is an audit hook (``sys.addaudithook``; the events CPython raises before ``subprocess.Popen``, ``os.fork``,
``os.posix_spawn``, ``os.exec*``, ``os.system``), checked while a test is set up, run and torn down; a
session or module fixture first set up by a process test belongs to that test. Collection is not guarded.

The budget: ``--time-budget SECONDS`` prints the session's wall time at the end and a warning line when it
is over (a warning, not a failure: the machine is shared and noisy).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TypeVar

import pytest

F = TypeVar("F", bound=Callable[..., object])

TIERS = {
    "process": "starts a child process (dev server, provider, worker, CLI, grader, lab command)",
    "fuse": "mounts a FUSE file system (lab.powercut)",
    "postgres": "starts the project's own PostgreSQL (lab.postgres)",
    "browser": "drives headless Chromium",
    "soak": "a long property run at a size that proves the bound (larger sizes are in bench/)",
}
FAST = "fast"

# The conftest fixtures that start something, by the tier they put a test in. A fixture of a module's own
# declares its tiers where it is written, with ``@starts("process")`` under its ``@pytest.fixture``.
FIXTURE_TIERS = {
    # The adapter's pytest plugin (durable_agents.testing.plugin), loaded in every session.
    "durable_dev_server": ("process",),
    "kill_matrix": ("process",),
    "dev_server": ("process",),
    "provider": ("process",),
    "workers": ("process",),
    "runrecord": ("process",),
    "dbos_procs": ("process",),
    "standin": ("process",),
    "power_cut": ("fuse", "process"),
    "powercut_dir": ("fuse", "process"),
    "postgres": ("postgres", "process"),
}


def starts(*tiers: str) -> Callable[[F], F]:
    """Declare that a fixture starts something: every test that takes it (directly or through another
    fixture) is in these tiers. Goes under ``@pytest.fixture``."""
    unknown = [tier for tier in tiers if tier not in TIERS]
    if unknown or not tiers:
        raise ValueError(f"unknown tiers {unknown or '(none given)'}: choose from {', '.join(TIERS)}")

    def declare(func: F) -> F:
        if hasattr(func, "_fixture_function"):  # already a fixture: the mark would sit where pytest never looks
            raise TypeError(f"@starts{tiers!r} goes under @pytest.fixture, not above it (tests/tiers.py)")
        func.__test_tiers__ = tiers  # type: ignore[attr-defined]
        return func

    return declare


def _fixture_tiers(item: pytest.Item) -> set[str]:
    tiers: set[str] = set()
    info = getattr(item, "_fixtureinfo", None)
    for name in getattr(item, "fixturenames", ()):
        tiers.update(FIXTURE_TIERS.get(name, ()))
        for definition in (info.name2fixturedefs.get(name, ()) if info is not None else ()):
            tiers.update(getattr(definition.func, "__test_tiers__", ()))
    return tiers


_SPAWN_EVENTS = {"subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.exec", "os.spawn", "os.system",
                 "pty.spawn"}


class StartedAProcess(RuntimeError):
    """A fast-tier test started a child process."""


class _Guard:
    def __init__(self) -> None:
        self.current: pytest.Item | None = None

    def __call__(self, event: str, args: tuple) -> None:
        if event not in _SPAWN_EVENTS or self.current is None:
            return
        item, self.current = self.current, None  # the failure below must not trip the guard again
        what = " ".join(str(a) for a in args[1]) if event == "subprocess.Popen" and len(args) > 1 else str(args[:1])
        raise StartedAProcess(
            f"{item.nodeid} is in the fast tier but started a child process ({event}: {what[:200]}). Put it in "
            "the process tier: take conftest's fixture that starts it (dev_server, provider, workers, ...), "
            "declare a fixture of your own with @starts(\"process\") under its @pytest.fixture "
            "(from tests.tiers import starts), or mark the test @pytest.mark.process (a whole module: "
            "pytestmark = pytest.mark.process); docs/commands.md, 'The tests: tiers and budgets'")


_guard = _Guard()
_started = time.monotonic()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--time-budget", type=float, default=None, metavar="SECONDS",
                     help="print the session's wall time and warn when it is over SECONDS (tests/tiers.py)")


def pytest_configure(config: pytest.Config) -> None:
    for name, what in TIERS.items():
        config.addinivalue_line("markers", f"{name}: {what}")
    config.addinivalue_line("markers", f"{FAST}: starts nothing (set by tests/tiers.py; make test-fast)")
    sys.addaudithook(_guard)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for tier in sorted(_fixture_tiers(item)):
            item.add_marker(tier)
        if not any(item.get_closest_marker(tier) for tier in TIERS):
            item.add_marker(FAST)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    _guard.current = item if item.get_closest_marker(FAST) else None
    try:
        yield
    finally:
        _guard.current = None


@pytest.hookimpl(trylast=True)  # after pytest's own --durations list: the budget's lines come last
def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    budget = config.getoption("--time-budget")
    if budget is None or hasattr(config, "workerinput"):
        return
    wall = time.monotonic() - _started
    terminalreporter.write_line(f"wall time {wall:.0f} s ({wall / 60:.1f} min), budget {budget:.0f} s")
    if wall > budget:
        terminalreporter.write_line(
            f"WARNING: the tests took {wall - budget:.0f} s over their budget of {budget:.0f} s: a slow machine, "
            "or a test that belongs in another tier or in bench/ (--durations lists the slowest)", yellow=True)
