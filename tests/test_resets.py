"""Resets as an operator does them (``temporal workflow reset``, lab/resets.py),
on completed and failed runs, to each workflow task, with the deterministic
model and with one that words every answer differently: every reset run
completes, each effect applied once, and a re-run step with a different
request adopts what its run had applied instead of failing on the 409."""

from __future__ import annotations

import pytest

from lab.resets import matrix, ok

pytestmark = pytest.mark.process


async def test_every_reset_completes_with_each_effect_once():
    rows = await matrix(say=lambda line: None)
    table = {(r["model"], r["run"], r["reset to"]): (r["draft"], r["send_confirmation"], r["record_outcome"])
             for r in rows}
    assert ok(rows), rows
    # The deterministic model re-drafts the same words (the prompt is cut at the
    # run's start), so the re-sent email is the same request: a replay.
    assert table["deterministic", "completed", "first"] == ("re-run", "replayed", "replayed")
    # A model that writes differently: the provider's 409 is adopted, not a failure.
    assert table["varying", "completed", "first"] == ("re-run", "adopted", "adopted")
    assert table["deterministic", "completed", "after draft"] == ("kept", "replayed", "replayed")
    assert table["deterministic", "completed", "after send"] == ("kept", "kept", "replayed")
    assert all(cells == ("kept", "kept", "kept") for (m, run, point), cells in table.items()
               if point == "last" and run == "completed")
    # Failed runs (ticket API down past their budget), reset once the API is back: the ticket is made once.
    assert table["varying", "failed", "first"] == ("re-run", "adopted", "applied")
    assert table["deterministic", "failed", "first"] == ("re-run", "replayed", "applied")
    assert table["deterministic", "failed", "after send"] == ("kept", "kept", "applied")
    # Even reset to its last task, a failed run tries its failed step again: a reset starts the budget afresh.
    assert table["deterministic", "failed", "last"] == ("kept", "kept", "applied")
