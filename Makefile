# MARA: each target builds on the files the previous one writes.
# PROFILE selects experiments/profiles/<name>.toml (smoke | default | paper | cluster).
PROFILE ?= default
VENV    := .venv
PY      := $(VENV)/bin/python
MARA    := $(VENV)/bin/mara
# A profile with `extends = "<name>"` shares that profile's banks and predictor.
STAGE_ONE := $(or $(shell sed -n 's/^extends *= *"\(.*\)"/\1/p' experiments/profiles/$(PROFILE).toml 2>/dev/null),$(PROFILE))
BANK    := data/banks/$(STAGE_ONE).parquet
WIDE_BANK := data/banks/$(STAGE_ONE)-wide.parquet
HISTORY_BANK := data/banks/$(STAGE_ONE)-history.parquet
FM      := artifacts/predictor/$(STAGE_ONE)/predictor
# Scheduler settings default to the profile's [scheduler]; these override the common ones
# (every [scheduler] setting has a flag: `mara train-scheduler --help`; ARGS="--flag value ..." passes more).
# PREDICTOR=wls trains MARA-WLS, PREDICTOR=recall MARA-recall, PREDICTOR=history MARA-history, BETA=0 the sparse-reward ablation, SEED=N another seed,
# IMITATION=N the warm start's episodes (0: PPO from a random MAT), TEACHER=..., DAGGER=R.
SEED      ?=
BETA      ?=
PREDICTOR ?=
IMITATION ?=
TEACHER   ?=
DAGGER    ?=
ARGS      ?=
SCHED_FLAGS := $(if $(SEED),--seed $(SEED)) $(if $(BETA),--beta $(BETA)) $(if $(PREDICTOR),--predictor $(PREDICTOR)) \
	$(if $(IMITATION),--imitation-episodes $(IMITATION)) $(if $(TEACHER),--imitation-teacher $(TEACHER)) \
	$(if $(DAGGER),--imitation-dagger-rounds $(DAGGER)) $(ARGS)
# The single-machine Ray head of `make ray-up`: its own ports, temp dir and token under .ray/.
RAY_DIR   := .ray
RAY_DASH  ?= 8266
# The head's other ports are RAY_PORTS and the next 7: none of Ray's defaults, so a local
# ray.init() (a training run) or another head on the machine does not collide with it.
RAY_PORTS ?= 26380

.PHONY: setup test lint curves curves-wide curves-history train-predictor eval-predictor train-scheduler submit-scheduler \
	evaluate bench live live-compare mlflow-ui clean ray-up ray-down

setup: $(VENV)/.installed

# torch is pinned to the CPU wheel that pip finds locally; install it first so nothing else
# pulls a CUDA build. constraints.txt pins every other package (same seed, same result needs
# the same numerics). Two make commands started together after a change would both reinstall
# at once and break each other: the install holds a lock, and the second one, once it gets
# it, finds the venv up to date and skips.
$(VENV)/.installed: pyproject.toml constraints.txt
	flock $(VENV).lock sh -ec '[ $@ -nt pyproject.toml ] && [ $@ -nt constraints.txt ] && exit 0; \
		test -d $(VENV) || python3 -m venv $(VENV); \
		$(PY) -m pip install -q --upgrade pip; \
		$(PY) -m pip install -q -c constraints.txt torch==2.13.0; \
		$(PY) -m pip install -q -c constraints.txt -e ".[dev]"; \
		touch $@'

lint: setup
	$(VENV)/bin/ruff check mara_common mara_fm mara_env mara_live mara_rl experiments tests

test: lint
	$(PY) -m pytest -q

curves: $(BANK)
$(BANK): | $(VENV)/.installed
	$(MARA) curves --profile $(PROFILE) --out $@

curves-wide: $(WIDE_BANK)
$(WIDE_BANK): | $(VENV)/.installed
	$(MARA) curves --wide --profile $(PROFILE) --out $@

curves-history: $(HISTORY_BANK)
$(HISTORY_BANK): | $(VENV)/.installed
	$(MARA) curves --history --profile $(PROFILE) --out $@

train-predictor: $(FM)/config.json
$(FM)/config.json: $(BANK)
	$(MARA) train-predictor --profile $(PROFILE) --bank $(BANK)

eval-predictor: reports/predictor/$(PROFILE)/predictor_eval.json
reports/predictor/$(PROFILE)/predictor_eval.json: $(FM)/config.json
	$(MARA) eval-predictor --profile $(PROFILE) --bank $(BANK) --predictor-path $(FM)

# The run folder is named by the profile and the settings that differ from it
# (artifacts/scheduler/default-seed0, default-wls-seed0, ...); a finished run is not trained
# again, an interrupted one resumes, and `make reproduce` reuses it.
train-scheduler: $(FM)/config.json
	$(MARA) train-scheduler --profile $(PROFILE) --bank $(BANK) $(SCHED_FLAGS)

# Needs a running Ray cluster: RAY_ADDRESS=http://HEAD:PORT (see README; `make ray-up`).
submit-scheduler: $(FM)/config.json
	$(MARA) submit-scheduler --profile $(PROFILE) --bank $(BANK) $(SCHED_FLAGS) --wait

# Every method and trained variant (MARA, MARA-WLS, sparse per seed; train them first):
# main table, stress scenario, load sweep. EXTRA=NAME[@SEED]=DIR,... adds more policies
# (NAME@SEED enters them as more training seeds of a method, e.g. mara@1=...). Cells whose
# inputs and code are unchanged keep their records; FRESH=1 evaluates every cell again.
evaluate: $(BANK)
	$(MARA) evaluate-all --profile $(PROFILE) $(if $(EXTRA),--policies $(EXTRA)) $(if $(FRESH),--fresh)

bench: $(FM)/config.json
	$(MARA) bench --profile $(PROFILE) --bank $(BANK) --fm $(FM) $(if $(wildcard $(HISTORY_BANK)),--history $(HISTORY_BANK)) $(if $(wildcard artifacts/scheduler/$(PROFILE)-seed0/policy),--live mara,--live lara_fm_optimistic)

# Live mode (docs/design.md §11): real jobs on 7 Ray node actors (RAY_ADDRESS: a cluster).
# `make live` runs MARA (METHOD=...) on one generated stream of about 40 jobs and kills one
# node actor on purpose at tick KILL_AT; rerunning it resumes an interrupted run.
METHOD  ?= mara
KILL_AT ?= 300
live: $(FM)/config.json
	$(MARA) live --profile $(PROFILE) --bank $(BANK) --method $(METHOD) --kill-at $(KILL_AT)

# Each method of [live] methods live on [live] streams generated streams (a node actor
# killed in each run), beside the simulator's prediction: results/<profile>/live.md. A rerun
# keeps the rows of live.json made with the same inputs; FRESH=1 makes every row anew.
FRESH ?=
live-compare: $(FM)/config.json
	$(MARA) live-compare --profile $(PROFILE) --bank $(BANK) --kill-at $(KILL_AT) $(if $(FRESH),--fresh)

mlflow-ui: setup
	$(VENV)/bin/mlflow ui --backend-store-uri sqlite:///$(CURDIR)/mlflow.db \
		--default-artifact-root $(CURDIR)/mlartifacts --host 127.0.0.1 --port 5000

# A Ray head for this machine alone, from the project's venv (so jobs find its python): its own
# ports and temp dir, token auth, the token in .ray/token. `make ray-down` stops exactly this
# head (its process group), never another cluster on the machine.
ray-up: setup
	@mkdir -p $(RAY_DIR) && test -s $(RAY_DIR)/token || $(PY) -c "import secrets; print(secrets.token_hex(16))" > $(RAY_DIR)/token
	@if [ -f $(RAY_DIR)/head.pid ] && kill -0 $$(cat $(RAY_DIR)/head.pid) 2>/dev/null; then \
		echo "Ray head already running (pid $$(cat $(RAY_DIR)/head.pid))"; exit 0; fi; \
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH RAY_AUTH_MODE=token RAY_AUTH_TOKEN=$$(cat $(RAY_DIR)/token) \
		setsid $(VENV)/bin/ray start --head --block --node-ip-address=127.0.0.1 --port=$(RAY_PORTS) \
		--dashboard-host=127.0.0.1 --dashboard-port=$(RAY_DASH) --ray-client-server-port=$$(($(RAY_PORTS) + 1)) \
		--dashboard-agent-listen-port=$$(($(RAY_PORTS) + 2)) --dashboard-agent-grpc-port=$$(($(RAY_PORTS) + 3)) \
		--runtime-env-agent-port=$$(($(RAY_PORTS) + 4)) --metrics-export-port=$$(($(RAY_PORTS) + 5)) \
		--node-manager-port=$$(($(RAY_PORTS) + 6)) --object-manager-port=$$(($(RAY_PORTS) + 7)) \
		--disable-usage-stats --temp-dir=/tmp/mara-ray-$$(id -u) > $(RAY_DIR)/head.log 2>&1 & \
		echo $$! > $(RAY_DIR)/head.pid; \
	echo "Ray head starting (pid $$(cat $(RAY_DIR)/head.pid), log $(RAY_DIR)/head.log). Then:"; \
	echo "  export RAY_ADDRESS=http://127.0.0.1:$(RAY_DASH) RAY_AUTH_MODE=token RAY_AUTH_TOKEN=\$$(cat $(RAY_DIR)/token)"

ray-down:
	@if [ -f $(RAY_DIR)/head.pid ]; then pid=$$(cat $(RAY_DIR)/head.pid); \
		kill -TERM $$pid 2>/dev/null; for i in $$(seq 30); do kill -0 $$pid 2>/dev/null || break; sleep 1; done; \
		kill -KILL -- -$$pid 2>/dev/null; rm -f $(RAY_DIR)/head.pid; echo "Ray head $$pid stopped"; \
	else echo "no Ray head of this project running"; fi

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
