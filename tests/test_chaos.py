"""A small chaos run (lab/chaos.py) in the suite: 12 concurrent runs, workers
SIGKILLed 3 times while runs are in flight, two workers part of the time,
the provider failing and losing responses. No duplicate and no lost effect,
and every run closed for a stated reason."""

from __future__ import annotations

from lab.chaos import ChaosConfig, run_chaos


async def test_small_chaos_run_loses_and_duplicates_nothing(dev_server, tmp_path):
    lines: list[str] = []
    config = ChaosConfig(runs=12, kills=3, seed=7, max_seconds=150, pace=1.0,
                         temporal_address=dev_server.address, workdir=tmp_path, say=lines.append)
    report = await run_chaos(config)
    summary = report.summary()
    print(summary)
    assert report.ok, "\n".join(lines) + "\n" + summary
    assert report.kills_with_runs_in_flight >= 3, summary
    assert len(report.runs) >= 12 and report.by_status()["running"] == 0, summary
    for run_id, status in report.runs.items():
        assert status["status"] in ("completed", "failed"), (run_id, status)
        if status["status"] == "failed":
            assert status["error"], (run_id, status)
    # The provider's own store agrees: at most one email and one ticket per run, and all of
    # them for every completed run (a failed run may have sent its email and stopped).
    completed = report.by_status()["completed"]
    assert completed <= report.emails <= len(report.runs), summary
    assert completed <= report.tickets <= len(report.runs), summary
    assert report.effects_applied == report.emails + report.tickets, summary
