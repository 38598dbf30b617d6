"""Runs in flight send what they would have sent: replaying each committed
history (tests/data/histories/<commit>/) under the current workflow code, the
activities it schedules carry the same inputs as the ones the history
recorded, field for field.

Temporal's replay checks commands (an activity of this type, this id), not
inputs, so a change to how a request is built (``durable_agents.steps.requests``: a key, the
start id, the memory cut-off, the remembered reply) would pass
tests/test_replay_fixtures.py and still make a resumed run send a different
email than its first attempt; for the agent loop, a change to a turn's window
or a call's key would ask a recorded turn with another prompt or send a call
under another key. A field added later with its default value is
absent from older recordings and is not a difference."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import WorkflowHistory
from temporalio.converter import DataConverter
from temporalio.worker import (
    Interceptor,
    Replayer,
    StartActivityInput,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
    WorkflowOutboundInterceptor,
)

from durable_agents.flowclient.worker_options import worker_options
from durable_agents.payloadcodec import data_converter_from_env
from durable_agents.workflows.agent_flow import AgentFlow
from durable_agents.workflows.agent_loop import AgentLoop
from tests.record_histories import FIXTURE_KEY, FIXTURE_KEY_ID, fixture_workflow_id

HISTORIES = Path(__file__).parent / "data" / "histories"
FIXTURES = sorted(HISTORIES.glob("*/*.json"))


class _Scheduled(Interceptor):
    """Keeps (activity type, arguments) of every activity the workflow schedules."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, list[Any]]] = []

    def workflow_interceptor_class(self, input: WorkflowInterceptorClassInput) -> type[WorkflowInboundInterceptor]:
        seen = self.seen

        class Outbound(WorkflowOutboundInterceptor):
            def start_activity(self, input: StartActivityInput):
                seen.append((input.activity, list(input.args)))
                return super().start_activity(input)

        class Inbound(WorkflowInboundInterceptor):
            def init(self, outbound: WorkflowOutboundInterceptor) -> None:
                super().init(Outbound(outbound))

        return Inbound


def _without_unrecorded_defaults(ours: Any, recorded: Any) -> Any:
    if isinstance(ours, dict) and isinstance(recorded, dict):
        return {k: _without_unrecorded_defaults(v, recorded.get(k)) for k, v in ours.items()
                if k in recorded or v not in (None, "")}
    return ours


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: f"{p.parent.name}/{p.stem}")
async def test_replay_schedules_the_recorded_activity_inputs(path: Path):
    recorded_json = json.loads(path.read_text())
    history = WorkflowHistory.from_json(fixture_workflow_id(path, recorded_json), recorded_json)
    env = {"LAB_CODEC_KEY": FIXTURE_KEY, "LAB_CODEC_KEY_ID": FIXTURE_KEY_ID} if "encrypted" in path.stem else {}
    converter = data_converter_from_env(env)
    scheduled = _Scheduled()
    await Replayer(workflows=[AgentFlow, AgentLoop], workflow_runner=worker_options()["workflow_runner"],
                   data_converter=converter, interceptors=[scheduled]).replay_workflow(history)

    recorded = []
    for event in history.events:
        if event.HasField("activity_task_scheduled_event_attributes"):
            attributes = event.activity_task_scheduled_event_attributes
            payloads = list(attributes.input.payloads)
            if converter.payload_codec is not None:
                payloads = await converter.payload_codec.decode(payloads)
            recorded.append((attributes.activity_type.name, [json.loads(p.data) for p in payloads]))
    assert recorded, f"{path} schedules no activity"
    plain = DataConverter.default.payload_converter
    ours = [(name, [json.loads(p.data) for p in plain.to_payloads(args)]) for name, args in scheduled.seen]
    assert len(ours) >= len(recorded), f"replay scheduled {len(ours)} activities; the history has {len(recorded)}"
    for i, ((name, values), (recorded_name, recorded_values)) in enumerate(zip(ours, recorded, strict=False)):
        assert name == recorded_name, f"activity {i}: {name}, recorded {recorded_name}"
        shown = [_without_unrecorded_defaults(v, r) for v, r in zip(values, recorded_values, strict=True)]
        assert shown == recorded_values, f"activity {i} ({name}) input differs from the recorded one"
