# The two set-up commands of the README: `make wheels` and `make test`.  Each creates the
# virtual environment it needs (once) and keeps downloads in the caches.
PYTHON    ?= python3
VENV      := .venv
BVENV     := .venv-build
# One payload venv per torch version, shared by the SGLang lines on it: torch 2.11.0 holds the
# 0.5.17 line, torch 2.14.1 the 0.5.23 line (the 0.5.9 line runs on torch 2.9.1 in $(VENV));
# tests/tiers.py names the same.
PVENV_T211 := .venv-torch-2.11
PWHEELS_T211 := .cache/wheels/torch-2.11
PVENV_T214 := .venv-torch-2.14
PWHEELS_T214 := .cache/wheels/torch-2.14
PIP_FLAGS ?= -q --disable-pip-version-check
# The test venvs skip pip's byte-compilation of every module (torch alone has thousands): what
# the tests import is compiled on first import.
TEST_PIP_FLAGS := $(PIP_FLAGS) --no-compile
PROFILE   ?= cu130-sm120
ARGS      ?=
LINE      ?=

.PHONY: wheels test test-venvs test-fast test-mutation test-reliability gpu-test gpu-bundle verify review lint bench bench-outlook clean install

$(BVENV)/.stamp: pyproject.toml
	@echo "creating $(BVENV) with patchkit and its dependencies (once: about 20 s)"
	$(PYTHON) -m venv $(BVENV)
	$(BVENV)/bin/pip install $(PIP_FLAGS) -e .
	touch $@

$(VENV)/.stamp-core: pyproject.toml
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install $(PIP_FLAGS) -e '.[test,compression,fast-inflate]'
	touch $@

$(VENV)/.stamp-payload: build/constraints/payload-test.txt $(VENV)/.stamp-core
	@echo "installing torch 2.9.1 and the payload test stack into $(VENV) (once: about 7 GB, minutes)"
	$(VENV)/bin/pip install $(TEST_PIP_FLAGS) -r build/constraints/payload-test.txt
	touch $@

# Its wheels (2.7 GB, torch 2.11.0) are kept in .cache/: a later build installs from there.
$(PVENV_T211)/.stamp: build/constraints/payload-test-0.5.17.txt pyproject.toml
	test -x $(PVENV_T211)/bin/python || $(PYTHON) -m venv $(PVENV_T211)
	@echo "installing torch 2.11.0 and the payload stack of its lines into $(PVENV_T211) (once: 2.7 GB of wheels, minutes)"
	$(PVENV_T211)/bin/pip download $(PIP_FLAGS) -d $(PWHEELS_T211) setuptools wheel \
	    -r build/constraints/payload-test-0.5.17.txt '.[test]'
	$(PVENV_T211)/bin/pip install $(TEST_PIP_FLAGS) --no-index --find-links $(PWHEELS_T211) \
	    -e '.[test]' -r build/constraints/payload-test-0.5.17.txt
	touch $@

$(PVENV_T214)/.stamp: build/constraints/payload-test-0.5.23.txt pyproject.toml
	test -x $(PVENV_T214)/bin/python || $(PYTHON) -m venv $(PVENV_T214)
	@echo "installing torch 2.14.1 and the payload stack of its lines into $(PVENV_T214) (once: 3 GB of wheels, minutes)"
	$(PVENV_T214)/bin/pip download $(PIP_FLAGS) -d $(PWHEELS_T214) setuptools wheel \
	    -r build/constraints/payload-test-0.5.23.txt '.[test]'
	$(PVENV_T214)/bin/pip install $(TEST_PIP_FLAGS) --no-index --find-links $(PWHEELS_T214) \
	    -e '.[test]' -r build/constraints/payload-test-0.5.23.txt
	touch $@

# Debian's chromium for the review page's browser test (skips cleanly where it cannot install).
$(VENV)/.stamp-browser: tests/browser/ensure-chromium.sh $(VENV)/.stamp-core
	bash tests/browser/ensure-chromium.sh
	touch $@

## wheels: patched, versioned wheels with provenance in dist/ (the newest SGLang line, 0.5.23,
## the default, and the FlashInfer line it names, none for 0.5.23; LINE=0.5.17 builds that
## line and the lines it is built with, e.g. the cp311 and cp312 wheels of a wheel base and
## its FlashInfer 0.6.15.post1; LINE=0.5.9 the seed line on its sdists)
wheels: $(BVENV)/.stamp
	$(BVENV)/bin/patchkit build --target all $(if $(LINE),--line $(LINE)) --profile $(PROFILE) --out dist $(ARGS)

## install: `patchkit` on PATH: its own venv under $(PREFIX)/share/patchkit, a link in $(PREFIX)/bin
PREFIX ?= $(HOME)/.local
install:
	@echo "installing patchkit into $(PREFIX)/share/patchkit/venv (about 20 s)"
	$(PYTHON) -m venv $(PREFIX)/share/patchkit/venv
	$(PREFIX)/share/patchkit/venv/bin/pip install $(PIP_FLAGS) --upgrade .
	mkdir -p $(PREFIX)/bin
	ln -sf $(PREFIX)/share/patchkit/venv/bin/patchkit $(PREFIX)/bin/patchkit
	@echo "installed: $(PREFIX)/bin/patchkit (run it inside a checkout of the series, or -C DIR)"
	@case ":$$PATH:" in *":$(PREFIX)/bin:"*) ;; *) echo "note: $(PREFIX)/bin is not on PATH;" \
	    "add it: export PATH=\"$(PREFIX)/bin:\$$PATH\" (e.g. in ~/.profile)";; esac

## test: the CPU tier in parts, each timed (tests/tiers.py prints the summary): lint, the
## manager tests, the payload tests of each SGLang line in its torch's venv; pytest on every core;
## a rotating sample of each long class (planted mistakes, kill points: tests/sampling.py)
## (the venvs are made two at a time; their time is the summary's first row)
test:
	@start=$$(date +%s); $(MAKE) --no-print-directory -j2 test-venvs && \
	    $(VENV)/bin/python tests/tiers.py --setup-seconds $$(( $$(date +%s) - start )) \
	    $(if $(ARGS),-- $(ARGS))

test-venvs: $(VENV)/.stamp-payload $(VENV)/.stamp-browser $(PVENV_T211)/.stamp $(PVENV_T214)/.stamp

## test-fast: manager tests only (no torch)
test-fast: $(VENV)/.stamp-core
	$(VENV)/bin/python -m pytest -n auto --dist worksteal -m "not gpu and not payload" $(ARGS)

## test-mutation: every planted mistake of every line (tests/mutation/), two at a time
test-mutation: $(VENV)/.stamp-payload $(PVENV_T211)/.stamp $(PVENV_T214)/.stamp
	$(VENV)/bin/python tests/mutation/plant.py --line 0.5.9 --jobs 2
	$(PVENV_T211)/bin/python tests/mutation/plant.py --line 0.5.17 --jobs 2
	$(PVENV_T214)/bin/python tests/mutation/plant.py --line 0.5.23 --jobs 2

## test-reliability: the reliability tests with every kill point (PATCHKIT_SAMPLE=all), a longer,
## randomized model-based search and the kill tests ten times in a row (MODEL_EXAMPLES sequences
## of MODEL_STEPS steps); ends with a table per test file: cases run, passed, failed, skipped and
## kill points tried (tests/reliability/summary.py, from the runs' JUnit XML in RELIABILITY_OUT)
MODEL_EXAMPLES  ?= 2000
MODEL_STEPS     ?= 10
RELIABILITY_OUT ?= work/reliability
test-reliability: $(VENV)/.stamp-core
	rm -rf $(RELIABILITY_OUT) && mkdir -p $(RELIABILITY_OUT)
	status=0; \
	PATCHKIT_SAMPLE=all PATCHKIT_MODEL_EXAMPLES=$(MODEL_EXAMPLES) PATCHKIT_MODEL_STEPS=$(MODEL_STEPS) \
		PATCHKIT_KILL_TALLY=$(abspath $(RELIABILITY_OUT))/tally-all.jsonl \
		$(VENV)/bin/python -m pytest -n auto --dist worksteal \
		--junitxml=$(RELIABILITY_OUT)/all.xml tests/reliability $(ARGS) || status=1; \
	for i in 1 2 3 4 5 6 7 8 9 10; do \
		PATCHKIT_SAMPLE=all PATCHKIT_KILL_TALLY=$(abspath $(RELIABILITY_OUT))/tally-kill.jsonl \
		$(VENV)/bin/python -m pytest -q -n auto --junitxml=$(RELIABILITY_OUT)/kill-$$i.xml \
		tests/reliability/test_kill.py || { status=1; break; }; done; \
	$(VENV)/bin/python tests/reliability/summary.py $(RELIABILITY_OUT); \
	exit $$status

## gpu-test: the GPU tier, on a host with the pinned stack and GPUs (skips cleanly without)
gpu-test: $(VENV)/.stamp-core
	$(VENV)/bin/python -m pytest -m gpu tests/gpu $(ARGS)

## gpu-bundle: the GPU tier's pinned, hash-checked bundle for the lent H200 (docs/gpu.md);
## LINE=0.5.12 for another line's bundle (gpu/bundles/LINE.toml; default 0.5.17);
## SGLANG_WHEEL=path picks the sglang wheel (default: dist/'s patched LINE cp312 wheel, built
## first when the line has a series, else the PyPI wheel); GPU_OPTIONAL=cutlass adds a group
GPU_BUNDLE   ?= .gpu-stage
SGLANG_WHEEL ?=
GPU_LINE      = $(or $(LINE),0.5.17)
GPU_OPTIONAL ?=
gpu-bundle: $(BVENV)/.stamp
	$(if $(SGLANG_WHEEL),,$(if $(wildcard patches/sglang/$(GPU_LINE)/series),$(BVENV)/bin/patchkit build --target sglang --line $(GPU_LINE) --python-tag cp312 --out dist))
	$(BVENV)/bin/python gpu/bundle.py --line $(GPU_LINE) --out $(GPU_BUNDLE) $(if $(SGLANG_WHEEL),--sglang-wheel $(SGLANG_WHEEL)) $(foreach g,$(GPU_OPTIONAL),--optional $(g))

## verify: static CUDA 13 / torch cu130 ABI check of the environment that runs the stack:
##   VERIFY_ENV (a venv, its python or a site-packages; default the active virtualenv, else
##   .venv); an environment with nothing to check fails.  The profile: PATCHKIT_PROFILE, else
##   PROFILE when set, else the one verify picks (the profile of the sglang installed)
VERIFY_ENV ?= $(or $(VIRTUAL_ENV),$(VENV))
VERIFY_PROFILE = $(or $(PATCHKIT_PROFILE),$(if $(filter-out file,$(origin PROFILE)),$(PROFILE)))
verify: $(BVENV)/.stamp
	$(BVENV)/bin/patchkit verify --env $(VERIFY_ENV) $(if $(VERIFY_PROFILE),--profile $(VERIFY_PROFILE)) $(ARGS)

## review: the upstream-diff review page
review: $(BVENV)/.stamp
	$(BVENV)/bin/patchkit review --html dist/review.html $(ARGS)

lint: $(VENV)/.stamp-core
	$(VENV)/bin/patchkit lint
	$(VENV)/bin/ruff check patchkit tests bench gpu
	$(VENV)/bin/vulture --min-confidence 60 patchkit tests/vulture_allow.py

bench: $(VENV)/.stamp-payload
	$(VENV)/bin/python bench/apply.py
	$(VENV)/bin/python bench/fixed_cost.py
	$(VENV)/bin/python bench/rebase.py
	$(VENV)/bin/python bench/wheels.py
	$(VENV)/bin/python bench/verify.py
	$(VENV)/bin/python bench/scale.py --sizes 10,100 --runs 3

## bench-outlook: release day, cold and warm outlook and a warm rebase preview beside pip
## download of the same release files (network; 15-20 minutes on a loaded 2-core machine)
bench-outlook: $(VENV)/.stamp-core
	env -u PYTHONDONTWRITEBYTECODE $(VENV)/bin/python bench/outlook.py $(ARGS)

clean:
	rm -rf work dist build/work
