# SPDX-License-Identifier: Apache-2.0
# The README's two commands:
#   make demo   install what is missing, build, train the reference CNN on Fashion-MNIST, 2 ranks,
#               and write its report (runs/fmnist/report.html)
#   make test   install what is missing, build, run every test with ctest
# Also: make build, make data, make quick (unit + conformance only), make bench, make clean.
# Hardening (CI runs them after make test): make sanitize (ASan+UBSan and TSan test runs),
# make lint (clang-tidy + cppcheck), make fuzz (libFuzzer targets, FUZZ_SECONDS each).
BUILD ?= build
JOBS ?= $(shell nproc)
BUILD_TYPE ?= Release
CMAKE_FLAGS ?=
DPTRAIN := $(BUILD)/launcher/dptrain
FMNIST := /usr/share/datasets/fashion-mnist
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-run-as-root,)
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
LINT_BUILD ?= build-tidy
FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 30
# Empty: every target (the list is in scripts/fuzz.sh).
FUZZ_TARGETS ?=

.PHONY: all deps configure build data demo test quick bench clean sanitize lint fuzz
all: build

deps:
	@bash scripts/install-deps.sh

$(BUILD)/build.ninja: | deps
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) -DDPTRAIN_WERROR=ON \
	  "-DMPIEXEC_PREFLAGS=--oversubscribe --bind-to none $(ROOT_FLAG)" $(CMAKE_FLAGS)

configure: $(BUILD)/build.ninja

build: deps configure
	cmake --build $(BUILD) -j $(JOBS)

data/fmnist/train.h5: | build
	@mkdir -p data/fmnist
	$(DPTRAIN) convert --from idx --images $(FMNIST)/train-images-idx3-ubyte.gz \
	  --labels $(FMNIST)/train-labels-idx1-ubyte.gz --out $@

data/fmnist/test.h5: | build
	@mkdir -p data/fmnist
	$(DPTRAIN) convert --from idx --images $(FMNIST)/t10k-images-idx3-ubyte.gz \
	  --labels $(FMNIST)/t10k-labels-idx1-ubyte.gz --out $@

data: build data/fmnist/train.h5 data/fmnist/test.h5

demo: build data
	. scripts/mpi-env.sh && mpirun -np 2 $(DPTRAIN) train --config configs/fmnist_cnn.toml \
	  --set checkpoint.resume=never
	$(DPTRAIN) report runs/fmnist

test: build data
	@bash scripts/install-deps.sh --cluster-tests
	cd $(BUILD) && DPTRAIN_DATA=$(CURDIR)/data ctest --output-on-failure -j $(JOBS) --timeout 900

quick: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) -L "unit|conformance"

bench: build data
	@bash scripts/install-deps.sh --bench
	bash bench/run.sh $(BUILD)
	bash bench/shard.sh $(BUILD)
	bash bench/loader.sh $(BUILD)
	bash bench/gpu.sh $(BUILD)

sanitize: deps
	ASAN_BUILD=$(ASAN_BUILD) TSAN_BUILD=$(TSAN_BUILD) JOBS=$(JOBS) \
	  MPIEXEC_PREFLAGS="--oversubscribe --bind-to none $(ROOT_FLAG)" bash scripts/sanitize.sh

lint: deps
	JOBS=$(JOBS) bash scripts/lint.sh $(LINT_BUILD)

fuzz: deps
	JOBS=$(JOBS) FUZZ_SECONDS=$(FUZZ_SECONDS) FUZZ_TARGETS="$(FUZZ_TARGETS)" \
	  bash scripts/fuzz.sh $(FUZZ_BUILD)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD) $(LINT_BUILD) $(FUZZ_BUILD)
