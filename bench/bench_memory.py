"""Benchmark of the conversation memory (a script, not a test).

    .venv/bin/python bench/bench_memory.py [--appends 100000] [--sqlite-appends 20000] [--repeat 3]

Measured side by side in one run, on the same pre-built messages:

- ``deque``: ``collections.deque(maxlen=max_messages).append`` — the floor: no
  token accounting, no exchanges, no idempotence, no eviction rule.
- ``deque+tokens``: the same deque plus a running token total with the default
  counter, popping from the left while over the budget — what the cheapest
  token-bounded buffer costs (it still orphans tool results).
- ``InMemoryStore``: the real thing, eviction included.
- ``SQLiteStore``: the real thing on a file (WAL, synchronous=NORMAL, the level
  these figures were first taken at: the store's work without an fsync per
  commit; memory's default, FULL, adds one, measured per exchange by
  bench_sync_levels.py), with every statement traced to count transactions
  per append.

Each figure is the best of ``--repeat`` runs. Then the token estimator is
measured against the provable bounds described in durable_agents/memory/tokens.py.
"""

from __future__ import annotations

import argparse
import collections
import inspect
import json
import os
import platform
import random
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from durable_agents.memory import InMemoryStore, MemoryPolicy, Message, SQLiteStore, ToolCall, approx_tokens  # noqa: E402
from durable_agents.memory.tokens import estimate_text_tokens, pretokenizer_pieces  # noqa: E402

POLICY = MemoryPolicy(max_tokens=4000, max_messages=50)
WORDS = "the order refund customer email ticket please confirm status shipped invoice address".split()


def conversation(n: int, seed: int = 1) -> list[Message]:
    """``n`` messages: user turns, tool rounds of 1-3 calls, replies; sizes from 0 to ~6 KB."""
    rng = random.Random(seed)
    out: list[Message] = []

    def text(chars: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(chars // 6 + 1))[:chars]

    turn = 0
    while len(out) < n:
        turn += 1
        out.append(Message(f"u{turn}", "user", text(rng.choice((20, 80, 300, 1200)))))
        for r in range(rng.choice((0, 1, 1, 2))):
            calls = tuple(
                ToolCall(f"c{turn}.{r}.{k}", "lookup_order", json.dumps({"order": rng.randint(1, 9999), "q": text(40)}))
                for k in range(rng.choice((1, 1, 2, 3)))
            )
            out.append(Message(f"a{turn}.{r}", "assistant", "", calls))
            for call in calls:
                out.append(Message(f"t{call.id}", "tool", text(rng.choice((50, 400, 2000, 6000))),
                                   tool_call_id=call.id))
        out.append(Message(f"a{turn}", "assistant", text(rng.choice((40, 200, 800)))))
    return out[:n]


def complete(messages: list[Message]) -> list[Message]:
    """Cut the list after a finished exchange (so no round is left open at the end)."""
    while messages and (messages[-1].role != "assistant" or messages[-1].tool_calls):
        messages = messages[:-1]
    return messages


def best(repeat: int, fn) -> float:
    return min(fn() for _ in range(repeat))


def run_deque(messages: list[Message]) -> float:
    d: collections.deque = collections.deque(maxlen=POLICY.max_messages)
    append = d.append
    t = time.perf_counter()
    for m in messages:
        append(m)
    return time.perf_counter() - t


def run_deque_tokens(messages: list[Message]) -> float:
    d: collections.deque = collections.deque()
    counter, budget, cap = POLICY.token_counter, POLICY.max_tokens, POLICY.max_messages
    total = 0
    t = time.perf_counter()
    for m in messages:
        n = counter(m)
        d.append((m, n))
        total += n
        while total > budget or len(d) > cap:
            total -= d.popleft()[1]
    return time.perf_counter() - t


def run_store(make, messages: list[Message]) -> tuple[float, object]:
    store = make()
    append = store.append
    t = time.perf_counter()
    for m in messages:
        append("bench", m)
    elapsed = time.perf_counter() - t
    return elapsed, store


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--appends", type=int, default=100_000)
    parser.add_argument("--sqlite-appends", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    messages = complete(conversation(args.appends))
    sql_messages = complete(conversation(args.sqlite_appends, seed=2))
    n, ns = len(messages), len(sql_messages)

    print(f"machine: {os.cpu_count()} CPUs (nproc), {platform.machine()}, {platform.system()} {platform.release()}")
    print(f"python {platform.python_version()}, sqlite {sqlite3.sqlite_version}")
    print(f"policy: max_tokens={POLICY.max_tokens}, max_messages={POLICY.max_messages}, default counter")
    print()

    t_deque = best(args.repeat, lambda: run_deque(messages))
    t_dtok = best(args.repeat, lambda: run_deque_tokens(messages))
    mem_runs = [run_store(lambda: InMemoryStore(POLICY), messages) for _ in range(args.repeat)]
    t_mem = min(t for t, _ in mem_runs)
    mem_stats = mem_runs[0][1].stats("bench")

    sql_runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeat):
            statements: list[str] = []

            def make(i=i, statements=statements):
                store = SQLiteStore(Path(tmp) / f"bench{i}.db", POLICY, synchronous="NORMAL")
                store._conn.set_trace_callback(statements.append)
                return store

            elapsed, store = run_store(make, sql_messages)
            store._conn.set_trace_callback(None)
            sql_stats = store.stats("bench")
            commits = sum(1 for s in statements if s == "COMMIT")
            begins = sum(1 for s in statements if s.startswith("BEGIN"))
            rows = store._conn.execute("SELECT COUNT(*) FROM messages").fetchone()[0]
            sql_runs.append((elapsed, commits, begins, store.transactions, rows))
            store.close()
    t_sql, commits, begins, counted, rows = min(sql_runs)
    per_deque = t_deque / n  # ratios compare time per append, so runs of different lengths compare fairly

    def row(name: str, count: int, seconds: float) -> str:
        ratio = seconds / count / per_deque
        return f"| {name:<24} | {count:>8,} | {seconds:8.3f} | {count / seconds:>12,.0f} | {ratio:>20,.1f}x |"

    print("| store                    |  appends |      s   |  appends/s   | vs deque (per append) |")
    print("|--------------------------|---------:|---------:|-------------:|----------------------:|")
    print(row("deque (maxlen)", n, t_deque))
    print(row("deque + token budget", n, t_dtok))
    print(row("InMemoryStore", n, t_mem))
    print(row("SQLiteStore (file, WAL)", ns, t_sql))
    print()
    print(f"InMemoryStore / deque+tokens: {t_mem / t_dtok:.1f}x per append")
    print(f"SQLiteStore / InMemoryStore: {(t_sql / ns) / (t_mem / n):.0f}x per append")
    print(
        f"InMemoryStore evicted {mem_stats.evicted_messages:,} messages "
        f"({mem_stats.evicted_tokens:,} tokens), truncated {mem_stats.truncated}; "
        f"window {mem_stats.messages} messages / {mem_stats.tokens} tokens"
    )
    print(
        f"SQLiteStore: {ns:,} appends, {begins:,} BEGIN and {commits:,} COMMIT statements traced, "
        f"store.transactions={counted:,} -> {commits / ns:.3f} transactions per append; "
        f"{rows} rows in messages at the end (evicted {sql_stats.evicted_messages:,})"
    )
    print()
    estimator_table()


def corpus() -> dict[str, list[str]]:
    """Texts we can reason about: stdlib docstrings (English prose), stdlib source (code), JSON arguments."""
    import argparse as m1
    import asyncio as m2
    import collections as m3
    import email as m4
    import http.client as m5
    import inspect as m12
    import json as m6
    import logging as m7
    import pathlib as m8
    import random as m11
    import sqlite3 as m9
    import textwrap as m10

    modules = [m1, m2, m3, m4, m5, m6, m7, m8, m9, m10, m11, m12]
    prose, code = [], []
    for module in modules:
        for _, obj in inspect.getmembers(module):
            doc = inspect.getdoc(obj)
            if doc and len(doc) > 200:
                prose.append(doc)
        source = inspect.getsource(module)
        # Whole 2,000-character chunks only: a 20-character tail is not a message anyone sends.
        code.extend(source[i : i + 2000] for i in range(0, len(source) - 1999, 2000))
    rng = random.Random(3)
    args = [
        json.dumps(
            {
                "order_id": rng.randint(1, 99999),
                "email": f"user{rng.randint(1, 999)}@example.com",
                "items": [{"sku": f"SKU-{rng.randint(100, 999)}", "qty": rng.randint(1, 5)}
                          for _ in range(rng.randint(1, 5))],
                "note": "please confirm the refund",
            }
        )
        for _ in range(300)
    ]
    return {"English prose": sorted(set(prose)), "Python source": code, "JSON arguments": args}


def estimator_table() -> None:
    print("Token estimate vs provable bounds (L = cl100k-style pre-tokenizer pieces <= true tokens <= U = UTF-8 bytes)")
    print("| text class      | texts |  chars | est/L mean | est/L min | est/L max | est/U mean |")
    print("|-----------------|------:|-------:|-----------:|----------:|----------:|-----------:|")
    for name, texts in corpus().items():
        ratios = [estimate_text_tokens(t) / max(1, pretokenizer_pieces(t)) for t in texts]
        est = sum(map(estimate_text_tokens, texts))
        low = sum(map(pretokenizer_pieces, texts))
        up = sum(len(t.encode()) for t in texts)
        chars = sum(map(len, texts))
        print(
            f"| {name:<15} | {len(texts):>5} | {chars:>6,} | {est / low:>10.2f} | {min(ratios):>9.2f} | "
            f"{max(ratios):>9.2f} | {est / up:>10.2f} |"
        )
    under = sum(
        1 for texts in corpus().values() for t in texts if estimate_text_tokens(t) < pretokenizer_pieces(t)
    )
    total = sum(len(v) for v in corpus().values())
    print(f"texts where the estimate is below the lower bound (a certain undercount): {under} of {total}")
    m = Message("x", "assistant", "", (ToolCall("call_1", "lookup_order", '{"order": 1}'),))
    print(f"example: an assistant message with one small tool call counts {approx_tokens(m)} tokens")


if __name__ == "__main__":
    main()
