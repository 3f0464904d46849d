# mjoin: two commands on a fresh clone
#   make demo   set up .venv, generate TPC-DS, run the re-optimization loop, print the comparison
#   make test   set up .venv, run the whole test suite
SHELL := /bin/bash
PYTHON ?= python3
VENV := $(CURDIR)/.venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

# spark-submit and airflow are only on PATH with the venv's bin/ first.
export PATH := $(VENV)/bin:$(PATH)
# Airflow lives in the project: SQLite metadata DB, our dags/ and plugins/.
export AIRFLOW_HOME ?= $(CURDIR)/.airflow
export AIRFLOW__CORE__DAGS_FOLDER := $(CURDIR)/dags
export AIRFLOW__CORE__PLUGINS_FOLDER := $(CURDIR)/plugins
export AIRFLOW__CORE__LOAD_EXAMPLES := False
# 2 cores: LocalExecutor would start 32 workers (1.3 GB idle) by default.
export AIRFLOW__CORE__PARALLELISM ?= 4
export AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG ?= 2
export PYSPARK_PYTHON := $(PY)
export PYSPARK_DRIVER_PYTHON := $(PY)

.PHONY: setup demo test airflow bench clean help

help:
	@sed -n '1,4p' Makefile

setup: $(STAMP)

$(STAMP): requirements.txt pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps -e .
	@$(PY) -c "import pyspark, airflow, mjoin; print('mjoin env ready: pyspark', pyspark.__version__, 'airflow', airflow.__version__)"
	@touch $(STAMP)

demo: $(STAMP)
	$(PY) -m mjoin demo

test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

airflow: $(STAMP)
	$(PY) -m mjoin airflow

bench: $(STAMP)
	$(PY) -m mjoin bench

clean:
	rm -rf .airflow .demo .pytest_cache spark-warehouse metastore_db derby.log
