"""The agent flow's input and status types, shared by the workflow and its clients.

Kept out of workflows/agent_flow.py on purpose: the worker runs with no
workflow cache, so the sandbox executes the workflow's module for every
workflow task, while this module is imported once and passed through.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class FlowInput:
    run_id: str
    task: str
    email: str
    conversation_id: str = ""
    timeouts: str = "tuned"  # "tuned" | "defaults" (benchmark only)


@dataclass
class StepState:
    name: str
    status: str = "pending"  # pending | running | completed | failed
    attempts: int = 0
    result: Any = None


@dataclass
class RunStatus:
    """The shape ``starter.py status --json`` prints, from the workflow itself."""

    run_id: str
    status: str  # running | completed | failed
    current_step: str | None
    steps: list[StepState] = field(default_factory=list)
    error: str | None = None
