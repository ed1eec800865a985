# The README's two commands are `make demo` and `make test`; both install what they need first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# dg warns (twice) that the active virtual environment is not the project's when none is activated, although
# it runs the project's: naming it makes that true.
DG := VIRTUAL_ENV=$(CURDIR)/$(VENV) $(BIN)/dg
DEV_PORT ?= 3000
# A git-ignored local Dagster instance (SQLite), never the production instance in deploy/.
export DAGSTER_HOME ?= $(CURDIR)/.dagster_home

.PHONY: install demo test test-fast dev check docs clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[test,bench,docs]"
	touch $@

install: $(BIN)/.installed

$(DAGSTER_HOME)/dagster.yaml: dagster.yaml
	mkdir -p $(DAGSTER_HOME)
	cp dagster.yaml $@

## Install, then run the main job on the embedded default (SQLite warehouse, local instance): the demo crawl.
demo: install $(DAGSTER_HOME)/dagster.yaml
	$(BIN)/dedup-pipeline demo

PYTEST := $(BIN)/pytest -n 2 --dist loadfile -q -p no:cacheprovider

# Material for MkDocs prints a banner about MkDocs 2 on every build; it says nothing about this site.
MKDOCS := NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir $(CURDIR)/site

## The full gate CI runs (.ci/run): lint and format check, the docs build, then the whole test suite
## (needs PostgreSQL, Redis and RabbitMQ on 127.0.0.1, see scripts/ensure-services.sh, and Debian's chromium).
test: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(MKDOCS)
	$(PYTEST)

## The edit loop: every test but the slow end-to-end ones (dagster dev, the daemon, a code server, a browser,
## the 100,000-row rehash). `make test` before you push.
test-fast: install
	$(PYTEST) -m "not slow"

## The Dagster UI on http://127.0.0.1:3000 (DEV_PORT) over the same local instance and warehouse.
# Dagster's warning that ./dagster.yaml "will not be used" is true of the file itself: its copy in DAGSTER_HOME
# (the rule above refreshes it) is the one in use, as the echo says.
dev: install $(DAGSTER_HOME)/dagster.yaml
	@echo "make dev: the instance is $(DAGSTER_HOME); its dagster.yaml is a copy of ./dagster.yaml, refreshed by make"
	$(DG) dev -h 127.0.0.1 -p $(DEV_PORT)

## Lint, format check, the docs build and the code location loading (no database, no tests).
check: install $(DAGSTER_HOME)/dagster.yaml
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(MKDOCS)
	$(DG) check defs

## The docs site, built strictly into site/ (open site/index.html).
docs: install
	$(MKDOCS)

clean:
	rm -rf .dagster_home .dedup .tmp_dagster_home_* site
