# Two commands for a fresh machine:
#   make reproduce   set up .venv with the pinned stack, then print the before/after/reference table
#   make test        set up .venv with the pinned stack, then run the test suite
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# --compile-bytecode: pip compiles what it installs, uv does not by default; without it every fresh process
# compiles transformers and Unsloth again wherever PYTHONDONTWRITEBYTECODE is set (seconds per process).
UV := VIRTUAL_ENV=$(abspath $(VENV)) UV_COMPILE_BYTECODE=1 $(BIN)/uv
# CPU-only hosts need this for `import unsloth`; set here for our runs only, never by the plugin.
RUN := UNSLOTH_ALLOW_CPU=1

.PHONY: setup reproduce test test-fast test-archive lint dist wheel-check docs-outputs matrix mutation convergence registered replicate block-study block-replicate fuzz clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml requirements-tools.txt requirements-dev.txt requirements-sharded.txt constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -r requirements-tools.txt
	# torch through pip, which reads this machine's pip configuration (here: a local CPU wheel); uv does not.
	$(BIN)/pip install -q -c constraints.txt torch==2.13.0
	# The rest through uv (minutes faster than pip); the pinned torch above satisfies every requirement on it.
	$(UV) pip install -q -c constraints.txt -r requirements-dev.txt
	# DeepSpeed (the `sharded` extra) builds against the torch just installed: no build isolation.
	$(UV) pip install -q --no-build-isolation -c constraints.txt -r requirements-sharded.txt
	# unsloth pulls torchvision, which cannot load beside the CPU torch and breaks `import unsloth`.
	$(UV) pip uninstall -q torchvision
	$(UV) pip install -q --no-deps -e .
	touch $@

reproduce: setup
	$(RUN) $(BIN)/unsloth-diffusion-norm reproduce

# Two workers, whole files each (module fixtures such as a launch of ranks run once), the longest files first
# (tests/conftest.py): most of the suite's time
# is single-threaded (process start-up, `import unsloth`), so the second core halves it.
WORKERS ?= 2
# The three-rank and two-node launches (markers three_ranks, multi_node) are the dense and native legs'
# (`make matrix`): the counting rule and per-sample keys they check are shared by every loss shape.
TEST := $(RUN) $(BIN)/python -m pytest -q -p no:cacheprovider -n $(WORKERS) --dist loadfile --no-loadscope-reorder \
	-m "not three_ranks and not multi_node and not notebook"

test: setup
	$(TEST)

# The unit tier from a source archive of HEAD (no .git), as a distribution builds and tests the package.
test-archive: setup
	where=$$(mktemp -d) && git archive HEAD | tar x -C $$where && cd $$where && \
		PYTHONPATH=$$where $(abspath $(BIN))/python -m pytest -q -p no:cacheprovider tests/unit; \
		status=$$?; rm -rf $$where; exit $$status

# ruff, configured in pyproject.toml: the lint rules, then the formatting (seconds).
lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# The unit tier alone: no Unsloth imported, seconds.
test-fast: setup
	$(BIN)/python -m pytest -q -p no:cacheprovider tests/unit

# The release: the wheel and the sdist into dist/, checked by twine (seconds; tests/unit/test_wheel.py holds the
# wheel's contents).
dist: setup
	rm -rf dist
	$(BIN)/python -m build --no-isolation --outdir dist .
	$(BIN)/twine check dist/*

# The docs' real-output blocks of the commands users run, rerun and stamped with the commit and the versions
# (scripts/docs_outputs.py; commit the code first); doctor on 2026.10.9 runs in that matrix leg (built once).
docs-outputs: setup
	$(BIN)/python scripts/matrix.py --legs $(NATIVE_LEG) --build-only
	$(RUN) $(BIN)/python scripts/docs_outputs.py

# The wheel as a user gets it: installed (not editable) into a fresh environment beside the pinned stack, and
# `--version`, `status`, `reproduce` and `doctor` run from outside the checkout (under a minute).
wheel-check: dist
	scripts/wheel_check.sh

# Every supported Unsloth release (and the oldest transformers / TRL that work), one environment per
# leg under .matrix/, the tiers that tell releases apart in each; rewrites docs/compatibility.md's table.
matrix: setup
	$(BIN)/python scripts/matrix.py --page docs/compatibility.md $(MATRIX_FLAGS)
	# The run wrote records/matrix.json: the pages quote it, so render them again (tests/unit/test_records.py).
	$(BIN)/python scripts/docs_outputs.py --render

# Does the fix change the model? (docs/convergence.md; about 75 minutes on 2 cores.) Part 2's third arm, Unsloth's own
# fix, is trained on 2026.10.9 in the matrix leg's environment (.matrix/, built once), then both parts run here;
# writes docs/convergence-native.json, docs/convergence.png and docs/convergence.json; then the lower-variance noise
# arms (docs/noise.md) against the window arm: docs/convergence-lower-variance.json and .png; then Part 3, task
# accuracy (about 30 minutes, two worker processes): one seed of the window arm on 2026.10.9 (Unsloth's own fix,
# docs/convergence-task-native.json), then every arm here, held to it: docs/convergence-task.json and .png.
NATIVE_LEG := unsloth-2026.10.9-transformers-5.17.0-trl-1.15.0
convergence: setup
	$(BIN)/python scripts/matrix.py --legs $(NATIVE_LEG) --build-only
	$(RUN) .matrix/$(NATIVE_LEG)/bin/python scripts/convergence.py --part 2 --arms window --json docs/convergence-native.json
	$(RUN) $(BIN)/python scripts/convergence.py --native docs/convergence-native.json --plot docs/convergence.png \
		--json docs/convergence.json
	$(RUN) $(BIN)/python scripts/convergence.py --part 2 --arms window,stratified,complementary,both,twice \
		--plot docs/convergence-lower-variance.png --json docs/convergence-lower-variance.json
	$(RUN) .matrix/$(NATIVE_LEG)/bin/python scripts/convergence.py --part 3 --arms window --seeds 1 \
		--json docs/convergence-task-native.json
	$(RUN) $(BIN)/python scripts/convergence.py --part 3 --native docs/convergence-task-native.json \
		--plot docs/convergence-task.png --json docs/convergence-task.json

# The registered accuracy study (docs/convergence.md, Part 3): each run adds whole seeds to
# docs/convergence-registered.json for REGISTERED_MINUTES, two worker processes; run it again until it has 24
# seeds of every arm and layout, when its table gives the registered tests. Writes records/convergence-registered.json.
REGISTERED_MINUTES ?= 30
registered: setup
	$(RUN) $(BIN)/python scripts/convergence.py --registered --add-to docs/convergence-registered.json \
		--minutes $(REGISTERED_MINUTES)

# The registered study again on fresh seeds (24-47): how to check its verdict on another machine, where the
# registered runs need not reproduce bitwise. Grows docs/convergence-replication.json like `make registered`.
replicate: setup
	$(RUN) $(BIN)/python scripts/convergence.py --registered --replicate 24 \
		--add-to docs/convergence-replication.json --minutes $(REGISTERED_MINUTES)

# The registered block-diffusion study (docs/convergence.md, Part 4): each run adds whole seeds (both modes) to
# docs/convergence-block.json for REGISTERED_MINUTES; run it again until it has 24 seeds. block-replicate: the same
# on fresh seeds (2000-2023). Write records/convergence-block.json and records/convergence-block-replication.json.
block-study: setup
	$(RUN) $(BIN)/python scripts/convergence.py --block-study --add-to docs/convergence-block.json \
		--minutes $(REGISTERED_MINUTES)
block-replicate: setup
	$(RUN) $(BIN)/python scripts/convergence.py --block-study --replicate 2000 \
		--add-to docs/convergence-block-replication.json --minutes $(REGISTERED_MINUTES)

# The fuzzer (tests/integration/test_fuzz.py, whose bounded share every `make test` and matrix leg runs) for
# FUZZ_MINUTES: rounds of fresh random configurations against the oracle and random bad input; prints the counts.
FUZZ_MINUTES ?= 10
fuzz: setup
	$(RUN) $(BIN)/python scripts/fuzz.py --minutes $(FUZZ_MINUTES)

# Mutation testing of the core (several hours on 2 cores; not in CI): mutmut and the fresh-interpreter /
# launched-rank pass here, then the dense and native legs for what no test reached here; writes
# mutation/report.md (the score and every mutant's fate). See scripts/mutation.py.
mutation: setup
	$(BIN)/pip install -q -c constraints.txt -r requirements-mutation.txt
	rm -rf mutants
	$(RUN) $(BIN)/python scripts/mutation.py run --label unsloth-2026.10.6
	$(RUN) $(BIN)/python scripts/mutation.py legs
	$(BIN)/python scripts/mutation.py report

clean:
	rm -rf $(VENV) .matrix unsloth_compiled_cache mutants dist build
