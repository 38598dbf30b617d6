"""How a run's status (the shape of ``durable_agents.steps.runstate``) is shown, the same on
every engine: a plain table (``render_table``, the same in a terminal and a
log), a live rich table for a terminal (``rich_table``), and one line per
change while a run is followed (``step_ticker``).

Every value shown is run data (the task's words in a subject, a provider's
refusal, an error from history, recorded before or after the text rule), so
each rendered line goes through ``durable_agents.steps.controls.printable``: control and
bidirectional characters are shown escaped (``\\x1b``), never sent to the
terminal; the rich table's cells are escaped for rich's markup too. JSON is
printed by ``json.dumps``, whose escapes are exact.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from durable_agents.steps.controls import printable
from durable_agents.steps.runstate import JsonValue, RunEntry, StepStateName, clock

if TYPE_CHECKING:
    from rich.table import Table


def render_table(status: RunEntry) -> str:
    """A readable table, plain text so it is the same in a terminal and a log."""
    lines = [f"run {status['run_id']}: {status['status']}"
             + (f", current step {status['current_step']}" if status["current_step"] else "")]
    lines.append(f"  {'#':<2} {'step':<18} {'status':<10} {'attempts':>12}  result")
    for i, step in enumerate(status["steps"], 1):
        result = step["result"]
        shown = "" if result is None else short_result(result)
        crashes = step.get("crashes") or 0
        attempts = f"{step['attempts']}" + (f" ({crashes} crash{'es' if crashes > 1 else ''})" if crashes else "")
        lines.append(f"  {i:<2} {step['name']:<18} {step['status']:<10} {attempts:>12}  {shown}".rstrip())
        if step["status"] in ("retrying", "in_doubt", "failed") and step.get("last_error"):
            lines.append(f"  {'':<2} {'':<18} last error: {step['last_error']}")
        if step["status"] == "retrying" and step.get("next_try_at"):
            lines.append(f"  {'':<2} {'':<18} next try at {clock(step['next_try_at'])} UTC")
        if step.get("note"):
            lines.append(f"  {'':<2} {'':<18} {step['note']}")
    if status.get("detail"):
        lines.append(f"  now: {status['detail']}")
    if status.get("error"):
        lines.append(f"  error: {status['error']}")
    # One line each: a value's own newline is escaped too, so data cannot forge a row.
    return "\n".join(printable(line) for line in lines)


def short_result(result: JsonValue) -> str:
    if not isinstance(result, dict):
        return json.dumps(result)
    # The ids an effect's result holds (message_id, ticket_id, refund_id: whatever its kind), a draft's subject.
    keys = [k for k in result if k.endswith("_id") and k != "run_id"] + ["subject"]
    parts = [f"{k}={result[k]}" for k in keys if k in result]
    if result.get("adopted"):
        parts.append("adopted")
    elif result.get("replayed"):
        parts.append("replayed")
    text = ", ".join(parts) or json.dumps(result)
    return text if len(text) <= 70 else text[:67] + "..."


def step_ticker(indent: str = "  ") -> Callable[[RunEntry], None]:
    """An ``on_change`` callback that prints one line each time a step changes status or attempt."""
    seen: dict[str, tuple[StepStateName, int]] = {}

    def tick(status: RunEntry) -> None:
        for step in status["steps"]:
            now = (step["status"], step["attempts"])
            if seen.get(step["name"]) != now:
                seen[step["name"]] = now
                if step["status"] != "pending":
                    extra = ""
                    if step["status"] == "retrying":
                        extra = f"; next try at {(step.get('next_try_at') or '?')[11:19]} UTC: {step.get('last_error')}"
                    print(printable(f"{indent}{time.strftime('%H:%M:%S')} {step['name']}: {step['status']}"
                                    f" (attempt {step['attempts']}{extra})"), flush=True)
        if status["status"] == "parked":
            print(printable(f"{indent}{time.strftime('%H:%M:%S')} parked: {status.get('detail')}"), flush=True)

    return tick


_STEP_STYLE: dict[StepStateName, str] = {
    "pending": "dim", "running": "bold yellow", "waiting": "yellow", "retrying": "bold magenta",
    "completed": "green", "adopted": "green", "failed": "bold red", "in_doubt": "bold red"}


def _cell(value: object) -> str:
    """Run data for a rich cell: control characters escaped, and rich's markup too."""
    from rich.markup import escape

    return escape(printable(value))


def rich_table(status: RunEntry, caption: str | None = None) -> Table:
    """The same table as ``render_table``, for a terminal: rich, updated in place.
    ``caption`` (e.g. the run's page in a UI) goes under it."""
    from rich.console import JustifyMethod
    from rich.table import Table

    title = _cell(f"run {status['run_id']}: {status['status']}")
    table = Table(title=title, title_justify="left", caption=caption, caption_justify="left")
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("#", "right"), ("step", "left"), ("status", "left"), ("attempts", "right"), ("result", "left"))
    for column, justify in columns:
        table.add_column(column, justify=justify)
    for i, step in enumerate(status["steps"], 1):
        style = _STEP_STYLE.get(step["status"], "")
        mark = {"running": "> ", "retrying": "~ ", "waiting": "… ", "completed": "ok ", "adopted": "ok ",
                "failed": "x ", "in_doubt": "? "}.get(step["status"], "  ")
        result = "" if step["result"] is None else short_result(step["result"])
        if step["status"] == "retrying":
            result = f"next try {(step.get('next_try_at') or '?')[11:19]} UTC: {step.get('last_error') or ''}"
        table.add_row(str(i), _cell(step["name"]), f"[{style}]{mark}{_cell(step['status'])}[/]",
                      str(step["attempts"]), _cell(result))
    if status.get("detail"):
        table.add_row("", "", "[yellow]now[/]", "", _cell(status["detail"]))
    if status.get("error"):
        table.add_row("", "", "[bold red]error[/]", "", _cell(status["error"]))
    return table
