/* SPDX-License-Identifier: MIT */
/*
 * CUDA interposition: host copies, on every road a program takes to them.
 *
 *  - Runtime API (cudaMemcpy, cudaMemcpyAsync and their per-thread-stream
 *    variants cudaMemcpy_ptds, cudaMemcpyAsync_ptsz): exported here, for
 *    programs linked against libcudart, and handed out by dlsym, for
 *    programs that dlopen() it (PyTorch's lazy loading, tsshim-train).
 *  - Driver API (cuMemcpyHtoD_v2, cuMemcpyHtoDAsync_v2, cuMemcpy,
 *    cuMemcpyAsync and their _ptds/_ptsz variants): exported, handed out by
 *    dlsym, and handed out by cuGetProcAddress/_v2, which is how libcudart
 *    (since CUDA 11.3) and cudaGetDriverEntryPoint reach the driver. Both
 *    cuGetProcAddress entry points are hooked the same three ways.
 *  - cuCtxEnablePeerAccess and cuCtxDisablePeerAccess, the same three ways,
 *    only for what they answer: gpu.c's mappings of another device's ring
 *    buffers enable peer access as a side effect the program must not see.
 *  - cuDevicePrimaryCtxReset and cuDevicePrimaryCtxRelease (v1 and _v2),
 *    the same three ways: a primary context may go with them (the runtime's
 *    cudaDeviceReset calls the v1 reset), and GPU ring buffers with it, so
 *    gpu.c drains what lives there first (ts_gpu_ctx_going); and cuCtxDestroy
 *    (v1 and _v2) of a context the program made, in which our buffers are
 *    made when it uploads there.
 *
 * Mapped by the real pointer. A wrapper is a fixed function bound to one
 * real function pointer: per signature ("kind") a static table of NSLOT
 * slots, slot i's wrapper calls exactly slot i's pointer. A lookup (dlsym,
 * cuGetProcAddress) that yields a real copy function claims the slot holding
 * that pointer (or a free one, with one compare-and-swap) and returns the
 * slot's wrapper. Which pointers are copy functions is learnt from the
 * driver itself: the first time a cuGetProcAddress is used, we ask it for
 * the legacy and per-thread variants of each hooked function at the oldest
 * version that has today's signature; whatever it returns later for any
 * name, version or flags is wrapped only if it is one of those pointers.
 * Anything else (a newer variant with another signature, every other entry
 * point) is returned untouched. No code is generated; reads are lock-free.
 *
 * One copy, handled once. A runtime copy reaches the driver through our
 * cuGetProcAddress wrappers; a driver whose own table is bound by the
 * dynamic linker even hands out our exported symbols (the real one and
 * tsemu bind theirs at link time; build/tests/cudainterp has a tsemu that
 * does not, for cuda_hooks.sh). A thread-local
 * depth guard, taken around the real call of a handled copy, makes every
 * nested copy hook pass straight through.
 *
 * Pass-through. With TSSHIM_MODE=off (or an invalid setting) dlsym and
 * cuGetProcAddress return the real pointers and the exported hooks call the
 * real functions at once; before the shim is ready, after exit has begun,
 * in a forked child and inside another hook, copies are not looked at.
 * errno is kept. The shim never loads CUDA: it only looks up what the
 * process has already loaded (dlopen with RTLD_NOLOAD).
 *
 * dlsym. Our dlsym is a small x86-64 assembly entry: glibc resolves RTLD_NEXT
 * (and the dependency bookkeeping of RTLD_DEFAULT) from dlsym's return
 * address, so every lookup we do not handle is *jumped* to the real dlsym
 * with the caller's return address intact. Only the hooked names (a few
 * "cu" strings, checked first) take the C path.
 *
 * dlclose is interposed only to be counted: which object calls an export
 * decides what the export forwards to, and a thread remembers its callers'
 * address ranges until an object is unloaded.
 */
#define __CUDA_API_VERSION_INTERNAL 1 /* legacy and _ptds/_ptsz prototypes, like the headers' own build */
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "cuda_hooks.h"
#include "log.h"
#include "native.h"
#include "real.h"
#include "shim.h"
#include "stream.h"

#define TS_EXPORT __attribute__((visibility("default")))
#define CALLER() __builtin_return_address(0)
/* For what the dlsym entry runs on every lookup: ASan's start-up resolves its
 * interceptors with dlsym before its shadow memory exists. */
#define TS_UNINSTRUMENTED __attribute__((no_sanitize_address, no_sanitize_undefined, noinline))


/* ---- kinds (signatures) and the names that have them ------------------------ */

/*
 * A kind is a signature and, for copies, what stream handle 0 means: the
 * legacy default stream, or (the _ptds/_ptsz variants, which a program
 * built with --default-stream per-thread calls) the calling thread's
 * per-thread default stream. Our own copies beside a caller's go on the
 * stream it means, or its cudaStreamSynchronize(0) would not cover them.
 */
enum kind {
	K_RT_MEMCPY,           /* cudaError_t (void *, const void *, size_t, cudaMemcpyKind) */
	K_RT_MEMCPY_ASYNC,     /* ... cudaStream_t */
	K_DRV_HTOD,            /* CUresult (CUdeviceptr, const void *, size_t) */
	K_DRV_HTOD_ASYNC,      /* ... CUstream */
	K_DRV_MEMCPY,          /* CUresult (CUdeviceptr, CUdeviceptr, size_t): unified addressing */
	K_DRV_MEMCPY_ASYNC,    /* ... CUstream */
	K_RT_MEMCPY_PT,        /* the same six, per-thread default stream */
	K_RT_MEMCPY_ASYNC_PT,
	K_DRV_HTOD_PT,
	K_DRV_HTOD_ASYNC_PT,
	K_DRV_MEMCPY_PT,
	K_DRV_MEMCPY_ASYNC_PT,
	K_GETPROC,             /* cuGetProcAddress */
	K_GETPROC_V2,          /* cuGetProcAddress_v2 */
	K_DRV_PEER_ENABLE,     /* CUresult (CUcontext, unsigned int): cuCtxEnablePeerAccess */
	K_DRV_PEER_DISABLE,    /* CUresult (CUcontext): cuCtxDisablePeerAccess */
	K_DRV_CTX_RESET,       /* CUresult (CUdevice): cuDevicePrimaryCtxReset, v1 and _v2 */
	K_DRV_CTX_RELEASE,     /* CUresult (CUdevice): cuDevicePrimaryCtxRelease, v1 and _v2 */
	K_DRV_CTX_DESTROY,     /* CUresult (CUcontext): cuCtxDestroy, v1 and _v2 */
	K_COUNT
};

#define PT_SHIFT (K_RT_MEMCPY_PT - K_RT_MEMCPY)

/* 1: handle 0 is the per-thread default stream for a function of kind k. */
static inline int kind_pt(enum kind k)
{
	return k >= K_RT_MEMCPY_PT && k <= K_DRV_MEMCPY_ASYNC_PT;
}

/* Kinds a and b have one signature (they differ at most in stream 0). */
static inline int same_signature(enum kind a, enum kind b)
{
	return (kind_pt(a) ? a - PT_SHIFT : a) == (kind_pt(b) ? b - PT_SHIFT : b);
}

typedef cudaError_t (*rt_memcpy_fn)(void *, const void *, size_t, enum cudaMemcpyKind);
typedef cudaError_t (*rt_memcpy_async_fn)(void *, const void *, size_t, enum cudaMemcpyKind, cudaStream_t);
typedef CUresult (*htod_fn)(CUdeviceptr, const void *, size_t);
typedef CUresult (*htod_async_fn)(CUdeviceptr, const void *, size_t, CUstream);
typedef CUresult (*memcpy_fn)(CUdeviceptr, CUdeviceptr, size_t);
typedef CUresult (*memcpy_async_fn)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
typedef CUresult (*getproc_fn)(const char *, void **, int, cuuint64_t);
typedef CUresult (*getproc2_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
typedef CUresult (*peer_enable_fn)(CUcontext, unsigned int);
typedef CUresult (*peer_disable_fn)(CUcontext);
typedef CUresult (*ctx_dev_fn)(CUdevice);
typedef CUresult (*ctx_destroy_fn)(CUcontext);

/* Every symbol we export and hook by name; the index is the export's id. */
#define HOOKED(X)                                                                     \
	X(cudaMemcpy, K_RT_MEMCPY) X(cudaMemcpy_ptds, K_RT_MEMCPY_PT)                 \
	X(cudaMemcpyAsync, K_RT_MEMCPY_ASYNC) X(cudaMemcpyAsync_ptsz, K_RT_MEMCPY_ASYNC_PT) \
	X(cuMemcpyHtoD_v2, K_DRV_HTOD) X(cuMemcpyHtoD_v2_ptds, K_DRV_HTOD_PT)         \
	X(cuMemcpyHtoDAsync_v2, K_DRV_HTOD_ASYNC) X(cuMemcpyHtoDAsync_v2_ptsz, K_DRV_HTOD_ASYNC_PT) \
	X(cuMemcpy, K_DRV_MEMCPY) X(cuMemcpy_ptds, K_DRV_MEMCPY_PT)                   \
	X(cuMemcpyAsync, K_DRV_MEMCPY_ASYNC) X(cuMemcpyAsync_ptsz, K_DRV_MEMCPY_ASYNC_PT) \
	X(cuGetProcAddress, K_GETPROC) X(cuGetProcAddress_v2, K_GETPROC_V2)               \
	X(cuCtxEnablePeerAccess, K_DRV_PEER_ENABLE) X(cuCtxDisablePeerAccess, K_DRV_PEER_DISABLE)        \
	X(cuDevicePrimaryCtxReset, K_DRV_CTX_RESET) X(cuDevicePrimaryCtxReset_v2, K_DRV_CTX_RESET)        \
	X(cuDevicePrimaryCtxRelease, K_DRV_CTX_RELEASE) X(cuDevicePrimaryCtxRelease_v2, K_DRV_CTX_RELEASE) \
	X(cuCtxDestroy, K_DRV_CTX_DESTROY) X(cuCtxDestroy_v2, K_DRV_CTX_DESTROY)

enum export_id {
#define X(name, kind) E_##name,
	HOOKED(X)
#undef X
	E_COUNT
};

/* Our definitions: static, exported under the CUDA names by alias (so that
 * their addresses here are ours even if the program defines the names). */
#define X(name, kind) static __typeof__(name) ts_##name;
HOOKED(X)
#undef X
/* name is a declarator: it cannot take parentheses */
#define EXPORT_AS(name) \
	extern __typeof__(name) name __attribute__((alias("ts_" #name), visibility("default"))); /* NOLINT(bugprone-macro-parentheses) */

static struct {
	const char *name;
	enum kind kind;
	void *ours;            /* our exported definition */
	void *_Atomic real;    /* next definition in the global scope, once found (callers not told apart) */
} exports[E_COUNT] = {
#define X(name, kind) [E_##name] = {#name, kind, (void *)ts_##name, NULL},
	HOOKED(X)
#undef X
};

/* A name we hook: its export id, else -1. Every hooked name starts "cu".
 * (No strcmp: this runs before ASan's interceptors exist.) */
TS_UNINSTRUMENTED static int hooked_name(const char *name)
{
	if (!name || name[0] != 'c' || name[1] != 'u')
		return -1;
	for (int e = 0; e < E_COUNT; e++) {
		const char *a = name, *b = exports[e].name;
		while (*a && *a == *b)
			a++, b++;
		if (*a == *b)
			return e;
	}
	return -1;
}

/* A libjpeg name: shim/jpeg.c answers its lookups (ts_jpeg_dlsym). */
TS_UNINSTRUMENTED static int jpeg_name(const char *name)
{
	return name && name[0] == 'j' && name[1] == 'p' && name[2] == 'e' && name[3] == 'g' && name[4] == '_';
}

static int export_of(const void *p)
{
	for (int e = 0; e < E_COUNT; e++)
		if (p == exports[e].ours)
			return e;
	return -1;
}

/* ---- counters ------------------------------------------------------------------------- */

static struct {
	_Atomic uint64_t runtime, driver, h2d, h2d_bytes, unknown, replaced;
	_Atomic uint64_t wrapped_dlsym, wrapped_getproc, full;
	_Atomic int touched; /* the process met CUDA through us: say so at exit */
	_Atomic int captured; /* a batch upload inside a stream capture was seen: said once */
} st;

#define ADD(field, n) atomic_fetch_add_explicit(&st.field, (n), memory_order_relaxed)

/* ---- the copy hooks ----------------------------------------------------------------------- */

/* Depth guard: set around the real call of a handled copy (initial-exec TLS). */
static __thread int cu_depth;

enum path { PATH_RUNTIME, PATH_DRIVER };
enum dir { DIR_OTHER, DIR_H2D, DIR_UNKNOWN };

/* 1: look at this copy (guard taken; pair with copy_leave). 0: pass through. */
static inline int copy_enter(void)
{
	if (cu_depth || ts_in_hook || !ts_shim_ready() ||
	    atomic_load_explicit(&ts_is_fork_child, memory_order_relaxed))
		return 0;
	cu_depth = 1;
	return 1;
}

static inline void copy_leave(void)
{
	cu_depth = 0;
}

/* Count one copy. */
static inline void copy_seen(enum path path, enum dir dir, size_t n)
{
	if (path == PATH_RUNTIME)
		ADD(runtime, 1);
	else
		ADD(driver, 1);
	if (dir == DIR_H2D) {
		ADD(h2d, 1);
		ADD(h2d_bytes, n);
	} else if (dir == DIR_UNKNOWN) {
		/* cudaMemcpyDefault / unified cuMemcpy: telling the direction
		 * costs a pointer-attribute query per copy; only a registered
		 * host source (a stream range) is looked at further. */
		ADD(unknown, 1);
	}
}

/*
 * Is this copy an upload of a stream range (stream.h)? Only host-to-device
 * and direction-unknown copies can be; one atomic load when nothing is
 * registered.
 */
static inline enum ts_hit_kind batch_hit(enum dir dir, const void *src, size_t n, struct ts_stream_hit *hit)
{
	if (dir == DIR_OTHER || !atomic_load_explicit(&ts_stream_nspans, memory_order_relaxed))
		return TS_HIT_NONE;
	return ts_stream_find(src, n, hit);
}

/*
 * The stream our own copies go on: the caller's stream, async. For the
 * default stream (handle 0, and every synchronous copy) the one the caller
 * means, named explicitly, async too: the legacy stream, ordered after what
 * any blocking stream of the context did before and before what they do
 * next, as the caller's own copy would be; or (pt: a _ptds/_ptsz entry
 * point) the thread's per-thread stream, which is all the caller's
 * cudaStreamSynchronize(0) waits for. A synchronous copy also waits for
 * ours (sync). Waiting on the host for every async copy on the default
 * stream, as before, made PyTorch's x.cuda(non_blocking=True) (stream 0)
 * wait for the work queued before it, the previous step's backward pass:
 * the loop lost its lead.
 */
static inline CUstream our_stream(CUstream s, int sync, int pt)
{
	if (s && !sync)
		return s;
	return pt ? CU_STREAM_PER_THREAD : CU_STREAM_LEGACY;
}

/*
 * A batch upload pushed into a stream that is being captured into a CUDA
 * graph (torch.cuda.graphs, torch.compile's "reduce-overhead") is recorded,
 * to be replayed at each launch of the graph: a copy out of a ring slot
 * would replay whatever the slot holds by then, and the wait on the
 * producer's event, recorded outside the capture, is illegal in it; a
 * producer's copy into the ring and its event record would be captured
 * too. So such an upload passes through untouched (a consumer's from the
 * host, as captured by the program), and the producer keeps nothing of it:
 * its consumers go from the host for that tensor without waiting. A
 * stream whose status cannot be had counts as capturing. Asked only for
 * batch uploads (other copies cost nothing more): a consumer's before it
 * would be served, a producer's after its real call, in the context the
 * runtime made current for it. A consumer's synchronous upload while a
 * capture bars its thread from such calls (its own, or another thread's in
 * global mode) passes through as well, to be refused by CUDA as without
 * us. 1: captured, pass it through.
 */
static int batch_captured(const struct ts_stream_hit *hit, enum ts_hit_kind k, CUstream s, int sync, int pt)
{
	if (!ts_gpu_in_capture(our_stream(s, 0, pt)) &&
	    !(k == TS_HIT_CONSUMER && sync && ts_gpu_sync_barred(our_stream(s, 1, pt))))
		return 0;
	if (!atomic_exchange_explicit(&st.captured, 1, memory_order_relaxed))
		ts_info("cuda: a batch upload inside a CUDA graph capture passes through (a graph replays its copies "
			"later): it is not served from, nor kept in, the GPU ring");
	if (k == TS_HIT_PRODUCER)
		ts_gpu_keep_skip(hit->gpu, hit->seq, hit->pos);
	return 1;
}

/* Consumer: 1 when the upload was served from the GPU ring. */
static int batch_serve(const struct ts_stream_hit *hit, const void *dst, CUstream s, int sync, int pt)
{
	CUstream os = our_stream(s, sync, pt);
	if (!ts_gpu_serve(hit->gpu, hit->piece, hit->npieces, (CUdeviceptr)(uintptr_t)dst, os, sync))
		return 0;
	ADD(replaced, 1);
	return 1;
}

/* Producer, after its real upload succeeded: keep it in the ring. */
static void batch_keep(const struct ts_stream_hit *hit, const void *dst, CUstream s, int sync, int pt)
{
	CUstream os = our_stream(s, sync, pt);
	ts_gpu_keep(hit->gpu, hit->seq, hit->npos, hit->len, hit->pos, hit->off, (CUdeviceptr)(uintptr_t)dst,
		    hit->n, os, sync);
}

/*
 * One body for every copy hook: count, serve or keep a stream range,
 * otherwise pass through. CALL is the real call's expression; OK its
 * success value; pt: stream 0 is the per-thread default stream.
 */
#define COPY_BODY(path, dir, dst, src, n, stream, sync, pt, CALL, OK)                                 \
	do {                                                                                       \
		struct ts_stream_hit hit_;                                                        \
		if (!copy_enter())                                                                 \
			return (CALL);                                                             \
		int errno_ = errno; /* ours may set it (a ring file opened, /proc read) */        \
		copy_seen(path, dir, n);                                                           \
		enum ts_hit_kind k_ = batch_hit(dir, src, n, &hit_);                               \
		if (k_ == TS_HIT_NONE && (dir) != DIR_OTHER)                                       \
			ts_native_upload_maybe(src, n);                                            \
		if (k_ == TS_HIT_CONSUMER && !batch_captured(&hit_, k_, stream, sync, pt) &&        \
		    batch_serve(&hit_, dst, stream, sync, pt)) {                                     \
			copy_leave();                                                              \
			errno = errno_;                                                            \
			return (OK);                                                               \
		}                                                                                  \
		errno = errno_;                                                                    \
		__typeof__(CALL) r_ = (CALL);                                                      \
		errno_ = errno;                                                                    \
		if (k_ == TS_HIT_PRODUCER && r_ == (OK) && !batch_captured(&hit_, k_, stream, sync, pt)) \
			batch_keep(&hit_, dst, stream, sync, pt);                                    \
		ts_gpu_poll_if_pending(); /* holds of our served copies done: let go soon */      \
		copy_leave();                                                                      \
		errno = errno_;                                                                    \
		return r_;                                                                         \
	} while (0)

static inline enum dir rt_dir(enum cudaMemcpyKind kind)
{
	return kind == cudaMemcpyHostToDevice ? DIR_H2D : kind == cudaMemcpyDefault ? DIR_UNKNOWN : DIR_OTHER;
}

static inline cudaError_t rt_memcpy(rt_memcpy_fn real, int pt, void *dst, const void *src, size_t n,
				    enum cudaMemcpyKind kind)
{
	COPY_BODY(PATH_RUNTIME, rt_dir(kind), dst, src, n, (CUstream)0, 1, pt, real(dst, src, n, kind),
		  cudaSuccess);
}

static inline cudaError_t rt_memcpy_async(rt_memcpy_async_fn real, int pt, void *dst, const void *src, size_t n,
					  enum cudaMemcpyKind kind, cudaStream_t s)
{
	COPY_BODY(PATH_RUNTIME, rt_dir(kind), dst, src, n, (CUstream)s, 0, pt, real(dst, src, n, kind, s),
		  cudaSuccess);
}

static inline CUresult drv_htod(htod_fn real, int pt, CUdeviceptr dst, const void *src, size_t n)
{
	COPY_BODY(PATH_DRIVER, DIR_H2D, (void *)(uintptr_t)dst, src, n, (CUstream)0, 1, pt, real(dst, src, n),
		  CUDA_SUCCESS);
}

static inline CUresult drv_htod_async(htod_async_fn real, int pt, CUdeviceptr dst, const void *src, size_t n,
				      CUstream s)
{
	COPY_BODY(PATH_DRIVER, DIR_H2D, (void *)(uintptr_t)dst, src, n, s, 0, pt, real(dst, src, n, s),
		  CUDA_SUCCESS);
}

static inline CUresult drv_memcpy(memcpy_fn real, int pt, CUdeviceptr dst, CUdeviceptr src, size_t n)
{
	COPY_BODY(PATH_DRIVER, DIR_UNKNOWN, (void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n, (CUstream)0, 1,
		  pt, real(dst, src, n), CUDA_SUCCESS);
}

static inline CUresult drv_memcpy_async(memcpy_async_fn real, int pt, CUdeviceptr dst, CUdeviceptr src, size_t n,
					CUstream s)
{
	COPY_BODY(PATH_DRIVER, DIR_UNKNOWN, (void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n, s, 0, pt,
		  real(dst, src, n, s), CUDA_SUCCESS);
}

static CUresult getproc_do(void *real, int v2, const char *symbol, void **pfn, int version, cuuint64_t flags,
			   CUdriverProcAddressQueryResult *status);

/*
 * Do we look at one of the program's calls that are not copies (below)?
 * Not where copies are passed straight through.
 */
static inline int call_enter(void)
{
	return !cu_depth && !ts_in_hook && ts_shim_ready() &&
	       !atomic_load_explicit(&ts_is_fork_child, memory_order_relaxed);
}

/*
 * The program's own peer-access calls: our mappings of another device's
 * ring buffers enable peer access as a side effect, which gpu.c keeps out
 * of the answers these get.
 */
static inline CUresult drv_peer_enable(peer_enable_fn real, CUcontext peer, unsigned int flags)
{
	if (!call_enter())
		return real(peer, flags);
	int saved = errno;
	CUresult r = ts_gpu_peer_enable(real, peer, flags);
	errno = saved;
	return r;
}

static inline CUresult drv_peer_disable(peer_disable_fn real, CUcontext peer)
{
	if (!call_enter())
		return real(peer);
	int saved = errno;
	CUresult r = ts_gpu_peer_disable(real, peer);
	errno = saved;
	return r;
}

/*
 * The program's calls that may destroy a context: a primary context's reset
 * or release (which does when it is the last), matched by device, and
 * cuCtxDestroy of a context it made, matched by context. What of the GPU
 * ring lives in it is drained before (a consumer's copy out of a buffer
 * that went would read garbage) and forgotten after (gpu.c). A nested call
 * (a runtime's reset reaching a driver hook of ours) passes straight through.
 */
static __thread int ctx_depth;

static inline void ctx_going(CUcontext ctx, int dev)
{
	int saved = errno;
	ctx_depth = 1;
	ts_gpu_ctx_going(ctx, dev);
	errno = saved;
}

static inline void ctx_gone(int dev, int reset, CUresult r)
{
	int saved = errno;
	ts_gpu_ctx_gone(dev, reset, r);
	ctx_depth = 0;
	errno = saved;
}

static inline CUresult drv_ctx_dev(ctx_dev_fn real, CUdevice dev, int reset)
{
	if (!call_enter() || ctx_depth)
		return real(dev);
	ctx_going(NULL, (int)dev);
	CUresult r = real(dev);
	ctx_gone((int)dev, reset, r);
	return r;
}

static inline CUresult drv_ctx_destroy(ctx_destroy_fn real, CUcontext ctx)
{
	if (!call_enter() || ctx_depth || !ctx)
		return real(ctx);
	ctx_going(ctx, -1);
	CUresult r = real(ctx);
	ctx_gone(-1, 0, r);
	return r;
}

/* ---- wrapper slots: one static function per (kind, slot) ---------------------------------- */

#define NSLOT 8
#define SLOTS(X, k) X(k, 0) X(k, 1) X(k, 2) X(k, 3) X(k, 4) X(k, 5) X(k, 6) X(k, 7)

/* slot_real[k][i]: the real function slot i of kind k calls; NULL: free.
 * Claimed once (compare-and-swap), never changed or freed. */
static void *_Atomic slot_real[K_COUNT][NSLOT];

#define REAL(type, k, i) ((type)atomic_load_explicit(&slot_real[k][i], memory_order_acquire))

/* Slot i of kind k: w_<k>_<i>, calling slot_real[k][i]. */
#define W_RT_MEMCPY(k, i)                                                                         \
	static cudaError_t w_##k##_##i(void *d, const void *s, size_t n, enum cudaMemcpyKind kind) \
	{                                                                                         \
		return rt_memcpy(REAL(rt_memcpy_fn, k, i), kind_pt(k), d, s, n, kind);            \
	}
#define W_RT_MEMCPY_ASYNC(k, i)                                                                   \
	static cudaError_t w_##k##_##i(void *d, const void *s, size_t n, enum cudaMemcpyKind kind, \
				       cudaStream_t st_)                                          \
	{                                                                                         \
		return rt_memcpy_async(REAL(rt_memcpy_async_fn, k, i), kind_pt(k), d, s, n, kind, st_); \
	}
#define W_DRV_HTOD(k, i)                                                         \
	static CUresult w_##k##_##i(CUdeviceptr d, const void *s, size_t n)      \
	{                                                                        \
		return drv_htod(REAL(htod_fn, k, i), kind_pt(k), d, s, n);       \
	}
#define W_DRV_HTOD_ASYNC(k, i)                                                              \
	static CUresult w_##k##_##i(CUdeviceptr d, const void *s, size_t n, CUstream st_)   \
	{                                                                                   \
		return drv_htod_async(REAL(htod_async_fn, k, i), kind_pt(k), d, s, n, st_); \
	}
#define W_DRV_MEMCPY(k, i)                                                      \
	static CUresult w_##k##_##i(CUdeviceptr d, CUdeviceptr s, size_t n)     \
	{                                                                       \
		return drv_memcpy(REAL(memcpy_fn, k, i), kind_pt(k), d, s, n);  \
	}
#define W_DRV_MEMCPY_ASYNC(k, i)                                                                \
	static CUresult w_##k##_##i(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st_)       \
	{                                                                                       \
		return drv_memcpy_async(REAL(memcpy_async_fn, k, i), kind_pt(k), d, s, n, st_); \
	}
#define W_GETPROC(k, i)                                                                          \
	static CUresult w_##k##_##i(const char *sym, void **pfn, int ver, cuuint64_t fl)         \
	{                                                                                        \
		return getproc_do(atomic_load_explicit(&slot_real[k][i], memory_order_acquire), 0, sym, \
				  pfn, ver, fl, NULL);                                           \
	}
#define W_GETPROC_V2(k, i)                                                                             \
	static CUresult w_##k##_##i(const char *sym, void **pfn, int ver, cuuint64_t fl,               \
				    CUdriverProcAddressQueryResult *qs)                                \
	{                                                                                              \
		return getproc_do(atomic_load_explicit(&slot_real[k][i], memory_order_acquire), 1, sym, pfn, \
				  ver, fl, qs);                                                        \
	}
#define W_DRV_PEER_ENABLE(k, i)                                                  \
	static CUresult w_##k##_##i(CUcontext peer, unsigned int fl)             \
	{                                                                        \
		return drv_peer_enable(REAL(peer_enable_fn, k, i), peer, fl);    \
	}
#define W_DRV_PEER_DISABLE(k, i)                                                 \
	static CUresult w_##k##_##i(CUcontext peer)                              \
	{                                                                        \
		return drv_peer_disable(REAL(peer_disable_fn, k, i), peer);      \
	}
#define W_DRV_CTX_DEV(k, i)                                                      \
	static CUresult w_##k##_##i(CUdevice dev)                                \
	{                                                                        \
		return drv_ctx_dev(REAL(ctx_dev_fn, k, i), dev, (k) == K_DRV_CTX_RESET); \
	}
#define W_DRV_CTX_DESTROY(k, i)                                                  \
	static CUresult w_##k##_##i(CUcontext ctx)                               \
	{                                                                        \
		return drv_ctx_destroy(REAL(ctx_destroy_fn, k, i), ctx);         \
	}

SLOTS(W_RT_MEMCPY, K_RT_MEMCPY)
SLOTS(W_RT_MEMCPY_ASYNC, K_RT_MEMCPY_ASYNC)
SLOTS(W_DRV_HTOD, K_DRV_HTOD)
SLOTS(W_DRV_HTOD_ASYNC, K_DRV_HTOD_ASYNC)
SLOTS(W_DRV_MEMCPY, K_DRV_MEMCPY)
SLOTS(W_DRV_MEMCPY_ASYNC, K_DRV_MEMCPY_ASYNC)
SLOTS(W_RT_MEMCPY, K_RT_MEMCPY_PT)
SLOTS(W_RT_MEMCPY_ASYNC, K_RT_MEMCPY_ASYNC_PT)
SLOTS(W_DRV_HTOD, K_DRV_HTOD_PT)
SLOTS(W_DRV_HTOD_ASYNC, K_DRV_HTOD_ASYNC_PT)
SLOTS(W_DRV_MEMCPY, K_DRV_MEMCPY_PT)
SLOTS(W_DRV_MEMCPY_ASYNC, K_DRV_MEMCPY_ASYNC_PT)
SLOTS(W_GETPROC, K_GETPROC)
SLOTS(W_GETPROC_V2, K_GETPROC_V2)
SLOTS(W_DRV_PEER_ENABLE, K_DRV_PEER_ENABLE)
SLOTS(W_DRV_PEER_DISABLE, K_DRV_PEER_DISABLE)
SLOTS(W_DRV_CTX_DEV, K_DRV_CTX_RESET)
SLOTS(W_DRV_CTX_DEV, K_DRV_CTX_RELEASE)
SLOTS(W_DRV_CTX_DESTROY, K_DRV_CTX_DESTROY)

#define PTR(k, i) (void *)w_##k##_##i,
#define ROW(k) [k] = {SLOTS(PTR, k)}
static void *const wrappers[K_COUNT][NSLOT] = {
	ROW(K_RT_MEMCPY),        ROW(K_RT_MEMCPY_ASYNC),    ROW(K_DRV_HTOD),      ROW(K_DRV_HTOD_ASYNC),
	ROW(K_DRV_MEMCPY),       ROW(K_DRV_MEMCPY_ASYNC),   ROW(K_RT_MEMCPY_PT),  ROW(K_RT_MEMCPY_ASYNC_PT),
	ROW(K_DRV_HTOD_PT),      ROW(K_DRV_HTOD_ASYNC_PT),  ROW(K_DRV_MEMCPY_PT), ROW(K_DRV_MEMCPY_ASYNC_PT),
	ROW(K_GETPROC),          ROW(K_GETPROC_V2),         ROW(K_DRV_PEER_ENABLE), ROW(K_DRV_PEER_DISABLE),
	ROW(K_DRV_CTX_RESET),    ROW(K_DRV_CTX_RELEASE),    ROW(K_DRV_CTX_DESTROY),
};
#undef ROW
#undef PTR

static int is_wrapper(const void *p)
{
	for (int k = 0; k < K_COUNT; k++)
		for (int i = 0; i < NSLOT; i++)
			if (p == wrappers[k][i])
				return 1;
	return 0;
}

static int ours(const void *p)
{
	return export_of(p) >= 0 || is_wrapper(p);
}

/* The wrapper of the slot holding `real` (any kind; its kind in *kind when
 * kind is not NULL), or NULL. */
static void *wrapper_of(const void *real, enum kind *kind)
{
	for (int k = 0; k < K_COUNT; k++)
		for (int i = 0; i < NSLOT; i++) {
			void *r = atomic_load_explicit(&slot_real[k][i], memory_order_acquire);
			if (!r)
				break; /* slots fill in order */
			if (r == real) {
				if (kind)
					*kind = (enum kind)k;
				return wrappers[k][i];
			}
		}
	return NULL;
}

/* The wrapper for real function `real` of kind k: its slot, claimed if new.
 * NULL (use `real` unwrapped) when the table is full, or when `real` is
 * already known under another signature (then nothing is safe to assume).
 * Known under this signature's other stream kind, it keeps the kind it has:
 * a driver that hands out one function for both can treat stream 0 only
 * one way, and the first probe asks for the legacy one. */
static void *wrap(enum kind k, void *real)
{
	if (!real || ours(real))
		return NULL;
	enum kind known;
	void *w = wrapper_of(real, &known);
	if (w)
		return same_signature(known, k) ? w : NULL;
	for (int i = 0; i < NSLOT; i++) {
		void *expected = NULL;
		if (atomic_compare_exchange_strong_explicit(&slot_real[k][i], &expected, real, memory_order_acq_rel,
							    memory_order_acquire) ||
		    expected == real)
			return wrappers[k][i];
	}
	if (atomic_fetch_add_explicit(&st.full, 1, memory_order_relaxed) == 0)
		ts_info("cuda: more than %d real functions of one kind; further ones pass through unwatched", NSLOT);
	return NULL;
}

/* ---- where the real functions are ------------------------------------------------------------ */

/*
 * Without us, a caller's reference to cudaMemcpy binds where the dynamic
 * linker puts it: the first definition in the global scope whose version
 * matches the reference's, else the first in the caller's own dependency
 * tree (its local scope). Our exports have no version, so they match every
 * reference, and preloaded they come first: a plugin that links
 * libcudart.so.12 and is loaded RTLD_LOCAL (as Python loads extensions)
 * beside a global libcudart.so.13 calls us, and must reach its own 12, not
 * the 13 every other caller reaches. The verdict is per calling object.
 */

TS_REAL(int, dlclose, (void *)); /* ours counts unloads (below); our own closes unload nothing */

/* `name` in the dependency tree of loaded object `file`; not ours. */
static void *lookup_in(const char *file, const char *name)
{
	if (!file || !file[0] || !TS_RESOLVE(dlclose))
		return NULL; /* "": the program, whose tree is the global scope */
	void *h = dlopen(file, RTLD_LAZY | RTLD_NOLOAD);
	if (!h)
		return NULL;
	void *p = ts_real_dlsym(h, name);
	real_dlclose(h); /* NOLOAD took a reference; the object stays loaded */
	return p && !ours(p) ? p : NULL;
}

/* `name` as seen from the object containing code address `caller`: its own
 * dependency tree. NULL when not found there or only ours is. */
static void *lookup_from(const void *caller, const char *name)
{
	Dl_info info = {0};
	return caller && dladdr(caller, &info) ? lookup_in(info.dli_fname, name) : NULL;
}

/* Any loaded object's own definition of `name`, in load order; not ours. */
#define MAX_OBJECTS 512
struct objects {
	unsigned n;
	const char *names[MAX_OBJECTS];
};

static int collect_object(struct dl_phdr_info *info, size_t size, void *arg)
{
	struct objects *o = arg;
	(void)size;
	if (info->dlpi_name && info->dlpi_name[0] && o->n < MAX_OBJECTS)
		o->names[o->n++] = info->dlpi_name;
	return 0;
}

static void *lookup_anywhere(const char *name)
{
	struct objects o = {0};
	dl_iterate_phdr(collect_object, &o); /* no dlopen under its lock: collect, then look */
	for (unsigned i = 0; i < o.n; i++) {
		void *p = lookup_in(o.names[i], name);
		if (p)
			return p;
	}
	return NULL;
}

/*
 * What loaded object `file` binds `name` to without us. Its tree's own
 * definition l is the one it was linked against, so its reference asks for
 * l's version: the global scope's first definition of that version (which
 * is l itself when l is global), else l. An unversioned l: the global
 * scope's first. None in its tree: the global scope's, else any loaded
 * object's (CUDA loaded RTLD_LOCAL by another object, see export_real).
 */
static void *resolve(const char *file, const char *name)
{
	void *l = lookup_in(file, name);
	if (!l) {
		void *g = ts_real_next(name);
		return g ? g : lookup_anywhere(name);
	}
	void *p = ts_real_bind(name, l);
	return p && !ours(p) ? p : l;
}

/* ---- which object calls ---- */

/* A calling object: its link_map and where it is mapped. */
struct caller_key {
	const void *map, *start, *end;
};

#if __GLIBC_PREREQ(2, 35)
/* _dl_find_object: lock-free, made for unwinders. Looked up, not linked, so
 * that the shim still loads on glibc 2.34, where callers are not told apart
 * (nor before this constructor has run). */
typedef int (*find_object_fn)(void *, struct dl_find_object *);
static find_object_fn _Atomic find_object;

__attribute__((constructor)) static void ts_cuda_find_object(void)
{
	int saved = errno;
	atomic_store_explicit(&find_object, (find_object_fn)dlvsym(RTLD_DEFAULT, "_dl_find_object", "GLIBC_2.35"),
			      memory_order_relaxed);
	errno = saved;
}
#endif

/* The object holding address pc; 0 when that cannot be told. */
static int caller_object(const void *pc, struct caller_key *k)
{
#if __GLIBC_PREREQ(2, 35)
	find_object_fn find = atomic_load_explicit(&find_object, memory_order_relaxed);
	struct dl_find_object o;
	if (find && find((void *)pc, &o) == 0) {
		*k = (struct caller_key){o.dlfo_link_map, o.dlfo_map_start, o.dlfo_map_end};
		return 1;
	}
#endif
	(void)pc, (void)k;
	return 0;
}

/*
 * Calling objects and their verdicts, per export. An entry is claimed by
 * its mapping's start (one compare-and-swap), published once filled, never
 * freed. One whose object is unloaded is marked dead by the dlclose that
 * unloaded it (an object loaded later may get the same link_map and range).
 */
#define NCALLER 128
static struct caller {
	const void *_Atomic start; /* NULL: free */
	const void *map, *end;
	_Atomic int ready, dead;
	void *_Atomic real[E_COUNT];
} callers[NCALLER];
static _Atomic int callers_full;

static struct caller *caller_at(const struct caller_key *k, unsigned i)
{
	return &callers[(((uintptr_t)k->start >> 12) + i) % NCALLER];
}

static int caller_is(struct caller *c, const struct caller_key *k)
{
	return atomic_load_explicit(&c->ready, memory_order_acquire) && c->map == k->map && c->end == k->end &&
	       !atomic_load_explicit(&c->dead, memory_order_acquire);
}

/* Object k's entry, added if new; NULL when the table is full. Probing
 * stops at the first free one. Two threads adding one object may add it
 * twice: the first wins. */
static struct caller *caller_add(const struct caller_key *k)
{
	for (unsigned i = 0; i < NCALLER; i++) {
		struct caller *c = caller_at(k, i);
		const void *s = NULL;
		if (atomic_compare_exchange_strong_explicit(&c->start, &s, k->start, memory_order_acq_rel,
							    memory_order_acquire)) {
			c->map = k->map;
			c->end = k->end;
			atomic_store_explicit(&c->ready, 1, memory_order_release);
			return c;
		}
		if (s == k->start && caller_is(c, k))
			return c;
	}
	if (atomic_fetch_add_explicit(&callers_full, 1, memory_order_relaxed) == 0)
		ts_info("cuda: more than %d objects called CUDA copies; further ones are looked up per call", NCALLER);
	return NULL;
}

/* After a dlclose: mark dead the entries of objects no longer mapped as
 * they were. */
static void callers_bury(void)
{
	for (unsigned i = 0; i < NCALLER; i++) {
		struct caller *c = &callers[i];
		struct caller_key k = {0};
		const void *s = atomic_load_explicit(&c->start, memory_order_acquire);
		if (!s || !atomic_load_explicit(&c->ready, memory_order_acquire) ||
		    atomic_load_explicit(&c->dead, memory_order_relaxed))
			continue;
		if (!caller_object(s, &k) || k.start != s || k.map != c->map || k.end != c->end)
			atomic_store_explicit(&c->dead, 1, memory_order_release);
	}
}

/*
 * dlclose, counted as it begins and as it ends, the entries of what it
 * unloaded buried in between. A thread's remembered callers (export_real)
 * hold while no dlclose began since; none is trusted while one is under
 * way (an object's destructors, run inside its dlclose, may call copies).
 */
static _Atomic unsigned dlclose_begun, dlclose_ended;

TS_EXPORT int dlclose(void *handle)
{
	if (!TS_RESOLVE(dlclose)) {
		errno = ENOSYS;
		return -1;
	}
	atomic_fetch_add_explicit(&dlclose_begun, 1, memory_order_acq_rel);
	int r = real_dlclose(handle);
	int saved = errno;
	callers_bury();
	ts_jpeg_unloaded();
	errno = saved;
	atomic_fetch_add_explicit(&dlclose_ended, 1, memory_order_release);
	return r;
}

/* ---- the function behind an export ---- */

/* Callers not told apart (glibc < 2.35, code outside any object): the
 * global scope's first definition for all, else the caller's own (found
 * with dladdr; per thread, the last few, until a dlclose), else any loaded
 * object's. */
#define CALLER_CACHE 4
static __thread struct {
	const void *caller;
	void *real;
	int e;
	unsigned gen; /* dlclose_begun when found: an unload may have taken it */
} caller_cache[CALLER_CACHE];
static __thread unsigned caller_next;

static void *export_real_global(int e, const void *caller)
{
	void *p = atomic_load_explicit(&exports[e].real, memory_order_acquire);
	if (p)
		return p;
	unsigned gen = atomic_load_explicit(&dlclose_begun, memory_order_acquire);
	for (int i = 0; i < CALLER_CACHE; i++)
		if (caller_cache[i].caller == caller && caller_cache[i].e == e && caller_cache[i].real &&
		    caller_cache[i].gen == gen)
			return caller_cache[i].real;
	int saved = errno;
	p = ts_real_next(exports[e].name);
	if (p) {
		atomic_store_explicit(&exports[e].real, p, memory_order_release);
	} else if (((p = lookup_from(caller, exports[e].name)) != NULL ||
		    (p = lookup_anywhere(exports[e].name)) != NULL) &&
		   atomic_load_explicit(&dlclose_ended, memory_order_acquire) == gen) {
		unsigned i = caller_next++ % CALLER_CACHE;
		caller_cache[i].caller = caller;
		caller_cache[i].e = e;
		caller_cache[i].real = p;
		caller_cache[i].gen = gen;
	}
	errno = saved;
	return p;
}

/* Per thread, the last objects that called: the range each is mapped at,
 * its entry, and dlclose_begun then. */
#define RECENT 4
static __thread struct recent {
	uintptr_t start, end;
	struct caller *c;
	unsigned gen;
} recent[RECENT];
static __thread unsigned recent_next;

/* Object k's verdict for export e: its entry's, else worked out and kept
 * there; the entry remembered by this thread. Entries are not used while a
 * dlclose is under way: it may not have buried what it unloaded yet. */
static void *export_real_slow(int e, const void *caller, unsigned gen)
{
	struct caller_key k;
	if (!caller_object(caller, &k))
		return export_real_global(e, caller);
	int saved = errno;
	struct caller *c = NULL;
	if (atomic_load_explicit(&dlclose_ended, memory_order_acquire) == gen)
		c = caller_add(&k);
	void *p = c ? atomic_load_explicit(&c->real[e], memory_order_acquire) : NULL;
	if (!p) {
		p = resolve(((const struct link_map *)k.map)->l_name, exports[e].name);
		if (p && c)
			atomic_store_explicit(&c->real[e], p, memory_order_release);
	}
	if (c)
		recent[recent_next++ % RECENT] = (struct recent){(uintptr_t)k.start, (uintptr_t)k.end, c, gen};
	errno = saved;
	return p;
}

/*
 * The function our export `e`, called from `caller`, stands for: what the
 * caller's object binds the name to without us (resolve), worked out once
 * per object. Per call, the common case is a range check against the
 * objects this thread saw last: a few loads. The caller may be a tail call
 * away: a driver's cuGetProcAddress may jump to cuGetProcAddress_v2, which
 * binds to us where its table goes through the dynamic linker, so the
 * return address may lie in the driver or in the shim: their verdict is the
 * driver's definition.
 */
static inline void *export_real(int e, const void *caller)
{
	unsigned gen = atomic_load_explicit(&dlclose_begun, memory_order_acquire);
	uintptr_t pc = (uintptr_t)caller;
	for (unsigned i = 0; i < RECENT; i++) {
		const struct recent *r = &recent[i];
		if (pc - r->start < r->end - r->start && r->gen == gen) {
			void *p = atomic_load_explicit(&r->c->real[e], memory_order_acquire);
			if (p)
				return p;
			break;
		}
	}
	return export_real_slow(e, caller, gen);
}

/* Does a lookup get wrappers? Not when the shim is off or the process is exiting. */
TS_UNINSTRUMENTED static int mapping_on(void)
{
	int s = atomic_load_explicit(&ts_init_state, memory_order_acquire);
	return s != TS_DISABLED && s != TS_FINI;
}

/* ---- cuGetProcAddress ----------------------------------------------------------------------- */

/*
 * What a driver hands out for the hooked functions, asked at the oldest
 * version with today's signature (so a later variant with another signature
 * is never mistaken for one of ours), legacy and per-thread.
 */
static const struct {
	const char *name;
	int version;
	cuuint64_t flags;
	enum kind kind;
} probes[] = {
	{"cuMemcpyHtoD", 3020, CU_GET_PROC_ADDRESS_LEGACY_STREAM, K_DRV_HTOD},
	{"cuMemcpyHtoD", 7000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, K_DRV_HTOD_PT},
	{"cuMemcpyHtoDAsync", 3020, CU_GET_PROC_ADDRESS_LEGACY_STREAM, K_DRV_HTOD_ASYNC},
	{"cuMemcpyHtoDAsync", 7000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, K_DRV_HTOD_ASYNC_PT},
	{"cuMemcpy", 4000, CU_GET_PROC_ADDRESS_LEGACY_STREAM, K_DRV_MEMCPY},
	{"cuMemcpy", 7000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, K_DRV_MEMCPY_PT},
	{"cuMemcpyAsync", 4000, CU_GET_PROC_ADDRESS_LEGACY_STREAM, K_DRV_MEMCPY_ASYNC},
	{"cuMemcpyAsync", 7000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, K_DRV_MEMCPY_ASYNC_PT},
	{"cuGetProcAddress", 11030, CU_GET_PROC_ADDRESS_LEGACY_STREAM, K_GETPROC},
	{"cuGetProcAddress", 12000, CU_GET_PROC_ADDRESS_LEGACY_STREAM, K_GETPROC_V2},
	{"cuCtxEnablePeerAccess", 4000, CU_GET_PROC_ADDRESS_LEGACY_STREAM, K_DRV_PEER_ENABLE},
	{"cuCtxDisablePeerAccess", 4000, CU_GET_PROC_ADDRESS_LEGACY_STREAM, K_DRV_PEER_DISABLE},
	/* v1 (7000: the real libcudart 13 asks for these) and _v2 (11000): one signature */
	{"cuDevicePrimaryCtxReset", 7000, CU_GET_PROC_ADDRESS_LEGACY_STREAM, K_DRV_CTX_RESET},
	{"cuDevicePrimaryCtxReset", 11000, CU_GET_PROC_ADDRESS_LEGACY_STREAM, K_DRV_CTX_RESET},
	{"cuDevicePrimaryCtxRelease", 7000, CU_GET_PROC_ADDRESS_LEGACY_STREAM, K_DRV_CTX_RELEASE},
	{"cuDevicePrimaryCtxRelease", 11000, CU_GET_PROC_ADDRESS_LEGACY_STREAM, K_DRV_CTX_RELEASE},
	/* v1 (2000) and _v2 (4000): one signature */
	{"cuCtxDestroy", 2000, CU_GET_PROC_ADDRESS_LEGACY_STREAM, K_DRV_CTX_DESTROY},
	{"cuCtxDestroy", 4000, CU_GET_PROC_ADDRESS_LEGACY_STREAM, K_DRV_CTX_DESTROY},
};

/* Per real cuGetProcAddress (one per driver and entry point): probed once. */
#define NDRIVER 8
static struct driver {
	void *_Atomic getproc;
	_Atomic int ready;
	void *export_wrap[E_COUNT]; /* a probe answered with our export: the wrapper of the driver's own */
} drivers[NDRIVER];

static CUresult call_getproc(void *real, int v2, const char *symbol, void **pfn, int version, cuuint64_t flags,
			     CUdriverProcAddressQueryResult *status)
{
	if (v2)
		return ((getproc2_fn)real)(symbol, pfn, version, flags, status);
	if (status)
		*status = CU_GET_PROC_ADDRESS_SUCCESS; /* the v1 entry point reports none */
	return ((getproc_fn)real)(symbol, pfn, version, flags);
}

/* Set while this thread probes: a driver whose cuGetProcAddress calls back
 * into ours (its v1 calling the v2 export, bound to us) is not probed again
 * inside. */
static __thread int probing;

/* Probe the driver behind `getproc`; fill export_wrap. */
static void probe_driver(void *getproc, int v2, void **export_wrap)
{
	if (probing)
		return;
	probing = 1;
	for (size_t j = 0; j < sizeof(probes) / sizeof(probes[0]); j++) {
		void *p = NULL;
		if (call_getproc(getproc, v2, probes[j].name, &p, probes[j].version, probes[j].flags, NULL) !=
			    CUDA_SUCCESS ||
		    !p)
			continue;
		int e = export_of(p);
		if (e >= 0) {
			/* The driver's table is bound by the dynamic linker, to us:
			 * its own definition is the real one. */
			if (exports[e].kind != probes[j].kind)
				continue;
			export_wrap[e] = wrap(probes[j].kind, lookup_from(getproc, exports[e].name));
		} else {
			(void)wrap(probes[j].kind, p);
		}
	}
	probing = 0;
}

/* Map a pointer `getproc` handed out: a wrapper when it is a hooked copy
 * function (or cuGetProcAddress itself), else the pointer untouched. */
static void *map_getproc_result(void *getproc, int v2, void *p)
{
	void *local_wrap[E_COUNT] = {0};
	void **export_wrap = local_wrap;
	struct driver *d = NULL;
	for (int i = 0; i < NDRIVER && !d; i++) {
		void *g = atomic_load_explicit(&drivers[i].getproc, memory_order_acquire);
		void *expected = NULL;
		if (g == getproc ||
		    (!g && atomic_compare_exchange_strong(&drivers[i].getproc, &expected, getproc)) ||
		    expected == getproc)
			d = &drivers[i];
	}
	if (d && atomic_load_explicit(&d->ready, memory_order_acquire) == 2) {
		export_wrap = d->export_wrap;
	} else {
		/* First use (or a race with it, or too many drivers): probe into
		 * our own array; the first prober publishes. */
		int nested = probing;
		probe_driver(getproc, v2, local_wrap);
		int expected = 0;
		if (d && !nested && atomic_compare_exchange_strong(&d->ready, &expected, 1)) {
			memcpy(d->export_wrap, local_wrap, sizeof(local_wrap));
			atomic_store_explicit(&d->ready, 2, memory_order_release);
		}
	}
	int e = export_of(p);
	if (e >= 0)
		return export_wrap[e] ? export_wrap[e] : p;
	if (is_wrapper(p))
		return p;
	void *w = wrapper_of(p, NULL);
	return w ? w : p;
}

static CUresult getproc_do(void *real, int v2, const char *symbol, void **pfn, int version, cuuint64_t flags,
			   CUdriverProcAddressQueryResult *status)
{
	if (!real)
		return CUDA_ERROR_NOT_INITIALIZED;
	CUresult r = v2 ? ((getproc2_fn)real)(symbol, pfn, version, flags, status)
			: ((getproc_fn)real)(symbol, pfn, version, flags);
	if (r != CUDA_SUCCESS || !pfn || !*pfn || !mapping_on())
		return r;
	int saved = errno;
	void *p = *pfn, *m = map_getproc_result(real, v2, p);
	if (m != p) {
		*pfn = m;
		ADD(wrapped_getproc, 1);
		atomic_store_explicit(&st.touched, 1, memory_order_relaxed);
	}
	errno = saved;
	return r;
}

/* ---- the exported hooks ------------------------------------------------------------------------ */

/* Called with no CUDA library to pass to: only through a weak reference or
 * a stale pointer, since dlsym never hands our export out then. */
#define NO_RUNTIME cudaErrorInsufficientDriver
#define NO_DRIVER CUDA_ERROR_NOT_INITIALIZED

static cudaError_t ts_cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind)
{
	rt_memcpy_fn real = (rt_memcpy_fn)export_real(E_cudaMemcpy, CALLER());
	return real ? rt_memcpy(real, 0, dst, src, n, kind) : NO_RUNTIME;
}
EXPORT_AS(cudaMemcpy)

static cudaError_t ts_cudaMemcpy_ptds(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind)
{
	rt_memcpy_fn real = (rt_memcpy_fn)export_real(E_cudaMemcpy_ptds, CALLER());
	return real ? rt_memcpy(real, 1, dst, src, n, kind) : NO_RUNTIME;
}
EXPORT_AS(cudaMemcpy_ptds)

static cudaError_t ts_cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind,
				      cudaStream_t s)
{
	rt_memcpy_async_fn real = (rt_memcpy_async_fn)export_real(E_cudaMemcpyAsync, CALLER());
	return real ? rt_memcpy_async(real, 0, dst, src, n, kind, s) : NO_RUNTIME;
}
EXPORT_AS(cudaMemcpyAsync)

static cudaError_t ts_cudaMemcpyAsync_ptsz(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind,
					   cudaStream_t s)
{
	rt_memcpy_async_fn real = (rt_memcpy_async_fn)export_real(E_cudaMemcpyAsync_ptsz, CALLER());
	return real ? rt_memcpy_async(real, 1, dst, src, n, kind, s) : NO_RUNTIME;
}
EXPORT_AS(cudaMemcpyAsync_ptsz)

static CUresult ts_cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n)
{
	htod_fn real = (htod_fn)export_real(E_cuMemcpyHtoD_v2, CALLER());
	return real ? drv_htod(real, 0, dst, src, n) : NO_DRIVER;
}
EXPORT_AS(cuMemcpyHtoD_v2)

static CUresult ts_cuMemcpyHtoD_v2_ptds(CUdeviceptr dst, const void *src, size_t n)
{
	htod_fn real = (htod_fn)export_real(E_cuMemcpyHtoD_v2_ptds, CALLER());
	return real ? drv_htod(real, 1, dst, src, n) : NO_DRIVER;
}
EXPORT_AS(cuMemcpyHtoD_v2_ptds)

static CUresult ts_cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream s)
{
	htod_async_fn real = (htod_async_fn)export_real(E_cuMemcpyHtoDAsync_v2, CALLER());
	return real ? drv_htod_async(real, 0, dst, src, n, s) : NO_DRIVER;
}
EXPORT_AS(cuMemcpyHtoDAsync_v2)

static CUresult ts_cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dst, const void *src, size_t n, CUstream s)
{
	htod_async_fn real = (htod_async_fn)export_real(E_cuMemcpyHtoDAsync_v2_ptsz, CALLER());
	return real ? drv_htod_async(real, 1, dst, src, n, s) : NO_DRIVER;
}
EXPORT_AS(cuMemcpyHtoDAsync_v2_ptsz)

static CUresult ts_cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
	memcpy_fn real = (memcpy_fn)export_real(E_cuMemcpy, CALLER());
	return real ? drv_memcpy(real, 0, dst, src, n) : NO_DRIVER;
}
EXPORT_AS(cuMemcpy)

static CUresult ts_cuMemcpy_ptds(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
	memcpy_fn real = (memcpy_fn)export_real(E_cuMemcpy_ptds, CALLER());
	return real ? drv_memcpy(real, 1, dst, src, n) : NO_DRIVER;
}
EXPORT_AS(cuMemcpy_ptds)

static CUresult ts_cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s)
{
	memcpy_async_fn real = (memcpy_async_fn)export_real(E_cuMemcpyAsync, CALLER());
	return real ? drv_memcpy_async(real, 0, dst, src, n, s) : NO_DRIVER;
}
EXPORT_AS(cuMemcpyAsync)

static CUresult ts_cuMemcpyAsync_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s)
{
	memcpy_async_fn real = (memcpy_async_fn)export_real(E_cuMemcpyAsync_ptsz, CALLER());
	return real ? drv_memcpy_async(real, 1, dst, src, n, s) : NO_DRIVER;
}
EXPORT_AS(cuMemcpyAsync_ptsz)

static CUresult ts_cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags)
{
	return getproc_do(export_real(E_cuGetProcAddress, CALLER()), 0, symbol, pfn, version, flags, NULL);
}
EXPORT_AS(cuGetProcAddress)

static CUresult ts_cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
				       CUdriverProcAddressQueryResult *status)
{
	return getproc_do(export_real(E_cuGetProcAddress_v2, CALLER()), 1, symbol, pfn, version, flags, status);
}
EXPORT_AS(cuGetProcAddress_v2)

static CUresult ts_cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags)
{
	peer_enable_fn real = (peer_enable_fn)export_real(E_cuCtxEnablePeerAccess, CALLER());
	return real ? drv_peer_enable(real, peer, flags) : NO_DRIVER;
}
EXPORT_AS(cuCtxEnablePeerAccess)

static CUresult ts_cuCtxDisablePeerAccess(CUcontext peer)
{
	peer_disable_fn real = (peer_disable_fn)export_real(E_cuCtxDisablePeerAccess, CALLER());
	return real ? drv_peer_disable(real, peer) : NO_DRIVER;
}
EXPORT_AS(cuCtxDisablePeerAccess)

#define CTX_DEV_EXPORT(name, reset)                                               \
	static CUresult ts_##name(CUdevice dev)                                   \
	{                                                                         \
		ctx_dev_fn real = (ctx_dev_fn)export_real(E_##name, CALLER());    \
		return real ? drv_ctx_dev(real, dev, reset) : NO_DRIVER;          \
	}                                                                         \
	EXPORT_AS(name)
CTX_DEV_EXPORT(cuDevicePrimaryCtxReset, 1)
CTX_DEV_EXPORT(cuDevicePrimaryCtxReset_v2, 1)
CTX_DEV_EXPORT(cuDevicePrimaryCtxRelease, 0)
CTX_DEV_EXPORT(cuDevicePrimaryCtxRelease_v2, 0)

#define CTX_DESTROY_EXPORT(name)                                                       \
	static CUresult ts_##name(CUcontext ctx)                                       \
	{                                                                              \
		ctx_destroy_fn real = (ctx_destroy_fn)export_real(E_##name, CALLER()); \
		return real ? drv_ctx_destroy(real, ctx) : NO_DRIVER;                  \
	}                                                                              \
	EXPORT_AS(name)
CTX_DESTROY_EXPORT(cuCtxDestroy)
CTX_DESTROY_EXPORT(cuCtxDestroy_v2)

/* ---- dlsym ---------------------------------------------------------------------------------------- */

typedef void *(*dlsym_fn)(void *, const char *);
static dlsym_fn _Atomic real_dlsym;

TS_UNINSTRUMENTED static dlsym_fn get_real_dlsym(void)
{
	dlsym_fn fn = atomic_load_explicit(&real_dlsym, memory_order_relaxed);
	if (!fn) {
		/* glibc >= 2.34 versions dlsym in libc; older ones in libdl. */
		fn = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
		if (!fn)
			fn = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
		atomic_store_explicit(&real_dlsym, fn, memory_order_relaxed);
	}
	return fn;
}

/* A hooked name: look it up for the caller, answer with a wrapper. */
__attribute__((used, visibility("hidden"))) void *ts_dlsym_hook(void *handle, const char *name, const void *caller);
void *ts_dlsym_hook(void *handle, const char *name, const void *caller)
{
	int e = hooked_name(name);
	void *p = get_real_dlsym()(handle, name);
	if (e < 0)
		return jpeg_name(name) ? ts_jpeg_dlsym(name, caller, p) : p;
	int wrapping = mapping_on();
	if (p && !ours(p)) {
		/* A real library's definition (a handle into it, or found first). */
		if (!wrapping)
			return p;
		int saved = errno;
		void *w = wrap(exports[e].kind, p);
		errno = saved;
		if (!w)
			return p;
		ADD(wrapped_dlsym, 1);
		atomic_store_explicit(&st.touched, 1, memory_order_relaxed);
		return w;
	}
	if (!p && handle != RTLD_DEFAULT)
		return NULL; /* not there: the real dlsym's answer, dlerror() included */
	/*
	 * Our own export (the global scope has us first: RTLD_DEFAULT, the
	 * program's handle) or nothing: what would the caller have found
	 * without us? The next definition, else one in its own tree. None: NULL,
	 * as without the shim; a program probing whether CUDA is loaded must
	 * not be told yes because we are, whatever the mode. Not wrapping (the
	 * shim off, or the process exiting): that definition itself.
	 */
	int saved = errno;
	void *q = ts_real_next(name);
	if (!q)
		q = lookup_from(caller, name);
	void *w = q && wrapping ? wrap(exports[e].kind, q) : NULL;
	if (q)
		(void)dlerror(); /* our misses left an error; a found symbol leaves none */
	else
		(void)ts_real_dlsym(RTLD_NEXT, name); /* last, so dlerror() tells "undefined symbol" */
	errno = saved;
	if (w) {
		ADD(wrapped_dlsym, 1);
		atomic_store_explicit(&st.touched, 1, memory_order_relaxed);
	}
	return w ? w : q;
}

TS_UNINSTRUMENTED static void *dlsym_none(void *handle, const char *name)
{
	(void)handle, (void)name;
	return NULL;
}

/* Where the dlsym entry goes: the real dlsym, reached by a jump so that it
 * sees our caller's return address, or ts_dlsym_hook for a hooked name. */
__attribute__((used, visibility("hidden"))) void *ts_dlsym_route(void *handle, const char *name);
TS_UNINSTRUMENTED void *ts_dlsym_route(void *handle, const char *name)
{
	dlsym_fn real = get_real_dlsym();
	if (!real)
		return (void *)dlsym_none;
	/*
	 * Hooked names in every mode: the real dlsym finds our exports even
	 * where nothing stands behind them. RTLD_NEXT goes to it with the
	 * caller's return address, which names the object to search after:
	 * from the program itself (before us), that finds our export, which
	 * wraps the next definition, as an interposer should; with none behind
	 * us (no CUDA library or libjpeg loaded, or only RTLD_LOCAL), nothing,
	 * as without us (a call of our libjpeg export would abort then). Our
	 * own look for it has failed then, so dlerror() says "undefined symbol".
	 */
	if (handle == RTLD_NEXT)
		return (hooked_name(name) >= 0 || jpeg_name(name)) && !ts_real_next(name) ? (void *)dlsym_none
											    : (void *)real;
	if (hooked_name(name) < 0 && !jpeg_name(name))
		return (void *)real;
	return (void *)ts_dlsym_hook;
}

/*
 * dlsym(handle, name): keep both arguments, ask ts_dlsym_route where to go,
 * restore them, pass our return address as a third argument (for the hook)
 * and jump. The stack is as the caller left it when the target runs.
 */
#if defined(__x86_64__)
__asm__(".text\n"
	".globl dlsym\n"
	".type dlsym, @function\n"
	".p2align 4\n"
	"dlsym:\n"
	"\t.cfi_startproc\n"
#ifdef __CET__
	"\tendbr64\n"
#endif
	"\tpushq %rdi\n"
	"\t.cfi_adjust_cfa_offset 8\n"
	"\tpushq %rsi\n"
	"\t.cfi_adjust_cfa_offset 8\n"
	"\tsubq $8, %rsp\n" /* 16-byte alignment for the call */
	"\t.cfi_adjust_cfa_offset 8\n"
	"\tcall ts_dlsym_route\n"
	"\taddq $8, %rsp\n"
	"\t.cfi_adjust_cfa_offset -8\n"
	"\tpopq %rsi\n"
	"\t.cfi_adjust_cfa_offset -8\n"
	"\tpopq %rdi\n"
	"\t.cfi_adjust_cfa_offset -8\n"
	"\tmovq (%rsp), %rdx\n"
	"\tjmp *%rax\n"
	"\t.cfi_endproc\n"
	".size dlsym, .-dlsym\n");
#else
/* No dlsym entry written for this architecture yet (aarch64 needs its own):
 * dlsym is not interposed, so only exported symbols and cuGetProcAddress
 * reached through them are hooked. */
#endif

/* ---- counters out ---------------------------------------------------------------------------------- */

TS_EXPORT int tsshim_cuda_stats(struct tsshim_cuda_stats *out, size_t size)
{
	if (!out)
		return -1;
	struct tsshim_cuda_stats s = {
		.runtime_copies = atomic_load(&st.runtime),
		.driver_copies = atomic_load(&st.driver),
		.h2d_copies = atomic_load(&st.h2d),
		.h2d_bytes = atomic_load(&st.h2d_bytes),
		.unknown_copies = atomic_load(&st.unknown),
		.batches_replaced = atomic_load(&st.replaced),
		.wrapped_dlsym = atomic_load(&st.wrapped_dlsym),
		.wrapped_getproc = atomic_load(&st.wrapped_getproc),
		.unwrapped_full = atomic_load(&st.full),
	};
	memcpy(out, &s, size < sizeof(s) ? size : sizeof(s));
	return 0;
}

/* At exit, in a process that met CUDA through us (not in a forked child:
 * those counts are the parent's). */
__attribute__((destructor)) static void ts_cuda_fini(void)
{
	uint64_t rt = atomic_load(&st.runtime), drv = atomic_load(&st.driver);
	if (atomic_load(&ts_is_fork_child) || (!atomic_load(&st.touched) && rt + drv == 0))
		return;
	ts_debug("cuda: %llu copies seen (runtime %llu, driver %llu), H2D %llu copies %llu bytes, batches replaced %llu",
		 (unsigned long long)(rt + drv), (unsigned long long)rt, (unsigned long long)drv,
		 (unsigned long long)atomic_load(&st.h2d), (unsigned long long)atomic_load(&st.h2d_bytes),
		 (unsigned long long)atomic_load(&st.replaced));
}
