# The two set-up commands of the README: `make wheels` and `make test`.  Each creates the
# virtual environment it needs (once) and keeps downloads in the caches.
PYTHON    ?= python3
VENV      := .venv
BVENV     := .venv-build
PIP_FLAGS ?= -q --disable-pip-version-check
PROFILE   ?= cu130-sm120
ARGS      ?=
LINE      ?=

.PHONY: wheels test test-fast gpu-test verify review lint bench clean

$(BVENV)/.stamp: pyproject.toml
	$(PYTHON) -m venv $(BVENV)
	$(BVENV)/bin/pip install $(PIP_FLAGS) -e .
	touch $@

$(VENV)/.stamp-core: pyproject.toml
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install $(PIP_FLAGS) -e '.[test,compression]'
	touch $@

$(VENV)/.stamp-payload: build/constraints/payload-test.txt $(VENV)/.stamp-core
	$(VENV)/bin/pip install $(PIP_FLAGS) -r build/constraints/payload-test.txt
	touch $@

# Debian's chromium for the review page's browser test (skips cleanly where it cannot install).
$(VENV)/.stamp-browser: tests/browser/ensure-chromium.sh $(VENV)/.stamp-core
	bash tests/browser/ensure-chromium.sh
	touch $@

## wheels: patched, versioned wheels with provenance in dist/ (each target's default line;
## LINE=0.5.12 builds that line instead, e.g. the cp311 and cp312 wheels of a wheel base)
wheels: $(BVENV)/.stamp
	$(BVENV)/bin/patchkit build --target all $(if $(LINE),--line $(LINE)) --profile $(PROFILE) --out dist $(ARGS)

## test: the CPU tier (manager tests and the payload tests of every patched path)
test: $(VENV)/.stamp-payload $(VENV)/.stamp-browser
	$(VENV)/bin/patchkit lint
	$(VENV)/bin/python -m pytest -m "not gpu" $(ARGS)

## test-fast: manager tests only (no torch)
test-fast: $(VENV)/.stamp-core
	$(VENV)/bin/python -m pytest -m "not gpu and not payload" $(ARGS)

## gpu-test: the GPU tier, on a host with the pinned stack and GPUs (skips cleanly without)
gpu-test: $(VENV)/.stamp-core
	$(VENV)/bin/python -m pytest -m gpu tests/gpu $(ARGS)

## verify: static CUDA 13 / torch cu130 ABI check of this interpreter's environment
verify: $(BVENV)/.stamp
	$(BVENV)/bin/patchkit verify --env --profile $(PROFILE) $(ARGS)

## review: the upstream-diff review page
review: $(BVENV)/.stamp
	$(BVENV)/bin/patchkit review --html dist/review.html $(ARGS)

lint: $(VENV)/.stamp-core
	$(VENV)/bin/patchkit lint
	$(VENV)/bin/ruff check patchkit tests bench

bench: $(VENV)/.stamp-payload
	$(VENV)/bin/python bench/apply.py
	$(VENV)/bin/python bench/rebase.py
	$(VENV)/bin/python bench/wheels.py
	$(VENV)/bin/python bench/verify.py

clean:
	rm -rf work dist build/work
