"""Runs drawn as one self-contained HTML page: one lane per engine, each on its
own time axis, so a learner *sees* where a process died, what the restarted
process read or replayed, what ran again, and how many effects the provider
applied.

- ``timeline.model``: what a lane holds (attempts as spans, kill / restart /
  replay marks, the provider's effects), each time tagged with where it came
  from: an engine's or the provider's **record**, or an **observation** of the
  processes by whoever drew the page. The two are drawn differently, and the
  page's legend says which is which.
- ``timeline.page``: the page (inline SVG and CSS, no script, no network, no
  font or file fetched; a Content-Security-Policy that allows none).

It imports nothing from the project: the lesson builds the lanes, from each
engine's side of the comparison (``lesson.lanes``) and, for the scenario,
from what it watched (``lesson.scenario_page``).
"""

from timeline.model import OBSERVED, RECORD, Effect, Lane, Mark, Span
from timeline.page import render_page

__all__ = ["OBSERVED", "RECORD", "Effect", "Lane", "Mark", "Span", "render_page"]
