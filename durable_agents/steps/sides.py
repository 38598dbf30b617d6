"""The comparison's shared shapes: what every engine's reader says of one run,
read from its own record (``Side``, ``SideStep``), and the provider's count
per key (``EffectEntry``). Each engine's own side extends ``Side`` in the
engine's package, next to the reader that builds it (its ``sides`` module);
the lesson lays them side by side (``lesson.compare``) and draws them
(``lesson.lanes``). Here, and not in the lesson, because the readers cannot
import the lesson and no engine may import another.

Plain JSON data, as ``durable_agents.steps.runstate``'s entries are: times are ``iso``
strings, a step's ``status`` is a ``StepStateName`` and a run's a
``RunStateName``. Every side has ``run_id``, ``status`` and ``error``, and
every side's step ``name``, ``status``, ``attempts``, ``seconds`` and
``result``: what the comparison reads of any engine. The rest is each
engine's own, in the order its JSON prints it; each engine's side is
``final``, told apart from the others by a key only it has.
"""

from __future__ import annotations

from typing import TypedDict

from durable_agents.steps.runstate import JsonValue, RunStateName, StepStateName


class SideStep(TypedDict):
    """What every engine's side says of one step."""

    name: str
    # The engine's own word for the step, one of the shared vocabulary's
    status: StepStateName
    attempts: int
    # From the step's start to its end, as the engine recorded them; None if it has not both
    seconds: float | None
    result: JsonValue


class Side(TypedDict):
    """What every engine's side says of the run."""

    run_id: str
    status: RunStateName
    error: str | None


# -- the provider (lesson.effects.effect_entries) -----------------------------------------------------------


class EffectEntry(TypedDict):
    """The provider's count for one idempotency key, and when it first and last saw it (its record)."""

    # The kind of effect the key's requests asked for (an email, a ticket, ...)
    kind: str
    requests: int
    # 0 or 1
    effects_applied: int
    first_seen: str | None
    last_seen: str | None
