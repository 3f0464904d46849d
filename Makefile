# mjoin: two commands on a fresh clone
#   make demo   set up .venv, generate TPC-DS, run the re-optimization loop, print the comparison
#   make test   set up .venv, run the whole test suite
#   make cluster-up / cluster-down / test-cluster   a native Spark standalone + PostgreSQL cluster (docs/cluster.md)
#   make test-compose   the compose deployment brought up in Docker and tested (docs/cluster.md)
SHELL := /bin/bash
PYTHON ?= python3
VENV := $(CURDIR)/.venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Three pytest-xdist workers on 2 cores: the real-Airflow, live and cluster tests partly wait on the clock
# (scheduled periods, real-time landers, restarts); scheduling in tests/conftest.py. On a clean clone three took
# 33.6 min, two 32.7 min: no faster, but three is what passed twice in full, once under load up to 26.
# PYTEST_WORKERS=0 runs in one process (e.g. to debug with -s); PYTEST_ARGS adds pytest arguments.
PYTEST_WORKERS ?= 3

# spark-submit and airflow are only on PATH with the venv's bin/ first.
# (Airflow's own settings: include/mjoin/loop/airflow_env.py, used by the demo, `make airflow` and the tests.)
export PATH := $(VENV)/bin:$(PATH)
export PYSPARK_PYTHON := $(PY)
export PYSPARK_DRIVER_PYTHON := $(PY)

.PHONY: setup demo test airflow airflow-cli bench flink-venv clean help cluster-setup cluster-up cluster-down test-cluster test-compose

help:
	@sed -n '1,6p' Makefile

setup: $(STAMP)

$(STAMP): requirements.txt pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps -e .
	$(PY) -m mjoin.runtime.sparkzip  # bytecode in the pyspark.zip Spark's Python workers import (include/mjoin/runtime/sparkzip.py)
	$(PY) -m mjoin.runtime.jvm  # mjoin's checkpoint file manager, when a JDK is present (include/mjoin/runtime/jvm/)
	@$(PY) -c "import pyspark, airflow, mjoin; print('mjoin env ready: pyspark', pyspark.__version__, 'airflow', airflow.__version__)"
	@touch $(STAMP)

demo: $(STAMP)
	$(PY) -m mjoin demo

# pytest exits 5 when it collected no tests: a suite that silently shrank to nothing is a failure.
test: $(STAMP)
	@rc=0; $(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadscope --no-loadscope-reorder --durations 25 $(PYTEST_ARGS) || rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests (exit 5): failing" >&2; exit 1; fi; \
	exit $$rc

# `make airflow` also runs the live TPC-DS feed into the lake (python -m mjoin live); LIVE=0: a real source feeds it
LIVE ?= 1
airflow: $(STAMP)
	$(PY) -m mjoin airflow $(if $(filter 1,$(LIVE)),--live,)

# any airflow command with the project's environment, e.g. make airflow-cli ARGS="dags list"
airflow-cli: $(STAMP)
	$(PY) -m mjoin airflow-cli $(ARGS)

# The benchmarks are separate scripts (long at full size, results committed under bench/*/results/): list them.
bench: $(STAMP)
	@echo "benchmark scripts (each has --help; most have --quick):"
	@for f in bench/*/*.py; do case $$(basename $$f) in _*) ;; *) echo "  .venv/bin/python $$f";; esac; done

# The Flink peer's own virtualenv (apache-flink 2.3.0, ~90 s, 844 MB; kept out of requirements.txt): used by
# bench/evaluation (the peers section) and bench/live/harness.py --system flink_multijoin; their tests skip without it.
FLINK_PYTHON ?= python3.11
FLINK_VENV := $(CURDIR)/bench/evaluation/.flink-venv
flink-venv: $(FLINK_VENV)/.installed

$(FLINK_VENV)/.installed: bench/evaluation/requirements-flink.txt
	@test -x $(FLINK_VENV)/bin/python || $(FLINK_PYTHON) -m venv $(FLINK_VENV)
	$(FLINK_VENV)/bin/python -m pip install --quiet --disable-pip-version-check -r bench/evaluation/requirements-flink.txt
	@touch $@

# ---- the native cluster (include/mjoin/runtime/cluster.py, docs/cluster.md): Spark standalone master + 2 workers and
# PostgreSQL (Debian's postgresql package) for Airflow, all on 127.0.0.1, state under .cluster/
CLUSTER_STAMP := $(VENV)/.cluster-installed
cluster-setup: $(CLUSTER_STAMP)

$(CLUSTER_STAMP): $(STAMP) docker/requirements-cluster.txt
	$(PY) -m pip install --quiet --disable-pip-version-check -r docker/requirements-cluster.txt
	@touch $(CLUSTER_STAMP)

cluster-up: $(CLUSTER_STAMP)
	$(PY) -m mjoin cluster up $(CLUSTER_ARGS)

cluster-down:
	@if [ -x $(PY) ]; then $(PY) -m mjoin cluster down; else echo "no .venv: nothing to stop"; fi

# the cluster tests alone, on a cluster started for them and stopped after them whatever happens
test-cluster: $(CLUSTER_STAMP)
	@trap '$(PY) -m mjoin cluster down' EXIT; \
	$(PY) -m mjoin cluster up $(CLUSTER_ARGS) && \
	$(PY) -m pytest -m cluster tests/ $(PYTEST_ARGS)

# ---- the compose deployment (docker-compose.yml, docs/cluster.md): its static checks, then brought up for real by
# the test marked `compose`, which needs a Docker engine and `docker compose` v2 (docker/engine.sh installs and
# starts them on Debian) and builds on the local Debian bases of docker/local-base.sh unless MJOIN_BASE_IMAGE and MJOIN_POSTGRES_IMAGE name others;
# skipped, with the reason, where no engine answers. COMPOSE_RESULTS=<file>: its timings kept as a results file.
test-compose: $(STAMP)
	MJOIN_COMPOSE_TEST=1 $(if $(COMPOSE_RESULTS),MJOIN_COMPOSE_RESULTS=$(abspath $(COMPOSE_RESULTS))) \
	$(PY) -m pytest tests/test_compose.py $(PYTEST_ARGS)

clean:
	rm -rf .airflow .demo .pytest_cache spark-warehouse metastore_db derby.log
	@test ! -f .cluster/cluster.json || echo "kept .cluster/ (make cluster-down, then rm -rf .cluster to drop its database)"
