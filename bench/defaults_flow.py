"""The agent flow with Temporal's default activity timeouts, for
bench/bench_resume.py's "defaults" mode only: no heartbeat timeout, so a
killed worker's attempt is noticed only when its 10 s start-to-close timeout
runs out. Everything else is ``durable_agents.workflows.agent_flow.AgentFlow``, whose
``attempt_timeouts`` hook this overrides.

Registered under the same workflow name by bench/defaults_worker.py, on the
benchmark's own task queue; never by worker.py. A module of its own (not the
worker script) because the sandbox imports a workflow's module by name.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow

from durable_agents.workflows.agent_flow import WORKFLOW_NAME, AgentFlow

with workflow.unsafe.imports_passed_through():
    from durable_agents.steps.retry import RetryRule
    from durable_agents.workflows.state import FlowInput, RunStatus

DEFAULTS_ATTEMPT_TIMEOUT = timedelta(seconds=10)
"""The benchmark's stand-in for Temporal's defaults: with no heartbeat timeout,
this start-to-close timeout is what notices a dead worker."""


@workflow.defn(name=WORKFLOW_NAME)
class DefaultsFlow(AgentFlow):
    @workflow.run
    async def run(self, inp: FlowInput) -> RunStatus:  # the SDK wants @workflow.run on the class itself
        return await super().run(inp)

    def attempt_timeouts(self, step: str, rule: RetryRule) -> tuple[timedelta, timedelta | None]:
        return DEFAULTS_ATTEMPT_TIMEOUT, None
