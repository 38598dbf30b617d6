"""Where a run's time went, from its event history (server clock), for the benches."""

from __future__ import annotations

import statistics
from collections import defaultdict

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client


async def step_breakdown(client: Client, run_ids: list[str]) -> dict[str, float]:
    """Median milliseconds of each segment of an activity step, from history timestamps."""
    seg: dict[str, list[float]] = defaultdict(list)
    E = EventType
    for run_id in run_ids:
        history = await client.get_workflow_handle(run_id).fetch_history()
        t = {}
        last_completed = None
        for ev in history.events:
            ts = ev.event_time.ToMicroseconds() / 1000.0
            et = ev.event_type
            if et == E.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                t[ev.event_id] = ts
            elif et == E.EVENT_TYPE_ACTIVITY_TASK_STARTED:
                a = ev.activity_task_started_event_attributes
                seg["activity scheduled -> started"].append(ts - t[a.scheduled_event_id])
                t[("started", a.scheduled_event_id)] = ts
            elif et == E.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
                a = ev.activity_task_completed_event_attributes
                seg["activity started -> completed"].append(ts - t[("started", a.scheduled_event_id)])
                last_completed = ts
            elif et == E.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED:
                t["wft_scheduled"] = ts
                if last_completed is not None:
                    seg["activity completed -> wf task scheduled"].append(ts - last_completed)
                    last_completed = None
            elif et == E.EVENT_TYPE_WORKFLOW_TASK_STARTED:
                seg["wf task scheduled -> started"].append(ts - t["wft_scheduled"])
                t["wft_started"] = ts
            elif et == E.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
                seg["wf task started -> completed"].append(ts - t["wft_started"])
        first, last = history.events[0], history.events[-1]
        seg["whole run (first to last event)"].append(
            (last.event_time.ToMicroseconds() - first.event_time.ToMicroseconds()) / 1000.0)
    return {k: statistics.median(v) for k, v in seg.items()}
