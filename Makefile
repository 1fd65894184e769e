# Two commands for a fresh machine:
#   make reproduce   set up .venv with the pinned stack, then print the before/after/reference table
#   make test        set up .venv with the pinned stack, then run the test suite
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# CPU-only hosts need this for `import unsloth`; set here for our runs only, never by the plugin.
RUN := UNSLOTH_ALLOW_CPU=1

.PHONY: setup reproduce test test-fast matrix mutation clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml requirements-dev.txt requirements-sharded.txt constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c constraints.txt -r requirements-dev.txt
	# DeepSpeed (the `sharded` extra) builds against the torch just installed: no build isolation.
	$(BIN)/pip install -q --no-build-isolation -c constraints.txt -r requirements-sharded.txt
	# unsloth pulls torchvision, which cannot load beside the CPU torch and breaks `import unsloth`.
	$(BIN)/pip uninstall -q -y torchvision
	$(BIN)/pip install -q --no-deps -e .
	touch $@

reproduce: setup
	$(RUN) $(BIN)/unsloth-diffusion-norm reproduce

test: setup
	$(RUN) $(BIN)/python -m pytest -q -p no:cacheprovider

# The unit tier alone: no Unsloth imported, seconds.
test-fast: setup
	$(BIN)/python -m pytest -q -p no:cacheprovider tests/unit

# Every supported Unsloth release (and the oldest transformers / TRL that work), one environment per
# leg under .matrix/, the whole suite in each; rewrites the README's compatibility table.
matrix:
	$(PYTHON) scripts/matrix.py --readme README.md $(MATRIX_FLAGS)

# Mutation testing of the core (about an hour and a half on 2 cores; not in CI): mutmut and the fresh-interpreter /
# launched-rank pass here, then the dense and native legs for what no test reached here; writes
# mutation/report.md (the score and every mutant's fate). See scripts/mutation.py.
mutation: setup
	$(BIN)/pip install -q -c constraints.txt -r requirements-mutation.txt
	rm -rf mutants
	$(RUN) $(BIN)/python scripts/mutation.py run --label unsloth-2026.10.6
	$(RUN) $(BIN)/python scripts/mutation.py legs
	$(BIN)/python scripts/mutation.py report

clean:
	rm -rf $(VENV) .matrix unsloth_compiled_cache mutants
