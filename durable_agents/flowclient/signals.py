"""Run a Temporal worker until the process is told to stop: the run-until-signal lines every worker process
of the lab shares (``worker.py``, and the peers' workers in ``peers/``).

``run_until_signalled(worker, ready, stopping)`` enters the worker (it polls from then on), calls ``ready()``
(the line a driver or a test waits for, printed by the caller: each worker names what it runs), waits for
SIGINT or SIGTERM, calls ``stopping()`` if given, and leaves, which shuts the worker down: in-flight
activities get the worker's ``graceful_shutdown_timeout``, then are cancelled. A SIGKILL is not handled (it
cannot be): it is the crash the lab is about.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable

from temporalio.worker import Worker

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


async def run_until_signalled(worker: Worker, ready: Callable[[], None],
                              stopping: Callable[[], None] | None = None) -> None:
    """Run ``worker`` until SIGINT or SIGTERM; ``ready()`` once it polls, ``stopping()`` before it shuts down."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, stop.set)
    try:
        async with worker:
            ready()
            await stop.wait()
            if stopping is not None:
                stopping()
    finally:
        for sig in STOP_SIGNALS:
            loop.remove_signal_handler(sig)
