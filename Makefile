# Two commands for a fresh machine: `make smoke` (the main job) and `make test` (the tests).
PYTHON ?= python3
TOOLS := .venv-tools
NOX := $(TOOLS)/bin/nox
# The profile and level an audit expects come from the command, never from the files it audits.
PROFILE ?= cpu-reference
LEVEL ?= release_smoke
# A release gate's gate.json for `make verify` to compare with the statements of out/release-assets (optional).
GATE_RECORD ?=

.PHONY: docs verl verl-env test lint smoke full release-assets verify harness-tests lint-workflows runtime-smoke tools schemas

$(NOX):
	$(PYTHON) -m venv $(TOOLS)
	$(TOOLS)/bin/python -m pip install -q nox==2026.10.20

tools: $(NOX)

# The suite, then the decode step's triton kernels under triton's interpreter (their own venv, with triton).
test: $(NOX)
	$(NOX) -s tests kernels

lint: $(NOX)
	$(NOX) -s lint

# The documentation site (mkdocs-material, requirements-docs.txt), built with --strict into .nox/docs/tmp/site.
docs: $(NOX)
	$(NOX) -s docs

runtime-smoke: $(NOX)
	$(NOX) -s runtime_smoke

# Release harness (owned by harness/): torch-free nox venvs; qualification venvs are made fresh by the harness.
smoke: $(NOX)
	$(NOX) -s smoke

# The handoff diagnosis runs in verl 0.9.1's own venv (.nox/verl_env, the candidate overlaid by the harness):
# `full` builds it first (once; later runs reuse it), so `--verl-python` is never missing.
full: verl-env
	$(NOX) -s full

release-assets: $(NOX)
	$(NOX) -s release_assets -- --profile $(PROFILE)

verify: $(NOX)
	$(NOX) -s verify -- --profile $(PROFILE) --level $(LEVEL) $(if $(GATE_RECORD),--gate-record $(GATE_RECORD))

harness-tests: $(NOX)
	$(NOX) -s harness_tests

lint-workflows: $(NOX)
	$(NOX) -s lint_workflows

# verl 0.9.1's own venv from known-good/verl-0.9.1-cpu.txt (it pins transformers < 5.11), without miniverl.
verl-env: $(NOX)
	$(NOX) -s verl_env

# The handoff tests against the real verl 0.9.1, in verl-env's interpreter with this checkout on PYTHONPATH.
verl: verl-env
	$(NOX) -s verl
