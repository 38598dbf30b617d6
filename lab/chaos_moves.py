"""What both chaos sessions do at random, written once: ``lab.chaos`` (the flow on Temporal) and
``lab.loop_chaos`` (the agent loop on every engine) make these moves, each drawing from its own seeded
``random.Random``, in this order, so a seed replays the same choices.

- Provider faults (``POST /admin/faults``): at random, the next 1-3 effect requests answered 503 before
  anything is applied, or the next 1-2 applied and their responses lost (503 after the effect). A new
  countdown replaces what is left of the old one, and ``clear_faults`` ends them: only what fired is
  counted, in the report's ``faults_503`` and ``faults_lost``.
- Workers on one task queue, in named slots: ``A``, always replaced when killed; ``B``, the standby, which
  comes when absent with probability ``STANDBY_ODDS`` and is replaced after a kill with the same odds, so
  part of the time two workers share the queue.
- What is still open when ``--max-seconds`` is reached is terminated, so no run outlives its session.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from typing import Protocol

from temporalio.client import Client

from durable_agents.providerclient import ProviderClient
from lab.processes import Proc

STANDBY_ODDS = 0.6
"""The standby worker B: the chance it comes when absent, and that it is replaced after its kill."""


class FaultCounts(Protocol):
    """The report's count of the provider faults that fired."""

    faults_503: int
    faults_lost: int


def model_words(vary: bool) -> str:
    """The model the workers run, as the summaries name it."""
    return "a model that varies every answer" if vary else "the deterministic model"


async def inject_faults(pc: ProviderClient, rng: random.Random, counts: FaultCounts) -> None:
    """At random: the next 1-3 effect requests answered 503 before anything is applied, or the next 1-2
    applied and their responses lost. What is left of the countdown it replaces never fired: not counted."""
    if rng.random() < 0.6:
        n = rng.randint(1, 3)
        counts.faults_503 -= (await pc.faults())["fail"]["remaining"]
        await pc.set_faults(fail_next=n, status=503)
        counts.faults_503 += n
    elif rng.random() < 0.6:
        n = rng.randint(1, 2)
        counts.faults_lost -= (await pc.faults())["lose_response"]["remaining"]
        await pc.set_faults(lose_response_next=n)
        counts.faults_lost += n


async def clear_faults(pc: ProviderClient, counts: FaultCounts) -> None:
    """No more faults; what never fired is not counted."""
    left = await pc.faults()
    counts.faults_503 -= left["fail"]["remaining"]
    counts.faults_lost -= left["lose_response"]["remaining"]
    await pc.clear_faults()


def worker_ready(proc: Proc) -> bool:
    """A worker alive and polling (it printed ``worker ready``)."""
    return proc.alive() and "worker ready" in proc.output()


def ready_workers(slots: Mapping[str, Proc]) -> dict[str, Proc]:
    """The slots whose worker is ready: the ones a kill may land on."""
    return {slot: p for slot, p in slots.items() if worker_ready(p)}


def wants_standby(slots: Mapping[str, Proc], rng: random.Random) -> bool:
    """Whether to start the standby B now: it is absent, and the odds say so."""
    return "B" not in slots and rng.random() < STANDBY_ODDS


def replaces(slot: str, rng: random.Random) -> bool:
    """Whether the worker just killed in ``slot`` is replaced: A always, B with the standby's odds."""
    return slot == "A" or rng.random() < STANDBY_ODDS


async def terminate_open(client: Client, run_ids: Iterable[str], reason: str) -> None:
    """End the runs still open, each with ``reason`` (the checks report them as not completed)."""
    for run_id in run_ids:
        try:
            await client.get_workflow_handle(run_id).terminate(reason)
        except Exception:  # noqa: BLE001 - closed between the last read and here
            pass
