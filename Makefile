# Two commands do all the set-up on a fresh machine with only Python 3.11+ (see README):
#   make serve   -> virtualenv, install, start the service on http://127.0.0.1:8000
#   make test    -> virtualenv, install with test tools, Chromium for the browser tests, ruff, the whole suite
VENV ?= .venv
PY := $(VENV)/bin/python
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: serve test lint bench browser

$(VENV)/.runtime: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e .
	touch $@

$(VENV)/.test: $(VENV)/.runtime
	$(PY) -m pip install -q -e '.[test]'
	touch $@

serve: $(VENV)/.runtime
	$(VENV)/bin/commplan serve --host $(HOST) --port $(PORT)

browser:
	bash scripts/install-browser.sh

lint: $(VENV)/.test
	$(VENV)/bin/ruff check app planner collectives tests bench

test: $(VENV)/.test browser lint
	$(PY) -m pytest

bench: $(VENV)/.test
	$(PY) -m pytest bench --benchmark-only --benchmark-columns=min,median,max,rounds
	$(PY) bench/bench_execute.py
	PYTHONPATH=. $(PY) bench/bench_search.py
	PYTHONPATH=. $(PY) bench/library_table.py
	PYTHONPATH=. $(PY) bench/step_validation.py
	PYTHONPATH=. $(PY) bench/serving_validation.py
	PYTHONPATH=. $(PY) bench/serving_speed.py
