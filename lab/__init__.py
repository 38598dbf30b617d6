"""The lab's tools on real processes: each part started as its own OS process,
so that "killed" means SIGKILL and effects are counted by a process that
outlived the kill (README.md for the demo, LAB.md for the guided path).

- ``lab.processes``: the harness every tool, test and benchmark starts parts
  with: ``Proc`` (an OS process, its output, its ready line awaited with a
  deadline), the Temporal dev server (``DevServer``, with the lab's server
  settings ``LAB_SERVER_CONFIG``), workers and the codec server, free ports.
- ``lab.registry``: the engines there are, each registered by its own package
  (its ``registration.py``): what every tool below iterates, and a test's stub
  engine joins.
- ``lab.engines``: one driver per engine (the registry's), and the in-memory
  lane's: start a run with a crash point, resume it, read its status and the
  steps a process started; what the tools, the lessons and the tests use.
- ``lab.provider_process``: the provider as a real process: started, SIGKILLed
  (a crash, or an outage) and restarted on the same store and port.
- ``durable_agents.testing.loopback``: an HTTP server on 127.0.0.1 in a thread of this process,
  for stand-ins read in place (the grader's model, the tests' OpenAI server).
- ``durable_agents.testing.standin``: an OpenAI-compatible server playing the agent loop's
  scripted model (and the offline draft), in a thread or as its own process,
  that counts the requests of each run and turn: a recorded turn never asked again.
- ``lab.demo``: the kill-and-resume demo (``make demo``): a worker SIGKILLed
  after step 2, a new one finishing the run, each effect counted once.
- ``lab.loop_demo``: the same for the agent loop (``make loop-demo``): on
  Temporal and on the run record, killed right after a refund and resumed;
  each effect once, no recorded turn asked again.
- ``lab.scheduler_demo``: the same for an agent from outside the lab (``make example``,
  ``examples/scheduler``): killed right after a booking, each effect once at its own service.
- ``lab.chaos``: many concurrent runs on Temporal while workers are SIGKILLed
  and the provider fails and loses answers (``make chaos``); no effect
  doubled or lost.
- ``lab.loop_chaos``: chaos over the agent loop on every engine (``make chaos-loop``): loop runs whose
  processes are SIGKILLed at random, a model that varies every answer, provider faults; no effect doubled
  or lost, no recorded turn asked again.
- ``lab.chaos_moves``: what both chaos sessions do at random, written once: provider faults that fire
  before or after the effect, the standby worker and a killed worker's replacement, the runs still open
  at the end terminated.
- ``lab.outage``: the provider really stopped while runs on both engines reach
  their email, for each outage length; ``retry`` for a run that ran out of
  budget.
- ``lab.resets``: ``temporal workflow reset`` on completed and failed runs, to
  each of their workflow tasks, with a model that words every answer
  differently too; each effect still once.
- ``lab.powercut``: a FUSE file system that loses every write never synced:
  the lab's power cut (a SIGKILL leaves the page cache intact).
- ``lab.powercut_matrix``: power cuts on every engine, placement, cut point,
  directory rule and sync level (``make powercut``), in one table.
- ``lab.powercut_postgres``: the server of the matrix's cases of DBOS on PostgreSQL (``dbos-pg``): its data
  directory on the cut, its whole process group killed by it, started again on what is left.
- ``lab.postgres``: Debian's PostgreSQL started and stopped by the project as the dev server is (its own
  data directory under .state/, its own port, as the ``postgres`` user when run as root), for DBOS's
  system database.
- ``lab.browser``: headless Chromium, for what needs a real browser (the
  Temporal UI through the codec server, the scenario's page, the inbox).
- ``lab.import_graph``: the import graph between the packages and between
  their modules, its cycles and sizes (``tests/test_architecture.py`` holds
  docs/architecture.md to it).

Nothing here is imported by the engines: the tools drive them from outside.
"""
