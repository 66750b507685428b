# kvsim — the two set-up commands of README.md live here.
#   make run   installs what is missing, builds, runs the quickstart scenario
#   make test  the same set-up, then every test (a missing reference model fails it:
#              KVSIM_REQUIRE_MODEL=0 lets it skip instead, visibly)
#   make install PREFIX=DIR  builds, then installs PREFIX/bin/kvsim, PREFIX/share/kvsim/ (policies,
#              scenarios, cards, devices, scripts/plot) and PREFIX/share/man/man1/kvsim.1 (default /usr/local)
#   make measure-deps  the optional PyTorch venv of scripts/measure-model.py (scripts/setup-measure.sh;
#              never run by make run or make test; KVSIM_VENV=DIR, default ~/.cache/kvsim/venv)
#   make fuzz  every libFuzzer harness of tests/fuzz for FUZZ_SECONDS each (needs clang)
# Everything real is in CMake; this file only strings the steps together.

BUILD      ?= build
BUILD_ASAN ?= build-asan
JOBS       ?= $(shell nproc 2>/dev/null || echo 2)
SCENARIO   ?= scenarios/quickstart.yaml
CMAKE_ARGS ?=
FUZZ_SECONDS ?= 60
FUZZ_TARGETS ?= scenario gguf trace_azure trace_mooncake trace_burstgpt
KVSIM_REQUIRE_MODEL ?= 1
PREFIX     ?= /usr/local

.PHONY: all setup build run test test-asan fuzz bench clean install measure-deps

all: build

setup:
	@sh scripts/setup.sh

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKV_WERROR=ON $(CMAKE_ARGS)

build: setup $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

run: build
	./$(BUILD)/kvsim run $(SCENARIO) --out out/quickstart

install: build
	cmake --install $(BUILD) --prefix "$(PREFIX)"

test: build
	cd $(BUILD) && KVSIM_REQUIRE_MODEL=$(KVSIM_REQUIRE_MODEL) ctest --output-on-failure -j $(JOBS)

# The harnesses are built with clang by the normal build, in $(BUILD)/fuzz; what
# they find is kept in $(BUILD)/fuzz/tests/fuzz/corpus, crashes in .../artifacts.
fuzz: build
	@test -d $(BUILD)/fuzz/tests/fuzz || { echo "make fuzz: no harnesses in $(BUILD)/fuzz (clang with libFuzzer was not found when CMake ran; see its message)"; exit 1; }
	sh tests/fuzz/run.sh long $(BUILD)/fuzz/tests/fuzz "$(FUZZ_TARGETS)" $(FUZZ_SECONDS)

# AddressSanitizer + UndefinedBehaviorSanitizer build of everything, then every test.
test-asan: setup
	cmake -S . -B $(BUILD_ASAN) -DCMAKE_BUILD_TYPE=Debug -DKV_WERROR=ON -DKV_SANITIZE=ON $(CMAKE_ARGS)
	cmake --build $(BUILD_ASAN) -j $(JOBS)
	cd $(BUILD_ASAN) && KVSIM_REQUIRE_MODEL=$(KVSIM_REQUIRE_MODEL) ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 ctest --output-on-failure -j $(JOBS)

measure-deps:
	sh scripts/setup-measure.sh

clean:
	rm -rf $(BUILD) $(BUILD_ASAN)
