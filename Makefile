# The two commands of the README, and a few more. Each creates .venv and
# installs the project if needed (again whenever pyproject.toml or the lock
# changes): the locked dependencies with their hashes, then the project alone.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: help install demo scenario scenario-deploy pictures test lint ui-check bench clean chaos lock grade powercut

## help: list the targets (the default)
help:
	@echo "make TARGET, where TARGET is one of (each sets up .venv itself):"
	@grep -E '^## [a-z-]+:' $(MAKEFILE_LIST) | sed -E 's/^## ([a-z-]+): (.*)/  \1\t\2/' | expand -t 20

## install: create .venv and install the locked dependencies and the project (the other targets do it too)
install: $(STAMP)

# The adapter (the package durable_agents, the one distribution pyproject.toml builds) is installed editable; the
# lab around it (lab/, lesson/, grader/, provider/, examples/, tests/, worker.py, starter.py) is not a
# distribution: it runs from the checkout, which lab.pth puts on the environment's path. The wheelhouse holds the
# adapter's own dependencies (requirements/adapter.lock), so tests/test_wheel.py installs its wheel into a fresh
# environment without downloading anything; sdk-floor/ holds the lowest temporalio of the range, which
# tests/test_sdk_range.py puts first on the path of the engine-facing tests.
LAB_PTH := "import pathlib, sysconfig; pathlib.Path(sysconfig.get_path('purelib'), 'lab.pth').write_text(str(pathlib.Path.cwd()) + chr(10))"
$(STAMP): pyproject.toml requirements/dev.lock requirements/adapter.lock requirements/sdk-floor.lock
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --require-hashes -r requirements/dev.lock
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	$(PY) -c $(LAB_PTH)
	$(PY) -m pip download --quiet --require-hashes --only-binary=:all: -r requirements/adapter.lock -d $(VENV)/wheelhouse
	$(PY) -m pip install --quiet --no-deps --require-hashes --upgrade --target $(VENV)/sdk-floor -r requirements/sdk-floor.lock
	touch $(STAMP)

## demo: kill a worker mid-run and watch the run resume (starts and stops everything itself)
demo: $(STAMP)
	$(PY) -m lab.demo

## example: an agent from outside the lab (examples/scheduler) killed right after a booking and resumed, on Temporal and the run record
.PHONY: example
example: $(STAMP)
	$(PY) -m lab.scheduler_demo

## loop-demo: an agent loop killed right after a refund and resumed, on Temporal and the run record; each effect once
.PHONY: loop-demo
loop-demo: $(STAMP)
	$(PY) -m lab.loop_demo

## loop-scenario: the agent loop killed right after a refund on every engine (Temporal, run record, DBOS); one table, and its picture in .state/loop.html
.PHONY: loop-scenario
loop-scenario: $(STAMP)
	$(PY) -m lesson.loop_scenario --html .state/loop.html

## scenario: restart between step 2 and step 3 on every engine (in memory, run record, Temporal, DBOS); one table, and its picture in .state/scenario.html
scenario: $(STAMP)
	$(PY) -m lesson.scenario --html .state/scenario.html

## scenario-deploy: the restart that is a deploy (and a move) on every engine; one table
scenario-deploy: $(STAMP)
	$(PY) -m lesson.scenario --deploy

# tests/test_codec_server.py checks the Temporal UI in a real browser: Debian's
# chromium, installed here when missing (root, or sudo), so a fresh machine can
# run the suite with this one command.
CHROMIUM := /usr/bin/chromium
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

$(CHROMIUM):
	$(SUDO) apt-get update
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium

# tests/test_powercut_fs.py and tests/test_power_cut.py mount a FUSE file system that
# loses unsynced writes (lab/powercut.py, through mfusepy): Debian's fuse3 (fusermount3)
# and libfuse3-3, installed here when missing, as chromium is. The kernel's /dev/fuse
# must exist (it does on a stock kernel; a container must be given it).
FUSERMOUNT := /usr/bin/fusermount3

$(FUSERMOUNT):
	$(SUDO) apt-get update
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends fuse3 libfuse3-3

# tests/test_postgres.py, the PostgreSQL case of tests/test_crash_matrix.py and the dbos-pg rows of
# make powercut run DBOS on Debian's postgresql, a server the project starts and stops itself (lab/postgres.py:
# its own data directory under .state/, its own port, as the postgres user when run as root). Installed here
# when missing, as chromium is; the cluster the package creates and starts on its own (pg_lsclusters) is
# stopped: the lab never uses it.
.PHONY: postgresql
postgresql:
	@ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || { \
	  $(SUDO) apt-get update && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends postgresql && \
	  { pg_lsclusters -h | while read -r version cluster rest; do \
	      $(SUDO) pg_ctlcluster "$$version" "$$cluster" stop || true; done; }; }

## ui-check: the Temporal UI in headless Chromium shows an encrypted run decrypted through the codec server
ui-check: $(STAMP) $(CHROMIUM)
	$(PY) -m pytest -q -p no:cacheprovider tests/test_codec_server.py -k "ui_shows"

## pictures: docs/scenario.png, docs/inbox.png and docs/loop.png made again from a real scenario run, in headless Chromium
pictures: $(STAMP) $(CHROMIUM)
	$(PY) -m lesson.pictures

# The suite's budgets (tests/tiers.py prints the wall time and warns past them; a warning, not a failure).
# TEST_JOBS: pytest-xdist workers for make test; most of the suite waits on processes, so more workers than
# cores pay (docs/commands.md has the figures). 0 runs it in this process alone.
TEST_BUDGET ?= 1080
FAST_BUDGET ?= 180
TEST_JOBS ?= 4

## test: the whole suite against real processes (dev server, provider, workers, a browser), every tier
test: $(STAMP) $(CHROMIUM) $(FUSERMOUNT) postgresql
	$(PY) -m pytest -q -p no:cacheprovider --durations=25 --time-budget $(TEST_BUDGET) -n $(TEST_JOBS) --dist worksteal

## test-fast: the tests that start nothing (no process, mount, database or browser): under a minute, budget 3 min
.PHONY: test-fast
test-fast: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider --durations=10 --time-budget $(FAST_BUDGET) -m fast

## powercut: power cuts on every engine (DBOS on PostgreSQL too), placement, cut point, directory rule and sync level (~30 min); one table
powercut: $(STAMP) $(FUSERMOUNT) postgresql
	$(PY) -m lab.powercut_matrix

## api-docs: the adapter's API reference from its docstrings (pdoc), in .state/api/index.html; no warning allowed
# The public surface (CHANGELOG.md): the namespace, the declarations, the plugin, the engines' commands, memory.
API_MODULES := durable_agents durable_agents.agent durable_agents.tools durable_agents.flowclient.agents \
	durable_agents.worker durable_agents.starter durable_agents.runrecord durable_agents.dbosflow durable_agents.memory \
	'!durable_agents.*.__main__' '!durable_agents.*.sides'
.PHONY: api-docs
api-docs: $(STAMP)
	@mkdir -p .state
	PDOC_ALLOW_EXEC=1 $(PY) -m pdoc --output-directory .state/api $(API_MODULES) 2> .state/api-docs.log; \
	  done=$$?; cat .state/api-docs.log; \
	  if [ $$done -ne 0 ] || [ -s .state/api-docs.log ]; then echo "make api-docs: pdoc failed or warned (above)"; exit 1; fi
	@echo "API reference: .state/api/index.html"

## lint: ruff (style, bugs, imports) on everything and mypy on the adapter and the lab's packages; no findings allowed
lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m mypy

## grade: grade an exercise under real kills: make grade N=1 [IMPL=practice|solution|PATH] (exercises/README.md)
N ?=
IMPL ?= practice
grade: $(STAMP)
	@[ -n "$(N)" ] || { echo "make grade N=<exercise number> [IMPL=practice|solution|PATH]: which exercise? (exercises/README.md)"; exit 2; }
	$(PY) -m grader.grade $(N) --impl $(IMPL)

## grade-class: grade every learner's submission (one subfolder each) in one table: make grade-class N=1 DIR=class/ (exercises/README.md)
DIR ?=
.PHONY: grade-class
grade-class: $(STAMP)
	@[ -n "$(N)" ] && [ -n "$(DIR)" ] || { echo "make grade-class N=<exercise number> DIR=<folder of submissions>: which exercise, which class? (exercises/README.md, Grading a class)"; exit 2; }
	$(PY) -m grader.grade $(N) --class $(DIR)

## chaos: 50 concurrent runs, workers SIGKILLed 10 times mid-run, provider faults; checks no duplicate or lost effect
chaos: $(STAMP)
	$(PY) -m lab.chaos

## chaos-loop: agent-loop runs on Temporal, the run record and DBOS, SIGKILLed 10 times each, a varying model, provider faults; checks no duplicate, lost or re-asked (~3 min)
.PHONY: chaos-loop
chaos-loop: $(STAMP)
	$(PY) -m lab.loop_chaos

clean:
	rm -rf .state

## bench: the benchmarks, one after the other (~40 min; docs/benchmarks.md has the figures and each one's own command)
bench: $(STAMP)
	$(PY) bench/bench_step_time.py --runs 20
	$(PY) bench/bench_overhead.py --latency-runs 20 --batch 50 --rounds 2
	$(PY) bench/bench_resume.py --trials 3
	$(PY) bench/bench_resume_record.py --trials 3
	$(PY) bench/bench_runrecord.py --temporal
	$(PY) bench/bench_sync_levels.py
	$(PY) bench/bench_devserver_sync.py
	$(PY) bench/bench_memory.py
	$(PY) bench/bench_scale.py --runs 300 --workers 1,2
	$(PY) bench/bench_engines.py
	$(PY) bench/bench_worker_cache.py --trials 2

## lock: regenerate requirements/*.lock (hashes included) from pyproject.toml, with pip-tools in a throwaway venv
lock:
	rm -rf $(VENV)-lock && $(PYTHON) -m venv $(VENV)-lock
	$(VENV)-lock/bin/pip install --quiet 'pip-tools>=7.4,<8'
	$(VENV)-lock/bin/pip-compile --quiet --extra dev --all-build-deps --generate-hashes --strip-extras --allow-unsafe \
	  --no-emit-index-url --no-emit-find-links --output-file requirements/dev.lock pyproject.toml
	$(VENV)-lock/bin/pip-compile --quiet --extra crypto --extra otel --all-build-deps --generate-hashes --strip-extras \
	  --allow-unsafe --no-emit-index-url --no-emit-find-links --output-file requirements/deploy.lock pyproject.toml
	$(VENV)-lock/bin/pip-compile --quiet --generate-hashes --strip-extras --allow-unsafe --no-emit-index-url \
	  --no-emit-find-links -c requirements/dev.lock --output-file requirements/adapter.lock pyproject.toml
	grep -v '^temporalio==' requirements/dev.lock > $(VENV)-lock/others.txt
	$(VENV)-lock/bin/pip-compile --quiet --generate-hashes --strip-extras --allow-unsafe --no-emit-index-url \
	  --no-emit-find-links -c $(VENV)-lock/others.txt --output-file requirements/sdk-floor.lock requirements/sdk-floor.in
	rm -rf $(VENV)-lock

## peers: the loop beside pydantic-ai's and the OpenAI Agents SDK's Temporal agents, under the same kills, the kill matrix and the clock (docs/peers.md; ~11 min; builds .venv-peers)
.PHONY: peers
PEERS_VENV := .venv-peers
PEERS_STAMP := $(PEERS_VENV)/.installed
# Its own environment: the dev lock's pins plus the peers' (requirements/peers.lock, compiled with the dev lock as
# constraint, so no lab pin moves), never .venv: the lab's own targets never see the peer frameworks.
$(PEERS_STAMP): pyproject.toml requirements/peers.lock
	$(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/python -m pip install --quiet --require-hashes -r requirements/peers.lock
	$(PEERS_VENV)/bin/python -m pip install --quiet --no-deps --no-build-isolation -e .
	$(PEERS_VENV)/bin/python -c $(LAB_PTH)
	touch $(PEERS_STAMP)

peers: $(PEERS_STAMP)
	$(PEERS_VENV)/bin/python -m peers $(PEERS_ARGS)
