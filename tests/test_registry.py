"""The engine registry (``lab.registry``): each engine's package registers itself, the lab's loops reach a stub
engine a test registers, and an unknown name is refused with the names there are. Fast: the stub runs nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from durable_agents.steps.engine_row import Engine
from durable_agents.steps.plan import FLOW, FlowStep
from lab import engines, registry
from lab.engines import EngineDriver, Settled, Status, driver_for
from lab.loop_chaos import LoopChaosConfig, Session, run_engine, run_loop_chaos
from lab.processes import Proc


class StubDriver(EngineDriver):
    """An engine that starts no process and holds no run."""

    async def start(self, run_id: str, task: str, email: str, *, crash_at: str = "",
                    conversation: str | None = None, args: Sequence[str] = (), name: str | None = None) -> Proc:
        raise NotImplementedError("the stub starts no process")

    async def resume(self, run_id: str, *, args: Sequence[str] = (), name: str | None = None,
                     timeout: float | None = None) -> Settled:
        raise NotImplementedError("the stub starts no process")

    async def status(self, run_id: str) -> Status | None:
        return None


def stub_points(flow: Sequence[FlowStep]) -> tuple[str, ...]:
    return tuple(f"stub:{s.name}:after_record" for s in flow)


class StubSession(Session):
    """The loop chaos's session of the stub: it plans one wave and plays nothing."""

    async def play(self) -> None:
        self.plan_wave()
        self.say("the stub's session played")


STUB = Engine(name="stub", rank=99, label="a test's stub", driver=f"{__name__}:StubDriver",
              loop_session=f"{__name__}:StubSession", crash_points=stub_points, letter="S",
              sync_levels=("ON", "OFF"))


@pytest.fixture
def stub():
    with registry.registered(STUB) as row:
        yield row


def test_each_engine_registers_in_its_own_package():
    """The three engines are found where they live, each once, by rank, each with a driver of its own."""
    found = {e.name: e for e in registry.engines()}
    assert set(found) >= {"temporal", "runrecord", "dbos"}
    assert list(registry.names()) == sorted(found, key=lambda n: found[n].rank)
    drivers = [registry.driver_class(name) for name in found]
    assert all(issubclass(d, EngineDriver) for d in drivers) and len(set(drivers)) == len(drivers)
    assert {registry.registration_of(d).name for d in drivers} == set(found)


def test_the_lab_reaches_a_stub_engine_registered_by_a_test(stub):
    """A row registered from outside the checkout's packages is listed, driven and given its crash points."""
    assert "stub" in registry.names() and "stub" in engines.engine_names()
    driver = driver_for("stub", {"X": "1"}, timeout=5)
    assert isinstance(driver, StubDriver) and driver.name == "stub" and driver.env["X"] == "1"
    assert driver.registration is stub
    assert registry.engine_points(FLOW)["stub"] == stub_points(FLOW)
    assert registry.engine("stub").letter == "S"


def test_the_power_cut_matrix_cuts_a_stub_engine_at_each_of_its_levels(stub):
    from lab import powercut_matrix

    assert "stub" in powercut_matrix.engine_names()
    chosen = powercut_matrix.cases(["stub"], points=["between"], dirs=["strict"])
    assert sorted({(c.engine, c.sync) for c in chosen}) == [("stub", "OFF"), ("stub", "ON")]
    assert [c.own_default for c in chosen if c.placement == "laptop"] == [True, False]
    assert powercut_matrix.crash_at("stub", "between") == "stub:send_confirmation:after_record"


def test_a_registered_name_is_not_taken_twice(stub):
    with pytest.raises(ValueError, match="registered already"):
        registry.register(stub)


def test_an_unknown_engine_is_refused_with_the_registered_ones(stub):
    with pytest.raises(registry.UnknownEngine) as err:
        driver_for("nope")
    message = str(err.value)
    assert "'nope'" in message
    assert all(name in message for name in (*registry.names(), "in_memory", "stub")), message
    with pytest.raises(registry.UnknownEngine, match="choose from .*stub"):
        registry.engine("nope")


def test_the_stub_is_gone_after_its_test():
    assert "stub" not in registry.names()
    with pytest.raises(registry.UnknownEngine):
        driver_for("stub")


def test_a_lane_is_no_engine():
    """The in-memory flow is a lane: driven by name, named by its driver, not in the registry."""
    driver = driver_for("in_memory")
    assert driver.name == "in_memory" and "in_memory" not in registry.names()
    with pytest.raises(engines.EngineError, match="no registered engine"):
        driver.registration  # noqa: B018 - the property is the check


def test_a_server_engine_needs_its_server():
    server_engines = [e.name for e in registry.engines() if e.needs_server]
    assert server_engines
    for name in server_engines:
        with pytest.raises(ValueError, match="needs a dev server"):
            driver_for(name)


def test_every_registration_names_classes_that_exist():
    """Each engine's import strings resolve: its driver, and its loop chaos session where it runs the loop."""
    for row in registry.engines():
        assert issubclass(registry.driver_class(row.name), EngineDriver), row
        if row.loop_session is not None:
            assert issubclass(registry.session_class(row.name), Session), row


def test_the_loop_chaos_lists_a_stub_engine_and_refuses_an_unknown_one(stub, tmp_path):
    assert LoopChaosConfig().engines[-1] == "stub"
    assert registry.session_class("stub") is StubSession
    with pytest.raises(registry.UnknownEngine, match="choose from .*stub"):
        asyncio.run(run_engine("nope", LoopChaosConfig(workdir=tmp_path)))


@pytest.mark.process
async def test_the_loop_chaos_reaches_a_stub_engine_through_the_registry(stub, tmp_path):
    """The loop chaos of a stub engine: its session made from its row, played, checked (the provider and the
    model stand-in are real processes; the stub's session starts nothing)."""
    lines: list[str] = []
    reports = await run_loop_chaos(LoopChaosConfig(engines=("stub",), runs=2, workdir=tmp_path, say=lines.append))
    assert [r.engine for r in reports] == ["stub"] and reports[0].error is None, (reports, lines)
    assert any("stub: the stub's session played" in line for line in lines), lines
    # The checks ran over the stub's runs: planned, never run, so each fails the first check.
    assert len(reports[0].findings.failed) == 2 and not reports[0].ok
    assert all("its engine holds no such run" in line for line in reports[0].findings.failed)
    assert {r.run.run_id.split("-")[1] for r in reports[0].runs} == {"stub"}
    assert all(order.startswith("S-") for r in reports[0].runs for order in r.run.orders)
