/* SPDX-License-Identifier: MIT */
/*
 * Another CUDA runtime in the process, first in the global scope, as
 * PyTorch 2 loads its libcudart.so.13 (RTLD_GLOBAL, from its
 * nvidia-cuda-runtime wheel) before a program's own runtime: its functions
 * fail, as a runtime with no driver under it does. cudaemu.sh preloads it:
 * tsemu's runtime must never call into it (the real libcudart binds its
 * calls into itself; tsemu's cudaStreamCreate reached this
 * cudaStreamCreateWithFlags through the PLT before it was linked with
 * -Bsymbolic-functions).
 */
#include <cuda_runtime_api.h>

#define OTHER __attribute__((visibility("default")))

OTHER cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags)
{
	(void)s;
	(void)flags;
	return cudaErrorCallRequiresNewerDriver;
}

OTHER cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags)
{
	(void)e;
	(void)flags;
	return cudaErrorCallRequiresNewerDriver;
}
