"""The tiers hold (tests/tiers.py): a test's tier comes from what it takes, and a fast test that starts a
child process fails, naming what it started."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.tiers import FAST, FIXTURE_TIERS, TIERS, StartedAProcess, _fixture_tiers, _guard, starts


def test_a_test_that_takes_nothing_is_fast(request):
    assert request.node.get_closest_marker(FAST) is not None
    assert not any(request.node.get_closest_marker(tier) for tier in TIERS)


def test_a_fixture_declared_with_starts_puts_its_tests_in_that_tier():
    @starts("soak", "process")
    def long_thing() -> int:
        return 1

    class Definition:
        func = long_thing

    class Info:
        name2fixturedefs = {"long_thing": (Definition(),)}

    class Item:
        fixturenames = ["tmp_path", "long_thing"]
        _fixtureinfo = Info()

    assert _fixture_tiers(Item()) == {"soak", "process"}  # type: ignore[arg-type]


def test_starts_above_the_fixture_decorator_is_refused():
    with pytest.raises(TypeError, match="goes under @pytest.fixture"):
        @starts("process")
        @pytest.fixture
        def upside_down() -> int:
            return 1


def test_the_conftest_fixtures_that_start_things_are_tiered_by_name():
    class Item:
        fixturenames = ["tmp_path", "client", "dev_server", "postgres"]

    assert _fixture_tiers(Item()) == {"process", "postgres"}  # type: ignore[arg-type]
    assert set(FIXTURE_TIERS) >= {"dev_server", "provider", "workers", "runrecord", "dbos_procs", "standin",
                                  "power_cut", "postgres"}
    with pytest.raises(ValueError, match="choose from process"):
        starts("slow")


@pytest.mark.parametrize("spawn", [
    lambda: subprocess.run(["true"], check=True),
    lambda: os.system("true"),
    lambda: os.posix_spawn("/bin/true", ["true"], {}),
], ids=["subprocess", "os.system", "posix_spawn"])
def test_a_fast_test_that_starts_a_process_fails_naming_it(request, spawn):
    assert _guard.current is request.node, "the guard is not watching this fast test"
    with pytest.raises(StartedAProcess, match=r"is in the fast tier but started a child process .*true.*"
                                              r"@starts\(\"process\"\) under its @pytest.fixture.*"
                                              r"mark the test @pytest.mark.process"):
        spawn()
