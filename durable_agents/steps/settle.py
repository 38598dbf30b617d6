"""Settling a step left in doubt: ask the receiver, by idempotency key, what
it applied. Engine-agnostic: both CLIs (``starter.py settle``, ``python -m
durable_agents.runrecord settle``) call this with a provider client.

A step is *in doubt* when an attempt's outcome is unknown (a 5xx, a timeout,
a lost answer, a worker that died mid-request): the effect may or may not have
been applied. The engines cannot know; the receiver can. For each effect step
of the run this reports one of:

- **applied**: the provider holds an effect under the key (its ids, when,
  and the request's digest). It happened, exactly once. ``retry`` of the run
  finds it: the same request is replayed, a different one adopted; nothing
  is applied again.
- **not applied**: the key was seen (``requests`` times) but nothing stored.
  ``retry`` sends it again with the same key, and the provider applies it once.
- **never seen**: no request with the key reached the provider; the same.

The answer is as of the lookup: a request still on its way (a provider that
hangs before it applies) can still be applied, once, under the same key, and
``retry`` then gets its stored answer back. What each engine does with the
answer is its own: the run record records it on the intents in doubt, so the
step is no longer in doubt (``RunRecord.settle_intents``); Temporal's history
cannot be written from outside a run, so it is only reported there.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from durable_agents.steps.controls import printable
from durable_agents.steps.keys import idempotency_key
from durable_agents.steps.plan import EFFECT_STEPS
from durable_agents.steps.ports import EffectApi
from durable_agents.tools import Toolbox


async def settle(provider: EffectApi, run_id: str, steps: Iterable[str] = EFFECT_STEPS) -> list[dict[str, Any]]:
    """One entry per effect step (``steps``: the flow's, ``durable_agents.steps.plan.effect_steps``; the lab's by
    default): ``{"step", "key", "state", "requests", "applied_at", "ids"}``."""
    return await settle_keys(provider, {step: idempotency_key(run_id, step) for step in steps})


async def settle_keys(provider: EffectApi, keys: Mapping[str, str]) -> list[dict[str, Any]]:
    """``settle`` for steps given with their keys (``{step: key}``): an agent loop's calls with an effect,
    each under the key its recorded turn gives it (``durable_agents.steps.loop.tool_key``). The same entries, in
    order."""
    report = []
    for step, key in keys.items():
        found = await provider.lookup(key)
        entry: dict[str, Any] = {"step": step, "key": key, "state": "never seen", "requests": 0,
                                 "applied_at": None, "ids": None, "request_sha256": None}
        if found is not None:
            entry["requests"] = found.requests
            entry["state"] = "applied" if found.applied else "not applied"
            if found.applied:
                response = found.response or {}
                entry["applied_at"] = found.applied_at
                entry["ids"] = made_ids(response, found.request or {})
                entry["request_sha256"] = found.request_sha256
        report.append(entry)
    return report


CANNOT_ASK = "cannot ask"
"""The state of a loop call whose tool declares no lookup by key: nothing is known of it from here."""


async def settle_calls(calls: Mapping[str, tuple[str, str]], tools: Toolbox, services: Any) -> list[dict[str, Any]]:
    """``settle`` for an agent loop's calls with an effect, ``{step: (tool name, key)}`` (each under the key its
    recorded turn gives it: ``durable_agents.steps.loop.tool_key``): each asked through its tool's own lookup by key
    (``durable_agents.Tool.lookup``, given ``services``: what the agent's tools reach their services by in this
    process). A tool that declares no lookup, that ``tools`` does not hold, or whose lookup raised (its
    service unreachable) is ``CANNOT_ASK`` with the ``reason``. The same entries as ``settle`` (no request
    digest: a lookup gives none), in order, with the tool's name."""
    report = []
    for step, (name, key) in calls.items():
        entry: dict[str, Any] = {"step": step, "tool": name, "key": key, "state": "never seen", "requests": 0,
                                 "applied_at": None, "ids": None}
        tool = tools.get(name)
        if tool is None or tool.lookup is None:
            entry.update(state=CANNOT_ASK, requests=None,
                         reason=(f"tool {name} declares no lookup by key" if tool is not None else
                                 f"the agent this command loaded has no tool {name!r}"))
            report.append(entry)
            continue
        try:
            found = await tool.lookup(key, services)
        except Exception as err:  # its service down, or the lookup's own bug: this call unknown, the others asked
            entry.update(state=CANNOT_ASK, requests=None, reason=f"its lookup failed: {str(err)[:200] or repr(err)}")
            report.append(entry)
            continue
        if found is not None:
            entry["requests"] = found.requests
            entry["state"] = "applied" if found.applied else "not applied"
            if found.applied:
                entry["applied_at"] = found.applied_at
                entry["ids"] = dict(found.ids)
        report.append(entry)
    return report


def made_ids(response: Mapping[str, Any], request: Mapping[str, Any]) -> dict[str, Any]:
    """The ids the provider made for an effect, whatever its kind: the answer's ``*_id`` fields that the
    request did not carry (a ticket's ``email_message_id`` is the request's; its ``ticket_id`` is made)."""
    return {k: v for k, v in response.items() if k.endswith("_id") and k not in request}


def answer_text(entry: Mapping[str, Any]) -> str:
    """The provider's answer for one key, in the words every engine prints."""
    requests = ("" if entry["requests"] is None else
                f"{entry['requests']} request(s) carried the key")
    if entry["state"] == "applied":
        ids = ", ".join(f"{k} {v}" for k, v in (entry["ids"] or {}).items())
        said = "; ".join(part for part in (ids, requests) if part)
        return f"applied at {entry['applied_at']}{f' ({said})' if said else ''}: it happened, once"
    if entry["state"] == "not applied":
        return f"not applied ({requests or 'the service saw the key'}, none stored)"
    if entry["state"] == CANNOT_ASK:
        return (f"cannot ask: {entry.get('reason') or 'its tool declares no lookup by key'}; ask its service "
                "what it holds under the key below")
    return f"never seen by {'its service' if 'tool' in entry else 'the provider'}: not applied"


def what_retry_does(entry: Mapping[str, Any]) -> str:
    """What a retry of the run meets under this key, given the provider's answer."""
    if entry["state"] == CANNOT_ASK:
        return "it is sent again with the same key: its service must apply at most one request per key"
    if entry["state"] == "applied":
        return ("the same key gets this answer back (replayed; adopted if the rebuilt request differs): "
                "nothing is applied again")
    return "it is sent with the same key, and the provider applies it once"


def settle_advice(run_id: str, state: str, *, retry: str, refused: str | None, in_doubt: Sequence[str],
                  follow: str, status: str) -> tuple[bool, str]:
    """What the report says to do next, from the run's own state (``state``: ``durable_agents.steps.runstate``'s word
    for the run), so it never points at a retry the engine would refuse: (whether each key's lines say what
    ``retry`` meets, the closing line). ``refused``: why the engine's retry refuses this run, or None;
    ``in_doubt``: the steps its status shows in doubt; ``follow`` and ``status``: the engine's commands that
    follow an open run and show a run."""
    if state == "completed":
        return False, (f"run {run_id} completed: nothing to do. Its steps are done and the answers above are what "
                       "was applied under their keys; a completed run cannot be retried (a new RUN_ID "
                       "does the task again).")
    if state == "parked":
        return False, (f"run {run_id} is parked (open; its workflow task keeps failing): `{status}` says what "
                       "parked it and what to do; a retry is refused while it is open.")
    if state == "running":
        return False, (f"run {run_id} is still running: nothing to do by hand. Its own next attempts send the same "
                       f"keys, so what the provider holds is never applied again "
                       f"(a tool with a lookup asks it first); `{follow}` follows it "
                       "(a retry is for a run that failed).")
    if refused is not None:
        return False, f"`{retry}` is refused for this run: {refused}"
    doubt = f"{', '.join(in_doubt)} in doubt: the answers above settle it. " if in_doubt else ""
    return True, (f"run {run_id} {state}. {doubt}`{retry}` restarts it at its failed step; each key then meets "
                  "what its lines say.")


def render_settle(run_id: str, report: list[dict[str, Any]], *, retry: str | None,
                  recorded: Mapping[str, str] | None = None, footer: str | None = None) -> str:
    """The report for a terminal. ``retry``: the engine's retry command, or None where a retry is not the
    next step (``settle_advice``); ``recorded``: by step, what the engine did with the answer; ``footer``: a
    closing line."""
    lines = [f"run {run_id}: what each call's service holds under its key (asked through its tool's lookup)"
             if any("tool" in e for e in report) else f"run {run_id}: what the provider holds under each effect "
             "step's key"]
    for e in report:
        lines.append(f"  {e['step']}: {answer_text(e)}")
        lines.append(f"    key {e['key']}")
        if recorded and e["step"] in recorded:
            lines.append(f"    {recorded[e['step']]}")
        if retry is not None:
            lines.append(f"    `{retry}`: {what_retry_does(e)}")
    if footer:
        lines.append(footer)
    # The ids and times are the provider's answer: data, escaped for the terminal.
    return "\n".join(printable(line) for line in lines)
