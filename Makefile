# Two commands for a fresh machine: `make smoke` (the main job) and `make test` (the tests).
PYTHON ?= python3
TOOLS := .venv-tools
NOX := $(TOOLS)/bin/nox

.PHONY: test lint smoke runtime-smoke tools schemas

$(NOX):
	$(PYTHON) -m venv $(TOOLS)
	$(TOOLS)/bin/python -m pip install -q nox==2026.10.20

tools: $(NOX)

test: $(NOX)
	$(NOX) -s tests

lint: $(NOX)
	$(NOX) -s lint

runtime-smoke: $(NOX)
	$(NOX) -s runtime_smoke

smoke: runtime-smoke
