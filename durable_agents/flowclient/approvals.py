"""A person's decision on a loop run's waiting call, sent to Temporal (``starter.py approve|deny RUN_ID CALL``).

First an **update** (``AgentLoop.approval``): it answers the sender, and once a worker accepts it the decision is
in history; its validator refuses what ``durable_agents.steps.approval.judge`` refuses, leaving no trace. An
update needs a worker: with none polling the run's queue the server holds it, and an update admitted but not
yet accepted is lost if the server restarts. So when no worker accepts it within ``accept_seconds``, the same
decision goes as a **signal** (``approval_kept``), which is in history at once with no worker; the run judges it
when a worker runs, and ``status`` shows it ``kept`` until then. The sender is told which happened.

Before either, the decision is judged here against the run's memo (what ``status`` shows, read from history with
no worker): a call that is not waiting, a decision for other arguments (``digest``), a different decision after
one was taken, are refused with nothing sent; the same decision again is answered as the first was.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from temporalio.client import Client, RPCTimeoutOrCancelledError, WorkflowUpdateFailedError

from durable_agents.flowclient.loop import read_chain
from durable_agents.steps.approval import (
    REJECTED,
    SAME,
    Asked,
    Decision,
    Wait,
    judge,
)
from durable_agents.steps.limits import InputError
from durable_agents.workflows.agent_loop import APPROVAL_SIGNAL, APPROVAL_UPDATE

DEFAULT_ACCEPT_SECONDS = 5.0


class DecisionRefused(InputError):
    """The decision was refused (the reason says why); nothing was recorded."""


def _found(chain: Any, call: str) -> tuple[Wait | None, Decision | None, bool]:
    """The call's wait, the decision taken for it, and whether its deadline passed, from the runs' memos."""
    wait, decided, expired = None, None, False
    for run in chain.runs:
        for entry in run.approvals:
            if entry.get("call") != call or entry.get("state") not in ("waiting", "approved", "denied", "expired"):
                continue
            wait = Wait.from_json(entry)
            expired = entry["state"] == "expired"
            decided = Decision.from_json(entry["decision"]) if isinstance(entry.get("decision"), Mapping) else None
    return wait, decided, expired


async def decide_loop(client: Client, run_id: str, call: str, verdict: str, *, by: str = "", reason: str = "",
                      digest: str | None = None, accept_seconds: float = DEFAULT_ACCEPT_SECONDS) -> tuple[str, str]:
    """Send a decision on ``call`` of ``run_id``: ``("decided" | "same" | "kept", what to tell the person)``;
    ``DecisionRefused`` (an ``InputError``) for a decision refused, ``InputError`` for bad input (checked before
    anything is read), ``TemporalRunNotFound`` for an unknown run."""
    asked = Asked.checked(call, verdict, by, reason, digest)
    call = asked.call
    chain = await read_chain(client, run_id)
    wait, decided, expired = _found(chain, call)
    decision = asked.decision(wait)
    turn, _, index = call.removeprefix("turn-").partition("/call-")
    ran = any((int(turn), int(index)) in run.results for run in chain.runs)
    said_verdict, said = judge(wait, decided, decision, expired=expired, ran=ran)
    if said_verdict == REJECTED:
        raise DecisionRefused(said)
    if said_verdict == SAME:
        return "same", said
    handle = client.get_workflow_handle(run_id)
    try:
        answer = await asyncio.wait_for(
            handle.execute_update(APPROVAL_UPDATE, decision.to_json(), id=decision.id, result_type=str,
                                  rpc_timeout=timedelta(seconds=accept_seconds)),
            accept_seconds + 5)
    except WorkflowUpdateFailedError as err:
        cause = err.__cause__
        raise DecisionRefused(str(getattr(cause, "message", None) or cause or err)) from None
    except (RPCTimeoutOrCancelledError, TimeoutError):
        await handle.signal(APPROVAL_SIGNAL, decision.to_json())
        return "kept", (f"{call}: no worker accepted the decision within {accept_seconds:g} s; it was sent as a "
                        f"signal and is kept in the run's history: the next worker to run takes it "
                        f"({decision.said()}). `python starter.py status {run_id}` shows it")
    return "decided", str(answer)
