"""The flow's shape, written once: its steps in order, each with its name
(recorded per position), its function (``steps.flow``), how its request is
built (``steps.requests``), whether it has an external effect, and the crash
points its function reaches (``steps.crashpoints``).

Everything else that names the steps reads them from here:

- ``STEP_NAMES`` and ``EFFECT_STEPS``, for whoever lists, counts or settles
  steps: the status views, ``settle``, the lab's tools, the lesson;
- the crash points every engine reaches (``step_points`` and
  ``engine_points`` below, given ``FLOW`` or a changed flow); the mechanism
  that arms and reaches them is ``steps.crashpoints``, which the step
  functions import and which imports nothing back;
- the engines that drive the steps themselves walk ``FLOW``: the run record
  (``runrecord.runner``, as its ``DEFAULT_FLOW``), DBOS (``dbosflow.engine``)
  and the in-memory "before" (``lesson.in_memory``);
- the Temporal workflow (``workflows.agent_flow``) spells the same calls in
  workflow code, since each run's history records them by name and position:
  a step added here reaches Temporal only by a versioned change there
  (``workflow.patched``). It takes each step's position and effect flag from
  here, and ``tests/test_workflow_bounds.py`` checks that it calls this
  plan's steps in this plan's order.

The flow is a plain tuple, injectable into ``runrecord.runner.Runner``, so a
test can hand it a changed one and see the change caught on resume.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from steps import flow as step_functions
from steps.requests import RequestBuilder, draft_request, record_request, send_request


@dataclass(frozen=True)
class FlowStep:
    """One step: its name (recorded per position), function and request.

    ``effect``: the step sends a keyed request to the provider, so each attempt
    records an intent (key and request) before it can be sent.
    ``crash_points``: where its function may be killed (``crash_point("<name>:<point>")``
    in ``steps.flow``), in the order it reaches them.
    """

    name: str
    run: Callable[[Any, Any], Awaitable[Any]]
    request: RequestBuilder
    effect: bool
    crash_points: tuple[str, ...] = ()


FLOW: tuple[FlowStep, ...] = (
    FlowStep("draft", step_functions.draft, draft_request, effect=False,
             crash_points=("before", "during_llm")),
    FlowStep("send_confirmation", step_functions.send_confirmation, send_request, effect=True,
             crash_points=("before", "after_effect")),
    FlowStep("record_outcome", step_functions.record_outcome, record_request, effect=True,
             crash_points=("before", "after_effect")),
)

STEP_NAMES: tuple[str, ...] = tuple(step.name for step in FLOW)
"""The flow, in order. Every engine checks a run against it on resume."""

EFFECT_STEPS: tuple[str, ...] = tuple(step.name for step in FLOW if step.effect)
"""The steps with an external effect, each sent under its idempotency key (``steps.keys``)."""


def step_points(flow: Iterable[FlowStep]) -> tuple[str, ...]:
    """The crash points the step functions of ``flow`` reach, on every engine, in flow order."""
    return tuple(f"{step.name}:{point}" for step in flow for point in step.crash_points)


def engine_points(flow: Iterable[FlowStep]) -> dict[str, tuple[str, ...]]:
    """Each engine's own crash points for ``flow``, in flow order, named as the engine's code names them
    (``workflows.agent_flow``, ``runrecord.runner``, ``dbosflow.engine``; ``steps.crashpoints`` lists them)."""
    steps = tuple(flow)
    return {
        "temporal": tuple(f"temporal:{s.name}:after_record" for s in steps),
        "runrecord": tuple(point for s in steps for point in (
            f"runrecord:{s.name}:{'after_intent' if s.effect else 'after_start'}",
            f"runrecord:{s.name}:after_record",
        )),
        "dbos": tuple(f"dbos:{s.name}:after_record" for s in steps),
    }
