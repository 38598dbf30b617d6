"""The tables ``make peers`` prints, as Markdown (so docs/peers.md holds them as printed)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from peers.clock import Figures
from peers.faults import EXPECTED, TURNS, Trial

FAULT_WORDS = {
    "tool:issue_refund:after_effect": "worker killed right after the provider applied the refund",
    "tool:send_email:after_effect": "worker killed right after the provider sent the email",
    "tool:create_ticket:after_effect": "worker killed right after the provider created the ticket",
    "peer:between_turns": "worker killed between turns (turn 1's tool results in, turn 2 not asked)",
    "model:during_request": "worker killed during a model request (turn 2's, in flight at the stand-in)",
}


def markdown(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _effect(trial: Trial, kind: str) -> str:
    found = trial.effects.get(kind, {"applied": 0, "refused": 0})
    mark = "" if found["applied"] == EXPECTED[kind] else " ✗"
    refused = f" (+{found['refused']} refused)" if found["refused"] else ""
    return f"{found['applied']}{mark}{refused}"


def _turns(trial: Trial) -> str:
    if not trial.turns:
        return "-"
    asked = sum(trial.turns.values())
    per = " ".join(f"{t}:{n}" for t, n in trial.turns.items())
    return f"{asked} ({per})"


def fault_table(fault: str, trials: Sequence[Trial]) -> str:
    rows = []
    for t in trials:
        killed = "yes" if t.killed else "no (not reached)"
        rows.append([t.subject, killed, t.outcome, _effect(t, "refund"), _effect(t, "email"), _effect(t, "ticket"),
                     _turns(t)])
    title = f"**{fault}**: {FAULT_WORDS.get(fault, fault)}. Expected per run: 1 refund, 1 email, 1 ticket; " \
            f"{TURNS} turns, each asked once (twice for the turn whose request was killed)."
    return title + "\n\n" + markdown(["subject", "worker A died there", "run", "refunds", "emails", "tickets",
                                      "model requests (per turn)"], rows)


def _spread(values: Sequence[float], scale: float = 1.0, digits: int = 0) -> str:
    if not values:
        return "-"
    med = statistics.median(values) * scale
    if len(values) == 1:
        return f"{med:.{digits}f}"
    return f"{med:.{digits}f} ({min(values) * scale:.{digits}f}-{max(values) * scale:.{digits}f})"


def figures_table(figures: Sequence[Figures]) -> str:
    """The clock's table. "x the first": each Temporal subject's time per turn over the first subject's (the
    lab's loop on Temporal) in the same round of ``clock.per_turn``, the median over the rounds both ran."""
    first = figures[0].per_turn if figures else []

    def over_first(f: Figures) -> str:
        if not f.events_per_turn:  # not a Temporal subject: clocked apart, in this process, not in the rounds
            return "-"
        ratios = [mine / theirs for mine, theirs in zip(f.per_turn, first, strict=False) if theirs]
        return f"{statistics.median(ratios):.2f}x" if ratios else "-"

    rows = [[f.subject, _spread(f.per_turn, 1000), over_first(f), _spread(f.events_per_turn, digits=1),
             _spread(f.kill_to_done, digits=2), f.note or ""] for f in figures]
    return markdown(["subject", "ms per turn, median (range)", "x the first, per round",
                     "history events per turn", "kill → done with a standby, s", "note"], rows)
