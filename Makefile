# The two commands of the README, and a few more. Each creates .venv and
# installs the project if needed (again whenever pyproject.toml changes).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

## demo: kill a worker mid-run and watch the run resume (starts and stops everything itself)
demo: $(STAMP)
	$(PY) -m lab.demo

## test: the whole suite against real processes (dev server, provider, workers)
test: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider

clean:
	rm -rf .state
