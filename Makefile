# Two commands do all the set-up on a fresh machine with only Python 3.11+ (see README):
#   make serve   -> virtualenv, install, start the service on http://127.0.0.1:8000
#   make test    -> virtualenv, install (+ Chromium for the browser tests), ruff, the whole test suite
VENV ?= .venv
PY := $(VENV)/bin/python
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: serve test lint bench install browser

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $@

install: $(VENV)/.installed

serve: $(VENV)/.installed
	$(VENV)/bin/commplan serve --host $(HOST) --port $(PORT)

browser:
	bash scripts/install-browser.sh

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check app planner collectives tests bench

test: $(VENV)/.installed browser lint
	$(PY) -m pytest

bench: $(VENV)/.installed
	$(PY) -m pytest bench --benchmark-only --benchmark-columns=min,median,max,rounds
	$(PY) bench/bench_execute.py
