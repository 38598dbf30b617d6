"""Control characters: which ones the boundary refuses, and how every
renderer shows them. One definition for both sides, so what is refused on
the way in is exactly what is escaped on the way out.

The characters (docs/commands.md, "Input limits and control characters", states the same rule):

- C0 controls U+0000-U+001F, except newline (LF, or CR LF) and tab in
  multi-line text (the task, an email body);
- DEL U+007F and the C1 controls U+0080-U+009F (U+009B is a one-byte CSI
  to many terminals);
- the bidirectional overrides and isolates U+202A-U+202E and U+2066-U+2069
  (they reorder what a reader sees: "Trojan Source", CVE-2021-42574);
- lone surrogates U+D800-U+DFFF: not characters at all, but how Python
  passes on bytes of a command-line argument that are not valid UTF-8
  (``\xff`` arrives as U+DCFF). They cannot be stored, sent or printed as
  UTF-8, so they are refused with the others instead of failing later.

Anything else is text, including zero-width joiners and combining marks:
they change how a string looks, not what a terminal does.

``find_control`` says where the first such character is (the input checks,
``durable_agents.steps.limits``, word the refusal from it). ``printable`` escapes them for
display: ESC becomes ``\\x1b``, U+202E ``\\u202e``; newline is kept only when
the caller renders multi-line text. Every place that prints run data (the
starter's tables, the run record's CLI, the demo, the lesson scripts, log
lines) goes through it, so data that did not pass the rule (read back from a
record, the provider or Temporal's history) never reaches a terminal raw. A
backslash is left as it is: the escape is for a reader, not a round trip
(``--json`` is the exact form). Log lines go through ``PrintableFormatter``
(installed by ``basic_config``, which every command's logging set-up uses:
``durable_agents.flowclient.logs`` adds the worker's filters on top), so a message that
quotes run data cannot clear a terminal or forge a second log line.

The provider has its own copy of the rule (``provider.validation``): it is
the far side of an API and shares no code with its clients.
"""

from __future__ import annotations

import logging
import re
import unicodedata

__all__ = ["CONTROLS", "LOG_FORMAT", "PrintableFormatter", "basic_config", "char_label", "find_control", "printable"]

_CLASS = "\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff"
CONTROLS = re.compile(f"[{_CLASS}]")
"""Every character of the rule, newline and tab included (a single-line field)."""
_MULTILINE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]|\r(?!\n)")
"""The same, less newline (LF or CR LF) and tab: multi-line text."""
_SHOW = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
"""What ``printable`` escapes when the caller keeps newlines."""

_C0 = ("NUL SOH STX ETX EOT ENQ ACK BEL BS TAB LF VT FF CR SO SI DLE DC1 DC2 DC3 DC4 NAK SYN ETB "
       "CAN EM SUB ESC FS GS RS US").split()
_C1 = ("PAD HOP BPH NBH IND NEL SSA ESA HTS HTJ VTS PLD PLU RI SS2 SS3 DCS PU1 PU2 STS CCH MW SPA EPA "
       "SOS SGCI SCI CSI ST OSC PM APC").split()


def char_label(ch: str) -> str:
    """``U+001B (ESC)``, ``U+202E (RIGHT-TO-LEFT OVERRIDE)``: how a refusal names a character."""
    code = ord(ch)
    if code < 0x20:
        name = _C0[code]
    elif code == 0x7F:
        name = "DEL"
    elif 0x80 <= code <= 0x9F:
        name = _C1[code - 0x80]
    elif 0xD800 <= code <= 0xDFFF:
        name = f"a byte that is not UTF-8: 0x{code - 0xDC00:02X}" if code >= 0xDC80 else "a lone surrogate"
    else:
        name = unicodedata.name(ch, "")
    return f"U+{code:04X}" + (f" ({name})" if name else "")


def find_control(value: str, *, multiline: bool = False) -> tuple[int, str] | None:
    """(position counting from 1, character) of the first character the rule
    refuses in ``value``, or None. ``multiline``: newline and tab are text."""
    found = (_MULTILINE if multiline else CONTROLS).search(value)
    return None if found is None else (found.start() + 1, value[found.start()])


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def printable(text: object, *, multiline: bool = False) -> str:
    """``text`` safe for a terminal: the rule's characters escaped (``\\x1b``,
    ``\\x9b``, ``\\u202e``). ``multiline`` keeps newlines, for callers that render
    multi-line text (a traceback); everything else, tab and CR included, is
    escaped. Cheap when there is nothing to escape: one regex search."""
    text = text if isinstance(text, str) else str(text)
    pattern = _SHOW if multiline else CONTROLS
    if pattern.search(text) is None:
        return text
    return pattern.sub(_escape, text)


LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class PrintableFormatter(logging.Formatter):
    """A formatter whose lines never carry a raw control character: the line itself escaped as one line,
    whatever the message held; a traceback after it (``exc_text``, which a filter may have set) keeps its
    newlines."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return printable(super().formatMessage(record))

    def format(self, record: logging.LogRecord) -> str:
        return printable(super().format(record), multiline=True)


def basic_config(level: int, fmt: str = LOG_FORMAT) -> None:
    """``logging.basicConfig(level=, format=)`` with ``PrintableFormatter``: a
    stderr handler on the root logger, unless it has handlers already (then,
    as basicConfig, nothing: an embedding program's logging is its own)."""
    root = logging.getLogger()
    if root.handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(PrintableFormatter(fmt))
    root.addHandler(handler)
    root.setLevel(level)
