"""The kill matrix's random mode on an engine that is not the adapter's (``durable_agents.testing.ForeignEngine``),
the way ``python -m peers`` gives it the peer frameworks' lanes: here a tiny lane with no framework
(tests/foreign_lane.py: a worker process per run that emails at the provider, then holds before it records the
run done). Killed in that window and replaced, a worker that sends a fresh key per attempt emails twice, and
random mode says so in the foreign engine's rows, counted at the provider by the probe; the same lane keyed by
the run passes; without a probe its rows are not judged; its turn, counted at the stand-in the caller names,
is asked once however often its worker is killed after recording it.

What is refused, with what to do instead, is held by fast tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from durable_agents.providerclient import fetch_effects
from durable_agents.testing import ForeignEngine, KillMatrix, MatrixError
from tests.foreign_lane import ForeignLane


def emails(provider_url: str):
    def probe(run_id: str) -> dict[str, int]:
        return {"email": sum(r.effects_applied for r in fetch_effects(provider_url, run_id) if r.kind == "email")}

    return probe


# ---------------------------------------------------------------- fast: what is refused


class _Named(ForeignEngine):
    def __init__(self, name: object) -> None:
        self.name = name  # type: ignore[assignment]


def test_a_foreign_engine_needs_a_name_of_its_own_and_an_instance():
    with pytest.raises(MatrixError, match="needs a name of its own .* has 'temporal'"):
        KillMatrix("lane", "t", engines=[_Named("temporal")])
    with pytest.raises(MatrixError, match="has ''"):
        KillMatrix("lane", "t", engines=[_Named("")])
    with pytest.raises(MatrixError, match="the engine 'lane-a' is given twice"):
        KillMatrix("lane", "t", engines=[_Named("lane-a"), _Named("lane-a")])
    with pytest.raises(MatrixError, match="give an instance of _Named, not the class"):
        KillMatrix("lane", "t", engines=[_Named])
    with pytest.raises(MatrixError, match="a name .* or a ForeignEngine instance, not int 3"):
        KillMatrix("lane", "t", engines=[3])  # type: ignore[list-item]
    with pytest.raises(MatrixError, match="model stand-in's API root"):
        KillMatrix("lane", "t", engines=[_Named("lane-a")], standin_url="127.0.0.1:9/v1")
    with pytest.raises(MatrixError, match="cannot go with count_turns=False"):
        KillMatrix("lane", "t", engines=[_Named("lane-a")], standin_url="http://127.0.0.1:9/v1", count_turns=False)


def test_a_foreign_engine_must_say_how_and_the_point_matrix_needs_its_run_at_and_points():
    with pytest.raises(MatrixError, match="lane-a: this ForeignEngine gives no run_at\\(\\), so it runs in random"):
        KillMatrix("lane", "t", engines=[_Named("lane-a")]).run()
    with pytest.raises(MatrixError, match="lane: give points="):
        KillMatrix("lane", "t", engines=[ForeignLane("lane", Path("."), {})]).run()
    with pytest.raises(NotImplementedError, match="_Named gives no chaos"):
        _Named("lane-a").chaos({}, 0, None, (0, 0), lambda rid, at: None, 1)  # type: ignore[arg-type]
    assert _Named("lane-a").recorded_turns("r") is None  # cannot say: only random mode's bound holds


# ---------------------------------------------------------------- the lane under random kills


@pytest.mark.timeout(120)
def test_random_mode_reports_a_foreign_lane_that_applies_an_effect_twice_and_passes_it_keyed(
        provider, standin, tmp_path):
    """Every kill lands between the email and the run's record of it (the lane opens a run to kills only
    there): each killed run of the fresh-key lane shows the email applied once more per kill, and fails
    naming it; the keyed lane's runs pass, however they were killed. The turn was recorded before the effect:
    asked once in every run."""
    env = {"PROVIDER_URL": provider.url, "LLM_BASE_URL": standin}
    for keyed in (False, True):
        lane = ForeignLane("lane, keyed" if keyed else "lane, fresh key", tmp_path, env, keyed=keyed)
        report = KillMatrix("tests.foreign_lane", "Email the customer.", engines=[lane], probe=emails(provider.url),
                            standin_url=standin).run_random(runs=2, kills=2, seed=7)
        ref = report.reference[lane.name]
        assert ref["status"] == "completed" and ref["probe"] == {"email": 1} and ref["turns"] == {"1": 1}, ref
        assert ref["kills_landed"] == 2, report.table()
        assert [r.point.split(":")[0] for r in report.rows] == ["random #1", "random #2"], report.table()
        assert "lane" in report.table() and "random mode on lane" in report.table()
        for row in report.rows:
            kills = int(row.point.split(": ")[1].split()[0])
            assert row.status == "completed" and row.turns == {"1": 1}, report.explain()
            assert row.probe == {"email": 1 if keyed else 1 + kills}, row
            assert f"probe: email {row.probe['email']}" in row.effects_text()
            if keyed or not kills:
                assert row.verdict == "passed", report.explain()
            else:
                assert row.verdict == "failed", report.explain()
                assert (f"email: applied {1 + kills} times, 1 in the unkilled run (the probe): an effect applied "
                        "again") in row.reasons[0], report.explain()
        assert report.ok is keyed, report.explain()


@pytest.mark.timeout(60)
def test_without_a_probe_a_foreign_engine_s_rows_are_not_judged_never_passed(provider, tmp_path):
    lane = ForeignLane("lane", tmp_path, {"PROVIDER_URL": provider.url})
    report = KillMatrix("tests.foreign_lane", "Email the customer.", engines=[lane]).run_random(runs=1, kills=1)
    (row,) = report.rows
    assert row.verdict == "not judged" and "give probe=" in row.reasons[0], report.explain()
    assert row.turns == {} and "not judged" in report.table()  # not a failure (as a tool with no lookup): shown


@pytest.mark.timeout(120)
def test_the_point_matrix_kills_a_foreign_lane_where_its_effect_applied_and_names_the_duplicate(
        provider, standin, tmp_path):
    """The point matrix on the same lane: its worker armed with ``tool:send_email:after_effect`` dies right after
    the email, a replacement finishes the run. The fresh-key lane applies the email twice and fails there,
    named; the keyed one passes. The turn, recorded before the email, is asked once."""
    env = {"PROVIDER_URL": provider.url, "LLM_BASE_URL": standin}
    for keyed in (False, True):
        lane = ForeignLane("lane, keyed" if keyed else "lane, fresh key", tmp_path, env, keyed=keyed)
        report = KillMatrix("tests.foreign_lane", "Email the customer.", engines=[lane], probe=emails(provider.url),
                            standin_url=standin, points=["tool:send_email:after_effect"]).run()
        (row,) = report.rows
        assert (row.point, row.status, row.turns) == ("tool:send_email:after_effect@1", "completed", {"1": 1}), row
        assert row.probe == {"email": 1 if keyed else 2}, row
        if keyed:
            assert row.verdict == "passed" and report.ok, report.explain()
        else:
            assert row.verdict == "failed", report.explain()
            assert "email: applied 2 times, 1 in the unkilled run (the probe): an effect applied again" in (
                row.reasons[0]), report.explain()
