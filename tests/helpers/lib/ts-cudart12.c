/* libcudart.so.12 stand-in, for the two-runtimes case of the CUDA hooks
 * scenario: the runtime a plugin built for CUDA 12 brings along while the
 * program runs CUDA 13 (tsemu's). Exported under the version node
 * libcudart.so.12, as the real one is (ts-cudart12.map): a reference to it
 * does not bind to libcudart.so.13's definitions. Its copies only count
 * themselves, return a code no CUDA call returns and set errno, so that the
 * caller can tell which runtime ran them. */
#include <cuda_runtime_api.h>

#include <errno.h>

#define TS_CUDART12_RC 1212 /* no cudaError_t has this value */

static int calls;

__attribute__((visibility("default"))) int ts_cudart12_calls(void);
int ts_cudart12_calls(void)
{
	return calls;
}

/* One copy "made" (a static helper: a call between the exports would bind to the shim's). */
static cudaError_t ran(void)
{
	calls++;
	errno = ERANGE;
	return (cudaError_t)TS_CUDART12_RC;
}

__attribute__((visibility("default"))) cudaError_t cudaMemcpy(void *dst, const void *src, size_t n,
							      enum cudaMemcpyKind kind)
{
	(void)dst, (void)src, (void)n, (void)kind;
	return ran();
}

__attribute__((visibility("default"))) cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n,
								   enum cudaMemcpyKind kind, cudaStream_t s)
{
	(void)dst, (void)src, (void)n, (void)kind, (void)s;
	return ran();
}
