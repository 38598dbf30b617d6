"""A tiny lane that is not the adapter's, for the kill matrix's ``ForeignEngine`` (tests/test_matrix_foreign.py):
no framework and no Temporal, only a worker process per run and a record file per run, so a test sees random
mode judge another engine's runs without the peers' frameworks installed.

The worker (``python -m tests.foreign_lane --run ID --record PATH --email TO [--keyed]``) runs one run of a
one-step agent, in this order:

1. its turn: unless the record holds turn 1, it asks the model stand-in at ``LLM_BASE_URL`` once, naming the
   run (``X-Lab-Run``), and records the answer (so a replacement worker never asks it again);
2. its effect: one email at the provider (``PROVIDER_URL``), under a fresh key per attempt (the mistake a tool
   written without a key in mind makes), or, with ``--keyed``, under a key from the run (what the provider
   dedups);
3. it prints ``applied`` and holds ``HOLD`` seconds before it records the run done: the window in which a kill
   leaves the email sent and the run not done, so the replacement sends it again (fresh key: applied twice;
   keyed: replayed, applied once).

``ForeignLane`` is the ``ForeignEngine``: a worker per run, a run open to a kill once its worker has printed
``applied`` (between the effect and its record, where the kill bites), a replacement worker started on the
run after each kill, the run past its deadline killed and read ``terminated``; for the point matrix
(``run_at``), a worker armed with ``CRASH_AT`` dies at ``tool:send_email:after_effect`` (its crash point,
right after the email) and a replacement finishes the run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path

from durable_agents.steps.crashpoints import crash_point
from durable_agents.testing import ForeignEngine
from durable_agents.testing.processes import Proc

HOLD = 1.0
"""Seconds between the effect and the run's record of it: the window a kill lands in."""


def _record(path: Path) -> dict[str, object]:
    return json.loads(path.read_text()) if path.exists() else {}


def _write(path: Path, record: Mapping[str, object]) -> None:
    spare = path.with_suffix(".tmp")
    spare.write_text(json.dumps(record))
    os.replace(spare, path)  # whole or not at all: a kill mid-write leaves the last record


# ---------------------------------------------------------------- the worker


async def _send(run_id: str, to: str, key: str) -> None:
    from durable_agents.providerclient import ProviderClient

    async with ProviderClient(os.environ["PROVIDER_URL"]) as provider:
        await provider.send_email(idempotency_key=key, run_id=run_id, to=to, subject="Your order",
                                  body="It is on its way.")


def work(run_id: str, record_path: Path, to: str, keyed: bool) -> None:
    record = _record(record_path)
    if record.get("done"):
        print("the run is done already", flush=True)
        return
    if "turn-1" not in record and os.environ.get("LLM_BASE_URL"):
        body = {"model": "scripted", "messages": [{"role": "user", "content": "Email the customer."}],
                "tools": [{"type": "function", "function": {"name": "send_email", "parameters": {}}}]}
        request = urllib.request.Request(f"{os.environ['LLM_BASE_URL']}/chat/completions",
                                         data=json.dumps(body).encode(), method="POST",
                                         headers={"Content-Type": "application/json", "X-Lab-Run": run_id})
        with urllib.request.urlopen(request, timeout=10) as answer:
            record["turn-1"] = json.loads(answer.read())["choices"][0]["message"]
        _write(record_path, record)
    key = f"agentlab/{run_id}/email" if keyed else f"fresh/{uuid.uuid4()}"
    asyncio.run(_send(run_id, to, key))
    crash_point("tool:send_email:after_effect")  # CRASH_AT: the point matrix's kill, where the email is applied
    print("applied", flush=True)
    time.sleep(HOLD)
    _write(record_path, {**record, "done": True})
    print("done", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.foreign_lane", description=__doc__.splitlines()[0])
    parser.add_argument("--run", required=True)
    parser.add_argument("--record", required=True, type=Path)
    parser.add_argument("--email", required=True)
    parser.add_argument("--keyed", action="store_true")
    args = parser.parse_args(argv)
    work(args.run, args.record, args.email, args.keyed)
    return 0


# ---------------------------------------------------------------- the engine


class ForeignLane(ForeignEngine):
    """The lane above as a ``ForeignEngine``: ``name`` for the report, the worker's environment in ``env``
    (``PROVIDER_URL``; ``LLM_BASE_URL`` to count its turn), the records in ``work``."""

    def __init__(self, name: str, work: Path, env: Mapping[str, str], *, keyed: bool = False,
                 deadline: float = 30.0) -> None:
        self.name, self.work, self.env, self.keyed, self.deadline = name, Path(work), dict(env), keyed, deadline
        self.active_seconds = HOLD  # the window a kill lands in: from the effect to the record
        self.terminated: set[str] = set()

    def record_of(self, run_id: str) -> Path:
        return self.work / f"{run_id}.json"

    def _worker(self, run_id: str, attempt: int, crash_at: str = "") -> Proc:
        argv = [sys.executable, "-m", "tests.foreign_lane", "--run", run_id, "--record", str(self.record_of(run_id)),
                "--email", "ada@example.com", *(["--keyed"] if self.keyed else [])]
        return Proc(f"{self.name}-{run_id}-{attempt}", argv,
                    env={**self.env, "PYTHONUNBUFFERED": "1", "CRASH_AT": crash_at},
                    cwd=Path(__file__).resolve().parent.parent)

    def chaos(self, tasks: Mapping[str, str], kills: int, rng: random.Random, wait: tuple[float, float],
              on_kill: Callable[[str, float], None], parallel: int) -> None:
        pending, live, started = list(tasks), {}, []
        attempts = dict.fromkeys(tasks, 0)
        began = time.monotonic()
        next_kill, landed = began + rng.uniform(*wait), 0
        try:
            while pending or live:
                while pending and len(live) < parallel:
                    rid = pending.pop(0)
                    live[rid] = self._worker(rid, 0)
                    started.append(live[rid])
                for rid, proc in list(live.items()):
                    if not proc.alive():
                        del live[rid]
                    elif time.monotonic() - began > self.deadline:
                        proc.kill()
                        self.terminated.add(rid)
                        del live[rid]
                # Open to a kill: its effect applied, its record not yet written (the worker printed "applied").
                bitable = sorted(rid for rid, proc in live.items() if "applied" in proc.output())
                if landed < kills and bitable and time.monotonic() >= next_kill:
                    rid = rng.choice(bitable)
                    live[rid].kill()
                    live[rid].wait(10)
                    landed += 1
                    on_kill(rid, time.monotonic() - began)
                    attempts[rid] += 1
                    live[rid] = self._worker(rid, attempts[rid])  # the replacement, as a supervisor starts one
                    started.append(live[rid])
                    next_kill = time.monotonic() + rng.uniform(*wait)
                time.sleep(0.02)
        finally:
            for proc in started:
                proc.kill()

    def run_at(self, run_id: str, task: str, crash_at: str) -> bool:
        """The point matrix: the worker armed with ``crash_at``, killed there by its own crash point, then a
        replacement worker, unarmed, finishes the run."""
        armed = self._worker(run_id, 0, crash_at)
        try:
            if armed.wait(self.deadline) != -9:
                return False
            again = self._worker(run_id, 1)
            again.wait(self.deadline)
            return True
        finally:
            armed.kill()

    def status(self, run_id: str) -> str:
        if run_id in self.terminated:
            return "terminated"
        record = self.record_of(run_id)
        if not record.exists():
            return ""
        return "completed" if _record(record).get("done") else "running"

    def recorded_turns(self, run_id: str) -> set[str] | None:
        return {"1"} if "turn-1" in _record(self.record_of(run_id)) else set()


if __name__ == "__main__":
    raise SystemExit(main())
