"""A deterministic stand-in for a language model, so the lab runs with no network."""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping
from typing import Any

from durable_agents.steps.errors import PermanentError
from durable_agents.steps.limits import MAX_SUBJECT_CHARS, MAX_SUMMARY_CHARS

from .base import Draft, DraftError, message_text

__all__ = ["OfflineModel"]

_WHITESPACE = re.compile(r"\s+")
_ELLIPSIS = "..."
# Generous for a task (limited to 4,000 characters upstream) yet far below the
# body limit, so a caller that skips the task check still gets a valid Draft.
_MAX_QUOTED_TASK_CHARS = 8000


class OfflineModel:
    """A stand-in, not a model: it writes a fixed-form polite reply from a template.

    Contract:

    - Deterministic: the same messages always give the same :class:`Draft`. No
      clock, no randomness, no network. The lab relies on this: a step that is
      re-run after a crash re-drafts, and the idempotency of the send depends on
      the second draft being identical to the first.
    - The task is the text of the last ``user`` message. Every non-system
      message before it counts as conversation context, and the body says how
      many there were, so a learner can watch the conversation memory feed the
      prompt from one run to the next.
    - Subject: ``"Re: <task>"``, whitespace collapsed, shortened at a word
      boundary with ``...`` to fit the subject limit. The summary is one line.

    Raises :class:`PermanentError` if there is no user message or it is empty,
    or if the template filled with the task breaks a rule of :class:`Draft`
    (a task with a control character, accepted before the text rule):
    retrying the same messages cannot help.

    ``vary=True`` (``LLM_OFFLINE_VARY=1``) gives up determinism on purpose: every
    call writes a differently worded subject, body and summary, as a real model
    does. The lab uses it to show that the flow stays live and exactly-once
    when a re-run step builds a different request (``durable_agents.steps.adoption``).
    """

    def __init__(self, *, vary: bool = False) -> None:
        self.vary = vary
        self.name = "offline-varying" if vary else "offline"

    async def draft(self, messages: list[dict]) -> Draft:
        task, context_count = _task_and_context(messages)
        one_line_task = _WHITESPACE.sub(" ", task).strip()
        variant = f" [draft {secrets.token_hex(3)}]" if self.vary else ""

        subject = _fit("Re: ", one_line_task, variant, MAX_SUBJECT_CHARS)

        quoted = task if len(task) <= _MAX_QUOTED_TASK_CHARS else task[:_MAX_QUOTED_TASK_CHARS].rstrip() + _ELLIPSIS
        quoted_lines = "\n".join(f"> {line}".rstrip() for line in quoted.splitlines())
        if context_count == 0:
            context_line = "This is the first message in this conversation, so I had no earlier messages as context."
        else:
            context_line = (
                f"I was given {_count(context_count)} from this conversation as context "
                "while writing this reply."
            )
        body = (
            "Hello,\n\n"
            "Thank you for your message. You asked:\n\n"
            f"{quoted_lines}\n\n"
            "I have noted this request and will follow up on it shortly.\n"
            f"{context_line}{variant}\n\n"
            "Kind regards,\n"
            "The offline drafting assistant"
        )

        summary = _fit("Drafted a reply to: ", one_line_task, f" ({_count(context_count)} of context){variant}",
                       MAX_SUMMARY_CHARS)
        try:
            return Draft(subject=subject, body=body, summary=summary)
        except DraftError as err:
            # Deterministic: asked again, it would write the same words. A task
            # checked by the input limits never gets here; one accepted before
            # the text rule (durable_agents.steps.controls) can.
            raise PermanentError(f"the offline model's draft breaks the rules for a draft: {err}") from None

    async def aclose(self) -> None:
        """Nothing to release; present so callers can close any model the same way."""

    def __repr__(self) -> str:
        return "OfflineModel(vary=True)" if self.vary else "OfflineModel()"


def _task_and_context(messages: list[dict]) -> tuple[str, int]:
    last_user = None
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if isinstance(message, Mapping) and message.get("role") == "user":
            last_user = index
            break
    if last_user is None:
        raise PermanentError("the draft step got no user message: the task must be the last user message")
    # NUL never reaches a Draft; everything else in the task is kept as written.
    task = message_text(messages[last_user]).replace("\x00", "").strip()
    if not task:
        raise PermanentError("the task (the last user message) is empty: describe what the agent should do")
    context_count = sum(1 for m in messages[:last_user] if _role(m) != "system")
    return task, context_count


def _role(message: Any) -> Any:
    return message.get("role") if isinstance(message, Mapping) else None


def _count(n: int) -> str:
    return f"{n} earlier message" if n == 1 else f"{n} earlier messages"


def _fit(prefix: str, text: str, suffix: str, limit: int) -> str:
    """``prefix + text + suffix`` within ``limit`` characters, cutting ``text`` at a word if needed."""
    room = limit - len(prefix) - len(suffix)
    if len(text) > room:
        cut = text[: room - len(_ELLIPSIS)]
        space = cut.rfind(" ")
        # Cut at a word only when that loses little; a very long word is just cut.
        if space >= len(cut) // 2:
            cut = cut[:space]
        text = cut.rstrip() + _ELLIPSIS
    return prefix + text + suffix
