"""The agent flow's input and status types, shared by the workflow and its clients.

Kept out of durable_agents/workflows/agent_flow.py on purpose: the sandbox executes the
workflow's module whenever a worker builds a run afresh (after a restart or
an eviction; for every workflow task with ``worker.py --cache 0``), while
this module is imported once and passed through.

The status vocabulary (what ``status`` and the fields mean) is defined once,
in ``durable_agents.steps.runstate``; these dataclasses are the typed form of that shape
that the workflow returns and answers its ``progress`` query with. They are
built from ``run_entry`` (``RunStatus.from_entry``), so a field added there
and not here fails at once instead of drifting.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

# At run time, not only for mypy: the SDK reads these annotations when a typed handle decodes a RunStatus.
from durable_agents.steps.runstate import RunEntry, RunStateName, StepEntry, StepStateName, step_entry


@dataclass
class FlowInput:
    run_id: str
    task: str
    email: str
    conversation_id: str = ""
    # Compatibility only: inputs recorded with "tuned" or "defaults" (the resume
    # benchmark's, before its timeouts became a subclass, bench/defaults_flow.py)
    # must decode and replay as they ran, and the frozen path
    # (durable_agents.workflows.before_live) picks its timeouts by it. New runs leave it at
    # "tuned"; the live path checks it and otherwise ignores it (its timeouts
    # are AgentFlow.attempt_timeouts).
    timeouts: str = "tuned"
    # The retry rule the run records (durable_agents.steps.retry.RetryRule.to_dict()); the
    # starter fills it from the environment. None: the code's defaults.
    retry: dict[str, Any] | None = None


@dataclass
class StepState:
    name: str
    status: StepStateName = "pending"
    attempts: int = 0
    # A step's JSON result (durable_agents.steps.runstate.JsonValue), annotated Any: the SDK's converter reads this
    # annotation when a typed handle decodes a RunStatus, and cannot decode a recursive alias.
    result: Any = None
    crashes: int = 0
    last_error: str | None = None
    next_try_at: str | None = None
    note: str | None = None

    def entry(self) -> StepEntry:
        """This step in the shared shape, through ``step_entry`` (which refuses a status not in the vocabulary);
        a field with no parameter there is a TypeError."""
        return step_entry(**asdict(self))


@dataclass
class RunStatus:
    """The shape ``starter.py status --json`` prints, from the workflow itself."""

    run_id: str
    status: RunStateName
    current_step: str | None
    steps: list[StepState] = field(default_factory=list)
    error: str | None = None
    detail: str | None = None

    @classmethod
    def from_entry(cls, entry: RunEntry) -> RunStatus:
        """From ``durable_agents.steps.runstate.run_entry``'s dict (its steps ``step_entry``'s); a key with no field
        here is a TypeError (mypy catches one in a step)."""
        made = cls(run_id=entry["run_id"], status=entry["status"], current_step=entry["current_step"],
                   steps=[StepState(**step) for step in entry["steps"]], error=entry["error"], detail=entry["detail"])
        missing = entry.keys() - vars(made).keys()
        if missing:
            raise TypeError(f"RunStatus has no field for {', '.join(sorted(missing))}: "
                            "add it (durable_agents.workflows.state)")
        return made
