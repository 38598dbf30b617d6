"""Entry points for the flow: open a store, and read or write without ever stopping a run."""

from __future__ import annotations

import logging
import os
import sqlite3
from pathlib import Path
from typing import Any

from durable_agents.memory.errors import MemoryStoreError
from durable_agents.memory.messages import Message
from durable_agents.memory.policy import MemoryPolicy
from durable_agents.memory.sqlite_store import SQLiteStore, appended_after, load_conversation
from durable_agents.memory.stores import EvictionHook, InMemoryStore, Store
from durable_agents.memory.window import AppendResult

__all__ = ["append_or_warn", "open_store", "read_context", "read_window"]

log = logging.getLogger("memory")


def open_store(
    path: str | os.PathLike[str] | None,
    policy: MemoryPolicy | None = None,
    *,
    on_evict: EvictionHook | None = None,
    synchronous: str = "FULL",
) -> Store:
    """A :class:`SQLiteStore` at ``path`` at ``synchronous`` (FULL: a committed append survives a power cut),
    or an :class:`InMemoryStore` when ``path`` is None.

    Raises :class:`durable_agents.memory.MemoryStoreError` if the file cannot be used; a
    caller that must carry on regardless can fall back to
    ``open_store(None, policy)``.
    """
    if path is None:
        return InMemoryStore(policy, on_evict=on_evict)
    return SQLiteStore(path, policy, on_evict=on_evict, synchronous=synchronous)


def read_window(
    source: Store | str | os.PathLike[str] | None,
    conversation_id: str,
    *,
    include_pinned: bool = True,
    as_of: float | None = None,
) -> list[Message]:
    """The window of ``conversation_id``, or ``[]`` with a warning if the store is unusable.

    ``as_of`` (Unix seconds) leaves out what was appended after it, whole
    blocks at a time: the window as a run that started then would see it, as
    long as memory still holds it (eviction is not undone).

    ``source`` is an open store, or the path of a SQLite store file, which is
    opened read-only for this one call and never created. A missing file or
    directory, a file that is not a store (garbage bytes, another program's
    database), a locked or unreadable file, or a store object that raises: all
    give an empty context and one warning on the ``memory`` logger. Memory
    informs prompts; it must never stop a run. ``None`` gives ``[]`` quietly
    (no memory configured).
    """
    if source is None:
        return []
    try:
        if isinstance(source, (str, os.PathLike)):
            return _read_file(os.fspath(source), conversation_id, include_pinned, as_of)
        if as_of is None:
            return list(source.window(conversation_id, include_pinned=include_pinned))
        return list(source.window(conversation_id, include_pinned=include_pinned, as_of=as_of))
    except Exception as exc:  # noqa: BLE001 - by contract, nothing from the store escapes
        log.warning(
            "conversation memory unavailable (%s: %s); using an empty context for conversation %r",
            type(exc).__name__,
            exc,
            conversation_id,
        )
        return []


def read_context(
    source: Store | str | os.PathLike[str] | None,
    conversation_id: str,
    *,
    include_pinned: bool = True,
    as_of: float | None = None,
) -> list[dict[str, Any]]:
    """:func:`read_window` as OpenAI chat-format dicts, ready to put in a prompt. Never raises for store problems."""
    return [m.to_chat() for m in read_window(source, conversation_id, include_pinned=include_pinned, as_of=as_of)]


def _read_file(path: str, conversation_id: str, include_pinned: bool, as_of: float | None = None) -> list[Message]:
    file = Path(path)
    if not file.is_file():
        raise MemoryStoreError(f"no conversation memory file at {path}")
    # mode=ro: a reader never creates, migrates or repairs anything.
    conn = sqlite3.connect(file.resolve().as_uri() + "?mode=ro", uri=True, timeout=2.0, isolation_level=None)
    try:
        conn.execute("BEGIN")
        conv = load_conversation(conn, conversation_id, MemoryPolicy())
        hide = appended_after(conn, conversation_id, as_of)
        conn.execute("COMMIT")
        return conv.window(include_pinned, hide)
    finally:
        conn.close()


def append_or_warn(store: Store, conversation_id: str, message: Message) -> AppendResult | None:
    """``store.append``, except that store failures give ``None`` and a warning.

    For writers that must not fail a run because memory is unavailable (disk
    full, file damaged, lock held too long). Refused *input* still raises
    (:class:`durable_agents.memory.MemoryInputError`): that is a bug in the caller, and hiding
    it would lose context silently.
    """
    try:
        return store.append(conversation_id, message)
    except (MemoryStoreError, sqlite3.Error, OSError) as exc:
        log.warning(
            "conversation memory unavailable (%s: %s); message %r was not remembered in conversation %r",
            type(exc).__name__,
            exc,
            message.id,
            conversation_id,
        )
        return None
