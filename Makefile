# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: venv test check demo bench lint clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,postgres,web]'
	touch $(STAMP)

# The suite runs on TEST_WORKERS processes (pytest-xdist; each has its own PostgreSQL database and
# temporary files; a module's tests stay on one worker). TEST_WORKERS=0 runs it in this process.
TEST_WORKERS ?= 2

test: check $(STAMP)
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

# Static checks, fast and first: lint, formatting, strict types, the import layering (pyproject.toml).
check: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy
	$(VENV)/bin/lint-imports

demo: $(STAMP)
	$(VENV)/bin/admission-plane demo

bench: $(STAMP)
	mkdir -p bench-results
	$(PY) -m pytest benchmarks --benchmark-only --benchmark-json=bench-results/benchmarks.json $(PYTEST_ARGS)

lint: check

clean:
	rm -rf $(VENV) build dist *.egg-info .benchmarks bench-results
