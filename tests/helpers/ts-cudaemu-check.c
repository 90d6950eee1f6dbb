/* ts-cudaemu-check: checks tsemu, the test device (tools/cudaemu), the way a
 * CUDA program would meet it: it links nothing CUDA, dlopen()s
 * libcudart.so.13 and libcuda.so.1 (run it with LD_LIBRARY_PATH=build/emu)
 * and spawns copies of itself for the cross-process checks.
 *
 *   ts-cudaemu-check COMMAND [ARGS]   exit 0: every check passed, 1: some
 *                                     failed (each on stderr), 2: usage
 *
 * Commands: basics, errors, no-host-access, nodevice, getproc, route, deny, pinned,
 * fork, fork-clean, peer, ipc-mem, ipc-event, ipc-dead, ipc-exit, ipc-reset, ipc-ctx-destroy, ctx-stack, stream-async, stream-order, capture,
 * bandwidth h2d|d2d MIN_MS MAX_MS [ROUNDS], stats, quick (basics errors pinned peer
 * ipc-mem capture in one process, for valgrind). The *-child commands are the other
 * side of the IPC checks. tests/scenarios/cudaemu.sh runs them all.
 *
 * Real mode: where a library lacks tsemu_stats (the real runtime and driver;
 * or with TS_CUDAEMU_CHECK_REAL=1, forced on tsemu to test this mode), what
 * only tsemu can satisfy is skipped and counted: its counters, its knobs
 * (TSEMU_STREAM_DELAY_US, TSEMU_*_GBPS, TSEMU_GETPROC_DENY, TSEMU_DEVICES)
 * and whatever needs a copy still in flight, which only those knobs make
 * sure of. Return codes, error names, pointer attributes, IPC and capture
 * rules, fork, cuGetProcAddress and the data copied are checked as on
 * tsemu: each FAIL there is a place where tsemu differs from the real
 * driver (scripts/gpu-check.sh, case 0). Commands left with no check
 * (route, deny, stats, bandwidth, nodevice; peer with one device) exit 77;
 * the others end with a line on stderr: checks run, checks skipped. A
 * crash (a bad handle a real driver need not catch) names the last check
 * passed before it. */
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../../tools/cudaemu/tsemu.h"

/* ---- the libraries --------------------------------------------------------------------- */

#define RT_FUNCS(X)                                                                                      \
	X(GetDeviceCount, cudaGetDeviceCount) X(SetDevice, cudaSetDevice) X(GetDevice, cudaGetDevice)    \
	X(Malloc, cudaMalloc) X(Free, cudaFree) X(Memcpy, cudaMemcpy) X(MemcpyAsync, cudaMemcpyAsync)    \
	X(MemcpyPeer, cudaMemcpyPeer) X(MemcpyPeerAsync, cudaMemcpyPeerAsync) X(Memset, cudaMemset)      \
	X(HostAlloc, cudaHostAlloc) X(MallocHost, cudaMallocHost) X(FreeHost, cudaFreeHost)              \
	X(HostRegister, cudaHostRegister) X(HostUnregister, cudaHostUnregister)                          \
	X(PointerGetAttributes, cudaPointerGetAttributes) X(MemGetInfo, cudaMemGetInfo)                  \
	X(StreamCreate, cudaStreamCreate) X(StreamCreateWithFlags, cudaStreamCreateWithFlags)            \
	X(StreamDestroy, cudaStreamDestroy) X(StreamSynchronize, cudaStreamSynchronize)                  \
	X(StreamQuery, cudaStreamQuery) X(StreamWaitEvent, cudaStreamWaitEvent)                          \
	X(EventCreate, cudaEventCreate) X(EventCreateWithFlags, cudaEventCreateWithFlags)                \
	X(EventRecord, cudaEventRecord) X(EventSynchronize, cudaEventSynchronize)                        \
	X(EventQuery, cudaEventQuery) X(EventDestroy, cudaEventDestroy)                                  \
	X(EventElapsedTime, cudaEventElapsedTime) X(IpcGetMemHandle, cudaIpcGetMemHandle)                \
	X(IpcOpenMemHandle, cudaIpcOpenMemHandle) X(IpcCloseMemHandle, cudaIpcCloseMemHandle)            \
	X(IpcGetEventHandle, cudaIpcGetEventHandle) X(IpcOpenEventHandle, cudaIpcOpenEventHandle)        \
	X(DeviceSynchronize, cudaDeviceSynchronize) X(DeviceCanAccessPeer, cudaDeviceCanAccessPeer)      \
	X(DeviceReset, cudaDeviceReset)                                                                  \
	X(DeviceEnablePeerAccess, cudaDeviceEnablePeerAccess) X(GetLastError, cudaGetLastError)          \
	X(DeviceDisablePeerAccess, cudaDeviceDisablePeerAccess)                                          \
	X(PeekAtLastError, cudaPeekAtLastError) X(GetErrorString, cudaGetErrorString)                    \
	X(GetErrorName, cudaGetErrorName) X(RuntimeGetVersion, cudaRuntimeGetVersion)                    \
	X(DriverGetVersion, cudaDriverGetVersion) X(GetDriverEntryPoint, cudaGetDriverEntryPoint)        \
	X(GetDriverEntryPointByVersion, cudaGetDriverEntryPointByVersion)                                \
	X(Memcpy_ptds, cudaMemcpy) X(MemcpyAsync_ptsz, cudaMemcpyAsync)                                  \
	X(StreamSynchronize_ptsz, cudaStreamSynchronize) X(StreamQuery_ptsz, cudaStreamQuery)             \
	X(StreamBeginCapture, cudaStreamBeginCapture) X(StreamEndCapture, cudaStreamEndCapture)          \
	X(StreamIsCapturing, cudaStreamIsCapturing) X(StreamGetCaptureInfo, cudaStreamGetCaptureInfo)    \
	X(ThreadExchangeStreamCaptureMode, cudaThreadExchangeStreamCaptureMode)                          \
	X(GraphInstantiate, cudaGraphInstantiate) X(GraphLaunch, cudaGraphLaunch)                        \
	X(GraphExecDestroy, cudaGraphExecDestroy) X(GraphDestroy, cudaGraphDestroy)                      \
	X(LaunchHostFunc, cudaLaunchHostFunc)

/* cudaGetDriverEntryPoint is deprecated (CUDA 12.5): its type only is used. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
static struct {
	void *lib, *drv;
#define X(f, proto) __typeof__(proto) *f;
	RT_FUNCS(X)
#undef X
	int (*stats)(struct tsemu_stats *);     /* libcudart's tsemu_stats */
	int (*drv_stats)(struct tsemu_stats *); /* libcuda's */
	__typeof__(cuGetProcAddress_v2) *GetProcAddress;
} rt;
#pragma GCC diagnostic pop

static const char *self; /* this program, to spawn the other side of a check */
static int fails;
static int real;                       /* real mode (see the top) */
static int checks, skipped;            /* counted for real mode's summary */
static volatile sig_atomic_t last_line; /* of the last check, for a crash */

static void die(const char *what)
{
	fprintf(stderr, "ts-cudaemu-check: %s\n", what);
	exit(2);
}

static void load(void)
{
	if (rt.lib)
		return;
	if (!(rt.lib = dlopen("libcudart.so.13", RTLD_NOW | RTLD_GLOBAL)))
		die(dlerror());
#define X(f, proto)                                              \
	if (!(*(void **)&rt.f = dlsym(rt.lib, "cuda" #f)))        \
		die("libcudart.so.13 lacks cuda" #f);
	RT_FUNCS(X)
#undef X
	if (!(rt.drv = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL)))
		die(dlerror());
	if (!(*(void **)&rt.GetProcAddress = dlsym(rt.drv, "cuGetProcAddress_v2")))
		die("libcuda.so.1 lacks cuGetProcAddress_v2");
	/* Opening calls nothing: CUDA is not initialised here, and tsemu reads
	 * its knobs only at cuInit or cuGetProcAddress. */
	*(void **)&rt.stats = dlsym(rt.lib, "tsemu_stats");
	*(void **)&rt.drv_stats = dlsym(rt.drv, "tsemu_stats");
	const char *force = getenv("TS_CUDAEMU_CHECK_REAL");
	real = !rt.stats || !rt.drv_stats || (force && !strcmp(force, "1"));
}

/* A driver entry point, through cuGetProcAddress (legacy stream). */
static void *drv(const char *name)
{
	void *fn = NULL;
	if (!rt.drv) {
		if (!(rt.drv = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL)) ||
		    !(*(void **)&rt.GetProcAddress = dlsym(rt.drv, "cuGetProcAddress_v2")))
			die("cannot load libcuda.so.1");
	}
	if (rt.GetProcAddress(name, &fn, 13000, CU_GET_PROC_ADDRESS_LEGACY_STREAM, NULL) != CUDA_SUCCESS || !fn) {
		fprintf(stderr, "ts-cudaemu-check: cuGetProcAddress(%s) failed\n", name);
		exit(2);
	}
	return fn;
}

/* ---- checking ------------------------------------------------------------------------------- */

static const char *ename(int e)
{
	return rt.GetErrorName ? rt.GetErrorName((cudaError_t)e) : "?";
}

static void counted(int line)
{
	checks++;
	last_line = line;
}

/* n checks not run, and why; 0. */
static int skip(int n, const char *why)
{
	skipped += n;
	fprintf(stderr, "# skipped %d: %s\n", n, why);
	return 0;
}

/* Whether to run the n checks that follow: real mode skips them, as only
 * the test device can satisfy them. */
static int emu_only(int n, const char *what)
{
	return real ? skip(n, what) : 1;
}

static int expect_(long got, long want, const char *what, int line)
{
	counted(line);
	if (got == want)
		return 1;
	fails++;
	fprintf(stderr, "FAIL (line %d) %s: got %ld (%s), expected %ld (%s)\n", line, what, got, ename((int)got), want,
		ename((int)want));
	return 0;
}
#define EXPECT(call, want) expect_((long)(call), (long)(want), #call, __LINE__)
#define OK(call) EXPECT(call, cudaSuccess)

#define CHECK(cond, ...)                                                      \
	do {                                                                  \
		int check_ok_ = !!(cond);                                     \
		counted(__LINE__);                                            \
		if (!check_ok_) {                                             \
			fails++;                                              \
			fprintf(stderr, "FAIL (line %d) %s: ", __LINE__, #cond); \
			fprintf(stderr, __VA_ARGS__);                         \
			fputc('\n', stderr);                                  \
		}                                                             \
	} while (0)

static void fill(void *p, size_t n, int seed)
{
	unsigned char *b = p;
	for (size_t i = 0; i < n; i++)
		b[i] = (unsigned char)(i * 131u + (unsigned)seed * 7u + (i >> 9));
}

/* The seed that filled p, or -1 if none of 0..255 did. */
static int seed_of(const void *p, size_t n)
{
	const unsigned char *b = p;
	for (int s = 0; s < 256; s++) {
		if (b[0] != (unsigned char)((unsigned)s * 7u))
			continue;
		size_t i;
		for (i = 0; i < n; i++)
			if (b[i] != (unsigned char)(i * 131u + (unsigned)s * 7u + (i >> 9)))
				break;
		if (i == n)
			return s;
	}
	return -1;
}

static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void *xmalloc(size_t n)
{
	void *p = malloc(n);
	if (!p)
		die("out of memory");
	return p;
}

static void hex(const void *p, size_t n, char *out)
{
	const unsigned char *b = p;
	for (size_t i = 0; i < n; i++)
		sprintf(out + 2 * i, "%02x", b[i]);
}

static int unhex(const char *s, void *p, size_t n)
{
	unsigned char *b = p;
	if (strlen(s) != 2 * n)
		return -1;
	for (size_t i = 0; i < n; i++) {
		unsigned v;
		if (sscanf(s + 2 * i, "%2x", &v) != 1)
			return -1;
		b[i] = (unsigned char)v;
	}
	return 0;
}

static pid_t spawn(char **argv)
{
	pid_t p = fork();
	if (p == 0) {
		execv(self, argv);
		_exit(127);
	}
	if (p < 0)
		die("fork failed");
	return p;
}

/* Exit status of a child, or 128+signal. */
static int reap(pid_t p)
{
	int st;
	while (waitpid(p, &st, 0) < 0)
		if (errno != EINTR)
			return -1;
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static void put_byte(int fd, char c)
{
	if (write(fd, &c, 1) != 1)
		die("pipe write failed");
}

static char get_byte(int fd)
{
	char c = 0;
	if (read(fd, &c, 1) != 1)
		return 0;
	return c;
}

/* tsemu's counters; zeros in real mode, where no check reads them. */
static struct tsemu_stats stats(void)
{
	struct tsemu_stats s;
	memset(&s, 0, sizeof s);
	if (!real && rt.stats(&s) != 0)
		die("tsemu_stats failed");
	return s;
}

/* ---- basics --------------------------------------------------------------------------------- */

static void *devthread(void *arg)
{
	int *dev = arg;
	*dev = -1;
	rt.GetDevice(dev);
	return NULL;
}

static void t_basics(void)
{
	load();
	int v = 0, n = 0;
	/* tsemu is 13.0 with TSEMU_DEVICES devices (2); a real machine any
	 * CUDA 13 runtime, a driver at least as new, and its own GPUs */
	OK(rt.RuntimeGetVersion(&v));
	int rtv = v;
	if (real)
		CHECK(v >= 13000 && v < 14000, "runtime version %d", v);
	else
		EXPECT(v, 13000);
	OK(rt.DriverGetVersion(&v));
	if (real)
		CHECK(v >= rtv, "driver version %d, runtime %d", v, rtv);
	else
		EXPECT(v, 13000);
	OK(rt.GetDeviceCount(&n));
	const char *want = getenv("TSEMU_DEVICES");
	if (real)
		CHECK(n >= 1, "devices: %d", n);
	else
		EXPECT(n, want ? strtol(want, NULL, 10) : 2);

	size_t sz = (1 << 20) + 77;
	unsigned char *h = xmalloc(sz), *g = xmalloc(sz);
	void *d = NULL, *d2 = NULL, *z = (void *)1;
	OK(rt.Malloc(&d, sz));
	OK(rt.Malloc(&d2, sz));
	fill(h, sz, 1);
	OK(rt.Memcpy(d, h, sz, cudaMemcpyHostToDevice));
	OK(rt.Memcpy(d2, d, sz, cudaMemcpyDeviceToDevice));
	memset(g, 0, sz);
	OK(rt.Memcpy(g, d2, sz, cudaMemcpyDeviceToHost));
	CHECK(seed_of(g, sz) == 1, "H2D, D2D, D2H round trip: seed %d", seed_of(g, sz));
	fill(h, sz, 2);
	OK(rt.Memcpy(d, h, sz, cudaMemcpyDefault));
	OK(rt.Memcpy(g, d, sz, cudaMemcpyDefault));
	CHECK(seed_of(g, sz) == 2, "cudaMemcpyDefault round trip");
	OK(rt.Memset((char *)d + 10, 0xab, 100));
	OK(rt.Memcpy(g, d, 200, cudaMemcpyDeviceToHost));
	CHECK(g[9] == h[9] && g[10] == 0xab && g[109] == 0xab && g[110] == h[110], "cudaMemset");
	OK(rt.Malloc(&z, 0));
	CHECK(z == NULL, "cudaMalloc(0) gives NULL");
	OK(rt.Free(NULL));

	void *a[5];
	size_t sizes[5] = {1, 255, 4097, 100000, 3};
	for (int i = 0; i < 5; i++) {
		OK(rt.Malloc(&a[i], sizes[i]));
		CHECK((uintptr_t)a[i] % 256 == 0, "allocation base %p is 256-byte aligned", a[i]);
	}
	size_t fr0, fr1, tot;
	OK(rt.MemGetInfo(&fr0, &tot));
	void *big;
	OK(rt.Malloc(&big, 1 << 24));
	OK(rt.MemGetInfo(&fr1, &tot));
	CHECK(fr0 - fr1 == 1 << 24, "cudaMemGetInfo: free memory drops by the allocation");
	OK(rt.Free(big));
	for (int i = 0; i < 5; i++)
		OK(rt.Free(a[i]));

	/* per-thread default stream entry points */
	fill(h, sz, 3);
	OK(rt.Memcpy_ptds(d, h, sz, cudaMemcpyHostToDevice));
	OK(rt.MemcpyAsync_ptsz(d2, d, sz, cudaMemcpyDeviceToDevice, 0));
	OK(rt.StreamSynchronize_ptsz(0));
	OK(rt.MemcpyAsync_ptsz(g, d2, sz, cudaMemcpyDeviceToHost, cudaStreamPerThread));
	OK(rt.StreamSynchronize(cudaStreamPerThread));
	CHECK(seed_of(g, sz) == 3, "_ptds/_ptsz copies");

	/* the current device is per thread */
	int dev = -1;
	OK(rt.GetDevice(&dev));
	EXPECT(dev, 0);
	if (n > 1) {
		OK(rt.SetDevice(1));
		OK(rt.GetDevice(&dev));
		EXPECT(dev, 1);
		pthread_t th;
		pthread_create(&th, NULL, devthread, &dev);
		pthread_join(th, NULL);
		EXPECT(dev, 0);
		OK(rt.SetDevice(0));
	}
	OK(rt.Free(d));
	OK(rt.Free(d2));
	free(h);
	free(g);
}

/* A device pointer is not host memory: dereferencing it faults. */
static void t_no_host_access(void)
{
	load();
	void *d;
	OK(rt.Malloc(&d, 4096));
	pid_t p = fork();
	if (p == 0) {
		signal(SIGSEGV, SIG_DFL);
		volatile char c = *(volatile char *)d;
		(void)c;
		_exit(0);
	}
	int st = reap(p);
#ifdef __SANITIZE_ADDRESS__
	CHECK(st != 0, "reading a device pointer on the host: child ended with %d, no fault", st); /* ASan's report */
#else
	CHECK(st == 128 + SIGSEGV, "reading a device pointer on the host: child ended with %d, not SIGSEGV", st);
#endif
	OK(rt.Free(d));
}

/* TSEMU_DEVICES=0: a machine without a GPU. */
static void t_nodevice(void)
{
	load();
	int n = -1;
	void *d;
	EXPECT(rt.GetDeviceCount(&n), cudaErrorNoDevice);
	EXPECT(n, 0);
	EXPECT(rt.Malloc(&d, 16), cudaErrorNoDevice);
	EXPECT(rt.GetLastError(), cudaErrorNoDevice);
}

/* ---- errors ---------------------------------------------------------------------------------- */

static void t_errors(void)
{
	load();
	OK(rt.GetLastError());
	char *host = xmalloc(4096);
	void *d, *d2;
	OK(rt.Malloc(&d, 4096));
	EXPECT(rt.Free(host), cudaErrorInvalidValue);
	EXPECT(rt.PeekAtLastError(), cudaErrorInvalidValue);
	EXPECT(rt.PeekAtLastError(), cudaErrorInvalidValue);
	EXPECT(rt.GetLastError(), cudaErrorInvalidValue);
	EXPECT(rt.GetLastError(), cudaSuccess);
	OK(rt.Malloc(&d2, 10));
	EXPECT(rt.PeekAtLastError(), cudaSuccess);
	EXPECT(rt.Free((char *)d + 256), cudaErrorInvalidValue);
	EXPECT(rt.Free((void *)(uintptr_t)0x10), cudaErrorInvalidValue);
	EXPECT(rt.Memcpy((char *)d + 4000, host, 97, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
	OK(rt.Memcpy((char *)d + 4000, host, 96, cudaMemcpyHostToDevice));
	EXPECT(rt.Memcpy(host, d, 4097, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
	EXPECT(rt.Memcpy(host, host + 2048, 16, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
	EXPECT(rt.Memcpy(d, d2, 8, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
	EXPECT(rt.Memcpy(d, NULL, 8, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
	EXPECT(rt.Memcpy(NULL, d, 8, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
	EXPECT(rt.Memcpy(d, host, 8, (enum cudaMemcpyKind)7), cudaErrorInvalidMemcpyDirection);
	OK(rt.Memcpy(d, NULL, 0, cudaMemcpyHostToDevice));
	EXPECT(rt.Malloc(NULL, 8), cudaErrorInvalidValue);
	OK(rt.Free(d2));
	EXPECT(rt.Free(d2), cudaErrorInvalidValue);
	EXPECT(rt.SetDevice(99), cudaErrorInvalidDevice);
	EXPECT(rt.SetDevice(-1), cudaErrorInvalidDevice);
	EXPECT(rt.GetLastError(), cudaErrorInvalidDevice);

	cudaStream_t s;
	OK(rt.StreamCreate(&s));
	EXPECT(rt.StreamSynchronize((cudaStream_t)host), cudaErrorInvalidResourceHandle);
	EXPECT(rt.MemcpyAsync(d, host, 8, cudaMemcpyHostToDevice, (cudaStream_t)host), cudaErrorInvalidResourceHandle);
	OK(rt.StreamDestroy(s));
	EXPECT(rt.StreamSynchronize(s), cudaErrorInvalidResourceHandle);
	EXPECT(rt.StreamDestroy(0), cudaErrorInvalidResourceHandle);
	EXPECT(rt.StreamCreateWithFlags(&s, 0x10), cudaErrorInvalidValue);

	cudaEvent_t e;
	OK(rt.EventCreate(&e));
	OK(rt.EventQuery(e)); /* never recorded: complete */
	OK(rt.EventSynchronize(e));
	OK(rt.EventDestroy(e));
	EXPECT(rt.EventQuery(e), cudaErrorInvalidResourceHandle);
	EXPECT(rt.EventCreateWithFlags(&e, cudaEventInterprocess), cudaErrorInvalidValue);
	EXPECT(rt.EventRecord((cudaEvent_t)host, 0), cudaErrorInvalidResourceHandle);

	EXPECT(rt.HostUnregister(host), cudaErrorHostMemoryNotRegistered);
	EXPECT(rt.HostRegister(NULL, 10, 0), cudaErrorInvalidValue);
	EXPECT(rt.HostRegister(d, 10, 0), cudaErrorInvalidValue);
	EXPECT(rt.FreeHost(host), cudaErrorInvalidValue);
	EXPECT(rt.GetLastError(), cudaErrorInvalidValue);

	CHECK(!strcmp(rt.GetErrorString(cudaErrorInvalidValue), "invalid argument"), "cudaGetErrorString(1)");
	CHECK(!strcmp(rt.GetErrorName(cudaErrorInvalidValue), "cudaErrorInvalidValue"), "cudaGetErrorName(1)");
	CHECK(!strcmp(rt.GetErrorString(cudaErrorDeviceUninitialized), "invalid device context"), "201");
	CHECK(!strcmp(rt.GetErrorString((cudaError_t)12345), "unrecognized error code"), "unknown code");
	CHECK(!strcmp(rt.GetErrorName(cudaSuccess), "cudaSuccess"), "cudaGetErrorName(0)");

	__typeof__(cuGetErrorString) *ges = drv("cuGetErrorString");
	__typeof__(cuGetErrorName) *gen = drv("cuGetErrorName");
	const char *str = "x";
	EXPECT(ges(CUDA_ERROR_INVALID_CONTEXT, &str), CUDA_SUCCESS);
	CHECK(str && !strcmp(str, "invalid device context"), "cuGetErrorString(201)");
	EXPECT(gen(CUDA_ERROR_NOT_READY, &str), CUDA_SUCCESS);
	CHECK(str && !strcmp(str, "CUDA_ERROR_NOT_READY"), "cuGetErrorName(600)");
	EXPECT(ges((CUresult)12345, &str), CUDA_ERROR_INVALID_VALUE);
	CHECK(str == NULL, "cuGetErrorString(unknown) sets NULL");
	OK(rt.Free(d));
	free(host);
}

/* ---- cuGetProcAddress and the runtime's route to the driver ------------------------------------ */

static void *noctx_alloc(void *arg)
{
	__typeof__(cuMemAlloc_v2) *ma = arg;
	CUdeviceptr p;
	return (void *)(intptr_t)ma(&p, 16);
}

static void t_getproc(void)
{
	void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!lib)
		die(dlerror());
	__typeof__(cuGetProcAddress_v2) *gpa = dlsym(lib, "cuGetProcAddress_v2");
	CUresult (*gpa1)(const char *, void **, int, cuuint64_t) = dlsym(lib, "cuGetProcAddress");
	__typeof__(cuMemAlloc_v2) *alloc_sym = dlsym(lib, "cuMemAlloc_v2");
	CHECK(gpa && gpa1 && alloc_sym, "libcuda.so.1 exports cuGetProcAddress_v2, cuGetProcAddress, cuMemAlloc_v2");
	if (!gpa || !gpa1 || !alloc_sym)
		return;
	CUdeviceptr dp;
	EXPECT(alloc_sym(&dp, 16), CUDA_ERROR_NOT_INITIALIZED); /* before cuInit */

	struct {
		const char *name;
		int version;
		cuuint64_t flags;
		const char *sym; /* what dlsym must give for the same function; NULL: none */
		int status;
	} cases[] = {
		{"cuMemAlloc", 13000, 0, "cuMemAlloc_v2", CU_GET_PROC_ADDRESS_SUCCESS},
		{"cuMemAlloc", 3020, CU_GET_PROC_ADDRESS_LEGACY_STREAM, "cuMemAlloc_v2", CU_GET_PROC_ADDRESS_SUCCESS},
		{"cuMemAlloc", 3000, 0, "cuMemAlloc", CU_GET_PROC_ADDRESS_SUCCESS},
		{"cuMemcpyHtoD", 13000, CU_GET_PROC_ADDRESS_LEGACY_STREAM, "cuMemcpyHtoD_v2", 0},
		{"cuMemcpyHtoD", 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, "cuMemcpyHtoD_v2_ptds", 0},
		{"cuMemcpyHtoDAsync", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, "cuMemcpyHtoDAsync_v2_ptsz", 0},
		{"cuMemcpyPeer", 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, "cuMemcpyPeer_ptds", 0},
		{"cuStreamSynchronize", 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, "cuStreamSynchronize_ptsz", 0},
		{"cuMemAlloc", 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, "cuMemAlloc_v2", 0},
		{"cuStreamDestroy", 13000, 0, "cuStreamDestroy_v2", 0},
		{"cuIpcOpenMemHandle", 13000, 0, "cuIpcOpenMemHandle_v2", 0},
		{"cuCtxGetDevice", 13000, 0, "cuCtxGetDevice_v2", 0},
		{"cuCtxGetDevice", 12080, 0, "cuCtxGetDevice", 0},
		{"cuGetProcAddress", 13000, 0, "cuGetProcAddress_v2", 0},
		{"cuGetProcAddress", 11030, 0, "cuGetProcAddress", 0},
		{"cuIpcGetMemHandle", 4000, 0, NULL, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT},
		{"cuNoSuchFunction", 13000, 0, NULL, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND},
		{"cuMemAlloc_v2", 13000, 0, NULL, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND}, /* base names only */
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		void *fn = (void *)1;
		CUdriverProcAddressQueryResult st = (CUdriverProcAddressQueryResult)99;
		CUresult r = gpa(cases[i].name, &fn, cases[i].version, cases[i].flags, &st);
		void *want = cases[i].sym ? dlsym(lib, cases[i].sym) : NULL;
		CHECK(r == CUDA_SUCCESS && fn == want && (int)st == cases[i].status,
		      "cuGetProcAddress(%s, %d, %llu): rc %d, %p status %d; expected %s (%p) status %d", cases[i].name,
		      cases[i].version, (unsigned long long)cases[i].flags, (int)r, fn, (int)st,
		      cases[i].sym ? cases[i].sym : "NULL", want, cases[i].status);
	}
	void *fn;
	__typeof__(cuDriverGetVersion) *dver = dlsym(lib, "cuDriverGetVersion");
	int dv = 0;
	CHECK(dver && dver(&dv) == CUDA_SUCCESS && dv >= 13000, "cuDriverGetVersion before cuInit: %d", dv);
	EXPECT(gpa("cuMemAlloc", &fn, dv + 10, 0, NULL), CUDA_ERROR_INVALID_VALUE); /* newer than the driver */
	EXPECT(gpa("cuMemAlloc", &fn, 13000, 4, NULL), CUDA_ERROR_INVALID_VALUE);
	EXPECT(gpa(NULL, &fn, 13000, 0, NULL), CUDA_ERROR_INVALID_VALUE);
	EXPECT(gpa1("cuMemFree", &fn, 13000, 0), CUDA_SUCCESS);
	CHECK(fn == dlsym(lib, "cuMemFree_v2"), "v1 cuGetProcAddress");

	/* the pointers work */
	__typeof__(cuInit) *init;
	__typeof__(cuDevicePrimaryCtxRetain) *retain;
	__typeof__(cuCtxSetCurrent) *setcur;
	__typeof__(cuMemAlloc_v2) *alloc;
	__typeof__(cuMemFree_v2) *mfree;
	__typeof__(cuMemcpyHtoD_v2) *htod;
	__typeof__(cuMemcpyDtoH_v2) *dtoh;
	__typeof__(cuPointerGetAttribute) *pga;
	__typeof__(cuIpcGetMemHandle) *ipcget;
	__typeof__(cuDeviceGetCount) *count;
	CUresult (*alloc1)(unsigned int *, unsigned int);
	gpa("cuInit", (void **)&init, 13000, 0, NULL);
	gpa("cuDevicePrimaryCtxRetain", (void **)&retain, 13000, 0, NULL);
	gpa("cuCtxSetCurrent", (void **)&setcur, 13000, 0, NULL);
	gpa("cuMemAlloc", (void **)&alloc, 13000, 0, NULL);
	gpa("cuMemFree", (void **)&mfree, 13000, 0, NULL);
	gpa("cuMemcpyHtoD", (void **)&htod, 13000, 0, NULL);
	gpa("cuMemcpyDtoH", (void **)&dtoh, 13000, 0, NULL);
	gpa("cuPointerGetAttribute", (void **)&pga, 13000, 0, NULL);
	gpa("cuIpcGetMemHandle", (void **)&ipcget, 13000, 0, NULL);
	gpa("cuDeviceGetCount", (void **)&count, 13000, 0, NULL);
	gpa("cuMemAlloc", (void **)&alloc1, 2000, 0, NULL);
	EXPECT(init(1), CUDA_ERROR_INVALID_VALUE);
	EXPECT(init(0), CUDA_SUCCESS);
	int n = 0;
	EXPECT(count(&n), CUDA_SUCCESS);
	CHECK(n >= 1, "devices: %d", n);
	pthread_t th;
	void *thr = NULL;
	pthread_create(&th, NULL, noctx_alloc, (void *)alloc);
	pthread_join(th, &thr);
	EXPECT((intptr_t)thr, CUDA_ERROR_INVALID_CONTEXT); /* no current context */
	CUcontext c;
	EXPECT(retain(&c, 0), CUDA_SUCCESS);
	EXPECT(setcur(c), CUDA_SUCCESS);
	CUdeviceptr d;
	EXPECT(alloc(&d, 10000), CUDA_SUCCESS);
	char h[10000], g[10000];
	fill(h, sizeof h, 5);
	EXPECT(htod(d, h, sizeof h), CUDA_SUCCESS);
	EXPECT(dtoh(g, d, sizeof g), CUDA_SUCCESS);
	CHECK(seed_of(g, sizeof g) == 5, "driver round trip through cuGetProcAddress pointers");
	CUdeviceptr start = 0;
	size_t size = 0;
	EXPECT(pga(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, d + 1234), CUDA_SUCCESS);
	EXPECT(pga(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, d + 1234), CUDA_SUCCESS);
	CHECK(start == d && size == 10000, "range of an interior pointer: %#llx %zu", (unsigned long long)start, size);
	unsigned int mt = 0;
	EXPECT(pga(&mt, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)(uintptr_t)h), CUDA_ERROR_INVALID_VALUE);
	CUipcMemHandle ih;
	EXPECT(ipcget(&ih, d + 256), CUDA_ERROR_INVALID_VALUE);
	EXPECT(ipcget(&ih, d), CUDA_SUCCESS);
	unsigned int d1;
	EXPECT(alloc1(&d1, 16), CUDA_ERROR_NOT_SUPPORTED); /* v1: 32-bit device pointers */
	EXPECT(mfree(d + 1), CUDA_ERROR_INVALID_VALUE);
	EXPECT(mfree(d), CUDA_SUCCESS);

	/* and the runtime hands out the same ones */
	load();
	void *p = NULL;
	enum cudaDriverEntryPointQueryResult st;
	OK(rt.GetDriverEntryPoint("cuMemAlloc", &p, cudaEnableDefault, &st));
	CHECK(p == (void *)alloc && st == cudaDriverEntryPointSuccess, "cudaGetDriverEntryPoint(cuMemAlloc)");
	OK(rt.GetDriverEntryPointByVersion("cuMemAlloc", &p, 3000, cudaEnableDefault, &st));
	CHECK(p == dlsym(lib, "cuMemAlloc"), "cudaGetDriverEntryPointByVersion(cuMemAlloc, 3000)");
	OK(rt.GetDriverEntryPoint("cuMemcpyHtoD", &p, cudaEnablePerThreadDefaultStream, &st));
	CHECK(p == dlsym(lib, "cuMemcpyHtoD_v2_ptds"), "cudaGetDriverEntryPoint per-thread");
	OK(rt.GetDriverEntryPoint("cuNope", &p, cudaEnableDefault, &st));
	CHECK(p == NULL && st == cudaDriverEntryPointSymbolNotFound, "unknown symbol");
	dlclose(lib);
}

/* The runtime reaches the driver: its calls show in the driver's counters
 * (TSEMU_TRACE=1 also lists its cuGetProcAddress lookups on stderr). */
static void t_route(void)
{
	load();
	void *d;
	char h[64] = {0};
	OK(rt.Malloc(&d, 64));
	struct tsemu_stats a = stats();
	OK(rt.Memcpy(d, h, 64, cudaMemcpyHostToDevice));
	OK(rt.Memcpy(h, d, 64, cudaMemcpyDeviceToHost));
	struct tsemu_stats b;
	rt.drv_stats(&b);
	CHECK(b.api_calls >= a.api_calls + 2 && b.h2d_calls == a.h2d_calls + 1 && b.d2h_calls == a.d2h_calls + 1,
	      "two runtime copies reach the driver (api calls %llu -> %llu)", (unsigned long long)a.api_calls,
	      (unsigned long long)b.api_calls);
	CHECK(a.getproc_lookups >= 40, "the runtime took its driver entry points from cuGetProcAddress (%llu lookups)",
	      (unsigned long long)a.getproc_lookups);
	OK(rt.Free(d));
}

/* Run with TSEMU_GETPROC_DENY=cuMemcpyHtoD: the driver exports the symbol,
 * but cuGetProcAddress does not give it, so the runtime cannot start. */
static void t_deny(void)
{
	load();
	void *d;
	CHECK(dlsym(rt.drv, "cuMemcpyHtoD_v2") != NULL, "libcuda.so.1 exports cuMemcpyHtoD_v2");
	EXPECT(rt.Malloc(&d, 64), cudaErrorInsufficientDriver);
}

/* ---- pinned memory and pointer attributes -------------------------------------------------------- */

static void attr_is(const void *p, enum cudaMemoryType type, int dev, const void *dp, const void *hp, int line)
{
	struct cudaPointerAttributes a;
	memset(&a, 0x55, sizeof a);
	cudaError_t e = rt.PointerGetAttributes(&a, p);
	counted(line);
	if (e != cudaSuccess || a.type != type || a.device != dev || a.devicePointer != dp || a.hostPointer != hp) {
		fails++;
		fprintf(stderr,
			"FAIL (line %d) attributes of %p: rc %d type %d device %d dptr %p hptr %p; expected type %d "
			"device %d dptr %p hptr %p\n",
			line, p, (int)e, (int)a.type, a.device, a.devicePointer, a.hostPointer, (int)type, dev, dp, hp);
	}
}
#define ATTR(p, t, d, dp, hp) attr_is(p, t, d, dp, hp, __LINE__)

static void t_pinned(void)
{
	load();
	int n = 0;
	OK(rt.GetDeviceCount(&n));
	int dv = n > 1 ? 1 : 0;
	OK(rt.SetDevice(dv));
	char *p, *q, *d;
	OK(rt.HostAlloc((void **)&p, 10000, cudaHostAllocDefault));
	ATTR(p, cudaMemoryTypeHost, dv, p, p);
	ATTR(p + 9999, cudaMemoryTypeHost, dv, p + 9999, p + 9999);
	OK(rt.MallocHost((void **)&q, 100));
	ATTR(q, cudaMemoryTypeHost, dv, q, q);
	OK(rt.Malloc((void **)&d, 1000));
	ATTR(d, cudaMemoryTypeDevice, dv, d, NULL);
	ATTR(d + 999, cudaMemoryTypeDevice, dv, d + 999, NULL);
	OK(rt.SetDevice(0));
	ATTR(d, cudaMemoryTypeDevice, dv, d, NULL); /* the allocation's device, not the current one */

	char *m = xmalloc(3 * 4096);
	int local = 0;
	ATTR(m, cudaMemoryTypeUnregistered, -2, NULL, NULL);
	ATTR(&local, cudaMemoryTypeUnregistered, -2, NULL, NULL);
	ATTR(NULL, cudaMemoryTypeUnregistered, -2, NULL, NULL);
	EXPECT(rt.GetLastError(), cudaSuccess); /* not an error since CUDA 11 */
	OK(rt.HostRegister(m, 8192, cudaHostRegisterDefault));
	ATTR(m, cudaMemoryTypeHost, 0, m, m);
	ATTR(m + 8191, cudaMemoryTypeHost, 0, m + 8191, m + 8191);
	ATTR(m + 8192, cudaMemoryTypeUnregistered, -2, NULL, NULL);
	EXPECT(rt.HostRegister(m, 100, 0), cudaErrorHostMemoryAlreadyRegistered);
	EXPECT(rt.HostRegister(m + 4096, 8192, 0), cudaErrorHostMemoryAlreadyRegistered);
	EXPECT(rt.HostRegister(m + 8192, 4096, 0x40), cudaErrorInvalidValue);
	EXPECT(rt.HostUnregister(m + 1), cudaErrorHostMemoryNotRegistered);
	OK(rt.HostUnregister(m));
	ATTR(m, cudaMemoryTypeUnregistered, -2, NULL, NULL);
	EXPECT(rt.HostUnregister(m), cudaErrorHostMemoryNotRegistered);
	OK(rt.FreeHost(p));
	ATTR(p + 1, cudaMemoryTypeUnregistered, -2, NULL, NULL);
	EXPECT(rt.FreeHost(m), cudaErrorInvalidValue);
	EXPECT(rt.PointerGetAttributes(NULL, d), cudaErrorInvalidValue);
	OK(rt.GetLastError() == cudaErrorInvalidValue ? cudaSuccess : cudaErrorUnknown);
	OK(rt.FreeHost(q));
	OK(rt.Free(d));
	free(m);
}

/* ---- fork ------------------------------------------------------------------------------------------ */

static void t_fork(void)
{
	load();
	void *d;
	char h[16] = {0};
	OK(rt.Malloc(&d, 16));
	fflush(stderr);
	pid_t p = fork();
	if (p == 0) {
		alarm(10);
		void *x;
		int n;
		struct cudaPointerAttributes a;
		EXPECT(rt.Malloc(&x, 16), cudaErrorInitializationError);
		EXPECT(rt.GetDeviceCount(&n), cudaErrorInitializationError);
		EXPECT(rt.Memcpy(h, d, 16, cudaMemcpyDeviceToHost), cudaErrorInitializationError);
		EXPECT(rt.PointerGetAttributes(&a, d), cudaErrorInitializationError);
		EXPECT(rt.SetDevice(0), cudaErrorInitializationError);
		EXPECT(rt.GetLastError(), cudaErrorInitializationError);
		__typeof__(cuInit) *init = dlsym(rt.drv, "cuInit");
		__typeof__(cuMemAlloc_v2) *alloc = dlsym(rt.drv, "cuMemAlloc_v2");
		CUdeviceptr dp;
		EXPECT(init(0), CUDA_ERROR_NOT_INITIALIZED);
		EXPECT(alloc(&dp, 16), CUDA_ERROR_NOT_INITIALIZED);
		exit(fails ? 1 : 0); /* exit(), not _exit(): the libraries' destructors run */
	}
	int st = reap(p);
	CHECK(st == 0, "child forked after initialisation: exit %d", st);
	OK(rt.Memcpy(h, d, 16, cudaMemcpyDeviceToHost));
	OK(rt.Free(d));
}

/* A child forked before the parent used CUDA may use it. */
static void t_fork_clean(void)
{
	load();
	fflush(stderr);
	pid_t p = fork();
	if (p == 0) {
		alarm(10);
		void *d;
		char h[100], g[100];
		fill(h, sizeof h, 9);
		OK(rt.Malloc(&d, 100));
		OK(rt.Memcpy(d, h, 100, cudaMemcpyHostToDevice));
		OK(rt.Memcpy(g, d, 100, cudaMemcpyDeviceToHost));
		CHECK(seed_of(g, 100) == 9, "round trip in the child");
		OK(rt.Free(d));
		exit(fails ? 1 : 0);
	}
	int st = reap(p);
	CHECK(st == 0, "child forked before initialisation: exit %d", st);
	void *d;
	OK(rt.Malloc(&d, 100));
	OK(rt.Free(d));
}

/* ---- devices and peers ------------------------------------------------------------------------------ */

/* Returns 0 when not run: real mode with one device. */
static int t_peer(void)
{
	load();
	int n = 0, can = -1, can10 = -1;
	OK(rt.GetDeviceCount(&n));
	if (n < 2 && real)
		return 0;
	if (n < 2) {
		fprintf(stderr, "peer: needs 2 devices (TSEMU_DEVICES=%d)\n", n);
		fails++;
		return 1;
	}
	OK(rt.SetDevice(0));
	OK(rt.DeviceCanAccessPeer(&can, 0, 1));
	OK(rt.DeviceCanAccessPeer(&can10, 1, 0));
	/* tsemu's devices are peers; real GPUs without P2P (PCIe without it,
	 * some virtual machines) are not, which is the hardware's business */
	if (real && !can && !can10) {
		skip(7, "peer: devices 0 and 1 are not peers on this machine: peer access not checked");
	} else {
		EXPECT(can, 1);
		EXPECT(can10, 1);
		OK(rt.DeviceEnablePeerAccess(1, 0));
		EXPECT(rt.DeviceEnablePeerAccess(1, 0), cudaErrorPeerAccessAlreadyEnabled);
		EXPECT(rt.GetLastError(), cudaErrorPeerAccessAlreadyEnabled);
		EXPECT(rt.DeviceEnablePeerAccess(0, 0), cudaErrorInvalidDevice);
		EXPECT(rt.GetLastError(), cudaErrorInvalidDevice);
	}
	OK(rt.DeviceCanAccessPeer(&can, 0, 0));
	EXPECT(can, 0);
	EXPECT(rt.DeviceCanAccessPeer(&can, 0, n), cudaErrorInvalidDevice);

	size_t sz = 300000;
	char *h = xmalloc(sz), *g = xmalloc(sz);
	void *d0, *d1, *d1b;
	OK(rt.Malloc(&d0, sz));
	OK(rt.SetDevice(1));
	OK(rt.Malloc(&d1, sz));
	OK(rt.Malloc(&d1b, sz));
	ATTR(d0, cudaMemoryTypeDevice, 0, d0, NULL);
	ATTR(d1, cudaMemoryTypeDevice, 1, d1, NULL);
	fill(h, sz, 40);
	OK(rt.Memcpy(d0, h, sz, cudaMemcpyHostToDevice));
	struct tsemu_stats a = stats();
	OK(rt.MemcpyPeer(d1, 1, d0, 0, sz));
	OK(rt.Memcpy(g, d1, sz, cudaMemcpyDeviceToHost));
	CHECK(seed_of(g, sz) == 40, "cudaMemcpyPeer");
	cudaStream_t s;
	OK(rt.StreamCreate(&s));
	OK(rt.MemcpyPeerAsync(d1b, 1, d0, 0, sz, s));
	OK(rt.StreamSynchronize(s));
	OK(rt.Memcpy(g, d1b, sz, cudaMemcpyDeviceToHost));
	CHECK(seed_of(g, sz) == 40, "cudaMemcpyPeerAsync");
	fill(h, sz, 41);
	OK(rt.Memcpy(d1, h, sz, cudaMemcpyHostToDevice));
	OK(rt.Memcpy(d0, d1, sz, cudaMemcpyDefault)); /* unified copy across devices */
	OK(rt.Memcpy(d1b, d1, sz, cudaMemcpyDeviceToDevice));
	OK(rt.DeviceSynchronize());
	OK(rt.SetDevice(0));
	OK(rt.DeviceSynchronize());
	OK(rt.Memcpy(g, d0, sz, cudaMemcpyDeviceToHost));
	CHECK(seed_of(g, sz) == 41, "cudaMemcpyDefault from device 1 to device 0");
	struct tsemu_stats b = stats();
	if (emu_only(3, "peer: tsemu_stats counts the peer copies")) {
		EXPECT(b.peer_bytes - a.peer_bytes, 3 * sz);
		EXPECT(b.peer_calls - a.peer_calls, 3);
		EXPECT(b.d2d_bytes - a.d2d_bytes, sz);
	}
	EXPECT(rt.MemcpyPeer(d1, n, d0, 0, sz), cudaErrorInvalidDevice); /* the first ordinal past the last */
	if (!real || can10) {
		/* another process opens d0 on device 1, with the lazy flag */
		cudaIpcMemHandle_t hd;
		char hx[2 * sizeof hd + 1], szs[32];
		fill(h, sz, 40);
		OK(rt.SetDevice(0));
		OK(rt.Memcpy(d0, h, sz, cudaMemcpyHostToDevice));
		OK(rt.IpcGetMemHandle(&hd, d0));
		hex(&hd, sizeof hd, hx);
		snprintf(szs, sizeof szs, "%zu", sz);
		char *child[] = {"ts-cudaemu-check", "ipc-mem-child", hx, szs, "lazy-peer", NULL};
		int st = reap(spawn(child));
		CHECK(st == 0, "importer on device 1 of device 0's memory (lazy peer access): exit %d", st);
	}
	OK(rt.StreamDestroy(s));
	OK(rt.Free(d0));
	OK(rt.Free(d1));
	OK(rt.Free(d1b));
	free(h);
	free(g);
	return 1;
}

/* ---- IPC memory ------------------------------------------------------------------------------------- */

#define IPC_SIZE ((size_t)(1 << 20) + 100)

static void t_ipc_mem(void)
{
	load();
	size_t sz = IPC_SIZE, half = sz / 2;
	char *h = xmalloc(sz), *g = xmalloc(sz), *pin;
	void *d, *o;
	OK(rt.Malloc(&d, sz));
	fill(h, sz, 1);
	OK(rt.Memcpy(d, h, sz, cudaMemcpyHostToDevice));
	cudaIpcMemHandle_t hd, hd2, x;
	OK(rt.IpcGetMemHandle(&hd, d));
	OK(rt.IpcGetMemHandle(&hd2, d));
	CHECK(!memcmp(&hd, &hd2, sizeof hd), "the same allocation gives the same handle");
	EXPECT(rt.IpcGetMemHandle(&x, (char *)d + 256), cudaErrorInvalidValue);
	EXPECT(rt.IpcGetMemHandle(&x, (char *)d + 1), cudaErrorInvalidValue);
	EXPECT(rt.IpcGetMemHandle(&x, h), cudaErrorInvalidValue);
	OK(rt.HostAlloc((void **)&pin, 4096, 0));
	EXPECT(rt.IpcGetMemHandle(&x, pin), cudaErrorInvalidValue);
	EXPECT(rt.IpcGetMemHandle(NULL, d), cudaErrorInvalidValue);
	/* the exporter cannot open its own handle: "invalid device context" */
	EXPECT(rt.IpcOpenMemHandle(&o, hd, cudaIpcMemLazyEnablePeerAccess), cudaErrorDeviceUninitialized);
	memset(&x, 0, sizeof x);
	EXPECT(rt.IpcOpenMemHandle(&o, x, cudaIpcMemLazyEnablePeerAccess), cudaErrorInvalidValue);
	EXPECT(rt.IpcCloseMemHandle(d), cudaErrorInvalidValue);
	rt.GetLastError();

	char hx[2 * sizeof hd + 1], szs[32], rfd[16], wfd[16];
	hex(&hd, sizeof hd, hx);
	snprintf(szs, sizeof szs, "%zu", sz);
	/* another process opens it, reads what we wrote, writes its half */
	char *a1[] = {"ts-cudaemu-check", "ipc-mem-child", hx, szs, "rw", NULL};
	int st = reap(spawn(a1));
	CHECK(st == 0, "importer (read, reopen, write, close): exit %d", st);
	OK(rt.Memcpy(g, d, sz, cudaMemcpyDeviceToHost));
	CHECK(seed_of(g, half) == 2 && !memcmp(g + half, h + half, sz - half),
	      "the exporter sees the importer's write (first half seed %d)", seed_of(g, half));

	/*
	 * Freeing memory another live process has open is undefined on CUDA:
	 * tsemu counts it and overwrites the bytes (the importer sees that). One
	 * that closed its mapping, or died, does not count.
	 */
	int up[2], down[2];
	if (pipe(up) || pipe(down))
		die("pipe");
	snprintf(rfd, sizeof rfd, "%d", down[0]);
	snprintf(wfd, sizeof wfd, "%d", up[1]);
	void *d2;
	cudaIpcMemHandle_t hd2x;
	char hx2[2 * sizeof hd + 1];
	OK(rt.Malloc(&d2, sz));
	OK(rt.IpcGetMemHandle(&hd2x, d2));
	hex(&hd2x, sizeof hd2x, hx2);
	struct tsemu_stats s0 = stats();
	char *a4[] = {"ts-cudaemu-check", "ipc-mem-child", hx2, szs, "die", NULL};
	st = reap(spawn(a4));
	CHECK(st == 0, "importer that exits with the handle open: exit %d", st);
	char *a5[] = {"ts-cudaemu-check", "ipc-mem-child", hx2, szs, "closed", rfd, wfd, NULL};
	pid_t p = spawn(a5);
	CHECK(get_byte(up[0]) == 'r', "closed importer ready");
	OK(rt.Free(d2));
	put_byte(down[1], 'g');
	st = reap(p);
	CHECK(st == 0, "importer that closed its mapping: exit %d", st);
	if (emu_only(1, "ipc-mem: tsemu_stats does not count a free after the importers closed or died"))
		EXPECT(stats().ipc_freed_while_open - s0.ipc_freed_while_open, 0);

	char *a2[] = {"ts-cudaemu-check", "ipc-mem-child", hx, szs, "hold", rfd, wfd, NULL};
	p = spawn(a2);
	close(up[1]);
	close(down[0]);
	CHECK(get_byte(up[0]) == 'r', "holding importer ready");
	OK(rt.Free(d)); /* succeeds, as on CUDA */
	if (emu_only(1, "ipc-mem: tsemu_stats counts a free while an importer has it open"))
		EXPECT(stats().ipc_freed_while_open - s0.ipc_freed_while_open, 1);
	put_byte(down[1], 'g');
	st = reap(p);
	CHECK(st == 0, "importer reading after the exporter's cudaFree: exit %d", st);
	close(up[0]);
	close(down[1]);

	/* a handle of freed memory does not open (and does not crash) */
	char *a3[] = {"ts-cudaemu-check", "ipc-mem-child", hx, szs, "stale", NULL};
	st = reap(spawn(a3));
	CHECK(st == 0, "opening the handle of a freed allocation fails cleanly: exit %d", st);
	OK(rt.FreeHost(pin));
	free(h);
	free(g);
}

static void t_ipc_mem_child(int argc, char **argv)
{
	if (argc < 3)
		die("usage: ipc-mem-child HANDLE SIZE MODE [RFD WFD]");
	load();
	cudaIpcMemHandle_t hd;
	if (unhex(argv[0], &hd, sizeof hd))
		die("bad handle");
	size_t sz = strtoul(argv[1], NULL, 10), half = sz / 2;
	const char *mode = argv[2];
	char *g = xmalloc(sz), *h = xmalloc(sz);
	void *p = NULL, *p2 = NULL;
	int lazy = !strcmp(mode, "lazy-peer"); /* the handle is device 0's; we open it on device 1 */
	if (lazy)
		OK(rt.SetDevice(1));
	cudaError_t e = rt.IpcOpenMemHandle(&p, hd, cudaIpcMemLazyEnablePeerAccess);
	if (!strcmp(mode, "stale")) {
		CHECK(e != cudaSuccess, "opened the handle of a freed allocation");
		fprintf(stderr, "# stale handle: %s\n", rt.GetErrorName(e));
		exit(fails ? 1 : 0);
	}
	if (!OK(e)) {
		if (argc >= 5)
			put_byte((int)strtol(argv[4], NULL, 10), 'x'); /* the exporter waits for a byte: go on */
		exit(1);
	}
	ATTR(p, cudaMemoryTypeDevice, 0, p, NULL);
	if (lazy) {
		/*
		 * "As if the user called cuCtxEnablePeerAccess" (cuda.h): the
		 * program's own enable now answers AlreadyEnabled, a side effect the
		 * shim hides from it (gpu_share.sh case 3). What a real GPU answers
		 * is printed: cuda.h is all this rests on.
		 */
		void *d1;
		cudaError_t en = rt.DeviceEnablePeerAccess(0, 0);
		rt.GetLastError();
		fprintf(stderr, "# lazy peer: cudaDeviceEnablePeerAccess(0) after a lazy open on device 1: %s\n",
			rt.GetErrorName(en));
		if (emu_only(2, "ipc-mem-child: a lazy open enables peer access as the program sees it")) {
			EXPECT(en, cudaErrorPeerAccessAlreadyEnabled);
			EXPECT(rt.DeviceDisablePeerAccess(0), cudaSuccess);
		}
		OK(rt.Malloc(&d1, sz));
		OK(rt.Memcpy(d1, p, sz, cudaMemcpyDefault));
		OK(rt.Memcpy(g, d1, sz, cudaMemcpyDeviceToHost));
		CHECK(seed_of(g, sz) == 40, "copied from device 0's mapping to device 1 (seed %d)", seed_of(g, sz));
		OK(rt.Free(d1));
		OK(rt.IpcCloseMemHandle(p));
	} else if (!strcmp(mode, "rw")) {
		OK(rt.Memcpy(g, p, sz, cudaMemcpyDeviceToHost));
		CHECK(seed_of(g, sz) == 1, "the importer reads the exporter's data (seed %d)", seed_of(g, sz));
		OK(rt.IpcOpenMemHandle(&p2, hd, cudaIpcMemLazyEnablePeerAccess));
		CHECK(p2 == p, "opening an open handle again gives the same pointer");
		fill(h, half, 2);
		OK(rt.Memcpy(p, h, half, cudaMemcpyHostToDevice));
		OK(rt.DeviceSynchronize());
		OK(rt.IpcCloseMemHandle(p2));
		OK(rt.Memcpy(g, p, 16, cudaMemcpyDeviceToHost)); /* one open left: still mapped */
		OK(rt.IpcCloseMemHandle(p));
		EXPECT(rt.IpcCloseMemHandle(p), cudaErrorInvalidValue);
		EXPECT(rt.Memcpy(g, p, 16, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
	} else if (!strcmp(mode, "hold") && argc >= 5) {
		int rfd = atoi(argv[3]), wfd = atoi(argv[4]);
		put_byte(wfd, 'r');
		CHECK(get_byte(rfd) == 'g', "go");
		OK(rt.Memcpy(g, p, sz, cudaMemcpyDeviceToHost));
		/* undefined on CUDA (the mapping may keep the memory): tsemu's poison */
		if (emu_only(1, "ipc-mem-child: the bytes an importer reads after the exporter's cudaFree"))
			CHECK(seed_of(g, half) != 2 && (unsigned char)g[0] == 0xa5,
			      "the bytes are no longer the data after the exporter's cudaFree");
		OK(rt.IpcCloseMemHandle(p));
	} else if (!strcmp(mode, "closed") && argc >= 5) {
		OK(rt.IpcCloseMemHandle(p));
		put_byte(atoi(argv[4]), 'r');
		CHECK(get_byte(atoi(argv[3])) == 'g', "go");
	} else if (!strcmp(mode, "die")) {
		_exit(0); /* the mapping dies with us, never closed */
	} else {
		die("bad mode");
	}
	exit(fails ? 1 : 0);
}

/* ---- IPC events -------------------------------------------------------------------------------------- */

/* The exporter's stream work is slowed down (each operation waits 300 ms):
 * an importer that did not wait for the event would read old data. (Real
 * mode: no delay; the orders are checked, not that they were needed.) */
static void t_ipc_event(void)
{
	load();
	if (!real)
		setenv("TSEMU_STREAM_DELAY_US", "300000", 1); /* read at tsemu's first call */
	size_t sz = 1 << 20;
	void *d;
	char *hb, *hr;
	OK(rt.Malloc(&d, sz));
	OK(rt.HostAlloc((void **)&hb, sz, 0));
	OK(rt.HostAlloc((void **)&hr, sz, 0));
	fill(hb, sz, 10);
	OK(rt.Memcpy(d, hb, sz, cudaMemcpyHostToDevice));
	cudaEvent_t ev, plain;
	cudaIpcEventHandle_t he;
	EXPECT(rt.EventCreateWithFlags(&ev, cudaEventInterprocess), cudaErrorInvalidValue);
	OK(rt.EventCreateWithFlags(&ev, cudaEventInterprocess | cudaEventDisableTiming));
	OK(rt.EventCreate(&plain));
	EXPECT(rt.IpcGetEventHandle(&he, plain), cudaErrorInvalidValue);
	rt.GetLastError();
	cudaStream_t s;
	OK(rt.StreamCreateWithFlags(&s, cudaStreamNonBlocking));
	fill(hb, sz, 11);
	double t0 = now_ms();
	OK(rt.MemcpyAsync(d, hb, sz, cudaMemcpyHostToDevice, s));
	OK(rt.EventRecord(ev, s));
	double el = now_ms() - t0;
	if (emu_only(1, "ipc-event: an async copy and record return before the (delayed) copy"))
		CHECK(el < 150, "async copy from pinned memory and record return at once (%.0f ms)", el);
	cudaIpcMemHandle_t hm;
	OK(rt.IpcGetMemHandle(&hm, d));
	OK(rt.IpcGetEventHandle(&he, ev));
	cudaEvent_t own;
	EXPECT(rt.IpcOpenEventHandle(&own, he), cudaErrorDeviceUninitialized);

	char mx[2 * sizeof hm + 1], ex[2 * sizeof he + 1], szs[32], rfd[16], wfd[16];
	hex(&hm, sizeof hm, mx);
	hex(&he, sizeof he, ex);
	snprintf(szs, sizeof szs, "%zu", sz);
	int up[2], down[2];
	if (pipe(up) || pipe(down))
		die("pipe");
	snprintf(rfd, sizeof rfd, "%d", down[0]);
	snprintf(wfd, sizeof wfd, "%d", up[1]);
	char *a1[] = {"ts-cudaemu-check", "ipc-event-child", mx, ex, szs, rfd, wfd, NULL};
	pid_t p = spawn(a1);
	close(up[1]);
	close(down[0]);
	/* the importer wrote seed 12 and recorded the event after it (its
	 * stream is slow too): our stream waits for it before reading */
	CHECK(get_byte(up[0]) == 'r', "importer recorded");
	OK(rt.StreamWaitEvent(s, ev, 0));
	OK(rt.MemcpyAsync(hr, d, sz, cudaMemcpyDeviceToHost, s));
	OK(rt.StreamSynchronize(s));
	CHECK(seed_of(hr, sz) == 12, "the exporter's stream waited for the importer's record (seed %d)",
	      seed_of(hr, sz));
	OK(rt.EventSynchronize(ev));
	OK(rt.EventQuery(ev));
	put_byte(down[1], 'g');
	int st = reap(p);
	CHECK(st == 0, "importer: exit %d", st);

	/* an importer that records and dies: waiting for the event ends */
	char *a2[] = {"ts-cudaemu-check", "ipc-event-child", mx, ex, szs, rfd, wfd, "die", NULL};
	if (pipe(up))
		die("pipe");
	snprintf(wfd, sizeof wfd, "%d", up[1]);
	p = spawn(a2);
	close(up[1]);
	CHECK(get_byte(up[0]) == 'r', "dying importer recorded");
	kill(p, SIGKILL);
	reap(p);
	t0 = now_ms();
	OK(rt.EventSynchronize(ev));
	el = now_ms() - t0;
	CHECK(el < 2000, "waiting for an event recorded by a dead process ends (%.0f ms)", el);
	close(up[0]);
	close(down[1]);
	OK(rt.EventDestroy(ev));
	OK(rt.EventDestroy(plain));
	OK(rt.StreamDestroy(s));
	OK(rt.Free(d));
	OK(rt.FreeHost(hb));
	OK(rt.FreeHost(hr));
}

static void t_ipc_event_child(int argc, char **argv)
{
	if (argc < 5)
		die("usage: ipc-event-child MEMHANDLE EVHANDLE SIZE RFD WFD [die]");
	int dying = argc > 5 && !strcmp(argv[5], "die");
	load();
	if (!real)
		setenv("TSEMU_STREAM_DELAY_US", dying ? "20000000" : "600000", 1);
	cudaIpcMemHandle_t hm;
	cudaIpcEventHandle_t he;
	if (unhex(argv[0], &hm, sizeof hm) || unhex(argv[1], &he, sizeof he))
		die("bad handle");
	size_t sz = strtoul(argv[2], NULL, 10);
	int rfd = atoi(argv[3]), wfd = atoi(argv[4]);
	void *d;
	cudaEvent_t ev;
	char *hc;
	cudaStream_t cs;
	if (!OK(rt.IpcOpenMemHandle(&d, hm, cudaIpcMemLazyEnablePeerAccess)) || !OK(rt.IpcOpenEventHandle(&ev, he)))
		exit(1);
	OK(rt.HostAlloc((void **)&hc, sz, 0));
	OK(rt.StreamCreateWithFlags(&cs, cudaStreamNonBlocking));
	if (dying) {
		OK(rt.EventRecord(ev, cs)); /* completes in 20 s: we are killed first */
		put_byte(wfd, 'r');
		pause();
		exit(1);
	}
	/* the exporter's copy and record are still on their way */
	if (emu_only(2, "ipc-event-child: the exporter's record still pending, and not ready is no last error")) {
		EXPECT(rt.EventQuery(ev), cudaErrorNotReady);
		EXPECT(rt.GetLastError(), cudaSuccess); /* "not ready" is not an error to remember */
	}
	OK(rt.StreamWaitEvent(cs, ev, 0));
	OK(rt.MemcpyAsync(hc, d, sz, cudaMemcpyDeviceToHost, cs));
	OK(rt.StreamSynchronize(cs));
	CHECK(seed_of(hc, sz) == 11, "the importer's stream waited for the exporter's record (seed %d)",
	      seed_of(hc, sz));
	OK(rt.EventQuery(ev));
	fill(hc, sz, 12);
	OK(rt.MemcpyAsync(d, hc, sz, cudaMemcpyHostToDevice, cs));
	OK(rt.EventRecord(ev, cs));
	put_byte(wfd, 'r');
	OK(rt.StreamSynchronize(cs));
	CHECK(get_byte(rfd) == 'g', "go");
	OK(rt.EventDestroy(ev));
	OK(rt.IpcCloseMemHandle(d));
	OK(rt.StreamDestroy(cs));
	OK(rt.FreeHost(hc));
	exit(fails ? 1 : 0);
}

/* ---- a dead exporter ----------------------------------------------------------------------------------- */

/*
 * What a process that waits on, and reads from, an exporter that died with
 * work pending gets: the window a consumer of the GPU ring is in when its
 * producer dies (README, "The GPU data plane"). CUDA leaves an event and
 * memory of a destroyed context undefined; the shim no longer queues a wait
 * on another process's event (it waits on the host, bounded), and what a
 * real driver does is printed here ("# dead exporter: ..."), for gpu-check
 * to show. Checked everywhere: the importer's own context goes on working.
 * Checked on tsemu: its default (the wait ends; the exporter's queued copy
 * never ran) and TSEMU_DEAD_EVENTS=pending (the wait never ends).
 */
#define DEAD_SIZE ((size_t)1 << 20)

static void block_forever(void *arg)
{
	(void)arg;
	for (;;)
		pause(); /* the exporter's stream stays here until it is killed */
}

/* poll ev for up to ms; the query's last answer, and the time waited */
static cudaError_t query_for(cudaEvent_t ev, int ms, double *waited)
{
	double t0 = now_ms();
	cudaError_t e;
	while ((e = rt.EventQuery(ev)) == cudaErrorNotReady && now_ms() - t0 < ms) {
		struct timespec ts = {0, 1000000};
		nanosleep(&ts, NULL);
	}
	*waited = now_ms() - t0;
	return e;
}

static int read_full(int fd, char *buf, size_t n)
{
	size_t got = 0;
	while (got < n) {
		ssize_t r = read(fd, buf + got, n - got);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return -1;
		got += (size_t)r;
	}
	return 0;
}

static void t_ipc_dead(void)
{
	load();
	const char *sem = getenv("TSEMU_DEAD_EVENTS");
	int pending = sem && !strcmp(sem, "pending");
	int up[2];
	if (pipe(up))
		die("pipe");
	char wfd[16];
	snprintf(wfd, sizeof wfd, "%d", up[1]);
	char *a[] = {"ts-cudaemu-check", "ipc-dead-child", wfd, NULL};
	pid_t p = spawn(a);
	close(up[1]);
	cudaIpcMemHandle_t hm;
	cudaIpcEventHandle_t he;
	char mx[2 * sizeof hm + 1] = {0}, ex[2 * sizeof he + 1] = {0};
	if (read_full(up[0], mx, sizeof mx - 1) || read_full(up[0], ex, sizeof ex - 1) || unhex(mx, &hm, sizeof hm) ||
	    unhex(ex, &he, sizeof he)) {
		kill(p, SIGKILL);
		reap(p);
		die("the exporter sent no handles");
	}
	close(up[0]);
	void *d;
	cudaEvent_t ev, done, done2;
	cudaStream_t s, s2;
	char *g, *h;
	OK(rt.IpcOpenMemHandle(&d, hm, cudaIpcMemLazyEnablePeerAccess));
	OK(rt.IpcOpenEventHandle(&ev, he));
	OK(rt.HostAlloc((void **)&g, DEAD_SIZE, 0));
	OK(rt.HostAlloc((void **)&h, DEAD_SIZE, 0));
	OK(rt.StreamCreateWithFlags(&s, cudaStreamNonBlocking));
	OK(rt.StreamCreateWithFlags(&s2, cudaStreamNonBlocking));
	OK(rt.EventCreateWithFlags(&done, cudaEventDisableTiming));
	OK(rt.EventCreateWithFlags(&done2, cudaEventDisableTiming));
	EXPECT(rt.EventQuery(ev), cudaErrorNotReady); /* its record waits behind its blocked stream */
	memset(g, 0, DEAD_SIZE);
	OK(rt.StreamWaitEvent(s, ev, 0));
	OK(rt.MemcpyAsync(g, d, DEAD_SIZE, cudaMemcpyDeviceToHost, s));
	OK(rt.EventRecord(done, s));
	EXPECT(rt.EventQuery(done), cudaErrorNotReady);
	kill(p, SIGKILL);
	CHECK(reap(p) == 128 + SIGKILL, "the exporter killed");

	/* 1. a stream that waits on the dead exporter's pending record */
	double waited;
	cudaError_t e = query_for(done, pending ? 1500 : 3000, &waited);
	int stuck = e == cudaErrorNotReady;
	int seed = e == cudaSuccess ? seed_of(g, DEAD_SIZE) : -1;
	if (e == cudaErrorNotReady)
		fprintf(stderr, "# dead exporter: a stream waiting on its pending record had not moved after %.0f ms\n",
			waited);
	else
		fprintf(stderr, "# dead exporter: a stream waiting on its pending record went on after %.0f ms: %s, "
			"the bytes then read: seed %d (21: its queued copy never ran)\n", waited, ename(e), seed);
	fprintf(stderr, "# dead exporter: cudaEventQuery of its event: %s\n", ename(rt.EventQuery(ev)));
	rt.GetLastError();
	if (emu_only(1, "ipc-dead: tsemu's semantics for a dead recorder's pending record")) {
		if (pending)
			CHECK(e == cudaErrorNotReady, "TSEMU_DEAD_EVENTS=pending: the wait never ends (%s)", ename(e));
		else
			CHECK(e == cudaSuccess && seed == 21, "default: the wait ends, the copy never ran (%s, seed %d)",
			      ename(e), seed);
	}

	/* 2. this process's own work goes on, on another stream */
	void *mine;
	fill(h, DEAD_SIZE, 23);
	OK(rt.Malloc(&mine, DEAD_SIZE));
	OK(rt.MemcpyAsync(mine, h, DEAD_SIZE, cudaMemcpyHostToDevice, s2));
	OK(rt.MemcpyAsync(g, mine, DEAD_SIZE, cudaMemcpyDeviceToHost, s2));
	OK(rt.EventRecord(done2, s2));
	e = query_for(done2, 5000, &waited);
	CHECK(e == cudaSuccess && seed_of(g, DEAD_SIZE) == 23,
	      "the importer's own copies run on after the exporter's death (%s after %.0f ms, seed %d)", ename(e),
	      waited, e == cudaSuccess ? seed_of(g, DEAD_SIZE) : -1);

	/* 2b. a record of its event here: does it release the stream that waits
	 * (a way to unstick one; tsemu's generations say yes) */
	if (stuck) {
		OK(rt.EventRecord(ev, s2));
		e = query_for(done, 2000, &waited);
		fprintf(stderr, "# dead exporter: recording its event here %s the waiting stream (%s after %.0f ms)\n",
			e == cudaSuccess ? "released" : "did not release", ename(e), waited);
		rt.GetLastError();
		if (emu_only(1, "ipc-dead: a record of the event in the importer releases the wait on tsemu"))
			CHECK(e == cudaSuccess, "a record here released the wait (%s)", ename(e));
		stuck = e == cudaErrorNotReady;
	}

	/* 3. a copy out of its memory after it died (what a consumer's copy
	 * queued at the death reads) */
	OK(rt.MemcpyAsync(g, d, DEAD_SIZE, cudaMemcpyDeviceToHost, s2));
	OK(rt.EventRecord(done2, s2));
	e = query_for(done2, 5000, &waited);
	seed = e == cudaSuccess ? seed_of(g, DEAD_SIZE) : -1;
	fprintf(stderr, "# dead exporter: a copy out of its memory afterwards: %s after %.0f ms, seed %d "
		"(21: what it held)\n", ename(e), waited, seed);
	/* (a close waits for the copies out of it: one is behind the stuck wait) */
	if (!stuck)
		fprintf(stderr, "# dead exporter: closing its memory's handle: %s\n", ename(rt.IpcCloseMemHandle(d)));
	rt.GetLastError();
	if (emu_only(1, "ipc-dead: tsemu keeps a dead exporter's memory while it is open here"))
		CHECK(e == cudaSuccess && seed == 21, "its memory still reads what it held (%s, seed %d)", ename(e), seed);
	/* s may never end its wait: left as it is, to the process's exit (a free
	 * would wait for the whole device, s too) */
	if (!stuck)
		OK(rt.Free(mine));
}

static void t_ipc_dead_child(int argc, char **argv)
{
	if (argc < 1)
		die("usage: ipc-dead-child WFD");
	load();
	int wfd = atoi(argv[0]);
	void *d;
	char *h;
	cudaEvent_t ev;
	cudaStream_t s;
	cudaIpcMemHandle_t hm;
	cudaIpcEventHandle_t he;
	OK(rt.Malloc(&d, DEAD_SIZE));
	OK(rt.HostAlloc((void **)&h, DEAD_SIZE, 0));
	fill(h, DEAD_SIZE, 21);
	OK(rt.Memcpy(d, h, DEAD_SIZE, cudaMemcpyHostToDevice));
	OK(rt.EventCreateWithFlags(&ev, cudaEventInterprocess | cudaEventDisableTiming));
	OK(rt.StreamCreateWithFlags(&s, cudaStreamNonBlocking));
	OK(rt.IpcGetMemHandle(&hm, d));
	OK(rt.IpcGetEventHandle(&he, ev));
	/* the stream blocks; the copy of seed 22 and the record wait behind it */
	OK(rt.LaunchHostFunc(s, block_forever, NULL));
	fill(h, DEAD_SIZE, 22);
	OK(rt.MemcpyAsync(d, h, DEAD_SIZE, cudaMemcpyHostToDevice, s));
	OK(rt.EventRecord(ev, s));
	char mx[2 * sizeof hm + 1], ex[2 * sizeof he + 1];
	hex(&hm, sizeof hm, mx);
	hex(&he, sizeof he, ex);
	if (fails || write(wfd, mx, sizeof mx - 1) != (ssize_t)(sizeof mx - 1) ||
	    write(wfd, ex, sizeof ex - 1) != (ssize_t)(sizeof ex - 1))
		exit(1);
	for (;;)
		pause(); /* killed */
}

/*
 * An exporter that exits normally while the importer still has its memory
 * open: its context is destroyed at exit, and with it (PyTorch's notes on
 * CUDA IPC: "automatically freed upon the producer's exit") its memory. This
 * is what a consumer's copy out of the GPU ring reads when it is still queued
 * as its producer exits (the shim's producer waits at exit for the copies
 * its consumers hold: README, "The GPU data plane"). Checked everywhere: the
 * memory reads right while its exporter lives. Printed: what a copy reads
 * after the exit ("# exited exporter: ..."). Checked on tsemu: the memory is
 * overwritten at the exit and the copy is counted (ipc_read_lost).
 *
 * ipc-reset: the same, with an exporter that calls cudaDeviceReset() and
 * lives on (as CUDA's samples end main): its primary context, and its
 * memory with it, goes at the reset. Checked everywhere: the exporter
 * allocates and copies again after it. Printed ("# reset exporter: ..."):
 * what the importer's copy reads, and what cudaFree of a pointer from before
 * answers. Checked on tsemu: other bytes, the read counted.
 *
 * ipc-ctx-destroy: the same, with an exporter that makes a context of its
 * own (cuCtxCreate), allocates in it, and destroys it (cuCtxDestroy) while
 * it lives on: the memory goes with that context. Checked and printed as for
 * ipc-reset ("# destroyed context's exporter: ...").
 */
enum gone_how { GONE_EXIT, GONE_RESET, GONE_CTX_DESTROY };
static const char *const gone_arg[] = {NULL, "reset", "destroy"};
static const char *const gone_call[] = {"normal exit", "cudaDeviceReset", "cuCtxDestroy"};

static void t_ipc_gone(enum gone_how how)
{
	int reset = how != GONE_EXIT; /* the exporter lives on */
	load();
	int up[2], down[2];
	if (pipe(up) || pipe(down))
		die("pipe");
	char wfd[16], rfd[16];
	snprintf(wfd, sizeof wfd, "%d", up[1]);
	snprintf(rfd, sizeof rfd, "%d", down[0]);
	char *a[] = {"ts-cudaemu-check", "ipc-exit-child", wfd, rfd, (char *)gone_arg[how], NULL};
	const char *who = how == GONE_CTX_DESTROY ? "destroyed context's exporter"
			  : reset		 ? "reset exporter"
						 : "exited exporter";
	pid_t p = spawn(a);
	close(up[1]);
	close(down[0]);
	cudaIpcMemHandle_t hm;
	char mx[2 * sizeof hm + 1] = {0};
	if (read_full(up[0], mx, sizeof mx - 1) || unhex(mx, &hm, sizeof hm)) {
		kill(p, SIGKILL);
		reap(p);
		die("the exporter sent no handle");
	}
	void *d;
	char *g;
	cudaStream_t s;
	OK(rt.IpcOpenMemHandle(&d, hm, cudaIpcMemLazyEnablePeerAccess));
	OK(rt.HostAlloc((void **)&g, DEAD_SIZE, 0));
	OK(rt.StreamCreateWithFlags(&s, cudaStreamNonBlocking));
	memset(g, 0, DEAD_SIZE);
	OK(rt.MemcpyAsync(g, d, DEAD_SIZE, cudaMemcpyDeviceToHost, s));
	OK(rt.StreamSynchronize(s));
	CHECK(seed_of(g, DEAD_SIZE) == 31, "its memory reads what it holds while it lives (seed %d)",
	      seed_of(g, DEAD_SIZE));
	struct tsemu_stats s0 = stats();
	put_byte(down[1], 'x');
	if (reset)
		CHECK(get_byte(up[0]) == 'r', "the exporter's context went, it allocated and copied again");
	else
		CHECK(reap(p) == 0, "the exporter exited normally");
	memset(g, 0, DEAD_SIZE);
	cudaError_t e = rt.MemcpyAsync(g, d, DEAD_SIZE, cudaMemcpyDeviceToHost, s);
	if (e == cudaSuccess)
		e = rt.StreamSynchronize(s);
	int seed = e == cudaSuccess ? seed_of(g, DEAD_SIZE) : -1;
	fprintf(stderr, "# %s: a copy out of its memory after its %s: %s, seed %d (31: what it held; -1: other "
		"bytes)\n", who, gone_call[how], ename(e), seed);
	fprintf(stderr, "# %s: closing its memory's handle: %s\n", who, ename(rt.IpcCloseMemHandle(d)));
	rt.GetLastError();
	if (reset) {
		put_byte(down[1], 'y');
		CHECK(reap(p) == 0, "the exporter exited normally");
	}
	if (emu_only(2, "ipc-exit: tsemu takes an exited or reset exporter's memory, and counts a read of it")) {
		CHECK(e == cudaSuccess && seed == -1, "a copy afterwards reads other bytes (%s, seed %d)", ename(e),
		      seed);
		EXPECT(stats().ipc_read_lost - s0.ipc_read_lost, 1);
	}
	/* this process goes on */
	void *mine;
	fill(g, DEAD_SIZE, 33);
	OK(rt.Malloc(&mine, DEAD_SIZE));
	OK(rt.Memcpy(mine, g, DEAD_SIZE, cudaMemcpyHostToDevice));
	memset(g, 0, DEAD_SIZE);
	OK(rt.Memcpy(g, mine, DEAD_SIZE, cudaMemcpyDeviceToHost));
	CHECK(seed_of(g, DEAD_SIZE) == 33, "the importer's own copies run on (seed %d)", seed_of(g, DEAD_SIZE));
	OK(rt.Free(mine));
	OK(rt.StreamDestroy(s));
	OK(rt.FreeHost(g));
}

/* The exporter's side after its reset: allocations and copies work again. */
static int exporter_after_reset(void *old, char *h)
{
	void *d;
	int ok = 1;
	cudaError_t e = rt.Free(old);
	rt.GetLastError();
	fprintf(stderr, "# exporter: cudaFree of a pointer from before its context went: %s\n", ename(e));
	if (emu_only(1, "ipc-reset: tsemu's cudaFree of a pointer from before the reset fails"))
		CHECK(e != cudaSuccess, "tsemu: memory from before the reset is gone (cudaFree: %s)", ename(e));
	ok &= EXPECT(rt.Malloc(&d, DEAD_SIZE), cudaSuccess);
	fill(h, DEAD_SIZE, 35);
	ok &= EXPECT(rt.Memcpy(d, h, DEAD_SIZE, cudaMemcpyHostToDevice), cudaSuccess);
	memset(h, 0, DEAD_SIZE);
	ok &= EXPECT(rt.Memcpy(h, d, DEAD_SIZE, cudaMemcpyDeviceToHost), cudaSuccess);
	CHECK(seed_of(h, DEAD_SIZE) == 35, "after the reset its own copies work (seed %d)", seed_of(h, DEAD_SIZE));
	ok &= EXPECT(rt.Free(d), cudaSuccess);
	return ok && seed_of(h, DEAD_SIZE) == 35;
}

static void t_ipc_exit_child(int argc, char **argv)
{
	if (argc < 2)
		die("usage: ipc-exit-child WFD RFD [reset|destroy]");
	load();
	int wfd = atoi(argv[0]), rfd = atoi(argv[1]), reset = argc > 2 && !strcmp(argv[2], "reset");
	int destroy = argc > 2 && !strcmp(argv[2], "destroy");
	CUcontext own = NULL;
	if (destroy) {
		CUresult (*init)(unsigned int) = drv("cuInit");
		CUresult (*create)(CUcontext *, CUctxCreateParams *, unsigned int, CUdevice) = drv("cuCtxCreate");
		if (init(0) != CUDA_SUCCESS || create(&own, NULL, 0, 0) != CUDA_SUCCESS)
			die("cuCtxCreate failed");
	}
	void *d;
	char *h = xmalloc(DEAD_SIZE);
	cudaIpcMemHandle_t hm;
	OK(rt.Malloc(&d, DEAD_SIZE));
	fill(h, DEAD_SIZE, 31);
	OK(rt.Memcpy(d, h, DEAD_SIZE, cudaMemcpyHostToDevice));
	OK(rt.DeviceSynchronize()); /* from pageable memory, cudaMemcpy may return before the bytes land */
	OK(rt.IpcGetMemHandle(&hm, d));
	char mx[2 * sizeof hm + 1];
	hex(&hm, sizeof hm, mx);
	if (fails || write(wfd, mx, sizeof mx - 1) != (ssize_t)(sizeof mx - 1))
		exit(1);
	get_byte(rfd); /* then exit, its memory not freed: the context goes with the process */
	if (reset || destroy) {
		if (reset)
			OK(rt.DeviceReset());
		else if (((CUresult(*)(CUcontext))drv("cuCtxDestroy"))(own) != CUDA_SUCCESS)
			die("cuCtxDestroy failed");
		if (!exporter_after_reset(d, h) || fails)
			exit(1);
		put_byte(wfd, 'r');
		get_byte(rfd);
	}
	free(h);
	exit(fails ? 1 : 0);
}

/* ---- contexts --------------------------------------------------------------------------------------- */

/*
 * ctx-stack: a thread's context stack, as cuda.h documents it. cuCtxCreate
 * pushes the new context; cuCtxPushCurrent/cuCtxPopCurrent push and pop;
 * cuCtxSetCurrent replaces the top; memory allocated lives in the current
 * context; cuCtxDestroy of the current context pops it, and its handle is
 * invalid after. Checked everywhere but the last pop of an empty stack,
 * whose error is tsemu's (printed for a real driver).
 */
static void t_ctx_stack(void)
{
	load();
	CUresult (*create)(CUcontext *, CUctxCreateParams *, unsigned int, CUdevice) = drv("cuCtxCreate");
	CUresult (*destroy)(CUcontext) = drv("cuCtxDestroy");
	CUresult (*push)(CUcontext) = drv("cuCtxPushCurrent");
	CUresult (*pop)(CUcontext *) = drv("cuCtxPopCurrent");
	CUresult (*setcur)(CUcontext) = drv("cuCtxSetCurrent");
	CUresult (*getcur)(CUcontext *) = drv("cuCtxGetCurrent");
	CUresult (*alloc)(CUdeviceptr *, size_t) = drv("cuMemAlloc");
	CUresult (*mfree)(CUdeviceptr) = drv("cuMemFree");
	CUresult (*attr)(void *, CUpointer_attribute, CUdeviceptr) = drv("cuPointerGetAttribute");
	CUcontext p = NULL, a = NULL, x = NULL;
	OK(rt.Free(NULL)); /* the runtime makes the primary context current */
	EXPECT(getcur(&p), CUDA_SUCCESS);
	CHECK(p != NULL, "the runtime made a context current");
	EXPECT(create(&a, NULL, 0, 0), CUDA_SUCCESS);
	EXPECT(getcur(&x), CUDA_SUCCESS);
	CHECK(x == a && a != p, "cuCtxCreate: the new context is current");
	EXPECT(push(p), CUDA_SUCCESS);
	EXPECT(getcur(&x), CUDA_SUCCESS);
	CHECK(x == p, "cuCtxPushCurrent: the pushed context is current");
	x = NULL;
	EXPECT(pop(&x), CUDA_SUCCESS);
	CHECK(x == p, "cuCtxPopCurrent gives the popped context");
	EXPECT(getcur(&x), CUDA_SUCCESS);
	CHECK(x == a, "... and the one below is current again");
	EXPECT(setcur(p), CUDA_SUCCESS);
	EXPECT(getcur(&x), CUDA_SUCCESS);
	CHECK(x == p, "cuCtxSetCurrent: current");
	EXPECT(setcur(a), CUDA_SUCCESS);
	EXPECT(getcur(&x), CUDA_SUCCESS);
	CHECK(x == a, "... it replaced the top, not pushed");
	CUdeviceptr d = 0;
	CUcontext owner = NULL;
	EXPECT(alloc(&d, 4096), CUDA_SUCCESS);
	EXPECT(attr(&owner, CU_POINTER_ATTRIBUTE_CONTEXT, d), CUDA_SUCCESS);
	CHECK(owner == a, "memory allocated lives in the current context");
	/* pinned host memory of the context, and a registration in it */
	CUresult (*hostalloc)(void **, size_t, unsigned int) = drv("cuMemHostAlloc");
	CUresult (*hostreg)(void *, size_t, unsigned int) = drv("cuMemHostRegister");
	CUresult (*hostunreg)(void *) = drv("cuMemHostUnregister");
	void *pinned = NULL;
	char *mine = xmalloc(8192);
	EXPECT(hostalloc(&pinned, 4096, 0), CUDA_SUCCESS);
	EXPECT(hostreg(mine, 8192, 0), CUDA_SUCCESS);
	EXPECT(destroy(a), CUDA_SUCCESS);
	unsigned int mtype = 0;
	CUresult pe = attr(&mtype, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)(uintptr_t)pinned);
	CUresult ue = hostunreg(mine);
	fprintf(stderr, "# after cuCtxDestroy: its pinned allocation's memory type: %d (type %u); unregistering its "
		"registration: %d\n", (int)pe, mtype, (int)ue);
	if (emu_only(2, "ctx-stack: tsemu's answers about a destroyed context's host memory")) {
		CHECK(pe == CUDA_ERROR_INVALID_VALUE, "its pinned allocation went with it (%d)", (int)pe);
		CHECK(ue == CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, "its registration ended with it (%d)", (int)ue);
	}
	memset(mine, 1, 8192); /* the registered memory is the program's: still there */
	free(mine);
	EXPECT(getcur(&x), CUDA_SUCCESS);
	CHECK(x == p, "cuCtxDestroy of the current context pops it: the one below is current");
	EXPECT(mfree(d), CUDA_ERROR_INVALID_VALUE); /* its memory went with it */
	CHECK(destroy(a) == CUDA_ERROR_INVALID_CONTEXT, "a destroyed context's handle is invalid");
	x = NULL;
	EXPECT(pop(&x), CUDA_SUCCESS);
	CHECK(x == p, "the runtime's context was at the bottom");
	CUresult e = pop(&x);
	fprintf(stderr, "# cuCtxPopCurrent of an empty stack: %d\n", (int)e);
	if (emu_only(1, "ctx-stack: tsemu's answer to a pop of an empty stack"))
		CHECK(e == CUDA_ERROR_INVALID_CONTEXT, "a pop of an empty stack: CUDA_ERROR_INVALID_CONTEXT (%d)", (int)e);
	OK(rt.Free(NULL)); /* the runtime makes its context current again */
	EXPECT(getcur(&x), CUDA_SUCCESS);
	CHECK(x == p, "the runtime's next call made its primary context current again");
}

/* ---- streams ------------------------------------------------------------------------------------------ */

/* Every stream operation waits 200 ms before it runs. Real mode: no delay,
 * so what shows a copy still on its way is skipped; what CUDA promises at a
 * call's return (a pageable source consumed, host to host done) and after a
 * synchronisation is checked. */
static void t_stream_async(void)
{
	load();
	if (!real)
		setenv("TSEMU_STREAM_DELAY_US", "200000", 1);
	size_t sz = 1 << 20;
	void *d, *d2;
	char *hp, *hq = xmalloc(sz), *hx = xmalloc(sz);
	cudaStream_t s, s2;
	OK(rt.Malloc(&d, sz));
	OK(rt.Malloc(&d2, sz));
	OK(rt.HostAlloc((void **)&hp, sz, 0));
	OK(rt.StreamCreate(&s));

	/* pinned source: the copy runs later, on the stream */
	fill(hp, sz, 20);
	double t0 = now_ms();
	OK(rt.MemcpyAsync(d, hp, sz, cudaMemcpyHostToDevice, s));
	double el = now_ms() - t0;
	fill(hp, sz, 21); /* an ordering bug: the source changes before synchronisation */
	OK(rt.StreamSynchronize(s));
	OK(rt.Memcpy(hx, d, sz, cudaMemcpyDeviceToHost));
	if (emu_only(2, "stream-async: a pinned async copy still on its way reads its source when it runs")) {
		CHECK(el < 100, "cudaMemcpyAsync from pinned memory returns before the copy (%.0f ms)", el);
		CHECK(seed_of(hx, sz) == 21, "the copy read the pinned source when it ran (seed %d)", seed_of(hx, sz));
	}

	/* pageable source, up to a staging buffer (1 MiB): consumed at the
	 * call, which returns with the device write still queued */
	fill(hq, sz, 22);
	t0 = now_ms();
	OK(rt.MemcpyAsync(d, hq, sz, cudaMemcpyHostToDevice, s));
	el = now_ms() - t0;
	fill(hq, sz, 23);
	if (emu_only(2, "stream-async: a staged pageable copy returns with the device write on its way")) {
		CHECK(el < 100, "cudaMemcpyAsync of 1 MiB of pageable memory is staged: returns at once (%.0f ms)", el);
		EXPECT(rt.StreamQuery(s), cudaErrorNotReady); /* "the DMA ... may not have completed" */
	}
	OK(rt.StreamSynchronize(s));
	OK(rt.Memcpy(hx, d, sz, cudaMemcpyDeviceToHost));
	CHECK(seed_of(hx, sz) == 22, "pageable source consumed at the call (seed %d)", seed_of(hx, sz));
	/* the synchronous form waits for earlier work on its stream, not for its own copy */
	void *d3;
	OK(rt.Malloc(&d3, 4096));
	OK(rt.MemcpyAsync(d2, hp, sz, cudaMemcpyHostToDevice, 0));
	t0 = now_ms();
	OK(rt.Memcpy(d3, hq, 4096, cudaMemcpyHostToDevice));
	el = now_ms() - t0;
	if (emu_only(2, "stream-async: cudaMemcpy waits for the stream's earlier work, not its own")) {
		CHECK(el >= 150 && el < 350, "cudaMemcpy from pageable memory: stream sync, then staged (%.0f ms)", el);
		EXPECT(rt.StreamQuery(0), cudaErrorNotReady);
	}
	OK(rt.Memcpy(hx, d3, 4096, cudaMemcpyDeviceToHost));
	CHECK(seed_of(hx, 4096) == 23, "... and later work on the stream sees it");
	OK(rt.Free(d3));
	/* more than a staging buffer: the call returns about when the data is there */
	char *big = xmalloc(4 * sz);
	void *db;
	OK(rt.Malloc(&db, 4 * sz));
	fill(big, 4 * sz, 25);
	t0 = now_ms();
	OK(rt.MemcpyAsync(db, big, 4 * sz, cudaMemcpyHostToDevice, s));
	el = now_ms() - t0;
	if (emu_only(2, "stream-async: a pageable copy past the staging buffer returns when the data is there")) {
		CHECK(el >= 150, "cudaMemcpyAsync of 4 MiB of pageable memory returns after the copy (%.0f ms)", el);
		OK(rt.StreamQuery(s));
	}
	OK(rt.Free(db));
	free(big);
	/* host to host is synchronous even in the Async form */
	t0 = now_ms();
	OK(rt.MemcpyAsync(hx, hp, 4096, cudaMemcpyHostToHost, s));
	el = now_ms() - t0;
	CHECK(!memcmp(hx, hp, 4096), "cudaMemcpyAsync host to host is synchronous: done at its return");
	if (emu_only(1, "stream-async: host to host waits for the stream's earlier (delayed) work"))
		CHECK(el >= 150, "cudaMemcpyAsync host to host waits for the stream (%.0f ms)", el);

	/* cudaMemcpy device to device does not wait for the copy */
	t0 = now_ms();
	OK(rt.Memcpy(d2, d, sz, cudaMemcpyDeviceToDevice));
	el = now_ms() - t0;
	if (emu_only(1, "stream-async: cudaMemcpy device to device returns before the (delayed) copy"))
		CHECK(el < 100, "cudaMemcpy device to device returns before the copy (%.0f ms)", el);
	OK(rt.Memcpy(hx, d2, sz, cudaMemcpyDeviceToHost)); /* ordered after it */
	CHECK(seed_of(hx, sz) == 22, "... and what follows on the stream sees it");

	/* device to pinned host: the buffer is not filled before synchronisation */
	t0 = now_ms();
	OK(rt.MemcpyAsync(hp, d2, sz, cudaMemcpyDeviceToHost, s));
	el = now_ms() - t0;
	if (emu_only(3, "stream-async: an async copy to pinned memory still on its way, not ready no last error")) {
		CHECK(el < 100 && seed_of(hp, sz) == 21, "async copy to pinned memory: %.0f ms, buffer seed %d before sync",
		      el, seed_of(hp, sz));
		EXPECT(rt.StreamQuery(s), cudaErrorNotReady);
		EXPECT(rt.GetLastError(), cudaSuccess);
	}
	OK(rt.StreamSynchronize(s));
	OK(rt.StreamQuery(s));
	CHECK(seed_of(hp, sz) == 22, "... and is after it");

	/* events */
	cudaEvent_t e1, e2;
	OK(rt.EventCreate(&e1));
	OK(rt.EventCreate(&e2));
	OK(rt.EventRecord(e1, s));
	OK(rt.MemcpyAsync(d, hp, sz, cudaMemcpyHostToDevice, s));
	OK(rt.EventRecord(e2, s));
	if (emu_only(2, "stream-async: an event behind a (delayed) copy is not ready, not a last error")) {
		EXPECT(rt.EventQuery(e2), cudaErrorNotReady);
		EXPECT(rt.PeekAtLastError(), cudaSuccess);
	}
	OK(rt.EventSynchronize(e2));
	OK(rt.EventQuery(e2));
	float ms = 0;
	OK(rt.EventElapsedTime(&ms, e1, e2));
	if (emu_only(1, "stream-async: cudaEventElapsedTime spans the (delayed) copy"))
		CHECK(ms >= 300, "cudaEventElapsedTime over a copy and a record: %.1f ms", (double)ms);

	/* destroying a stream with work pending: the work still happens */
	OK(rt.StreamCreate(&s2));
	fill(hp, sz, 24);
	OK(rt.MemcpyAsync(d2, hp, sz, cudaMemcpyHostToDevice, s2));
	OK(rt.StreamDestroy(s2));
	OK(rt.DeviceSynchronize());
	OK(rt.Memcpy(hx, d2, sz, cudaMemcpyDeviceToHost));
	CHECK(seed_of(hx, sz) == 24, "work of a destroyed stream completes");
	/* destroying an event with a record pending */
	OK(rt.EventRecord(e1, s));
	OK(rt.EventDestroy(e1));
	OK(rt.StreamSynchronize(s));
	OK(rt.EventDestroy(e2));
	OK(rt.StreamDestroy(s));
	OK(rt.Free(d));
	OK(rt.Free(d2));
	OK(rt.FreeHost(hp));
	free(hq);
	free(hx);
}

struct ptds_arg {
	void *dst, *src;
	size_t n;
	int busy_seen;
	cudaError_t e;
};

static void *ptds_thread(void *arg)
{
	struct ptds_arg *a = arg;
	a->e = rt.MemcpyAsync_ptsz(a->dst, a->src, a->n, cudaMemcpyDeviceToDevice, 0);
	a->busy_seen = rt.StreamQuery_ptsz(0) == cudaErrorNotReady;
	if (a->e == cudaSuccess)
		a->e = rt.StreamSynchronize_ptsz(0);
	return NULL;
}

/* Device-to-device copies take 200 ms (TSEMU_D2D_GBPS=0.02, 4 MiB), the
 * data landing at the end: a stream that reads too early sees old data.
 * Real mode: the orders CUDA promises are checked; that streams without one
 * overlap needs a copy still on its way, and is skipped. */
static void t_stream_order(void)
{
	load();
	if (!real)
		setenv("TSEMU_D2D_GBPS", "0.02", 1);
	size_t sz = 4 << 20;
	char *x = NULL, *y = NULL, *y2 = NULL, *z = NULL, *z2 = NULL, *w = NULL, *w2 = NULL, *v = NULL; /* (cppcheck) */
	char *hp, *hp2, *hf = xmalloc(sz);
	char **all[] = {&x, &y, &y2, &z, &z2, &w, &w2, &v};
	for (size_t i = 0; i < 8; i++) {
		OK(rt.Malloc((void **)all[i], sz));
		fill(hf, sz, i == 0 ? 30 : 31);
		OK(rt.Memcpy(*all[i], hf, sz, cudaMemcpyHostToDevice));
	}
	OK(rt.HostAlloc((void **)&hp, sz, 0));
	OK(rt.HostAlloc((void **)&hp2, sz, 0));
	cudaStream_t t, s, s2, b, nb;
	OK(rt.StreamCreateWithFlags(&t, cudaStreamNonBlocking));
	OK(rt.StreamCreateWithFlags(&s, cudaStreamNonBlocking));
	OK(rt.StreamCreateWithFlags(&s2, cudaStreamNonBlocking));
	OK(rt.StreamCreate(&b));
	OK(rt.StreamCreateWithFlags(&nb, cudaStreamNonBlocking));
	cudaEvent_t e;
	OK(rt.EventCreateWithFlags(&e, cudaEventDisableTiming));

	/* S waits for T's copy through an event; S2, without, does not */
	OK(rt.MemcpyAsync(y, x, sz, cudaMemcpyDeviceToDevice, t));
	OK(rt.EventRecord(e, t));
	OK(rt.StreamWaitEvent(s, e, 0));
	OK(rt.MemcpyAsync(hp, y, sz, cudaMemcpyDeviceToHost, s));
	OK(rt.StreamSynchronize(s));
	CHECK(seed_of(hp, sz) == 30, "a copy queued after cudaStreamWaitEvent runs after the event (seed %d)",
	      seed_of(hp, sz));
	OK(rt.MemcpyAsync(y2, x, sz, cudaMemcpyDeviceToDevice, t));
	OK(rt.MemcpyAsync(hp2, y2, sz, cudaMemcpyDeviceToHost, s2));
	OK(rt.StreamSynchronize(s2));
	if (emu_only(1, "stream-order: without a wait, another stream reads before the (slow) copy lands"))
		CHECK(seed_of(hp2, sz) == 31, "without the wait, another stream runs concurrently (seed %d)",
		      seed_of(hp2, sz));
	OK(rt.StreamSynchronize(t));

	/* the legacy default stream: blocking streams wait for it, others not */
	OK(rt.MemcpyAsync(z, x, sz, cudaMemcpyDeviceToDevice, 0));
	OK(rt.MemcpyAsync(hp, z, sz, cudaMemcpyDeviceToHost, b));
	OK(rt.StreamSynchronize(b));
	CHECK(seed_of(hp, sz) == 30, "a blocking stream waits for earlier legacy-stream work (seed %d)", seed_of(hp, sz));
	OK(rt.MemcpyAsync(z2, x, sz, cudaMemcpyDeviceToDevice, 0));
	OK(rt.MemcpyAsync(hp2, z2, sz, cudaMemcpyDeviceToHost, nb));
	OK(rt.StreamSynchronize(nb));
	if (emu_only(1, "stream-order: a non-blocking stream reads before legacy-stream work lands"))
		CHECK(seed_of(hp2, sz) == 31, "a non-blocking stream does not (seed %d)", seed_of(hp2, sz));
	OK(rt.DeviceSynchronize());
	/* ... and the legacy stream waits for blocking streams, not others */
	OK(rt.MemcpyAsync(w, x, sz, cudaMemcpyDeviceToDevice, b));
	OK(rt.Memcpy(hp, w, sz, cudaMemcpyDeviceToHost));
	CHECK(seed_of(hp, sz) == 30, "legacy-stream work waits for a blocking stream's (seed %d)", seed_of(hp, sz));
	OK(rt.MemcpyAsync(w2, x, sz, cudaMemcpyDeviceToDevice, nb));
	OK(rt.Memcpy(hp2, w2, sz, cudaMemcpyDeviceToHost));
	if (emu_only(1, "stream-order: the legacy stream reads before a non-blocking stream's copy lands"))
		CHECK(seed_of(hp2, sz) == 31, "... not for a non-blocking stream's (seed %d)", seed_of(hp2, sz));
	OK(rt.DeviceSynchronize());
	OK(rt.MemcpyAsync(w, y2, sz, cudaMemcpyDeviceToDevice, b));
	OK(rt.StreamSynchronize(0)); /* synchronising the legacy stream waits for blocking streams */
	if (emu_only(1, "stream-order: a blocking stream's copy, done after cudaStreamSynchronize(0)"))
		EXPECT(rt.StreamQuery(b), cudaSuccess);

	/* per-thread default streams are per thread */
	struct ptds_arg a = {v, x, sz, 0, cudaSuccess};
	pthread_t th;
	pthread_create(&th, NULL, ptds_thread, &a);
	usleep(50000);
	EXPECT(rt.StreamQuery_ptsz(0), cudaSuccess); /* ours is idle */
	pthread_join(th, NULL);
	OK(a.e);
	if (emu_only(1, "stream-order: the other thread's per-thread stream busy with its (slow) copy"))
		CHECK(a.busy_seen, "the other thread's per-thread stream was busy");
	OK(rt.Memcpy_ptds(hp, v, sz, cudaMemcpyDeviceToHost));
	CHECK(seed_of(hp, sz) == 30, "per-thread stream copy");

	OK(rt.EventDestroy(e));
	cudaStream_t ss[] = {t, s, s2, b, nb};
	for (size_t i = 0; i < 5; i++)
		OK(rt.StreamDestroy(ss[i]));
	for (size_t i = 0; i < 8; i++)
		OK(rt.Free(*all[i]));
	OK(rt.FreeHost(hp));
	OK(rt.FreeHost(hp2));
	free(hf);
}

/* ---- stream capture and graphs ------------------------------------------------------------------- */

static enum cudaStreamCaptureStatus capture_status(cudaStream_t s)
{
	enum cudaStreamCaptureStatus st = (enum cudaStreamCaptureStatus)-1;
	if (rt.StreamIsCapturing(s, &st) != cudaSuccess)
		return (enum cudaStreamCaptureStatus)-1;
	return st;
}

/* End a capture that must have been invalidated: the error, and no graph. */
static void end_invalidated(cudaStream_t s, const char *why, int line)
{
	cudaGraph_t g = (cudaGraph_t)1;
	expect_(rt.StreamEndCapture(s, &g), cudaErrorStreamCaptureInvalidated, why, line);
	CHECK(g == NULL, "an invalidated capture gives no graph (%s)", why);
	EXPECT(capture_status(s), cudaStreamCaptureStatusNone);
	rt.GetLastError();
}
#define END_INVALIDATED(s, why) end_invalidated(s, why, __LINE__)

/* A capture that ends well: its graph destroyed. */
static void end_ok(cudaStream_t s, const char *why, int line)
{
	cudaGraph_t g = NULL;
	if (expect_(rt.StreamEndCapture(s, &g), cudaSuccess, why, line))
		expect_(rt.GraphDestroy(g), cudaSuccess, why, line);
}
#define END_OK(s, why) end_ok(s, why, __LINE__)

struct unsafe_arg {
	enum cudaStreamCaptureMode mode; /* the thread's capture mode */
	cudaEvent_t ev;
	cudaError_t alloc, query;
};

/* Potentially unsafe calls (an allocation, an event query) from a thread in capture mode a->mode. */
static void *unsafe_calls(void *arg)
{
	struct unsafe_arg *a = arg;
	enum cudaStreamCaptureMode m = a->mode;
	rt.ThreadExchangeStreamCaptureMode(&m);
	void *p = NULL;
	a->alloc = rt.Malloc(&p, 4096);
	a->query = rt.EventQuery(a->ev);
	if (p)
		rt.Free(p);
	return NULL;
}

static struct unsafe_arg unsafe_elsewhere(enum cudaStreamCaptureMode mode, cudaEvent_t ev)
{
	struct unsafe_arg a = {mode, ev, cudaErrorUnknown, cudaErrorUnknown};
	pthread_t th;
	pthread_create(&th, NULL, unsafe_calls, &a);
	pthread_join(th, NULL);
	return a;
}

struct end_arg {
	cudaStream_t s;
	cudaGraph_t g;
	cudaError_t rc;
};

static void *end_capture(void *arg)
{
	struct end_arg *a = arg;
	a->rc = rt.StreamEndCapture(a->s, &a->g);
	return NULL;
}

/* Captured copies run at each launch, reading their sources then; nothing runs while capturing. */
static void capture_replays(cudaStream_t s, void *d, void *d2, char *hp, char *hq, size_t sz)
{
	struct tsemu_stats a = stats(), b;
	enum cudaStreamCaptureStatus st;
	unsigned long long id = 0;
	cudaGraph_t g = NULL;
	const cudaGraphNode_t *deps = NULL;
	size_t nd = 9;
	fill(hp, sz, 51);
	OK(rt.StreamBeginCapture(s, cudaStreamCaptureModeGlobal));
	EXPECT(capture_status(s), cudaStreamCaptureStatusActive);
	OK(rt.StreamGetCaptureInfo(s, &st, &id, &g, &deps, NULL, &nd));
	CHECK(st == cudaStreamCaptureStatusActive && id && g && nd == 0, "capture info: status %d id %llu nodes %zu",
	      (int)st, id, nd);
	OK(rt.MemcpyAsync(d, hp, sz, cudaMemcpyHostToDevice, s));
	OK(rt.MemcpyAsync(d2, d, sz, cudaMemcpyDeviceToDevice, s));
	OK(rt.MemcpyAsync(hq, d2, sz, cudaMemcpyDeviceToHost, s));
	OK(rt.StreamGetCaptureInfo(s, &st, &id, &g, &deps, NULL, &nd));
	CHECK(nd == 1 && deps && deps[0], "the next node depends on the last captured (%zu)", nd);
	usleep(50000);
	b = stats();
	if (emu_only(1, "capture: tsemu_stats counts no copy while capturing"))
		CHECK(b.h2d_calls == a.h2d_calls && b.d2d_calls == a.d2d_calls && b.d2h_calls == a.d2h_calls,
		      "captured copies do not run (h2d %llu, d2d %llu, d2h %llu calls)",
		      (unsigned long long)(b.h2d_calls - a.h2d_calls), (unsigned long long)(b.d2d_calls - a.d2d_calls),
		      (unsigned long long)(b.d2h_calls - a.d2h_calls));
	g = NULL;
	OK(rt.StreamEndCapture(s, &g));
	EXPECT(capture_status(s), cudaStreamCaptureStatusNone);
	CHECK(seed_of(hq, sz) != 51, "nothing was copied before the launch");
	cudaGraphExec_t x = NULL;
	OK(rt.GraphInstantiate(&x, g, 0));
	for (int seed = 52; seed <= 53; seed++) {
		fill(hp, sz, seed); /* after the capture: the launch reads it */
		OK(rt.GraphLaunch(x, s));
		OK(rt.StreamSynchronize(s));
		CHECK(seed_of(hq, sz) == seed, "launch %d replays H2D, D2D, D2H reading the source then (seed %d)",
		      seed - 51, seed_of(hq, sz));
	}
	b = stats();
	if (emu_only(1, "capture: tsemu_stats counts the two launches' uploads"))
		EXPECT(b.h2d_bytes - a.h2d_bytes, 2 * sz);
	OK(rt.GraphExecDestroy(x));
	OK(rt.GraphDestroy(g));
	EXPECT(rt.GraphDestroy(g), cudaErrorInvalidValue);
	rt.GetLastError();
}

/* Events in a capture: a record there runs nothing; cross-capture waits are refused. */
static void capture_events(cudaStream_t s, void *d, const char *hp, size_t sz)
{
	cudaEvent_t in, out;
	cudaGraph_t g = NULL;
	OK(rt.EventCreateWithFlags(&in, cudaEventDisableTiming));
	OK(rt.EventCreateWithFlags(&out, cudaEventDisableTiming));
	OK(rt.EventRecord(out, s));
	OK(rt.StreamSynchronize(s));

	OK(rt.StreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
	OK(rt.EventRecord(in, s));
	OK(rt.StreamWaitEvent(s, in, 0)); /* recorded in this capture: in-stream order */
	EXPECT(rt.EventQuery(in), cudaErrorCapturedEvent);
	EXPECT(capture_status(s), cudaStreamCaptureStatusInvalidated);
	EXPECT(rt.MemcpyAsync(d, hp, sz, cudaMemcpyHostToDevice, s), cudaErrorStreamCaptureInvalidated);
	END_INVALIDATED(s, "cudaEventQuery on an event recorded in the capture");
	OK(rt.EventRecord(in, s));

	OK(rt.StreamBeginCapture(s, cudaStreamCaptureModeGlobal));
	EXPECT(rt.StreamWaitEvent(s, out, 0), cudaErrorStreamCaptureIsolation);
	END_INVALIDATED(s, "a wait on an event recorded outside the capture");

	OK(rt.StreamBeginCapture(s, cudaStreamCaptureModeGlobal));
	OK(rt.StreamWaitEvent(s, out, cudaEventWaitExternal));
	OK(rt.MemcpyAsync(d, hp, sz, cudaMemcpyHostToDevice, s));
	OK(rt.StreamEndCapture(s, &g));
	cudaGraphExec_t x = NULL;
	OK(rt.GraphInstantiate(&x, g, 0));
	OK(rt.GraphLaunch(x, s));
	OK(rt.StreamSynchronize(s));
	OK(rt.GraphExecDestroy(x));
	OK(rt.GraphDestroy(g));
	EXPECT(rt.StreamWaitEvent(s, out, cudaEventWaitExternal), cudaErrorInvalidValue); /* outside a capture */
	rt.GetLastError();
	OK(rt.EventDestroy(in));
	OK(rt.EventDestroy(out));
}

/* What waits for a capturing stream, or cannot be captured, invalidates the capture. */
static void capture_waits(cudaStream_t s, void *d, char *hp, size_t sz)
{
	char *pageable = xmalloc(sz);
	OK(rt.StreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
	EXPECT(rt.StreamSynchronize(s), cudaErrorStreamCaptureUnsupported);
	EXPECT(capture_status(s), cudaStreamCaptureStatusInvalidated);
	END_INVALIDATED(s, "cudaStreamSynchronize of the capturing stream");
	OK(rt.StreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
	EXPECT(rt.StreamQuery(s), cudaErrorStreamCaptureUnsupported);
	END_INVALIDATED(s, "cudaStreamQuery of the capturing stream");
	OK(rt.StreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
	EXPECT(rt.DeviceSynchronize(), cudaErrorStreamCaptureUnsupported);
	END_INVALIDATED(s, "cudaDeviceSynchronize while a stream of the device captures");
	OK(rt.StreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
	EXPECT(rt.MemcpyAsync(d, pageable, sz, cudaMemcpyHostToDevice, s), cudaErrorStreamCaptureUnsupported);
	END_INVALIDATED(s, "a copy from pageable memory (a stream sync first)");
	OK(rt.StreamBeginCapture(s, cudaStreamCaptureModeGlobal));
	EXPECT(rt.Memcpy(d, hp, sz, cudaMemcpyHostToDevice), cudaErrorStreamCaptureUnsupported);
	END_INVALIDATED(s, "a synchronous copy in the capturing thread");
	rt.GetLastError();
	free(pageable);
}

/* The capture modes: who may make potentially unsafe calls meanwhile. */
static void capture_modes(cudaStream_t s, void *d, char *hp, size_t sz)
{
	cudaEvent_t ev;
	OK(rt.EventCreateWithFlags(&ev, cudaEventDisableTiming));
	struct unsafe_arg a;

	OK(rt.StreamBeginCapture(s, cudaStreamCaptureModeGlobal));
	a = unsafe_elsewhere(cudaStreamCaptureModeGlobal, ev);
	CHECK(a.alloc == cudaErrorStreamCaptureUnsupported && a.query == cudaErrorStreamCaptureUnsupported,
	      "a global capture bars another thread in global mode: cudaMalloc %s, cudaEventQuery %s", ename(a.alloc),
	      ename(a.query));
	END_INVALIDATED(s, "an unsafe call in another thread during a global capture");

	const enum cudaStreamCaptureMode other[] = {cudaStreamCaptureModeRelaxed, cudaStreamCaptureModeThreadLocal};
	for (int i = 0; i < 2; i++) {
		OK(rt.StreamBeginCapture(s, cudaStreamCaptureModeGlobal));
		a = unsafe_elsewhere(other[i], ev);
		CHECK(a.alloc == cudaSuccess && a.query == cudaSuccess,
		      "another thread in mode %d may: cudaMalloc %s, cudaEventQuery %s", (int)other[i], ename(a.alloc),
		      ename(a.query));
		OK(rt.MemcpyAsync(d, hp, sz, cudaMemcpyHostToDevice, s));
		END_OK(s, "unsafe calls of a thread not in global mode leave the capture alone");
	}

	OK(rt.StreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
	a = unsafe_elsewhere(cudaStreamCaptureModeGlobal, ev);
	CHECK(a.alloc == cudaSuccess, "a thread-local capture does not bar other threads (%s)", ename(a.alloc));
	void *p = NULL;
	EXPECT(rt.Malloc(&p, 4096), cudaErrorStreamCaptureUnsupported); /* but it bars its own */
	END_INVALIDATED(s, "an unsafe call in the thread of its thread-local capture");

	OK(rt.StreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
	OK(rt.Malloc(&p, 4096));
	OK(rt.Free(p));
	END_OK(s, "a relaxed capture bars nobody");

	enum cudaStreamCaptureMode m = cudaStreamCaptureModeRelaxed;
	OK(rt.ThreadExchangeStreamCaptureMode(&m));
	EXPECT(m, cudaStreamCaptureModeGlobal); /* the default */
	m = (enum cudaStreamCaptureMode)7;
	EXPECT(rt.ThreadExchangeStreamCaptureMode(&m), cudaErrorInvalidValue);
	m = cudaStreamCaptureModeGlobal;
	OK(rt.ThreadExchangeStreamCaptureMode(&m));
	EXPECT(m, cudaStreamCaptureModeRelaxed);

	struct end_arg e = {s, NULL, cudaSuccess};
	pthread_t th;
	OK(rt.StreamBeginCapture(s, cudaStreamCaptureModeGlobal));
	pthread_create(&th, NULL, end_capture, &e);
	pthread_join(th, NULL);
	EXPECT(e.rc, cudaErrorStreamCaptureWrongThread);
	END_OK(s, "a global capture ends in its own thread");
	OK(rt.StreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
	pthread_create(&th, NULL, end_capture, &e);
	pthread_join(th, NULL);
	OK(e.rc);
	if (e.g)
		OK(rt.GraphDestroy(e.g));
	rt.GetLastError();
	OK(rt.EventDestroy(ev));
}

/* The legacy stream: never captured, unusable beside a blocking stream's capture. */
static void capture_legacy(void *d, char *hp, size_t sz)
{
	cudaStream_t b;
	OK(rt.StreamCreate(&b));
	EXPECT(rt.StreamBeginCapture(0, cudaStreamCaptureModeGlobal), cudaErrorStreamCaptureUnsupported);
	OK(rt.StreamBeginCapture(b, cudaStreamCaptureModeRelaxed));
	enum cudaStreamCaptureStatus st;
	EXPECT(rt.StreamIsCapturing(0, &st), cudaErrorStreamCaptureImplicit);
	EXPECT(capture_status(b), cudaStreamCaptureStatusActive); /* the query invalidates nothing */
	EXPECT(rt.MemcpyAsync(d, hp, sz, cudaMemcpyHostToDevice, 0), cudaErrorStreamCaptureImplicit);
	END_INVALIDATED(b, "work on the legacy stream beside a blocking capture");
	OK(rt.StreamBeginCapture(cudaStreamPerThread, cudaStreamCaptureModeGlobal));
	EXPECT(capture_status(cudaStreamPerThread), cudaStreamCaptureStatusActive);
	OK(rt.MemcpyAsync(d, hp, sz, cudaMemcpyHostToDevice, cudaStreamPerThread));
	END_OK(cudaStreamPerThread, "the per-thread default stream can be captured");
	OK(rt.StreamDestroy(b));
}

static void t_capture(void)
{
	load();
	size_t sz = 1 << 16;
	void *d, *d2;
	char *hp, *hq;
	cudaStream_t s;
	OK(rt.Malloc(&d, sz));
	OK(rt.Malloc(&d2, sz));
	OK(rt.HostAlloc((void **)&hp, sz, 0));
	OK(rt.HostAlloc((void **)&hq, sz, 0));
	fill(hq, sz, 50);
	OK(rt.Memcpy(d, hq, sz, cudaMemcpyHostToDevice));
	OK(rt.StreamCreateWithFlags(&s, cudaStreamNonBlocking));
	EXPECT(capture_status(s), cudaStreamCaptureStatusNone);
	capture_replays(s, d, d2, hp, hq, sz);
	capture_events(s, d, hp, sz);
	capture_waits(s, d, hp, sz);
	capture_modes(s, d, hp, sz);
	capture_legacy(d, hp, sz);
	OK(rt.StreamDestroy(s));
	OK(rt.Free(d));
	OK(rt.Free(d2));
	OK(rt.FreeHost(hp));
	OK(rt.FreeHost(hq));
}

/* ---- bandwidth model and counters ------------------------------------------------------------------ */

/* Each of ROUNDS copies (default 1) must take MIN_MS..MAX_MS; prints the
 * shortest (ms=), the time the copy takes at least: on a loaded machine (or
 * under ASan) one round can take tens of ms longer than the copy needs, and
 * cudaemu.sh compares the copy times with and without a modelled bandwidth. */
static void t_bandwidth(int argc, char **argv)
{
	if (argc < 3)
		die("usage: bandwidth h2d|d2d MIN_MS MAX_MS [ROUNDS]");
	load();
	int d2d = !strcmp(argv[0], "d2d");
	double lo = atof(argv[1]), hi = atof(argv[2]), best = 0;
	int rounds = argc > 3 ? atoi(argv[3]) : 1;
	if (rounds < 1)
		die("bandwidth: ROUNDS must be at least 1");
	size_t sz = 64 << 20;
	char *h = xmalloc(sz);
	void *d, *d2;
	memset(h, 1, sz);
	OK(rt.Malloc(&d, sz));
	OK(rt.Malloc(&d2, sz));
	OK(rt.Memset(d, 0, sz)); /* fault the pages in first */
	OK(rt.Memset(d2, 0, sz));
	OK(rt.DeviceSynchronize());
	for (int r = 0; r < rounds; r++) {
		struct tsemu_stats a = stats();
		double t0 = now_ms();
		if (d2d) {
			OK(rt.Memcpy(d2, d, sz, cudaMemcpyDeviceToDevice));
			OK(rt.DeviceSynchronize());
		} else {
			OK(rt.Memcpy(d, h, sz, cudaMemcpyHostToDevice));
		}
		double el = now_ms() - t0;
		struct tsemu_stats b = stats();
		CHECK(el >= lo && el <= hi, "64 MiB %s copy took %.1f ms, expected %.0f..%.0f", argv[0], el, lo, hi);
		if (d2d)
			EXPECT(b.d2d_bytes - a.d2d_bytes, sz);
		else
			EXPECT(b.h2d_bytes - a.h2d_bytes, sz);
		printf("round %d: %.1f ms\n", r + 1, el);
		if (r == 0 || el < best)
			best = el;
	}
	printf("ms=%.1f\n", best);
	OK(rt.Free(d));
	OK(rt.Free(d2));
	free(h);
}

/* Known copies, counted exactly; prints pid=N for the TSEMU_STATS line. */
static void t_stats(void)
{
	load();
	struct tsemu_stats a = stats(), b, c;
	void *d, *d2;
	char h[3000];
	memset(h, 7, sizeof h);
	OK(rt.Malloc(&d, 3000));
	OK(rt.Malloc(&d2, 3000));
	for (int i = 0; i < 3; i++)
		OK(rt.Memcpy(d, h, 1000, cudaMemcpyHostToDevice));
	OK(rt.Memcpy(h, d, 500, cudaMemcpyDeviceToHost));
	OK(rt.Memcpy(d2, d, 700, cudaMemcpyDeviceToDevice));
	OK(rt.Memset(d, 0, 300));
	OK(rt.Memcpy(h, h + 1000, 10, cudaMemcpyHostToHost));
	OK(rt.DeviceSynchronize());
	b = stats();
	rt.drv_stats(&c);
	CHECK(!memcmp(&b, &c, sizeof b), "libcudart's and libcuda's tsemu_stats agree");
	EXPECT(b.version, TSEMU_STATS_VERSION);
	EXPECT(b.h2d_bytes - a.h2d_bytes, 3000);
	EXPECT(b.h2d_calls - a.h2d_calls, 3);
	EXPECT(b.d2h_bytes - a.d2h_bytes, 500);
	EXPECT(b.d2h_calls - a.d2h_calls, 1);
	EXPECT(b.d2d_bytes - a.d2d_bytes, 700);
	EXPECT(b.h2h_bytes - a.h2h_bytes, 10);
	EXPECT(b.memset_bytes - a.memset_bytes, 300);
	EXPECT(b.allocs - a.allocs, 2);
	EXPECT(b.alloc_bytes - a.alloc_bytes, 6000);
	OK(rt.Free(d2));
	b = stats();
	EXPECT(b.frees - a.frees, 1);
	EXPECT(b.alloc_bytes - a.alloc_bytes, 3000);
	printf("pid=%d\n", (int)getpid());
}

/* ---- main ------------------------------------------------------------------------------------------- */

static const char *cmd;
static pid_t main_pid;
static int summarise; /* real mode: at exit, how many checks ran and were skipped */

static void summary(void)
{
	if (summarise) /* a forked child too: its count starts with the checks before the fork */
		fprintf(stderr, "%s%s: %s: %d checks run, %d skipped (test device only)\n", cmd,
			getpid() == main_pid ? "" : " (forked child)",
			rt.stats && rt.drv_stats ? "real mode on tsemu" : "real CUDA", checks, skipped);
}

/* A command with nothing to check here: exit 77. */
static void skip_command(const char *why)
{
	printf("skip: %s %s\n", cmd, why);
	fflush(stdout);
	summarise = 0;
	exit(77);
}

/* async-signal-safe: the decimal digits of v at p; their count */
static size_t put_uint(char *p, unsigned v)
{
	char d[12];
	size_t n = 0, i;
	do
		d[n++] = (char)('0' + v % 10);
	while ((v /= 10) && n < sizeof d);
	for (i = 0; i < n; i++)
		p[i] = d[n - 1 - i];
	return n;
}

/* Real mode: a call the real driver does not survive (a bad or destroyed
 * handle it need not catch) ends the command with a FAIL line that names
 * the last check before it. */
static void crashed(int sig)
{
	static const char a[] = "FAIL (after the check at line ", b[] = ") crashed, signal ";
	char msg[128];
	size_t n = 0;
	memcpy(msg, a, sizeof a - 1);
	n += sizeof a - 1;
	n += put_uint(msg + n, (unsigned)last_line);
	memcpy(msg + n, b, sizeof b - 1);
	n += sizeof b - 1;
	n += put_uint(msg + n, (unsigned)sig);
	msg[n++] = '\n';
	ssize_t w = write(STDERR_FILENO, msg, n);
	(void)w;
	signal(sig, SIG_DFL);
	raise(sig);
}

int main(int argc, char **argv)
{
	static char exe[4096];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
	self = n > 0 ? (exe[n] = 0, exe) : argv[0];
	if (argc < 2)
		die("usage: ts-cudaemu-check COMMAND [ARGS] (see the source)");
	cmd = argv[1];
	int ac = argc - 2;
	char **av = argv + 2;
	load();
	if (real) {
		/* what these check is tsemu's own machinery */
		const char *const emu_cmds[] = {"route", "deny", "stats", "bandwidth", "nodevice"};
		for (size_t i = 0; i < sizeof emu_cmds / sizeof emu_cmds[0]; i++)
			if (!strcmp(cmd, emu_cmds[i]))
				skip_command("needs the test device");
		main_pid = getpid();
		summarise = 1;
		atexit(summary);
		signal(SIGSEGV, crashed);
		signal(SIGBUS, crashed);
	}
	if (!strcmp(cmd, "basics"))
		t_basics();
	else if (!strcmp(cmd, "no-host-access"))
		t_no_host_access();
	else if (!strcmp(cmd, "nodevice"))
		t_nodevice();
	else if (!strcmp(cmd, "errors"))
		t_errors();
	else if (!strcmp(cmd, "getproc"))
		t_getproc();
	else if (!strcmp(cmd, "route"))
		t_route();
	else if (!strcmp(cmd, "deny"))
		t_deny();
	else if (!strcmp(cmd, "pinned"))
		t_pinned();
	else if (!strcmp(cmd, "fork"))
		t_fork();
	else if (!strcmp(cmd, "fork-clean"))
		t_fork_clean();
	else if (!strcmp(cmd, "peer")) {
		if (!t_peer())
			skip_command("needs 2 devices (one here)");
	}
	else if (!strcmp(cmd, "ipc-mem"))
		t_ipc_mem();
	else if (!strcmp(cmd, "ipc-mem-child"))
		t_ipc_mem_child(ac, av);
	else if (!strcmp(cmd, "ipc-event"))
		t_ipc_event();
	else if (!strcmp(cmd, "ipc-event-child"))
		t_ipc_event_child(ac, av);
	else if (!strcmp(cmd, "ipc-dead"))
		t_ipc_dead();
	else if (!strcmp(cmd, "ipc-dead-child"))
		t_ipc_dead_child(ac, av);
	else if (!strcmp(cmd, "ipc-exit"))
		t_ipc_gone(GONE_EXIT);
	else if (!strcmp(cmd, "ipc-reset"))
		t_ipc_gone(GONE_RESET);
	else if (!strcmp(cmd, "ipc-ctx-destroy"))
		t_ipc_gone(GONE_CTX_DESTROY);
	else if (!strcmp(cmd, "ctx-stack"))
		t_ctx_stack();
	else if (!strcmp(cmd, "ipc-exit-child"))
		t_ipc_exit_child(ac, av);
	else if (!strcmp(cmd, "stream-async"))
		t_stream_async();
	else if (!strcmp(cmd, "stream-order"))
		t_stream_order();
	else if (!strcmp(cmd, "capture"))
		t_capture();
	else if (!strcmp(cmd, "bandwidth"))
		t_bandwidth(ac, av);
	else if (!strcmp(cmd, "stats"))
		t_stats();
	else if (!strcmp(cmd, "quick")) {
		t_basics();
		t_errors();
		t_pinned();
		if (!t_peer())
			fprintf(stderr, "# quick: peer not run: one device\n");
		t_ipc_mem();
		t_capture();
	} else
		die("unknown command");
	if (fails)
		fprintf(stderr, "%s: %d check(s) failed\n", cmd, fails);
	return fails ? 1 : 0;
}
