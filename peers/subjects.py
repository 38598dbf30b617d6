"""What the driver runs under the kills: a peer's lane (``peers.lane.Lane``) or the lab's own loop on Temporal,
behind one shape, so every row of a table is made by the same code.

A ``Subject`` starts a worker process (armed with ``CRASH_AT`` or not, its model requests counted under the
run at the stand-in ``llm_url``), starts a run on the server, and waits for the run's result through the
Temporal client. Both kinds of subject are Temporal workflows on the same dev server, with workers as OS
processes the driver can SIGKILL.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from temporalio.client import Client, WorkflowFailureError

from lab.engines import TemporalDriver
from lab.processes import DevServer, Proc
from peers.lane import READY

EMAIL = "ada@example.com"
WORKER_READY_TIMEOUT = 90.0  # a peer's worker imports its framework: seconds on a busy 2-core machine
LAB_POINTS = {"peer:between_turns": "temporal:loop:after_turn"}
"""The lab's own name of a crash point where it differs: the loop's turn boundary is ``<engine>:loop:after_turn``
(a turn's last call recorded, the next turn not asked), the point the peers call ``peer:between_turns``."""


@dataclass
class Context:
    """The shared parts of one invocation: the server, the provider, the stand-ins, a client, the work dir."""

    server: DevServer
    client: Client
    provider_url: str
    standin_url: str  # answers at once
    slow_url: str  # answers each tool request after a delay: a kill lands during a model request
    work: str
    procs: list[Proc] = field(default_factory=list)


class Subject:
    """One row of the tables: a lane's variant, or the lab's loop."""

    label: str

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.queue = f"peers-{uuid.uuid4().hex[:10]}"

    def fresh_queue(self) -> None:
        self.queue = f"peers-{uuid.uuid4().hex[:10]}"

    async def start_worker(self, run_id: str, *, crash_at: str, llm_url: str, name: str) -> Proc:
        raise NotImplementedError

    async def start_run(self, run_id: str, task: str) -> None:
        raise NotImplementedError

    async def result(self, run_id: str, timeout: float) -> tuple[str, float]:
        """("completed" or what ended the run otherwise, the wall time it was seen to end)."""
        handle = self.ctx.client.get_workflow_handle(run_id)
        try:
            await asyncio.wait_for(handle.result(), timeout)
        except TimeoutError:
            await _terminate(self.ctx.client, run_id)
            return f"not done in {timeout:.0f} s (terminated)", time.time()
        except WorkflowFailureError as err:
            return f"failed: {err.cause or err}"[:160], time.time()
        return "completed", time.time()

    async def history_events(self, run_id: str) -> int:
        return len((await self.ctx.client.get_workflow_handle(run_id).fetch_history()).events)

    def close(self) -> None:
        """Nothing of its own: its worker processes are in the context's list."""


async def _terminate(client: Client, run_id: str) -> None:
    try:
        await client.get_workflow_handle(run_id).terminate("make peers: the run missed its deadline")
    except Exception:  # already closed: nothing to stop
        pass


class LaneSubject(Subject):
    """A peer framework's lane, one variant."""

    def __init__(self, ctx: Context, lane: ModuleType, variant: str) -> None:
        super().__init__(ctx)
        self.lane, self.variant = lane, variant
        self.label = f"{lane.NAME}, {variant}"

    async def start_worker(self, run_id: str, *, crash_at: str, llm_url: str, name: str) -> Proc:
        env = {"TEMPORAL_ADDRESS": self.ctx.server.address, "PROVIDER_URL": self.ctx.provider_url,
               "LLM_BASE_URL": llm_url, "LAB_PEER_RUN": run_id, "CRASH_AT": crash_at, "PYTHONUNBUFFERED": "1",
               "OPENAI_API_KEY": os.environ.get("OPENAI_API_KEY", "lab-stand-in")}
        proc = Proc(name, self.lane.worker_argv(self.variant, self.queue), env=env)
        self.ctx.procs.append(proc)
        await asyncio.to_thread(proc.wait_for_line, READY, WORKER_READY_TIMEOUT)
        return proc

    async def start_run(self, run_id: str, task: str) -> None:
        await self.lane.start_run(self.ctx.client, run_id=run_id, task=task, email=EMAIL, task_queue=self.queue,
                                  variant=self.variant)


class LabSubject(Subject):
    """The lab's agent loop on Temporal: ``worker.py`` processes and ``starter.py loop``'s start
    (``lab.engines.TemporalDriver``), with its keys from the run, the turn and the call."""

    label = "the lab's loop on Temporal"

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self._drivers: dict[str, TemporalDriver] = {}

    def _driver(self, llm_url: str) -> TemporalDriver:
        key = f"{self.queue}|{llm_url}"
        if key not in self._drivers:
            env = {"PROVIDER_URL": self.ctx.provider_url, "LLM_BASE_URL": llm_url, "LLM_MODEL": "scripted",
                   "MEMORY_DB": os.path.join(self.ctx.work, "memory.db")}
            self._drivers[key] = TemporalDriver(self.ctx.server, env, queue=self.queue)
        return self._drivers[key]

    async def start_worker(self, run_id: str, *, crash_at: str, llm_url: str, name: str) -> Proc:
        return await self._driver(llm_url).start_worker(crash_at=LAB_POINTS.get(crash_at, crash_at), name=name)

    async def start_run(self, run_id: str, task: str) -> None:
        driver = next(d for k, d in self._drivers.items() if k.startswith(f"{self.queue}|"))
        await driver.submit_loop(run_id, task, EMAIL, max_turns=10)

    def close(self) -> None:
        for driver in self._drivers.values():
            driver.close()


def effects_of(records: list[Any]) -> dict[str, dict[str, int]]:
    """Per kind: effects applied, and requests refused by the provider (a refund past the order's total)."""
    out: dict[str, dict[str, int]] = {k: {"applied": 0, "refused": 0} for k in ("refund", "email", "ticket")}
    for record in records:
        slot = out.setdefault(record.kind, {"applied": 0, "refused": 0})
        slot["applied"] += record.effects_applied
        if not record.effects_applied and record.status_code and 400 <= record.status_code < 500:
            slot["refused"] += 1
    return out
