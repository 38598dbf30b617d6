"""The flow as data: each step's name, its function (``steps.flow``), how its
request is built (``steps.requests``) and whether it has an external effect.

The engines that drive the steps themselves walk this list: the run record
(``runrecord.runner``, as its ``DEFAULT_FLOW``) and DBOS (``dbosflow.engine``).
The Temporal workflow spells the same sequence in workflow code
(``workflows.agent_flow``) with the same functions and builders.

The flow is a plain tuple, injectable into ``runrecord.runner.Runner``, so a
test can hand it a changed one and see the change caught on resume.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from steps import flow as step_functions
from steps.models import STEP_NAMES
from steps.requests import RequestBuilder, draft_request, record_request, send_request


@dataclass(frozen=True)
class FlowStep:
    """One step: its name (recorded per position), function and request.

    ``effect``: the step sends a keyed request to the provider, so each attempt
    records an intent (key and request) before it can be sent.
    """

    name: str
    run: Callable[[Any, Any], Awaitable[Any]]
    request: RequestBuilder
    effect: bool


FLOW: tuple[FlowStep, ...] = (
    FlowStep("draft", step_functions.draft, draft_request, effect=False),
    FlowStep("send_confirmation", step_functions.send_confirmation, send_request, effect=True),
    FlowStep("record_outcome", step_functions.record_outcome, record_request, effect=True),
)
assert tuple(s.name for s in FLOW) == STEP_NAMES, "the engines must drive the same flow as Temporal"
