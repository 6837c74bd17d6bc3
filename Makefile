# The README's commands. `make run` runs the shop; `make test` runs the whole suite.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
BIN := $(VENV)/bin
## The locks (docs/dependencies.md), compiled by `make lock` from requirements/*.in,
## every package pinned with its hashes: requirements.txt (production),
## requirements/dev.txt (development and tests: make venv), requirements/bench.txt
## (the bench's peer, never in requirements.txt), requirements/tools.txt (the plots
## and pip-tools: make tools). Each install is stamped by its lock's contents.
PIP_INSTALL = $(BIN)/pip install --disable-pip-version-check -q --require-hashes
STAMP := $(VENV)/.installed-$(shell cat requirements.txt requirements/dev.txt | sha1sum | cut -c1-12)
BENCH_STAMP := $(VENV)/.bench-installed-$(shell cat requirements/bench.txt | sha1sum | cut -c1-12)
TOOLS_STAMP := $(VENV)/.tools-installed-$(shell cat requirements/tools.txt | sha1sum | cut -c1-12)

.PHONY: venv tools lock test lint format messages run bench mutants chaos fuzz-money clean

venv: $(STAMP)

$(STAMP): requirements.txt requirements/dev.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP_INSTALL) -r requirements/dev.txt
	@rm -f $(VENV)/.installed-* && touch $@

tools: $(TOOLS_STAMP)

$(TOOLS_STAMP): requirements/tools.txt $(STAMP)
	$(PIP_INSTALL) -r requirements/tools.txt
	@rm -f $(VENV)/.tools-installed-* && touch $@

## Compile the locks from their sources: the pins that still satisfy a source stay;
## LOCK_ARGS="--upgrade" (or "--upgrade-package django") moves them (docs/dependencies.md).
LOCK_FLAGS = -q --generate-hashes --allow-unsafe --strip-extras --no-emit-index-url \
	--no-emit-find-links --no-emit-trusted-host $(LOCK_ARGS)
lock: $(TOOLS_STAMP)
	$(BIN)/pip-compile $(LOCK_FLAGS) --output-file=requirements.txt requirements/production.in
	$(BIN)/pip-compile $(LOCK_FLAGS) --output-file=requirements/dev.txt requirements/dev.in
	$(BIN)/pip-compile $(LOCK_FLAGS) --output-file=requirements/bench.txt requirements/bench.in
	$(BIN)/pip-compile $(LOCK_FLAGS) --output-file=requirements/tools.txt requirements/tools.in

## Run the whole test suite (against DATABASE_URL / REDIS_URL when set, else on
## embedded servers started once): TEST_WORKERS pytest-xdist workers, one test
## file per worker at a time, longest first (tests/support/file_order.py), then the
## tests marked `serial` alone
## (docs/testing.md, "Running in parallel"). Both passes run; the target fails
## when either fails (exit 5, nothing selected, counts as passed unless both
## select nothing). The bench's own dependencies too, for its tests (tests/bench).
TEST_WORKERS ?= 4
## The tests write bytecode even where PYTHONDONTWRITEBYTECODE is set: pytest's
## rewritten test modules are cached in __pycache__, so the workers and the serial
## pass do not rewrite every test module again (docs/testing.md, "Running in parallel").
test: export PYTHONDONTWRITEBYTECODE :=
test: $(STAMP) $(BENCH_STAMP)
	@$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS); parallel=$$?; \
	echo "::: the serial tests, alone"; \
	SHOP_TEST_SERIAL_ONLY=1 $(BIN)/python -m pytest -n 0 $(PYTEST_ARGS); serial=$$?; \
	if [ $$parallel = 5 ] && [ $$serial = 5 ]; then exit 5; fi; \
	for status in $$parallel $$serial; do \
		if [ $$status != 0 ] && [ $$status != 5 ]; then exit $$status; fi; \
	done

## Run the shop: embedded PostgreSQL and Redis unless DATABASE_URL / REDIS_URL
## are set, migrations, demo data, then web + worker + beat (docs/running.md).
# Demo data: the run command decides (runner/supervisor.py, demo_wanted): on the
# embedded PostgreSQL, or with SHOP_DEMO=1; never by default on a DATABASE_URL.
# No shell in the recipe, so Ctrl-C reaches the run command itself.
run: $(STAMP)
	$(BIN)/python -m runner

## The mutation check (docs/testing.md, "Mutation check"): each deliberately
## wrong change must fail its guarding tests; DATABASE_URL / REDIS_URL as for test.
mutants: $(STAMP)
	$(BIN)/python tools/mutants.py $(MUTANTS_ARGS)

## The chaos run (docs/failure-model.md, "Chaos run"): the real system, two
## hosts, a mixed workload, SIGKILLs, failpoints, Redis restarted empty, then
## the invariants. CHAOS_ARGS e.g. "--duration 180 --broker rabbitmq" or "--long".
chaos: $(STAMP) $(TOOLS_STAMP)
	$(BIN)/python -m tools.chaos $(CHAOS_ARGS)

## The long form of the money model (docs/testing.md, "The model-based test of an
## order's money life"): new examples for FUZZ_MONEY_SECONDS (default 20 minutes).
FUZZ_MONEY_SECONDS ?= 1200
fuzz-money: $(STAMP)
	SHOP_FUZZ_MONEY=$(FUZZ_MONEY_SECONDS) $(BIN)/python -m pytest -m fuzz_money -s --timeout 0 \
		tests/orders/test_money_model.py $(PYTEST_ARGS)

## Lint, check that every model change has its migration, then type-check the
## apps (docs/testing.md, "Lint checks" and "Type checking"); .pre-commit-config.yaml
## runs the first three on a commit.
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python manage.py makemigrations --check --dry-run
	$(BIN)/mypy

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

## The translation catalogues (docs/storefront.md, "Languages"): the marked strings
## into locale/<language>/LC_MESSAGES/django.po, then the .mo files, which are
## committed (a host needs no gettext). Needs GNU gettext (xgettext, msgfmt).
MESSAGES_IGNORE := -i ".venv/*" -i "tests/*" -i "bench/*" -i "tools/*" -i "docs/*" \
	-i "staticfiles/*" -i "runner/*" -i "devtools/*" -i "var/*"
messages: $(STAMP)
	$(BIN)/python manage.py makemessages --all --no-obsolete --no-location $(MESSAGES_IGNORE)
	$(BIN)/python manage.py compilemessages --ignore ".venv/*"


$(BENCH_STAMP): requirements/bench.txt $(STAMP)
	$(PIP_INSTALL) -r requirements/bench.txt
	@rm -f $(VENV)/.bench-installed-* && touch $@

bench: $(STAMP) $(BENCH_STAMP) $(TOOLS_STAMP)
	$(BIN)/python -m bench.run $(BENCH_ARGS)

clean:
	rm -rf $(VENV) staticfiles .pytest_cache .ruff_cache .mypy_cache
