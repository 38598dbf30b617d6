"""The longest history a run can make, and what replaying it costs against the
workflow task timeout.

    .venv/bin/python bench/bench_history_bound.py [--repeats 5] [--body-chars 20000]

A run's rule allows each step ``attempts_per_step`` failed attempts (50,
``durable_agents.steps.retry``), whatever its budget: this run spends all of them on every
step. Stand-in activities (in this process, like tests/test_operator_actions.py)
fail with the largest bodies the limits allow, so each attempt re-records the
largest input. A transient error costs the most history (11 events: the
attempt, its workflow task, the backoff timer and its task), but the budget
bounds how many a step can have (the backoff cap is at least budget / 30, so
about 35-50 errors spend any budget); the rest are attempts a worker shutdown
cut short (6 events, no budget). The stand-ins alternate the two, and every
step succeeds at its last allowed attempt, after 49 failures (a 50th would
end the run, one attempt's events sooner). The rule's times are shrunk (a 3 s
budget, a 0.1 s cap: the ratio a week-long budget records) so the run takes
seconds.

It prints the history's events and bytes against Temporal's limits (warning at
10,240 events and 10 MB, termination at 51,200 events and 50 MB), and the time
to replay it from scratch with the worker's own sandboxed runner (what a worker
does on a cache miss, and for every workflow task with ``--cache 0``) against
the 2 s workflow task timeout, beside a clean run's replay measured in the same
invocation. Not a test: it reports.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from temporalio import activity  # noqa: E402
from temporalio.exceptions import ApplicationError  # noqa: E402
from temporalio.worker import Replayer, Worker  # noqa: E402

from durable_agents.activities import WORKER_SHUTDOWN_TYPE, DraftOutput, RecordOutput, SendOutput  # noqa: E402
from durable_agents.flowclient.connect import connect  # noqa: E402
from durable_agents.flowclient.runs import WORKFLOW_TASK_TIMEOUT, start_run  # noqa: E402
from durable_agents.flowclient.worker_options import worker_options  # noqa: E402
from durable_agents.steps.limits import MAX_SUMMARY_CHARS  # noqa: E402
from durable_agents.steps.models import (  # noqa: E402
    DraftRequest,
    DraftResult,
    EmailSent,
    OutcomeRecorded,
    RecordRequest,
    SendRequest,
)
from durable_agents.steps.retry import ATTEMPTS_PER_STEP, RetryRule  # noqa: E402
from durable_agents.workflows.agent_flow import AgentFlow  # noqa: E402
from lab.processes import LAB_SERVER_CONFIG, DevServer  # noqa: E402

WARN_EVENTS, LIMIT_EVENTS = 10_240, 51_200
WARN_BYTES, LIMIT_BYTES = 10 * 1024 * 1024, 50 * 1024 * 1024


class StandIns:
    """The three steps, failing ``fail_first`` attempts of each with a transient error."""

    def __init__(self, fail_first: int, body_chars: int) -> None:
        self.fail_first = fail_first
        self.body = "x" * body_chars
        self.calls = {"draft": 0, "send_confirmation": 0, "record_outcome": 0}

    def _maybe_fail(self, step: str) -> int:
        self.calls[step] += 1
        n = self.calls[step]
        if n <= self.fail_first:
            if n % 2:  # as the activity wrapper reports each: how long it took, not in doubt
                raise ApplicationError("503 unavailable (stand-in)", {"seconds": 0.001, "in_doubt": False},
                                       type="TransientError")
            raise ApplicationError("this worker shut down during the attempt (stand-in)", {"seconds": 0.001},
                                   type=WORKER_SHUTDOWN_TYPE)
        return n

    @activity.defn(name="draft")
    async def draft(self, req: DraftRequest) -> DraftOutput:
        n = self._maybe_fail("draft")
        return DraftOutput(DraftResult(subject="Re: refund", body=self.body, summary="s" * MAX_SUMMARY_CHARS,
                                       model="stand-in"), n)

    @activity.defn(name="send_confirmation")
    async def send_confirmation(self, req: SendRequest) -> SendOutput:
        n = self._maybe_fail("send_confirmation")
        return SendOutput(EmailSent(message_id="msg_1", to=req.to, idempotency_key=req.idempotency_key), n)

    @activity.defn(name="record_outcome")
    async def record_outcome(self, req: RecordRequest) -> RecordOutput:
        n = self._maybe_fail("record_outcome")
        return RecordOutput(OutcomeRecorded(ticket_id="tkt_1", idempotency_key=req.idempotency_key), n)

    def all(self) -> list:
        return [self.draft, self.send_confirmation, self.record_outcome]


async def run_once(client, rule: RetryRule, fail_first: int, body_chars: int):
    queue = f"bound-{uuid.uuid4().hex[:8]}"
    run_id = f"bound-{uuid.uuid4().hex[:8]}"
    stand_ins = StandIns(fail_first, body_chars)
    async with Worker(client, task_queue=queue, workflows=[AgentFlow], activities=stand_ins.all(),
                      **worker_options(cache=1000)):
        await start_run(client, run_id, "Confirm the refund for order 1234", "ada@example.com",
                        queue=queue, rule=rule)
        try:
            await client.get_workflow_handle(run_id).result()
        except Exception as err:  # noqa: BLE001 - the bounded run fails at its third step: expected
            print(f"  run {run_id} ended: {type(err).__name__}: {getattr(err, 'cause', None) or err}")
    return await client.get_workflow_handle(run_id).fetch_history()


async def replay_seconds(history, repeats: int) -> list[float]:
    replayer = Replayer(workflows=[AgentFlow], workflow_runner=worker_options(cache=0)["workflow_runner"])
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        await replayer.replay_workflow(history, raise_on_replay_failure=True)
        times.append(time.perf_counter() - began)
    return times


async def main(args) -> None:
    # The stand-ins fail on purpose, hundreds of times: the SDK's warning per failure is noise here.
    logging.getLogger("temporalio.activity").setLevel(logging.ERROR)
    server = DevServer(dynamic_config=LAB_SERVER_CONFIG).start()
    try:
        client = await connect({"TEMPORAL_ADDRESS": server.address})
        week = RetryRule(budget_seconds=604_800)
        print(f"the largest budget's rule: cap {week.maximum_interval:g} s, {week.attempts_per_step} attempts per step")
        # The same budget-to-cap ratio, in seconds instead of a week.
        fast = RetryRule(budget_seconds=3, initial_interval=0.001, maximum_interval=0.1)
        bounded = await run_once(client, fast, ATTEMPTS_PER_STEP - 1, args.body_chars)
        clean = await run_once(client, RetryRule(), 0, args.body_chars)
        rows = []
        for name, history in (("clean run", clean), ("every attempt spent", bounded)):
            events = len(history.events)
            size = sum(e.ByteSize() for e in history.events)
            times = await replay_seconds(history, args.repeats)
            rows.append((name, events, size, statistics.median(times), max(times)))
        base = rows[0][3]
        timeout = WORKFLOW_TASK_TIMEOUT.total_seconds()
        print(f"{'run':<22}{'events':>8}{'bytes':>12}{'replay median':>15}{'worst':>9}{'x clean':>9}"
              f"{'x task timeout':>16}")
        for name, events, size, median, worst in rows:
            print(f"{name:<22}{events:>8}{size:>12,}{median:>14.3f}s{worst:>8.3f}s{median / base:>9.1f}"
                  f"{worst / timeout:>16.2f}")
        _, events, size, _, worst = rows[1]
        print(f"events: {events / WARN_EVENTS:.2f} of the warning, {events / LIMIT_EVENTS:.2f} of the limit; "
              f"bytes: {size / WARN_BYTES:.2f} of the warning, {size / LIMIT_BYTES:.2f} of the limit; "
              f"worst replay {worst / timeout:.2f} of the {timeout:g} s workflow task timeout")
    finally:
        server.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--body-chars", type=int, default=20_000)
    asyncio.run(main(parser.parse_args()))
