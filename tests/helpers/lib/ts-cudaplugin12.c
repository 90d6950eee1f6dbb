/* libts-cudaplugin12.so: a plugin built for CUDA 12, linked against its own
 * libcudart.so.12 (ts-cudart12.c, found through its run path), which
 * ts-tworuntimes, a CUDA 13 program, loads RTLD_LOCAL as Python loads
 * extension modules. Without the shim its copies bind to its own runtime
 * (the global libcudart.so.13 has no libcudart.so.12 version); with the
 * shim they bind to the shim's exports, which must pass them on there.
 * Built a second time as libts-cudapluginnov.so, against the same runtime
 * without versions: then the global 13 comes first, with or without us. */
#include <cuda_runtime_api.h>

#include <errno.h>

int ts_cudart12_calls(void);
int ts_plugin12_copy(int async, void *dev, int *err);
int ts_plugin12_calls(void);

/* One host-to-device copy to dev (async: cudaMemcpyAsync on stream 0); its
 * return code, and in *err errno after it (0 before). */
__attribute__((visibility("default"))) int ts_plugin12_copy(int async, void *dev, int *err)
{
	static char host[64];
	errno = 0;
	cudaError_t r = async ? cudaMemcpyAsync(dev, host, sizeof host, cudaMemcpyHostToDevice, 0)
			      : cudaMemcpy(dev, host, sizeof host, cudaMemcpyHostToDevice);
	*err = errno;
	return (int)r;
}

/* Copies its own runtime ran. */
__attribute__((visibility("default"))) int ts_plugin12_calls(void)
{
	return ts_cudart12_calls();
}
