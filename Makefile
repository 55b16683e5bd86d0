# The two commands a newcomer needs (see README):
#   make serve   set up (first time: a few minutes) and run saga serve on the embedded default model
#   make test    set up and run every test (fast tier + real tier against one real saga serve)
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: setup serve test test-fast test-real test-vllm-compat bench-hints proto clean-model

setup:
	scripts/setup.sh

serve: setup
	$(VENV)/bin/saga serve

test: setup
	$(PY) -m pytest tests $(PYTEST_ARGS)

test-fast: setup
	$(PY) -m pytest tests/fast $(PYTEST_ARGS)

test-real: setup
	$(PY) -m pytest tests/real $(PYTEST_ARGS)

# The plugin's vLLM tests against the other supported vLLM release, in its own venv.
COMPAT_VLLM ?= 0.31.0
test-vllm-compat:
	SAGA_VENV=$(CURDIR)/.venv-vllm-$(COMPAT_VLLM) SAGA_VLLM_VERSION=$(COMPAT_VLLM) SAGA_EXTRAS=server,dev scripts/setup.sh
	.venv-vllm-$(COMPAT_VLLM)/bin/python -m pytest tests/fast/vllm $(PYTEST_ARGS)

bench-hints: setup
	$(PY) -m benchmarks.hints_bench

proto:
	$(PY) scripts/gen_proto.py
