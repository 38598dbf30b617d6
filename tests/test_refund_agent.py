"""The lab's refund agent is one user of the adapter: its four tools are one declaration
(``durable_agents.steps.refund_agent.REFUND_TOOLS``), the loop reads it, and what a run in flight recorded still
holds."""

from __future__ import annotations

import asyncio
import json
import re

from durable_agents import Toolbox
from durable_agents.steps import loop
from durable_agents.steps.flow import StepDeps
from durable_agents.steps.refund_agent import MAX_LOOP_BODY_CHARS, REFUND_TOOLS
from lab.processes import REPO
from tests.test_loop_steps import CUSTOMER, FakeProvider, Order

SIGNATURE_ON_MAIN = (
    "steps turn-1 turn-1/call-0 turn-1/call-1 turn-2",
    "key agentlab/run/turn-1/call-0-7edb360f06acaef2",
    "tool lookup_order::order_id=string",
    "tool issue_refund:refund:order_id=string,amount=integer",
    "tool send_email:email:subject=string,body=string",
    "tool create_ticket:ticket:summary=string",
)
"""``loop_signature()`` as main computed it before the tools were declared (c2a7150): runs in flight and the
replay fixtures recorded it, so the declaration must give it byte for byte."""


def test_the_signature_is_the_one_runs_in_flight_recorded():
    assert loop.loop_signature() == SIGNATURE_ON_MAIN
    assert loop.loop_digest() == "32861cd650"


def test_the_loop_reads_the_declaration():
    assert loop.TOOLBOX is REFUND_TOOLS and isinstance(REFUND_TOOLS, Toolbox)
    assert loop.TOOL_NAMES == ("lookup_order", "issue_refund", "send_email", "create_ticket")
    assert loop.EFFECT_OF_TOOL == {"issue_refund": "refund", "send_email": "email", "create_ticket": "ticket"}
    specs = {s["function"]["name"]: s["function"] for s in loop.tool_specs()}
    assert specs["issue_refund"]["parameters"]["properties"]["amount"]["type"] == "integer"
    assert specs["send_email"]["parameters"]["properties"]["body"]["maxLength"] == MAX_LOOP_BODY_CHARS
    assert set(specs["send_email"]["parameters"]["properties"]) == {"subject", "body"}, "no address field"
    instructions = loop.instructions()
    assert len(instructions["prompt"]) + len(str(instructions["tools"])) <= loop.MAX_INSTRUCTIONS_CHARS


def test_run_tool_has_no_branch_on_a_tool_name():
    source = (REPO / "durable_agents" / "steps" / "loop.py").read_text()
    assert not re.search(r"== \"(lookup_order|issue_refund|send_email|create_ticket)\"", source)


def test_the_email_goes_to_the_runs_customer_and_each_effect_under_the_calls_key():
    provider = FakeProvider({"A-1001": Order("A-1001", 2500)})
    deps = StepDeps(provider=provider, llm=None)
    inputs = loop.LoopInputs("r1", "t", CUSTOMER, start_id="s1")
    calls = [loop.AskedCall("c0", "lookup_order", '{"order_id": "A-1001"}'),
             loop.AskedCall("c1", "issue_refund", '{"order_id": "A-1001", "amount": 500}'),
             loop.AskedCall("c2", "send_email", '{"subject": "Refund", "body": "Done.\\nBye"}'),
             loop.AskedCall("c3", "create_ticket", '{"summary": "Refunded A-1001"}')]
    results = [asyncio.run(loop.run_tool(loop.tool_request(inputs, 1, i, c), deps)) for i, c in enumerate(calls)]
    assert [r.status for r in results] == ["ok"] * 4
    assert json.loads(results[0].content) == {"order_id": "A-1001", "total": 2500, "refunded": 0, "currency": "EUR"}
    assert results[0].idempotency_key is None and results[0].kind is None
    assert [r.kind for r in results[1:]] == ["refund", "email", "ticket"]
    assert [r.idempotency_key for r in results[1:]] == [loop.tool_key("r1", 1, i, f"c{i}") for i in (1, 2, 3)]
    assert json.loads(results[2].content)["to"] == CUSTOMER
    assert sorted(provider.applied) == sorted(r.idempotency_key for r in results[1:])
    email = provider.applied[results[2].idempotency_key]
    assert email["to"] == CUSTOMER and email["body"] == "Done.\nBye"
