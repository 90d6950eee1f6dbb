# tsshim: shared data loading for collocated training jobs.
#
#   make          build/libtsshim.so, build/tsshim-inspect, tools
#   make test     install missing packages, build, run every test (+ tsan, fuzz replay, lint)
#   make fuzz     libFuzzer targets (tests/fuzz), FUZZ_SECONDS each
#   make asan     the same build and tests with ASan+UBSan (build-asan/)
#   make tsan     the core and its unit suites with ThreadSanitizer (build-tsan/)
#   make lint     cppcheck and clang-tidy (.cppcheck-suppressions, .clang-tidy)
#   make demo     the main job on a built-in default
#   make bench    the benchmarks (scripts/bench.sh: with vs without the shim)
#   make gpu-check  the GPU scenarios against real CUDA (skips without a GPU)
#   make torch-check  the PyTorch scenarios with torch 2.11 from PyPI (4.7 GB venv)
#   make gpu-bundle  what scripts/gpu-device.sh carries to a lent GPU machine
#   make stress   fault injection: 30 rounds of PyTorch jobs hit by signals (tests/stress.py)
#
# CUDA_HOME points at the CUDA toolkit (headers only: nothing links CUDA).

CUDA_HOME ?= /usr/local/cuda
CC        ?= cc
BUILD     ?= build
SAN       ?=
TSAN      ?=

WARN    := -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -Wmissing-prototypes \
           -Wno-unused-parameter -Wno-format-truncation
CPPFLAGS := -D_GNU_SOURCE -Iinclude -Icore -Ishim -isystem $(CUDA_HOME)/include
OPT     := -O2
ifneq ($(SAN),)
OPT     := -O1 -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
endif
ifneq ($(TSAN),)
OPT     := -O1 -fsanitize=thread -fno-omit-frame-pointer
endif
CFLAGS  ?=
CFLAGS  += -std=gnu11 -g $(OPT) $(WARN) -fPIC -fvisibility=hidden -ftls-model=initial-exec \
           -pthread -MMD -MP
LDFLAGS += -pthread $(if $(SAN),-fsanitize=address$(comma)undefined) $(if $(TSAN),-fsanitize=thread)
comma   := ,

CORE_SRC   := $(wildcard core/*.c)
SHIM_SRC   := $(wildcard shim/*.c)
TOOL_SRC   := $(wildcard tools/*.c)
UNIT_SRC   := $(wildcard tests/unit/test_*.c)
HELPER_SRC := $(wildcard tests/helpers/*.c)
PY_SRC     := $(wildcard shim/python/*.py)

CORE_OBJ := $(CORE_SRC:%.c=$(BUILD)/obj/%.o)
SHIM_OBJ := $(SHIM_SRC:%.c=$(BUILD)/obj/%.o)
CORE_LIB := $(BUILD)/libtscore.a
SHIM_LIB := $(BUILD)/libtsshim.so
TOOLS    := $(TOOL_SRC:tools/%.c=$(BUILD)/tsshim-%)
UNITS    := $(UNIT_SRC:tests/unit/%.c=$(BUILD)/tests/%)
HELPERS  := $(HELPER_SRC:tests/helpers/%.c=$(BUILD)/tests/%)
PY_OUT   := $(PY_SRC:shim/python/%=$(BUILD)/python/%)

.PHONY: all test asan tsan tsan-run lint demo bench gpu-check gpu-bundle torch-check deps clean check-build test-run
# Keep objects of tools and tests: they are not throw-away intermediates.
.SECONDARY:
all: $(SHIM_LIB) $(TOOLS) $(PY_OUT)

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(CFLAGS) -c $< -o $@

$(CORE_LIB): $(CORE_OBJ)
	@rm -f $@
	ar rcs $@ $^

# The shim links only libc: no CUDA library; liburing goes in statically.
$(SHIM_LIB): $(SHIM_OBJ) $(CORE_LIB) shim/tsshim.map
	$(CC) -shared -o $@ $(SHIM_OBJ) $(CORE_LIB) -l:liburing.a $(LDFLAGS) \
	    -Wl,--version-script=shim/tsshim.map -Wl,-z,defs -Wl,-z,now -ldl

# Extra libraries per program: LIBS_<tool> for build/tsshim-<tool>,
# LIBS_<name> for build/tests/<name>.
LIBS_mkdata := -ljpeg -lm
LIBS_train  := -ljpeg -ldl -lm
LIBS_test_prefetch := -l:liburing.a
# test_session injects EINTR into the core's posix_fallocate calls
LIBS_test_session  := -Wl,--wrap=posix_fallocate
LIBS_ts-jpegcheck  := -ljpeg
LIBS_ts-jpegedge   := -ljpeg
# ts-jpegedge again, its crop looked up with dlsym (tests/helpers/ts-jpegedge.c)
LIBS_ts-jpegedge-dlcrop := -ljpeg -ldl
$(BUILD)/obj/tests/helpers/ts-jpegedge-dlcrop.o: tests/helpers/ts-jpegedge.c
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) -DTS_CROP_BY_DLSYM $(CFLAGS) -c $< -o $@

$(BUILD)/tsshim-%: $(BUILD)/obj/tools/%.o $(CORE_LIB)
	$(CC) -o $@ $^ $(LDFLAGS) $(LIBS_$*)

# The Python bootstrap lives next to the library; precompiled, because
# jobs often run with PYTHONDONTWRITEBYTECODE (a few ms per start-up).
$(BUILD)/python/%.py: shim/python/%.py
	@mkdir -p $(@D)
	cp $< $@
	-@python3 -m compileall -q $@ >/dev/null 2>&1

# Criterion cannot start under ThreadSanitizer (Snaipe/Criterion#274): the
# TSan build compiles the suites against tests/tsan/criterion/criterion.h, a
# small compatible harness (tests/tsan/harness.c), instead.
ifneq ($(TSAN),)
UNIT_RUNNER := $(BUILD)/obj/tests/tsan/harness.o
UNIT_LIBS   := -lm
$(BUILD)/obj/tests/unit/%.o: CPPFLAGS += -isystem tests/tsan
$(BUILD)/obj/tests/tsan/%.o: CPPFLAGS += -isystem tests/tsan
else
UNIT_RUNNER :=
UNIT_LIBS   := -lcriterion
endif

$(BUILD)/tests/test_%: $(BUILD)/obj/tests/unit/test_%.o $(CORE_LIB) $(UNIT_RUNNER)
	@mkdir -p $(@D)
	$(CC) -o $@ $^ $(LDFLAGS) $(UNIT_LIBS) $(LIBS_test_$*)

# test_feed's consumers are ts-feedpeer processes it starts (posix_spawn).
$(BUILD)/tests/test_feed: | $(BUILD)/tests/ts-feedpeer

$(BUILD)/tests/%: $(BUILD)/obj/tests/helpers/%.o $(CORE_LIB)
	@mkdir -p $(@D)
	$(CC) -o $@ $^ $(LDFLAGS) $(LIBS_$*)

# tsemu, the test device (tools/cudaemu/): a CPU emulation of the CUDA 13
# runtime and driver subset tsshim uses, so the CUDA path is tested without
# a GPU. Programs pick it up with LD_LIBRARY_PATH=$(BUILD)/emu. Compiled
# against the CUDA headers; the runtime dlopen()s the driver. Both bind their
# own names at link time (-Bsymbolic-functions), as the real ones do: what the
# driver's cuGetProcAddress hands out is never a preloaded library's export,
# and the runtime's calls into itself never reach another libcudart.so.13 in
# the process (PyTorch 2's, from its nvidia-cuda-runtime wheel).
EMU_DIR  := $(BUILD)/emu
EMU_LIBS := $(EMU_DIR)/libcudart.so.13 $(EMU_DIR)/libcuda.so.1
all: $(EMU_LIBS)

$(EMU_DIR)/libcuda.so.1: $(BUILD)/obj/tools/cudaemu/driver.o tools/cudaemu/libcuda.map
	@mkdir -p $(@D)
	$(CC) -shared -o $@ $< $(LDFLAGS) -Wl,--version-script=tools/cudaemu/libcuda.map \
	    -Wl,-soname,libcuda.so.1 -Wl,-z,defs -Wl,-z,now -Wl,-Bsymbolic-functions

# The same driver linked without -Bsymbolic-functions: its table goes through
# the dynamic linker, so it hands out a preloaded library's exports of its
# names (cuda_hooks.sh: the shim maps those too).
CUDAINTERP := $(BUILD)/tests/cudainterp/libcuda.so.1
$(CUDAINTERP): $(BUILD)/obj/tools/cudaemu/driver.o tools/cudaemu/libcuda.map
	@mkdir -p $(@D)
	$(CC) -shared -o $@ $< $(LDFLAGS) -Wl,--version-script=tools/cudaemu/libcuda.map \
	    -Wl,-soname,libcuda.so.1 -Wl,-z,defs -Wl,-z,now

$(EMU_DIR)/libcudart.so.13: $(BUILD)/obj/tools/cudaemu/runtime.o tools/cudaemu/libcudart.map
	@mkdir -p $(@D)
	$(CC) -shared -o $@ $< $(LDFLAGS) -Wl,--version-script=tools/cudaemu/libcudart.map \
	    -Wl,-soname,libcudart.so.13 -Wl,-z,defs -Wl,-z,now -Wl,-Bsymbolic-functions -ldl

# ts-cudaemu-check links nothing CUDA: it dlopen()s the emulated libraries.
LIBS_ts-cudaemu-check := -ldl
LIBS_ts-cudacalls     := -ldl
LIBS_ts-fdupload      := -ldl
# ts-gpurace calls the CUDA runtime directly: tsemu's at build and run time.
LIBS_ts-gpurace       := -L$(EMU_DIR) -l:libcudart.so.13
$(BUILD)/tests/ts-gpurace: | $(EMU_DIR)/libcudart.so.13
# ts-servedge too (tests/scenarios/serve_edge.sh).
LIBS_ts-servedge      := -L$(EMU_DIR) -l:libcudart.so.13 -pthread
$(BUILD)/tests/ts-servedge: | $(EMU_DIR)/libcudart.so.13

# tsshim-train with the CUDA runtime linked into the program, as nvcc links
# it by default (-cudart static; tools/train.c, TRAIN_CUDART_LINKED): no
# runtime symbol to interpose, only the driver entry points the runtime takes
# from cuGetProcAddress. ts-train-linked links tsemu's runtime, for the
# scenarios; ts-train-cudart-static the toolkit's libcudart_static.a, for
# scripts/gpu-check.sh (built there on demand, and by make gpu-bundle).
$(BUILD)/obj/tools/train-linked.o: tools/train.c
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) -DTRAIN_CUDART_LINKED $(CFLAGS) -c $< -o $@
$(BUILD)/tests/ts-train-linked: $(BUILD)/obj/tools/train-linked.o $(BUILD)/obj/tools/cudaemu/runtime.o $(CORE_LIB)
	@mkdir -p $(@D)
	$(CC) -o $@ $^ $(LDFLAGS) $(LIBS_train)
$(BUILD)/tests/ts-train-cudart-static: $(BUILD)/obj/tools/train-linked.o $(CORE_LIB) \
    $(CUDA_HOME)/lib64/libcudart_static.a
	@mkdir -p $(@D)
	$(CC) -o $@ $^ $(LDFLAGS) $(LIBS_train) -lrt

# For cudaemu.sh: another runtime's functions, failing, first in the global scope.
CUDARTOTHER := $(BUILD)/tests/libts-cudartother.so
$(CUDARTOTHER): tests/helpers/lib/ts-cudartother.c
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(CFLAGS) -shared -o $@ $< $(LDFLAGS)

# For the CUDA hooks scenario: a library linked against (emulated) libcudart,
# which ts-cudacalls loads RTLD_LOCAL.
CUDALOCAL := $(BUILD)/tests/libts-cudalocal.so
$(CUDALOCAL): tests/helpers/lib/ts-cudalocal.c $(EMU_DIR)/libcudart.so.13
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(CFLAGS) -shared -o $@ $< -L$(EMU_DIR) -l:libcudart.so.13 $(LDFLAGS)

# For its two-runtimes case: a stand-in libcudart.so.12 (in a directory of
# its own, where nothing else looks) and a plugin linked against it, found
# through the plugin's run path; the same pair again without symbol
# versions; ts-tworuntimes links tsemu's libcudart.so.13.
CUDART12      := $(BUILD)/tests/cudart12/libcudart.so.12
CUDARTNOV     := $(BUILD)/tests/cudartnov/libts-cudartnov.so
CUDAPLUGIN12  := $(BUILD)/tests/libts-cudaplugin12.so
CUDAPLUGINNOV := $(BUILD)/tests/libts-cudapluginnov.so
$(CUDART12): tests/helpers/lib/ts-cudart12.c tests/helpers/lib/ts-cudart12.map
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(CFLAGS) -shared -o $@ $< $(LDFLAGS) \
	    -Wl,--version-script=tests/helpers/lib/ts-cudart12.map -Wl,-soname,libcudart.so.12
$(CUDARTNOV): tests/helpers/lib/ts-cudart12.c
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(CFLAGS) -shared -o $@ $< $(LDFLAGS) -Wl,-soname,libts-cudartnov.so
$(CUDAPLUGIN12): tests/helpers/lib/ts-cudaplugin12.c $(CUDART12)
	$(CC) $(CPPFLAGS) $(CFLAGS) -shared -o $@ $< -L$(dir $(CUDART12)) -l:libcudart.so.12 \
	    -Wl,-rpath,'$$ORIGIN/cudart12' $(LDFLAGS)
$(CUDAPLUGINNOV): tests/helpers/lib/ts-cudaplugin12.c $(CUDARTNOV)
	$(CC) $(CPPFLAGS) $(CFLAGS) -shared -o $@ $< -L$(dir $(CUDARTNOV)) -l:libts-cudartnov.so \
	    -Wl,-rpath,'$$ORIGIN/cudartnov' $(LDFLAGS)
LIBS_ts-tworuntimes := -L$(EMU_DIR) -l:libcudart.so.13
$(BUILD)/tests/ts-tworuntimes: | $(EMU_DIR)/libcudart.so.13

# For the jpeg_libs scenario: stand-in copies of libjpeg (ts-jpegfake.c, in
# a directory of their own, where nothing else looks) under libjpeg-turbo's
# version nodes (62), under libjpeg 9's (9) and without versions (nov), and
# a plugin linked against each, found through its run path; ts-jpegplugins
# links the system's libjpeg.so.62.
comma        := ,
JPEGFAKE_DIR := $(BUILD)/tests/jpegfake
JPEGPLUGINS  := $(patsubst %,$(BUILD)/tests/libts-jpegplugin%.so,62 9 nov)
$(JPEGFAKE_DIR)/libts-jpegfake%.so: tests/helpers/lib/ts-jpegfake.c $(wildcard tests/helpers/lib/ts-jpegfake*.map)
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(CFLAGS) -shared -o $@ $< $(LDFLAGS) -Wl,-soname,$(@F) \
	    $(addprefix -Wl$(comma)--version-script=,$(wildcard tests/helpers/lib/ts-jpegfake$*.map))
$(JPEGPLUGINS): $(BUILD)/tests/libts-jpegplugin%.so: tests/helpers/lib/ts-jpegplugin.c $(JPEGFAKE_DIR)/libts-jpegfake%.so
	$(CC) $(CPPFLAGS) $(CFLAGS) -shared -o $@ $< -L$(JPEGFAKE_DIR) -l:libts-jpegfake$*.so -ldl \
	    -Wl,-rpath,'$$ORIGIN/jpegfake' $(LDFLAGS)
LIBS_ts-jpegplugins := -ljpeg -ldl

check-build: all $(UNITS) $(HELPERS) $(CUDALOCAL) $(CUDAPLUGIN12) $(CUDAPLUGINNOV) $(JPEGPLUGINS) \
	$(BUILD)/tests/ts-jpegedge-dlcrop $(BUILD)/tests/ts-train-linked $(CUDAINTERP) $(CUDARTOTHER)

deps:
	@scripts/install-deps.sh

# The builds behind test, asan, tsan, demo, stress and torch-check use every
# CPU unless make was given -j itself (evaluated in the recipe, where
# MAKEFLAGS has it): on CI's 2 cores this halves their build time. The tests
# themselves run one at a time.
BUILD_JOBS ?= $(shell nproc 2>/dev/null || echo 1)
PAR = $(if $(filter -j%,$(MAKEFLAGS)),,-j$(BUILD_JOBS))

# Everything a fresh Debian machine needs, then every test.
test: deps
	@$(MAKE) --no-print-directory $(PAR) check-build
	@BUILD=$(BUILD) tests/run.sh
	@$(MAKE) --no-print-directory $(PAR) BUILD=build-tsan TSAN=1 tsan-run
	@$(MAKE) --no-print-directory $(PAR) fuzz-replay
	@$(MAKE) --no-print-directory lint

test-run: check-build
	@BUILD=$(BUILD) tests/run.sh

asan: deps
	@$(MAKE) --no-print-directory $(PAR) BUILD=build-asan SAN=1 test-run

# ThreadSanitizer: the core library and the Criterion unit suites that drive
# it from several threads and processes (the shim is preloaded into programs
# not built with TSan, so the scenarios do not apply). Any report fails.
tsan: deps
	@$(MAKE) --no-print-directory $(PAR) BUILD=build-tsan TSAN=1 tsan-run

# No suppressions; tests/tsan/skip lists the few tests TSan cannot follow,
# with reasons. die_after_fork=0: a fork of a threaded test process is not
# an error by itself (test_feed's consumers are spawned programs instead).
tsan-run: $(UNITS)
	@BUILD=$(BUILD) TESTS=unit TSH_SKIP_FILE=$(CURDIR)/tests/tsan/skip \
	    TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 die_after_fork=0 $${TSAN_OPTIONS:-}" \
	    tests/run.sh

# Static analysis: cppcheck and clang-tidy over core/, shim/, tools/ with the
# checked-in configurations; any finding fails (tests/static.sh).
lint: deps
	@LINT_CPPFLAGS='$(CPPFLAGS)' JOBS=$${JOBS:-$$(nproc)} tests/static.sh

demo: deps
	@$(MAKE) --no-print-directory $(PAR) all $(HELPERS)
	@BUILD=$(BUILD) scripts/demo.sh

bench: deps
	@BUILD=$(BUILD) scripts/bench.sh

# The PyTorch scenarios with torch 2.11 from PyPI (or TORCH=... VISION=...), in a
# venv under $(BUILD) (4.7 GB); make test runs them with Debian's torch 1.13.
torch-check: deps
	@$(MAKE) --no-print-directory $(PAR) check-build
	@BUILD=$(BUILD) scripts/torch-check.sh $(TORCH) $(VISION)

# The GPU scenarios against real CUDA (exit 77, skipped, where there is no GPU).
gpu-check: all $(BUILD)/tests/ts-cudaemu-check
	@BUILD=$(BUILD) scripts/gpu-check.sh

# What scripts/gpu-device.sh runs on a lent GPU machine, which has the driver,
# CUDA 13 and torch but none of the build's dependencies: $(BUILD)/gpu-bundle.
gpu-bundle: check-build $(BUILD)/tests/ts-cudaemu-check $(BUILD)/tests/ts-train-cudart-static
	@BUILD=$(BUILD) scripts/gpu-device.sh bundle

# The short form (3 rounds) runs in make test as tests/scenarios/stress.sh.
stress: deps
	@$(MAKE) --no-print-directory $(PAR) all
	@STRESS_ROUNDS=$${STRESS_ROUNDS:-30} BUILD=$(BUILD) bash tests/scenarios/stress.sh

clean:
	rm -rf build build-asan build-tsan build-fuzz

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)

# ---- fuzzing (tests/fuzz/) ---------------------------------------------------
#   make fuzz          libFuzzer targets (clang, ASan+UBSan) in build-fuzz/, each
#                      run FUZZ_SECONDS (default 60) from tests/fuzz/corpus/<target>;
#                      new inputs go to build-fuzz/corpus/<target>, findings to
#                      build-fuzz/crash-<target>-*
#   make fuzz-replay   the same binaries, every checked-in corpus input run once
#                      (a few seconds: a regression test)
#   make fuzz-seeds    rewrite the generated seeds (tests/fuzz/mkseeds.c)
# Needs clang and libFuzzer (Debian: clang-14, libclang-rt-14-dev).
FUZZ_CC      ?= clang
FUZZ_BUILD   := build-fuzz
FUZZ_SECONDS ?= 60
FUZZ_TARGETS := segment config ring feed gpuring
FUZZ_SAN     := -fsanitize=address,undefined -fno-sanitize-recover=undefined
FUZZ_CFLAGS  := -std=gnu11 -g -O1 -fno-omit-frame-pointer -pthread $(filter-out -Werror -Wno-format-truncation,$(WARN)) \
                -Wno-unused-function -MMD -MP $(FUZZ_SAN)
FUZZ_OBJ     := $(CORE_SRC:%.c=$(FUZZ_BUILD)/obj/%.o)
FUZZ_BINS    := $(FUZZ_TARGETS:%=$(FUZZ_BUILD)/fuzz_%)
FUZZ_MAXLEN_segment := 65536
FUZZ_MAXLEN_config  := 8192
FUZZ_MAXLEN_ring    := 4096
FUZZ_MAXLEN_feed    := 1024
FUZZ_MAXLEN_gpuring := 4096

.PHONY: fuzz fuzz-build fuzz-replay fuzz-seeds fuzz-clean

$(FUZZ_BUILD)/obj/%.o: %.c
	@mkdir -p $(@D)
	$(FUZZ_CC) $(CPPFLAGS) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -c $< -o $@

$(FUZZ_BUILD)/libtscore.a: $(FUZZ_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(FUZZ_BUILD)/fuzz_%: tests/fuzz/fuzz_%.c $(FUZZ_BUILD)/libtscore.a
	$(FUZZ_CC) $(CPPFLAGS) $(FUZZ_CFLAGS) -fsanitize=fuzzer -o $@ $< $(FUZZ_BUILD)/libtscore.a

fuzz-build: $(FUZZ_BINS)

fuzz: fuzz-build
	@for t in $(FUZZ_TARGETS); do \
	    mkdir -p $(FUZZ_BUILD)/corpus/$$t; \
	    echo "fuzz: $$t for $(FUZZ_SECONDS) s"; \
	    $(FUZZ_BUILD)/fuzz_$$t -max_total_time=$(FUZZ_SECONDS) -max_len=$(FUZZ_MAXLEN_$$t) \
	        -timeout=10 -print_final_stats=1 -artifact_prefix=$(FUZZ_BUILD)/crash-$$t- \
	        $(FUZZ_BUILD)/corpus/$$t tests/fuzz/corpus/$$t 2>$(FUZZ_BUILD)/fuzz-$$t.log \
	        || { tail -n 60 $(FUZZ_BUILD)/fuzz-$$t.log; echo "fuzz: $$t FAILED (log $(FUZZ_BUILD)/fuzz-$$t.log)"; exit 1; }; \
	    grep -E '^stat::number_of_executed_units|DONE' $(FUZZ_BUILD)/fuzz-$$t.log; \
	done

fuzz-replay: fuzz-build
	@for t in $(FUZZ_TARGETS); do \
	    $(FUZZ_BUILD)/fuzz_$$t tests/fuzz/corpus/$$t/* >$(FUZZ_BUILD)/replay-$$t.log 2>&1 \
	        || { tail -n 60 $(FUZZ_BUILD)/replay-$$t.log; echo "fuzz-replay: $$t FAILED"; exit 1; }; \
	    echo "fuzz-replay: $$t: $$(ls tests/fuzz/corpus/$$t | wc -l) inputs pass"; \
	done

fuzz-seeds: $(CORE_LIB)
	@mkdir -p $(BUILD)/tests
	$(CC) $(CPPFLAGS) -std=gnu11 -g -O1 $(WARN) -pthread -o $(BUILD)/tests/fuzz-mkseeds tests/fuzz/mkseeds.c \
	    $(CORE_LIB) $(LDFLAGS)
	$(BUILD)/tests/fuzz-mkseeds tests/fuzz/corpus

fuzz-clean:
	rm -rf $(FUZZ_BUILD)

-include $(shell find $(FUZZ_BUILD) -name '*.d' 2>/dev/null)
