"""The peers' comparison (``make peers``, docs/peers.md) without the peer frameworks: what the lab's own
environment can check of it. CI does not build ``.venv-peers``; no test here runs a peer.

- the peers never move a lab pin: every package both locks pin has one version in both, and the peers' lock
  holds every pin of the dev lock (``.venv-peers`` is the lab's environment plus the peers);
- the stand-in counts a peer's requests per turn (a run named, no turn: the turn its window implies) and
  leaves the lab's unlabelled requests as they were;
- the scripted model reads the shared tools' results (``peers.tools``) in the message shapes a framework
  sends (its own system prompt first, results as the tool's return serialised to JSON);
- a ``keyed`` tool's key is stable for one call and different for another.
"""

from __future__ import annotations

import json
import re
import tomllib

import httpx
import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from durable_agents.drafting.scripted import ScriptedModel
from durable_agents.steps.loop import tool_specs
from durable_agents.testing.standin import ModelStandIn
from lab.processes import REPO
from peers.tools import call_key, fresh_key

PIN = re.compile(r"^([A-Za-z0-9_.-]+)==([^\s\\]+)", re.M)


def pins(lock: str) -> dict[str, str]:
    return {canonicalize_name(n): v for n, v in PIN.findall((REPO / "requirements" / lock).read_text())}


@pytest.mark.process
def test_the_peers_never_move_a_lab_pin():
    dev, peers = pins("dev.lock"), pins("peers.lock")
    moved = {name: (dev[name], peers[name]) for name in dev.keys() & peers.keys() if dev[name] != peers[name]}
    assert not moved, (f"requirements/peers.lock moves lab pins (dev.lock, peers.lock): {moved}; regenerate it with "
                       "the dev lock as constraint (requirements/README.md)")
    assert not dev.keys() - peers.keys(), (f"peers.lock lacks dev.lock's {sorted(dev.keys() - peers.keys())}: "
                                           "regenerate it after `make lock` (requirements/README.md)")


def test_the_peers_extra_is_pinned_with_hashes():
    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["peers"]
    pinned = pins("peers.lock")
    for text in extra:
        requirement = Requirement(text)
        name = canonicalize_name(requirement.name)
        assert name in pinned and requirement.specifier.contains(pinned[name]), \
            f"peers.lock does not pin {text} (has {pinned.get(name)}): regenerate it (requirements/README.md)"
    body = (REPO / "requirements" / "peers.lock").read_text()
    blocks = re.split(r"\n(?=[A-Za-z0-9_.-]+==)", body)
    assert all("--hash=sha256:" in b for b in blocks if PIN.match(b)), "peers.lock has a pin without a hash"


def _window(task: str, *rounds: tuple[list[tuple[str, dict]], list[dict]]) -> list[dict]:
    """A framework's window: its own system prompt, the task, then (calls, results) rounds."""
    messages: list[dict] = [{"role": "system", "content": "You are a framework's agent."},
                            {"role": "user", "content": task}]
    for n, (calls, results) in enumerate(rounds):
        ids = [f"call_{n}_{i}" for i in range(len(calls))]
        messages.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": ids[i], "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
            for i, (name, args) in enumerate(calls)]})
        messages += [{"role": "tool", "tool_call_id": ids[i], "content": json.dumps(result)}
                     for i, result in enumerate(results)]
    return messages


def test_the_stand_in_counts_a_peer_request_under_the_turn_its_window_implies():
    lookup = ([("lookup_order", {"order_id": "P-1001"})], [{"order_id": "P-1001", "total": 4200, "refunded": 0}])
    with ModelStandIn() as standin, httpx.Client(timeout=10) as http:
        def ask(messages: list[dict], headers: dict[str, str]) -> dict:
            body = {"model": "any", "messages": messages, "tools": tool_specs()}
            answer = http.post(f"{standin.url}/chat/completions", json=body, headers=headers)
            assert answer.status_code == 200, answer.text
            return answer.json()["choices"][0]["message"]

        first = ask(_window("Order P-1001 arrived broken"), {"X-Lab-Run": "peer-1"})
        second = ask(_window("Order P-1001 arrived broken", lookup), {"X-Lab-Run": "peer-1"})
        ask(_window("Order P-1001 arrived broken", lookup), {"X-Lab-Run": "peer-1"})  # turn 2 asked again
        ask(_window("Order P-1001 arrived broken", lookup), {"X-Lab-Run": "lab-1", "X-Lab-Turn": "7"})
        ask(_window("Order P-1001 arrived broken", lookup), {})  # the lab's unlabelled request: as before
        assert [c["function"]["name"] for c in first["tool_calls"]] == ["lookup_order"]
        assert [c["function"]["name"] for c in second["tool_calls"]] == ["issue_refund", "send_email"]
        assert standin.counts("peer-1") == {"run": "peer-1", "requests": 3, "turns": {"1": 1, "2": 2}}
        assert standin.counts("lab-1")["turns"] == {"7": 1}, "a named turn is counted under its name"
        assert standin.counts("-")["turns"] == {"-": 1}, "a request naming no run is counted as before"


def test_the_scripted_model_reads_the_shared_tools_results_in_a_frameworks_window():
    """The shapes ``peers.tools`` returns, serialised as a framework sends a tool's return, walk the script to
    its end: lookup, refund and email, ticket, final answer."""
    model = ScriptedModel()
    task = "Order P-1001 arrived broken: please refund it."
    lookup = ([("lookup_order", {"order_id": "P-1001"})],
              [{"order_id": "P-1001", "total": 4200, "refunded": 0, "currency": "EUR"}])
    refund = ([("issue_refund", {"order_id": "P-1001", "amount": 4200}), ("send_email", {"subject": "s", "body": "b"})],
              [{"refund_id": "R-1", "order_id": "P-1001", "amount": 4200}, {"message_id": "M-1", "to": "a@b.c"}])
    ticket = ([("create_ticket", {"summary": "done"})], [{"ticket_id": "T-9"}])
    steps = [model.answer(_window(task, *rounds)) for rounds in ((), (lookup,), (lookup, refund),
                                                                  (lookup, refund, ticket))]
    assert [[c.name for c in a.tool_calls] for a in steps] == [
        ["lookup_order"], ["issue_refund", "send_email"], ["create_ticket"], []]
    assert json.loads(steps[1].tool_calls[0].arguments) == {"order_id": "P-1001", "amount": 4200}
    assert "T-9" in steps[3].content
    refused = ([("issue_refund", {"order_id": "P-1001", "amount": 4200})], [{"error": "the provider refused it"}])
    assert [c.name for c in model.answer(_window(task, lookup, refused)).tool_calls] == ["create_ticket"]


def test_a_keyed_tools_key_is_stable_per_call_and_within_the_providers_rule():
    key = call_key("run-1", "issue_refund", "call_abc")
    assert key == call_key("run-1", "issue_refund", "call_abc")
    assert len({key, call_key("run-1", "issue_refund", "call_abd"), call_key("run-2", "issue_refund", "call_abc"),
                call_key("run-1", "send_email", "call_abc")}) == 4
    long = call_key("r" * 300, "send_email", "\u00e9\n" * 500)
    assert len(long) <= 255 and all("\x21" <= ch <= "\x7e" for ch in long), long
    assert fresh_key() != fresh_key()
