#!/usr/bin/env bash
# Installs the Debian packages tsshim needs that are missing, and says which.
# Idempotent: with everything present it installs nothing and prints one line.
# Run as root on a fresh machine (make test / make demo call it); --bench adds
# what scripts/bench.sh needs.
set -euo pipefail

PACKAGES=(
	gcc make libc6-dev         # toolchain
	liburing-dev               # io_uring prefetch (TSSHIM_PREFETCH=warm)
	libjpeg62-turbo-dev        # libjpeg-turbo: JPEG interposition, dataset tool
	libffi-dev                 # libffi: tracing closures for driver entry points
	libcriterion-dev           # Criterion: unit tests
	python3                    # test scripts parse tsshim-inspect --json
	python3-torch              # real PyTorch DataLoader jobs under the shim
	python3-torchvision        # ImageFolder and the standard transforms
	python3-pil                # Pillow: the JPEG decodes the shim serves
	procps                     # ps/pkill in scenarios
	valgrind                   # memcheck scenario
	util-linux                 # setpriv: the isolation scenario's second user
	cppcheck clang-tidy        # make lint (part of make test)
	clang libclang-rt-14-dev   # libFuzzer targets: make fuzz, corpus replay in make test
)

# scripts/bench.sh also draws its plot.
[ "${1:-}" = --bench ] && PACKAGES+=(python3-matplotlib util-linux) # util-linux: taskset

missing=()
for p in "${PACKAGES[@]}"; do
	status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
	[ "$status" = "install ok installed" ] || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
	echo "install-deps: all ${#PACKAGES[@]} packages present"
else
	if [ "$(id -u)" != 0 ]; then
		echo "install-deps: missing packages: ${missing[*]}" >&2
		echo "install-deps: run as root: apt-get install -y ${missing[*]}" >&2
		exit 1
	fi
	echo "install-deps: installing ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	if ! apt-get install -y --no-install-recommends "${missing[@]}" >/tmp/tsshim-apt.log 2>&1; then
		apt-get update >>/tmp/tsshim-apt.log 2>&1
		apt-get install -y --no-install-recommends "${missing[@]}" >>/tmp/tsshim-apt.log 2>&1 || {
			echo "install-deps: apt-get failed; see /tmp/tsshim-apt.log" >&2
			tail -n 20 /tmp/tsshim-apt.log >&2
			exit 1
		}
	fi
	echo "install-deps: installed ${missing[*]}"
fi

# CUDA: headers only, from the toolkit; nothing links it. Not a Debian package.
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
if [ ! -f "$CUDA_HOME/include/cuda.h" ]; then
	echo "install-deps: note: no CUDA toolkit headers under $CUDA_HOME (set CUDA_HOME); the CUDA path needs them"
fi
