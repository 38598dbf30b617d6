"""Conversation memory for the steps, from the environment: the
``MemoryContext`` and ``MemoryWriter`` of ``durable_agents.steps.ports`` over the SQLite
store of ``memory``.

- ``MEMORY_DB``: the store file (default ``.state/memory.db``; ``off``
  disables memory);
- ``MEMORY_MAX_TOKENS`` and ``MEMORY_MAX_MESSAGES`` bound each
  conversation's window (see ``memory``);
- ``MEMORY_SYNCHRONOUS``: the store's ``synchronous`` level, FULL by default
  (a committed exchange survives a power cut); NORMAL to measure what a cut
  then takes.

The writer keeps its connection open between exchanges; a process closes it
when it is done with the steps (``close_memory``), so nothing is left to an
interpreter's exit.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from durable_agents.memory import MemoryPolicy, Message, Store, append_or_warn, open_store, read_context
from durable_agents.steps.limits import InputError
from durable_agents.steps.ports import MemoryContext, MemoryWriter, Remembered
from durable_agents.storage.sqlite import synchronous_setting

log = logging.getLogger("steps")

DEFAULT_MEMORY_DB = ".state/memory.db"
DEFAULT_MEMORY_MAX_TOKENS = 2000
DEFAULT_MEMORY_MAX_MESSAGES = 40
DEFAULT_MEMORY_SYNCHRONOUS = "FULL"


def _synchronous(env: Mapping[str, str]) -> str:
    try:
        return synchronous_setting(env, "MEMORY_SYNCHRONOUS", DEFAULT_MEMORY_SYNCHRONOUS)
    except ValueError as err:
        raise InputError(str(err)) from None


def _positive_int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name) or str(default)
    try:
        value = int(raw)
        if value < 2:
            raise ValueError
    except ValueError:
        raise InputError(f"{name}={raw!r} must be a whole number of at least 2") from None
    return value


def memory_from_env(env: Mapping[str, str]) -> tuple[MemoryContext, MemoryWriter]:
    """(context reader, exchange writer) over the SQLite memory store, or two
    that do nothing when ``MEMORY_DB=off``. Memory never stops a run: each
    turns any store problem into a warning (``_ContextReader``, ``_ExchangeWriter``)."""
    path = env.get("MEMORY_DB") or DEFAULT_MEMORY_DB
    if path == "off":
        return _nothing_remembered, _nothing_written
    policy = MemoryPolicy(
        max_tokens=_positive_int(env, "MEMORY_MAX_TOKENS", DEFAULT_MEMORY_MAX_TOKENS),
        max_messages=_positive_int(env, "MEMORY_MAX_MESSAGES", DEFAULT_MEMORY_MAX_MESSAGES),
    )
    return _ContextReader(path), _ExchangeWriter(path, policy, _synchronous(env))


def close_memory(remember: MemoryWriter) -> None:
    """Close the writer's store if it has one open (``memory_from_env``'s writer; any other is left alone).
    Safe to call twice; the writer opens the store again if it is called afterwards."""
    if isinstance(remember, _ExchangeWriter):
        remember.close()


class _ContextReader:
    """Opens the file read-only per call, leaves out what was appended after the
    run's cut-off (``as_of``), and turns any store problem into an empty context
    with a warning. Blocking (SQLite, with a busy timeout): the steps call it in
    a thread."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __call__(self, conversation_id: str, as_of: float | None = None) -> list[dict[str, Any]]:
        if not Path(self.path).exists():
            return []  # nothing remembered yet: the first run creates the file; not worth a warning
        # Pinned messages left out: the draft step puts its own system prompt first.
        return read_context(self.path, conversation_id, include_pinned=False, as_of=as_of)


class _ExchangeWriter:
    """Appends idempotently by message id (evicting by the memory's rule) and
    turns any store problem into a warning.

    Keeps one connection open, since opening and closing a WAL database
    checkpoints it, which costs each exchange several times more
    (docs/benchmarks.md); reopens it if the file was replaced or removed (a
    learner wiping memory) or after an error. Blocking (SQLite): the steps call
    it in a thread, and it takes a lock so that two steps finishing at once in
    one worker never share its connection's state."""

    def __init__(self, path: str, policy: MemoryPolicy, synchronous: str = DEFAULT_MEMORY_SYNCHRONOUS) -> None:
        self.path, self.policy, self.synchronous = path, policy, synchronous
        self.store: Store | None = None
        self.opened_on: tuple[int, int] | None = None  # the file (device, inode) the store was opened on
        self.writing = threading.Lock()

    def __call__(self, conversation_id: str, messages: list[Remembered]) -> int:
        with self.writing:
            store = self._open()
            if store is None:
                return 0
            added = 0
            for message_id, role, content in messages:
                result = append_or_warn(store, conversation_id, Message(id=message_id, role=role, content=content))
                if result is None:
                    self._drop()  # warned already; start afresh next time
                    break
                added += bool(result.added)
            return added

    def _open(self) -> Store | None:
        """The open store, opened afresh if the file changed under it; None (warned) when it cannot be."""
        if self.store is not None and self.opened_on != self._file_id():
            self._drop()  # the file was removed or replaced under us: write to the new one
        if self.store is None:
            try:
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
                self.store = open_store(self.path, self.policy, synchronous=self.synchronous)
                self.opened_on = self._file_id()
            except Exception as err:  # noqa: BLE001 - memory must never stop a run
                log.warning("conversation memory unavailable (%s); exchange not remembered", err)
                return None
        return self.store

    def close(self) -> None:
        """Close the store (its last connection: SQLite checkpoints the WAL into the file)."""
        with self.writing:
            self._drop()

    def _file_id(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_dev, st.st_ino

    def _drop(self) -> None:
        if self.store is not None:
            try:
                self.store.close()
            except Exception:  # noqa: BLE001 - closing a broken store must not raise here
                pass
            self.store = None


def _nothing_remembered(conversation_id: str, as_of: float | None = None) -> list[dict[str, Any]]:
    return []


def _nothing_written(conversation_id: str, messages: list[Remembered]) -> int:
    return 0
