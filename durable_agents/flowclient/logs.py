"""Log set-up for the worker: ``--verbose`` for diagnostics, never for payloads.

``--verbose`` puts the root logger at DEBUG, for the SDK's own account of
tasks, polls and evictions. Some libraries write what a run carries at DEBUG,
and a worker's output ends up in terminals, CI logs and log shippers, where
the payload codec (``payloadcodec``) does not reach:

- HTTP clients: ``openai`` (some versions log each request's options, the
  prompt included: the task and the conversation memory), ``httpx`` and
  ``httpcore`` (and ``httpx2``/``httpcore2``, which recent ``openai`` versions
  use). Capped at INFO: a request line (method, URL, status) stays, bodies go.
- The SDK dumps an activity's completion (its result payloads, in clear when
  the codec is off) and heartbeat details at DEBUG. A filter on the handler
  replaces any protobuf message passed as a log argument, and heartbeat
  details, with a note; the line itself stays.
- The SDK logs the traceback of a failed activity attempt (WARNING, at any
  level) and of a workflow that raised its failure (DEBUG). Those messages
  are the application's and can quote a value: the provider's refusal names
  the address (which is why the codec encrypts failure messages in history).
  The traceback is kept, frames and exception types, with each message
  replaced by a note; the run's error, message included, is in history, where
  ``starter.py status`` shows it. Workflow-task failures (the codec's refusals,
  non-determinism) keep their messages: they name ids and keys, not values.

Without ``--verbose``: INFO, and the per-request lines of ``httpx`` off too (one
per provider call drowns the step lines).

Every line is formatted by ``PrintableFormatter`` (``durable_agents.steps.controls``, which
every command's ``basic_config`` installs; this module adds the filters
above for the worker and the starter): a message that quotes run
data (a refusal naming a subject, a model's answer, an SDK message with a
value in it) shows control and bidirectional characters escaped
(``durable_agents.steps.controls.printable``), so a log read in a terminal cannot be made to
clear it, retitle it or colour it, and a message's own newline cannot forge a
second log line. Tracebacks keep their newlines. The cost when there is
nothing to escape is one regex search per line.
"""

from __future__ import annotations

import logging
import traceback

from google.protobuf.message import Message

from durable_agents.steps.controls import LOG_FORMAT as FORMAT
from durable_agents.steps.controls import PrintableFormatter, basic_config

__all__ = ["FORMAT", "NoPayloadsInLogs", "PrintableFormatter", "basic_config", "configure_logging",
           "traceback_without_messages"]

BODY_LOGGERS = ("openai", "httpx", "httpcore", "httpx2", "httpcore2")
REQUEST_LINE_LOGGERS = ("httpx", "httpx2")
_HEARTBEAT = "Recording heartbeat with details %s"  # temporalio.worker._activity, SDK 1.35


# (logger, message start) of the SDK's records whose traceback is an application failure (SDK 1.35).
APPLICATION_FAILURES = (
    ("temporalio.activity", "Completing activity as failed"),
    ("temporalio.worker._workflow_instance", "Workflow raised failure"),
    ("temporalio.worker._workflow_instance", "Update raised failure"),
)
_NO_MESSAGE = "(message not logged: it may quote payload values; `starter.py status RUN_ID` shows the run's error)"


def traceback_without_messages(error: BaseException) -> str:
    """The traceback text Python would print, with every exception's message left out."""
    chain: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and all(current is not seen for seen in chain):
        chain.append(current)
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)
    parts: list[str] = []
    oldest_first = chain[::-1]
    for n, exc in enumerate(oldest_first):
        if n:
            parts.append("\nThe above exception was the direct cause of the following exception:\n\n"
                         if exc.__cause__ is oldest_first[n - 1] else
                         "\nDuring handling of the above exception, another exception occurred:\n\n")
        parts.append("Traceback (most recent call last):\n")
        parts.extend(traceback.format_tb(exc.__traceback__))
        parts.append(f"{type(exc).__module__}.{type(exc).__qualname__}: {_NO_MESSAGE}\n")
    return "".join(parts).rstrip("\n")


class NoPayloadsInLogs(logging.Filter):
    """Keeps a record but not the payloads in its arguments, nor the messages of an application failure."""

    def filter(self, record: logging.LogRecord) -> bool:
        application_failure = any(record.name == name and str(record.msg).startswith(start)
                                  for name, start in APPLICATION_FAILURES)
        if application_failure and record.exc_info and record.exc_info[1] is not None:
            # The formatter prints exc_text when it is set, instead of formatting exc_info.
            record.exc_text = traceback_without_messages(record.exc_info[1])
        if record.msg == _HEARTBEAT:
            record.args = ("(not logged: they may hold payloads)",)
        elif isinstance(record.args, tuple) and any(isinstance(arg, Message) for arg in record.args):
            record.args = tuple(
                f"<{type(arg).__name__}, not logged: it may hold payloads>" if isinstance(arg, Message) else arg
                for arg in record.args
            )
        return True


def configure_logging(verbose: bool) -> None:
    basic_config(logging.DEBUG if verbose else logging.INFO)
    for handler in logging.getLogger().handlers:
        handler.addFilter(NoPayloadsInLogs())
    if verbose:
        for name in BODY_LOGGERS:
            logging.getLogger(name).setLevel(logging.INFO)
    else:
        for name in REQUEST_LINE_LOGGERS:
            logging.getLogger(name).setLevel(logging.WARNING)
