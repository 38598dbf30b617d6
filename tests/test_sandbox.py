"""The sandbox refuses non-determinism in workflow code, in the worker as
shipped: a probe workflow, loaded by the same module rules as the shipped
one, tries each forbidden call on worker.py's own workflow runner."""

from __future__ import annotations

import uuid

import pytest
from temporalio.worker import Worker

from durable_agents.flowclient.worker_options import worker_options
from tests.probe.nondeterminism import CALLS, NondeterminismProbe


@pytest.mark.parametrize("options", [{}, {"cache": 10}], ids=["no cache", "cache"])
async def test_each_nondeterministic_call_is_refused_on_the_shipped_runner(client, options):
    queue = f"probe-{uuid.uuid4().hex[:8]}"
    runner = worker_options(**options)["workflow_runner"]
    async with Worker(client, task_queue=queue, workflows=[NondeterminismProbe], workflow_runner=runner):
        for name in CALLS:
            answer = await client.execute_workflow(
                NondeterminismProbe.run, name, id=f"probe-{uuid.uuid4().hex[:8]}", task_queue=queue
            )
            assert answer.startswith("RestrictedWorkflowAccessError"), f"{name} was not refused: {answer}"


def test_the_workflow_module_is_not_passed_through():
    restrictions = worker_options()["workflow_runner"].restrictions
    assert not restrictions.passthrough_all_modules
    assert not any(m in ("durable_agents", "durable_agents.workflows")
                   or m.startswith("durable_agents.workflows.agent_flow")
                   for m in restrictions.passthrough_modules)
