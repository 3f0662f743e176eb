# `make test` and `make run` each set everything up on a fresh machine.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TYPED := harness scripted_agents soak

.PHONY: test test-endpoint run run-scripted bench soak lint typecheck mutation demo-workspace clean browser

# llama.cpp is built for any x86-64 with AVX2, not for this CPU (`-march=native`): a VM that advertises AMX
# without enabling it kills a native build with SIGILL at the first batched matmul.
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(BIN)/pip install --quiet --disable-pip-version-check --config-settings editable_mode=compat -e '.[dev,inference,soak]'
	touch $(STAMP)

test: $(STAMP) browser
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	@# mypy (one core, about 35 s cold) runs beside the tests, whose workers wait on agents a third of the time;
	@# its report follows theirs, and either failing fails the target (pytest's 5, no tests, too)
	@log=$$(mktemp); $(BIN)/mypy $(TYPED) > $$log 2>&1 & types=$$!; \
	$(BIN)/pytest -n 2 $(PYTEST_ARGS); tests=$$?; \
	wait $$types; typed=$$?; echo "mypy $(TYPED):"; cat $$log; rm -f $$log; \
	[ $$tests -eq 0 ] && [ $$typed -eq 0 ]
	@if [ -n "$(ENDPOINT_TIER)" ]; then $(MAKE) --no-print-directory test-endpoint; fi

# LoopInference a second time with the agent on an OpenAI-compatible server instead of in-process: by default
# llama-cpp-python's own server on the pinned model, on a free loopback port (the path a user's llama.cpp,
# Ollama or vLLM server takes). `make test ENDPOINT_TIER=` leaves it out; `ENDPOINT_TIER=URL` (with
# `ENDPOINT_PYTEST_ARGS=--loop-model=NAME`) runs it against your own server. Serial: the server takes both cores.
ENDPOINT_TIER ?= llama-cpp-server
test-endpoint: $(STAMP)
	$(BIN)/pytest -m LoopInference --loop-endpoint "$(or $(ENDPOINT_TIER),llama-cpp-server)" $(ENDPOINT_PYTEST_ARGS)

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

# Mutation testing of the policy and the shell parser (not part of `make test`: about 40 minutes on 2 cores).
# Then every surviving mutant is hunted with a corpus of requests: one refused by the original and allowed by
# the mutant is a refusal-to-allow survivor, and the run fails.
mutation: $(STAMP)
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(BIN)/pip install --quiet --disable-pip-version-check --config-settings editable_mode=compat -e '.[dev,inference,soak,mutation]'
	rm -rf mutants
	$(BIN)/mutmut run --max-children 2
	$(BIN)/python tools/hunt_mutants.py --score

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# Strict (pyproject.toml [tool.mypy]) on the kernel, both agents and the soak.
typecheck: $(STAMP)
	$(BIN)/mypy $(TYPED)

# The status page's test drives a real Chromium: Debian's package (Playwright's own download is not used).
browser:
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || [ -n "$$LOOP_HARNESS_CHROMIUM" ] || \
	  { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null; } || \
	  { echo "the status page test needs Chromium: sudo apt-get install chromium (or set LOOP_HARNESS_CHROMIUM)" >&2; exit 1; }

demo-workspace:
	bash examples/make-demo-workspace.sh .demo

clean:
	rm -rf $(VENV) .demo .pytest_cache .ruff_cache .mypy_cache mutants
