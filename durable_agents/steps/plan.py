"""The flow's shape, written once: its steps in order, each with its name
(recorded per position), its function (``durable_agents.steps.flow``), how its request is
built (``durable_agents.steps.requests``), the kind of external effect it has, if any (the
provider's kind: ``email``, ``ticket``, ``refund``), and the crash points its
function reaches (``durable_agents.steps.crashpoints``).

Everything else that names the steps or their effects reads them from here:

- ``STEP_NAMES``, ``EFFECT_STEPS`` and ``KIND_OF_STEP`` (and, for a flow
  given as a parameter, ``effect_steps``, ``kind_of_step``,
  ``effect_kinds``), for whoever lists, counts, draws or settles steps: the
  status views, ``settle``, the effects table (``lesson.effects``), the
  timeline's lanes (``lesson.lanes``), chaos (``lab.chaos``), the grader;
- the crash points every engine's step functions reach (``step_points``
  below, given ``FLOW`` or a changed flow; an engine's own points are its
  registration's, ``durable_agents.steps.engine_row.Engine.crash_points``); the mechanism
  that arms and reaches them is ``durable_agents.steps.crashpoints``, which the step
  functions import and which imports nothing back;
- the engines that drive the steps themselves walk ``FLOW``, given as a
  parameter; an engine whose history records each call by name and position
  spells the same calls in its own code, and a step added here reaches it
  only by a versioned change there (the engine's package says how).

The flow is a plain tuple, a parameter of the engines that walk it (the
lab's ``FLOW`` by default). Their commands take it from ``LAB_FLOW``
(``module:NAME``, ``flow_from_env``), so a flow that exists only in a test
runs on the real processes, and a test can hand an engine a changed flow and
see the change caught on resume: the run record checks the recorded step
names; DBOS runs a flow under an application version derived from it
(``plan_digest``).
"""

from __future__ import annotations

import hashlib
import importlib
import os
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from durable_agents.steps import flow as step_functions
from durable_agents.steps.requests import RequestBuilder, draft_request, record_request, send_request

NAME = re.compile(r"[a-z][a-z0-9_]{0,39}")
"""A step's name and an effect's kind: they go into idempotency keys, crash points and log lines."""


@dataclass(frozen=True)
class FlowStep:
    """One step: its name (recorded per position), function and request.

    ``kind``: the kind of external effect the step has, as the provider names
    it (``email``, ``ticket``, ``refund``), or None for a step without one. A
    step with a kind sends a keyed request to the provider, so each attempt
    records an intent (key and request) before it can be sent; the provider
    counts its effects under that kind.
    ``crash_points``: where its function may be killed (``crash_point("<name>:<point>")``
    in ``durable_agents.steps.flow``), in the order it reaches them.
    ``params``: the run's parameters its request builder reads (``durable_agents.steps.params``: a refund's
    ``amount``), which every engine requires when a run of the flow starts (``missing_params``).
    """

    name: str
    run: Callable[[Any, Any], Awaitable[Any]]
    request: RequestBuilder
    kind: str | None = None
    crash_points: tuple[str, ...] = ()
    params: tuple[str, ...] = ()

    @property
    def effect(self) -> bool:
        """The step has an external effect (its ``kind``)."""
        return self.kind is not None


FLOW: tuple[FlowStep, ...] = (
    FlowStep("draft", step_functions.draft, draft_request,
             crash_points=("before", "during_llm")),
    FlowStep("send_confirmation", step_functions.send_confirmation, send_request, kind="email",
             crash_points=("before", "after_effect")),
    FlowStep("record_outcome", step_functions.record_outcome, record_request, kind="ticket",
             crash_points=("before", "after_effect")),
)


def effect_steps(flow: Iterable[FlowStep]) -> tuple[str, ...]:
    """The steps of ``flow`` with an external effect, in order."""
    return tuple(step.name for step in flow if step.kind is not None)


def kind_of_step(flow: Iterable[FlowStep]) -> dict[str, str]:
    """Each effect step of ``flow`` and the kind of its effect, in flow order."""
    return {step.name: step.kind for step in flow if step.kind is not None}


def effect_kinds(flow: Iterable[FlowStep]) -> tuple[str, ...]:
    """The kinds of effect ``flow`` has, each once, in the order its steps first have them."""
    return tuple(dict.fromkeys(kind_of_step(flow).values()))


def missing_params(flow: Iterable[FlowStep], params: Mapping[str, object]) -> str | None:
    """What a run of ``flow`` lacks among the parameters its steps read (``FlowStep.params``), said the way
    a command is given them; None when it has them all. Every engine asks before it starts a run."""
    missing = {name: step.name for step in flow for name in step.params if name not in params}
    if not missing:
        return None
    wanted = ", ".join(f"{name} (step {step})" for name, step in missing.items())
    example = " ".join(f"--param {name}=VALUE" for name in missing)
    return f"this flow's steps need the run's parameters {wanted}: give them when the run starts ({example})"


def plan_signature(flow: Iterable[FlowStep]) -> tuple[str, ...]:
    """What identifies a flow's shape to a run in flight: each step's name, and its kind after a colon
    (``send_confirmation:email``). Recorded with a DBOS run; the run record records the names."""
    return tuple(step.name + (f":{step.kind}" if step.kind else "") for step in flow)


def plan_digest(flow: Iterable[FlowStep]) -> str:
    """A short hash of ``plan_signature``: another flow, another digest (DBOS's application version)."""
    return hashlib.sha256("\n".join(plan_signature(flow)).encode()).hexdigest()[:10]


STEP_NAMES: tuple[str, ...] = tuple(step.name for step in FLOW)
"""The flow, in order. Every engine checks a run against it on resume."""

EFFECT_STEPS: tuple[str, ...] = effect_steps(FLOW)
"""The steps with an external effect, each sent under its idempotency key (``durable_agents.steps.keys``)."""

KIND_OF_STEP: dict[str, str] = kind_of_step(FLOW)
"""Each effect step of the lab's flow and its kind: the one step-to-kind map; everything else derives it."""


def step_points(flow: Iterable[FlowStep]) -> tuple[str, ...]:
    """The crash points the step functions of ``flow`` reach, on every engine, in flow order."""
    return tuple(f"{step.name}:{point}" for step in flow for point in step.crash_points)


FLOW_ENV = "LAB_FLOW"


def check_flow_shape(flow: Iterable[FlowStep], source: str = "the flow") -> tuple[FlowStep, ...]:
    """``flow`` as a tuple, once it is one an engine can walk: at least one ``FlowStep``, names unique,
    names and kinds of the form ``NAME``; ``ValueError`` saying what is wrong otherwise."""
    steps = tuple(flow)
    if not steps or not all(isinstance(step, FlowStep) for step in steps):
        raise ValueError(f"{source} must be a non-empty tuple of durable_agents.steps.plan.FlowStep")
    for step in steps:
        for what, value in (("name", step.name), ("kind", step.kind)):
            if value is not None and not NAME.fullmatch(value):
                raise ValueError(f"{source}: step {step.name!r} has {what} {value!r}; a {what} is 1-40 of a-z, "
                                 "0-9 and _, starting with a letter")
    names = [step.name for step in steps]
    if len(set(names)) != len(names):
        raise ValueError(f"{source} names a step twice: {names}; a step's name is its place in the record")
    return steps


def load_flow(spec: str) -> tuple[FlowStep, ...]:
    """The flow named by ``module:NAME`` (e.g. ``durable_agents.steps.plan:FLOW``), imported and checked."""
    module, _, name = spec.partition(":")
    if not module or not name:
        raise ValueError(f"{FLOW_ENV}={spec!r} names no flow: give module:NAME, e.g. durable_agents.steps.plan:FLOW")
    try:
        found = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"{FLOW_ENV}={spec!r}: {err}; give module:NAME of a tuple of FlowStep") from None
    return check_flow_shape(found, f"{FLOW_ENV}={spec}")


def flow_from_env(env: Mapping[str, str] | None = None) -> tuple[FlowStep, ...]:
    """The flow an engine's command runs: ``LAB_FLOW`` (``module:NAME``) if set, else the lab's ``FLOW``."""
    spec = ((os.environ if env is None else env).get(FLOW_ENV) or "").strip()
    return load_flow(spec) if spec else FLOW
