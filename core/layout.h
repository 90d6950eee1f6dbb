/* SPDX-License-Identifier: MIT */
/*
 * The session segment: one POSIX shared-memory object per (user, session),
 * mapped by every member and read (never written) by tsshim-inspect.
 *
 * Everything after the static part is written concurrently by several
 * processes, so every shared word is an atomic and every value read from
 * here is validated before use: another process may be buggy, dead half-way
 * through a write, or hostile.
 *
 * Bump TS_LAYOUT_VERSION whenever anything below changes shape.
 */
#ifndef TSSHIM_CORE_LAYOUT_H
#define TSSHIM_CORE_LAYOUT_H

#include <stdatomic.h>
#include <stdint.h>

#define TS_MAGIC          0x31304d4853535354ULL /* "TSSSHM01" little-endian */
#define TS_LAYOUT_VERSION 4u
#define TS_MAX_MEMBERS    64u
#define TS_MAX_DEPTH      64u
#define TS_MAX_POSITIONS  16u
#define TS_NAME_MAX       64u /* session name incl. NUL */
#define TS_LABEL_MAX      96u /* what the session shares, for people (incl. NUL) */
/* Timeouts a segment may carry: heartbeats come every timeout/4. */
#define TS_TIMEOUT_MIN_MS 10u
#define TS_TIMEOUT_MAX_MS 600000u

/* Written once by the creator before the segment becomes visible. */
struct ts_static {
	uint64_t magic;
	uint32_t layout_version;
	uint32_t header_size;   /* sizeof(struct ts_segment) */
	uint64_t segment_size;  /* bytes the creator truncated the object to */
	uint32_t max_members;
	uint32_t max_depth;
	uint32_t max_positions;
	uint32_t depth;         /* ring depth in use, 1..max_depth */
	uint32_t timeout_ms;    /* producer silence tolerated */
	uint32_t uid;           /* owner, also checked against fstat */
	uint64_t created_unix_ns;
	uint32_t creator_pid;
	uint32_t reserved0;
	char name[TS_NAME_MAX]; /* NUL-terminated session name */
	char label[TS_LABEL_MAX]; /* NUL-terminated; "" for the process session */
	uint32_t checksum;      /* FNV-1a of everything above */
	uint32_t reserved1;
};

/* A member is one process (its forked children belong to it). */
struct ts_member {
	_Atomic uint32_t pid;          /* 0: slot free; written under the join lock */
	_Atomic uint32_t reserved;
	_Atomic uint64_t start_time;   /* clock ticks since boot: pid + this = identity */
	_Atomic uint64_t heartbeat_ns; /* CLOCK_MONOTONIC of the last beat */
	_Atomic uint64_t joined_ns;
	/*
	 * Ring attachment: bit 0 set while attached, the rest a generation that
	 * changes on every attach and on every eviction, so a consumer notices
	 * it was evicted even if it re-attached in between.
	 */
	_Atomic uint64_t attach;
	_Atomic uint64_t read_seq;     /* lowest ring seq this consumer still reads */
	_Atomic uint64_t batches_read;
	/*
	 * CLOCK_MONOTONIC since when this member, not iterating this feed (its
	 * epoch of it over), waits in another feed of its process; 0: not. A
	 * producer need not wait the stall time on such a laggard: it may be
	 * waiting on the producer itself, through that other feed.
	 */
	_Atomic uint64_t away_ns;
};

/*
 * Slot word: state (2 bits) | writer member index + 1 (7 bits) |
 * epoch (9 bits, truncated) | seq (46 bits).
 */
enum ts_slot_state { TS_SLOT_FREE = 0, TS_SLOT_WRITING = 1, TS_SLOT_PUBLISHED = 2 };

#define TS_SLOT_SEQ_BITS    46
#define TS_SLOT_EPOCH_BITS  9
#define TS_SLOT_WRITER_BITS 7

/* Batch metadata, written only by the member that claimed the slot. */
struct ts_batch_meta {
	uint32_t npos;                   /* tensor positions in this batch */
	uint32_t flags;                  /* TS_BATCH_* */
	uint64_t len[TS_MAX_POSITIONS];  /* bytes per position */
	uint64_t tag;                    /* opaque to the ring (buffer id for the data plane) */
	uint64_t nsamples;               /* samples in the batch: every len[p] is a multiple */
};

#define TS_BATCH_END_OF_EPOCH 1u

struct ts_slot {
	_Atomic uint64_t word;
	uint64_t pad[7];
};

struct ts_ring {
	_Atomic uint64_t claim_seq; /* highest seq claimed + 1 (informational) */
	_Atomic uint64_t pub_seq;   /* every seq below this is published */
	_Atomic uint32_t pub_ev;    /* futex: bumped on every publish and producer change */
	_Atomic uint32_t rel_ev;    /* futex: bumped on every release/detach */
	uint64_t pad[5];
	struct ts_slot slots[TS_MAX_DEPTH];
	/*
	 * Metadata per (writer, slot): a producer that was replaced while it was
	 * stopped can only scribble over its own rows, which nobody reads once
	 * its claim has been taken over.
	 */
	struct ts_batch_meta meta[TS_MAX_MEMBERS][TS_MAX_DEPTH];
};

struct ts_counters {
	_Atomic uint64_t batches_shared;
	_Atomic uint64_t decodes_skipped;
	_Atomic uint64_t decodes_shared;
	_Atomic uint64_t bytes_not_copied;
	_Atomic uint64_t cpu_ns_saved;
	_Atomic uint64_t takeovers;
	_Atomic uint64_t evictions;
	_Atomic uint64_t samples_served;  /* samples consumers took from the stream */
	_Atomic uint64_t samples_produced; /* samples published, with their cost: */
	_Atomic uint64_t produce_cpu_ns;   /* CPU the producers spent making them */
	uint64_t pad;
};

enum ts_seg_state { TS_SEG_OPEN = 1, TS_SEG_CLOSED = 2 };

/* feed_flags */
#define TS_FEED_UNSHAREABLE 1u /* the producer met batches the feed cannot carry */

/* producer word: epoch (high 32 bits) | member index + 1 (low 32; 0 = none) */
struct ts_segment {
	struct ts_static st;
	_Atomic uint32_t state;
	_Atomic uint32_t election_ev;  /* futex: bumped when the producer changes */
	_Atomic uint64_t producer;
	/*
	 * Data feeds (feed.h): a producer that is not iterating says so by
	 * storing its producer word here with the time; a consumer that waits
	 * longer than the timeout on an idle producer may take over.
	 */
	_Atomic uint64_t idle_word;
	_Atomic uint64_t idle_ns;
	_Atomic uint32_t feed_flags;   /* TS_FEED_* */
	uint32_t pad0;
	uint64_t pad[3];
	struct ts_counters counters;
	struct ts_member members[TS_MAX_MEMBERS];
	struct ts_ring ring;
};

#endif
