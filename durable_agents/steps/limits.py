"""Input limits and checks, shared by the starter, the workflow boundary and
the hand-rolled runner, so that every entry point rejects the same bad input
with the same words. The provider applies the same limits in its own code
(``provider.validation``); docs/provider-contract.md is the table both sides
are tested against.

Each ``check_*`` function returns the cleaned value or raises ``InputError``
with a message that says what is wrong and what to do about it.

Control characters (``durable_agents.steps.controls``): ``check_text`` refuses them, naming
the field, the character and its position; the ``check_*`` functions below
apply that text rule first, and the field's own shape (length, pattern)
after; ``text_rule=False`` checks the shape alone.
"""

from __future__ import annotations

import re

from durable_agents.steps.controls import char_label, find_control

# The workflow checks the task, the address, the run id and the conversation id
# again on every replay: tightening one of those limits (or their patterns) needs
# ``workflow.patched``, or runs in flight that it now refuses park
# (tests/test_workflow_bounds.py pins them).
MAX_TASK_CHARS = 4000
"""A task is a request to an agent, not a document: 4,000 characters keeps
workflow inputs and history small (Temporal fails a payload above 2 MB)."""

MAX_EMAIL_CHARS = 254
"""RFC 5321's limit on a forward path, less the angle brackets."""

MAX_RUN_ID_CHARS = 64
MAX_CONVERSATION_ID_CHARS = 128
MAX_SUBJECT_CHARS = 200
MAX_BODY_CHARS = 20000
MAX_SUMMARY_CHARS = 500
MAX_ARGUMENTS_CHARS = 8000
"""A tool call's arguments, as the model wrote them (JSON text): a longer call is refused back to the model
(``durable_agents.steps.loop.recorded_calls``), and the loop's email body is derived from it
(``durable_agents.steps.refund_agent``)."""

_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
# Deliberately simple: one @, a dot in the domain, no spaces, no quotes or
# angle brackets. It refuses some exotic valid addresses; it never lets through
# something that could break a header.
_EMAIL = re.compile(r"[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]+@[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
                    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)+")


class InputError(ValueError):
    """Bad input, refused before anything starts. The message says what to do."""


def has_line_break(value: str) -> bool:
    """True if ``value`` holds a character that ends a header line.

    CR and LF are the classic injection; the Unicode line separators are
    refused too because some mail libraries fold them into line breaks.
    """
    return any(ch in value for ch in "\r\n\x0b\x0c\x85\u2028\u2029")


MULTILINE_RULE = ("control characters (C0 and C1) other than newline and tab, DEL, bidirectional "
                  "override/isolate characters and bytes that are not UTF-8 are refused")
SINGLE_LINE_RULE = ("the field is a single line of printable text: control characters (C0 and C1, newline and "
                    "tab included), DEL, bidirectional override/isolate characters and bytes that are not UTF-8 "
                    "are refused")
"""The rule, as refusals quote it (docs/commands.md, "Input limits and control characters", states it in full)."""


def check_text(field: str, value: str, *, multiline: bool = False,
               what_to_do: str = "Remove it and try again") -> str:
    """Refuse the rule's control characters in ``value`` (``durable_agents.steps.controls``).

    ``multiline``: newline (LF or CR LF) and tab are text, as in a task or an
    email body; otherwise the field is single-line printable text. The
    message names the field, the character (``U+001B (ESC)``) and its
    position counting from 1, then the rule and ``what_to_do``.
    """
    found = find_control(value, multiline=multiline)
    if found is not None:
        position, ch = found
        rule = MULTILINE_RULE if multiline else SINGLE_LINE_RULE
        raise InputError(f"{field} holds {char_label(ch)} at position {position}: {rule}"
                         + (f". {what_to_do}" if what_to_do else ""))
    return value


def check_single_line(field: str, value: str, max_chars: int) -> str:
    if not isinstance(value, str):
        raise InputError(f"{field} must be a string, got {type(value).__name__}")
    if has_line_break(value):
        raise InputError(f"{field} must be a single line: remove the line breaks (CR/LF) from it")
    if "\x00" in value:
        raise InputError(f"{field} must not contain NUL characters")
    if len(value) > max_chars:
        raise InputError(f"{field} is {len(value)} characters; the limit is {max_chars}")
    return value


def check_run_id(run_id: str, *, text_rule: bool = True) -> str:
    if not isinstance(run_id, str) or not run_id:
        raise InputError("run id is empty: give a name such as order-1234")
    if text_rule:
        check_text("run id", run_id)
    check_single_line("run id", run_id, MAX_RUN_ID_CHARS)
    if not _RUN_ID.fullmatch(run_id):
        raise InputError(
            f"run id {run_id!r} may hold only letters, digits, '.', '_' and '-', "
            "and must start with a letter or digit"
        )
    return run_id


def check_conversation_id(conversation_id: str, *, text_rule: bool = True) -> str:
    if not isinstance(conversation_id, str) or not conversation_id:
        raise InputError("conversation id is empty: give one, or leave it out to use the run id")
    if text_rule:
        check_text("conversation id", conversation_id)
    check_single_line("conversation id", conversation_id, MAX_CONVERSATION_ID_CHARS)
    if not _RUN_ID.fullmatch(conversation_id):
        raise InputError(
            f"conversation id {conversation_id!r} may hold only letters, digits, '.', '_' and '-'"
        )
    return conversation_id


def check_task(task: str, *, text_rule: bool = True) -> str:
    if not isinstance(task, str):
        raise InputError(f"task must be text, got {type(task).__name__}")
    if text_rule:
        # Before stripping: the position counts from the task as given.
        check_text("task", task, multiline=True)
    stripped = task.strip()
    if not stripped:
        raise InputError('task is empty: describe what the agent should do, e.g. "Confirm the refund for order 1234"')
    if len(task) > MAX_TASK_CHARS:
        raise InputError(
            f"task is {len(task)} characters; the limit is {MAX_TASK_CHARS}. "
            "Put long material somewhere the agent can fetch it and pass a reference instead."
        )
    if "\x00" in task:
        raise InputError("task must not contain NUL characters")
    return stripped


def check_email(address: str, *, text_rule: bool = True) -> str:
    if not isinstance(address, str) or not address:
        raise InputError("email address is empty: give one with --email, e.g. --email ada@example.com")
    if text_rule:
        check_text("email address", address)
    check_single_line("email address", address, MAX_EMAIL_CHARS)
    if not _EMAIL.fullmatch(address):
        raise InputError(f"email address {address!r} is malformed: expected something like ada@example.com")
    return address
