"""The stall a busy worker has: how long worker.py's event loop goes without
running, under load, and how many live attempts the server took for dead.

    .venv/bin/python bench/bench_worker_stall.py [--runs 50,100,200] [--slots 100,20]
                                                 [--openai-runs 1,50] [--heartbeat 1] [--sticky 0.1]
                                                 [--trials 1]

Every attempt of a step runs on the worker's one event loop, and so do its
heartbeats: the activity wrapper calls ``heartbeat()`` every 0.3 s and the SDK
sends at most one per 0.8 x the heartbeat timeout. A loop that stalls for
about the heartbeat timeout (1 s as shipped before this bench) makes the
server time the attempt out as if its worker had died: a second attempt
starts while the first still runs, and enough of them fail the run as a
poison pill. This bench measures the stall a real worker has.

Real processes: the dev server (in memory, ``LAB_SERVER_CONFIG``: timers fire
within 100 ms, so a heartbeat timeout is not forgiven by a late timer), the
provider, and per case a fresh ``worker.py`` process (bench/stall_worker.py:
worker.py's own ``main`` with a lag probe beside it). A case starts N runs at
once and waits until every one has closed. Cases:

- **offline**: the offline model, N runs from ``--runs``, once per activity
  slot count in ``--slots`` (``LAB_MAX_CONCURRENT_ACTIVITIES``; 100 is the
  SDK's default, what worker.py ran with before it set one);
- **openai**: an OpenAI-compatible model (``durable_agents.testing.standin.ModelStandIn``,
  the lab's stand-in, in this process, answering every draft at once; the
  figures in docs/benchmarks.md were measured with the tests' scripted fake,
  which answered at once too), N runs from ``--openai-runs``: the
  worker as it was (no preload, 100 slots), with the client loaded before
  polling (``durable_agents.wiring.preload``) and 100 slots, and as shipped (preload and the
  shipped slot count).

Each case runs under every heartbeat timeout in ``--heartbeat`` (recorded in
the runs' rule, ``durable_agents.steps.retry.RetryRule.heartbeat_timeout``); the offline
cases under every sticky schedule-to-start timeout in ``--sticky``
(``LAB_STICKY_TIMEOUT_SECONDS``; default the shipped 100 ms).

Figures, over the time from the first start to the last run closed:

- **loop lag**: from a probe task on the worker's loop that sleeps 10 ms again
  and again; each wake-up's lateness. max, p99, and wake-ups >= 0.25 s late;
- **heartbeat gap**: between two ``heartbeat()`` calls of one attempt, beyond
  the 0.3 s asked (only attempts that ran longer than 0.3 s have one); and
  **first heartbeat**: from the attempt's start (server clock) to its first
  call, 0.3 s asked;
- from the runs' histories: heartbeat timeouts (``ActivityTaskTimedOut``,
  HEARTBEAT), start-to-close timeouts, attempts beyond one per step, and
  workflow tasks timed out on a sticky queue (SCHEDULE_TO_START: the 100 ms
  sticky timeout missed by a live worker, then a full replay elsewhere).

Not a test: it reports, it does not assert.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from temporalio.api.enums.v1 import EventType, TimeoutType  # noqa: E402

from durable_agents.flowclient.connect import connect, exit_now  # noqa: E402
from durable_agents.flowclient.runs import start_run  # noqa: E402
from durable_agents.flowclient.worker_options import MAX_CONCURRENT_ACTIVITIES  # noqa: E402
from durable_agents.steps.retry import rule_from_env  # noqa: E402
from durable_agents.testing.standin import ModelStandIn  # noqa: E402
from lab.processes import LAB_SERVER_CONFIG, DevServer, Proc  # noqa: E402
from lab.provider_process import start_provider  # noqa: E402

TASK = "Confirm the refund for order {i}"
EMAIL = "ada@example.com"
HEARTBEAT_EVERY = 0.3  # the activity wrapper's interval (durable_agents.activities.FlowActivities)
SDK_DEFAULT_SLOTS = 100


@dataclasses.dataclass(frozen=True)
class Case:
    model: str  # offline | openai
    runs: int
    slots: int
    preload: bool
    heartbeat: float
    sticky: float | None = None  # seconds; None: the shipped value

    @property
    def label(self) -> str:
        return f"{self.model}{'' if self.preload or self.model == 'offline' else ', no preload'}"


@dataclasses.dataclass
class Result:
    case: Case
    seconds: float
    statuses: dict[str, int]
    lags: list[float]
    beat_gaps: list[float]
    first_beats: list[float]
    heartbeat_timeouts: int
    start_to_close_timeouts: int
    extra_attempts: int
    sticky_timeouts: int
    task_timeouts: int
    most_running: int


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def secs(value: float) -> str:
    """Seconds to 3 places, or "-" where there was nothing to measure."""
    return "-" if value != value else f"{value:.3f}s"


async def history_counts(client, run_ids: list[str]) -> tuple[int, int, int, int, int]:
    """(heartbeat timeouts, start-to-close timeouts, attempts beyond one per step,
    sticky schedule-to-start timeouts, workflow task start-to-close timeouts) over the runs."""
    heartbeat = start_to_close = started = steps = sticky = task = 0
    for run_id in run_ids:
        history = await client.get_workflow_handle(run_id).fetch_history()
        scheduled_types: set[str] = set()
        for ev in history.events:
            et = ev.event_type
            if et == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                scheduled_types.add(ev.activity_task_scheduled_event_attributes.activity_type.name)
            elif et == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
                started += 1
            elif et == EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT:
                kind = ev.activity_task_timed_out_event_attributes.failure.timeout_failure_info.timeout_type
                heartbeat += kind == TimeoutType.TIMEOUT_TYPE_HEARTBEAT
                start_to_close += kind == TimeoutType.TIMEOUT_TYPE_START_TO_CLOSE
            elif et == EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT:
                kind = ev.workflow_task_timed_out_event_attributes.timeout_type
                sticky += kind == TimeoutType.TIMEOUT_TYPE_SCHEDULE_TO_START
                task += kind == TimeoutType.TIMEOUT_TYPE_START_TO_CLOSE
        steps += len(scheduled_types)
    return heartbeat, start_to_close, started - steps, sticky, task


async def one(case: Case, server: DevServer, provider_url: str, work: Path) -> Result:
    queue = f"stall-{uuid.uuid4().hex[:8]}"
    probe_file = work / f"{queue}.json"
    env = {"TEMPORAL_ADDRESS": server.address, "TEMPORAL_NAMESPACE": "default", "TASK_QUEUE": queue,
           "PROVIDER_URL": provider_url, "PYTHONUNBUFFERED": "1", "MEMORY_DB": str(work / f"{queue}-memory.db"),
           "STALL_PROBE_FILE": str(probe_file), "LAB_MAX_CONCURRENT_ACTIVITIES": str(case.slots),
           "STALL_NO_PRELOAD": "0" if case.preload else "1"}
    if case.sticky is not None:
        env["LAB_STICKY_TIMEOUT_SECONDS"] = f"{case.sticky:g}"
    model = None
    if case.model == "openai":
        model = ModelStandIn().start()  # the lab's stand-in: every draft request answered at once, over HTTP
        env.update(LLM_BASE_URL=model.url, LLM_MODEL="stand-in")
    worker = Proc("stall-worker", [sys.executable, "bench/stall_worker.py"], env=env)
    try:
        worker.wait_for_line("worker ready", timeout=60)
        client = await connect({**os.environ, "TEMPORAL_ADDRESS": server.address})
        rule = dataclasses.replace(rule_from_env({}), heartbeat_timeout=case.heartbeat)
        run_ids = [f"{queue}-{i:04d}" for i in range(case.runs)]
        began = time.time()
        await asyncio.gather(*(start_run(client, run_id, TASK.format(i=i), EMAIL, queue=queue, rule=rule)
                               for i, run_id in enumerate(run_ids)))

        async def closed(run_id: str) -> str:
            try:
                result = await asyncio.wait_for(client.get_workflow_handle(run_id).result(), timeout=600)
                return str(result["status"])
            except Exception as err:  # noqa: BLE001 - a failed run is a figure here, not an error
                cause = err
                while cause.__cause__ is not None:  # the workflow's own failure, under the SDK's wrapper
                    cause = cause.__cause__
                return f"{type(err).__name__} ({str(cause)[:120]})"

        outcomes = await asyncio.gather(*(closed(r) for r in run_ids))
        ended = time.time()
        worker.stop(timeout=30)  # SIGTERM: the probe writes its samples on the way out
        if not probe_file.exists():
            raise RuntimeError(f"the worker wrote no samples; its output:\n{worker.output()}")
        probe = json.loads(probe_file.read_text())
        counts = await history_counts(client, run_ids)
    finally:
        worker.kill()
        if model is not None:
            model.stop()
    statuses: dict[str, int] = {}
    for outcome in outcomes:
        statuses[outcome] = statuses.get(outcome, 0) + 1
    return Result(
        case=case, seconds=ended - began, statuses=statuses,
        lags=[lag for when, lag in probe["lags"] if began <= when <= ended],
        beat_gaps=[gap - HEARTBEAT_EVERY for gap in probe["beat_gaps"]],
        first_beats=probe["first_beats"],
        heartbeat_timeouts=counts[0], start_to_close_timeouts=counts[1], extra_attempts=counts[2],
        sticky_timeouts=counts[3], task_timeouts=counts[4], most_running=int(probe.get("most_running", 0)),
    )


def cases(runs: list[int], slots: list[int], openai_runs: list[int], heartbeats: list[float],
          stickies: list[float | None]) -> list[Case]:
    out = []
    for heartbeat in heartbeats:
        for n in runs:
            out += [Case("offline", n, s, True, heartbeat, sticky) for s in slots for sticky in stickies]
        for n in openai_runs:
            out += [Case("openai", n, SDK_DEFAULT_SLOTS, False, heartbeat),
                    Case("openai", n, SDK_DEFAULT_SLOTS, True, heartbeat),
                    Case("openai", n, MAX_CONCURRENT_ACTIVITIES, True, heartbeat)]
    return out


async def main_async(all_cases: list[Case], trials: int) -> list[Result]:
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-stall-") as tmp:
        server = DevServer(dynamic_config=LAB_SERVER_CONFIG).start()
        provider = start_provider(Path(tmp) / "provider.db")
        try:
            for trial in range(trials):
                for case in all_cases:
                    result = await one(case, server, provider.url, Path(tmp))
                    results.append(result)
                    print(f"  trial {trial + 1}: {case.label:<19} {case.runs:>4} runs, {case.slots:>3} slots, "
                          f"heartbeat {case.heartbeat:g} s: {result.seconds:5.1f} s, loop lag max "
                          f"{max(result.lags, default=float('nan')):.3f} s, heartbeat timeouts "
                          f"{result.heartbeat_timeouts}, {result.statuses}", flush=True)
        finally:
            provider.stop()
            server.stop()
    return results


def report(results: list[Result]) -> None:
    print(f"\nmachine: {os.cpu_count()} cores, Python {platform.python_version()}, {platform.platform()}, "
          f"load average {os.getloadavg()[0]:.2f} at the end")
    print("dev server in memory (LAB_SERVER_CONFIG), provider and worker as separate processes; "
          "all of a case's runs started at once\n")
    head = (f"{'model':<19} {'runs':>4} {'slots':>5} {'hb':>4} {'sticky':>6} {'secs':>6} {'lag max':>8} {'lag p99':>8} "
            f"{'>=0.25s':>7} {'gap max':>8} {'gap p99':>8} {'1st max':>8} {'hb t/o':>6} {'s2c t/o':>7} "
            f"{'extra att':>9} {'sticky t/o':>10} {'WFT t/o':>7} {'at once':>7}  statuses")
    print(head)
    for r in results:
        c = r.case
        nan = float("nan")
        sticky = "-" if c.sticky is None else f"{c.sticky:g}s"
        print(f"{c.label:<19} {c.runs:>4} {c.slots:>5} {c.heartbeat:>3g}s {sticky:>6} {r.seconds:>5.1f}s "
              f"{secs(max(r.lags, default=nan)):>8} {secs(pct(r.lags, 0.99)):>8} "
              f"{sum(lag >= 0.25 for lag in r.lags):>7} "
              f"{secs(max(r.beat_gaps, default=nan)):>8} {secs(pct(r.beat_gaps, 0.99)):>8} "
              f"{secs(max(r.first_beats, default=nan)):>8} "
              f"{r.heartbeat_timeouts:>6} {r.start_to_close_timeouts:>7} {r.extra_attempts:>9} "
              f"{r.sticky_timeouts:>10} {r.task_timeouts:>7} {r.most_running:>7}  "
              + ", ".join(f"{k} {v}" for k, v in sorted(r.statuses.items())))
    lags = [lag for r in results for lag in r.lags]
    if lags:
        print(f"\nevery case: loop lag max {max(lags):.3f} s, p99 {pct(lags, 0.99):.3f} s, "
              f"median {statistics.median(lags) * 1000:.1f} ms over {len(lags)} wake-ups")
    print("lag: how late a 10 ms sleep on the worker's loop woke; gap: between two heartbeat() calls "
          f"of one attempt, beyond the {HEARTBEAT_EVERY} s asked; 1st: attempt start (server) to its first "
          "heartbeat() call; t/o: timeouts in the runs' histories; extra att: attempts beyond one per step; "
          "at once: the most attempts the worker ran at one time")


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default="50,100,200", help="runs started at once, offline model")
    parser.add_argument("--slots", default=f"{SDK_DEFAULT_SLOTS},{MAX_CONCURRENT_ACTIVITIES}",
                        help="activity slot counts to compare, offline model")
    parser.add_argument("--openai-runs", default="1,50", help="runs started at once, OpenAI-compatible model")
    parser.add_argument("--heartbeat", default="1", help="heartbeat timeouts (seconds) recorded in the runs' rule")
    parser.add_argument("--sticky", default="",
                        help="sticky schedule-to-start timeouts (seconds) for the offline cases; "
                             "default: the shipped one")
    parser.add_argument("--trials", type=int, default=1)
    args = parser.parse_args()
    heartbeats = [float(x) for x in args.heartbeat.split(",") if x]
    stickies: list[float | None] = [float(x) for x in args.sticky.split(",") if x] or [None]
    all_cases = cases(ints(args.runs), ints(args.slots), ints(args.openai_runs), heartbeats, stickies)
    results = asyncio.run(main_async(all_cases, args.trials))
    report(results)
    return 0


if __name__ == "__main__":
    exit_now(main())
