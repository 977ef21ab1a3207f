# One-command setup: `make run` and `make test` create .venv and install everything when missing.
PY ?= python3.11
VARIANT := $(shell nvidia-smi -L >/dev/null 2>&1 && echo cuda || echo cpu)
VENV := .venv
STAMP := $(VENV)/.installed-$(VARIANT)
export TMPDIR := $(CURDIR)/.tmp
export TORCHINDUCTOR_CACHE_DIR := $(CURDIR)/.cache/inductor
export PYTHONUNBUFFERED := 1

.PHONY: install test test-unit run lint clean

$(STAMP): pyproject.toml requirements/common.txt requirements/$(VARIANT).txt scripts/install.sh
	@mkdir -p $(TMPDIR)
	PYTHON=$(PY) bash scripts/install.sh $(VARIANT)
	@touch $@

install: $(STAMP)

# Two test processes: one alone leaves the cores idle while a test waits (runs, servers, polls); with two,
# both cores were 95-99% busy through a whole run (sampled from /proc/stat), so a third would only queue.
# --dist loadfile keeps each module's tests, and the Ray or server its fixtures share, in one process;
# modules go out longest first (tests/ordering.py), which --no-loadscope-reorder keeps.
TEST_WORKERS ?= 2
PYTEST_ARGS ?=

# mypy (about 100 CPU-seconds without its cache, as in a fresh clone) runs beside pytest at the lowest
# priority: it takes the CPU time pytest leaves idle (10-18% of a run) instead of a core while the first,
# longest tests start up. Its output is printed after pytest's and either failing fails.
test: $(STAMP)
	$(VENV)/bin/ruff check .
	@nice -n 19 $(VENV)/bin/mypy > $(TMPDIR)/mypy.log 2>&1 & mypy=$$!; \
	$(VENV)/bin/python -m pytest tests -q -ra -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder \
		--durations=15 $(PYTEST_ARGS); rc=$$?; \
	wait $$mypy; mypy_rc=$$?; echo "mypy:"; cat $(TMPDIR)/mypy.log; \
	test $$rc -eq 0 -a $$mypy_rc -eq 0

test-unit: $(STAMP)
	$(VENV)/bin/python -m pytest tests/unit -q

# Each `make run` is a new experiment (runs/quickstart-<time>/); `rollart train` never overwrites one.
run: $(STAMP)
	$(VENV)/bin/rollart train configs/quickstart.yaml --set name=quickstart-$(shell date +%Y%m%d-%H%M%S)

# mypy reads its settings and the files it checks (engine/, infra/) from pyproject.toml; its cache,
# .mypy_cache, makes a run after a small change take seconds.
lint: $(STAMP)
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check . && $(VENV)/bin/mypy

clean:
	rm -rf $(VENV) .tmp .cache .mypy_cache runs
