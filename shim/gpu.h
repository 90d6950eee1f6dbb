/* SPDX-License-Identifier: MIT */
/*
 * The GPU side of a feed (socket mode): the producer keeps its uploads of
 * stream ranges in device buffers of the GPU ring (core/gpuring.h); a
 * consumer's upload of stream ranges is served from them, device to device
 * (or peer), once the producer's interprocess event says its copy is done.
 *
 * Everything here goes through the CUDA driver API of the libcuda the
 * process has already loaded (never loaded by us); a process where it is
 * missing, or a call that fails, keeps nothing and serves nothing: the
 * upload is then done from the host, which holds the same bytes.
 */
#ifndef TSSHIM_SHIM_GPU_H
#define TSSHIM_SHIM_GPU_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda.h>

struct ts_feed;
struct ts_gpu;

/* A part of an upload that comes from ring seq `seq` (published by `writer`). */
struct ts_gpu_piece {
	uint64_t seq;
	int writer;
	uint32_t pos;
	uint64_t off;   /* offset within the position's bytes of that seq */
	uint64_t len;
	uint64_t at;    /* offset within the upload's destination */
	uint64_t slot_len; /* the position's full size in that seq */
};

/* Has the process loaded a CUDA driver we can use? (Never loads one.) */
int ts_gpu_driver_ready(void);

/*
 * Is stream s (a copy's; CU_STREAM_LEGACY or CU_STREAM_PER_THREAD for the
 * default ones) being captured into a CUDA graph, or can the driver not
 * tell? Such a copy is recorded to be replayed later: it is neither kept
 * nor served. Every driver call of the functions below runs in relaxed
 * capture mode, so that a capture another thread holds in global mode is
 * not invalidated by ours.
 */
int ts_gpu_in_capture(CUstream s);

/*
 * Would CUDA refuse a synchronous copy of this thread now, for a capture
 * (cudaErrorStreamCaptureUnsupported)? s: the default stream it goes to.
 * A consumer's synchronous upload is then not served: it goes to the
 * driver, which refuses it as without the shim.
 */
int ts_gpu_sync_barred(CUstream s);

/*
 * The program's cuCtxEnablePeerAccess / cuCtxDisablePeerAccess (real: the
 * driver's), answered as without the shim: our mappings of another
 * device's ring buffers enable peer access as a side effect (gpu.c).
 */
CUresult ts_gpu_peer_enable(CUresult (*real)(CUcontext, unsigned int), CUcontext peer, unsigned int flags);
CUresult ts_gpu_peer_disable(CUresult (*real)(CUcontext), CUcontext peer);

/*
 * The program is about to destroy context ctx (cuCtxDestroy), or, ctx NULL,
 * a context of device dev (a primary-context reset or release), and has
 * (ts_gpu_ctx_gone: dev as given to ts_gpu_ctx_going, -1 for cuCtxDestroy;
 * reset, 1 for a primary context's reset, 0 for its release; r, the
 * driver's answer): what of the GPU ring lives there is drained
 * before and forgotten after, if the driver no longer knows it, and so is
 * the peer access the program enabled there (gpu.c, "before and after the
 * program destroys a context").
 */
void ts_gpu_ctx_going(CUcontext ctx, int dev);
void ts_gpu_ctx_gone(int dev, int reset, CUresult r);

struct ts_gpu *ts_gpu_new(struct ts_feed *f);
/*
 * Give up our slots and wait (TSSHIM_TIMEOUT_MS at most) until no consumer
 * holds a buffer of ours, wait for our copies, let go of every hold, free
 * what we allocated and nobody holds. exiting: the process is exiting: no
 * CUDA call, only the shared table is tidied (a producer's buffers were
 * drained by an atexit handler before, while CUDA was still there).
 */
void ts_gpu_free(struct ts_gpu *g, int exiting);

/* Served copies of this process still in flight (their buffers held). */
extern _Atomic unsigned ts_gpu_npending;
/* Let go of the buffers of served copies that have completed (any thread; never blocks). */
void ts_gpu_poll(void);
/* After any copy: one atomic load when no served copy is in flight. */
static inline void ts_gpu_poll_if_pending(void)
{
	if (atomic_load_explicit(&ts_gpu_npending, memory_order_relaxed))
		ts_gpu_poll();
}

/*
 * Producer, after the real upload of bytes [off, off + n) of position p of
 * ring seq `seq` (npos positions of len[] bytes) to dst on stream s: copy
 * them into the ring buffer of that seq (a position is kept as one run from
 * its start, on the stream of the batch's first upload; each complete one
 * records the buffer's event). Once every position this job uploads is
 * complete (learnt from its earlier batches; at first all of them), the
 * slot is READY; positions not complete then read as 0 bytes. sync: the
 * upload was synchronous, so ours has read dst before this returns.
 */
void ts_gpu_keep(struct ts_gpu *g, uint64_t seq, uint32_t npos, const uint64_t *len, uint32_t p, uint64_t off,
		 CUdeviceptr dst, size_t n, CUstream s, int sync);
/*
 * Producer, for an upload of position p of ring seq `seq` that is not kept
 * (made inside a stream capture): the position is left out of the batch and
 * not waited for, as one uploaded on another stream; a batch left with
 * nothing is dropped, so that consumers go from the host at once. No driver call.
 */
void ts_gpu_keep_skip(struct ts_gpu *g, uint64_t seq, uint32_t p);
/*
 * Producer, when it registers batch `seq`: begin keeping it now (its ring
 * slot says WRITING), so that a consumer whose upload comes before ours
 * waits for it rather than copying from the host. Nothing when a batch is
 * still being kept. Its first upload then fixes the stream.
 */
void ts_gpu_keep_announce(struct ts_gpu *g, uint64_t seq, uint32_t npos, const uint64_t *len);
/* Producer: the batch being kept is over (a new one was registered): READY with the positions
 * complete, dropped when none is. */
void ts_gpu_keep_end(struct ts_gpu *g);

/*
 * Consumer: serve an upload to dst made of npieces pieces from the ring,
 * on stream s (sync: the caller's copy was synchronous: wait for ours).
 * 1: served (dst gets the bytes); 0: not (nothing was enqueued; upload from the host).
 */
int ts_gpu_serve(struct ts_gpu *g, const struct ts_gpu_piece *pc, unsigned npieces, CUdeviceptr dst, CUstream s,
		 int sync);

#endif
