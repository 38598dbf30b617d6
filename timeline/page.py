"""The page: a header, a summary table, a legend, then one lane per engine.

A lane is an SVG: a row for the processes, one row per step, one row per kind
of effect the lane carries (``Lane.effect_kinds``: its flow's kinds, emails and
tickets in the lab's, and any other the provider counted for the run), a time
axis in seconds from the lane's start (each lane has its own scale: the
engines ran one after another and take different times). Under it, the
provider's keys as a list, and a verdict. Each kind of effect has a colour and
a shape of its own on the page (``effect_looks``, in the order the lanes first
carry them); the page knows no kind by name.

How a time's source is drawn (the legend repeats it): from a **record**, a
solid edge or line; from an **observation**, a dashed one, and a bar filled
paler. A killed attempt usually has one of each: it began in the record and
ended when the observer saw the process die.

Everything that came from data is escaped (``html.escape``, control
characters made visible); the page holds no script and forbids scripts and
fetches in its Content-Security-Policy, so it is safe to open whatever the
runs carried.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from html import escape

from timeline.model import (
    AGAIN,
    EXECUTED,
    KILL,
    OBSERVED,
    READ,
    RECORD,
    REPLAY,
    REPLAYED,
    RERUN,
    RESTART,
    UNRECORDED,
    WAITING,
    Lane,
    Mark,
    Span,
)

WIDTH = 1100
GUTTER = 170  # row labels
RIGHT = 24
PLOT = WIDTH - GUTTER - RIGHT
TOP = 34  # room for the marks' labels
PROCESS_ROW = 22
STEP_ROW = 27
EFFECT_ROW = 22
AXIS = 30
MIN_BAR = 4.0  # pixels: a 3 ms step on a 3 s axis still shows
CHAR = 6.6  # pixels per character at 11 px, to keep labels from running into the next bar

COLOURS = {EXECUTED: "#3b6fb6", AGAIN: "#d9822b", REPLAYED: "#3b6fb6", READ: "#3b6fb6", WAITING: "#8a93a6",
           RERUN: "#1f8a8a", "process": "#8a93a6",
           KILL: "#c0392b", RESTART: "#2e8b57", REPLAY: "#3b6fb6"}
LOOKS = (("#2e8b57", "circle"), ("#6a4fb3", "square"), ("#b7791f", "diamond"), ("#1f7a8c", "triangle"),
         ("#a23b72", "circle"), ("#4a6b2a", "square"))
"""The looks of the kinds of effect, given out in the order the page's lanes first carry them (the lab's flow:
the email a green circle, the ticket a purple square); past the last, they start again."""
CSP = "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'"

_STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; color: #1d2330; margin: 20px auto; max-width: 1140px; padding: 0 14px; }
h1 { font-size: 21px; margin: 0 0 4px; }
h2 { font-size: 16px; margin: 0; display: flex; gap: 12px; align-items: baseline; flex-wrap: wrap; }
p.lead { margin: 2px 0 10px; color: #4a5264; overflow-wrap: anywhere; max-height: 7.5em; overflow: hidden; }
table.summary { border-collapse: collapse; font-size: 13px; margin: 6px 0 10px; }
table.summary th, table.summary td { border-bottom: 1px solid #dde2ec; padding: 3px 12px 3px 0; text-align: left; }
table.summary tr.bad td { color: #b03a2e; font-weight: 600; }
ul.legend { display: flex; flex-wrap: wrap; gap: 4px 18px; padding: 8px 10px; margin: 0 0 12px; list-style: none;
            background: #f4f6fa; border-radius: 6px; font-size: 12.5px; }
ul.legend li { display: flex; align-items: center; gap: 6px; }
section.lane { border: 1px solid #d5dbe6; border-radius: 8px; padding: 8px 12px 6px; margin: 0 0 12px; }
section.lane.bad { border-color: #e3a49c; background: #fffafa; }
h2 .run { font-size: 12.5px; font-weight: 400; color: #6b7385; font-family: ui-monospace, monospace; }
p.verdict { font-size: 13.5px; font-weight: 600; color: #2e7d4f; margin: 1px 0 0; }
section.lane.bad .verdict { color: #b03a2e; }
p.caption { margin: 2px 0 0; font-size: 12.5px; color: #4a5264; overflow-wrap: anywhere; }
svg.timeline { width: 100%; height: auto; display: block; }
svg text { font: 11px system-ui, sans-serif; fill: #1d2330; }
svg text.row { fill: #4a5264; }
svg text.bad { fill: #b03a2e; font-weight: 600; }
ul.effects { margin: 0; padding: 0 0 0 18px; font-size: 12.5px; columns: 2; column-gap: 28px; }
ul.effects li { overflow-wrap: anywhere; break-inside: avoid; }
ul.effects code { font-size: 11.5px; }
li.effect.second { color: #b03a2e; font-weight: 600; }
p.notes { font-size: 12px; color: #4a5264; }
"""

_BAD = ' class="bad"'
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def text(value: object) -> str:
    """``value`` as HTML text: markup escaped, control characters shown as ``U+XXXX``, never obeyed."""
    return escape(_CONTROL.sub(lambda m: f"U+{ord(m.group()):04X}", str(value)), quote=True)


def _seconds(value: float) -> str:
    return f"{value:.3f}".rstrip("0").rstrip(".") if value else "0"


class _Axis:
    """Seconds since the lane's start, to x pixels; ticks at a round step."""

    def __init__(self, start: float, end: float) -> None:
        span = max(end - start, 0.05) * 1.08  # room after the last event for its label
        step = next(s for s in (0.01, 0.02, 0.05, 0.1, 0.2, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800)
                    if span / s <= 10) if span <= 18000 else 3600.0
        self.start, self.step = start, step
        self.length = math.ceil(span / step - 1e-9) * step

    def x(self, at: float) -> float:
        return GUTTER + PLOT * (at - self.start) / self.length

    def ticks(self) -> list[float]:
        return [i * self.step for i in range(int(round(self.length / self.step)) + 1)]


def _times(lane: Lane) -> list[float]:
    out = [lane.start]
    for span in (*lane.spans, *lane.processes):
        out += [span.start, span.end]
    out += [m.at for m in lane.marks]
    out += [t for e in lane.effects for t in (e.first_seen, e.last_seen) if t is not None]
    return out


def _dash(source: str) -> str:
    return ' stroke-dasharray="4 3"' if source == OBSERVED else ""


def _bar(axis: _Axis, span: Span, y: float, height: float, colour: str, room: float, left: float) -> str:
    """One span; its label beside it (``room``: pixels free from its start to the next span's), else
    within it, else to its left (``left``: pixels free before it); where the label fits nowhere, its
    ``short_label`` the same way."""
    x0 = axis.x(span.start)
    x1 = max(axis.x(span.end), x0 + MIN_BAR)
    observed = OBSERVED in (span.start_from, span.end_from)
    title = f"<title>{text(span.note or span.label)}</title>"
    if span.kind in (UNRECORDED, WAITING):
        mid = y + height / 2
        shape = (f'<line x1="{x0:.1f}" y1="{mid:.1f}" x2="{x1:.1f}" y2="{mid:.1f}" stroke="{colour}" '
                 f'stroke-width="2" stroke-dasharray="{"1 3" if span.kind == UNRECORDED else "6 3"}"/>')
    else:
        fill = "url(#hatch)" if span.kind in (REPLAYED, READ) else colour
        opacity = ' fill-opacity="0.5"' if observed and span.kind not in (REPLAYED, READ) else ""
        # The four edges drawn apart: each end in the style of its own source.
        sides = OBSERVED if observed else RECORD
        shape = (f'<rect x="{x0:.1f}" y="{y:.1f}" width="{x1 - x0:.1f}" height="{height}" fill="{fill}"{opacity}/>'
                 f'<path d="M{x0:.1f},{y:.1f}H{x1:.1f}M{x0:.1f},{y + height:.1f}H{x1:.1f}" stroke="#1d2330" '
                 f'stroke-width="1"{_dash(sides)}/>'
                 f'<path d="M{x0:.1f},{y:.1f}V{y + height:.1f}" stroke="#1d2330" stroke-width="1.3"'
                 f'{_dash(span.start_from)}/>'
                 f'<path d="M{x1:.1f},{y:.1f}V{y + height:.1f}" stroke="#1d2330" stroke-width="1.3"'
                 f'{_dash(span.end_from)}/>')
    label = ""
    for words in (span.label, span.short_label) if span.short_label else (span.label,):
        label = _label(span, words, x0, x1, y, height, room, left)
        if label:
            break
    classes = f"span {span.kind} {'observed' if observed else 'record'}"
    data = "".join(f' data-{name}="{text(value)}"' for name, value in span.data)
    return (f'<g class="{classes}" data-row="{text(span.row)}" data-start-from="{span.start_from}" '
            f'data-end-from="{span.end_from}"{data}>{title}{shape}{label}</g>')


def _label(span: Span, words: str, x0: float, x1: float, y: float, height: float, room: float, left: float) -> str:
    """``words`` beside the bar, if the row is free up to the next one (``room``), else within it, else to its
    left (``left``: pixels free before it); "" if it fits nowhere."""
    need, width = len(words) * CHAR + 6, x1 - x0
    if words and need <= room - width:  # beside the bar, if the row is free up to the next one
        return (f'<text x="{x1 + 4:.1f}" y="{y + height / 2 + 4:.1f}"'
                f'{_BAD if span.kind == AGAIN else ""}>{text(words)}</text>')
    if words and need <= width:  # else within it: over a line, or in white on a bar
        inside = "fill:#ffffff" if span.kind in (EXECUTED, AGAIN, RERUN) and span.row != "process" else "fill:#1d2330"
        lift = -4 if span.kind in (UNRECORDED, WAITING) else 4
        return (f'<text x="{(x0 + x1) / 2:.1f}" y="{y + height / 2 + lift:.1f}" text-anchor="middle" '
                f'style="{inside}">{text(words)}</text>')
    if words and need <= left:
        return (f'<text x="{x0 - 4:.1f}" y="{y + height / 2 + 4:.1f}" text-anchor="end"'
                f'{_BAD if span.kind == AGAIN else ""}>{text(words)}</text>')
    return ""


def _row_bars(axis: _Axis, spans: Sequence[Span], y: float, height: float, colour_of) -> str:
    ordered = sorted(spans, key=lambda s: s.start)
    out = []
    free_from = float(GUTTER)  # where the row is free of the bars before, for a label to their left
    for i, span in enumerate(ordered):
        following = ordered[i + 1].start if i + 1 < len(ordered) else None
        room = (axis.x(following) if following is not None else WIDTH) - axis.x(span.start)
        out.append(_bar(axis, span, y, height, colour_of(span), room, axis.x(span.start) - free_from))
        free_from = max(free_from, axis.x(span.end) + MIN_BAR)
    return "".join(out)


def _mark(axis: _Axis, mark: Mark, level: int, bottom: float) -> str:
    x = axis.x(mark.at)
    colour = COLOURS[mark.kind]
    symbol = {KILL: "\u2715 ", RESTART: "\u21bb ", REPLAY: ""}[mark.kind]
    # A kill's label reads to the left of its line, a restart's to the right: the two are often
    # milliseconds apart.
    anchor = "end" if mark.kind == KILL else "start"
    dx = -4 if mark.kind == KILL else 4
    y = 12 + 12 * level
    return (f'<g class="mark {mark.kind} {mark.source}" data-at="{mark.at:.3f}"><title>{text(mark.note or mark.label)}'
            f'</title><line x1="{x:.1f}" y1="{y - 8:.1f}" x2="{x:.1f}" y2="{bottom:.1f}" stroke="{colour}" '
            f'stroke-width="2"{_dash(mark.source)}/><text x="{x + dx:.1f}" y="{y:.1f}" text-anchor="{anchor}" '
            f'style="fill:{colour};font-weight:600">{text(symbol + mark.label)}</text></g>')


Look = tuple[str, str]  # (colour, shape)


def effect_looks(lanes: Sequence[Lane]) -> dict[str, Look]:
    """Each kind of effect the lanes carry, with its colour and shape, the same in every lane of the page."""
    kinds = dict.fromkeys(kind for lane in lanes for kind in lane.effect_kinds())
    return {kind: LOOKS[i % len(LOOKS)] for i, kind in enumerate(kinds)}


def _shape(shape: str, x: float, y: float, fill: str, colour: str) -> str:
    """A mark of ``shape`` centred on (x, y)."""
    paint = f'fill="{fill}" stroke="{colour}" stroke-width="1.5"'
    if shape == "square":
        return f'<rect x="{x - 5.5:.1f}" y="{y - 5.5:.1f}" width="11" height="11" {paint}/>'
    if shape == "diamond":
        return f'<path d="M{x:.1f},{y - 7:.1f}L{x + 7:.1f},{y:.1f}L{x:.1f},{y + 7:.1f}L{x - 7:.1f},{y:.1f}Z" {paint}/>'
    if shape == "triangle":
        return f'<path d="M{x:.1f},{y - 6.5:.1f}L{x + 6.5:.1f},{y + 5.5:.1f}L{x - 6.5:.1f},{y + 5.5:.1f}Z" {paint}/>'
    return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="6" {paint}/>'


def _effect_marks(axis: _Axis, lane: Lane, kind: str, y: float, look: Look) -> str:
    out = []
    mine = sorted((e for e in lane.effects if e.kind == kind and e.first_seen is not None),
                  key=lambda e: e.first_seen or 0.0)
    applied = 0
    in_group: dict[str, int] = {}  # applied per group (``Effect.group``; its kind when it names none)
    for i, effect in enumerate(mine):
        assert effect.first_seen is not None
        x = axis.x(effect.first_seen)
        mid = y + EFFECT_ROW / 2
        applied += effect.applied
        group = effect.group or kind
        in_group[group] = in_group.get(group, 0) + effect.applied
        second = effect.applied and in_group[group] > 1
        colour = "#b03a2e" if second else look[0]
        filled = colour if effect.applied else "#ffffff"
        shape = _shape(look[1], x, mid, filled, colour)
        later = ""
        if effect.requests > 1 and effect.last_seen is not None:
            later = (f'<circle cx="{axis.x(effect.last_seen):.1f}" cy="{mid:.1f}" r="6" fill="none" '
                     f'stroke="{colour}" stroke-width="1.5" stroke-dasharray="2 2"/>')
        word = (f"{kind} {applied}" + (" (again!)" if second else "")) if effect.applied else f"{kind}: nothing applied"
        following = mine[i + 1].first_seen if i + 1 < len(mine) else None
        room = (axis.x(following) if following is not None else WIDTH) - x
        label = (f'<text x="{x + 10:.1f}" y="{mid + 4:.1f}"{_BAD if second else ""}>{text(word)}</text>'
                 if len(word) * CHAR + 14 <= room else "")
        note = (f"{effect.key}: {effect.requests} request(s), {effect.applied} applied; first request "
                f"+{_seconds(effect.first_seen - lane.start)} s (the provider's first_seen)")
        out.append(f'<g class="effect-mark {text(kind)}{" applied" if effect.applied else ""}" '
                   f'data-kind="{text(kind)}"><title>{text(note)}</title>{shape}{later}{label}</g>')
    return "".join(out)


def _lane_svg(lane: Lane, looks: dict[str, Look]) -> str:
    times = _times(lane)
    axis = _Axis(lane.start, max(times))
    rows_y: dict[str, float] = {}
    y = TOP
    process_y = y
    y += PROCESS_ROW if lane.processes else 0  # drawn from the records alone, a lane knows no processes
    for name in lane.rows:
        rows_y[name] = y
        y += STEP_ROW
    kinds = lane.effect_kinds()
    effects_y = {kind: y + i * EFFECT_ROW for i, kind in enumerate(kinds)}
    bottom = y + len(kinds) * EFFECT_ROW
    height = bottom + AXIS
    parts = [f'<svg class="timeline" viewBox="0 0 {WIDTH} {height}" role="img" '
             f'aria-label="{text(lane.title)}: a timeline" xmlns="http://www.w3.org/2000/svg">']
    # Row bands and labels.
    labels: list[tuple[str, float, int]] = [("processes", process_y, PROCESS_ROW)] if lane.processes else []
    labels += [(lane.row_labels.get(name, f"{i} {name}"), rows_y[name], STEP_ROW)
               for i, name in enumerate(lane.rows, 1)]
    labels += [(f"provider: {kind}{'' if kind.endswith('s') else 's'}", effects_y[kind], EFFECT_ROW) for kind in kinds]
    for i, (label, top, h) in enumerate(labels):
        if i % 2:
            parts.append(f'<rect x="{GUTTER}" y="{top}" width="{PLOT}" height="{h}" fill="#f6f8fb"/>')
        parts.append(f'<text class="row" x="{GUTTER - 8}" y="{top + h / 2 + 4:.1f}" text-anchor="end">'
                     f"{text(label)}</text>")
    for tick in axis.ticks():
        x = axis.x(lane.start + tick)
        parts.append(f'<line x1="{x:.1f}" y1="{TOP - 4}" x2="{x:.1f}" y2="{bottom}" stroke="#e3e7ef"/>'
                     f'<text x="{x:.1f}" y="{bottom + 14}" text-anchor="middle">{_seconds(tick)} s</text>')
    parts.append(f'<text class="row" x="{GUTTER + PLOT}" y="{bottom + 27}" text-anchor="end">'
                 "seconds since this engine's run began (its own axis)</text>")
    parts.append(_row_bars(axis, lane.processes, process_y + 4, PROCESS_ROW - 8, lambda s: COLOURS["process"]))
    for name in lane.rows:
        mine = [s for s in lane.spans if s.row == name]
        parts.append(_row_bars(axis, mine, rows_y[name] + 6, STEP_ROW - 12,
                               lambda s: COLOURS.get(s.kind, COLOURS[EXECUTED])))
    for kind in kinds:
        parts.append(_effect_marks(axis, lane, kind, effects_y[kind], looks[kind]))
    for i, mark in enumerate(sorted(lane.marks, key=lambda m: m.at)):
        parts.append(_mark(axis, mark, i % 2, bottom))
    parts.append("</svg>")
    return "".join(parts)


def _effects_list(lane: Lane) -> str:
    items = []
    applied: dict[str, int] = {}
    for effect in sorted(lane.effects, key=lambda e: e.first_seen or 0.0):
        group = effect.group or effect.kind
        applied[group] = applied.get(group, 0) + effect.applied
        second = effect.applied and applied[group] > 1
        outcome = ("applied" if effect.applied else "nothing applied") + (
            f", then {effect.requests - 1} more request(s) with this key, none applied again"
            if effect.requests > 1 else "")
        when = f" at +{_seconds(effect.first_seen - lane.start)} s" if effect.first_seen is not None else ""
        classes = f"effect {effect.kind} {'applied' if effect.applied else 'not-applied'}{' second' if second else ''}"
        items.append(f'<li class="{classes}" data-key="{text(effect.key)}">{text(effect.kind)} '
                     f"<code>{text(effect.key)}</code>: {effect.requests} request{'' if effect.requests == 1 else 's'},"
                     f" {text(outcome)}{text(when)}{' (a second one: the customer reads it twice)' if second else ''}"
                     "</li>")
    if not items:
        items.append('<li class="none">the provider saw no request for this run</li>')
    return f'<ul class="effects" aria-label="the provider\'s count for this run">{"".join(items)}</ul>'


def _lane(lane: Lane, looks: dict[str, Look]) -> str:
    run = f'<span class="run">run {text(lane.run_id)}</span>' if lane.run_id else ""
    return (f'<section class="lane{" bad" if lane.bad else ""}" data-engine="{text(lane.engine)}" '
            f'id="lane-{text(lane.engine)}" data-run-id="{text(lane.run_id)}"><h2>{text(lane.title)}{run}</h2>'
            f'<p class="verdict">{text(lane.verdict)}</p>'
            + (f'<p class="caption">{text(lane.caption)}</p>' if lane.caption else "")
            + _lane_svg(lane, looks) + _effects_list(lane) + "</section>")


def _swatch(inner: str, width: int = 34) -> str:
    return f'<svg width="{width}" height="16" viewBox="0 0 {width} 16" aria-hidden="true">{inner}</svg>'


def _present(lanes: Sequence[Lane]) -> set[str]:
    """What the lanes draw, so the legend explains that and nothing else."""
    found: set[str] = set()
    for lane in lanes:
        for span in lane.spans:
            found.add(span.kind)
            if OBSERVED in (span.start_from, span.end_from):
                found.add(OBSERVED)
            if RECORD in (span.start_from, span.end_from) and span.kind in (EXECUTED, AGAIN, RERUN):
                found.add(RECORD)
        found.update(mark.kind for mark in lane.marks)
        found.update("effect" for _ in lane.effects[:1])
        found.update("later" for e in lane.effects if e.requests > 1)
    return found


def _bar_swatch(fill: str, extra: str = "") -> str:
    return _swatch(f'<rect x="2" y="3" width="30" height="10" fill="{fill}" stroke="#1d2330" stroke-width="1.3"'
                   f"{extra}/>")


def _line_swatch(colour: str, dash: str, across: bool = False) -> str:
    if across:  # a mark: a vertical line
        solid = "" if not dash else f' stroke-dasharray="{dash}"'
        return _swatch(f'<line x1="10" y1="0" x2="10" y2="16" stroke="{colour}" stroke-width="2"{solid}/>', 20)
    return _swatch(f'<line x1="2" y1="8" x2="32" y2="8" stroke="{colour}" stroke-width="2" stroke-dasharray="{dash}"/>')


def _legend(present: set[str], looks: dict[str, Look]) -> str:
    """The legend, for what ``present`` says the lanes draw (see ``_present``), and the kinds of effect."""
    effects = "".join(_shape(shape, 9 + 14 * i, 8, colour, colour) for i, (colour, shape) in enumerate(looks.values()))
    kinds = " / ".join(f"{'an' if kind[:1] in 'aeiou' else 'a'} {kind}" for kind in looks)
    items: list[tuple[set[str], str, str]] = [
        ({RECORD}, _bar_swatch(COLOURS[EXECUTED]),
         "a step executed; its times from the engine's record (solid edges)"),
        ({OBSERVED}, _bar_swatch(COLOURS[EXECUTED], ' fill-opacity="0.5" stroke-dasharray="4 3"'),
         "times observed, not recorded (dashed edges): a line a process printed, its death, its start"),
        ({AGAIN}, _bar_swatch(COLOURS[AGAIN]), "executed again after the restart, although it had completed"),
        ({RERUN}, _bar_swatch(COLOURS[RERUN]),
         "executed again after the restart, its result never recorded: the same idempotency key, answered from the "
         "provider's store, applied once"),
        ({REPLAYED, READ}, _bar_swatch("url(#hatch)"),
         "read or replayed: the restarted process took the recorded result and did not run the step"),
        ({WAITING}, _line_swatch(COLOURS[WAITING], "6 3"),
         "nothing ran: the engine waited (a dead worker's heartbeat timeout)"),
        ({UNRECORDED}, _line_swatch(COLOURS[EXECUTED], "1 3"), "attempts the record counts but does not time"),
        ({KILL}, _line_swatch(COLOURS[KILL], "4 3", across=True), "\u2715 process killed (SIGKILL)"),
        ({RESTART}, _line_swatch(COLOURS[RESTART], "4 3", across=True), "\u21bb process started again"),
        ({REPLAY}, _line_swatch(COLOURS[REPLAY], "", across=True),
         "Temporal's new worker replays the history (a record time: its workflow task)"),
        ({"effect"}, _swatch(effects, 14 * len(looks) + 6),
         f"{kinds} applied by the provider, at its first request (the provider's record)"),
        ({"later"}, _swatch('<circle cx="9" cy="8" r="6" fill="none" stroke="#2e8b57" stroke-width="1.5" '
                            'stroke-dasharray="2 2"/>', 20),
         "a later request with the same key: nothing applied again"),
    ]
    entries = "".join(f"<li>{svg}<span>{text(words)}</span></li>" for keys, svg, words in items if keys & present)
    return f'<ul class="legend">{entries}</ul>'


def render_page(title: str, lead: str, lanes: Sequence[Lane], *, summary: Sequence[Sequence[str]] = (),
                summary_bad: Sequence[bool] = (), notes: Sequence[str] = ()) -> str:
    """The whole page. ``summary``: a header row then one row per engine (``summary_bad`` marks rows
    whose outcome is the failure shown); ``notes``: sentences under the lanes. All of it is text."""
    looks = effect_looks(lanes)
    table = ""
    if summary:
        head, *rows = summary
        bad = list(summary_bad) + [False] * len(rows)
        table = ('<table class="summary"><thead><tr>' + "".join(f"<th>{text(c)}</th>" for c in head)
                 + "</tr></thead><tbody>"
                 + "".join(f'<tr{_BAD if bad[i] else ""}>' + "".join(f"<td>{text(c)}</td>" for c in row)
                           + "</tr>" for i, row in enumerate(rows))
                 + "</tbody></table>")
    defs = ('<svg width="0" height="0" style="position:absolute" aria-hidden="true"><defs>'
            '<pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)">'
            f'<rect width="6" height="6" fill="#e8eef8"/><line x1="0" y1="0" x2="0" y2="6" '
            f'stroke="{COLOURS[REPLAYED]}" stroke-width="2.5"/></pattern></defs></svg>')
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        f"<title>{text(title)}</title><style>{_STYLE}</style></head><body>{defs}"
        f"<h1>{text(title)}</h1><p class=\"lead\">{text(lead)}</p>{table}{_legend(_present(lanes), looks)}"
        + "".join(_lane(lane, looks) for lane in lanes)
        + "".join(f'<p class="notes">{text(n)}</p>' for n in notes)
        + "</body></html>"
    )
