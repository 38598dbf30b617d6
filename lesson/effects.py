"""The provider's own count of effects for a run: what actually happened outside.

    python -m lesson.effects RUN_ID [--json]

One line per idempotency key (requests that carried it, effects applied: 0 or
1), then per step the totals: each effect step of the flow counts the effects
of its kind (``durable_agents.steps.plan``: the email is ``send_confirmation``'s, the ticket
``record_outcome``'s; ``LAB_FLOW`` names another flow). An agent loop's run
(its keys name a turn and a call: ``durable_agents.steps.loop.tool_key``) has no steps of a
flow: its totals are per kind of effect, the tool calls' refunds, emails and
tickets. Reads ``PROVIDER_URL``
(default http://127.0.0.1:8780). Exit 0, or 2 if the provider cannot be
reached.

``effect_entries`` / ``provider_side``: the same count per key, with when the
provider first and last saw each key, as the comparison (``lesson.compare``)
and the pages' lanes (``lesson.lanes``) read it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Iterable
from typing import Any

from durable_agents.providerclient import EffectRecord, fetch_effects, provider_url_from_env
from durable_agents.steps.controls import printable
from durable_agents.steps.plan import FLOW, FlowStep, flow_from_env
from durable_agents.steps.sides import EffectEntry


def step_of(effect: EffectRecord, flow: Iterable[FlowStep] = FLOW) -> str | None:
    """The step of ``flow`` whose effect ``effect`` is: the one step of its kind, or, when several steps have
    that kind, the one its key names (``durable_agents.steps.keys``: the step is the key's last part); None if none
    is."""
    mine = [step.name for step in flow if step.kind == effect.kind]
    if len(mine) == 1:
        return mine[0]
    named = [name for name in mine if name in effect.key.split("/")]
    return named[0] if len(named) == 1 else None


def per_step(effects: Iterable[EffectRecord], flow: Iterable[FlowStep] = FLOW) -> dict[str, dict[str, int]]:
    """Per effect step of ``flow`` (the lab's by default): how many keys, requests and effects applied the
    provider saw. An effect no step of the flow has is counted apart, under ``<kind> (no step of the flow)``."""
    steps = tuple(flow)
    out = {step.name: {"keys": 0, "requests": 0, "applied": 0} for step in steps if step.kind is not None}
    for e in effects:
        row = out.setdefault(step_of(e, steps) or f"{e.kind} (no step of the flow)",
                             {"keys": 0, "requests": 0, "applied": 0})
        row["keys"] += 1
        row["requests"] += e.requests
        row["applied"] += e.effects_applied
    return out


LOOP_KEY = re.compile(r"/turn-\d+/call-")
"""What marks an agent loop's key: the turn and the call (``durable_agents.steps.loop.tool_key``; exercise 7's keys
too)."""


def per_kind(effects: Iterable[EffectRecord]) -> dict[str, dict[str, int]]:
    """Per kind of effect (``refund``, ``email``, ``ticket``, ...): keys, requests and effects applied, as
    ``per_step`` counts them, for a run whose effects are an agent loop's tool calls, not a flow's steps."""
    out: dict[str, dict[str, int]] = {}
    for e in effects:
        row = out.setdefault(f"{e.kind} (tool calls)", {"keys": 0, "requests": 0, "applied": 0})
        row["keys"] += 1
        row["requests"] += e.requests
        row["applied"] += e.effects_applied
    return out


def effect_entries(effects: Iterable[EffectRecord]) -> dict[str, EffectEntry]:
    """The provider's count per key, and when it first and last saw the key (its record)."""
    return {
        e.key: {"kind": e.kind, "requests": e.requests, "effects_applied": e.effects_applied,
                "first_seen": e.first_seen, "last_seen": e.last_seen}
        for e in effects
    }


def provider_side(url: str, run_id: str) -> dict[str, EffectEntry]:
    """``effect_entries`` for one run, asked of the provider at ``url``."""
    return effect_entries(fetch_effects(url, run_id=run_id))


def describe(counts: dict[str, int]) -> str:
    def n(value: int, word: str) -> str:
        return f"{value} {word}{'' if value == 1 else 's'}"
    return f"{n(counts['keys'], 'key')}, {n(counts['requests'], 'request')}, {counts['applied']} applied"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lesson.effects", description=__doc__.splitlines()[0])
    parser.add_argument("run_id", metavar="RUN_ID")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    try:
        effects = fetch_effects(provider_url_from_env(os.environ), run_id=args.run_id)
    except Exception as err:  # noqa: BLE001 - a CLI: say what went wrong and stop
        print(printable(f"error: {err}"), file=sys.stderr)
        return 2
    try:
        loop = bool(effects) and all(LOOP_KEY.search(e.key) for e in effects)
        steps = per_kind(effects) if loop else per_step(effects, flow_from_env())
    except ValueError as err:  # LAB_FLOW names no flow
        print(printable(f"error: {err}"), file=sys.stderr)
        return 2
    if args.json:
        report: dict[str, Any] = {"run_id": args.run_id, "keys": [e.__dict__ for e in effects], "steps": steps}
        print(json.dumps(report, indent=2))
        return 0
    print(f"effects at the provider for run {args.run_id}:")
    print(f"  {'idempotency key':<64} {'kind':<7} {'requests':>8} {'applied':>8}")
    for e in effects:
        print(printable(f"  {e.key:<64} {e.kind:<7} {e.requests:>8} {e.effects_applied:>8}"))
    for step, counts in steps.items():
        print(f"  {step}: {describe(counts)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
