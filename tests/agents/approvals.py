"""The lab's refund agent with a person in the loop, for the approval tests (tests/test_approvals_*.py): its
``issue_refund`` waits for a decision when the refund is over 20.00 (2000 cents), so of the two orders the
tests' task names (25.00 and 12.00 to refund) the first waits and the second runs at once.

- ``WAITS``: a call waits an hour at most, then is refused back to the model;
- ``EXPIRES``: two seconds, then refused back to the model (the deadline's test);
- ``EXPIRES_FAILS``: two seconds, then the run fails naming the call.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from durable_agents import Agent, Approval, Toolbox
from durable_agents.steps.refund_agent import REFUND_AGENT, REFUND_TOOLS

LIMIT_CENTS = 2000


def over_the_limit(arguments) -> bool:
    """A refund over 20.00 waits for a person."""
    return arguments.amount > LIMIT_CENTS


def _agent(name: str, approval: Approval) -> Agent:
    tools = Toolbox(replace(t, approval=approval) if t.name == "issue_refund" else t for t in REFUND_TOOLS)
    return replace(REFUND_AGENT, name=name, tools=tools)


WAITS = _agent("refund-approved", Approval(over_the_limit, within=timedelta(hours=1)))
EXPIRES = _agent("refund-expires", Approval(over_the_limit, within=timedelta(seconds=2)))
EXPIRES_FAILS = _agent("refund-expires-fails", Approval(over_the_limit, within=timedelta(seconds=2),
                                                        on_expiry="fail"))
