"""Runs in flight survive every change: histories recorded by earlier mains
(tests/data/histories/<commit>/, made by tests/record_histories.py; never
regenerated) replay under the current workflow code, with the worker's own
sandbox runner and, for the encrypted ones, the codec.

A replay that fails here is what a worker upgrade would do to those runs:
a non-determinism error parks them (or, for a closed run, breaks queries
and resets of it)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer

from flowclient.worker_options import worker_options
from payloadcodec import data_converter_from_env
from tests.record_histories import FIXTURE_KEY, FIXTURE_KEY_ID, fixture_workflow_id
from workflows.agent_flow import AgentFlow

HISTORIES = Path(__file__).parent / "data" / "histories"
FIXTURES = sorted(HISTORIES.glob("*/*.json"))


def test_there_are_fixtures_to_replay():
    assert len(FIXTURES) >= 7, f"expected the recorded histories under {HISTORIES}"


def test_fixtures_hold_no_machine_path():
    """Stack traces name files relative to the project or to site-packages, never where
    the recording machine kept them (tests/record_histories.py cuts them when it writes)."""
    found = {p.relative_to(HISTORIES).as_posix(): re.findall(r'File \\?"(/[^"\\]*)', p.read_text())
             for p in FIXTURES}
    assert not {name: paths for name, paths in found.items() if paths}, found


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: f"{p.parent.name}/{p.stem}")
async def test_recorded_history_replays_under_the_current_code(path: Path):
    # Replay decodes in the workflow's context, and the codec checks bound payloads against its id.
    recorded = json.loads(path.read_text())
    history = WorkflowHistory.from_json(fixture_workflow_id(path, recorded), recorded)
    env = {"LAB_CODEC_KEY": FIXTURE_KEY, "LAB_CODEC_KEY_ID": FIXTURE_KEY_ID} if "encrypted" in path.stem else {}
    replayer = Replayer(
        workflows=[AgentFlow],
        workflow_runner=worker_options()["workflow_runner"],
        data_converter=data_converter_from_env(env),
    )
    await replayer.replay_workflow(history)
