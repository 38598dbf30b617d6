"""Runs in flight survive every change: histories recorded by earlier mains
(tests/data/histories/<commit>/, made by tests/record_histories.py; never
regenerated) replay under the current workflow code, with the worker's own
sandbox runner and, for the encrypted ones, the codec. Both workflows the
worker runs are given to the replayer, as to the worker: a history of the
agent flow (``AgentFlow``) or of the agent loop (``AgentLoop``, the
``loop-...`` fixtures) replays under the code of its type.

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

from durable_agents.flowclient.worker_options import worker_options
from durable_agents.payloadcodec import data_converter_from_env
from durable_agents.workflows.agent_flow import AgentFlow
from durable_agents.workflows.agent_loop import AgentLoop
from tests.record_histories import FIXTURE_KEY, FIXTURE_KEY_ID, fixture_workflow_id

HISTORIES = Path(__file__).parent / "data" / "histories"
FIXTURES = sorted(HISTORIES.glob("*/*.json"))
WORKFLOWS = [AgentFlow, AgentLoop]
LOOP_SCENARIOS = {"loop-completed", "loop-in-flight", "loop-continued-1", "loop-continued-2", "loop-retried",
                  "loop-turn-limit"}
"""The agent loop's scenarios every recording since the loop holds (tests/record_histories.py)."""


def _workflow_type(path: Path) -> str:
    return json.loads(path.read_text())["events"][0]["workflowExecutionStartedEventAttributes"]["workflowType"]["name"]


def test_there_are_fixtures_to_replay():
    assert len(FIXTURES) >= 7, f"expected the recorded histories under {HISTORIES}"


def test_both_workflows_have_fixtures_and_the_replayer_knows_their_types():
    """Every fixture's workflow type is one the replayer is given, and each workflow the worker runs has
    fixtures: the loop's scenarios are all in at least one recording."""
    types = {p.relative_to(HISTORIES).as_posix(): _workflow_type(p) for p in FIXTURES}
    known = {getattr(w, "__temporal_workflow_definition").name for w in WORKFLOWS}  # what @workflow.defn names
    assert set(types.values()) == known, types
    recordings: dict[str, set[str]] = {}
    for p in FIXTURES:
        recordings.setdefault(p.parent.name, set()).add(p.stem)
    assert any(LOOP_SCENARIOS <= stems for stems in recordings.values()), recordings
    assert all(types[name] == "AgentLoop" for name in types if name.split("/")[1].startswith("loop-")), types


def test_a_reset_loop_run_and_a_parked_one_are_among_the_fixtures():
    """Issue 41's two: a loop run reset (its turns read back from the base and reused) and one parked by a bad
    deploy, then mended; each replays in the test below. The parked one's history holds the failed task."""
    by_stem = {p.stem: p for p in FIXTURES}
    assert {"loop-reset-second", "loop-parked"} <= set(by_stem), sorted(by_stem)
    events = json.loads(by_stem["loop-parked"].read_text())["events"]
    failed = [e["workflowTaskFailedEventAttributes"] for e in events if "workflowTaskFailedEventAttributes" in e]
    assert [f["cause"] for f in failed] == ["WORKFLOW_TASK_FAILED_CAUSE_WORKFLOW_WORKER_UNHANDLED_FAILURE"], failed
    assert events[-1]["eventType"] == "EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED", events[-1]


def test_the_loop_before_agents_had_names_has_every_scenario_recorded():
    """Issue 43's change to the loop (aa53186: a run names its agent, its parameters and version) came after
    6cf34ba, whose loop histories are all here, the reset and the parked one too: they replay in the test
    below (tests/test_loop_upgrade.py finishes that code's runs with today's workers)."""
    stems = {p.stem for p in FIXTURES if p.parent.name == "6cf34ba04e8f"}
    assert LOOP_SCENARIOS | {"loop-reset-second", "loop-parked"} <= stems, sorted(stems)


def test_fixtures_hold_no_machine_path():
    """Stack traces name files relative to the project or to site-packages, never where
    the recording machine kept them (tests/record_histories.py cuts them when it writes);
    and no fixture names a home, work or temporary directory anywhere else either (a
    loop's prompts and tool results are recorded whole). The loop's fixtures are checked
    like the flow's."""
    found = {p.relative_to(HISTORIES).as_posix(): re.findall(r'File \\?"(/[^"\\]*)', p.read_text())
             for p in FIXTURES}
    assert not {name: paths for name, paths in found.items() if paths}, found
    elsewhere = {p.relative_to(HISTORIES).as_posix(): re.findall(r"/(?:home|Users|root|tmp|work|private|var)/[^\s\"']*",
                                                                 p.read_text()) for p in FIXTURES}
    assert not {name: paths for name, paths in elsewhere.items() if paths}, elsewhere
    assert any(name.split("/")[1].startswith("loop-") for name in found), "no loop fixture was checked"


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: f"{p.parent.name}/{p.stem}")
async def test_recorded_history_replays_under_the_current_code(path: Path):
    # Replay decodes in the workflow's context, and the codec checks bound payloads against its id.
    recorded = json.loads(path.read_text())
    history = WorkflowHistory.from_json(fixture_workflow_id(path, recorded), recorded)
    env = {"LAB_CODEC_KEY": FIXTURE_KEY, "LAB_CODEC_KEY_ID": FIXTURE_KEY_ID} if "encrypted" in path.stem else {}
    replayer = Replayer(
        workflows=WORKFLOWS,
        workflow_runner=worker_options()["workflow_runner"],
        data_converter=data_converter_from_env(env),
    )
    await replayer.replay_workflow(history)
