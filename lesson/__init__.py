"""The lesson's runnable pieces (see LAB.md for the guided path).

- ``lesson.in_memory``: the "before": the three-step flow held only in process
  memory, with a fresh random idempotency key per execution. A restart between
  step 2 and step 3 runs steps 1 and 2 again and sends the email twice.
- ``lesson.scenario``: the same restart on all four engines (in memory, the
  SQLite run record, Temporal, DBOS), in one table (``make scenario``), and
  with ``--html`` as one page (``lesson.scenario_page``); what it observed and
  expected, and the table both show, in ``lesson.observed``. Every engine is
  driven through its driver (``lab.engines``).
- ``lesson.loop_scenario``: the agent loop killed right after a refund and
  resumed, on Temporal, the run record and DBOS, in one table (``make
  loop-scenario``), and with ``--html`` as one page (``lesson.loop_page``);
  what it observed, and the table both show, in ``lesson.loop_observed``.
- ``lesson.deploy``: the restart that is a deploy, or a move, on every engine
  (``make scenario-deploy``).
- ``lesson.replay``: replay a recorded history with the current workflow
  code, as a resuming worker does.
- ``lesson.pictures``: that page and the provider's inbox, photographed in
  headless Chromium for LAB.md (``make pictures``).
- ``lesson.memory_vs_record``: falsify or wipe conversation memory between a
  crash and a resume; the resume follows the run record anyway.
- ``lesson.memory_demo``: the bounded memory's eviction rule, on a long
  conversation with tool calls.
- ``lesson.effects``: the provider's own count of effects for a run id.
- ``lesson.compare``: the engines' records of the same task side by side (the
  run record's, Temporal's history, DBOS's rows), each read by its engine's
  own ``compare`` module, with the provider's counts; a table, or with
  ``--html`` a page (``python -m lesson.compare``).
- ``lesson.lanes``: one timeline lane per engine from its record, plus what a
  watcher saw: drawn by the comparison's page and the scenario's.

Nothing in here is imported by the durable engines; it only drives them and
reads their records.
"""
