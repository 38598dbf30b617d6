"""What ``settle`` tells an operator to do next (``durable_agents.steps.settle.settle_advice``, ``render_settle``), from
the run's own state: a retry only where the engine's retry would take the run, and in doubt only where a step
is. (tests/test_loop_commands.py and tests/test_in_doubt.py run ``starter.py settle`` on real runs.)"""

from __future__ import annotations

from durable_agents.flowclient.loop import loop_retry_refusal
from durable_agents.flowclient.runs import retry_refusal
from durable_agents.steps.settle import render_settle, settle_advice

RETRY = "python starter.py retry r-1"
COMMANDS = {"retry": RETRY, "follow": "python starter.py watch r-1", "status": "python starter.py status r-1"}
APPLIED = [{"step": "turn-2/call-0", "key": "agentlab/r-1/turn-2/call-0-ab", "state": "applied", "requests": 1,
            "applied_at": "2026-12-03T10:00:00Z", "ids": {"refund_id": "rfd_1"}, "request_sha256": "00"}]


def _told(state: str, error: str | None = None, in_doubt: tuple[str, ...] = (), *, loop: bool = True) -> str:
    refused = (loop_retry_refusal if loop else retry_refusal)("r-1", state, error)
    offer, advice = settle_advice("r-1", state, refused=refused, in_doubt=in_doubt, **COMMANDS)
    return render_settle("r-1", APPLIED, retry=RETRY if offer else None, footer=advice)


def test_a_completed_run_is_told_nothing_to_do_and_no_retry():
    for loop in (True, False):
        told = _told("completed", loop=loop)
        assert "run r-1 completed: nothing to do" in told, told
        assert RETRY not in told and "in_doubt" not in told and "in doubt" not in told, told


def test_an_open_run_is_told_to_follow_it_not_to_retry_it():
    running, parked = _told("running"), _told("parked")
    assert "still running: nothing to do by hand" in running and "`python starter.py watch r-1`" in running
    assert "is parked" in parked and "`python starter.py status r-1` says what parked it" in parked
    assert RETRY not in running + parked, running + parked


def test_a_failed_run_is_told_what_retry_does_or_why_it_is_refused():
    told = _told("failed", "step turn-2/call-0 failed after 3 attempt(s): boom", ("turn-2/call-0",))
    assert f"`{RETRY}`: the same key gets this answer back" in told, told
    assert "turn-2/call-0 in doubt: the answers above settle it" in told and "restarts it at its failed step" in told
    assert "in doubt" not in _told("failed", "step turn-2/call-0 failed after 3 attempt(s): boom"), "none in doubt"
    limit = _told("failed", "turn 20 still asked for tools (lookup_order) at the turn limit of 20 turns")
    assert f"`{RETRY}` is refused for this run: run r-1 reached its turn limit" in limit, limit
    assert f"`{RETRY}`:" not in limit and "higher --max-turns" in limit, limit
    refused_input = _told("failed", "input refused: window tokens of 300 cannot hold the start", loop=False)
    assert "is refused for this run: run r-1 failed on its input" in refused_input, refused_input
