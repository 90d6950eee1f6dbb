/* tsemu: the tsshim test device, runtime half (build/emu/libcudart.so.13).
 *
 * The CUDA 13 runtime API subset tsshim uses, on top of the emulated driver.
 * Like the real libcudart (since CUDA 11.3), it reaches the driver only
 * through cuGetProcAddress: it dlopen()s libcuda.so.1, looks up
 * cuGetProcAddress_v2 with dlsym() once, and takes every other driver entry
 * point from it (legacy-stream variants, and the per-thread ones for the
 * _ptds/_ptsz runtime entry points). It has no link-time reference to the
 * driver, so a shim that interposes the pointers cuGetProcAddress hands out
 * sees every driver call the runtime makes.
 *
 * Runtime semantics kept from the real one: lazy initialisation, the
 * calling thread's current device (default 0) bound to its primary context
 * on first use, cudaSetDevice, the per-thread last error (cudaGetLastError
 * returns and clears it, cudaPeekAtLastError does not; cudaErrorNotReady
 * is not recorded), cudaPointerGetAttributes returning
 * cudaMemoryTypeUnregistered without error for memory CUDA does not know,
 * and cudaMalloc(&p, 0) giving NULL.
 *
 * Linked with -Bsymbolic-functions, as the real one binds its calls into
 * itself: beside another libcudart.so.13 in the process (PyTorch 2 loads
 * one), cudaStreamCreate still calls this library's cudaStreamCreateWithFlags.
 *
 * Built with __CUDA_API_VERSION_INTERNAL so that cuda_runtime_api.h declares
 * both the legacy names and the _ptds/_ptsz ones with their exact
 * prototypes. */
#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "errors.h"
#include "tsemu.h"

#define API __attribute__((visibility("default")))
#define TLS __thread __attribute__((tls_model("global-dynamic")))
#define MAXDEV 16

#define X(cu, rt, msg) _Static_assert((int)(cu) == (int)(rt), #cu " and " #rt " differ");
TSEMU_ERRORS(X)
#undef X
_Static_assert(sizeof(cudaIpcMemHandle_t) == sizeof(CUipcMemHandle), "IPC handle sizes differ");
_Static_assert(sizeof(cudaIpcEventHandle_t) == sizeof(CUipcEventHandle), "IPC handle sizes differ");
_Static_assert((int)cudaDriverEntryPointSymbolNotFound == (int)CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND, "");
_Static_assert((int)cudaDriverEntryPointVersionNotSufficent == (int)CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT, "");

/* ---- the driver, as cuGetProcAddress hands it out ----------------------------------- */

#define F(name) __typeof__(name) *
static struct {
	F(cuGetProcAddress_v2) GetProcAddress;
	F(cuInit) Init;
	F(cuDriverGetVersion) DriverGetVersion;
	F(cuDeviceGetCount) DeviceGetCount;
	F(cuDeviceGetAttribute) DeviceGetAttribute;
	F(cuDeviceCanAccessPeer) DeviceCanAccessPeer;
	F(cuDevicePrimaryCtxRetain) DevicePrimaryCtxRetain;
	F(cuDevicePrimaryCtxReset) DevicePrimaryCtxReset;
	F(cuCtxGetCurrent) CtxGetCurrent;
	F(cuCtxSetCurrent) CtxSetCurrent;
	F(cuCtxGetDevice) CtxGetDevice;
	F(cuCtxSynchronize) CtxSynchronize;
	F(cuCtxEnablePeerAccess) CtxEnablePeerAccess;
	F(cuCtxDisablePeerAccess) CtxDisablePeerAccess;
	F(cuMemAlloc_v2) MemAlloc;
	F(cuMemFree_v2) MemFree;
	F(cuMemGetInfo_v2) MemGetInfo;
	F(cuMemHostAlloc) MemHostAlloc;
	F(cuMemFreeHost) MemFreeHost;
	F(cuMemHostRegister_v2) MemHostRegister;
	F(cuMemHostUnregister) MemHostUnregister;
	F(cuPointerGetAttribute) PointerGetAttribute;
	F(cuStreamCreate) StreamCreate;
	F(cuStreamDestroy_v2) StreamDestroy;
	F(cuEventCreate) EventCreate;
	F(cuEventSynchronize) EventSynchronize;
	F(cuEventQuery) EventQuery;
	F(cuEventDestroy_v2) EventDestroy;
	F(cuEventElapsedTime_v2) EventElapsedTime;
	F(cuIpcGetMemHandle) IpcGetMemHandle;
	F(cuIpcOpenMemHandle_v2) IpcOpenMemHandle;
	F(cuIpcCloseMemHandle) IpcCloseMemHandle;
	F(cuIpcGetEventHandle) IpcGetEventHandle;
	F(cuIpcOpenEventHandle) IpcOpenEventHandle;
	F(cuThreadExchangeStreamCaptureMode) ThreadExchangeStreamCaptureMode;
	F(cuGraphInstantiateWithFlags) GraphInstantiateWithFlags;
	F(cuGraphExecDestroy) GraphExecDestroy;
	F(cuGraphDestroy) GraphDestroy;
	/* [0]: legacy default stream, [1]: per-thread default stream */
	F(cuMemcpy) Memcpy[2];
	F(cuMemcpyAsync) MemcpyAsync[2];
	F(cuMemcpyHtoD_v2) MemcpyHtoD[2];
	F(cuMemcpyDtoH_v2) MemcpyDtoH[2];
	F(cuMemcpyDtoD_v2) MemcpyDtoD[2];
	F(cuMemcpyHtoDAsync_v2) MemcpyHtoDAsync[2];
	F(cuMemcpyDtoHAsync_v2) MemcpyDtoHAsync[2];
	F(cuMemcpyDtoDAsync_v2) MemcpyDtoDAsync[2];
	F(cuMemcpyPeer) MemcpyPeer[2];
	F(cuMemcpyPeerAsync) MemcpyPeerAsync[2];
	F(cuMemsetD8_v2) MemsetD8[2];
	F(cuMemsetD8Async) MemsetD8Async[2];
	F(cuStreamSynchronize) StreamSynchronize[2];
	F(cuStreamQuery) StreamQuery[2];
	F(cuStreamWaitEvent) StreamWaitEvent[2];
	F(cuLaunchHostFunc) LaunchHostFunc[2];
	F(cuEventRecord) EventRecord[2];
	F(cuStreamBeginCapture_v2) StreamBeginCapture[2];
	F(cuStreamEndCapture) StreamEndCapture[2];
	F(cuStreamIsCapturing) StreamIsCapturing[2];
	F(cuStreamGetCaptureInfo_v3) StreamGetCaptureInfo[2];
	F(cuGraphLaunch) GraphLaunch[2];
} D;
#undef F

#define E1(field, name) {name, (void **)&D.field, 0}
#define E2(field, name) {name, (void **)&D.field[0], 0}, {name, (void **)&D.field[1], 1}
static const struct {
	const char *name;
	void **slot;
	int ptds;
} entries[] = {
	E1(Init, "cuInit"),
	E1(DriverGetVersion, "cuDriverGetVersion"),
	E1(DeviceGetCount, "cuDeviceGetCount"),
	E1(DeviceGetAttribute, "cuDeviceGetAttribute"),
	E1(DeviceCanAccessPeer, "cuDeviceCanAccessPeer"),
	E1(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain"),
	E1(CtxGetCurrent, "cuCtxGetCurrent"),
	E1(CtxSetCurrent, "cuCtxSetCurrent"),
	E1(CtxEnablePeerAccess, "cuCtxEnablePeerAccess"),
	E1(CtxDisablePeerAccess, "cuCtxDisablePeerAccess"),
	E1(MemAlloc, "cuMemAlloc"),
	E1(MemFree, "cuMemFree"),
	E1(MemGetInfo, "cuMemGetInfo"),
	E1(MemHostAlloc, "cuMemHostAlloc"),
	E1(MemFreeHost, "cuMemFreeHost"),
	E1(MemHostRegister, "cuMemHostRegister"),
	E1(MemHostUnregister, "cuMemHostUnregister"),
	E1(PointerGetAttribute, "cuPointerGetAttribute"),
	E1(StreamCreate, "cuStreamCreate"),
	E1(StreamDestroy, "cuStreamDestroy"),
	E1(EventCreate, "cuEventCreate"),
	E1(EventSynchronize, "cuEventSynchronize"),
	E1(EventQuery, "cuEventQuery"),
	E1(EventDestroy, "cuEventDestroy"),
	E1(EventElapsedTime, "cuEventElapsedTime"),
	E1(IpcGetMemHandle, "cuIpcGetMemHandle"),
	E1(IpcOpenMemHandle, "cuIpcOpenMemHandle"),
	E1(IpcCloseMemHandle, "cuIpcCloseMemHandle"),
	E1(IpcGetEventHandle, "cuIpcGetEventHandle"),
	E1(IpcOpenEventHandle, "cuIpcOpenEventHandle"),
	E1(ThreadExchangeStreamCaptureMode, "cuThreadExchangeStreamCaptureMode"),
	E1(GraphInstantiateWithFlags, "cuGraphInstantiateWithFlags"),
	E1(GraphExecDestroy, "cuGraphExecDestroy"),
	E1(GraphDestroy, "cuGraphDestroy"),
	E2(Memcpy, "cuMemcpy"),
	E2(MemcpyAsync, "cuMemcpyAsync"),
	E2(MemcpyHtoD, "cuMemcpyHtoD"),
	E2(MemcpyDtoH, "cuMemcpyDtoH"),
	E2(MemcpyDtoD, "cuMemcpyDtoD"),
	E2(MemcpyHtoDAsync, "cuMemcpyHtoDAsync"),
	E2(MemcpyDtoHAsync, "cuMemcpyDtoHAsync"),
	E2(MemcpyDtoDAsync, "cuMemcpyDtoDAsync"),
	E2(MemcpyPeer, "cuMemcpyPeer"),
	E2(MemcpyPeerAsync, "cuMemcpyPeerAsync"),
	E2(MemsetD8, "cuMemsetD8"),
	E2(MemsetD8Async, "cuMemsetD8Async"),
	E2(StreamSynchronize, "cuStreamSynchronize"),
	E2(StreamQuery, "cuStreamQuery"),
	E2(StreamWaitEvent, "cuStreamWaitEvent"),
	E2(LaunchHostFunc, "cuLaunchHostFunc"),
	E2(EventRecord, "cuEventRecord"),
	E2(StreamBeginCapture, "cuStreamBeginCapture"),
	E2(StreamEndCapture, "cuStreamEndCapture"),
	E2(StreamIsCapturing, "cuStreamIsCapturing"),
	E2(StreamGetCaptureInfo, "cuStreamGetCaptureInfo"),
	E2(GraphLaunch, "cuGraphLaunch"),
};

/* cuCtxGetDevice and cuCtxSynchronize got new versions (taking a context)
 * in CUDA 13: the runtime asks for the 2000 ones, whose prototypes it uses. */
static const struct {
	const char *name;
	void **slot;
	int version;
} old_entries[] = {
	{"cuCtxGetDevice", (void **)&D.CtxGetDevice, 2000},
	{"cuCtxSynchronize", (void **)&D.CtxSynchronize, 2000},
	/* the real libcudart 13 asks for this one at 7000 too (its v1) */
	{"cuDevicePrimaryCtxReset", (void **)&D.DevicePrimaryCtxReset, 7000},
};

static struct {
	pthread_once_t once;
	cudaError_t load_err;
	void *lib;
	int ndev;
	pthread_mutex_t mu;
	CUcontext pctx[MAXDEV]; /* primary contexts retained by the runtime */
} R = {.once = PTHREAD_ONCE_INIT, .mu = PTHREAD_MUTEX_INITIALIZER};

static TLS cudaError_t tls_last; /* cudaGetLastError */
static TLS int tls_dev;          /* cudaSetDevice; 0 by default */

static cudaError_t cu2rt(CUresult r)
{
	return (cudaError_t)r; /* same numbers: see errors.h */
}

/* Record a failure as the thread's last error, and return it. */
static cudaError_t ret(cudaError_t e)
{
	if (e != cudaSuccess && e != cudaErrorNotReady)
		tls_last = e;
	return e;
}

#define RET(cuexpr) return ret(cu2rt(cuexpr))

static void rt_load(void)
{
	R.load_err = cudaErrorInsufficientDriver;
	R.lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
	if (!R.lib)
		return;
	*(void **)&D.GetProcAddress = dlsym(R.lib, "cuGetProcAddress_v2");
	if (!D.GetProcAddress)
		return;
	for (size_t i = 0; i < sizeof entries / sizeof entries[0]; i++) {
		cuuint64_t fl = entries[i].ptds ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
						: CU_GET_PROC_ADDRESS_LEGACY_STREAM;
		CUdriverProcAddressQueryResult st;
		if (D.GetProcAddress(entries[i].name, entries[i].slot, CUDART_VERSION, fl, &st) != CUDA_SUCCESS ||
		    !*entries[i].slot)
			return;
	}
	for (size_t i = 0; i < sizeof old_entries / sizeof old_entries[0]; i++)
		if (D.GetProcAddress(old_entries[i].name, old_entries[i].slot, old_entries[i].version,
				     CU_GET_PROC_ADDRESS_LEGACY_STREAM, NULL) != CUDA_SUCCESS ||
		    !*old_entries[i].slot)
			return;
	int v = 0;
	if (D.DriverGetVersion(&v) != CUDA_SUCCESS || v < CUDART_VERSION)
		return;
	CUresult r = D.Init(0);
	if (r == CUDA_SUCCESS)
		r = D.DeviceGetCount(&R.ndev);
	R.load_err = cu2rt(r);
	if (R.ndev > MAXDEV)
		R.ndev = MAXDEV;
}

/* The driver is there and initialised. */
static cudaError_t rt_init(void)
{
	pthread_once(&R.once, rt_load);
	return R.load_err;
}

static cudaError_t primary(int dev, CUcontext *out)
{
	if (dev < 0 || dev >= R.ndev)
		return cudaErrorInvalidDevice;
	pthread_mutex_lock(&R.mu);
	CUresult r = CUDA_SUCCESS;
	if (!R.pctx[dev])
		r = D.DevicePrimaryCtxRetain(&R.pctx[dev], dev);
	*out = R.pctx[dev];
	pthread_mutex_unlock(&R.mu);
	return cu2rt(r);
}

/* Initialised, and the calling thread has a current context: the one the
 * driver API made current, else the primary context of its device. */
static cudaError_t rt_begin(void)
{
	cudaError_t e = rt_init();
	if (e != cudaSuccess)
		return e;
	CUcontext c;
	CUresult r = D.CtxGetCurrent(&c);
	if (r != CUDA_SUCCESS)
		return cu2rt(r);
	if (c)
		return cudaSuccess;
	if ((e = primary(tls_dev, &c)) != cudaSuccess)
		return e;
	return cu2rt(D.CtxSetCurrent(c));
}

#define BEGIN()                                       \
	do {                                          \
		cudaError_t e_ = rt_begin();          \
		if (e_ != cudaSuccess)                \
			return ret(e_);               \
	} while (0)

#define INIT()                                        \
	do {                                          \
		cudaError_t e_ = rt_init();           \
		if (e_ != cudaSuccess)                \
			return ret(e_);               \
	} while (0)

/* ---- errors, versions ----------------------------------------------------------------- */

API cudaError_t cudaGetLastError(void)
{
	cudaError_t e = tls_last;
	tls_last = cudaSuccess;
	return e;
}

API cudaError_t cudaPeekAtLastError(void)
{
	return tls_last;
}

API const char *cudaGetErrorString(cudaError_t error)
{
	switch (error) {
#define X(cu, rt, msg) \
	case rt: return msg;
		TSEMU_ERRORS(X)
#undef X
#define X(rt, msg) \
	case rt: return msg;
		TSEMU_RT_ERRORS(X)
#undef X
	default: return "unrecognized error code";
	}
}

API const char *cudaGetErrorName(cudaError_t error)
{
	switch (error) {
#define X(cu, rt, msg) \
	case rt: return #rt;
		TSEMU_ERRORS(X)
#undef X
#define X(rt, msg) \
	case rt: return #rt;
		TSEMU_RT_ERRORS(X)
#undef X
	default: return "unrecognized error code";
	}
}

API cudaError_t cudaRuntimeGetVersion(int *runtimeVersion)
{
	if (!runtimeVersion)
		return ret(cudaErrorInvalidValue);
	*runtimeVersion = CUDART_VERSION;
	return cudaSuccess;
}

/* 0 when there is no driver, as documented. */
API cudaError_t cudaDriverGetVersion(int *driverVersion)
{
	if (!driverVersion)
		return ret(cudaErrorInvalidValue);
	pthread_once(&R.once, rt_load);
	*driverVersion = 0;
	if (D.DriverGetVersion)
		RET(D.DriverGetVersion(driverVersion));
	return cudaSuccess;
}

/* ---- devices ---------------------------------------------------------------------------- */

API cudaError_t cudaGetDeviceCount(int *count)
{
	if (!count)
		return ret(cudaErrorInvalidValue);
	*count = 0;
	INIT();
	int n = 0;
	CUresult r = D.DeviceGetCount(&n); /* fails in a child forked after initialisation */
	if (r == CUDA_SUCCESS)
		*count = n;
	RET(r);
}

API cudaError_t cudaSetDevice(int device)
{
	INIT();
	CUcontext c;
	cudaError_t e = primary(device, &c);
	if (e != cudaSuccess)
		return ret(e);
	CUresult r = D.CtxSetCurrent(c);
	if (r == CUDA_SUCCESS)
		tls_dev = device;
	RET(r);
}

API cudaError_t cudaGetDevice(int *device)
{
	if (!device)
		return ret(cudaErrorInvalidValue);
	INIT();
	CUcontext c;
	CUresult r = D.CtxGetCurrent(&c);
	if (r != CUDA_SUCCESS)
		RET(r);
	if (!c) {
		*device = tls_dev;
		return cudaSuccess;
	}
	RET(D.CtxGetDevice(device));
}

/* The current device's primary context is destroyed, everything in it with
 * it; the runtime's retain stays, so the next call brings it back, empty. */
API cudaError_t cudaDeviceReset(void)
{
	INIT();
	int dev = tls_dev;
	CUcontext c;
	CUresult r = D.CtxGetCurrent(&c);
	if (r == CUDA_SUCCESS && c)
		r = D.CtxGetDevice(&dev);
	if (r != CUDA_SUCCESS)
		RET(r);
	RET(D.DevicePrimaryCtxReset(dev));
}

API cudaError_t cudaDeviceSynchronize(void)
{
	BEGIN();
	RET(D.CtxSynchronize());
}

API cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device)
{
	INIT();
	if (device < 0 || device >= R.ndev)
		return ret(cudaErrorInvalidDevice);
	RET(D.DeviceGetAttribute(value, (CUdevice_attribute)attr, device));
}

API cudaError_t cudaDeviceCanAccessPeer(int *canAccessPeer, int device, int peerDevice)
{
	if (!canAccessPeer)
		return ret(cudaErrorInvalidValue);
	INIT();
	if (device < 0 || device >= R.ndev || peerDevice < 0 || peerDevice >= R.ndev)
		return ret(cudaErrorInvalidDevice);
	RET(D.DeviceCanAccessPeer(canAccessPeer, device, peerDevice));
}

API cudaError_t cudaDeviceEnablePeerAccess(int peerDevice, unsigned int flags)
{
	BEGIN();
	if (flags != 0)
		return ret(cudaErrorInvalidValue);
	CUcontext p;
	cudaError_t e = primary(peerDevice, &p);
	if (e != cudaSuccess)
		return ret(e);
	RET(D.CtxEnablePeerAccess(p, 0));
}

API cudaError_t cudaDeviceDisablePeerAccess(int peerDevice)
{
	BEGIN();
	CUcontext p;
	cudaError_t e = primary(peerDevice, &p);
	if (e != cudaSuccess)
		return ret(e);
	RET(D.CtxDisablePeerAccess(p));
}

/* ---- memory ---------------------------------------------------------------------------- */

API cudaError_t cudaMalloc(void **devPtr, size_t size)
{
	if (!devPtr)
		return ret(cudaErrorInvalidValue);
	BEGIN();
	if (size == 0) {
		*devPtr = NULL;
		return cudaSuccess;
	}
	CUdeviceptr d;
	CUresult r = D.MemAlloc(&d, size);
	if (r == CUDA_SUCCESS)
		*devPtr = (void *)(uintptr_t)d;
	RET(r);
}

API cudaError_t cudaFree(void *devPtr)
{
	BEGIN();
	if (!devPtr)
		return cudaSuccess;
	RET(D.MemFree((CUdeviceptr)(uintptr_t)devPtr));
}

API cudaError_t cudaMemGetInfo(size_t *free_, size_t *total)
{
	BEGIN();
	RET(D.MemGetInfo(free_, total));
}

API cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags)
{
	BEGIN();
	RET(D.MemHostAlloc(pHost, size, flags)); /* cudaHostAlloc* flags are CU_MEMHOSTALLOC_* */
}

API cudaError_t cudaMallocHost(void **ptr, size_t size)
{
	BEGIN();
	RET(D.MemHostAlloc(ptr, size, 0));
}

API cudaError_t cudaFreeHost(void *ptr)
{
	BEGIN();
	if (!ptr)
		return cudaSuccess;
	RET(D.MemFreeHost(ptr));
}

API cudaError_t cudaHostRegister(void *ptr, size_t size, unsigned int flags)
{
	BEGIN();
	RET(D.MemHostRegister(ptr, size, flags)); /* cudaHostRegister* flags are CU_MEMHOSTREGISTER_* */
}

API cudaError_t cudaHostUnregister(void *ptr)
{
	BEGIN();
	RET(D.MemHostUnregister(ptr));
}

/* Memory CUDA does not know is cudaMemoryTypeUnregistered, without error
 * (CUDA 11 and later); its device is reported as -2 and both pointers as
 * NULL (assumed). */
API cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attributes, const void *ptr)
{
	if (!attributes)
		return ret(cudaErrorInvalidValue);
	INIT();
	memset(attributes, 0, sizeof *attributes);
	CUdeviceptr p = (CUdeviceptr)(uintptr_t)ptr;
	unsigned int type = 0;
	CUresult r = ptr ? D.PointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p) : CUDA_ERROR_INVALID_VALUE;
	if (r == CUDA_ERROR_INVALID_VALUE) {
		attributes->type = cudaMemoryTypeUnregistered;
		attributes->device = -2;
		return cudaSuccess;
	}
	if (r != CUDA_SUCCESS)
		RET(r);
	int dev = 0;
	CUdeviceptr dp = 0;
	void *hp = NULL;
	if ((r = D.PointerGetAttribute(&dev, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p)) != CUDA_SUCCESS ||
	    (r = D.PointerGetAttribute(&dp, CU_POINTER_ATTRIBUTE_DEVICE_POINTER, p)) != CUDA_SUCCESS)
		RET(r);
	if (type == CU_MEMORYTYPE_HOST && (r = D.PointerGetAttribute(&hp, CU_POINTER_ATTRIBUTE_HOST_POINTER, p)))
		RET(r);
	attributes->type = type == CU_MEMORYTYPE_DEVICE ? cudaMemoryTypeDevice : cudaMemoryTypeHost;
	attributes->device = dev;
	attributes->devicePointer = (void *)(uintptr_t)dp;
	attributes->hostPointer = hp;
	return cudaSuccess;
}

/* ---- copies ------------------------------------------------------------------------------- */

#define DP(p) ((CUdeviceptr)(uintptr_t)(p))

static cudaError_t memcpy_rt(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind, cudaStream_t s,
			     int async, int pt)
{
	BEGIN();
	CUresult r;
	switch (kind) {
	case cudaMemcpyHostToDevice:
		r = async ? D.MemcpyHtoDAsync[pt](DP(dst), src, count, s) : D.MemcpyHtoD[pt](DP(dst), src, count);
		break;
	case cudaMemcpyDeviceToHost:
		r = async ? D.MemcpyDtoHAsync[pt](dst, DP(src), count, s) : D.MemcpyDtoH[pt](dst, DP(src), count);
		break;
	case cudaMemcpyDeviceToDevice:
		r = async ? D.MemcpyDtoDAsync[pt](DP(dst), DP(src), count, s)
			  : D.MemcpyDtoD[pt](DP(dst), DP(src), count);
		break;
	case cudaMemcpyHostToHost:
	case cudaMemcpyDefault:
		r = async ? D.MemcpyAsync[pt](DP(dst), DP(src), count, s) : D.Memcpy[pt](DP(dst), DP(src), count);
		break;
	default:
		return ret(cudaErrorInvalidMemcpyDirection);
	}
	RET(r);
}

API cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind)
{
	return memcpy_rt(dst, src, count, kind, NULL, 0, 0);
}

API cudaError_t cudaMemcpy_ptds(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind)
{
	return memcpy_rt(dst, src, count, kind, NULL, 0, 1);
}

API cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
				cudaStream_t stream)
{
	return memcpy_rt(dst, src, count, kind, stream, 1, 0);
}

API cudaError_t cudaMemcpyAsync_ptsz(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
				     cudaStream_t stream)
{
	return memcpy_rt(dst, src, count, kind, stream, 1, 1);
}

static cudaError_t peer_rt(void *dst, int dstDevice, const void *src, int srcDevice, size_t count, cudaStream_t s,
			   int async)
{
	BEGIN();
	CUcontext dc, sc;
	cudaError_t e = primary(dstDevice, &dc);
	if (e == cudaSuccess)
		e = primary(srcDevice, &sc);
	if (e != cudaSuccess)
		return ret(e);
	RET(async ? D.MemcpyPeerAsync[0](DP(dst), dc, DP(src), sc, count, s)
		  : D.MemcpyPeer[0](DP(dst), dc, DP(src), sc, count));
}

API cudaError_t cudaMemcpyPeer(void *dst, int dstDevice, const void *src, int srcDevice, size_t count)
{
	return peer_rt(dst, dstDevice, src, srcDevice, count, NULL, 0);
}

API cudaError_t cudaMemcpyPeerAsync(void *dst, int dstDevice, const void *src, int srcDevice, size_t count,
				    cudaStream_t stream)
{
	return peer_rt(dst, dstDevice, src, srcDevice, count, stream, 1);
}

API cudaError_t cudaMemset(void *devPtr, int value, size_t count)
{
	BEGIN();
	RET(D.MemsetD8[0](DP(devPtr), (unsigned char)value, count));
}

API cudaError_t cudaMemset_ptds(void *devPtr, int value, size_t count)
{
	BEGIN();
	RET(D.MemsetD8[1](DP(devPtr), (unsigned char)value, count));
}

API cudaError_t cudaMemsetAsync(void *devPtr, int value, size_t count, cudaStream_t stream)
{
	BEGIN();
	RET(D.MemsetD8Async[0](DP(devPtr), (unsigned char)value, count, stream));
}

API cudaError_t cudaMemsetAsync_ptsz(void *devPtr, int value, size_t count, cudaStream_t stream)
{
	BEGIN();
	RET(D.MemsetD8Async[1](DP(devPtr), (unsigned char)value, count, stream));
}

/* ---- streams and events -------------------------------------------------------------------- */

API cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags)
{
	BEGIN();
	RET(D.StreamCreate(pStream, flags)); /* cudaStreamNonBlocking == CU_STREAM_NON_BLOCKING */
}

API cudaError_t cudaStreamCreate(cudaStream_t *pStream)
{
	return cudaStreamCreateWithFlags(pStream, cudaStreamDefault);
}

API cudaError_t cudaStreamDestroy(cudaStream_t stream)
{
	BEGIN();
	RET(D.StreamDestroy(stream));
}

API cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
	BEGIN();
	RET(D.StreamSynchronize[0](stream));
}

API cudaError_t cudaStreamSynchronize_ptsz(cudaStream_t stream)
{
	BEGIN();
	RET(D.StreamSynchronize[1](stream));
}

API cudaError_t cudaStreamQuery(cudaStream_t stream)
{
	BEGIN();
	RET(D.StreamQuery[0](stream));
}

API cudaError_t cudaStreamQuery_ptsz(cudaStream_t stream)
{
	BEGIN();
	RET(D.StreamQuery[1](stream));
}

API cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags)
{
	BEGIN();
	RET(D.StreamWaitEvent[0](stream, event, flags));
}

API cudaError_t cudaStreamWaitEvent_ptsz(cudaStream_t stream, cudaEvent_t event, unsigned int flags)
{
	BEGIN();
	RET(D.StreamWaitEvent[1](stream, event, flags));
}

API cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void *userData)
{
	BEGIN();
	RET(D.LaunchHostFunc[0](stream, fn, userData));
}

API cudaError_t cudaLaunchHostFunc_ptsz(cudaStream_t stream, cudaHostFn_t fn, void *userData)
{
	BEGIN();
	RET(D.LaunchHostFunc[1](stream, fn, userData));
}

API cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags)
{
	BEGIN();
	RET(D.EventCreate(event, flags)); /* cudaEvent* flags are CU_EVENT_* */
}

API cudaError_t cudaEventCreate(cudaEvent_t *event)
{
	return cudaEventCreateWithFlags(event, cudaEventDefault);
}

API cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
	BEGIN();
	RET(D.EventRecord[0](event, stream));
}

API cudaError_t cudaEventRecord_ptsz(cudaEvent_t event, cudaStream_t stream)
{
	BEGIN();
	RET(D.EventRecord[1](event, stream));
}

API cudaError_t cudaEventSynchronize(cudaEvent_t event)
{
	BEGIN();
	RET(D.EventSynchronize(event));
}

API cudaError_t cudaEventQuery(cudaEvent_t event)
{
	BEGIN();
	RET(D.EventQuery(event));
}

API cudaError_t cudaEventDestroy(cudaEvent_t event)
{
	BEGIN();
	RET(D.EventDestroy(event));
}

API cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end)
{
	BEGIN();
	RET(D.EventElapsedTime(ms, start, end));
}

/* ---- stream capture and graphs ---------------------------------------------------------------- */

/* (cudaStreamCaptureMode, cudaStreamCaptureStatus and the graph handles are the driver's, by value.) */
API cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode)
{
	BEGIN();
	RET(D.StreamBeginCapture[0](stream, (CUstreamCaptureMode)mode));
}

API cudaError_t cudaStreamBeginCapture_ptsz(cudaStream_t stream, enum cudaStreamCaptureMode mode)
{
	BEGIN();
	RET(D.StreamBeginCapture[1](stream, (CUstreamCaptureMode)mode));
}

API cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *pGraph)
{
	BEGIN();
	RET(D.StreamEndCapture[0](stream, pGraph));
}

API cudaError_t cudaStreamEndCapture_ptsz(cudaStream_t stream, cudaGraph_t *pGraph)
{
	BEGIN();
	RET(D.StreamEndCapture[1](stream, pGraph));
}

API cudaError_t cudaStreamIsCapturing(cudaStream_t stream, enum cudaStreamCaptureStatus *pCaptureStatus)
{
	BEGIN();
	RET(D.StreamIsCapturing[0](stream, (CUstreamCaptureStatus *)pCaptureStatus));
}

API cudaError_t cudaStreamIsCapturing_ptsz(cudaStream_t stream, enum cudaStreamCaptureStatus *pCaptureStatus)
{
	BEGIN();
	RET(D.StreamIsCapturing[1](stream, (CUstreamCaptureStatus *)pCaptureStatus));
}

static cudaError_t capture_info_rt(cudaStream_t stream, enum cudaStreamCaptureStatus *status, unsigned long long *id,
				   cudaGraph_t *graph, const cudaGraphNode_t **deps, const cudaGraphEdgeData **edges,
				   size_t *ndeps, int pt)
{
	BEGIN();
	RET(D.StreamGetCaptureInfo[pt](stream, (CUstreamCaptureStatus *)status, (cuuint64_t *)id, graph, deps,
				      (const CUgraphEdgeData **)edges, ndeps));
}

API cudaError_t cudaStreamGetCaptureInfo(cudaStream_t stream, enum cudaStreamCaptureStatus *captureStatus_out,
					 unsigned long long *id_out, cudaGraph_t *graph_out,
					 const cudaGraphNode_t **dependencies_out, const cudaGraphEdgeData **edgeData_out,
					 size_t *numDependencies_out)
{
	return capture_info_rt(stream, captureStatus_out, id_out, graph_out, dependencies_out, edgeData_out,
			       numDependencies_out, 0);
}

API cudaError_t cudaStreamGetCaptureInfo_ptsz(cudaStream_t stream, enum cudaStreamCaptureStatus *captureStatus_out,
					      unsigned long long *id_out, cudaGraph_t *graph_out,
					      const cudaGraphNode_t **dependencies_out,
					      const cudaGraphEdgeData **edgeData_out, size_t *numDependencies_out)
{
	return capture_info_rt(stream, captureStatus_out, id_out, graph_out, dependencies_out, edgeData_out,
			       numDependencies_out, 1);
}

API cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode *mode)
{
	INIT();
	RET(D.ThreadExchangeStreamCaptureMode((CUstreamCaptureMode *)mode));
}

API cudaError_t cudaGraphInstantiate(cudaGraphExec_t *pGraphExec, cudaGraph_t graph, unsigned long long flags)
{
	BEGIN();
	RET(D.GraphInstantiateWithFlags(pGraphExec, graph, flags)); /* cudaGraphInstantiateFlag* are CUDA_GRAPH_INSTANTIATE_FLAG_* */
}

API cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t *pGraphExec, cudaGraph_t graph, unsigned long long flags)
{
	BEGIN();
	RET(D.GraphInstantiateWithFlags(pGraphExec, graph, flags));
}

API cudaError_t cudaGraphLaunch(cudaGraphExec_t graphExec, cudaStream_t stream)
{
	BEGIN();
	RET(D.GraphLaunch[0](graphExec, stream));
}

API cudaError_t cudaGraphLaunch_ptsz(cudaGraphExec_t graphExec, cudaStream_t stream)
{
	BEGIN();
	RET(D.GraphLaunch[1](graphExec, stream));
}

API cudaError_t cudaGraphExecDestroy(cudaGraphExec_t graphExec)
{
	BEGIN();
	RET(D.GraphExecDestroy(graphExec));
}

API cudaError_t cudaGraphDestroy(cudaGraph_t graph)
{
	BEGIN();
	RET(D.GraphDestroy(graph));
}

/* ---- IPC ----------------------------------------------------------------------------------- */

API cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *handle, void *devPtr)
{
	BEGIN();
	if (!handle)
		return ret(cudaErrorInvalidValue);
	CUipcMemHandle h;
	CUresult r = D.IpcGetMemHandle(&h, DP(devPtr));
	if (r == CUDA_SUCCESS)
		memcpy(handle, &h, sizeof h);
	RET(r);
}

API cudaError_t cudaIpcOpenMemHandle(void **devPtr, cudaIpcMemHandle_t handle, unsigned int flags)
{
	BEGIN();
	if (!devPtr)
		return ret(cudaErrorInvalidValue);
	CUipcMemHandle h;
	memcpy(&h, &handle, sizeof h);
	CUdeviceptr d;
	CUresult r = D.IpcOpenMemHandle(&d, h, flags);
	if (r == CUDA_SUCCESS)
		*devPtr = (void *)(uintptr_t)d;
	RET(r);
}

API cudaError_t cudaIpcCloseMemHandle(void *devPtr)
{
	BEGIN();
	RET(D.IpcCloseMemHandle(DP(devPtr)));
}

API cudaError_t cudaIpcGetEventHandle(cudaIpcEventHandle_t *handle, cudaEvent_t event)
{
	BEGIN();
	if (!handle)
		return ret(cudaErrorInvalidValue);
	CUipcEventHandle h;
	CUresult r = D.IpcGetEventHandle(&h, event);
	if (r == CUDA_SUCCESS)
		memcpy(handle, &h, sizeof h);
	RET(r);
}

API cudaError_t cudaIpcOpenEventHandle(cudaEvent_t *event, cudaIpcEventHandle_t handle)
{
	BEGIN();
	CUipcEventHandle h;
	memcpy(&h, &handle, sizeof h);
	RET(D.IpcOpenEventHandle(event, h));
}

/* ---- driver entry points -------------------------------------------------------------------- */

static cudaError_t entry_rt(const char *symbol, void **funcPtr, unsigned int cudaVersion, unsigned long long flags,
			    enum cudaDriverEntryPointQueryResult *driverStatus, int pt)
{
	INIT();
	if (flags & ~(unsigned long long)(cudaEnableLegacyStream | cudaEnablePerThreadDefaultStream))
		return ret(cudaErrorInvalidValue);
	cuuint64_t fl = flags == cudaEnableDefault
				? (pt ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : CU_GET_PROC_ADDRESS_LEGACY_STREAM)
				: (cuuint64_t)flags;
	CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
	CUresult r = D.GetProcAddress(symbol, funcPtr, (int)cudaVersion, fl, &st);
	if (r == CUDA_SUCCESS && driverStatus)
		*driverStatus = (enum cudaDriverEntryPointQueryResult)st;
	RET(r);
}

API cudaError_t cudaGetDriverEntryPoint(const char *symbol, void **funcPtr, unsigned long long flags,
					enum cudaDriverEntryPointQueryResult *driverStatus)
{
	return entry_rt(symbol, funcPtr, CUDART_VERSION, flags, driverStatus, 0);
}

API cudaError_t cudaGetDriverEntryPoint_ptsz(const char *symbol, void **funcPtr, unsigned long long flags,
					     enum cudaDriverEntryPointQueryResult *driverStatus)
{
	return entry_rt(symbol, funcPtr, CUDART_VERSION, flags, driverStatus, 1);
}

API cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **funcPtr, unsigned int cudaVersion,
						 unsigned long long flags,
						 enum cudaDriverEntryPointQueryResult *driverStatus)
{
	return entry_rt(symbol, funcPtr, cudaVersion, flags, driverStatus, 0);
}

API cudaError_t cudaGetDriverEntryPointByVersion_ptsz(const char *symbol, void **funcPtr, unsigned int cudaVersion,
						      unsigned long long flags,
						      enum cudaDriverEntryPointQueryResult *driverStatus)
{
	return entry_rt(symbol, funcPtr, cudaVersion, flags, driverStatus, 1);
}

/* ---- the emulator's counters, from the driver ------------------------------------------------ */

API int tsemu_stats(struct tsemu_stats *out)
{
	pthread_once(&R.once, rt_load);
	int (*f)(struct tsemu_stats *) = NULL;
	if (R.lib)
		*(void **)&f = dlsym(R.lib, "tsemu_stats");
	return f ? f(out) : -1;
}

/* dlclose at exit is not needed: the driver tears itself down. */
