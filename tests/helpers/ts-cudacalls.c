/* ts-cudacalls: host copies through every road the CUDA interposition
 * (shim/cuda.c) covers, each made a known number of times, every byte
 * checked. Links nothing CUDA: dlopen()s libcudart.so.13 and libcuda.so.1
 * (run it with LD_LIBRARY_PATH=build/emu), with or without the shim.
 *
 *   ts-cudacalls copies     runtime, driver by dlsym, by cuGetProcAddress(_v2)
 *                           (legacy and per-thread), by cudaGetDriverEntryPoint,
 *                           by dlsym(RTLD_DEFAULT); prints what it made and
 *                           (shim loaded) what the shim counted
 *   ts-cudacalls other      non-copy calls through dlsym still work; where
 *                           each looked-up pointer lives
 *   ts-cudacalls probe      dlsym(RTLD_DEFAULT) of CUDA names before CUDA is
 *                           loaded: NULL, as without the shim
 *   ts-cudacalls fork       a child forked after initialisation gets the
 *                           device's cudaErrorInitializationError through the hooks
 *   ts-cudacalls local LIB  copies by a library linked against libcudart and
 *                           loaded RTLD_LOCAL
 *   ts-cudacalls bench N    ns per pass-through cudaMemcpyAsync (64 B, pinned)
 *
 * Lines "made ..." and "shim ..." carry the counts; exit 0 when every check
 * passed, 1 when one failed (each on stderr), 2 on a usage or set-up error. */
#define CUDA_ENABLE_DEPRECATED 1
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <dlfcn.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cuda_hooks.h" /* struct tsshim_cuda_stats only: found with dlsym */

static int fails;

#define CHECK(cond, ...)                                                           \
	do {                                                                       \
		if (!(cond)) {                                                     \
			fails++;                                                   \
			fprintf(stderr, "FAIL (line %d) %s: ", __LINE__, #cond);   \
			fprintf(stderr, __VA_ARGS__);                              \
			fputc('\n', stderr);                                       \
		}                                                                  \
	} while (0)

static void die(const char *what)
{
	fprintf(stderr, "ts-cudacalls: %s\n", what);
	exit(2);
}

/* ---- the libraries ------------------------------------------------------------------ */

static struct {
	void *rt, *drv;
	__typeof__(cudaMalloc) *Malloc;
	__typeof__(cudaFree) *Free;
	__typeof__(cudaHostAlloc) *HostAlloc;
	__typeof__(cudaFreeHost) *FreeHost;
	__typeof__(cudaStreamCreate) *StreamCreate;
	__typeof__(cudaStreamDestroy) *StreamDestroy;
	__typeof__(cudaStreamSynchronize) *StreamSynchronize;
	__typeof__(cudaDeviceSynchronize) *DeviceSynchronize;
	__typeof__(cudaGetDriverEntryPointByVersion) *GetDriverEntryPointByVersion;
	__typeof__(cudaMemcpy) *Memcpy;
	__typeof__(cudaMemcpy) *Memcpy_ptds;
	__typeof__(cudaMemcpyAsync) *MemcpyAsync;
	__typeof__(cudaMemcpyAsync) *MemcpyAsync_ptsz;
	__typeof__(cuGetProcAddress_v2) *GetProcAddress_v2;
	CUresult (*GetProcAddress)(const char *, void **, int, cuuint64_t);
	__typeof__(cuMemcpyDtoH_v2) *DtoH; /* not hooked: reads back */
	int (*shim_stats)(struct tsshim_cuda_stats *, size_t);
} L;

static void *sym(void *h, const char *name)
{
	void *p = dlsym(h, name);
	if (!p) {
		fprintf(stderr, "ts-cudacalls: %s not found: %s\n", name, dlerror());
		exit(2);
	}
	return p;
}

static void load(void)
{
	if (!(L.rt = dlopen("libcudart.so.13", RTLD_NOW | RTLD_GLOBAL)))
		die(dlerror());
	if (!(L.drv = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL)))
		die(dlerror());
	*(void **)&L.Malloc = sym(L.rt, "cudaMalloc");
	*(void **)&L.Free = sym(L.rt, "cudaFree");
	*(void **)&L.HostAlloc = sym(L.rt, "cudaHostAlloc");
	*(void **)&L.FreeHost = sym(L.rt, "cudaFreeHost");
	*(void **)&L.StreamCreate = sym(L.rt, "cudaStreamCreate");
	*(void **)&L.StreamDestroy = sym(L.rt, "cudaStreamDestroy");
	*(void **)&L.StreamSynchronize = sym(L.rt, "cudaStreamSynchronize");
	*(void **)&L.DeviceSynchronize = sym(L.rt, "cudaDeviceSynchronize");
	*(void **)&L.GetDriverEntryPointByVersion = sym(L.rt, "cudaGetDriverEntryPointByVersion");
	*(void **)&L.Memcpy = sym(L.rt, "cudaMemcpy");
	*(void **)&L.Memcpy_ptds = sym(L.rt, "cudaMemcpy_ptds");
	*(void **)&L.MemcpyAsync = sym(L.rt, "cudaMemcpyAsync");
	*(void **)&L.MemcpyAsync_ptsz = sym(L.rt, "cudaMemcpyAsync_ptsz");
	*(void **)&L.GetProcAddress_v2 = sym(L.drv, "cuGetProcAddress_v2");
	*(void **)&L.GetProcAddress = sym(L.drv, "cuGetProcAddress");
	*(void **)&L.DtoH = sym(L.drv, "cuMemcpyDtoH_v2");
	*(void **)&L.shim_stats = dlsym(RTLD_DEFAULT, "tsshim_cuda_stats"); /* NULL without the shim */
}

/* A driver entry point as a runtime of `version` asks for it (legacy stream). */
static void *getproc_at(const char *name, int version)
{
	void *fn = NULL;
	CUdriverProcAddressQueryResult st;
	if (L.GetProcAddress_v2(name, &fn, version, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &st) != CUDA_SUCCESS || !fn)
		die("cuGetProcAddress_v2 failed");
	return fn;
}

static void *getproc(const char *name, cuuint64_t flags)
{
	void *fn = NULL;
	CUdriverProcAddressQueryResult st;
	if (L.GetProcAddress_v2(name, &fn, 13000, flags, &st) != CUDA_SUCCESS || !fn)
		die("cuGetProcAddress_v2 failed");
	return fn;
}

/* ---- data ------------------------------------------------------------------------------ */

static void fill(unsigned char *p, size_t n, unsigned seed)
{
	uint32_t x = seed * 2654435761u + 1;
	for (size_t i = 0; i < n; i++) {
		x = x * 1103515245u + 12345u;
		p[i] = (unsigned char)(x >> 16);
	}
}

static void print_shim(void)
{
	struct tsshim_cuda_stats s;
	if (!L.shim_stats) {
		printf("shim none\n");
		return;
	}
	memset(&s, 0, sizeof s);
	L.shim_stats(&s, sizeof s);
	printf("shim runtime=%llu driver=%llu h2d=%llu h2d_bytes=%llu unknown=%llu replaced=%llu\n",
	       (unsigned long long)s.runtime_copies, (unsigned long long)s.driver_copies,
	       (unsigned long long)s.h2d_copies, (unsigned long long)s.h2d_bytes,
	       (unsigned long long)s.unknown_copies, (unsigned long long)s.batches_replaced);
}

/* ---- copies ---------------------------------------------------------------------------------- */

enum via { RT_MEMCPY, RT_MEMCPY_ASYNC, DRV_HTOD, DRV_HTOD_ASYNC, DRV_MEMCPY, DRV_MEMCPY_ASYNC };

struct copy {
	const char *how;
	enum via via;
	void *fn;                 /* the entry point as the program got it */
	enum cudaMemcpyKind kind; /* runtime copies */
	int pinned, stream;       /* source pinned; on our stream (else the default one) */
	int d2d;                  /* runtime device-to-device copy of the previous region */
};

#define REGION 8192
#define MAXCOPIES 64

static void t_copies(void)
{
	load();
	struct copy c[MAXCOPIES];
	int n = 0;
#define ADD_(h, v, f, k, p, s) c[n++] = (struct copy){h, v, f, k, p, s, 0}
	/* runtime, by dlsym on the library's handle */
	ADD_("cudaMemcpy H2D", RT_MEMCPY, L.Memcpy, cudaMemcpyHostToDevice, 0, 0);
	c[n++] = (struct copy){"cudaMemcpy D2D", RT_MEMCPY, L.Memcpy, cudaMemcpyDeviceToDevice, 0, 0, 1};
	ADD_("cudaMemcpy Default", RT_MEMCPY, L.Memcpy, cudaMemcpyDefault, 0, 0);
	ADD_("cudaMemcpyAsync H2D", RT_MEMCPY_ASYNC, L.MemcpyAsync, cudaMemcpyHostToDevice, 1, 1);
	ADD_("cudaMemcpyAsync Default", RT_MEMCPY_ASYNC, L.MemcpyAsync, cudaMemcpyDefault, 1, 1);
	ADD_("cudaMemcpy_ptds H2D", RT_MEMCPY, L.Memcpy_ptds, cudaMemcpyHostToDevice, 0, 0);
	ADD_("cudaMemcpyAsync_ptsz H2D", RT_MEMCPY_ASYNC, L.MemcpyAsync_ptsz, cudaMemcpyHostToDevice, 1, 0);
	ADD_("cudaMemcpyAsync_ptsz H2D pageable", RT_MEMCPY_ASYNC, L.MemcpyAsync_ptsz, cudaMemcpyHostToDevice, 0, 1);
	/* runtime, by dlsym(RTLD_DEFAULT): our export with the shim */
	ADD_("dlsym(RTLD_DEFAULT) cudaMemcpy H2D", RT_MEMCPY, sym(RTLD_DEFAULT, "cudaMemcpy"), cudaMemcpyHostToDevice, 0, 0);
	/* driver, by dlsym on its handle */
	ADD_("cuMemcpyHtoD_v2", DRV_HTOD, sym(L.drv, "cuMemcpyHtoD_v2"), 0, 0, 0);
	ADD_("cuMemcpyHtoD_v2_ptds", DRV_HTOD, sym(L.drv, "cuMemcpyHtoD_v2_ptds"), 0, 0, 0);
	ADD_("cuMemcpyHtoDAsync_v2", DRV_HTOD_ASYNC, sym(L.drv, "cuMemcpyHtoDAsync_v2"), 0, 1, 1);
	ADD_("cuMemcpyHtoDAsync_v2_ptsz", DRV_HTOD_ASYNC, sym(L.drv, "cuMemcpyHtoDAsync_v2_ptsz"), 0, 1, 0);
	ADD_("cuMemcpy", DRV_MEMCPY, sym(L.drv, "cuMemcpy"), 0, 0, 0);
	ADD_("cuMemcpy_ptds", DRV_MEMCPY, sym(L.drv, "cuMemcpy_ptds"), 0, 0, 0);
	ADD_("cuMemcpyAsync", DRV_MEMCPY_ASYNC, sym(L.drv, "cuMemcpyAsync"), 0, 1, 1);
	ADD_("cuMemcpyAsync_ptsz", DRV_MEMCPY_ASYNC, sym(L.drv, "cuMemcpyAsync_ptsz"), 0, 1, 0);
	/* driver, by dlsym(RTLD_DEFAULT) */
	ADD_("dlsym(RTLD_DEFAULT) cuMemcpyHtoD_v2", DRV_HTOD, sym(RTLD_DEFAULT, "cuMemcpyHtoD_v2"), 0, 0, 0);
	/* driver, by cuGetProcAddress_v2, legacy and per-thread */
	static const cuuint64_t flags[2] = {CU_GET_PROC_ADDRESS_LEGACY_STREAM,
					    CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM};
	static const char *const fl[2] = {"legacy", "per-thread"};
	static char how[2][4][80];
	for (int f = 0; f < 2; f++) {
		static const char *const names[4] = {"cuMemcpyHtoD", "cuMemcpyHtoDAsync", "cuMemcpy", "cuMemcpyAsync"};
		static const enum via vias[4] = {DRV_HTOD, DRV_HTOD_ASYNC, DRV_MEMCPY, DRV_MEMCPY_ASYNC};
		for (int i = 0; i < 4; i++) {
			snprintf(how[f][i], sizeof how[f][i], "cuGetProcAddress_v2(%s, %s)", names[i], fl[f]);
			ADD_(how[f][i], vias[i], getproc(names[i], flags[f]), 0, i % 2, i % 2);
		}
	}
	/* driver, by the v1 cuGetProcAddress and by the runtime's cudaGetDriverEntryPointByVersion */
	void *fn = NULL;
	if (L.GetProcAddress("cuMemcpyHtoDAsync", &fn, 13000, 0) != CUDA_SUCCESS || !fn)
		die("cuGetProcAddress failed");
	ADD_("cuGetProcAddress(cuMemcpyHtoDAsync)", DRV_HTOD_ASYNC, fn, 0, 1, 1);
	enum cudaDriverEntryPointQueryResult qr;
	fn = NULL;
	if (L.GetDriverEntryPointByVersion("cuMemcpyHtoD", &fn, 13000, cudaEnableDefault, &qr) != cudaSuccess || !fn)
		die("cudaGetDriverEntryPointByVersion failed");
	ADD_("cudaGetDriverEntryPointByVersion(cuMemcpyHtoD)", DRV_HTOD, fn, 0, 0, 0);
#undef ADD_

	/* A variant with another signature (v1: 32-bit device pointers) is no
	 * copy function of ours: handed out untouched, as dlsym gives it. */
	void *v1 = NULL;
	CHECK(L.GetProcAddress_v2("cuMemcpyHtoD", &v1, 3000, CU_GET_PROC_ADDRESS_LEGACY_STREAM, NULL) == CUDA_SUCCESS &&
		      v1 && v1 == dlsym(L.drv, "cuMemcpyHtoD"),
	      "cuGetProcAddress(cuMemcpyHtoD, 3000) is the v1 function, untouched (%p, %p)", v1,
	      dlsym(L.drv, "cuMemcpyHtoD"));

	unsigned char *dev, *pinned, *pageable = malloc((size_t)n * REGION), *back = malloc((size_t)n * REGION);
	cudaStream_t s;
	if (!pageable || !back || L.Malloc((void **)&dev, (size_t)n * REGION) != cudaSuccess ||
	    L.HostAlloc((void **)&pinned, (size_t)n * REGION, cudaHostAllocDefault) != cudaSuccess ||
	    L.StreamCreate(&s) != cudaSuccess)
		die("set-up failed");
	struct tsshim_cuda_stats before = {0};
	if (L.shim_stats)
		L.shim_stats(&before, sizeof before);

	unsigned long long runtime = 0, driver = 0, h2d = 0, h2d_bytes = 0, unknown = 0;
	for (int i = 0; i < n; i++) {
		size_t len = REGION - 64 * (size_t)i; /* a different length per copy */
		unsigned char *src = (c[i].pinned ? pinned : pageable) + (size_t)i * REGION;
		unsigned char *dst = dev + (size_t)i * REGION;
		CUdeviceptr ddst = (CUdeviceptr)(uintptr_t)dst;
		CUstream st = c[i].stream ? (CUstream)s : NULL;
		int r, is_h2d = 0, is_unknown = 0;
		if (c[i].d2d) { /* the previous region, already on the device (a synchronous copy) */
			src = dev + (size_t)(i - 1) * REGION;
			len = REGION - 64 * (size_t)(i - 1);
		} else {
			fill(src, len, (unsigned)i + 1);
		}
		switch (c[i].via) {
		case RT_MEMCPY:
			r = ((__typeof__(cudaMemcpy) *)c[i].fn)(dst, src, len, c[i].kind);
			break;
		case RT_MEMCPY_ASYNC:
			r = ((__typeof__(cudaMemcpyAsync) *)c[i].fn)(dst, src, len, c[i].kind, (cudaStream_t)st);
			break;
		case DRV_HTOD:
			r = ((__typeof__(cuMemcpyHtoD_v2) *)c[i].fn)(ddst, src, len);
			break;
		case DRV_HTOD_ASYNC:
			r = ((__typeof__(cuMemcpyHtoDAsync_v2) *)c[i].fn)(ddst, src, len, st);
			break;
		case DRV_MEMCPY:
			r = ((__typeof__(cuMemcpy) *)c[i].fn)(ddst, (CUdeviceptr)(uintptr_t)src, len);
			break;
		default:
			r = ((__typeof__(cuMemcpyAsync) *)c[i].fn)(ddst, (CUdeviceptr)(uintptr_t)src, len, st);
			break;
		}
		CHECK(r == 0, "%s: error %d", c[i].how, r);
		if (c[i].via == RT_MEMCPY || c[i].via == RT_MEMCPY_ASYNC) {
			runtime++;
			is_h2d = c[i].kind == cudaMemcpyHostToDevice;
			is_unknown = c[i].kind == cudaMemcpyDefault;
		} else {
			driver++;
			is_h2d = c[i].via == DRV_HTOD || c[i].via == DRV_HTOD_ASYNC;
			is_unknown = !is_h2d;
		}
		h2d += is_h2d;
		h2d_bytes += is_h2d ? len : 0;
		unknown += is_unknown;
	}
	CHECK(L.StreamSynchronize(s) == cudaSuccess && L.DeviceSynchronize() == cudaSuccess, "synchronize");
	/* Read everything back with a call the shim does not hook. */
	CHECK(L.DtoH(back, (CUdeviceptr)(uintptr_t)dev, (size_t)n * REGION) == CUDA_SUCCESS, "read back");
	for (int i = 0; i < n; i++) {
		size_t len = REGION - 64 * (size_t)(c[i].d2d ? i - 1 : i);
		unsigned char want[REGION];
		fill(want, len, (unsigned)(c[i].d2d ? i : i + 1));
		CHECK(memcmp(back + (size_t)i * REGION, want, len) == 0, "%s: data on the device is wrong", c[i].how);
	}
	printf("made runtime=%llu driver=%llu h2d=%llu h2d_bytes=%llu unknown=%llu replaced=0\n", runtime, driver, h2d,
	       h2d_bytes, unknown);
	if (L.shim_stats) {
		struct tsshim_cuda_stats after = {0};
		L.shim_stats(&after, sizeof after);
		printf("shim runtime=%llu driver=%llu h2d=%llu h2d_bytes=%llu unknown=%llu replaced=%llu\n",
		       (unsigned long long)(after.runtime_copies - before.runtime_copies),
		       (unsigned long long)(after.driver_copies - before.driver_copies),
		       (unsigned long long)(after.h2d_copies - before.h2d_copies),
		       (unsigned long long)(after.h2d_bytes - before.h2d_bytes),
		       (unsigned long long)(after.unknown_copies - before.unknown_copies),
		       (unsigned long long)(after.batches_replaced - before.batches_replaced));
	} else {
		printf("shim none\n");
	}
	printf("copies=%d\n", n);
	L.StreamDestroy(s);
	L.FreeHost(pinned);
	L.Free(dev);
	free(pageable);
	free(back);
}

/* ---- everything else passes through ------------------------------------------------------- */

static const char *where(const void *p)
{
	Dl_info info;
	if (!p || !dladdr(p, &info) || !info.dli_fname)
		return "?";
	const char *b = strrchr(info.dli_fname, '/');
	return b ? b + 1 : info.dli_fname;
}

/*
 * The calls that may destroy a primary context, by cuGetProcAddress (v1 at
 * 7000, as the real libcudart 13 asks, and _v2 at 11000) and by dlsym:
 * answers and errno as without the shim, and a reset still destroys the
 * context's memory. Prints where each pointer lives.
 */
typedef CUresult (*ctx_dev_fn)(CUdevice);
typedef CUresult (*ctx_destroy_fn)(CUcontext);
typedef CUresult (*ctx_create_fn)(CUcontext *, CUctxCreateParams *, unsigned int, CUdevice);

/*
 * cuCtxDestroy (v1 at 2000, _v2 at 4000, and _v2 by dlsym) of a context the
 * program made with cuCtxCreate (CUDA 13's, _v4): success, errno kept, the
 * context's memory gone with it, its handle invalid after.
 */
static void ctx_destroy_calls(__typeof__(cuMemAlloc_v2) *alloc, __typeof__(cuMemFree_v2) *mfree)
{
	ctx_destroy_fn destroys[] = {getproc_at("cuCtxDestroy", 2000), getproc_at("cuCtxDestroy", 4000),
				     sym(L.drv, "cuCtxDestroy_v2")};
	ctx_create_fn create = getproc_at("cuCtxCreate", 12050);
	__typeof__(cuCtxGetCurrent) *getcur = getproc("cuCtxGetCurrent", CU_GET_PROC_ADDRESS_LEGACY_STREAM);
	__typeof__(cuCtxSetCurrent) *setcur = getproc("cuCtxSetCurrent", CU_GET_PROC_ADDRESS_LEGACY_STREAM);
	for (unsigned i = 0; i < 3; i++) {
		CUcontext prev = NULL, c = NULL, now = NULL;
		CUdeviceptr dp;
		CHECK(getcur(&prev) == CUDA_SUCCESS && create(&c, NULL, 0, 0) == CUDA_SUCCESS && c &&
			      getcur(&now) == CUDA_SUCCESS && now == c,
		      "cuCtxCreate (%u of 3): a context of our own, current", i + 1);
		errno = 4244;
		CHECK(alloc(&dp, 100) == CUDA_SUCCESS && destroys[i](c) == CUDA_SUCCESS && errno == 4244,
		      "cuCtxDestroy (%u of 3): success, errno kept (%d)", i + 1, errno);
		CHECK(setcur(prev) == CUDA_SUCCESS && mfree(dp) == CUDA_ERROR_INVALID_VALUE,
		      "... its memory went with the context (%u of 3)", i + 1);
		CHECK(destroys[i](c) == CUDA_ERROR_INVALID_CONTEXT, "... and its handle is invalid after (%u of 3)", i + 1);
	}
	printf("where-ctx-destroy destroy=%s destroy_v2=%s dlsym_destroy_v2=%s\n", where(destroys[0]),
	       where(destroys[1]), where(destroys[2]));
}

static void ctx_calls(__typeof__(cuMemAlloc_v2) *alloc, __typeof__(cuMemFree_v2) *mfree)
{
	ctx_dev_fn reset1 = getproc_at("cuDevicePrimaryCtxReset", 7000);
	ctx_dev_fn reset2 = getproc_at("cuDevicePrimaryCtxReset", 11000);
	ctx_dev_fn release1 = getproc_at("cuDevicePrimaryCtxRelease", 7000);
	ctx_dev_fn release2 = getproc_at("cuDevicePrimaryCtxRelease", 11000);
	ctx_dev_fn reset_dl = sym(L.drv, "cuDevicePrimaryCtxReset_v2");
	__typeof__(cuDevicePrimaryCtxRetain) *retain = getproc("cuDevicePrimaryCtxRetain", CU_GET_PROC_ADDRESS_LEGACY_STREAM);
	CUcontext pc;
	errno = 4242;
	CHECK(retain(&pc, 0) == CUDA_SUCCESS && release1(0) == CUDA_SUCCESS && retain(&pc, 0) == CUDA_SUCCESS &&
		      release2(0) == CUDA_SUCCESS && errno == 4242,
	      "cuDevicePrimaryCtxRelease (v1, _v2) of a retain: success, errno kept (%d)", errno);
	CHECK(release1(99) == CUDA_ERROR_INVALID_DEVICE && reset2(99) == CUDA_ERROR_INVALID_DEVICE,
	      "a bad device: CUDA_ERROR_INVALID_DEVICE");
	ctx_dev_fn resets[] = {reset1, reset2, reset_dl};
	for (unsigned i = 0; i < 3; i++) {
		CUdeviceptr dp;
		errno = 4243;
		CHECK(alloc(&dp, 100) == CUDA_SUCCESS && resets[i](0) == CUDA_SUCCESS && errno == 4243,
		      "cuDevicePrimaryCtxReset (%u of 3): success, errno kept (%d)", i + 1, errno);
		CHECK(mfree(dp) == CUDA_ERROR_INVALID_VALUE, "... its memory went with the context (%u of 3)", i + 1);
	}
	printf("where-ctx reset=%s reset_v2=%s release=%s release_v2=%s dlsym_reset_v2=%s\n", where(reset1),
	       where(reset2), where(release1), where(release2), where(reset_dl));
	ctx_destroy_calls(alloc, mfree);
}

static void t_other(void)
{
	load();
	/* non-copy runtime calls, by dlsym */
	__typeof__(cudaGetDeviceCount) *count = sym(L.rt, "cudaGetDeviceCount");
	__typeof__(cudaEventCreate) *ecreate = sym(L.rt, "cudaEventCreate");
	__typeof__(cudaEventRecord) *erecord = sym(L.rt, "cudaEventRecord");
	__typeof__(cudaEventSynchronize) *esync = sym(L.rt, "cudaEventSynchronize");
	__typeof__(cudaEventElapsedTime) *elapsed = sym(L.rt, "cudaEventElapsedTime");
	__typeof__(cudaEventDestroy) *edestroy = sym(L.rt, "cudaEventDestroy");
	__typeof__(cudaMemset) *memset_ = sym(L.rt, "cudaMemset");
	__typeof__(cudaPointerGetAttributes) *attrs = sym(L.rt, "cudaPointerGetAttributes");
	__typeof__(cudaGetLastError) *lasterr = sym(L.rt, "cudaGetLastError");
	int nd = 0;
	CHECK(count(&nd) == cudaSuccess && nd >= 1, "cudaGetDeviceCount: %d", nd);
	void *d;
	cudaStream_t s;
	cudaEvent_t e0, e1;
	CHECK(L.Malloc(&d, 4096) == cudaSuccess, "cudaMalloc");
	CHECK(L.StreamCreate(&s) == cudaSuccess, "cudaStreamCreate");
	CHECK(ecreate(&e0) == cudaSuccess && ecreate(&e1) == cudaSuccess, "cudaEventCreate");
	CHECK(erecord(e0, s) == cudaSuccess, "cudaEventRecord");
	CHECK(memset_(d, 0x5a, 4096) == cudaSuccess, "cudaMemset");
	CHECK(erecord(e1, s) == cudaSuccess && esync(e1) == cudaSuccess, "cudaEventRecord/Synchronize");
	float ms = -1;
	CHECK(elapsed(&ms, e0, e1) == cudaSuccess && ms >= 0, "cudaEventElapsedTime");
	struct cudaPointerAttributes a;
	CHECK(attrs(&a, d) == cudaSuccess && a.type == cudaMemoryTypeDevice, "cudaPointerGetAttributes");
	unsigned char h[4096];
	CHECK(L.DtoH(h, (CUdeviceptr)(uintptr_t)d, sizeof h) == CUDA_SUCCESS && h[0] == 0x5a && h[4095] == 0x5a,
	      "cudaMemset wrote, cuMemcpyDtoH read");
	CHECK(L.Memcpy(h, d, sizeof h, (enum cudaMemcpyKind)42) == cudaErrorInvalidMemcpyDirection &&
		      lasterr() == cudaErrorInvalidMemcpyDirection && lasterr() == cudaSuccess,
	      "an invalid copy kind: the runtime's error, sticky as usual");
	/* driver calls by cuGetProcAddress that are not copies */
	__typeof__(cuMemAlloc_v2) *alloc = getproc("cuMemAlloc", CU_GET_PROC_ADDRESS_LEGACY_STREAM);
	__typeof__(cuMemFree_v2) *mfree = getproc("cuMemFree", CU_GET_PROC_ADDRESS_LEGACY_STREAM);
	__typeof__(cuStreamSynchronize) *ssync = getproc("cuStreamSynchronize", CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
	CUdeviceptr dp;
	CHECK(alloc(&dp, 100) == CUDA_SUCCESS && mfree(dp) == CUDA_SUCCESS, "cuMemAlloc/cuMemFree by cuGetProcAddress");
	CHECK(ssync(NULL) == CUDA_SUCCESS, "cuStreamSynchronize_ptsz by cuGetProcAddress");
	CHECK(!strcmp(where(alloc), "libcuda.so.1"), "cuMemAlloc from cuGetProcAddress is the driver's own (%s)",
	      where(alloc));
	/* dlerror after lookups: a found name leaves no error, a missing one does */
	dlerror();
	void *p = dlsym(L.rt, "cudaMemcpy");
	CHECK(p && dlerror() == NULL, "dlsym(libcudart, cudaMemcpy) then dlerror() is NULL");
	p = dlsym(RTLD_DEFAULT, "cuMemcpyHtoD_v2");
	CHECK(p && dlerror() == NULL, "dlsym(RTLD_DEFAULT, cuMemcpyHtoD_v2) then dlerror() is NULL");
	p = dlsym(L.rt, "cudaNoSuchFunction");
	CHECK(!p && dlerror() != NULL, "a missing name: NULL and an error");
	/* where the pointers live: hooked names come from the shim when it is there */
	printf("where cudaMalloc=%s cudaMemcpy=%s cuMemcpyHtoD_v2=%s cuGetProcAddress_v2=%s cuMemAlloc=%s\n",
	       where(L.Malloc), where(L.Memcpy), where(dlsym(L.drv, "cuMemcpyHtoD_v2")), where(L.GetProcAddress_v2),
	       where(alloc));
	edestroy(e0);
	edestroy(e1);
	L.StreamDestroy(s);
	L.Free(d);
	ctx_calls(alloc, mfree);
	print_shim();
}

/* dlsym(RTLD_DEFAULT) and dlsym(RTLD_NEXT) (from the program, which comes
 * before a preloaded library) of CUDA names while no CUDA library is loaded,
 * and RTLD_NEXT of libjpeg's names (this program links no libjpeg). */
static void t_probe(void)
{
	static const char *const names[] = {"cudaMemcpy", "cudaMemcpyAsync_ptsz", "cuMemcpyHtoD_v2",
					    "cuGetProcAddress", "cuGetProcAddress_v2", "cuDevicePrimaryCtxReset",
					    "cudaMalloc"};
	for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
		dlerror();
		void *p = dlsym(RTLD_DEFAULT, names[i]);
		const char *err = dlerror();
		CHECK(!p && err, "dlsym(RTLD_DEFAULT, %s) with no CUDA loaded: %p (%s)", names[i], p, err ? err : "no error");
		p = dlsym(RTLD_NEXT, names[i]);
		err = dlerror();
		CHECK(!p && err, "dlsym(RTLD_NEXT, %s) with no CUDA loaded: %p (%s)", names[i], p, err ? err : "no error");
	}
	/* libjpeg's names too: the shim exports them, and a call through ours aborts where none is loaded */
	static const char *const jpeg[] = {"jpeg_CreateDecompress", "jpeg_read_header", "jpeg_destroy"};
	for (size_t i = 0; i < sizeof jpeg / sizeof jpeg[0]; i++) {
		dlerror();
		void *p = dlsym(RTLD_NEXT, jpeg[i]);
		const char *err = dlerror();
		CHECK(!p && err, "dlsym(RTLD_NEXT, %s) with no libjpeg loaded: %p (%s)", jpeg[i], p, err ? err : "no error");
	}
	load();
	CHECK(dlsym(RTLD_DEFAULT, "cudaMemcpy") && dlsym(RTLD_DEFAULT, "cuGetProcAddress_v2"),
	      "after loading CUDA (RTLD_GLOBAL) the names are found");
	CHECK(dlsym(RTLD_NEXT, "cudaMemcpy") && dlsym(RTLD_NEXT, "cuGetProcAddress_v2"),
	      "after loading CUDA (RTLD_GLOBAL) RTLD_NEXT finds the names");
	printf("probe done\n");
}

/* ---- fork ------------------------------------------------------------------------------------ */

static void t_fork(void)
{
	load();
	void *d;
	unsigned char h[256];
	fill(h, sizeof h, 3);
	__typeof__(cuMemcpyHtoD_v2) *htod = sym(L.drv, "cuMemcpyHtoD_v2");
	__typeof__(cuMemcpyAsync) *gp = getproc("cuMemcpyAsync", CU_GET_PROC_ADDRESS_LEGACY_STREAM);
	CHECK(L.Malloc(&d, sizeof h) == cudaSuccess && L.Memcpy(d, h, sizeof h, cudaMemcpyHostToDevice) == cudaSuccess,
	      "parent: a copy");
	struct tsshim_cuda_stats s0 = {0}, s1 = {0};
	if (L.shim_stats)
		L.shim_stats(&s0, sizeof s0);
	fflush(stdout);
	fflush(stderr);
	pid_t p = fork();
	if (p == 0) {
		alarm(10);
		CHECK(L.Memcpy(d, h, sizeof h, cudaMemcpyHostToDevice) == cudaErrorInitializationError,
		      "child: cudaMemcpy fails with cudaErrorInitializationError");
		CHECK(L.MemcpyAsync(d, h, sizeof h, cudaMemcpyHostToDevice, NULL) == cudaErrorInitializationError,
		      "child: cudaMemcpyAsync fails with cudaErrorInitializationError");
		CHECK(htod((CUdeviceptr)(uintptr_t)d, h, sizeof h) == CUDA_ERROR_NOT_INITIALIZED,
		      "child: cuMemcpyHtoD_v2 fails with CUDA_ERROR_NOT_INITIALIZED");
		CHECK(gp((CUdeviceptr)(uintptr_t)d, (CUdeviceptr)(uintptr_t)h, sizeof h, NULL) == CUDA_ERROR_NOT_INITIALIZED,
		      "child: cuMemcpyAsync (cuGetProcAddress) fails with CUDA_ERROR_NOT_INITIALIZED");
		if (L.shim_stats) {
			L.shim_stats(&s1, sizeof s1);
			CHECK(!memcmp(&s0, &s1, sizeof s0), "child: the shim looked at none of its calls");
		}
		exit(fails ? 1 : 0);
	}
	int st = -1;
	while (waitpid(p, &st, 0) < 0)
		;
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child exit status %d", st);
	unsigned char b[256];
	CHECK(L.Memcpy(b, d, sizeof b, cudaMemcpyDeviceToHost) == cudaSuccess && !memcmp(b, h, sizeof b),
	      "parent: goes on");
	L.Free(d);
	print_shim();
}

/* ---- a library bound to libcudart, loaded RTLD_LOCAL --------------------------------------------- */

static void t_local(const char *lib)
{
	void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
	if (!h)
		die(dlerror());
	int (*copies)(int *, int *, int *) = sym(h, "ts_cudalocal_copies");
	int (*stats)(struct tsshim_cuda_stats *, size_t) = dlsym(RTLD_DEFAULT, "tsshim_cuda_stats");
	struct tsshim_cuda_stats s0 = {0}, s1 = {0};
	if (stats)
		stats(&s0, sizeof s0);
	int n = 0, h2d = 0, unknown = 0, r = copies(&n, &h2d, &unknown);
	CHECK(r == 0, "the library's copies (step %d failed)", r);
	printf("made runtime=%d driver=0 h2d=%d unknown=%d\n", n, h2d, unknown);
	if (stats) {
		stats(&s1, sizeof s1);
		printf("shim runtime=%llu driver=%llu h2d=%llu unknown=%llu\n",
		       (unsigned long long)(s1.runtime_copies - s0.runtime_copies),
		       (unsigned long long)(s1.driver_copies - s0.driver_copies),
		       (unsigned long long)(s1.h2d_copies - s0.h2d_copies),
		       (unsigned long long)(s1.unknown_copies - s0.unknown_copies));
	} else {
		printf("shim none\n");
	}
}

/* ---- cost of a pass-through copy ------------------------------------------------------------------ */

static double now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static void t_bench(long n)
{
	load();
	void *d, *h;
	cudaStream_t s;
	if (L.Malloc(&d, 64) != cudaSuccess || L.HostAlloc(&h, 64, cudaHostAllocDefault) != cudaSuccess ||
	    L.StreamCreate(&s) != cudaSuccess)
		die("set-up failed");
	double best = 1e30;
	for (int round = 0; round < 7; round++) {
		double t0 = now_ns();
		for (long i = 0; i < n; i++)
			if (L.MemcpyAsync(d, h, 64, cudaMemcpyHostToDevice, s) != cudaSuccess)
				die("cudaMemcpyAsync failed");
		if (L.StreamSynchronize(s) != cudaSuccess)
			die("sync failed");
		double per = (now_ns() - t0) / (double)n;
		if (per < best)
			best = per;
	}
	printf("ns_per_call=%.0f\n", best);
	print_shim();
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc >= 2 && !strcmp(argv[1], "copies"))
		t_copies();
	else if (argc >= 2 && !strcmp(argv[1], "other"))
		t_other();
	else if (argc >= 2 && !strcmp(argv[1], "probe"))
		t_probe();
	else if (argc >= 2 && !strcmp(argv[1], "fork"))
		t_fork();
	else if (argc >= 3 && !strcmp(argv[1], "local"))
		t_local(argv[2]);
	else if (argc >= 3 && !strcmp(argv[1], "bench"))
		t_bench(atol(argv[2]));
	else {
		fprintf(stderr, "usage: ts-cudacalls copies|other|probe|fork|local LIB|bench N\n");
		return 2;
	}
	if (fails)
		fprintf(stderr, "%s: %d check(s) failed\n", argv[1], fails);
	return fails ? 1 : 0;
}
