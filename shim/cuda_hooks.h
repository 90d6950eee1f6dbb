/* SPDX-License-Identifier: MIT */
/*
 * CUDA interposition (shim/cuda.c): the in-shim interface.
 *
 * (Not named cuda.h: -Ishim comes before the CUDA headers on the include
 * path, so a shim/cuda.h would shadow <cuda.h> everywhere.)
 *
 * Every host copy the program makes through the hooked entry points is
 * classified once (runtime or driver path, host-to-device or not). An
 * upload of a registered stream range (shim/stream.h) is then served from
 * the GPU ring (consumer) or kept in it after the real copy (producer);
 * everything else goes to the real function untouched.
 */
#ifndef TSSHIM_SHIM_CUDA_HOOKS_H
#define TSSHIM_SHIM_CUDA_HOOKS_H

#include <stddef.h>
#include <stdint.h>

/*
 * Counters of this process (internal, for tests and `TSSHIM_LOG=debug`):
 * tsshim_cuda_stats() is exported from libtsshim.so (shim/tsshim.map) but is
 * no public API; tests find it with dlsym(RTLD_DEFAULT, ...). Fields are
 * only ever appended.
 */
struct tsshim_cuda_stats {
	uint64_t runtime_copies;   /* cudaMemcpy*, each copy once */
	uint64_t driver_copies;    /* cuMemcpyHtoD*, cuMemcpy, cuMemcpyAsync called by the program */
	uint64_t h2d_copies;       /* of those, host to device (explicit kind or HtoD entry point) */
	uint64_t h2d_bytes;
	uint64_t unknown_copies;   /* direction unknown (cudaMemcpyDefault, unified cuMemcpy*) */
	uint64_t batches_replaced; /* uploads served from the shared ring (items 3-5; 0 today) */
	uint64_t wrapped_dlsym;    /* dlsym lookups answered with a wrapper */
	uint64_t wrapped_getproc;  /* cuGetProcAddress lookups answered with a wrapper */
	uint64_t unwrapped_full;   /* real pointers handed out unwrapped: wrapper table full */
};

/* Copy min(size, sizeof) bytes of the counters to *out. 0, or -1 when out is NULL. */
int tsshim_cuda_stats(struct tsshim_cuda_stats *out, size_t size);

#endif
