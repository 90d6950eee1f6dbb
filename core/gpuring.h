/* SPDX-License-Identifier: MIT */
/*
 * The GPU ring: where a feed's batches lie in device memory, so that a
 * consumer's upload of a stream range becomes a device-to-device (or peer)
 * copy instead of a host-to-device one.
 *
 * One shared-memory file per feed incarnation, next to the feed's files:
 *
 *   tsshim-feed.<uid>.<session>.<incarnation>.gpu
 *
 * It holds no device memory, only what a process needs to reach it: buffer
 * records (an exported cudaMalloc allocation and the interprocess event
 * recorded after its last write) and, per ring slot, which buffer holds
 * which seq and where each position lies in it. CUDA itself is called by
 * the shim (shim/gpu.c); this file is bookkeeping, unit-tested as such.
 *
 * Lifetimes. A buffer is never written while someone may read it: a
 * consumer sets its hold bit on the buffer before it copies and clears it
 * once its copy has completed; a producer that finds the buffer of a slot
 * held gives the slot a fresh buffer and retires the old one. Nor is it
 * freed while a process has it open (CUDA: freeing exported memory before
 * every importer closed it is undefined): a consumer sets its mapped bit
 * while it holds the buffer, before it lets go, keeps the mapping for later
 * copies, and closes it, then clears the bit, once the record is retired or
 * gone. A retired buffer is freed once no live member holds or maps it.
 * Bits of dead members do not count.
 *
 * Slot protocol (a seqlock with a Dekker pair against reuse):
 *   producer: word = WRITING(seq, buf)  [seq_cst]; check holds of buf;
 *             fill off/len; ... device writes, event recorded ...;
 *             word = READY(seq, buf)    [release]
 *   consumer: w = word [acquire], READY for (seq, writer); copy off/len;
 *             set hold bit [seq_cst]; word == w again [seq_cst] -> held.
 * Either the producer sees the hold (and does not reuse the buffer) or the
 * consumer sees the word change (and lets go).
 *
 * Every value read from the file is validated: another process may be
 * buggy, dead half-way through a write, or hostile. Functions return 0 or
 * -errno and never block.
 */
#ifndef TSSHIM_CORE_GPURING_H
#define TSSHIM_CORE_GPURING_H

#include <stddef.h>
#include <stdint.h>

#include "layout.h"

#define TS_GPU_MAX_BUFS   (3 * TS_MAX_DEPTH)
#define TS_GPU_HANDLE     64u  /* bytes of a cudaIpcMemHandle_t / cudaIpcEventHandle_t */
#define TS_GPU_MAX_DEVICE 64u
#define TS_GPU_ALIGN      256u /* offsets of positions in a buffer */

enum ts_gpu_slot_state { TS_GPU_FREE = 0, TS_GPU_WRITING = 1, TS_GPU_READY = 2 };

/* state (2) | writer member index + 1 (7) | buffer index (8) | seq (46): 63 bits */
static inline uint64_t ts_gpu_slot_word(unsigned state, unsigned writer, unsigned buf, uint64_t seq)
{
	return (uint64_t)state << 61 | (uint64_t)((writer + 1) & 0x7f) << 54 | (uint64_t)(buf & 0xff) << 46 |
	       (seq & ((1ULL << 46) - 1));
}
static inline unsigned ts_gpu_slot_state(uint64_t w) { return (unsigned)(w >> 61) & 3; }
static inline int ts_gpu_slot_writer(uint64_t w) { return (int)((w >> 54) & 0x7f) - 1; }
static inline unsigned ts_gpu_slot_buf(uint64_t w) { return (unsigned)(w >> 46) & 0xff; }
static inline uint64_t ts_gpu_slot_seq(uint64_t w) { return w & ((1ULL << 46) - 1); }

/* One exported device allocation. Fields are written before `uniq` is published. */
struct ts_gpu_buf {
	_Atomic uint64_t uniq;  /* 0: free; odd: being filled in by the process it names; else the record's identity */
	uint32_t owner;         /* member index of the process that allocated it */
	uint32_t owner_pid;
	uint64_t owner_start;   /* pid + start time: the owner's identity */
	uint32_t device;        /* CUDA device ordinal in the owner */
	_Atomic uint32_t retired; /* nonzero: serves no slot any more, freed once no one holds or maps it */
	uint64_t size;
	unsigned char mem[TS_GPU_HANDLE];   /* IPC handle of the allocation (its base) */
	unsigned char event[TS_GPU_HANDLE]; /* IPC handle of its interprocess event */
};

struct ts_gpu_slot {
	_Atomic uint64_t word;
	uint64_t uniq;          /* the buffer record's identity while READY */
	uint32_t npos;
	uint32_t pad;
	uint64_t off[TS_MAX_POSITIONS]; /* where each position starts in the buffer */
	uint64_t len[TS_MAX_POSITIONS];
};

struct ts_gpu_counters {
	_Atomic uint64_t batches_kept;   /* producer uploads placed in the ring */
	_Atomic uint64_t bytes_kept;
	_Atomic uint64_t uploads_served; /* consumer uploads served from the ring */
	_Atomic uint64_t bytes_served;   /* = host-to-device bytes not copied */
	_Atomic uint64_t buffers_live;
	_Atomic uint64_t buffer_bytes;
	_Atomic uint64_t replaced;       /* slots that got a fresh buffer because theirs was held */
};

#define TS_GPU_MAGIC   0x31555047535354ULL /* "TSSGPU1" */
#define TS_GPU_VERSION 2u

struct ts_gpu_table {
	uint64_t magic;
	uint32_t version;
	uint32_t depth;
	uint64_t size;          /* bytes of the file */
	uint32_t uid;
	uint32_t nbufs;
	uint64_t pad[4];
	struct ts_gpu_counters counters;
	struct ts_gpu_slot slots[TS_MAX_DEPTH];
	struct ts_gpu_buf bufs[TS_GPU_MAX_BUFS];
	/* held[m][b / 64] bit b % 64: member m may be reading buffer b */
	_Atomic uint64_t held[TS_MAX_MEMBERS][TS_GPU_MAX_BUFS / 64];
	/* mapped[m][b / 64] bit b % 64: member m has buffer b open (cuIpcOpenMemHandle) */
	_Atomic uint64_t mapped[TS_MAX_MEMBERS][TS_GPU_MAX_BUFS / 64];
};

/* A process's mapping of the table. */
struct ts_gpuring {
	struct ts_gpu_table *t;
	size_t size;
	uint32_t depth; /* the table's depth as validated at open: its geometry, whatever a peer writes later */
	uint32_t uid;   /* ours, as validated at open (ts_gpuring_intact() makes no syscall) */
};

/* A record's uniq word: 0 free, odd a claim (a process filling it in), else its identity. */
static inline int ts_gpu_uniq_is_identity(uint64_t u)
{
	return u != 0 && !(u & 1);
}

/* Slots of the ring (1..TS_MAX_DEPTH once open): index per-slot arrays with this, never t->depth. */
static inline uint32_t ts_gpuring_depth(const struct ts_gpuring *g)
{
	return g->depth;
}

/* What a consumer holds after ts_gpuring_hold(): a private snapshot. */
struct ts_gpu_held {
	unsigned buf;
	uint64_t uniq;
	uint32_t device;
	uint32_t owner_pid;
	uint64_t size;
	uint32_t npos;
	uint64_t off[TS_MAX_POSITIONS];
	uint64_t len[TS_MAX_POSITIONS];
	unsigned char mem[TS_GPU_HANDLE];
	unsigned char event[TS_GPU_HANDLE];
};

struct ts_segment;

/* "<dir>/tsshim-feed.<uid>.<session>.<incarnation hex>.gpu" */
int ts_gpuring_path(char *buf, size_t n, const char *session, uint64_t incarnation);
/* Map the table at `path`, creating it (depth slots) if missing. */
int ts_gpuring_open(struct ts_gpuring *g, const char *path, uint32_t depth);
void ts_gpuring_close(struct ts_gpuring *g);
/* Validate a mapped table of `size` bytes (possibly hostile). */
int ts_gpuring_valid(const struct ts_gpu_table *t, size_t size, uint32_t uid);
/* Is the open table still what was validated at open (a peer may rewrite it)? 0, else -EBADMSG. */
int ts_gpuring_intact(const struct ts_gpuring *g);

/* ---- producer ---------------------------------------------------------------------- */

/*
 * Claim a free buffer record (or one whose owner is dead and that nobody
 * live holds) for a new allocation; fills it and returns its index, *uniq
 * its identity. -ENOSPC when every record is in use.
 */
int ts_gpuring_buf_add(struct ts_gpuring *g, const struct ts_segment *seg, unsigned owner, uint32_t device,
		       uint64_t size, const void *mem, const void *event, uint64_t *uniq);
/* Forget a record we own (after freeing the allocation). */
void ts_gpuring_buf_remove(struct ts_gpuring *g, unsigned buf, uint64_t uniq);
/* Forget records whose owner is dead and that no live member holds; returns how many. */
int ts_gpuring_reclaim_dead(struct ts_gpuring *g, const struct ts_segment *seg);
/* Does a live member other than `self` hold buffer `buf`? (Dead members' holds do not count.) */
int ts_gpuring_buf_held(const struct ts_gpuring *g, const struct ts_segment *seg, unsigned buf, int self);
/* Does a live member other than `self` hold or map it: may it not be freed? */
int ts_gpuring_buf_in_use(const struct ts_gpuring *g, const struct ts_segment *seg, unsigned buf, int self);
/* Our record `buf` serves no slot any more: its mappers close it. */
void ts_gpuring_buf_retire(struct ts_gpuring *g, unsigned buf, uint64_t uniq);

/* Begin writing slot `slot` for `seq` into buffer `buf` (word -> WRITING). */
void ts_gpuring_slot_begin(struct ts_gpuring *g, unsigned slot, unsigned writer, uint64_t seq, unsigned buf);
/* The positions' places, then READY. -EINVAL: the layout does not fit the buffer. */
int ts_gpuring_slot_ready(struct ts_gpuring *g, unsigned slot, uint64_t uniq, uint32_t npos, const uint64_t *off,
			  const uint64_t *len);
/* Give up a slot we began (READY never comes). */
void ts_gpuring_slot_drop(struct ts_gpuring *g, unsigned slot);
/* Is `writer` keeping `seq` now (WRITING): READY, or a drop, is coming? */
int ts_gpuring_slot_pending(const struct ts_gpuring *g, uint64_t seq, int writer);
/* Has a later batch taken the slot of `seq` (so `seq` is never READY there again)? */
int ts_gpuring_slot_passed(const struct ts_gpuring *g, uint64_t seq);

/* ---- consumer ---------------------------------------------------------------------- */

/*
 * Hold the buffer that holds `seq` (published by member `writer`) in slot
 * seq % depth, if it is READY: 0 and *out filled; -EAGAIN not (yet) there
 * (WRITING, or an older seq); -ESTALE overwritten since; -EBADMSG invalid.
 */
int ts_gpuring_hold(struct ts_gpuring *g, int self, uint64_t seq, int writer, struct ts_gpu_held *out);
/* The same, for a caller that may already hold the buffer (a copy in flight): a failure leaves its bit set. */
int ts_gpuring_hold_again(struct ts_gpuring *g, int self, uint64_t seq, int writer, struct ts_gpu_held *out);
void ts_gpuring_unhold(struct ts_gpuring *g, int self, unsigned buf);
/* Clear every hold of member `self` (a new process in a reused member slot, or leaving). */
void ts_gpuring_unhold_all(struct ts_gpuring *g, int self);
/* Buffer `buf` is open here (set while holding it) / closed again. */
void ts_gpuring_map(struct ts_gpuring *g, int self, unsigned buf);
void ts_gpuring_unmap(struct ts_gpuring *g, int self, unsigned buf);
/* Clear every mapped bit of member `self` (a new process in a reused member slot). */
void ts_gpuring_unmap_all(struct ts_gpuring *g, int self);
/* Is record `buf` still the allocation `uniq`? */
int ts_gpuring_buf_current(const struct ts_gpuring *g, unsigned buf, uint64_t uniq);
/* ... and still serving a slot (not retired)? A mapping of anything else is closed. */
int ts_gpuring_buf_serving(const struct ts_gpuring *g, unsigned buf, uint64_t uniq);

#endif
