"""The shapes every engine and the lesson share (``durable_agents.steps.runstate``, ``durable_agents.steps.sides``,
``timeline.model``) are typed, and the types hold: a misspelt status is a mypy error where it is written and a
ValueError where it arrives another way; the entries print their keys in the documented order; the Temporal workflow's
dataclasses keep every key of the entries and still decode through the SDK's converter (a typed handle's
``result()``); a lane's verdict is composed from its parts, never split apart; and mypy refuses an explicit
``Any`` in the modules that hold the shapes."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from dataclasses import fields, replace
from typing import get_type_hints

import pytest
from temporalio.converter import default

from durable_agents.steps.runstate import (
    RUN_STATES,
    STEP_STATES,
    RunEntry,
    StepEntry,
    run_entry,
    run_state,
    step_entry,
    step_state,
)
from durable_agents.workflows.state import RunStatus, StepState
from lab.processes import REPO
from timeline.model import Effect, Verdict


def test_a_misspelt_status_is_refused_with_the_words_there_are() -> None:
    with pytest.raises(ValueError) as step:
        step_entry("send_confirmation", "in-doubt")  # type: ignore[arg-type]
    assert "'send_confirmation'" in str(step.value) and "'in-doubt'" in str(step.value)
    assert all(word in str(step.value) for word in STEP_STATES), step.value
    with pytest.raises(ValueError) as run:
        run_entry("r-1", "complete", [])  # type: ignore[arg-type]
    assert "'complete'" in str(run.value) and all(word in str(run.value) for word in RUN_STATES), run.value
    # A word read from a store goes through the same check.
    assert step_state("in_doubt") == "in_doubt" and run_state("parked") == "parked"
    with pytest.raises(ValueError, match="'done' is not a run status"):
        run_state("done")


@pytest.mark.process
def test_mypy_catches_a_misspelt_status_where_it_is_written(tmp_path):
    (tmp_path / "caller.py").write_text(
        "from durable_agents.steps.runstate import run_entry, step_entry\n"
        "ok = run_entry('r', 'completed', [step_entry('draft', 'completed', 1, {'subject': 's'})])\n"
        "bad = run_entry('r', 'complete', [step_entry('draft', 'in-doubt')])\n"
    )
    done = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental", "--follow-imports=silent",
                           str(tmp_path / "caller.py")], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={"MYPYPATH": str(REPO), "PATH": ""})
    found = [line for line in done.stdout.splitlines() if ": error:" in line]
    assert [line.split(":")[1] for line in found] == ["3", "3"], done.stdout + done.stderr
    assert "'complete'" in found[0] + found[1] and "'in-doubt'" in found[0] + found[1], found


def test_the_entries_print_their_keys_in_the_documented_order():
    entry = run_entry("r-1", "running", [step_entry("draft", "completed", 1, {"subject": "s"}),
                                         step_entry("send_confirmation")])
    assert list(entry) == list(RunEntry.__annotations__) == [
        "run_id", "status", "current_step", "steps", "error", "detail"]
    assert list(entry["steps"][0]) == list(StepEntry.__annotations__) == [
        "name", "status", "attempts", "result", "crashes", "last_error", "next_try_at", "note"]
    assert entry["current_step"] == "send_confirmation"


def test_the_workflows_dataclasses_keep_every_key_and_decode_through_the_sdk() -> None:
    """What the workflow returns and its ``progress`` query answers: the entries' keys, field for field, and a
    payload the SDK's converter decodes back into the dataclass (a typed handle's ``result()`` does that)."""
    assert [f.name for f in fields(StepState)] == list(StepEntry.__annotations__)
    assert [f.name for f in fields(RunStatus)] == list(RunEntry.__annotations__)
    entry = run_entry("r-1", "completed", [
        step_entry("draft", "completed", 1, {"subject": "s", "context_messages": 2, "nested": [1, {"a": None}]}),
        step_entry("send_confirmation", "adopted", 2, {"message_id": "m", "adopted": {"reason": "x"}}, crashes=1,
                   note="x"),
    ])
    status = RunStatus.from_entry(entry)
    converter = default().payload_converter
    payloads = converter.to_payloads([status])
    assert json.loads(payloads[0].data) == entry
    assert converter.from_payloads(payloads, [RunStatus]) == [status]
    assert status.steps[0].entry() == entry["steps"][0]
    with pytest.raises(TypeError, match="no field for extra"):
        RunStatus.from_entry({**entry, "extra": 1})  # type: ignore[typeddict-unknown-key]
    # The annotations resolve at run time (the SDK reads them), the statuses as the vocabulary's words.
    hints = get_type_hints(StepState)
    assert set(hints["status"].__args__) == set(STEP_STATES)


def test_a_verdict_is_composed_from_parts_and_one_part_replaced():
    effects = [Effect("k2", "ticket", 1, 1, 5.0, 5.0), Effect("k1", "email", 2, 1, 1.0, 3.0),
               Effect("k3", "email", 1, 1, 2.0, 2.0)]
    verdict = Verdict.of("completed", effects)
    assert verdict.applied == (("email", 2), ("ticket", 1))
    assert str(verdict) == "completed; the provider applied 2 emails, 1 ticket"
    resumed = replace(verdict, where="resumed at step 3 record_outcome")
    assert str(resumed) == "resumed at step 3 record_outcome; the provider applied 2 emails, 1 ticket"
    assert str(Verdict.of("failed", [])) == "failed" and str(Verdict()) == ""


@pytest.mark.process
def test_mypy_allows_no_explicit_any_in_the_shape_modules(tmp_path):
    """The per-module override is there, and works: a shape module given an ``Any`` is a mypy error."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["mypy"]
    strict = [o for o in config["overrides"] if o.get("disallow_any_explicit")]
    assert len(strict) == 1
    assert {"durable_agents.steps.runstate", "durable_agents.steps.sides", "timeline.model"} <= set(strict[0]["module"])
    package = tmp_path / "durable_agents" / "steps"
    package.mkdir(parents=True)
    (package.parent / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "sides.py").write_text("from typing import Any\nX: dict[str, Any] = {}\n")
    (tmp_path / "pyproject.toml").write_text(
        "[tool.mypy]\n[[tool.mypy.overrides]]\n"
        f"module = {json.dumps(strict[0]['module'])}\ndisallow_any_explicit = true\n")
    done = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental", "durable_agents/steps/sides.py"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert 'Explicit "Any" is not allowed' in done.stdout, done.stdout + done.stderr
