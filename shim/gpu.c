/* SPDX-License-Identifier: MIT */
/* The GPU side of a feed: keep the producer's uploads, serve consumers' (gpu.h). */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "feed.h"
#include "gpu.h"
#include "gpuring.h"
#include "log.h"
#include "real.h"
#include "shim.h"

/* ---- the driver functions we use, from the loaded libcuda ------------------------- */

static struct {
	CUresult (*CtxGetCurrent)(CUcontext *);
	CUresult (*CtxSetCurrent)(CUcontext);
	CUresult (*CtxGetDevice)(CUdevice *);
	CUresult (*PointerGetAttribute)(void *, CUpointer_attribute, CUdeviceptr);
	CUresult (*MemAlloc)(CUdeviceptr *, size_t);
	CUresult (*MemFree)(CUdeviceptr);
	CUresult (*IpcGetMemHandle)(CUipcMemHandle *, CUdeviceptr);
	CUresult (*IpcOpenMemHandle)(CUdeviceptr *, CUipcMemHandle, unsigned int);
	CUresult (*IpcCloseMemHandle)(CUdeviceptr);
	CUresult (*MemGetAddressRange)(CUdeviceptr *, size_t *, CUdeviceptr);
	CUresult (*EventCreate)(CUevent *, unsigned int);
	CUresult (*EventDestroy)(CUevent);
	CUresult (*EventRecord)(CUevent, CUstream);
	CUresult (*EventQuery)(CUevent);
	CUresult (*EventSynchronize)(CUevent);
	CUresult (*IpcGetEventHandle)(CUipcEventHandle *, CUevent);
	CUresult (*IpcOpenEventHandle)(CUevent *, CUipcEventHandle);
	CUresult (*StreamSynchronize)(CUstream);
	CUresult (*StreamQuery)(CUstream);
	CUresult (*MemcpyAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
	CUresult (*StreamIsCapturing)(CUstream, CUstreamCaptureStatus *);
	CUresult (*ThreadExchangeStreamCaptureMode)(CUstreamCaptureMode *);
	CUresult (*CtxGetDeviceOf)(CUdevice *, CUcontext); /* cuCtxGetDevice_v2 (12.8); NULL before */
	CUresult (*PrimaryCtxGetState)(CUdevice, unsigned int *, int *);
	CUresult (*PrimaryCtxRetain)(CUcontext *, CUdevice);
	CUresult (*PrimaryCtxRelease)(CUdevice);
} drv;

/*
 * 0: no driver loaded when we last looked (a Python job loads CUDA when it
 * first uses it, after the shim and its loader layer are up: look again
 * next time); 1: resolved; -1: the driver lacks a function we use.
 */
static _Atomic int drv_state;
static pthread_mutex_t drv_mu = PTHREAD_MUTEX_INITIALIZER;

static void drv_resolve(void)
{
	static const struct {
		size_t off;
		const char *name;
	} names[] = {
#define F(field, sym) {offsetof(__typeof__(drv), field), sym}
		F(CtxGetCurrent, "cuCtxGetCurrent"), F(CtxSetCurrent, "cuCtxSetCurrent"), F(CtxGetDevice, "cuCtxGetDevice"),
		F(PointerGetAttribute, "cuPointerGetAttribute"), F(MemAlloc, "cuMemAlloc_v2"),
		F(MemFree, "cuMemFree_v2"), F(IpcGetMemHandle, "cuIpcGetMemHandle"),
		F(IpcOpenMemHandle, "cuIpcOpenMemHandle_v2"), F(IpcCloseMemHandle, "cuIpcCloseMemHandle"),
		F(MemGetAddressRange, "cuMemGetAddressRange_v2"),
		F(EventCreate, "cuEventCreate"), F(EventDestroy, "cuEventDestroy_v2"), F(EventRecord, "cuEventRecord"),
		F(EventQuery, "cuEventQuery"), F(EventSynchronize, "cuEventSynchronize"),
		F(IpcGetEventHandle, "cuIpcGetEventHandle"), F(IpcOpenEventHandle, "cuIpcOpenEventHandle"),
		F(StreamSynchronize, "cuStreamSynchronize"), F(StreamQuery, "cuStreamQuery"),
		F(PrimaryCtxGetState, "cuDevicePrimaryCtxGetState"), F(PrimaryCtxRetain, "cuDevicePrimaryCtxRetain"),
		F(PrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2"),
		F(MemcpyAsync, "cuMemcpyAsync"), F(StreamIsCapturing, "cuStreamIsCapturing"),
		F(ThreadExchangeStreamCaptureMode, "cuThreadExchangeStreamCaptureMode"),
#undef F
	};
	/* Only a driver the process has loaded itself: we never load CUDA. */
	void *h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
	if (!h) {
		dlerror(); /* not loaded: the program's next dlerror() must not see our question */
		return;
	}
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		void *p = ts_real_dlsym(h, names[i].name);
		if (!p) {
			ts_info("gpu: the CUDA driver lacks %s: uploads are not shared on the GPU", names[i].name);
			ts_real_dlclose(h);
			atomic_store_explicit(&drv_state, -1, memory_order_release);
			return;
		}
		memcpy((char *)&drv + names[i].off, &p, sizeof(p));
	}
	/* optional: without it the program's peer-access calls are not looked at (below) */
	drv.CtxGetDeviceOf = (CUresult(*)(CUdevice *, CUcontext))ts_real_dlsym(h, "cuCtxGetDevice_v2");
	ts_real_dlclose(h); /* NOLOAD took a reference; the driver stays loaded */
	atomic_store_explicit(&drv_state, 1, memory_order_release); /* after drv is filled in */
}

static int drv_ready(void)
{
	int st = atomic_load_explicit(&drv_state, memory_order_acquire);
	if (st)
		return st > 0;
	pthread_mutex_lock(&drv_mu);
	if (!atomic_load_explicit(&drv_state, memory_order_relaxed))
		drv_resolve();
	pthread_mutex_unlock(&drv_mu);
	return atomic_load_explicit(&drv_state, memory_order_acquire) > 0;
}

int ts_gpu_driver_ready(void)
{
	return drv_ready();
}

/* ---- peer access our mappings enabled ------------------------------------------------ */

/*
 * peer_open maps a producer's buffer with CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
 * (which the runtime documents as required). A buffer of another device
 * then gets peer access enabled between the devices "as if the user called
 * cuCtxEnablePeerAccess" (cuda.h): without a word from us, the program's
 * own enable would answer CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED and a
 * disable would succeed where it had enabled nothing. So, per (context,
 * peer device): lazy, our mapping may have enabled access; prog, the
 * program has (as far as it knows). The program's enable and disable
 * (cuda.c's hooks, which every runtime reaches through cuGetProcAddress)
 * get the answers they would get without us; access our mapping enabled
 * stays enabled, for our copies (a kernel of the program that reads peer
 * memory it disabled access to is not stopped).
 */
#define MAX_PEER_NOTES 32
static struct peer_note {
	CUcontext ctx;
	CUdevice dev;
	int lazy, prog;
} peer_notes[MAX_PEER_NOTES];
static unsigned npeer_notes;
static pthread_mutex_t peer_mu = PTHREAD_MUTEX_INITIALIZER;

/* The note of (ctx, dev), added when `add`; NULL when absent or full. With peer_mu. */
static struct peer_note *peer_note(CUcontext ctx, CUdevice dev, int add)
{
	for (unsigned i = 0; i < npeer_notes; i++)
		if (peer_notes[i].ctx == ctx && peer_notes[i].dev == dev)
			return &peer_notes[i];
	if (!add || npeer_notes == MAX_PEER_NOTES)
		return NULL;
	peer_notes[npeer_notes] = (struct peer_note){ctx, dev, 0, 0};
	return &peer_notes[npeer_notes++];
}

/* We mapped memory of device mdev in ctx (whose device is cdev). */
static void peer_note_lazy(CUcontext ctx, CUdevice cdev, int mdev)
{
	if (mdev < 0 || mdev == cdev)
		return;
	pthread_mutex_lock(&peer_mu);
	struct peer_note *n = peer_note(ctx, mdev, 1);
	if (n && !n->lazy) {
		n->lazy = 1;
		ts_debug("gpu: mapping device %d's ring buffers in a context of device %d enables peer access; "
			 "the program's own peer-access calls are answered as without the shim", mdev, cdev);
	}
	pthread_mutex_unlock(&peer_mu);
}

/* The current context and peer's device; 0 when either cannot be had. */
static int peer_pair(CUcontext peer, CUcontext *ctx, CUdevice *dev)
{
	return drv_ready() && drv.CtxGetDeviceOf && drv.CtxGetCurrent(ctx) == CUDA_SUCCESS && *ctx &&
	       drv.CtxGetDeviceOf(dev, peer) == CUDA_SUCCESS;
}

CUresult ts_gpu_peer_enable(CUresult (*real)(CUcontext, unsigned int), CUcontext peer, unsigned int flags)
{
	CUresult r = real(peer, flags);
	CUcontext ctx;
	CUdevice dev;
	if ((r != CUDA_SUCCESS && r != CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED) || !peer_pair(peer, &ctx, &dev))
		return r;
	pthread_mutex_lock(&peer_mu);
	struct peer_note *n = peer_note(ctx, dev, r == CUDA_SUCCESS);
	if (n && r == CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED && n->lazy && !n->prog)
		r = CUDA_SUCCESS; /* enabled by our mapping, not by the program */
	if (n && r == CUDA_SUCCESS)
		n->prog = 1;
	pthread_mutex_unlock(&peer_mu);
	return r;
}

CUresult ts_gpu_peer_disable(CUresult (*real)(CUcontext), CUcontext peer)
{
	CUcontext ctx;
	CUdevice dev;
	if (!peer_pair(peer, &ctx, &dev))
		return real(peer);
	pthread_mutex_lock(&peer_mu);
	struct peer_note *n = peer_note(ctx, dev, 0);
	CUresult r;
	if (n && n->lazy) /* our mapping needs the access: what the program asked for is taken back, not the device's */
		r = n->prog ? CUDA_SUCCESS : CUDA_ERROR_PEER_ACCESS_NOT_ENABLED;
	else
		r = real(peer);
	if (n && r == CUDA_SUCCESS)
		n->prog = 0;
	pthread_mutex_unlock(&peer_mu);
	return r;
}

/* ---- stream capture ----------------------------------------------------------------- */

int ts_gpu_in_capture(CUstream s)
{
	CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
	if (!drv_ready())
		return 0; /* nothing is kept or served without a driver */
	/* the legacy stream beside a blocking capture answers an error: not ours to use either */
	return drv.StreamIsCapturing(s, &st) != CUDA_SUCCESS || st != CU_STREAM_CAPTURE_STATUS_NONE;
}

/*
 * Would the program's own synchronous copy be refused because of a capture
 * (its thread's own, not begun relaxed, or another thread's begun in global
 * mode)? A synchronous copy is one of CUDA's "potentially unsafe" calls; so
 * is a query, asked here in the thread's own capture mode. A barred query
 * invalidates the captures that bar it, as the program's copy, which then
 * goes to the driver and is refused, does anyway. Served, the copy would
 * have succeeded, and the capture gone on, where CUDA refuses both.
 */
int ts_gpu_sync_barred(CUstream s)
{
	if (!drv_ready())
		return 0;
	CUresult r = drv.StreamQuery(s);
	return r != CUDA_SUCCESS && r != CUDA_ERROR_NOT_READY;
}

/*
 * Our own driver calls run in relaxed capture mode; relax_end puts the
 * thread's mode back. A program capturing a CUDA graph in another thread
 * in the default global mode bars every thread in global mode from
 * "potentially unsafe" calls (cuMemAlloc, cuMemFree, IPC opens, event
 * queries, synchronisations): one of ours would fail and invalidate the
 * program's capture. Relaxed lifts the bar for this thread's calls only,
 * and ours never touch a capturing stream (cuda.c passes those copies by).
 * 1: switched.
 */
static inline int relax_begin(CUstreamCaptureMode *prev)
{
	*prev = CU_STREAM_CAPTURE_MODE_RELAXED;
	return drv.ThreadExchangeStreamCaptureMode(prev) == CUDA_SUCCESS;
}

static inline void relax_end(int relaxed, CUstreamCaptureMode prev)
{
	if (relaxed)
		drv.ThreadExchangeStreamCaptureMode(&prev);
}

/* ---- per-process state -------------------------------------------------------------- */

#define MAX_OWN     (2 * TS_MAX_DEPTH + 8)
#define MAX_PENDING 64
#define EARLY_WAITS 8            /* see hold_pieces */
/*
 * Batches kept at once. A loop that fetches ahead (Lightning's prefetching
 * fetcher: the next batch is registered before this one is uploaded) has
 * two open; one more for a loop that fetches two ahead.
 */
#define MAX_KEEPS   3

struct own_buf {                 /* an allocation of ours in the ring */
	int rec;                 /* its record; -1: entry unused */
	uint64_t uniq;
	CUdeviceptr ptr;
	CUevent ev;
	uint64_t size;
	CUcontext ctx;
	int dev;                 /* ctx's device */
	unsigned long long id;   /* the driver's CU_POINTER_ATTRIBUTE_BUFFER_ID; 0: not had */
	int going;               /* its context may be going: see ts_gpu_ctx_going */
	int slot;                /* the slot it serves; OWN_RETIRED, or OWN_SPARE */
};

#define OWN_RETIRED (-1)         /* freed once no one holds or has it open */
#define OWN_SPARE   (-2)         /* given up by a slot while held: taken again by a slot later */

struct peer_buf {                /* a record of another process, opened here */
	uint64_t uniq;           /* 0: not open */
	CUdeviceptr ptr;
	CUevent ev;
	CUcontext ctx;
	int dev;                 /* ctx's device */
	size_t real;             /* the opened allocation's size, from the driver */
	unsigned copies;         /* our copies from it in flight */
};

struct pending {                 /* one served upload in flight */
	CUevent done;
	unsigned nbuf;
	unsigned buf[8];
};

struct ts_gpu {
	struct ts_feed *f;
	struct ts_gpuring ring;
	int ring_state;          /* 0 not tried, 1 open, 2 open but rewritten by a peer (not used), 3 drained
				  * (our context is about to go: see drain), -1 failed */
	pthread_mutex_t mu;
	/* producer */
	struct own_buf own[MAX_OWN];
	int slot_own[TS_MAX_DEPTH];
	struct keep {
		int active;
		uint64_t seq;
		unsigned slot;
		int own;
		uint32_t npos;
		int stream_set;          /* announced: the first upload's stream is the batch's */
		int recorded;            /* the event follows every position complete so far */
		CUstream stream;
		const void *stream_thread; /* stream is CU_STREAM_PER_THREAD: whose */
		uint64_t len[TS_MAX_POSITIONS], off[TS_MAX_POSITIONS], done[TS_MAX_POSITIONS];
	} k[MAX_KEEPS];
	/*
	 * The positions this job uploads of each batch, learnt: at first all;
	 * a batch left with some never uploaded (labels kept on the host, an
	 * index tensor) is made READY with those, and the next is READY as soon
	 * as they are in. A later upload of a READY batch widens it again.
	 */
	uint32_t expect, expect_npos;
	int have_ready;
	uint64_t ready_seq;      /* the last batch made READY: nothing more of it is kept */
	uint64_t announced;      /* the last batch announced */
	int ahead;               /* learnt: the job uploads a batch after announcing the next */
	/*
	 * Learnt: the context of the device the job uploads its batches to. A
	 * job on cuda:1 that never called set_device registers its batches with
	 * device 0's context current (or none) and uploads them with device 1's
	 * (PyTorch's device guard): ring buffers go in this one, whatever is
	 * current when a batch is announced.
	 */
	CUcontext up_ctx;
	uint64_t allocs, spares_taken; /* ring buffers allocated; slots given a spare instead */
	/* consumer */
	struct peer_buf peer[TS_GPU_MAX_BUFS];
	struct pending pend[MAX_PENDING];
	unsigned npend;
	unsigned early_waits;    /* uploads that waited before the producer kept anything */
};

/*
 * Every ts_gpu of this process, so that a copy of any kind lets go of the
 * holds of served copies that have completed (ts_gpu_poll), and so that the
 * ring buffers of all of them are drained before the process's context goes
 * (drain_at_exit). Lock order: gpus_mu, then a g->mu (only tried, or timed).
 */
#define MAX_GPUS 32
static struct ts_gpu *gpus[MAX_GPUS];
static pthread_mutex_t gpus_mu = PTHREAD_MUTEX_INITIALIZER;
_Atomic unsigned ts_gpu_npending;

static void gpus_add(struct ts_gpu *g)
{
	pthread_mutex_lock(&gpus_mu);
	unsigned i;
	for (i = 0; i < MAX_GPUS && gpus[i]; i++)
		;
	if (i < MAX_GPUS)
		gpus[i] = g;
	else
		ts_debug("gpu: more than %d GPU feeds: this one is not drained at exit", MAX_GPUS);
	pthread_mutex_unlock(&gpus_mu);
}

static void gpus_remove(struct ts_gpu *g)
{
	pthread_mutex_lock(&gpus_mu);
	for (unsigned i = 0; i < MAX_GPUS; i++)
		if (gpus[i] == g)
			gpus[i] = NULL;
	pthread_mutex_unlock(&gpus_mu);
}

struct ts_gpu *ts_gpu_new(struct ts_feed *f)
{
	struct ts_gpu *g = calloc(1, sizeof(*g));
	if (!g)
		return NULL;
	g->f = f;
	pthread_mutex_init(&g->mu, NULL);
	for (unsigned i = 0; i < MAX_OWN; i++)
		g->own[i].rec = -1;
	for (unsigned i = 0; i < TS_MAX_DEPTH; i++)
		g->slot_own[i] = -1;
	gpus_add(g);
	return g;
}

/*
 * The table's geometry is fixed when it is made; one whose header changed
 * since we mapped it was rewritten by a buggy or hostile peer: stop using it
 * (our own buffers are still freed at the end), and say so once.
 */
static int ring_check(struct ts_gpu *g)
{
	if (ts_gpuring_intact(&g->ring) == 0)
		return 0;
	ts_warn("gpu: the GPU ring of '%s' was rewritten by another process (depth %u, was %u): uploads go "
		"from the host", g->f->s.name, __atomic_load_n(&g->ring.t->depth, __ATOMIC_RELAXED),
		ts_gpuring_depth(&g->ring));
	g->ring_state = 2;
	for (unsigned i = 0; i < MAX_KEEPS; i++)
		g->k[i].active = 0;
	return -1;
}

static int ring_open(struct ts_gpu *g)
{
	if (g->ring_state == 1)
		return ring_check(g);
	if (g->ring_state)
		return -1;
	char path[TS_PATH_MAX];
	int ret = ts_gpuring_path(path, sizeof(path), g->f->s.name, g->f->incarnation);
	if (!ret)
		ret = ts_gpuring_open(&g->ring, path, ts_ring_depth(g->f->s.seg));
	if (ret) {
		ts_info("gpu: cannot open the GPU ring of '%s' (%s): uploads go from the host", g->f->s.name,
			strerror(-ret));
		g->ring_state = -1;
		return -1;
	}
	/* a member slot reused from a dead process: its holds and mappings are not ours */
	ts_gpuring_unhold_all(&g->ring, g->f->s.self);
	ts_gpuring_unmap_all(&g->ring, g->f->s.self);
	ts_gpuring_reclaim_dead(&g->ring, g->f->s.seg);
	g->ring_state = 1;
	return 0;
}

/* ---- producer ------------------------------------------------------------------------- */

static int in_ctx(CUcontext ctx, CUcontext *prev);
static void in_ctx_end(int switched, CUcontext prev);

static void own_free(struct ts_gpu *g, int i)
{
	struct own_buf *o = &g->own[i];
	CUcontext prev;
	ts_gpuring_buf_remove(&g->ring, (unsigned)o->rec, o->uniq);
	int sw = in_ctx(o->ctx, &prev); /* its own context, whatever thread frees it */
	drv.EventDestroy(o->ev);
	drv.MemFree(o->ptr);
	in_ctx_end(sw, prev);
	o->rec = -1;
}

/* Free retired buffers no live process reads or has open any more. */
static void own_reap(struct ts_gpu *g)
{
	for (int i = 0; i < (int)MAX_OWN; i++)
		if (g->own[i].rec >= 0 && g->own[i].slot == OWN_RETIRED &&
		    !ts_gpuring_buf_in_use(&g->ring, g->f->s.seg, (unsigned)g->own[i].rec, g->f->s.self))
			own_free(g, i);
}

/* Our buffer i serves no slot any more: freed once unheld and closed by every consumer. */
static void own_retire(struct ts_gpu *g, int i)
{
	g->own[i].slot = OWN_RETIRED;
	ts_gpuring_buf_retire(&g->ring, (unsigned)g->own[i].rec, g->own[i].uniq);
}

/*
 * Spares. A slot whose buffer is still being read when the slot comes round
 * again gets another buffer; allocating one, and freeing the old one later,
 * would put cuMemAlloc and cuMemFree (which waits for the whole device) on
 * the upload path each time a consumer lags. The old buffer becomes a spare
 * instead, still exported and still open in the consumers, and the next slot
 * in need takes a spare nobody holds. At most depth spares; more retire.
 */
static void own_spare(struct ts_gpu *g, int i)
{
	unsigned n = 0;
	for (unsigned j = 0; j < MAX_OWN; j++)
		n += g->own[j].rec >= 0 && g->own[j].slot == OWN_SPARE;
	if (n >= ts_gpuring_depth(&g->ring))
		own_retire(g, i);
	else
		g->own[i].slot = OWN_SPARE;
}

/*
 * A spare of at least `size` bytes in `ctx` for slot `slot`, nobody holding
 * it once the slot's word names it (WRITING: the same Dekker pair as for a
 * slot's own buffer, header of gpuring.h), or -1.
 */
static int spare_take(struct ts_gpu *g, unsigned slot, uint64_t seq, uint64_t size, CUcontext ctx)
{
	for (int i = 0; i < (int)MAX_OWN; i++) {
		struct own_buf *o = &g->own[i];
		if (o->rec < 0 || o->slot != OWN_SPARE || o->size < size || o->ctx != ctx)
			continue;
		ts_gpuring_slot_begin(&g->ring, slot, (unsigned)g->f->s.self, seq, (unsigned)o->rec);
		if (ts_gpuring_buf_held(&g->ring, g->f->s.seg, (unsigned)o->rec, g->f->s.self))
			continue;
		o->slot = (int)slot;
		g->spares_taken++;
		return i;
	}
	return -1;
}

/*
 * Run our own driver calls in context `ctx`: made current for them, and
 * the caller's current context put back after (in_ctx_end). 1: switched.
 */
static int in_ctx(CUcontext ctx, CUcontext *prev)
{
	*prev = NULL;
	if (drv.CtxGetCurrent(prev) != CUDA_SUCCESS || *prev == ctx)
		return 0;
	return drv.CtxSetCurrent(ctx) == CUDA_SUCCESS;
}

static void in_ctx_end(int switched, CUcontext prev)
{
	if (switched)
		drv.CtxSetCurrent(prev);
}

static pthread_once_t drain_once = PTHREAD_ONCE_INIT;
static void drain_register(void);

/* A fresh exported allocation for `slot`, in the current context. */
#define IPC_GRAIN (2ull << 20)

static int own_alloc(struct ts_gpu *g, unsigned slot, uint64_t size)
{
	int i;
	for (i = 0; i < (int)MAX_OWN && g->own[i].rec >= 0; i++)
		;
	if (i == (int)MAX_OWN)
		return -1;
	struct own_buf *o = &g->own[i];
	CUipcMemHandle mh;
	CUipcEventHandle eh;
	CUdevice dev;
	memset(o, 0, sizeof(*o));
	o->rec = -1;
	if (drv.CtxGetCurrent(&o->ctx) != CUDA_SUCCESS || !o->ctx || drv.CtxGetDevice(&dev) != CUDA_SUCCESS)
		return -1;
	/*
	 * A whole number of 2 MiB: the driver may carve smaller allocations out
	 * of a larger block, and an IPC handle then shares the whole block
	 * (other allocations of ours included) and maps it whole, so that the
	 * consumer's address-range check refuses it (CUDA Programming Guide,
	 * interprocess communication: share 2 MiB-aligned sizes).
	 */
	size = (size + IPC_GRAIN - 1) / IPC_GRAIN * IPC_GRAIN;
	if (drv.MemAlloc(&o->ptr, size) != CUDA_SUCCESS)
		return -1;
	if (drv.EventCreate(&o->ev, CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) {
		drv.MemFree(o->ptr);
		return -1;
	}
	if (drv.IpcGetMemHandle(&mh, o->ptr) != CUDA_SUCCESS || drv.IpcGetEventHandle(&eh, o->ev) != CUDA_SUCCESS)
		goto fail;
	int rec = ts_gpuring_buf_add(&g->ring, g->f->s.seg, (unsigned)g->f->s.self, (uint32_t)dev, size, mh.reserved,
				     eh.reserved, &o->uniq);
	if (rec < 0)
		goto fail;
	o->rec = rec;
	o->size = size;
	o->dev = (int)dev;
	if (drv.PointerGetAttribute(&o->id, CU_POINTER_ATTRIBUTE_BUFFER_ID, o->ptr) != CUDA_SUCCESS)
		o->id = 0;
	o->slot = (int)slot;
	pthread_once(&drain_once, drain_register);
	return i;
fail:
	drv.EventDestroy(o->ev);
	drv.MemFree(o->ptr);
	return -1;
}

/* The buffer slot `slot` writes into for a batch of `size` bytes: its own if
 * big enough and unheld (after the slot word says WRITING), else a fresh one. */
static int slot_buffer(struct ts_gpu *g, unsigned slot, uint64_t seq, uint64_t size)
{
	int i = g->slot_own[slot];
	CUcontext ctx = g->up_ctx;
	if (!ctx)
		drv.CtxGetCurrent(&ctx);
	if (i >= 0) {
		struct own_buf *o = &g->own[i];
		ts_gpuring_slot_begin(&g->ring, slot, (unsigned)g->f->s.self, seq, (unsigned)o->rec);
		if (o->size >= size && o->ctx == ctx &&
		    !ts_gpuring_buf_held(&g->ring, g->f->s.seg, (unsigned)o->rec, g->f->s.self))
			return i;
		if (o->size >= size && o->ctx == ctx) {
			atomic_fetch_add_explicit(&g->ring.t->counters.replaced, 1, memory_order_relaxed);
			own_spare(g, i);
		} else {
			own_retire(g, i);
		}
		g->slot_own[slot] = -1;
	}
	own_reap(g);
	if ((i = spare_take(g, slot, seq, size, ctx)) >= 0) {
		g->slot_own[slot] = i;
		return i;
	}
	CUcontext prev;
	int sw = in_ctx(ctx, &prev);
	i = own_alloc(g, slot, size);
	in_ctx_end(sw, prev);
	if (i < 0) {
		ts_gpuring_slot_drop(&g->ring, slot);
		return -1;
	}
	g->allocs++;
	g->slot_own[slot] = i;
	ts_gpuring_slot_begin(&g->ring, slot, (unsigned)g->f->s.self, seq, (unsigned)g->own[i].rec);
	return i;
}

static int keep_untouched(const struct keep *k)
{
	for (uint32_t p = 0; p < k->npos; p++)
		if (k->done[p])
			return 0;
	return 1;
}

static uint32_t all_positions(uint32_t npos)
{
	return npos >= 32 ? UINT32_MAX : (1u << npos) - 1;
}

static int position_complete(const struct keep *k, uint32_t p)
{
	return k->done[p] >= k->len[p];
}

/*
 * The batch kept in k is READY with every position complete so far (the
 * others read as 0 bytes: a consumer's upload of them goes from the host);
 * with none, or no event behind them, it is dropped. Called with g->mu.
 */
static void keep_finish(struct ts_gpu *g, struct keep *k)
{
	uint64_t len[TS_MAX_POSITIONS], total = 0;
	uint32_t got = 0;
	struct own_buf *o = &g->own[k->own];
	for (uint32_t q = 0; q < k->npos; q++) {
		int in = position_complete(k, q);
		len[q] = in ? k->len[q] : 0;
		got |= (uint32_t)in << q;
		total += len[q];
	}
	k->active = 0;
	if (!total || !k->recorded || ts_gpuring_slot_ready(&g->ring, k->slot, o->uniq, k->npos, k->off, len)) {
		ts_gpuring_slot_drop(&g->ring, k->slot);
		return;
	}
	g->expect = got;
	g->expect_npos = k->npos;
	g->have_ready = 1;
	g->ready_seq = k->seq;
	atomic_fetch_add_explicit(&g->ring.t->counters.batches_kept, 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&g->ring.t->counters.bytes_kept, total, memory_order_relaxed);
}

/* Every position this job is known to upload is in. */
static int keep_expected_in(const struct ts_gpu *g, const struct keep *k)
{
	for (uint32_t q = 0; q < k->npos; q++)
		if ((g->expect >> q & 1) && !position_complete(k, q))
			return 0;
	return 1;
}

/*
 * Position p of the batch kept in k is not kept (uploaded in another
 * context, on another stream, or inside a stream capture): nor waited for,
 * from now on. Consumers go from the host for it, at once.
 */
static void keep_skip(struct ts_gpu *g, struct keep *k, uint32_t p)
{
	if (!k || p >= k->npos || position_complete(k, p))
		return;
	g->expect &= ~(1u << p);
	k->done[p] = 0;
	if (keep_expected_in(g, k))
		keep_finish(g, k);
}

static struct keep *keep_of(struct ts_gpu *g, uint64_t seq)
{
	for (unsigned i = 0; i < MAX_KEEPS; i++)
		if (g->k[i].active && g->k[i].seq == seq)
			return &g->k[i];
	return NULL;
}

/* The latest batch being kept, or NULL. */
static const struct keep *keep_newest(const struct ts_gpu *g)
{
	const struct keep *n = NULL;
	for (unsigned i = 0; i < MAX_KEEPS; i++)
		if (g->k[i].active && (!n || g->k[i].seq > n->seq))
			n = &g->k[i];
	return n;
}

/* Finish the batches kept before seq, with what they have (`recorded`: only those with something in). */
static void keep_finish_before(struct ts_gpu *g, uint64_t seq, int recorded)
{
	for (unsigned i = 0; i < MAX_KEEPS; i++)
		if (g->k[i].active && g->k[i].seq < seq && (!recorded || g->k[i].recorded))
			keep_finish(g, &g->k[i]);
}

void ts_gpu_keep_end(struct ts_gpu *g)
{
	pthread_mutex_lock(&g->mu);
	for (unsigned i = 0; i < MAX_KEEPS; i++) {
		if (g->k[i].active && g->ring_state == 1)
			keep_finish(g, &g->k[i]);
		g->k[i].active = 0;
	}
	pthread_mutex_unlock(&g->mu);
}

/*
 * An entry for a new batch seq: a free one, else the oldest batch's, which
 * ends with what it has. So does one in seq's slot (depth batches older).
 */
static struct keep *keep_entry(struct ts_gpu *g, unsigned slot)
{
	struct keep *free = NULL, *oldest = NULL;
	for (unsigned i = 0; i < MAX_KEEPS; i++) {
		struct keep *k = &g->k[i];
		if (k->active && k->slot == slot)
			keep_finish(g, k);
		if (!k->active) {
			if (!free)
				free = k;
		} else if (!oldest || k->seq < oldest->seq) {
			oldest = k;
		}
	}
	if (!free) {
		keep_finish(g, oldest);
		free = oldest;
	}
	return free;
}

/* CU_STREAM_PER_THREAD names another stream in each thread: the thread
 * tells two apart (stream_thread); other handles name one stream. */
static __thread char thread_mark;

static inline const void *stream_thread(CUstream s)
{
	return s == CU_STREAM_PER_THREAD ? &thread_mark : NULL;
}

static struct keep *keep_begin(struct ts_gpu *g, uint64_t seq, uint32_t npos, const uint64_t *len, CUstream s)
{
	uint64_t size = 0, off[TS_MAX_POSITIONS];
	for (uint32_t p = 0; p < npos; p++) {
		off[p] = size;
		size += (len[p] + TS_GPU_ALIGN - 1) / TS_GPU_ALIGN * TS_GPU_ALIGN;
	}
	unsigned slot = (unsigned)(seq % ts_gpuring_depth(&g->ring));
	struct keep *k = keep_entry(g, slot);
	int i = slot_buffer(g, slot, seq, size ? size : TS_GPU_ALIGN);
	if (i < 0)
		return NULL;
	if (g->expect_npos != npos) { /* another kind of batch: learn its positions anew */
		g->expect = all_positions(npos);
		g->expect_npos = npos;
	}
	memcpy(k->off, off, npos * sizeof(*off));
	memcpy(k->len, len, npos * sizeof(*len));
	memset(k->done, 0, sizeof(k->done));
	k->active = 1;
	k->seq = seq;
	k->slot = slot;
	k->own = i;
	k->npos = npos;
	k->recorded = 0;
	k->stream = s;
	k->stream_thread = stream_thread(s);
	k->stream_set = s != NULL;
	return k;
}

void ts_gpu_keep_announce(struct ts_gpu *g, uint64_t seq, uint32_t npos, const uint64_t *len)
{
	CUcontext ctx = NULL;
	CUstreamCaptureMode mode;
	if (!drv_ready() || npos < 1 || npos > TS_MAX_POSITIONS)
		return;
	int relaxed = relax_begin(&mode);
	pthread_mutex_lock(&g->mu);
	/*
	 * A batch still being kept is not given up for the next. The next is
	 * kept too once the job is known to fetch ahead (to register the next
	 * batch before it uploads this one, as Lightning's prefetching fetcher
	 * does); until then it is not, or batches that are never uploaded
	 * unchanged would stay announced several at a time, and consumers
	 * would wait for each. One exception: until the first batch is READY,
	 * one that has a complete position ends here with what it has.
	 * Otherwise a job that never uploads a tensor would leave its first
	 * batch open until the second one's upload, so that consumers reaching
	 * it first go from the host. A tensor of it uploaded later widens what
	 * the next batches wait for, as after any READY.
	 */
	if (!ring_open(g)) {
		if (!g->have_ready)
			keep_finish_before(g, seq, 1);
		if (seq > g->announced)
			g->announced = seq;
		const struct keep *newest = keep_newest(g);
		if ((!newest || (g->ahead && newest->seq < seq)) &&
		    (g->up_ctx || (drv.CtxGetCurrent(&ctx) == CUDA_SUCCESS && ctx)))
			(void)keep_begin(g, seq, npos, len, NULL);
	}
	pthread_mutex_unlock(&g->mu);
	relax_end(relaxed, mode);
}

void ts_gpu_keep(struct ts_gpu *g, uint64_t seq, uint32_t npos, const uint64_t *len, uint32_t p, uint64_t off,
		 CUdeviceptr dst, size_t n, CUstream s, int sync)
{
	CUstreamCaptureMode mode;
	if (!drv_ready() || npos < 1 || npos > TS_MAX_POSITIONS || p >= npos)
		return;
	int relaxed = relax_begin(&mode);
	pthread_mutex_lock(&g->mu);
	if (ring_open(g))
		goto out;
	if (g->have_ready && g->ready_seq == seq) {
		/* a tensor of a batch already READY: kept from the next batch on */
		if (g->expect_npos == npos)
			g->expect |= 1u << p;
		goto out;
	}
	if (seq < g->announced)
		g->ahead = 1;
	struct keep *k = keep_of(g, seq);
	const struct keep *newest = keep_newest(g);
	if (!k && newest && newest->seq > seq)
		goto out; /* a late tensor of a batch not kept (announced when too many were open) */
	keep_finish_before(g, seq, 0); /* a later batch: the earlier ones are over, with what they have */
	/*
	 * The ring buffer lies in the current context: keep only what is uploaded
	 * to its device. By device, not by context: memory of the virtual-memory
	 * API or of a stream-ordered pool (PyTorch's expandable_segments and
	 * cudaMallocAsync allocators) belongs to no context, and nothing was kept.
	 */
	CUcontext ctx = NULL;
	CUdevice cdev;
	unsigned int mtype = 0;
	int ddev = -1;
	if (drv.CtxGetCurrent(&ctx) != CUDA_SUCCESS || !ctx || drv.CtxGetDevice(&cdev) != CUDA_SUCCESS ||
	    drv.PointerGetAttribute(&mtype, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, dst) != CUDA_SUCCESS ||
	    mtype != CU_MEMORYTYPE_DEVICE ||
	    drv.PointerGetAttribute(&ddev, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, dst) != CUDA_SUCCESS ||
	    ddev != (int)cdev)
		goto skip;
	g->up_ctx = ctx;
	if (k && g->own[k->own].ctx != ctx && !k->recorded && keep_untouched(k))
		k->active = 0; /* announced in another context, nothing copied yet: begun again here */
	if ((!k || !k->active) && !(k = keep_begin(g, seq, npos, len, s)))
		goto out;
	if (!k->stream_set) { /* announced: this is the batch's first upload */
		k->stream = s;
		k->stream_thread = stream_thread(s);
		k->stream_set = 1;
	}
	struct own_buf *o = &g->own[k->own];
	/* one stream orders the copies before the event: positions on other streams are not kept */
	/* a position is kept as one run of bytes from its start: done[] is what is covered */
	if (k->stream != s || k->stream_thread != stream_thread(s) || o->ctx != ctx || off != k->done[p] ||
	    n > k->len[p] - off)
		goto skip;
	if (drv.MemcpyAsync(o->ptr + k->off[p] + off, dst, n, s) != CUDA_SUCCESS)
		goto drop;
	/*
	 * A synchronous upload has landed when it returns, and the program may
	 * change dst at once (an in-place kernel on a non-blocking stream, a
	 * free): our copy of it must have read it by then. Before, consumers
	 * were served the changed bytes.
	 */
	if (sync && (drv.EventRecord(o->ev, s) != CUDA_SUCCESS || drv.EventSynchronize(o->ev) != CUDA_SUCCESS))
		goto drop;
	k->done[p] += n;
	if (position_complete(k, p)) {
		/* the event follows every complete position: READY needs no CUDA call later */
		if (drv.EventRecord(o->ev, s) != CUDA_SUCCESS)
			goto drop;
		k->recorded = 1;
	}
	if (keep_expected_in(g, k))
		keep_finish(g, k);
	goto out;
skip:
	keep_skip(g, k, p);
	goto out;
drop:
	ts_gpuring_slot_drop(&g->ring, k->slot);
	k->active = 0;
out:
	pthread_mutex_unlock(&g->mu);
	relax_end(relaxed, mode);
}

void ts_gpu_keep_skip(struct ts_gpu *g, uint64_t seq, uint32_t p)
{
	pthread_mutex_lock(&g->mu);
	if (!ring_open(g))
		keep_skip(g, keep_of(g, seq), p);
	pthread_mutex_unlock(&g->mu);
}

/* ---- consumer --------------------------------------------------------------------------- */

static void peer_close(struct ts_gpu *g, unsigned b)
{
	struct peer_buf *pb = &g->peer[b];
	if (!pb->uniq)
		return;
	/* in the context it was opened in, whichever thread closes it (CUDA: one
	 * importing context per device; a close elsewhere fails) */
	CUcontext prev;
	int sw = in_ctx(pb->ctx, &prev);
	int closed = drv.IpcCloseMemHandle(pb->ptr) == CUDA_SUCCESS;
	drv.EventDestroy(pb->ev);
	in_ctx_end(sw, prev);
	memset(pb, 0, sizeof(*pb));
	/*
	 * After the close: the owner may free it now. A close that failed
	 * leaves the buffer marked as mapped by us: freeing an exported buffer
	 * still mapped in an importer is undefined in CUDA, so the owner keeps
	 * it until we are gone.
	 */
	if (closed)
		ts_gpuring_unmap(&g->ring, g->f->s.self, b);
	else
		ts_debug("gpu: closing our mapping of record %u failed; its owner keeps it while we live", b);
}

/* Our mapping of record b (opened once, reopened when the record changed). */
static struct peer_buf *peer_open(struct ts_gpu *g, const struct ts_gpu_held *h)
{
	struct peer_buf *pb = &g->peer[h->buf];
	CUcontext ctx = NULL;
	if (drv.CtxGetCurrent(&ctx) != CUDA_SUCCESS || !ctx)
		return NULL;
	if (pb->uniq == h->uniq && pb->ctx == ctx)
		return h->size <= pb->real ? pb : NULL; /* the record's size is a peer's word at every hold */
	if (pb->uniq && pb->copies)
		return NULL; /* the old mapping is still being read from */
	peer_close(g, h->buf);
	CUipcMemHandle mh;
	CUipcEventHandle eh;
	memcpy(mh.reserved, h->mem, sizeof(mh.reserved));
	memcpy(eh.reserved, h->event, sizeof(eh.reserved));
	if (drv.IpcOpenMemHandle(&pb->ptr, mh, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) != CUDA_SUCCESS)
		return NULL;
	CUdevice cdev = -1;
	int mdev = -1;
	if (drv.CtxGetDevice(&cdev) != CUDA_SUCCESS)
		cdev = -1;
	if (drv.CtxGetDeviceOf && cdev >= 0 &&
	    drv.PointerGetAttribute(&mdev, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, pb->ptr) == CUDA_SUCCESS)
		peer_note_lazy(ctx, cdev, mdev); /* another device's: peer access enabled, see peer_note */
	/*
	 * The record's size bounds every copy from it (the table checks each
	 * range against it), but it is only what the table says: the opened
	 * allocation itself must be at least that large, or a buggy or hostile
	 * record would have the device read past it.
	 */
	CUdeviceptr base = 0;
	size_t real = 0;
	if (drv.MemGetAddressRange(&base, &real, pb->ptr) != CUDA_SUCCESS || base != pb->ptr || h->size > real) {
		ts_debug("gpu: record %u says %llu bytes, its allocation has %zu: not read", h->buf,
			 (unsigned long long)h->size, real);
		drv.IpcCloseMemHandle(pb->ptr);
		return NULL;
	}
	if (drv.IpcOpenEventHandle(&pb->ev, eh) != CUDA_SUCCESS) {
		drv.IpcCloseMemHandle(pb->ptr);
		return NULL;
	}
	pb->uniq = h->uniq;
	pb->ctx = ctx;
	pb->dev = (int)cdev;
	pb->real = real;
	ts_gpuring_map(&g->ring, g->f->s.self, h->buf); /* while we hold it: see gpuring.h */
	return pb;
}

/*
 * Close our mappings of records retired or gone: the owner frees a retired
 * buffer only once every live consumer has closed it.
 */
static void close_stale(struct ts_gpu *g)
{
	for (unsigned b = 0; b < TS_GPU_MAX_BUFS; b++)
		if (g->peer[b].uniq && !g->peer[b].copies && !ts_gpuring_buf_serving(&g->ring, b, g->peer[b].uniq))
			peer_close(g, b);
}

static void release_pending(struct ts_gpu *g, struct pending *pd)
{
	for (unsigned j = 0; j < pd->nbuf; j++) {
		struct peer_buf *pb = &g->peer[pd->buf[j]];
		if (pb->copies && --pb->copies == 0)
			ts_gpuring_unhold(&g->ring, g->f->s.self, pd->buf[j]);
	}
	drv.EventDestroy(pd->done);
}

/*
 * Let go of the buffers of copies that have completed (all of them: wait).
 * A query that fails counts as done (the event is gone, so are our copies),
 * except from another thread than the copy's (POLL_DONE_ONLY, ts_gpu_poll),
 * which may not have its context current: only a completed one counts then.
 */
enum { POLL_QUERY, POLL_WAIT, POLL_DONE_ONLY };

static void poll_pending(struct ts_gpu *g, int how)
{
	unsigned k = 0, before = g->npend;
	for (unsigned i = 0; i < g->npend; i++) {
		struct pending *pd = &g->pend[i];
		CUresult r = how == POLL_WAIT ? drv.EventSynchronize(pd->done) : drv.EventQuery(pd->done);
		if (r == CUDA_ERROR_NOT_READY || (how == POLL_DONE_ONLY && r != CUDA_SUCCESS)) {
			g->pend[k++] = *pd;
			continue;
		}
		release_pending(g, pd);
	}
	g->npend = k;
	atomic_fetch_sub_explicit(&ts_gpu_npending, before - k, memory_order_relaxed);
}

void ts_gpu_poll(void)
{
	CUstreamCaptureMode mode;
	if (pthread_mutex_trylock(&gpus_mu))
		return;
	int relaxed = relax_begin(&mode);
	for (unsigned i = 0; i < MAX_GPUS; i++) {
		struct ts_gpu *g = gpus[i];
		if (g && !pthread_mutex_trylock(&g->mu)) {
			if (g->npend)
				poll_pending(g, POLL_DONE_ONLY);
			pthread_mutex_unlock(&g->mu);
		}
	}
	relax_end(relaxed, mode);
	pthread_mutex_unlock(&gpus_mu);
}

/* Drop holds taken for h[0..n) that no copy of ours in flight needs. */
static void unhold_unused(struct ts_gpu *g, const struct ts_gpu_held *h, unsigned n)
{
	for (unsigned i = 0; i < n; i++)
		if (h[i].buf < TS_GPU_MAX_BUFS && !g->peer[h[i].buf].copies)
			ts_gpuring_unhold(&g->ring, g->f->s.self, h[i].buf);
}

/*
 * A piece not READY that never will be: a later batch has its slot (a
 * consumer that lags), or its writer is gone (the producer died, or left
 * with its buffers), or is this process (which cannot make it READY while
 * it waits here). Waiting for those only delays the upload from the host.
 * The writer's liveness reads /proc: looked at every 5 ms.
 */
static int never_ready(struct ts_gpu *g, const struct ts_gpu_piece *pc, int tries)
{
	if (pc->writer == g->f->s.self || ts_gpuring_slot_passed(&g->ring, pc->seq))
		return 1;
	if (tries % 50)
		return 0;
	return !ts_member_alive(ts_member_health(g->f->s.seg, (unsigned)pc->writer, ts_now_ns()));
}

/*
 * A dead writer's buffers are never read, READY or not: its context went
 * with it, and with it a copy into the ring still queued when it died (a
 * slot is READY once the copy is queued, not done), its event (waiting on
 * an event of a destroyed context is undefined) and, on real CUDA, the
 * memory itself (freed while imported: undefined). Looked at before and
 * after waiting for its copies (producer_copies_done); a writer that dies
 * after that, while our copy out of its memory is queued, is the window that
 * remains (its copy is done by then: what the window risks is its memory).
 */
static int writers_alive(struct ts_gpu *g, const struct ts_gpu_piece *pc, unsigned n)
{
	uint64_t now = ts_now_ns();
	for (unsigned i = 0; i < n; i++) {
		if (i && pc[i].writer == pc[i - 1].writer)
			continue;
		if (!ts_member_alive(ts_member_health(g->f->s.seg, (unsigned)pc[i].writer, now))) {
			ts_debug("gpu: an upload of batch %llu is done from the host (its writer is gone)",
				 (unsigned long long)pc[i].seq);
			return 0;
		}
	}
	return 1;
}

/* Hold every buffer the pieces lie in; pass through when one is not there soon. */
static int hold_pieces(struct ts_gpu *g, const struct ts_gpu_piece *pc, unsigned npieces, struct ts_gpu_held *h)
{
	/*
	 * A producer that keeps its batches announces each one (WRITING: its
	 * READY or its drop is coming) right after it publishes it: give it
	 * 20 ms to, then up to half a second for the READY (the first batch of
	 * a job that never uploads a tensor is READY only when the job
	 * registers its second, after a training step). Before it has kept a
	 * batch it may be a job that keeps nothing (a CPU job): then only our
	 * first few uploads wait those 20 ms, so that its first batches, which
	 * a consumer often reaches before it is announced, are still served.
	 */
	int grace = 200;
	if (!atomic_load_explicit(&g->ring.t->counters.batches_kept, memory_order_relaxed)) {
		if (g->early_waits < EARLY_WAITS)
			g->early_waits++;
		else
			grace = 0;
	}
	for (unsigned i = 0; i < npieces; i++) {
		int ret, tries;
		h[i].buf = UINT32_MAX;
		for (tries = 0;; tries++) {
			ret = ts_gpuring_hold_again(&g->ring, g->f->s.self, pc[i].seq, pc[i].writer, &h[i]);
			if (ret != -EAGAIN || tries >= 5000 || never_ready(g, &pc[i], tries) ||
			    (tries >= grace && !ts_gpuring_slot_pending(&g->ring, pc[i].seq, pc[i].writer)))
				break;
			struct timespec ts = {0, 100000};
			nanosleep(&ts, NULL);
		}
		if (ret == 0 && (pc[i].pos >= h[i].npos || pc[i].off > h[i].len[pc[i].pos] ||
				 pc[i].len > h[i].len[pc[i].pos] - pc[i].off))
			ret = -EBADMSG;
		if (ret) {
			ts_debug("gpu: an upload of batch %llu is done from the host (%s after %d ms)",
				 (unsigned long long)pc[i].seq, ret == -EAGAIN ? "not READY" : strerror(-ret), tries / 10);
			unhold_unused(g, h, i + 1);
			return -1;
		}
	}
	return 0;
}

/*
 * Wait on the host, for TSSHIM_TIMEOUT_MS at most (how long a producer may be
 * silent), until the producer's copies into the buffers the pieces lie in are
 * done (each buffer's event, recorded after them, has completed); 0 when they
 * are, -1 to upload from the host. A buffer is held, so its event's latest
 * record is this batch's. So our stream never waits on another process's event: a producer that dies
 * with its copy queued leaves that event's record pending in a destroyed
 * context, which CUDA leaves undefined. A stream waiting on it may never be
 * released (the job hangs at its next synchronisation; tsemu with
 * TSEMU_DEAD_EVENTS=pending), or be released with the copy never done (the
 * consumer reads a buffer never written; tsemu's default): gpu_share.sh
 * case 27 saw both. A host wait can give up; the writer's liveness is
 * looked at every 5 ms meanwhile, as in hold_pieces.
 */
static int producer_copies_done(struct ts_gpu *g, const struct ts_gpu_piece *pc, struct peer_buf *const *pb,
				unsigned n)
{
	uint64_t start = ts_now_ns(), next_look = start + 5000000ull;
	uint64_t limit = g->f->s.timeout_ns;
	for (unsigned i = 0; i < n; i++) {
		if (i && pb[i] == pb[i - 1])
			continue;
		for (;;) {
			CUresult r = drv.EventQuery(pb[i]->ev);
			if (r == CUDA_SUCCESS)
				break;
			uint64_t now = ts_now_ns();
			int gone = 0;
			if (r == CUDA_ERROR_NOT_READY && now >= next_look) {
				gone = !ts_member_alive(ts_member_health(g->f->s.seg, (unsigned)pc[i].writer, now));
				next_look = now + 5000000ull;
			}
			if (r != CUDA_ERROR_NOT_READY || gone || now - start >= limit) {
				ts_debug("gpu: an upload of batch %llu is done from the host (the producer's copy into the "
					 "ring %s after %llu ms)",
					 (unsigned long long)pc[i].seq,
					 r != CUDA_ERROR_NOT_READY ? "cannot be queried" : gone ? "was lost with it"
												: "was not done",
					 (unsigned long long)((now - start) / 1000000ull));
				return -1;
			}
			struct timespec ts = {0, 100000};
			nanosleep(&ts, NULL);
		}
	}
	return 0;
}

int ts_gpu_serve(struct ts_gpu *g, const struct ts_gpu_piece *pc, unsigned npieces, CUdeviceptr dst, CUstream s,
		 int sync)
{
	struct ts_gpu_held h[8];
	struct peer_buf *pb[8];
	CUstreamCaptureMode mode;
	int served = 0;
	if (!npieces || npieces > 8 || !drv_ready())
		return 0;
	/*
	 * Only a copy into device memory: one into host memory (cudaMemcpyDefault
	 * or cuMemcpy to a pinned or registered buffer) is synchronous in CUDA
	 * whatever the call, and a device copy out of the ring would still be
	 * queued when it returned. Unified memory, too, goes the program's way.
	 */
	unsigned int dtype = 0;
	int relaxed = relax_begin(&mode);
	if (drv.PointerGetAttribute(&dtype, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, dst) != CUDA_SUCCESS ||
	    dtype != CU_MEMORYTYPE_DEVICE) {
		relax_end(relaxed, mode);
		return 0;
	}
	pthread_mutex_lock(&g->mu);
	if (ring_open(g))
		goto out;
	poll_pending(g, g->npend == MAX_PENDING ? POLL_WAIT : POLL_QUERY);
	close_stale(g);
	if (hold_pieces(g, pc, npieces, h))
		goto out;
	if (!writers_alive(g, pc, npieces))
		goto unhold;
	unsigned i;
	for (i = 0; i < npieces; i++)
		if (!(pb[i] = peer_open(g, &h[i])))
			break;
	struct pending pd = {0};
	/* the producer's copies done, its buffers still its own (alive) */
	if (i < npieces || producer_copies_done(g, pc, pb, npieces) || !writers_alive(g, pc, npieces) ||
	    drv.EventCreate(&pd.done, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS)
		goto unhold;
	/*
	 * The last piece first: the pieces lie in the upload in order, so one
	 * that runs past the end of its allocation is refused at its first copy,
	 * with nothing of it written, as the program's own upload would be.
	 */
	int failed = 0;
	for (i = npieces; i-- > 0;) {
		if (drv.MemcpyAsync(dst + pc[i].at, pb[i]->ptr + h[i].off[pc[i].pos] + pc[i].off, pc[i].len, s) !=
		    CUDA_SUCCESS) {
			failed = 1;
			break;
		}
	}
	/*
	 * The event tells when our copies are done, so we may let go of the
	 * buffers. A record that fails (a stream of another context than the
	 * current one: CUDA_ERROR_INVALID_HANDLE) leaves an event that reads as
	 * complete: then wait for the stream itself before letting go.
	 */
	if (drv.EventRecord(pd.done, s) != CUDA_SUCCESS)
		drv.StreamSynchronize(s);
	if (failed) {
		/* some copies may be queued: they must finish before we let go */
		drv.EventSynchronize(pd.done);
		drv.EventDestroy(pd.done);
		ts_info("gpu: serving an upload failed; it is done from the host");
		goto unhold;
	}
	for (i = 0; i < npieces; i++) {
		unsigned j;
		for (j = 0; j < pd.nbuf && pd.buf[j] != h[i].buf; j++)
			;
		if (j == pd.nbuf) {
			pd.buf[pd.nbuf++] = h[i].buf;
			pb[i]->copies++;
		}
	}
	g->pend[g->npend++] = pd;
	atomic_fetch_add_explicit(&ts_gpu_npending, 1, memory_order_relaxed);
	uint64_t total = 0;
	for (i = 0; i < npieces; i++)
		total += pc[i].len;
	atomic_fetch_add_explicit(&g->ring.t->counters.uploads_served, 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&g->ring.t->counters.bytes_served, total, memory_order_relaxed);
	atomic_fetch_add_explicit(&g->f->s.seg->counters.bytes_not_copied, total, memory_order_relaxed);
	if (sync)
		poll_pending(g, POLL_WAIT);
	served = 1;
	goto out;
unhold:
	unhold_unused(g, h, npieces);
out:
	pthread_mutex_unlock(&g->mu);
	relax_end(relaxed, mode);
	return served;
}

/* ---- before our context goes ------------------------------------------------------------ */

/*
 * Our buffers die with our context: at the process's exit the driver
 * destroys it, and its memory with it, imported elsewhere or not (PyTorch:
 * "automatically freed upon the producer's exit"). A consumer's copy out of
 * one that is still queued then (its stream runs behind its host, as any
 * training loop's does) reads what the memory has become: tsemu overwrites
 * it and counts the read (ipc_read_lost; gpu_share.sh case 28). So a
 * producer drains first: its slots are given up (a consumer takes no new
 * hold; it uploads those batches from the host), then it waits until no
 * live consumer holds a buffer of it (a hold lasts until the copy out of it
 * has completed), TSSHIM_TIMEOUT_MS at most, letting go meanwhile of its
 * own served copies that are done, should another producer be waiting for
 * it. Done when a feed is closed (the PyTorch layer closes its feeds in an
 * atexit handler), and for every feed still open by an atexit handler
 * registered at our first allocation: after the CUDA runtime's, so it runs
 * before the runtime's own teardown. The destructors come last; the driver
 * may be finalised by then.
 */
static void drain_begin(struct ts_gpu *g)
{
	if (g->ring_state != 1)
		return;
	for (unsigned i = 0; i < MAX_KEEPS; i++)
		if (g->k[i].active)
			ts_gpuring_slot_drop(&g->ring, g->k[i].slot);
	for (unsigned i = 0; i < MAX_KEEPS; i++)
		g->k[i].active = 0;
	for (unsigned sl = 0; sl < ts_gpuring_depth(&g->ring); sl++)
		if (g->slot_own[sl] >= 0)
			ts_gpuring_slot_drop(&g->ring, sl);
	g->ring_state = 3; /* nothing kept or served from now on */
}

/* Does a live process other than us hold a buffer of ours? */
static int held_elsewhere(const struct ts_gpu *g)
{
	if (g->ring_state != 3)
		return 0;
	for (unsigned i = 0; i < MAX_OWN; i++)
		if (g->own[i].rec >= 0 &&
		    ts_gpuring_buf_held(&g->ring, g->f->s.seg, (unsigned)g->own[i].rec, g->f->s.self))
			return 1;
	return 0;
}

static uint64_t drain_limit_ns(const struct ts_gpu *g)
{
	return g->f->s.timeout_ns;
}

static void drain_said(uint64_t start, int held)
{
	uint64_t ms = (ts_now_ns() - start) / 1000000ull;
	if (held)
		ts_info("gpu: a consumer still holds one of our ring buffers after %llu ms; our context goes all the "
			"same", (unsigned long long)ms);
	else if (ms)
		ts_debug("gpu: waited %llu ms for consumers' copies out of our ring buffers before our context goes",
			 (unsigned long long)ms);
}

/* One feed, under g->mu, out of gpus[] (ts_gpu_free). */
static void drain(struct ts_gpu *g)
{
	drain_begin(g);
	uint64_t start = ts_now_ns(), limit = drain_limit_ns(g);
	int held;
	while ((held = held_elsewhere(g)) && ts_now_ns() - start < limit) {
		ts_gpu_poll(); /* our other feeds' served copies: their producers may be draining too */
		struct timespec ts = {0, 500000};
		nanosleep(&ts, NULL);
	}
	drain_said(start, held);
}

static pid_t drain_pid;

/*
 * gpus_mu, waited for a second at most: a thread inside a call of ours does
 * not hold us for long. *until: that deadline, for the g->mu locks after. 0: locked.
 */
static int gpus_lock_timed(struct timespec *until)
{
	clock_gettime(CLOCK_REALTIME, until);
	until->tv_sec += 1;
	return pthread_mutex_timedlock(&gpus_mu, until);
}

/*
 * With gpus_mu: wait until no live process other than us holds a buffer of
 * ours that held_of(g) asks about, for limit ns from start at most, letting
 * go meanwhile of our own served copies that are done (another producer may
 * be waiting for them). A feed of mine[] busy in another thread counts as
 * held: looked at again. 1: still held when the time ran out.
 */
static int wait_unheld(struct ts_gpu *const mine[MAX_GPUS], int (*held_of)(const struct ts_gpu *), uint64_t start,
		       uint64_t limit)
{
	for (;;) {
		int held = 0;
		for (unsigned i = 0; i < MAX_GPUS; i++) {
			struct ts_gpu *g = gpus[i]; /* (gpus_mu held: mine[i] is gpus[i]) */
			if (!g || pthread_mutex_trylock(&g->mu)) {
				held |= mine[i] != NULL;
				continue;
			}
			if (g->npend)
				poll_pending(g, POLL_DONE_ONLY);
			held |= held_of(g);
			pthread_mutex_unlock(&g->mu);
		}
		if (!held || ts_now_ns() - start >= limit)
			return held;
		struct timespec ts = {0, 500000};
		nanosleep(&ts, NULL);
	}
}

/*
 * Every feed of this process that begin(g, dev) gives something up of
 * (under g->mu), then the wait until nobody holds what held_of(g) asks
 * about (wait_unheld), for the longest TSSHIM_TIMEOUT_MS of those feeds.
 */
static void drain_where(int (*begin)(struct ts_gpu *, int), int (*held_of)(const struct ts_gpu *), int dev)
{
	CUstreamCaptureMode mode;
	struct timespec until;
	if (gpus_lock_timed(&until))
		return;
	int relaxed = relax_begin(&mode);
	uint64_t limit = 0, start = ts_now_ns();
	struct ts_gpu *mine[MAX_GPUS] = {0};
	int any = 0;
	for (unsigned i = 0; i < MAX_GPUS; i++) {
		struct ts_gpu *g = gpus[i];
		if (!g || pthread_mutex_timedlock(&g->mu, &until))
			continue;
		if (begin(g, dev)) {
			any = 1;
			mine[i] = g;
			if (drain_limit_ns(g) > limit)
				limit = drain_limit_ns(g);
		}
		pthread_mutex_unlock(&g->mu);
	}
	int held = any && wait_unheld(mine, held_of, start, limit);
	relax_end(relaxed, mode);
	pthread_mutex_unlock(&gpus_mu);
	if (any)
		drain_said(start, held);
}

/* At exit: a feed of ours with its ring open gives up its slots (drain_begin). */
static int exit_begin(struct ts_gpu *g, int dev)
{
	(void)dev;
	if (g->ring_state != 1 || g->f->s.me.pid != (uint32_t)getpid())
		return 0;
	drain_begin(g);
	return 1;
}

/* Every feed of this process, at its exit (atexit: see above). */
static void drain_at_exit(void)
{
	if (atomic_load(&ts_is_fork_child) || getpid() != drain_pid || atomic_load(&drv_state) <= 0)
		return;
	drain_where(exit_begin, held_elsewhere, -1);
}

static void drain_register(void)
{
	drain_pid = getpid();
	if (atexit(drain_at_exit))
		ts_debug("gpu: atexit failed: our ring buffers are not drained at exit");
}

/* ---- before and after the program destroys a context ------------------------------------ */

/*
 * A program may destroy a context while the process goes on: cudaDeviceReset
 * (CUDA's samples end main with it; the runtime calls cuDevicePrimaryCtxReset),
 * the release of a primary context's last retain, cuCtxDestroy of a context
 * it made (and uploads to: our buffers are made in it). Its memory
 * goes then, exported or not, and a consumer's copy out of it that is still
 * queued reads what the memory has become, as at exit (above; gpu_share.sh
 * case 29). So cuda.c calls these around the program's call:
 *  - before (ts_gpu_ctx_going): a producer gives up the slots whose buffers
 *    live in the context (a consumer takes no new hold; it uploads those
 *    batches from the host), retires those buffers, and waits, for
 *    TSSHIM_TIMEOUT_MS at most, until no live consumer holds one; a consumer
 *    waits for its own served copies and closes its mappings opened there
 *    (their events and the peer access they enabled go with the context);
 *  - after (ts_gpu_ctx_gone): a buffer the driver no longer knows by its
 *    buffer id went with the context: its record is removed, nothing freed.
 *    One still there (a release that was not the last) stays retired, freed
 *    once nobody holds or has it open, as any.
 * The feed goes on: the next batch is kept in a fresh buffer of the context
 * the job uploads to then. Matched by context (cuCtxDestroy) or by device
 * (the primary-context calls name one: a context of it the program made
 * itself is drained too, which costs sharing for a batch, never data).
 */

/* ts_gpu_ctx_going's context in this thread; NULL: match by device. What
 * went, for ts_gpu_ctx_gone's line. */
static __thread CUcontext going_ctx;
static __thread int going_made;

static int going_match(CUcontext c, int d, int dev)
{
	return going_ctx ? c == going_ctx : d == dev;
}

/* The peer-access notes of context c (peer_note): its access goes with it. */
static void peer_notes_forget(CUcontext c)
{
	pthread_mutex_lock(&peer_mu);
	for (unsigned i = 0; i < npeer_notes;)
		if (peer_notes[i].ctx == c)
			peer_notes[i] = peer_notes[--npeer_notes];
		else
			i++;
	pthread_mutex_unlock(&peer_mu);
}

/*
 * The program's peer access goes with its context too: a note that says it
 * enabled access (peer_note's prog) would make its enable in the context
 * made again (a reset primary context keeps its handle) answer "already
 * enabled" once our mapping enables access lazily. The context a call may
 * destroy: cuCtxDestroy's, or the device's primary context, its handle had
 * by a retain and release of ours (count unchanged) while it is active.
 * Asked only when the program has made a peer-access call.
 */
static __thread CUcontext peer_going;

static void peer_ctx_going(CUcontext ctx, int dev)
{
	unsigned flags;
	int active = 0;
	CUcontext pctx;
	pthread_mutex_lock(&peer_mu);
	unsigned notes = npeer_notes;
	pthread_mutex_unlock(&peer_mu);
	peer_going = notes ? ctx : NULL;
	if (!notes || ctx)
		return;
	if (drv.PrimaryCtxGetState(dev, &flags, &active) == CUDA_SUCCESS && active &&
	    drv.PrimaryCtxRetain(&pctx, dev) == CUDA_SUCCESS) {
		drv.PrimaryCtxRelease(dev);
		peer_going = pctx;
	}
}

/*
 * After the program's call (r its answer): was the context destroyed? A
 * reset destroys the primary context's state whatever its retains; a
 * release only with the last one (then the context is no longer active).
 */
static void peer_ctx_gone(int dev, int reset, CUresult r)
{
	CUcontext c = peer_going;
	unsigned flags;
	int active = 1;
	peer_going = NULL;
	if (!c)
		return;
	if ((dev < 0 || reset) ? r == CUDA_SUCCESS
			       : drv.PrimaryCtxGetState(dev, &flags, &active) == CUDA_SUCCESS && !active)
		peer_notes_forget(c);
}

/* Under g->mu: what of g lives in the context, given up; 1 when one of our buffers does. */
static int going_begin(struct ts_gpu *g, int dev)
{
	if (g->ring_state <= 0)
		return 0;
	if (g->npend)
		poll_pending(g, POLL_WAIT); /* our served copies: their destinations may live there */
	for (unsigned b = 0; b < TS_GPU_MAX_BUFS; b++)
		if (g->peer[b].uniq && going_match(g->peer[b].ctx, g->peer[b].dev, dev)) {
			peer_notes_forget(g->peer[b].ctx);
			peer_close(g, b);
		}
	int any = 0;
	for (int i = 0; i < (int)MAX_OWN; i++) {
		struct own_buf *o = &g->own[i];
		if (o->rec < 0 || !going_match(o->ctx, o->dev, dev))
			continue;
		o->going = any = 1;
		if (o->slot >= 0) {
			ts_gpuring_slot_drop(&g->ring, (unsigned)o->slot);
			g->slot_own[o->slot] = -1;
		}
		for (unsigned k = 0; k < MAX_KEEPS; k++)
			if (g->k[k].active && g->k[k].own == i)
				g->k[k].active = 0;
		own_retire(g, i);
	}
	if (any)
		g->up_ctx = NULL; /* learnt again at the next upload */
	return any;
}

/* Does a live process other than us hold one of our buffers that is going? */
static int going_held(const struct ts_gpu *g)
{
	for (unsigned i = 0; i < MAX_OWN; i++)
		if (g->own[i].rec >= 0 && g->own[i].going &&
		    ts_gpuring_buf_held(&g->ring, g->f->s.seg, (unsigned)g->own[i].rec, g->f->s.self))
			return 1;
	return 0;
}

void ts_gpu_ctx_going(CUcontext ctx, int dev)
{
	if (atomic_load(&drv_state) <= 0)
		return;
	CUstreamCaptureMode mode;
	int relaxed = relax_begin(&mode);
	peer_ctx_going(ctx, dev);
	relax_end(relaxed, mode);
	going_ctx = ctx;
	going_made = ctx != NULL;
	drain_where(going_begin, going_held, dev);
	going_ctx = NULL;
}

void ts_gpu_ctx_gone(int dev, int reset, CUresult r)
{
	CUstreamCaptureMode mode;
	struct timespec until;
	if (atomic_load(&drv_state) <= 0)
		return;
	peer_ctx_gone(dev, reset, r);
	if (gpus_lock_timed(&until))
		return; /* what is left marked going stays retired: freed, or failing to be, as any */
	int relaxed = relax_begin(&mode);
	unsigned gone = 0, kept = 0;
	for (unsigned i = 0; i < MAX_GPUS; i++) {
		struct ts_gpu *g = gpus[i];
		if (!g || pthread_mutex_timedlock(&g->mu, &until))
			continue;
		for (unsigned j = 0; j < MAX_OWN; j++) {
			struct own_buf *o = &g->own[j];
			unsigned long long id = 0;
			if (o->rec < 0 || !o->going)
				continue;
			o->going = 0;
			if (o->id && drv.PointerGetAttribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, o->ptr) == CUDA_SUCCESS &&
			    id == o->id) {
				kept++; /* retired: freed when nobody holds or has it open */
				continue;
			}
			ts_gpuring_buf_remove(&g->ring, (unsigned)o->rec, o->uniq);
			o->rec = -1;
			gone++;
		}
		pthread_mutex_unlock(&g->mu);
	}
	relax_end(relaxed, mode);
	pthread_mutex_unlock(&gpus_mu);
	if (gone + kept)
		ts_debug("gpu: %s: %u ring buffers went with it, %u outlived it",
			 going_made ? "a context the job made was destroyed" : "a primary context was reset or released",
			 gone, kept);
}

void ts_gpu_free(struct ts_gpu *g, int exiting)
{
	CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
	if (!g)
		return;
	gpus_remove(g);
	int relaxed = !exiting && atomic_load(&drv_state) > 0 && relax_begin(&mode);
	pthread_mutex_lock(&g->mu);
	if (!exiting && atomic_load(&drv_state) > 0)
		drain(g);
	else
		drain_begin(g); /* our slots given up all the same (no CUDA call) */
	if (g->allocs)
		ts_debug("gpu: %llu ring buffers allocated; a spare served a slot %llu times instead",
			 (unsigned long long)g->allocs, (unsigned long long)g->spares_taken);
	if (g->ring_state > 0) {
		/*
		 * At exit the driver may be finalised already (it was dlopen()ed
		 * after us, so its destructors ran first): no CUDA call then. Our
		 * copies die with the process; our allocations go with its context.
		 */
		if (!exiting && atomic_load(&drv_state) > 0) {
			poll_pending(g, POLL_WAIT);
			for (unsigned b = 0; b < TS_GPU_MAX_BUFS; b++)
				peer_close(g, b);
		}
		ts_gpuring_unhold_all(&g->ring, g->f->s.self);
		for (int i = 0; i < (int)MAX_OWN; i++) {
			if (g->own[i].rec < 0)
				continue;
			/*
			 * Leaving while the process goes on: a buffer another process
			 * still holds or has open is left allocated (until our exit)
			 * rather than freed under it.
			 */
			own_retire(g, i);
			if (exiting)
				ts_gpuring_buf_remove(&g->ring, (unsigned)g->own[i].rec, g->own[i].uniq);
			else if (!ts_gpuring_buf_in_use(&g->ring, g->f->s.seg, (unsigned)g->own[i].rec, g->f->s.self))
				own_free(g, i);
			else
				ts_debug("gpu: a ring buffer still open in another process is kept until exit");
		}
		ts_gpuring_close(&g->ring);
	}
	atomic_fetch_sub_explicit(&ts_gpu_npending, g->npend, memory_order_relaxed); /* exiting: left as they are */
	pthread_mutex_unlock(&g->mu);
	relax_end(relaxed, mode);
	pthread_mutex_destroy(&g->mu);
	free(g);
}
