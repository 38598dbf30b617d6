"""What an engine tells the lab about itself: one frozen row, ``Engine``, which the engine's own package holds
(its ``registration.py``, as ``ENGINE``) and ``lab.registry`` finds. The lab's drivers, its loop chaos, the
power-cut matrix, the lessons and the benchmarks iterate the registered rows; none of them lists engines.

Here, in the core, because an engine's package may import the core and nothing of the lab: the row names the
lab's driver and chaos session for the engine by import string (``pkg.mod:attr``), resolved by the registry
only when the lab asks for them, so the engine imports nothing of the lab and the lab imports no engine until
it drives one.

What the row declares is what the drivers and sessions used to spell per engine in ``if``/``elif`` and tuples:

- ``name``: the engine's one name (``driver_for(name)``, ``--engine name``, a table's row), written here once;
  ``rank``: where it comes in the lab's tables and loops (lowest first);
- ``driver``: its ``lab.engines.EngineDriver`` (the engine protocol: ``start``, ``resume``, ``status``,
  ``start_loop``, ``loop_status``, ``processes``); ``loop_session``: its session of the loop's chaos
  (``lab.loop_chaos``), or None if it runs no agent loop;
- ``cli``: the module ``python -m`` runs for it (``start``, ``resume``, ``status --json``), None if it has none;
- ``crash_points(flow)``: its own crash points for a flow (``durable_agents.steps.crashpoints``), as its code names
  them;
- what it records, and where: ``sync_env`` and ``sync_levels`` (its store's synchronous levels, the lab's first:
  the power cut measures each), ``needs_server`` (its record is a server's, which the caller starts: the driver
  is given it), ``on_postgres`` (its record can live on PostgreSQL: a variant ``<name>-pg``), and
  ``cut_start``, the crash point just after a start is acknowledged ("" when none is needed);
- how the lab shows it: ``label``, ``letter`` (its order ids' first letter in the loop's runs), and ``runner``,
  what runs one of its runs (``worker``: processes serving a queue; ``process``: one per run).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from durable_agents.steps.plan import FlowStep


@dataclass(frozen=True)
class Engine:
    """One engine's registration (the module docstring)."""

    name: str
    rank: int
    label: str
    driver: str  # import string of its lab.engines.EngineDriver
    crash_points: Callable[[Sequence[FlowStep]], tuple[str, ...]]
    loop_session: str | None = None  # import string of its lab.loop_chaos session; None: no agent loop
    cli: str | None = None
    letter: str = "X"
    runner: str = "process"
    sync_env: str | None = None
    sync_levels: tuple[str, ...] = ()
    needs_server: bool = False
    on_postgres: bool = False
    cut_start: str = ""

    @property
    def default_sync(self) -> str | None:
        """The level the lab runs its store at (the first of ``sync_levels``), None if it declares none."""
        return self.sync_levels[0] if self.sync_levels else None

    def variant(self, suffix: str) -> str:
        """The name of a variant of this engine (``dbos-pg``: DBOS on PostgreSQL), derived from its own."""
        return f"{self.name}{suffix}"
