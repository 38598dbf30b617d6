# The two commands of the README, and a few more. Each creates .venv and
# installs the project if needed (again whenever pyproject.toml changes).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo scenario test bench clean chaos

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

## demo: kill a worker mid-run and watch the run resume (starts and stops everything itself)
demo: $(STAMP)
	$(PY) -m lab.demo

## scenario: restart between step 2 and step 3 on every engine (in memory, run record, Temporal); one table
scenario: $(STAMP)
	$(PY) -m lesson.scenario

## test: the whole suite against real processes (dev server, provider, workers)
test: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider

## chaos: 50 concurrent runs, workers SIGKILLed 10 times mid-run, provider faults; checks no duplicate or lost effect
chaos: $(STAMP)
	$(PY) -m lab.chaos

clean:
	rm -rf .state
