# One entry point for people and CI. `make study` and `make test` create .venv when missing and install the
# pinned lock into it, so both work on a fresh machine with nothing but Python 3.11 and make.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   ?= .venv
PY     := $(VENV)/bin/python
PROFILE ?= auto
# The install stamp changes whenever the lock or the project metadata does, so edits reinstall.
STAMP  := $(VENV)/.installed-$(shell cat requirements.lock pyproject.toml | sha256sum | cut -c1-16)

.PHONY: study allocators test unit notebooks install lint-notebooks refresh-notebooks clean-reports

study: install allocators
	$(VENV)/bin/sdperf doctor --profile $(PROFILE)
	$(VENV)/bin/sdperf run --profile $(PROFILE)

# The allocator rung (sdperf.optimizations.allocator) preloads jemalloc and tcmalloc from Debian's packages; as
# root with apt, `make study` installs them, elsewhere the rung records "not applicable: <lib> is not installed".
ALLOCATOR_PACKAGES := libjemalloc2 libtcmalloc-minimal4
allocators:
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		dpkg -s $(ALLOCATOR_PACKAGES) >/dev/null 2>&1 || \
		{ apt-get update -qq && apt-get install -y -qq $(ALLOCATOR_PACKAGES); } || \
		echo "allocators: apt-get could not install $(ALLOCATOR_PACKAGES); their rungs will say not applicable"; \
	else echo "allocators: not root or no apt-get; install $(ALLOCATOR_PACKAGES) for the allocator rung"; fi

test: unit notebooks

# Two pytest workers with one thread each: the 2-core machines this runs on are fully used without
# oversubscribing them (two 2-thread processes on 2 cores slow each other down many times over).
TEST_WORKERS ?= 2
XDIST := -n $(TEST_WORKERS) --dist loadscope
unit: install
	OMP_NUM_THREADS=1 $(PY) -m pytest tests -q $(XDIST)

# nbval runs every notebook on the tiny smoke profile, writing into a scratch reports folder;
# loadscope keeps each notebook's cells together on one worker. A kernel may take over a minute to start while
# the other worker runs torchrun ranks or an SD pipeline (13 did not answer in nbval's default 60 s on a fresh clone).
notebooks: install
	OMP_NUM_THREADS=1 SDPERF_PROFILE=smoke SDPERF_REPORTS_DIR=$$(mktemp -d) $(PY) -m pytest -q -p no:cacheprovider \
		$(XDIST) --nbval-lax --nbval-current-env --nbval-cell-timeout=900 --nbval-kernel-startup-timeout=300 notebooks

install: $(STAMP)

$(STAMP): requirements.lock pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	DS_BUILD_OPS=0 $(PY) -m pip install --quiet -r requirements.lock
	$(PY) -m pip install --quiet --no-deps -e .
	rm -f $(VENV)/.installed-*
	touch $@

# Re-executes the notebooks on smoke and keeps only the outputs of `# NBVAL_CHECK_OUTPUT` cells.
refresh-notebooks: install
	$(PY) -m sdperf.notebook_hygiene refresh notebooks/*.ipynb

lint-notebooks: install
	$(PY) -m sdperf.notebook_hygiene check notebooks/*.ipynb

clean-reports:
	rm -rf reports/smoke
