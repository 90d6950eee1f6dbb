/* SPDX-License-Identifier: MIT */
/*
 * The shared decoded-image cache (exact mode).
 *
 * One segment per (user, session): /dev/shm/tsshim-cache.<uid>.<session>,
 * mode 0600, created under a temporary name and link()ed into place once it
 * is fully initialised. A user of the cache asks for a key with ts_cache_get()
 * and gets one of:
 *
 *   TS_CACHE_HIT     the committed bytes were copied to dst (byte-identical to
 *                    what the filler committed; a torn copy is never returned)
 *   TS_CACHE_FILL    this process now owns the key: decode straight into
 *                    fill->ptr (fill->len bytes), then ts_cache_commit() or,
 *                    if the decode fails, ts_cache_abort()
 *   TS_CACHE_BYPASS  decode privately; nothing was inserted (lock busy, no
 *                    space, another filler did not finish in time, ...)
 *
 * Segment layout (all offsets from the start of the file; see the structs):
 *
 *   [0, index_off)                header: static part (checksummed), the
 *                                 lock, allocator state, counters, users
 *   [index_off, arena_off)        index: nentries (power of two) entries,
 *                                 open addressing with linear probing over a
 *                                 bounded window
 *   [arena_off, segment_size)     data arena (the budget), a ring
 *
 * Header and index are reserved with posix_fallocate at creation. The arena
 * is sparse: it is reserved in chunks (chunk_size) as allocation first
 * reaches them, so a full /dev/shm shows up as a failed allocation (BYPASS)
 * and never as SIGBUS in the host program. No byte of the arena above the
 * reserved high-water mark is ever touched.
 *
 * Concurrency: index changes and allocation run under the lock in the
 * header (shmlock.h: a holder that dies is taken over, and no pointer in it
 * is ever followed), taken with a timeout (never a hang: a timeout
 * means BYPASS). Three transitions are lock-free CASes on the entry word, so
 * that a decode already paid for is never lost to lock contention: commit
 * (FILLING->READY), abort (FILLING->DROPPED) and the late commit of an
 * orphaned fill (ORPHAN->DROPPED). Image bytes are never copied under the
 * lock. See cache.c for the memory-ordering map.
 *
 * Eviction (CLOCK over a log-structured ring): allocation happens at the
 * ring head and evicts the entries the new range overlaps, oldest first
 * (FIFO). An entry hit since the hand last passed it has its reference bit
 * set: the hand clears the bit and skips over it once (second chance), so
 * an entry that keeps being hit survives every sweep while cold ones go. A
 * FILLING entry whose filler is alive is never evicted (the hand skips it);
 * only when nothing else can be found is the reference bit ignored.
 *
 * All functions return 0 (or a TS_CACHE_* result) or -errno, and preserve
 * errno. Everything read from the segment is validated.
 */
#ifndef TSSHIM_CORE_CACHE_H
#define TSSHIM_CORE_CACHE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "layout.h"  /* TS_NAME_MAX */
#include "prim.h"
#include "session.h" /* TS_PATH_MAX */
#include "shmlock.h"

#define TS_CACHE_MAGIC          0x3148434143535354ULL /* "TSSCACH1" little-endian */
#define TS_CACHE_LAYOUT_VERSION 4u
#define TS_CACHE_PREFIX         "tsshim-cache."
#define TS_CACHE_MAX_USERS      128u
#define TS_CACHE_MIN_BUDGET     (1ull << 20)  /* 1 MiB */
#define TS_CACHE_MAX_BUDGET     (1ull << 40)  /* 1 TiB (TSSHIM_CACHE_MB's upper bound) */
#define TS_CACHE_ADMIT_RATIO    4u            /* default admit_ratio */
#define TS_CACHE_SAMPLE_MISSES  64u           /* not admitting: still one miss in this many */
#define TS_CACHE_CHUNK          (32ull << 20) /* arena reserved 32 MiB at a time */
#define TS_CACHE_MIN_ENTRIES    1024u
#define TS_CACHE_MAX_ENTRIES    (1u << 20)
#define TS_CACHE_BYTES_PER_ENTRY (64u << 10)  /* entries = arena / 64 KiB, rounded up to 2^k */
#define TS_CACHE_PROBE          64u           /* probe window of the hash table */
#define TS_CACHE_NONE           UINT32_MAX    /* "no entry" in list links */
#define TS_CACHE_SCOPE_MAX      2048u         /* the scope note, NUL included */

/* Default bounds (a handle may change its own copy; tests do). */
#define TS_CACHE_LOCK_TIMEOUT_NS  50000000ull     /* get(): 50 ms, then BYPASS */
#define TS_CACHE_OPEN_TIMEOUT_NS  500000000ull    /* open/close: 0.5 s */
#define TS_CACHE_STALE_FILL_NS    30000000000ull  /* a live fill older than 30 s is orphaned */

/*
 * The key: compared in full (all 72 bytes), hashed for the table. Every byte
 * that can change the decoded output must be in it: the file's identity
 * (ctime too: a rewrite whose mtime was put back, cp -p, still changes it) and
 * every decode parameter (packed raw, not hashed, into params, unused bytes
 * zero), including which decoder library produced it.
 */
struct ts_cache_key {
	uint64_t dev;
	uint64_t ino;
	uint64_t size;
	int64_t mtime_ns;
	int64_t ctime_ns;
	uint8_t params[32];
};

/* ---- segment layout (shared memory; bump the version on any change) ---- */

/* Written once by the creator before the segment becomes visible. */
struct ts_cache_static {
	uint64_t magic;
	uint32_t layout_version;
	uint32_t header_size;   /* sizeof(struct ts_cache_header) */
	uint32_t entry_size;    /* sizeof(struct ts_cache_entry) */
	uint32_t lock_size;     /* sizeof(struct ts_shm_lock): the lock's ABI */
	uint32_t nentries;      /* power of two, MIN..MAX_ENTRIES */
	uint32_t uid;
	uint64_t index_off;     /* page-aligned, >= header_size */
	uint64_t arena_off;     /* page-aligned, index_off + nentries * entry_size rounded up */
	uint64_t arena_size;    /* the budget, page-aligned */
	uint64_t segment_size;  /* arena_off + arena_size: the file's size */
	uint64_t chunk_size;    /* arena reservation granule */
	uint64_t created_unix_ns;
	uint32_t creator_pid;
	uint32_t reserved0;
	char session[TS_NAME_MAX];
	uint32_t checksum;      /* FNV-1a of everything above */
	uint32_t reserved1;
};

/*
 * Entry word: generation (56 bits) << 8 | state (8 bits). The generation
 * changes whenever an entry stops being what it was (removed, reused,
 * aborted); FILLING->READY and FILLING->ORPHAN keep it. A reader that copied
 * a READY entry's bytes accepts them only if the word is unchanged after the
 * copy (seqlock).
 *
 *   EMPTY    never used: ends a probe chain
 *   TOMB     free slot inside a chain
 *   FILLING  findable; range pinned while the filler process is alive
 *   READY    findable; range evictable
 *   ORPHAN   a fill that took longer than the stale bound: not findable (so
 *            the key can be filled again), range pinned while its filler lives
 *   DROPPED  aborted: not findable, range evictable
 *
 * FILLING, READY, ORPHAN and DROPPED hold an arena range and are on the
 * offset-ordered list (prev/next).
 */
enum ts_cache_state {
	TS_CENT_EMPTY = 0,
	TS_CENT_TOMB = 1,
	TS_CENT_FILLING = 2,
	TS_CENT_READY = 3,
	TS_CENT_ORPHAN = 4,
	TS_CENT_DROPPED = 5,
};

#define TS_CENT_STATE(w) ((uint32_t)((w) & 0xffu))
#define TS_CENT_GEN(w)   ((w) >> 8)
#define TS_CENT_WORD(gen, state) ((uint64_t)(gen) << 8 | (uint64_t)(state))

struct ts_cache_entry {
	_Atomic uint64_t word;      /* gen | state, see above */
	_Atomic uint32_t wake;      /* futex: bumped on every change of word */
	_Atomic uint32_t ref;       /* CLOCK reference bit: hit since the hand passed */
	/* The rest is written under the lock while the entry is EMPTY/TOMB
	 * (invisible), then published by the release store of word. */
	uint64_t hash;
	struct ts_cache_key key;
	uint64_t off;               /* arena offset */
	uint64_t len;               /* bytes */
	uint32_t prev, next;        /* offset-ordered list of range holders (under the lock) */
	uint32_t filler_pid;
	uint32_t reserved;
	uint64_t filler_start;      /* filler's start time: pid + this = identity */
	uint64_t fill_start_ns;     /* CLOCK_MONOTONIC when the fill began */
	_Atomic uint64_t decode_ns; /* set by commit: what a hit saves */
	_Atomic uint64_t last_hit;  /* tick of the last hit (LRU choice under index pressure) */
};

/*
 * OPENER: opened the cache itself. JOB: registered by a forked child for the
 * job it belongs to (ts_cache_adopt). WORKER: such a child; it counts as a
 * live user only while its parent is a live JOB, so that the workers a
 * killed job leaves behind (DataLoader workers notice within seconds) never
 * keep the last job out from removing the cache.
 */
enum { TS_CACHE_USER_OPENER = 0, TS_CACHE_USER_JOB = 1, TS_CACHE_USER_WORKER = 2 };

struct ts_cache_user {
	_Atomic uint32_t pid;       /* 0: free */
	uint32_t kind;              /* TS_CACHE_USER_*: how it came to be registered */
	_Atomic uint64_t start_time;
};

struct ts_cache_counters {
	_Atomic uint64_t hits;
	_Atomic uint64_t misses;         /* gets that found no READY entry */
	_Atomic uint64_t fills;          /* FILL results */
	_Atomic uint64_t commits;
	_Atomic uint64_t aborts;
	_Atomic uint64_t bypasses;       /* BYPASS results, all reasons */
	_Atomic uint64_t bypass_lock;    /* lock busy (timeout) or unusable */
	_Atomic uint64_t bypass_nospace; /* no range free of live fills, or index window full */
	_Atomic uint64_t bypass_shm;     /* /dev/shm full (fallocate failed) */
	_Atomic uint64_t bypass_wait;    /* another filler did not finish within wait_ns */
	_Atomic uint64_t bypass_aborted; /* the fill we waited for was aborted */
	_Atomic uint64_t bypass_other;   /* too large, length mismatch, corruption */
	_Atomic uint64_t waits;          /* gets that waited for another filler */
	_Atomic uint64_t evictions;      /* READY entries evicted */
	_Atomic uint64_t reclaims;       /* fills of dead processes removed */
	_Atomic uint64_t orphans;        /* live fills orphaned for being too old */
	_Atomic uint64_t torn;           /* copies rejected by the seqlock check */
	_Atomic uint64_t repairs;        /* index repairs (dead lock holder, corruption) */
	_Atomic uint64_t saved_decode_ns;/* sum of decode_ns of entries served as hits */
	_Atomic uint64_t bypass_cold;    /* misses not admitted: the cache evicts and is rarely hit */
	uint64_t pad[4];
};

enum ts_cache_seg_state { TS_CACHE_SEG_OPEN = 1, TS_CACHE_SEG_CLOSED = 2 };

struct ts_cache_header {
	struct ts_cache_static st;
	_Atomic uint32_t state;          /* OPEN, CLOSED (being removed: open again) */
	uint32_t reserved;
	uint64_t pad0[6];
	struct ts_shm_lock lock;         /* a holder that dies is taken over (shmlock.h) */
	/* Allocator state: only under the lock. */
	uint64_t head;                   /* next allocation offset, 0..arena_size */
	uint32_t first, last;            /* offset-ordered list of range holders */
	uint32_t cursor;                 /* first holder with off >= head, or NONE */
	uint32_t reserved2;
	_Atomic uint64_t bytes_in_use;   /* sum of len of range holders (under the lock) */
	_Atomic uint64_t falloc_hwm;     /* arena bytes reserved (multiple of chunk or arena_size) */
	_Atomic uint64_t tick;           /* logical clock for last_hit */
	_Atomic uint64_t ahead;          /* highest hwm whose next chunk someone pre-reserves */
	uint64_t pad1[1];
	struct ts_cache_counters counters;
	struct ts_cache_user users[TS_CACHE_MAX_USERS];
	/* The dataset scope its users decode from, for tsshim-inspect: a
	 * seqlock (odd while written; a writer that finds it odd skips). */
	_Atomic uint32_t scope_seq;
	uint32_t reserved3;
	char scope[TS_CACHE_SCOPE_MAX];
};

/* ---- API ---------------------------------------------------------------- */

enum ts_cache_result { TS_CACHE_BYPASS = 0, TS_CACHE_HIT = 1, TS_CACHE_FILL = 2 };

/* A process's handle. Fields marked "tunable" may be changed after open. */
struct ts_cache {
	struct ts_cache_header *hdr;
	struct ts_cache_entry *ents;
	unsigned char *arena;
	size_t map_size;
	/* the geometry, from the static header as validated (a private copy: a peer may rewrite the file's) */
	uint64_t arena_off;
	uint64_t arena_size;
	uint64_t chunk_size;
	uint32_t nentries;
	int fd;
	dev_t dev;                /* identity of fd: checked before every fallocate */
	ino_t ino;
	uint32_t opener_pid;      /* a forked child never unregisters its parent */
	int user_slot;
	int need_repair;          /* private: set under the lock, consumed before unlocking */
	unsigned told_repair;     /* private: lock take-overs this handle has seen (one line said) */
	/*
	 * private: the arena's chunks this process reserved itself (a bit per
	 * chunk). falloc_hwm in the shared header says how far the file is
	 * reserved, but a peer can write anything there: a range is read or
	 * written only once its chunks are in here (own_range, cache.c).
	 */
	_Atomic uint64_t *own_chunks;
	uint64_t lock_timeout_ns; /* tunable: get()'s lock wait */
	uint64_t stale_fill_ns;   /* tunable: live fills older than this are orphaned */
	/*
	 * tunable: once the cache has evicted, a miss is filled only while
	 * hits keep up with fills (a hit per admit_ratio fills), or one miss in
	 * TS_CACHE_SAMPLE_MISSES: a fill costs more than a decode, and a
	 * dataset much larger than the budget would only ever be filled and
	 * evicted. 0: fill every miss.
	 */
	uint32_t admit_ratio;
	/* Tests only: called between a hit's copy and its seqlock re-check. */
	void (*after_copy)(struct ts_cache *c, void *arg);
	void *after_copy_arg;
	char path[TS_PATH_MAX];
	char session[TS_NAME_MAX];
};

/* What a FILL hands out; pass it back to commit or abort. */
struct ts_cache_fill {
	void *ptr;       /* fill->len writable bytes in the arena */
	uint64_t len;
	uint64_t word;   /* the entry word while FILLING (private: identifies the fill) */
	uint32_t slot;   /* private */
	uint32_t owner;  /* pid of the process filling: a forked child holds a copy, never the fill */
};

struct ts_cache_stats {
	uint64_t hits, misses, fills, commits, aborts, bypasses;
	uint64_t bypass_lock, bypass_nospace, bypass_shm, bypass_wait, bypass_aborted, bypass_other;
	uint64_t waits, evictions, reclaims, orphans, torn, repairs;
	uint64_t saved_decode_ns;
	uint64_t bypass_cold;    /* misses not admitted (see admit_ratio) */
	uint64_t bytes_in_use;   /* bytes held by entries (ready, filling, not yet reclaimed) */
	uint64_t entries;        /* READY entries */
	uint64_t filling;        /* FILLING entries */
	uint64_t capacity;       /* index slots */
	uint64_t budget;         /* arena bytes */
	uint64_t reserved_bytes; /* arena bytes reserved in /dev/shm so far */
	uint64_t users;          /* registered users (live or not yet reaped) */
	char scope[TS_CACHE_SCOPE_MAX]; /* dataset scope noted by its users, "" if none */
	uint64_t created_unix_ns;
};

/* "/dev/shm/tsshim-cache.<uid>.<session>" */
int ts_cache_path(char *buf, size_t n, uid_t uid, const char *session);

/*
 * Open (creating if needed) the cache of `session` for the calling user and
 * register the caller as a user. budget_bytes (rounded up to a page) is used
 * only when creating: the creator's budget wins. A segment left behind by
 * users that all died is removed and replaced. On failure, why says why.
 */
int ts_cache_open(struct ts_cache *c, const char *session, uint64_t budget_bytes, char *why,
		  size_t whylen);
/*
 * Unregister (the adopted registrations of this process too) and unmap;
 * the last live user out removes the segment. In a
 * forked child (other pid than the opener) it only unmaps. Fills still
 * pending are not released (their ranges are reclaimed once this process
 * has exited): close only when no thread is still filling.
 */
void ts_cache_close(struct ts_cache *c);
/*
 * For exit paths (destructors): unregister like close (the last live user
 * out removes the segment) but keep the mapping and the descriptor, so that
 * threads still inside get/commit, or still writing a fill, never touch
 * unmapped memory. The handle keeps working; a later close only unmaps.
 */
void ts_cache_leave(struct ts_cache *c);

uint64_t ts_cache_key_hash(const struct ts_cache_key *k);
/* Tests only: the hash the table uses (default ts_cache_key_hash). */
extern uint64_t (*ts_cache_hash_fn)(const struct ts_cache_key *k);

/*
 * Look up k, whose decoded image is len bytes. dst (len bytes) receives the
 * image on HIT. If another live process is filling k, wait up to wait_ns
 * for it (then HIT, or BYPASS if it did not finish or aborted). On FILL,
 * *fill describes the reserved range. -EINVAL for bad arguments.
 */
int ts_cache_get(struct ts_cache *c, const struct ts_cache_key *k, uint64_t len, void *dst,
		 uint64_t wait_ns, struct ts_cache_fill *fill);
/* Publish a fill (all fill->len bytes written). -ESTALE if it was orphaned
 * or reclaimed meanwhile: nothing was published, nothing else to do. */
int ts_cache_commit(struct ts_cache *c, struct ts_cache_fill *fill, uint64_t decode_ns);
/* The decode failed: drop the entry; processes waiting for it BYPASS. */
void ts_cache_abort(struct ts_cache *c, struct ts_cache_fill *fill);

/*
 * Is k READY (1) or not (0)? Changes nothing (no hit is recorded, no
 * reference bit set); -ETIMEDOUT if the lock is busy.
 */
int ts_cache_peek(struct ts_cache *c, const struct ts_cache_key *k);

/* Note the dataset scope (shown by tsshim-inspect); never blocks. */
void ts_cache_set_scope(struct ts_cache *c, const char *scope);

/* Counters of an open cache. */
void ts_cache_stats(const struct ts_cache *c, struct ts_cache_stats *out);

/*
 * Read-only view for tsshim-inspect: map the segment at path read-only,
 * validate it, copy the counters. Never changes the segment. -ENOENT if
 * there is none.
 */
int ts_cache_view(const char *path, struct ts_cache_stats *out, char *why, size_t whylen);

/*
 * Also register `who` (the process this one was forked from) as a user, once:
 * a worker forked per epoch then leaves the segment alive for the next one
 * for as long as the job that forks them lives. 0, -ESRCH if who is gone,
 * -EUSERS, -ETIMEDOUT (lock busy). The job unregisters with ts_cache_depart.
 * The caller becomes a WORKER: it counts only while its parent, a JOB, lives.
 */
int ts_cache_adopt(struct ts_cache *c, const struct ts_ident *who);

/* Remove the segment at path if none of its users is alive: 1 removed, 0
 * left alone, -errno on error. */
int ts_cache_remove_if_stale(const char *path);
/* The same after taking the calling process off the list where forked
 * children adopted it: a job's exit path (ts_cache_close and
 * ts_cache_leave do the same for a process that opened the cache). On 1
 * (removed), *last (if not NULL) gets the counters the segment ended with. */
int ts_cache_depart(const char *path, struct ts_cache_stats *last);

/* Validation of a mapped header of `size` bytes (possibly hostile). */
int ts_cache_validate(const struct ts_cache_header *h, size_t size, uid_t uid, char *why,
		      size_t whylen);
uint32_t ts_cache_static_checksum(const struct ts_cache_static *st);

#endif
