"""Settling a step left in doubt: ask the receiver, by idempotency key, what
it applied. Engine-agnostic: both CLIs (``starter.py settle``, ``python -m
runrecord settle``) call this with a provider client.

A step is *in doubt* when an attempt's outcome is unknown (a timeout, a lost
answer, a worker that died mid-request): the effect may or may not have been
applied. The engines cannot know; the receiver can. For each effect step of
the run this reports one of:

- **applied**: the provider holds an effect under the key (its ids, when,
  and the request's digest). It happened, exactly once. ``retry`` of the run
  finds it: the same request is replayed, a different one adopted.
- **not applied**: the key was seen (``requests`` times) but nothing stored:
  safe to retry, nothing will be doubled.
- **never seen**: no request with the key reached the provider.
"""

from __future__ import annotations

from typing import Any

from steps.controls import printable
from steps.keys import idempotency_key
from steps.ports import EffectApi

EFFECT_STEPS = ("send_confirmation", "record_outcome")


async def settle(provider: EffectApi, run_id: str) -> list[dict[str, Any]]:
    """One entry per effect step: ``{"step", "key", "state", "requests", "applied_at", "ids"}``."""
    report = []
    for step in EFFECT_STEPS:
        key = idempotency_key(run_id, step)
        found = await provider.lookup(key)
        entry: dict[str, Any] = {"step": step, "key": key, "state": "never seen", "requests": 0,
                                 "applied_at": None, "ids": None, "request_sha256": None}
        if found is not None:
            entry["requests"] = found.requests
            entry["state"] = "applied" if found.applied else "not applied"
            if found.applied:
                response = found.response or {}
                entry["applied_at"] = found.applied_at
                entry["ids"] = {k: response[k] for k in ("message_id", "ticket_id") if k in response}
                entry["request_sha256"] = found.request_sha256
        report.append(entry)
    return report


def render_settle(run_id: str, report: list[dict[str, Any]]) -> str:
    lines = [f"run {run_id}: what the provider holds under each effect step's key"]
    for e in report:
        if e["state"] == "applied":
            ids = ", ".join(f"{k} {v}" for k, v in (e["ids"] or {}).items())
            lines.append(f"  {e['step']}: applied at {e['applied_at']} ({ids}; {e['requests']} request(s) "
                         "carried the key): it happened, once")
        elif e["state"] == "not applied":
            lines.append(f"  {e['step']}: not applied ({e['requests']} request(s) carried the key, none stored): "
                         "safe to retry")
        else:
            lines.append(f"  {e['step']}: never seen by the provider: not applied, safe to retry")
        lines.append(f"    key {e['key']}")
    # The ids and times are the provider's answer: data, escaped for the terminal.
    return "\n".join(printable(line) for line in lines)
