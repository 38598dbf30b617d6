"""A small chaos run (lab/chaos.py) in the suite: 12 concurrent runs, workers
SIGKILLed 3 times while runs are in flight, two workers part of the time,
the provider failing and losing responses; once with the deterministic
model, once with one that varies every answer. Every run completes; no
duplicate and no lost effect."""

from __future__ import annotations

import pytest

from lab.chaos import ChaosConfig, run_chaos


@pytest.mark.parametrize("vary", [False, True], ids=["deterministic", "varying"])
async def test_small_chaos_run_loses_and_duplicates_nothing(dev_server, tmp_path, vary):
    lines: list[str] = []
    config = ChaosConfig(runs=12, kills=3, seed=7, max_seconds=150, pace=1.0, vary=vary,
                         temporal_address=dev_server.address, workdir=tmp_path, say=lines.append)
    report = await run_chaos(config)
    summary = report.summary()
    print(summary)
    assert report.ok, "\n".join(lines) + "\n" + summary
    assert report.kills_with_runs_in_flight >= 3, summary
    assert len(report.runs) >= 12 and report.by_status()["running"] == 0, summary
    assert report.by_status()["completed"] == len(report.runs), summary
    # The provider's own store agrees: exactly one email and one ticket per run.
    assert report.emails == report.tickets == len(report.runs), summary
    assert report.effects_applied == report.emails + report.tickets, summary
