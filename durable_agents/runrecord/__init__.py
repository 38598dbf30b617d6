"""The agent flow on a hand-rolled SQLite run record: the sibling of the
Temporal path, driving THE SAME step functions (``durable_agents.steps.flow``) so the two
records can be compared (the lab's ``python -m lesson.compare``).

Contract
========

- A run record holds the task, the current step, the status (running |
  completed | failed) and every completed step's result, with attempts and
  timestamps (``durable_agents.runrecord.store`` has the schema). A step's result and the
  advance to the next step are committed in ONE transaction.
- Each effectful attempt records an *intent* (idempotency key, request)
  before the request can be sent, and its outcome with the step's result. A
  crash between the two leaves the intent ``in_doubt``, visible in
  ``status``; resume settles it by repeating the request with the same key
  (``durable_agents.steps.keys.idempotency_key``), and the provider replays its first answer.
  At-least-once execution plus an idempotent receiver: each effect once.
- The step name at each position is recorded and checked on resume: a
  changed flow is refused (``FlowChanged``), never resumed at the wrong step.
- Retries follow ``durable_agents.steps.retry``, the Temporal workflow's rule and numbers:
  errors spend a per-step time budget (backoff with jitter between attempts),
  crashes (an attempt started and no outcome recorded) are counted apart and
  bounded by the worker-death limit. A non-retryable error, a spent budget or
  one death too many ends the run failed, naming the step and the reason.
  Failed is terminal for ``resume``; ``retry`` restarts it at the failed step
  with a fresh budget, the same keys and nothing completed run again.
- A 409 on an effect is adopted when the provider holds this run's own
  earlier effect under the key (``durable_agents.steps.adoption``; the run's start id is
  drawn at ``start`` and recorded).
- One process drives a run at a time: a lease with an expiry, renewed by
  every commit and a heartbeat (``durable_agents.runrecord.runner``); a dead holder on this
  host is taken over at once, any other waited out (``durable_agents.runrecord.lease``).
- SQLite in WAL mode with synchronous=FULL: see ``durable_agents.runrecord.store`` for why.
- The agent loop (``durable_agents.steps.loop``; ``python -m durable_agents.runrecord loop``) runs on the
  same tables and the same runner: its plan grows as turns are recorded
  (``durable_agents.runrecord.plans``). A turn's answer and the rows of its calls and of the
  next turn are ONE commit, before any call runs; a call with an effect
  records its intent before its request can be sent; a recorded turn is
  never asked again; each turn's window is derived from the record under the
  run's recorded bounds, never stored.

Crash points (``CRASH_AT``, see ``durable_agents.steps.crashpoints``; the steps' own points
work here too), for each step name S:

=======================================  ==========================================
``runrecord:S:after_start``              (draft) attempt n recorded as started;
                                         the step function not yet called
``runrecord:S:after_intent``             (send_confirmation, record_outcome)
                                         attempt n and its intent committed;
                                         the request not yet sent
``runrecord:S:after_record``             S's result, its intent's outcome and
                                         the advance (with the next step's
                                         first attempt and intent) committed
=======================================  ==========================================

And for a run of the agent loop, besides the steps' ``turn:after_answer`` and
``tool:<name>:after_effect``:

=======================================  ==========================================
``runrecord:loop:between_calls``         a call's result committed, with the
                                         next call of its turn's attempt 1 (and
                                         intent); that call not started
``runrecord:loop:after_turn``            a turn's last call committed, with the
                                         next turn's attempt 1; the model not
                                         asked
=======================================  ==========================================

What resume does after each: after_start / after_intent: a new attempt
(n+1) of S, its intent in doubt until then is settled by the repeated,
same-key request; S:after_record: continues at the next step, S is not
run again; ``send_confirmation:after_effect`` (a steps point): the email went
out, its intent is in doubt; resume repeats it, the provider replays.
"""

from durable_agents.runrecord.runner import DEFAULT_FLOW, FlowChanged, Runner, RunTerminal
from durable_agents.runrecord.store import LeaseHeld, LeaseLost, RecordRunNotFound, RunExists, RunRecord
from durable_agents.steps.plan import FlowStep
from durable_agents.steps.requests import RunInputs

__all__ = [
    "DEFAULT_FLOW",
    "FlowChanged",
    "FlowStep",
    "LeaseHeld",
    "LeaseLost",
    "RecordRunNotFound",
    "RunExists",
    "RunInputs",
    "RunRecord",
    "RunTerminal",
    "Runner",
]
