"""The contract between the flow's "draft" step and whatever writes the draft.

A model turns OpenAI chat-format messages into a :class:`Draft`: an email
subject, a body and a one-line summary. The interface is the draft step's
(:class:`durable_agents.steps.ports.LanguageModel`); this package implements it. The messages are, in order, one system
message, the earlier turns of the conversation (user and assistant messages,
possibly assistant ``tool_calls`` and ``tool`` results) taken from the bounded
conversation memory, and the task as the last user message.

A :class:`Draft` is valid by construction: ``Draft(...)`` and
:meth:`Draft.from_dict` refuse anything that breaks the rules below, so a Draft
that exists can be sent as an email without further checks.

- ``subject``, ``body`` and ``summary`` are non-empty strings (after stripping
  surrounding whitespace) and contain no NUL character.
- The text rule of the input limits (``durable_agents.steps.controls``): ``subject`` (an
  email header) and ``summary`` are single-line printable text, with no
  control character (tab included), DEL or bidirectional override/isolate
  character; ``body`` is multi-line text, where newline and tab are allowed.
  Refused, never mended: a model that writes an escape sequence into a
  subject is not corrected by deleting bytes from it.
- ``subject`` is a single line: a line break in it is *refused*, not mended,
  because it becomes an email header and a model that puts a line break there
  has misread the format (the OpenAI client then asks the model again).
- ``summary`` is a single line. :func:`make_draft` *collapses* its whitespace
  (line breaks included) into single spaces, since a summary that wraps is a
  harmless and common model habit; ``Draft(...)`` itself refuses line breaks.
- ``len(subject) <= MAX_SUBJECT_CHARS``, ``len(body) <= MAX_BODY_CHARS``,
  ``len(summary) <= MAX_SUMMARY_CHARS`` (from :mod:`durable_agents.steps.limits`).

Use :func:`make_draft` for text from outside (a model's answer): it strips and
collapses as described, then builds a checked Draft.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from durable_agents.steps.limits import (
    MAX_BODY_CHARS,
    MAX_SUBJECT_CHARS,
    MAX_SUMMARY_CHARS,
    InputError,
    check_text,
    has_line_break,
)
from durable_agents.steps.ports import LanguageModel  # the port this package implements; re-exported for its users

__all__ = ["Draft", "DraftError", "LanguageModel", "make_draft", "message_text"]

DRAFT_FIELDS = ("subject", "body", "summary")

_WHITESPACE = re.compile(r"\s+")


class DraftError(ValueError):
    """A draft breaks the rules in this module's docstring; the message says which."""


@dataclass(frozen=True)
class Draft:
    """A checked reply: construction raises :class:`DraftError` if a rule is broken."""

    subject: str
    body: str
    summary: str

    def __post_init__(self) -> None:
        _check_text("subject", self.subject, MAX_SUBJECT_CHARS, single_line=True)
        _check_text("body", self.body, MAX_BODY_CHARS, single_line=False)
        _check_text("summary", self.summary, MAX_SUMMARY_CHARS, single_line=True)

    def to_dict(self) -> dict[str, str]:
        return {"subject": self.subject, "body": self.body, "summary": self.summary}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Draft:
        """Rebuild a Draft from :meth:`to_dict` output (e.g. a recorded step result).

        Strict: nothing is mended, so a stored draft reads back exactly as it
        was written or not at all. Unknown keys are ignored.
        """
        if not isinstance(data, Mapping):
            raise DraftError(f"a draft must be a JSON object, got {type(data).__name__}")
        missing = [f for f in DRAFT_FIELDS if f not in data]
        if missing:
            raise DraftError(f"a draft needs subject, body and summary; missing: {', '.join(missing)}")
        return cls(subject=data["subject"], body=data["body"], summary=data["summary"])


def make_draft(subject: Any, body: Any, summary: Any) -> Draft:
    """Build a Draft from outside text: strip all three, collapse the summary's whitespace.

    The subject's inner line breaks are not mended (see the module docstring);
    a string that is too long is refused, never cut, so no half sentence is sent.
    """
    for field, value in (("subject", subject), ("body", body), ("summary", summary)):
        if not isinstance(value, str):
            raise DraftError(f"{field} must be a string, got {type(value).__name__}")
    return Draft(
        subject=subject.strip(),
        body=body.strip(),
        summary=_WHITESPACE.sub(" ", summary).strip(),
    )


def _check_text(field: str, value: object, max_chars: int, *, single_line: bool) -> None:
    if not isinstance(value, str):
        raise DraftError(f"{field} must be a string, got {type(value).__name__}")
    if not value.strip():
        raise DraftError(f"{field} is empty")
    try:
        # NUL, CR and LF included: the message names the character and where it is.
        check_text(field, value, multiline=not single_line, what_to_do="")
    except InputError as err:
        raise DraftError(str(err)) from None
    if single_line and has_line_break(value):  # what is left: U+2028, U+2029
        raise DraftError(f"{field} must be a single line, without line breaks")
    if len(value) > max_chars:
        raise DraftError(f"{field} is {len(value)} characters; the limit is {max_chars}")


def message_text(message: Mapping[str, Any]) -> str:
    """The text of one chat message: a plain string, or the text parts of a list.

    Assistant messages that only carry ``tool_calls`` have no text (``""``).
    """
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [
            part.get("text", "")
            for part in content
            if isinstance(part, Mapping) and part.get("type") == "text" and isinstance(part.get("text"), str)
        ]
        return "\n".join(parts)
    return ""
