"""The lab's engine registry: every engine the lab drives, found where the engine lives.

An engine registers by holding a ``registration.py`` in its own package (one of the adapter's, or one at the top of
the checkout), whose ``ENGINE`` is a
``durable_agents.steps.engine_row.Engine`` row (``durable_agents/runrecord/registration.py``,
``durable_agents/dbosflow/registration.py``, ``durable_agents/flowclient/registration.py`` for Temporal). Adding an
engine is a package of its own and that one file: the drivers (``lab.engines.driver_for``), the loop's chaos
(``lab.loop_chaos``), the power-cut matrix, the lesson and the benchmarks take their engines from here, in ``rank``
order, and none lists them.

``register(row)`` adds one more from anywhere (a test's stub engine; ``registered(row)`` for a ``with``
block); an unknown name is refused with the names there are (``UnknownEngine``). The drivers and sessions a
row names by import string (``pkg.mod:attr``) are imported only when asked for (``driver_class``,
``session_class``), so listing the engines imports none of the lab's machinery and no engine's SDK.

Lanes that are not engines (the in-memory flow, the bare loop) are named where they are made, and are not
here; nor are an engine's variants (DBOS on PostgreSQL), each derived where it is made from its engine's row
(``Engine.variant``).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from durable_agents.steps.engine_row import Engine
from durable_agents.steps.plan import FlowStep

ROOT = Path(__file__).resolve().parents[1]
REGISTRATION = "registration"  # the module an engine's package registers in
_found: dict[str, Engine] | None = None


class UnknownEngine(ValueError):
    """No engine of that name is registered; the message lists those that are."""


def _discover() -> dict[str, Engine]:
    """Each package with a ``registration.py``, of the adapter's (``durable_agents/*/``) or at the top of the
    checkout: its ``ENGINE``."""
    found: dict[str, Engine] = {}
    for path in sorted([*ROOT.glob(f"durable_agents/*/{REGISTRATION}.py"), *ROOT.glob(f"*/{REGISTRATION}.py")]):
        if not (path.parent / "__init__.py").exists() or path.parent.name == "tests":
            continue
        module = ".".join([*path.parent.relative_to(ROOT).parts, REGISTRATION])
        row = getattr(importlib.import_module(module), "ENGINE", None)
        if not isinstance(row, Engine):
            raise TypeError(f"{module} registers no engine: "
                            "give it ENGINE = durable_agents.steps.engine_row.Engine(...)")
        _add(found, row, module)
    return found


def _add(into: dict[str, Engine], row: Engine, where: str) -> None:
    if row.name in into:
        raise ValueError(f"{where} registers the engine {row.name!r}, which is registered already")
    into[row.name] = row


def _registry() -> dict[str, Engine]:
    global _found
    if _found is None:
        _found = _discover()
    return _found


def engines(*, loop: bool = False) -> tuple[Engine, ...]:
    """Every registered engine, by rank; ``loop``: only those that run the agent loop (a chaos session)."""
    rows = sorted(_registry().values(), key=lambda e: (e.rank, e.name))
    return tuple(e for e in rows if e.loop_session is not None or not loop)


def names(*, loop: bool = False) -> tuple[str, ...]:
    """The registered engines' names, by rank (``engines``)."""
    return tuple(e.name for e in engines(loop=loop))


def engine(name: str) -> Engine:
    """The engine registered as ``name``; ``UnknownEngine`` naming every registered one otherwise."""
    found = _registry().get(name)
    if found is None:
        raise UnknownEngine(f"no engine {name!r} is registered: choose from {', '.join(names())}")
    return found


def register(row: Engine) -> Engine:
    """Register one more engine (a test's stub); ``ValueError`` if its name is taken."""
    _add(_registry(), row, f"register({row.name!r})")
    return row


def unregister(name: str) -> None:
    _registry().pop(name, None)


@contextmanager
def registered(row: Engine) -> Iterator[Engine]:
    """``row`` registered for the block, gone after it."""
    register(row)
    try:
        yield row
    finally:
        unregister(row.name)


def load(spec: str) -> Any:
    """The object an import string names: ``pkg.mod:attr``."""
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise ValueError(f"{spec!r} is no import string: give pkg.mod:attr")
    return getattr(importlib.import_module(module), attr)


def driver_class(name: str) -> Any:
    """The engine's ``lab.engines.EngineDriver`` subclass."""
    return load(engine(name).driver)


def session_class(name: str) -> Any:
    """The engine's session of the loop's chaos (``lab.loop_chaos``); ``UnknownEngine`` if it runs no loop."""
    row = engine(name)
    if row.loop_session is None:
        raise UnknownEngine(f"the {name} engine runs no agent loop: choose from {', '.join(names(loop=True))}")
    return load(row.loop_session)


def of_driver(cls: type) -> Engine | None:
    """The engine whose driver ``cls`` is, or derives from (the most derived match); None for a lane's."""
    for base in cls.__mro__:
        for row in engines():
            if load(row.driver) is base:
                return row
    return None


def registration_of(cls: type) -> Engine:
    """``of_driver``, for a driver that must be a registered engine's (``UnknownEngine`` otherwise): how a
    tool that has a lane of its own for one engine (a benchmark) names it without writing its name again."""
    found = of_driver(cls)
    if found is None:
        raise UnknownEngine(f"{cls.__name__} is no registered engine's driver: choose from {', '.join(names())}")
    return found


def engine_points(flow: Sequence[FlowStep]) -> dict[str, tuple[str, ...]]:
    """Each engine's own crash points for ``flow``, as its code names them (its ``crash_points``)."""
    return {e.name: e.crash_points(tuple(flow)) for e in engines()}
