# The README's two commands: `make demo` (the main job: reference policies, then a short
# SlateQ / FedSlate / random comparison) and `make test` (set-up, lint, tests).
# Both create the virtual environment on first use; pins come from constraints.txt.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.fedrec-installed
# Small-tensor PyTorch on 2 shared cores is fastest single-threaded with a passive OpenMP wait policy.
export OMP_NUM_THREADS ?= 1
export OMP_WAIT_POLICY ?= PASSIVE
export MKL_NUM_THREADS ?= 1

.PHONY: demo test lint bench docs install clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -c constraints.txt -e ".[test]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/fedrec demo --fedslate

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: lint
	$(BIN)/python -m pytest -q -n 2 --durations=20

bench: $(STAMP)
	$(BIN)/fedrec bench envs

# The API reference and the guides as a website, offline, into docs/_build/html (open index.html).
# Warnings are errors, as in tests/test_sphinx_docs.py.
docs: $(STAMP)
	$(BIN)/python -m sphinx -b html -W --keep-going -q docs docs/_build/html

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache docs/_build
