"""Token counting: pluggable, with an honest default.

A token counter is any ``Callable[[Message], int]``. Pass one that wraps the
real tokenizer of your model (for example ``tiktoken``) as
``MemoryPolicy(token_counter=...)`` when the budget must match the provider's
count exactly. This package ships two that need nothing outside the stdlib:

``approx_tokens`` (the default) is an *estimate*. Per message it counts

- ``MESSAGE_OVERHEAD`` (4) tokens for the role and the chat-format framing
  (OpenAI's cookbook counts 3 per message plus the role's own token);
- the content, the ``tool_call_id`` of a tool result, and for each tool call
  ``TOOL_CALL_OVERHEAD`` (8) plus its id, name and *arguments*, each with
  :func:`estimate_text_tokens`: a quarter token per character, plus three
  quarters more for each ``"``, ``:`` and ``,`` (JSON and code split into
  short tokens around them; prose hardly has any), plus half a token per extra
  UTF-8 byte of non-ASCII characters (CJK comes out at 1.25 tokens per
  character, accented Latin at 0.75).

Its error cannot be bounded without the real tokenizer, so here is what is
known, and what ``bench/bench_memory.py`` measures (figures in docs/memory.md):

- A *provable lower bound* ``L`` on the token count of any byte-level BPE
  tokenizer with a GPT-style pre-tokenizer (cl100k_base and relatives): BPE
  never merges across the pre-tokenizer's split points, so the number of
  pieces is at most the number of tokens. :func:`pretokenizer_pieces`
  reimplements the cl100k split with the stdlib ``re`` (exact for ASCII; it
  approximates Unicode letter classes).
- A *provable upper bound* ``U``: every token is at least one byte, so the
  count is at most the UTF-8 length. :func:`upper_bound_tokens` counts that
  way (plus the same overheads); use it when the budget must never be
  exceeded whatever the tokenizer, at the price of overcounting English about
  four times.

The true count T of such a tokenizer satisfies L <= T <= U, so the estimate's
error is bounded by est/U <= est/T <= est/L, and nothing tighter can be proved
here. ``bench/bench_memory.py`` measures est/L on prose, code and JSON
(docs/memory.md has the figures): mostly above 1, below it, a certain
undercount, on a few texts. How far T sits above L depends on how many pieces
split into several tokens (rare or long words, long digit runs), which only
the real tokenizer knows. So: the estimate usually
overcounts and may undercount. Keep a margin between ``max_tokens`` and the
model's real limit (no size for it can be proved here; 25 % is our unproven
suggestion for English and JSON), or plug in the real tokenizer.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from durable_agents.memory.messages import Message

__all__ = [
    "MESSAGE_OVERHEAD",
    "TOOL_CALL_OVERHEAD",
    "TokenCounter",
    "approx_tokens",
    "estimate_text_tokens",
    "pretokenizer_pieces",
    "upper_bound_tokens",
]

TokenCounter = Callable[[Message], int]

MESSAGE_OVERHEAD = 4
TOOL_CALL_OVERHEAD = 8


def estimate_text_tokens(text: str) -> int:
    """Estimated tokens of ``text`` (see the module docstring for the formula)."""
    dense = text.count('"') + text.count(":") + text.count(",")
    if text.isascii():
        return (len(text) + 3 * dense + 3) // 4
    extra_bytes = len(text.encode("utf-8")) - len(text)
    return (len(text) + 3 * dense + 3) // 4 + (extra_bytes + 1) // 2


def approx_tokens(message: Message) -> int:
    """The default counter: an estimate that counts tool calls and framing."""
    n = MESSAGE_OVERHEAD + estimate_text_tokens(message.content)
    if message.tool_call_id is not None:
        n += estimate_text_tokens(message.tool_call_id)
    for call in message.tool_calls:
        n += (
            TOOL_CALL_OVERHEAD
            + estimate_text_tokens(call.id)
            + estimate_text_tokens(call.name)
            + estimate_text_tokens(call.arguments)
        )
    return n


def _utf8_len(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8"))


def upper_bound_tokens(message: Message) -> int:
    """A count no byte-level BPE tokenizer can exceed: one token per UTF-8 byte."""
    n = MESSAGE_OVERHEAD + _utf8_len(message.content)
    if message.tool_call_id is not None:
        n += _utf8_len(message.tool_call_id)
    for call in message.tool_calls:
        n += TOOL_CALL_OVERHEAD + _utf8_len(call.id) + _utf8_len(call.name) + _utf8_len(call.arguments)
    return n


# cl100k_base's pre-tokenizer with \p{L} spelled [^\W\d_] and \p{N} spelled \d.
_PIECES = re.compile(
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)"
    r"|(?:[^\w\r\n]|_)?[^\W\d_]+"
    r"|\d{1,3}"
    r"| ?(?:[^\w\s]|_)+[\r\n]*"
    r"|\s*[\r\n]+"
    r"|\s+(?!\S)"
    r"|\s+"
)


def pretokenizer_pieces(text: str) -> int:
    """How many pieces a cl100k-style pre-tokenizer cuts ``text`` into.

    A lower bound on its token count (each piece is one token or more). Slow
    (a regex pass); meant for measuring estimators, not for counting on the
    hot path.
    """
    return sum(1 for _ in _PIECES.finditer(text))
