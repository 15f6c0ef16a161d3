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
	@if $(CUDA_PROBE) >/dev/null 2>&1; then $(MAKE) --no-print-directory install-gpu; \
	else echo "install-gpu: skipped, no CUDA device ('$(CUDA_PROBE)' failed); the GPU rungs will say not applicable"; fi
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

# Two pytest workers with one thread each, each pinned to its own share of the cores with everything it starts
# (conftest.py: OpenVINO's, NNCF's and inductor's thread pools ignore OMP_NUM_THREADS; unpinned, the unit tests
# took 432 s with two workers against 465 s with one; pinned, 291 s). The unit tests and
# the notebooks stay two sessions: in one session a unit test beside a notebook's 2-thread workers ran 5.7x slower
# (test_reference_model 118 s against 21 s), and both together took 882 s on a fresh clone against 372 + 429 s as
# two sessions an hour before. Within each, the longest scopes go first (conftest.py), so neither worker idles long
# at the end while the other finishes.
TEST_WORKERS ?= 2
XDIST := -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder
unit: install
	OMP_NUM_THREADS=1 $(PY) -m pytest tests -q $(XDIST) --durations=25

# nbval runs every notebook on the tiny smoke profile, writing into a scratch reports folder (NB_REPORTS, when set:
# .ci/run then checks the smoke report those notebooks drew in a browser);
# loadscope keeps each notebook's cells together on one worker. A kernel may take over a minute to start while
# the other worker runs torchrun ranks or an SD pipeline (13 did not answer in nbval's default 60 s on a fresh clone).
notebooks: install
	OMP_NUM_THREADS=1 SDPERF_PROFILE=smoke SDPERF_REPORTS_DIR=$${NB_REPORTS:-$$(mktemp -d)} $(PY) -m pytest -q -p no:cacheprovider \
		$(XDIST) --durations=25 --nbval-lax --nbval-current-env --nbval-cell-timeout=900 --nbval-kernel-startup-timeout=300 notebooks

install: $(STAMP)

# uv installs the lock from where pip's configuration says (sdperf.tooling.fast_install): 62 s on a fresh 2-core
# machine where pip took 123 s (issue 33); wherever uv cannot be installed or cannot install the lock, pip does it.
# The project itself goes in with uv too (0.5 s; pip's editable install took 5.1 s), from the venv's setuptools.
UV_VERSION := 0.13.9
$(STAMP): requirements.lock pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	{ $(PY) -m pip install --quiet uv==$(UV_VERSION) && DS_BUILD_OPS=0 $(PY) lib/sdperf/tooling/fast_install.py $(PY) requirements.lock && \
	  $(PY) -m uv pip install --quiet --python $(PY) --no-deps --no-build-isolation -e .; } || \
		{ echo "install: uv did not install requirements.lock and the project; pip installs them"; $(PY) -m pip install --quiet --upgrade pip && \
		  DS_BUILD_OPS=0 $(PY) -m pip install --quiet -r requirements.lock && $(PY) -m pip install --quiet --no-deps -e .; }
	rm -f $(VENV)/.installed-*
	touch $@

# GPU machines: requirements-gpu.lock (TensorRT 10 for 07's TensorRT rung, onnxruntime-gpu) over the main lock; its
# header says why each pin. onnxruntime and onnxruntime-gpu own the same files, so both go before the GPU build is
# installed alone; -c keeps every package the main lock pins at its version. `make study` runs this when
# $(CUDA_PROBE) finds a device; a main-lock reinstall removes this stamp too, so the swap is redone after it.
CUDA_PROBE ?= nvidia-smi -L
GPU_STAMP := $(VENV)/.installed-gpu-$(shell cat requirements-gpu.lock | sha256sum | cut -c1-16)
.PHONY: install-gpu check-gpu-lock
install-gpu: $(GPU_STAMP)

$(GPU_STAMP): $(STAMP) requirements-gpu.lock
	$(PY) -m pip uninstall --quiet -y onnxruntime onnxruntime-gpu
	$(PY) -m pip install --quiet -r requirements-gpu.lock -c requirements.lock
	rm -f $(VENV)/.installed-gpu-*
	touch $@

# Asks the indexes (no install) whether every GPU-lock pin has a Linux x86_64 CPython 3.11 wheel (sdperf.tooling.lock_check);
# exits 1 naming a pin without one, 3 when the only gaps are on an index that did not answer (pypi.nvidia.com).
check-gpu-lock: install
	$(VENV)/bin/sdperf check-lock requirements-gpu.lock

# Re-executes the notebooks on smoke and keeps only the outputs of `# NBVAL_CHECK_OUTPUT` cells.
refresh-notebooks: install
	$(PY) -m sdperf.tooling.notebook_hygiene refresh notebooks/*.ipynb

lint-notebooks: install
	$(PY) -m sdperf.tooling.notebook_hygiene check notebooks/*.ipynb

clean-reports:
	rm -rf reports/smoke

# The report as a reader's browser shows it (sdperf.report.report_check): index.html is rebuilt from what is on disk, then
# opened in headless Chromium; it fails, listing every problem, on an image that does not load, a table wider than
# the page, a figure without a caption. Needs a Chromium (apt-get install -y chromium); without one it exits 3.
.PHONY: check-report
check-report: PROFILE := $(if $(filter auto,$(PROFILE)),cpu,$(PROFILE))
check-report: install
	$(VENV)/bin/sdperf report --profile $(PROFILE)
	$(VENV)/bin/sdperf check-report --profile $(PROFILE) $(if $(SCREENSHOT),--screenshot $(SCREENSHOT))
