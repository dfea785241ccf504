# MARA: each target builds on the files the previous one writes.
# PROFILE selects experiments/profiles/<name>.toml (smoke | default | paper).
PROFILE ?= default
VENV    := .venv
PY      := $(VENV)/bin/python
MARA    := $(VENV)/bin/mara
BANK    := data/banks/$(PROFILE).parquet
FM      := artifacts/predictor/$(PROFILE)/predictor
SEED    ?= 0
BETA    ?= 0.1
PREDICTOR ?= fm
# The warm start (mara_rl.imitation) is the profile's unless overridden: IMITATION=N imitates
# the teacher on N training episodes (0: PPO from a random MAT), TEACHER=lara|lara_oracle|...,
# DAGGER=R runs R DAgger rounds after it (0: behaviour cloning only).
IMITATION ?=
TEACHER ?=
DAGGER ?=
WARM_FLAGS := $(if $(IMITATION),--imitation-episodes $(IMITATION)) $(if $(TEACHER),--imitation-teacher $(TEACHER)) \
	$(if $(DAGGER),--dagger-rounds $(DAGGER))

.PHONY: setup test lint curves train-predictor eval-predictor train-scheduler submit-scheduler \
	evaluate bench mlflow-ui clean

setup: $(VENV)/.installed

# torch is pinned to the CPU wheel that pip finds locally; install it first so
# nothing else pulls a CUDA build. Two make commands started together after a change to
# pyproject.toml would both reinstall at once and break each other: the install holds a
# lock, and the second one, once it gets it, finds the venv up to date and skips.
$(VENV)/.installed: pyproject.toml
	flock $(VENV).lock sh -ec '[ $@ -nt pyproject.toml ] && exit 0; \
		test -d $(VENV) || python3 -m venv $(VENV); \
		$(PY) -m pip install -q --upgrade pip; \
		$(PY) -m pip install -q torch==2.13.0; \
		$(PY) -m pip install -q -e ".[dev]"; \
		touch $@'

lint: setup
	$(VENV)/bin/ruff check mara_fm mara_env mara_rl experiments tests

test: lint
	$(PY) -m pytest -q

curves: $(BANK)
$(BANK): $(VENV)/.installed
	$(MARA) curves --profile $(PROFILE) --out $@

train-predictor: $(FM)/config.json
$(FM)/config.json: $(BANK)
	$(MARA) train-predictor --profile $(PROFILE) --bank $(BANK)

eval-predictor: reports/predictor/$(PROFILE)/predictor_eval.json
reports/predictor/$(PROFILE)/predictor_eval.json: $(FM)/config.json
	$(MARA) eval-predictor --profile $(PROFILE) --bank $(BANK) --predictor-path $(FM)

# MARA: PREDICTOR=wls trains MARA-WLS, BETA=0 the sparse-reward ablation. The run folder
# is named by the command (mara_rl.scheduler_commands.default_out); a finished run is not
# trained again, an interrupted one resumes.
train-scheduler: $(FM)/config.json
	$(MARA) train-scheduler --profile $(PROFILE) --predictor $(PREDICTOR) --fm $(FM) \
		--beta $(BETA) --seed $(SEED) --bank $(BANK) $(WARM_FLAGS)

# Needs a running Ray cluster: RAY_ADDRESS=http://HEAD:8265 (see README).
submit-scheduler: $(FM)/config.json
	$(MARA) submit-scheduler --profile $(PROFILE) --predictor $(PREDICTOR) --fm $(FM) \
		--beta $(BETA) --seed $(SEED) --bank $(BANK) $(WARM_FLAGS) --wait

# Every method and trained variant (MARA, MARA-WLS, sparse per seed; train them first):
# main table, stress scenario, load sweep. EXTRA=NAME[@SEED]=DIR,... adds more policies
# (NAME@SEED enters them as more training seeds of a method, e.g. mara@1=...).
evaluate: $(BANK)
	$(MARA) evaluate-all --profile $(PROFILE) $(if $(EXTRA),--policies $(EXTRA))

bench: $(FM)/config.json
	$(MARA) bench --profile $(PROFILE) --bank $(BANK) --fm $(FM)

mlflow-ui: setup
	$(VENV)/bin/mlflow ui --backend-store-uri sqlite:///$(CURDIR)/mlflow.db --host 127.0.0.1 --port 5000

clean:
	rm -rf reports/$(PROFILE) data/episodes

# The whole protocol (bank → predictor → schedulers → evaluation → report); each stage
# is skipped when its output exists, so a rerun continues where it stopped.
.PHONY: reproduce report
reproduce: $(VENV)/.installed
	$(MARA) reproduce --profile $(PROFILE)

# Rebuild reports/$(PROFILE)/report.md from the evaluation results already written.
report: $(VENV)/.installed
	$(MARA) report --profile $(PROFILE)
