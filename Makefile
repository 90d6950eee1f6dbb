# tsshim: shared data loading for collocated training jobs.
#
#   make          build/libtsshim.so, build/tsshim-inspect, tools
#   make test     install missing packages, build, run every test
#   make asan     the same build and tests with ASan+UBSan (build-asan/)
#   make demo     the main job on a built-in default
#   make bench    the benchmarks (scripts/bench.sh: with vs without the shim)
#
# CUDA_HOME points at the CUDA toolkit (headers only: nothing links CUDA).

CUDA_HOME ?= /usr/local/cuda
CC        ?= cc
BUILD     ?= build
SAN       ?=

WARN    := -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -Wmissing-prototypes \
           -Wno-unused-parameter -Wno-format-truncation
CPPFLAGS := -D_GNU_SOURCE -Iinclude -Icore -Ishim -isystem $(CUDA_HOME)/include
OPT     := -O2
ifneq ($(SAN),)
OPT     := -O1 -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
endif
CFLAGS  ?=
CFLAGS  += -std=gnu11 -g $(OPT) $(WARN) -fPIC -fvisibility=hidden -ftls-model=initial-exec \
           -pthread -MMD -MP
LDFLAGS += -pthread $(if $(SAN),-fsanitize=address$(comma)undefined)
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

.PHONY: all test asan demo bench deps clean check-build test-run
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
LIBS_ts-jpegcheck  := -ljpeg
LIBS_ts-jpegedge   := -ljpeg

$(BUILD)/tsshim-%: $(BUILD)/obj/tools/%.o $(CORE_LIB)
	$(CC) -o $@ $^ $(LDFLAGS) $(LIBS_$*)

# The Python bootstrap lives next to the library; precompiled, because
# jobs often run with PYTHONDONTWRITEBYTECODE (a few ms per start-up).
$(BUILD)/python/%.py: shim/python/%.py
	@mkdir -p $(@D)
	cp $< $@
	-@python3 -m compileall -q $@ >/dev/null 2>&1

$(BUILD)/tests/test_%: $(BUILD)/obj/tests/unit/test_%.o $(CORE_LIB)
	@mkdir -p $(@D)
	$(CC) -o $@ $^ $(LDFLAGS) -lcriterion $(LIBS_test_$*)

$(BUILD)/tests/%: $(BUILD)/obj/tests/helpers/%.o $(CORE_LIB)
	@mkdir -p $(@D)
	$(CC) -o $@ $^ $(LDFLAGS) $(LIBS_$*)

# tsemu, the test device (tools/cudaemu/): a CPU emulation of the CUDA 13
# runtime and driver subset tsshim uses, so the CUDA path is tested without
# a GPU. Programs pick it up with LD_LIBRARY_PATH=$(BUILD)/emu. Compiled
# against the CUDA headers; the runtime dlopen()s the driver.
EMU_DIR  := $(BUILD)/emu
EMU_LIBS := $(EMU_DIR)/libcudart.so.13 $(EMU_DIR)/libcuda.so.1
all: $(EMU_LIBS)

$(EMU_DIR)/libcuda.so.1: $(BUILD)/obj/tools/cudaemu/driver.o tools/cudaemu/libcuda.map
	@mkdir -p $(@D)
	$(CC) -shared -o $@ $< $(LDFLAGS) -Wl,--version-script=tools/cudaemu/libcuda.map \
	    -Wl,-soname,libcuda.so.1 -Wl,-z,defs -Wl,-z,now

$(EMU_DIR)/libcudart.so.13: $(BUILD)/obj/tools/cudaemu/runtime.o tools/cudaemu/libcudart.map
	@mkdir -p $(@D)
	$(CC) -shared -o $@ $< $(LDFLAGS) -Wl,--version-script=tools/cudaemu/libcudart.map \
	    -Wl,-soname,libcudart.so.13 -Wl,-z,defs -Wl,-z,now -ldl

# ts-cudaemu-check links nothing CUDA: it dlopen()s the emulated libraries.
LIBS_ts-cudaemu-check := -ldl
LIBS_ts-cudacalls     := -ldl

# For the CUDA hooks scenario: a library linked against (emulated) libcudart,
# which ts-cudacalls loads RTLD_LOCAL.
CUDALOCAL := $(BUILD)/tests/libts-cudalocal.so
$(CUDALOCAL): tests/helpers/lib/ts-cudalocal.c $(EMU_DIR)/libcudart.so.13
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(CFLAGS) -shared -o $@ $< -L$(EMU_DIR) -l:libcudart.so.13 $(LDFLAGS)

check-build: all $(UNITS) $(HELPERS) $(CUDALOCAL)

deps:
	@scripts/install-deps.sh

# Everything a fresh Debian machine needs, then every test.
test: deps
	@$(MAKE) --no-print-directory check-build
	@BUILD=$(BUILD) tests/run.sh

test-run: check-build
	@BUILD=$(BUILD) tests/run.sh

asan: deps
	@$(MAKE) --no-print-directory BUILD=build-asan SAN=1 test-run

demo: deps
	@$(MAKE) --no-print-directory all $(HELPERS)
	@BUILD=$(BUILD) scripts/demo.sh

bench: deps
	@BUILD=$(BUILD) scripts/bench.sh

clean:
	rm -rf build build-asan

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
