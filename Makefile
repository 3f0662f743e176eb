# `make test` and `make run` each set everything up on a fresh machine.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test run run-scripted bench soak lint demo-workspace clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check --config-settings editable_mode=compat -e '.[test,inference,soak]'
	touch $(STAMP)

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/pytest -n 2

run: $(STAMP) demo-workspace
	$(BIN)/loop-harness models fetch
	$(BIN)/loop-harness run examples/inference-demo.yaml

run-scripted: $(STAMP) demo-workspace
	$(BIN)/loop-harness run examples/demo.yaml

bench: $(STAMP)
	$(BIN)/loop-harness bench kernel
	$(BIN)/loop-harness bench inference

soak: $(STAMP)
	.github/scripts/run-loop-soak.sh

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

demo-workspace:
	bash examples/make-demo-workspace.sh .demo

clean:
	rm -rf $(VENV) .demo .pytest_cache .ruff_cache
