/* libts-cudalocal.so: a library linked against libcudart.so.13 (a DT_NEEDED
 * dependency, calls bound by the dynamic linker), which ts-cudacalls loads
 * RTLD_LOCAL, as Python loads extension modules: its libcudart is then not
 * in the global scope, and a preloaded shim that exports cudaMemcpy must
 * still find the caller's own libcudart behind it. */
#include <cuda_runtime_api.h>

#include <string.h>

int ts_cudalocal_copies(int *copies, int *h2d, int *unknown);

/* Three runtime copies (two host to device), checked through a fourth
 * (device to host). 0 when the data came back right, else the failing step. */
__attribute__((visibility("default"))) int ts_cudalocal_copies(int *copies, int *h2d, int *unknown)
{
	enum { N = 4096 };
	static unsigned char a[N], b[N];
	void *d;
	cudaStream_t s;
	for (int i = 0; i < N; i++)
		a[i] = (unsigned char)(i * 7 + 3);
	if (cudaMalloc(&d, 2 * N) != cudaSuccess || cudaStreamCreate(&s) != cudaSuccess)
		return 1;
	if (cudaMemcpy(d, a, N, cudaMemcpyHostToDevice) != cudaSuccess)
		return 2;
	if (cudaMemcpyAsync((char *)d + N, a, N, cudaMemcpyHostToDevice, s) != cudaSuccess ||
	    cudaStreamSynchronize(s) != cudaSuccess)
		return 3;
	if (cudaMemcpy(b, (char *)d + N, N, cudaMemcpyDeviceToHost) != cudaSuccess || memcmp(a, b, N) != 0)
		return 4;
	cudaStreamDestroy(s);
	cudaFree(d);
	*copies = 3;
	*h2d = 2;
	*unknown = 0;
	return 0;
}
