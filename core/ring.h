/* SPDX-License-Identifier: MIT */
/*
 * Ring bookkeeping: TSSHIM_DEPTH batch slots carried in the session segment.
 * The ring knows sizes and sequence numbers, not data: where the bytes of a
 * slot live (host shm, GPU buffer) is the data plane's business, named by
 * the opaque meta tag.
 *
 * The producer publishes batches as lists of tensor positions (bytes per
 * position). Each position is a byte stream: a consumer asks for the next
 * want[p] bytes of every position at its own batch size and gets ranges
 * that may span slots. Its sizes must be proportional to the producer's
 * (want[p] * len[0] == want[0] * len[p]), which keeps samples paired.
 *
 * All functions return 0 or -errno; none of them blocks without a timeout.
 */
#ifndef TSSHIM_CORE_RING_H
#define TSSHIM_CORE_RING_H

#include <stddef.h>
#include <stdint.h>

#include "layout.h"

static inline uint64_t ts_slot_word(unsigned state, unsigned writer1, uint32_t epoch, uint64_t seq)
{
	return (uint64_t)state << 62 | (uint64_t)(writer1 & 0x7f) << 55 |
	       (uint64_t)(epoch & 0x1ff) << 46 | (seq & ((1ULL << TS_SLOT_SEQ_BITS) - 1));
}
static inline unsigned ts_slot_state(uint64_t w) { return (unsigned)(w >> 62); }
static inline unsigned ts_slot_writer1(uint64_t w) { return (unsigned)(w >> 55) & 0x7f; }
static inline uint32_t ts_slot_epoch(uint64_t w) { return (uint32_t)(w >> 46) & 0x1ff; }
static inline uint64_t ts_slot_seq(uint64_t w) { return w & ((1ULL << TS_SLOT_SEQ_BITS) - 1); }

/*
 * The segment's ring depth, read once: a peer may rewrite the field at any
 * time, so a caller that divides or indexes by it uses this one value.
 * 1..TS_MAX_DEPTH, or 0 when out of range (a corrupt segment).
 */
static inline uint32_t ts_ring_depth(const struct ts_segment *seg)
{
	uint32_t v = __atomic_load_n(&seg->st.depth, __ATOMIC_RELAXED);
	return v >= 1 && v <= TS_MAX_DEPTH ? v : 0;
}

/* Producer-side state, private to the producing process. */
struct ts_ring_writer {
	int self;           /* our member index */
	uint32_t epoch;     /* producer epoch we hold */
	uint64_t next_seq;  /* seq the next begin claims */
	int claimed;        /* between begin and publish/abort */
	uint64_t seq;       /* claimed seq */
	unsigned slot;      /* claimed slot index */
	uint64_t prev;      /* slot word we replaced: abort() puts it back */
};

/* Consumer-side state, private to the consuming process. */
struct ts_ring_reader {
	int self;
	uint64_t attach;    /* our attach word as we last wrote it */
	uint64_t seq;       /* slot we are in */
	uint64_t off[TS_MAX_POSITIONS]; /* bytes consumed of seq, per position */
};

struct ts_range {
	uint64_t seq;
	uint32_t slot;
	uint32_t writer;    /* member index whose buffers hold the bytes */
	uint64_t tag;       /* writer's opaque buffer tag */
	uint64_t off;       /* byte offset within that slot's position */
	uint64_t len;
	uint64_t slot_len;  /* the position's full size in that slot */
};

#define TS_READ_MAX_RANGES TS_MAX_DEPTH

struct ts_read {
	uint32_t npos;
	uint32_t end_of_epoch;                    /* ranges reach an epoch's end */
	uint64_t got[TS_MAX_POSITIONS];           /* bytes returned per position */
	uint32_t nranges;                         /* same count for every position */
	struct ts_range r[TS_MAX_POSITIONS][TS_READ_MAX_RANGES];
};

/*
 * Producer. begin() waits (up to timeout_ns) until the slot for the next seq
 * is released by every attached consumer, evicting consumers that are dead
 * or whose heartbeat is older than the session timeout, then claims it.
 * Fill the returned meta row, then publish() or abort().
 *   -EPERM:     we are not (or no longer) the producer
 *   -ETIMEDOUT: still held back by a live consumer
 *   -EDEADLK:   held back by our own attachment (read the slot first)
 *   -EBUSY:     begin() while a claim is open
 *   -EINVAL:    publish() of an invalid meta row (the claim stays open)
 */
int ts_ring_writer_init(struct ts_segment *seg, int self, struct ts_ring_writer *w);
int ts_ring_begin(struct ts_segment *seg, struct ts_ring_writer *w, uint64_t timeout_ns,
		  struct ts_batch_meta **meta);
int ts_ring_publish(struct ts_segment *seg, struct ts_ring_writer *w);
int ts_ring_abort(struct ts_segment *seg, struct ts_ring_writer *w);

/*
 * Consumer. attach() starts at the current head (the next seq to be
 * published). peek() waits up to timeout_ns for data and returns ranges for
 * min(want, what is published) without consuming; advance() consumes got[]
 * bytes and releases slots fully passed, waking the producer.
 *   -ESTALE:    we were evicted (dead-looking heartbeat): re-attach
 *   -EPROTO:    want[] not proportional to the producer's sizes, or npos differs
 *   -ETIMEDOUT: nothing published in time
 *   -EBADMSG:   a slot's metadata failed validation
 *
 * The bytes named by peek()'s ranges may be used only if the advance() that
 * follows the copy returns 0: -ESTALE there means we were evicted and the
 * producer may have reused the slots while we were copying.
 */
int ts_ring_attach(struct ts_segment *seg, int self, struct ts_ring_reader *r);
/* Attach at seq `from` (<= the head) if it is still in the ring, else at the head. */
int ts_ring_attach_at(struct ts_segment *seg, int self, struct ts_ring_reader *r, uint64_t from);
int ts_ring_detach(struct ts_segment *seg, struct ts_ring_reader *r);
int ts_ring_peek(struct ts_segment *seg, struct ts_ring_reader *r, uint32_t npos,
		 const uint64_t *want, struct ts_read *out, uint64_t timeout_ns);
int ts_ring_advance(struct ts_segment *seg, struct ts_ring_reader *r, const struct ts_read *rd,
		    const uint64_t *got);

/*
 * The validated meta row of published seq, wherever it is (no reader):
 * -EAGAIN not published (yet), -ESTALE overwritten since.
 */
int ts_ring_slot_meta(struct ts_segment *seg, uint64_t seq, struct ts_batch_meta *m, unsigned *writer);
/* Wait (up to timeout_ns) until the slot the reader is in is published; its meta row. */
int ts_ring_wait_next(struct ts_segment *seg, struct ts_ring_reader *r, uint64_t timeout_ns,
		      struct ts_batch_meta *m, unsigned *writer);
/*
 * Producer: evict the live consumers that hold the slot the next begin()
 * needs (they stopped reading); they notice with -ESTALE and re-attach.
 * Returns how many.
 */
int ts_ring_evict_laggards(struct ts_segment *seg, const struct ts_ring_writer *w);
/*
 * The same for the laggards only that have been away (ts_member.away_ns)
 * for at least min_ns: they wait in another feed, maybe on us.
 */
int ts_ring_evict_away(struct ts_segment *seg, const struct ts_ring_writer *w, uint64_t min_ns);

/* Validate one meta row as read from shared memory. */
int ts_batch_meta_valid(const struct ts_batch_meta *m);

#endif
