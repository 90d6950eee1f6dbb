/* SPDX-License-Identifier: MIT */
/*
 * The shared decoded-image cache (see cache.h for the layout, the API and
 * the eviction policy).
 *
 * Memory-ordering map
 *
 *  - Publication of a fill: the filler writes the image bytes with plain
 *    stores, then commit CASes the entry word FILLING->READY with release.
 *    Every reader loads the word with acquire before it trusts the entry
 *    (under the lock, or in the lock-free wait loop), so the bytes and
 *    decode_ns happen-before its copy.
 *
 *  - Hits are seqlock reads: the word W (READY, generation g) and the
 *    entry's range are read under the lock, the lock is dropped, the bytes
 *    are copied, then an acquire fence and a re-load of the word. Any change
 *    that makes the range someone else's bumps the generation first (removal
 *    CASes the word to TOMB|g+1 under the lock). The thread that later
 *    writes into that range went through the lock after the removal and
 *    issues a release fence before its first byte (end of the FILL path in
 *    ts_cache_get). So if the copy saw any byte of the new owner, the fence
 *    pair (writer's release fence, reader's acquire fence) makes the new
 *    generation visible to the re-load, and the copy is rejected. The copy
 *    itself is a benign, detected data race (as in every seqlock); it never
 *    leaves [off, off+len), which was validated against the arena and the
 *    reserved high-water mark, so it can never fault.
 *
 *  - A live filler's range is never handed to anyone else: FILLING and
 *    ORPHAN entries are skipped by the allocator while the filler process
 *    is alive (identity = pid + start time), and their slot is not reused
 *    until commit/abort turned them into READY/DROPPED. That is what lets
 *    commit/abort run without the lock, and what keeps a slow or stopped
 *    filler from scribbling over someone else's bytes.
 *
 *  - Wake-ups: every change of an entry word is followed by a release
 *    increment of the entry's futex counter and a wake. A waiter loads the
 *    counter (acquire) before it re-checks the word, so a change between
 *    check and futex_wait turns the wait into -EAGAIN, never a lost wake.
 *    Waits are sliced (10 ms) to re-check the filler's liveness and are
 *    bounded by the caller's wait_ns.
 *
 *  - The lock (shmlock.h) is always taken with a timeout. A holder that
 *    died is taken over (TS_SHM_LOCK_REPAIR), and that or any inconsistency found while
 *    walking the index run repair(), which rebuilds everything derived
 *    (list, cursor, byte count) from the entry words and ranges; every
 *    critical section leaves entries either invisible or complete, because
 *    an entry becomes visible only by the final release store of its word.
 */
#include "cache.h"
#include "hash.h"
#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define NONE          TS_CACHE_NONE
#define SLICE_NS      10000000ull /* longest single futex wait: filler liveness is rechecked this often */
#define MAX_ROUNDS    8           /* lock acquisitions per get() besides waits */
#define OPEN_ATTEMPTS 16
#define E_SHM         4095        /* internal: reserving arena pages failed (/dev/shm full) */

_Static_assert(sizeof(struct ts_cache_key) == 72, "key must be 72 bytes without padding");
_Static_assert(sizeof(struct ts_shm_lock) == 64, "the lock is one cache line of the header");
_Static_assert(sizeof(struct ts_cache_entry) % 8 == 0, "entry alignment");

uint64_t (*ts_cache_hash_fn)(const struct ts_cache_key *k) = ts_cache_key_hash;

/* ---- small helpers ------------------------------------------------------ */

__attribute__((format(printf, 4, 5)))
static int fail(char *why, size_t whylen, int err, const char *fmt, ...)
{
	if (why && whylen) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(why, whylen, fmt, ap);
		va_end(ap);
	}
	return err;
}

static uint64_t page_size(void)
{
	long p = sysconf(_SC_PAGESIZE);
	return p > 0 ? (uint64_t)p : 4096;
}

static uint64_t round_up(uint64_t v, uint64_t a)
{
	return (v + a - 1) / a * a;
}

static inline uint64_t min_u64(uint64_t a, uint64_t b)
{
	return a < b ? a : b;
}

static inline uint64_t deadline_after(uint64_t timeout_ns)
{
	uint64_t now = ts_now_ns();
	return timeout_ns > UINT64_MAX - now ? UINT64_MAX : now + timeout_ns;
}

static inline uint64_t count(_Atomic uint64_t *ctr)
{
	return atomic_fetch_add_explicit(ctr, 1, memory_order_relaxed) + 1;
}

/* release: the change we announce is visible to a waiter that acquires the counter */
static inline void bump_wake(_Atomic uint32_t *ev)
{
	atomic_fetch_add_explicit(ev, 1, memory_order_release);
	ts_futex_wake_all(ev);
}

static inline bool is_holder(uint32_t s)
{
	return s == TS_CENT_FILLING || s == TS_CENT_READY || s == TS_CENT_ORPHAN || s == TS_CENT_DROPPED;
}

uint64_t ts_cache_key_hash(const struct ts_cache_key *k)
{
	return ts_hash64(k, sizeof(*k), 0x636163686b6579ull);
}

uint32_t ts_cache_static_checksum(const struct ts_cache_static *st)
{
	return ts_fnv1a32(st, offsetof(struct ts_cache_static, checksum));
}

int ts_cache_path(char *buf, size_t n, uid_t uid, const char *session)
{
	if (!ts_session_name_valid(session))
		return -EINVAL;
	int len = snprintf(buf, n, "%s/" TS_CACHE_PREFIX "%u.%s", ts_shm_dir(), (unsigned)uid, session);
	return len < 0 || (size_t)len >= n ? -ENAMETOOLONG : 0;
}

/* ---- geometry and validation ---------------------------------------------- */

static uint32_t entries_for(uint64_t arena)
{
	uint64_t want = arena / TS_CACHE_BYTES_PER_ENTRY;
	uint32_t n = TS_CACHE_MIN_ENTRIES;
	while (n < want && n < TS_CACHE_MAX_ENTRIES)
		n <<= 1;
	return n;
}

static void geometry(uint64_t budget, struct ts_cache_static *st)
{
	uint64_t page = page_size();
	st->arena_size = round_up(budget, page);
	st->nentries = entries_for(st->arena_size);
	st->index_off = round_up(sizeof(struct ts_cache_header), page);
	st->arena_off = round_up(st->index_off + (uint64_t)st->nentries * sizeof(struct ts_cache_entry), page);
	st->segment_size = st->arena_off + st->arena_size;
	st->chunk_size = TS_CACHE_CHUNK;
}

/*
 * Validate the header of a mapped cache of `size` bytes, on a private copy
 * of its static part taken once (*snap): what was checked is what the caller
 * uses, whatever a peer writes to the file afterwards.
 */
static int validate_snapshot(const struct ts_cache_header *h, size_t size, uid_t uid, struct ts_cache_static *snap,
			     char *why, size_t whylen)
{
	const struct ts_cache_static *st = snap;
	uint64_t page = page_size();
	if (size < sizeof(*st))
		return fail(why, whylen, -EBADMSG, "truncated: %zu bytes, smaller than its header", size);
	memcpy(snap, &h->st, sizeof(*snap));
	if (st->magic != TS_CACHE_MAGIC)
		return fail(why, whylen, -EBADMSG, "not a tsshim cache segment (bad magic)");
	if (st->layout_version != TS_CACHE_LAYOUT_VERSION || st->header_size != sizeof(*h) ||
	    st->entry_size != sizeof(struct ts_cache_entry) || st->lock_size != sizeof(struct ts_shm_lock))
		return fail(why, whylen, -EPROTO,
			    "written by another tsshim build (cache layout %u, header %u, entry %u, lock %u; this build: %u, %zu, %zu, %zu)",
			    st->layout_version, st->header_size, st->entry_size, st->lock_size,
			    TS_CACHE_LAYOUT_VERSION, sizeof(*h), sizeof(struct ts_cache_entry), sizeof(struct ts_shm_lock));
	if (st->checksum != ts_cache_static_checksum(st))
		return fail(why, whylen, -EBADMSG, "header checksum mismatch (corrupted)");
	if (st->uid != (uint32_t)uid)
		return fail(why, whylen, -EACCES, "belongs to uid %u", st->uid);
	uint32_t n = st->nentries;
	if (n < TS_CACHE_MIN_ENTRIES || n > TS_CACHE_MAX_ENTRIES || (n & (n - 1)))
		return fail(why, whylen, -EBADMSG, "invalid index size %u", n);
	if (st->arena_size < TS_CACHE_MIN_BUDGET || st->arena_size > TS_CACHE_MAX_BUDGET || st->arena_size % page ||
	    st->index_off < sizeof(*h) || st->index_off % page || st->arena_off % page ||
	    st->index_off > TS_CACHE_MAX_BUDGET || st->arena_off > TS_CACHE_MAX_BUDGET ||
	    st->arena_off < st->index_off + (uint64_t)n * sizeof(struct ts_cache_entry) ||
	    st->segment_size != st->arena_off + st->arena_size)
		return fail(why, whylen, -EBADMSG, "inconsistent geometry (index at %llu, arena %llu bytes at %llu, size %llu)",
			    (unsigned long long)st->index_off, (unsigned long long)st->arena_size,
			    (unsigned long long)st->arena_off, (unsigned long long)st->segment_size);
	if (st->chunk_size < page || st->chunk_size % page || st->chunk_size > (1ull << 34))
		return fail(why, whylen, -EBADMSG, "invalid reservation chunk %llu", (unsigned long long)st->chunk_size);
	if (st->segment_size > size)
		return fail(why, whylen, -EBADMSG, "truncated: %zu bytes, header says %llu", size,
			    (unsigned long long)st->segment_size);
	if (memchr(st->session, '\0', sizeof(st->session)) == NULL || !ts_session_name_valid(st->session))
		return fail(why, whylen, -EBADMSG, "invalid session name in header");
	uint32_t state = atomic_load_explicit(&h->state, memory_order_relaxed);
	if (state != TS_CACHE_SEG_OPEN && state != TS_CACHE_SEG_CLOSED)
		return fail(why, whylen, -EBADMSG, "invalid state %u", state);
	return 0;
}

int ts_cache_validate(const struct ts_cache_header *h, size_t size, uid_t uid, char *why, size_t whylen)
{
	struct ts_cache_static snap;
	return validate_snapshot(h, size, uid, &snap, why, whylen);
}

/* ---- the lock and repair ---------------------------------------------------- */

static void repair(struct ts_cache *c);

/*
 * ThreadSanitizer (make tsan): tsan_ignore_reads_* hide copy_out's seqlock
 * read, which may overlap a new owner's writes by design (the copy is then
 * dropped), from the race detector. Nothing in other builds. (The lock is
 * atomics TSan follows by itself.)
 */
#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TS_TSAN 1
#endif
#endif
#if defined(__SANITIZE_THREAD__) || defined(TS_TSAN)
void AnnotateIgnoreReadsBegin(const char *file, int line);
void AnnotateIgnoreReadsEnd(const char *file, int line);
#define tsan_ignore_reads_begin() AnnotateIgnoreReadsBegin(__FILE__, __LINE__)
#define tsan_ignore_reads_end() AnnotateIgnoreReadsEnd(__FILE__, __LINE__)
#else
#define tsan_ignore_reads_begin() ((void)0)
#define tsan_ignore_reads_end() ((void)0)
#endif

static int cache_lock(struct ts_cache *c, uint64_t timeout_ns)
{
	int r = ts_shm_lock(&c->hdr->lock, timeout_ns);
	if (r == TS_SHM_LOCK_REPAIR) {
		/*
		 * A holder died inside a critical section, or a peer wrote over
		 * the lock. If we die while repairing, the next one takes the
		 * lock over from us and repairs again. One line per handle: a
		 * peer that keeps writing would fill the job's stderr (the
		 * repairs counter has them all).
		 */
		if (!c->told_repair++)
			ts_warn("cache %s: the cache lock's holder is gone (a job died in it, or a peer wrote over it); "
				"repairing the index", c->session);
		else
			ts_debug("cache %s: the cache lock's holder is gone again; repairing the index", c->session);
		repair(c);
		return 0;
	}
	return r;
}

static void cache_unlock(struct ts_cache *c)
{
	if (c->need_repair)
		repair(c);
	ts_shm_unlock(&c->hdr->lock);
}

static void corrupt(struct ts_cache *c)
{
	c->need_repair = 1;
}

/* Range of an entry, validated against the arena and what is reserved of it. */
static bool range_ok(const struct ts_cache *c, uint64_t off, uint64_t len)
{
	uint64_t hwm = atomic_load_explicit(&c->hdr->falloc_hwm, memory_order_acquire);
	return len > 0 && len <= c->arena_size && off <= c->arena_size - len && off + len <= hwm &&
	       hwm <= c->arena_size;
}

static bool link_ok(const struct ts_cache *c, uint32_t i)
{
	return i == NONE || i < c->nentries;
}

/*
 * Links, offsets and lengths are written under the lock, but a peer that
 * ignores it can write them at any time: each is loaded once, into a local
 * that is checked and then used (a plain load may be repeated by the
 * compiler, between the check and the use).
 */
static inline uint32_t ld32(const uint32_t *p)
{
	return __atomic_load_n(p, __ATOMIC_RELAXED);
}

static inline uint64_t ld64(const uint64_t *p)
{
	return __atomic_load_n(p, __ATOMIC_RELAXED);
}

/* Is the filler of e alive? Our own process without reading /proc. */
static bool filler_alive(const struct ts_cache_entry *e)
{
	struct ts_ident me;
	if (ts_self_ident(&me) == 0 && me.pid == e->filler_pid && me.start_time == e->filler_start)
		return true;
	return ts_proc_liveness(e->filler_pid, e->filler_start) == TS_PROC_ALIVE;
}

/* ---- the offset-ordered list (under the lock, links validated) --------------- */

static void list_unlink(struct ts_cache *c, uint32_t i)
{
	struct ts_cache_header *h = c->hdr;
	struct ts_cache_entry *e = &c->ents[i];
	uint32_t p = ld32(&e->prev), nx = ld32(&e->next);
	if (!link_ok(c, p) || !link_ok(c, nx) || p == i || nx == i) {
		corrupt(c); /* repair() rebuilds the list from the entry words */
		e->prev = e->next = NONE;
		return;
	}
	if (p != NONE)
		c->ents[p].next = nx;
	else
		h->first = nx;
	if (nx != NONE)
		c->ents[nx].prev = p;
	else
		h->last = p;
	if (ld32(&h->cursor) == i)
		h->cursor = nx;
	e->prev = e->next = NONE;
}

static void list_insert_before(struct ts_cache *c, uint32_t i, uint32_t succ)
{
	struct ts_cache_header *h = c->hdr;
	uint32_t p = ld32(succ == NONE ? &h->last : &c->ents[succ].prev);
	if (!link_ok(c, p)) {
		corrupt(c);
		p = NONE;
	}
	c->ents[i].prev = p;
	c->ents[i].next = succ;
	if (p == NONE)
		h->first = i;
	else
		c->ents[p].next = i;
	if (succ == NONE)
		h->last = i;
	else
		c->ents[succ].prev = i;
}

/* A TOMB right before an EMPTY ends every chain through it: make it EMPTY
 * too, so tombstones do not pile up. The generation is kept. */
static void tomb_cleanup(struct ts_cache *c, uint32_t i)
{
	uint32_t mask = c->nentries - 1;
	uint64_t nw = atomic_load_explicit(&c->ents[(i + 1) & mask].word, memory_order_relaxed);
	if (TS_CENT_STATE(nw) != TS_CENT_EMPTY)
		return;
	for (uint32_t k = 0, j = i; k < TS_CACHE_PROBE; k++, j = (j - 1) & mask) {
		uint64_t w = atomic_load_explicit(&c->ents[j].word, memory_order_relaxed);
		if (TS_CENT_STATE(w) != TS_CENT_TOMB)
			break;
		atomic_store_explicit(&c->ents[j].word, TS_CENT_WORD(TS_CENT_GEN(w), TS_CENT_EMPTY),
				      memory_order_relaxed);
	}
}

/*
 * Remove range holder i (under the lock): a new generation first (any copy
 * in flight is rejected from here on), then its range is given back.
 * Returns the state it had, or -1 if it was not a holder.
 */
static int remove_holder(struct ts_cache *c, uint32_t i)
{
	struct ts_cache_entry *e = &c->ents[i];
	uint64_t w = atomic_load_explicit(&e->word, memory_order_acquire);
	for (;;) {
		if (!is_holder(TS_CENT_STATE(w)))
			return -1;
		/* CAS: commit and abort change FILLING/ORPHAN words without the lock. */
		if (atomic_compare_exchange_weak_explicit(&e->word, &w,
							  TS_CENT_WORD(TS_CENT_GEN(w) + 1, TS_CENT_TOMB),
							  memory_order_acq_rel, memory_order_acquire))
			break;
	}
	list_unlink(c, i);
	uint64_t used = atomic_load_explicit(&c->hdr->bytes_in_use, memory_order_relaxed), len = ld64(&e->len);
	atomic_store_explicit(&c->hdr->bytes_in_use, used >= len ? used - len : 0, memory_order_relaxed);
	bump_wake(&e->wake);
	tomb_cleanup(c, i);
	return (int)TS_CENT_STATE(w);
}

/* Count an eviction by the state the entry had. */
static void count_removal(struct ts_cache *c, int state)
{
	if (state == TS_CENT_READY)
		count(&c->hdr->counters.evictions);
	else if (state == TS_CENT_FILLING || state == TS_CENT_ORPHAN)
		count(&c->hdr->counters.reclaims);
}

/* ---- repair ------------------------------------------------------------------- */

/* A range holder as repair() saw it: loaded once, then only this copy is read. */
struct holder {
	uint64_t off, len;
	uint32_t i;
};

static int by_offset(const void *a, const void *b)
{
	const struct holder *x = a, *y = b;
	if (x->off != y->off)
		return x->off < y->off ? -1 : 1;
	return x->i < y->i ? -1 : x->i > y->i;
}

static void drop_entry(struct ts_cache *c, uint32_t i)
{
	struct ts_cache_entry *e = &c->ents[i];
	uint64_t w = atomic_load_explicit(&e->word, memory_order_acquire);
	while (!atomic_compare_exchange_weak_explicit(&e->word, &w, TS_CENT_WORD(TS_CENT_GEN(w) + 1, TS_CENT_TOMB),
						      memory_order_acq_rel, memory_order_acquire))
		;
	e->prev = e->next = NONE;
	bump_wake(&e->wake);
}

/*
 * Rebuild everything derived from the entries (under the lock): entries
 * with an unknown state or an invalid range are dropped, the list of range
 * holders is rebuilt in offset order, overlaps are resolved, the byte count
 * and the cursor recomputed. Called after EOWNERDEAD and whenever a walk
 * found something inconsistent.
 */
static void repair(struct ts_cache *c)
{
	struct ts_cache_header *h = c->hdr;
	struct ts_cache_entry *E = c->ents;
	uint32_t n = c->nentries, nh = 0;

	c->need_repair = 0;
	count(&h->counters.repairs);
	uint64_t hwm = atomic_load_explicit(&h->falloc_hwm, memory_order_relaxed);
	if (hwm > c->arena_size)
		/* Not trusted: reserving again what is already reserved is harmless. */
		atomic_store_explicit(&h->falloc_hwm, 0, memory_order_relaxed);
	/*
	 * The list is rebuilt from a private copy of the holders, sorted here:
	 * following the shared links instead would let a peer that writes
	 * them during the repair send us out of the table or round a cycle,
	 * with the lock held. Without the memory for the copy, every holder is
	 * dropped (the cache empties; nothing wrong is served).
	 */
	struct holder *H = malloc((size_t)n * sizeof(*H));
	for (uint32_t i = 0; i < n; i++) {
		uint64_t w = atomic_load_explicit(&E[i].word, memory_order_acquire);
		uint32_t s = TS_CENT_STATE(w);
		if (s == TS_CENT_EMPTY || s == TS_CENT_TOMB)
			continue;
		uint64_t off = ld64(&E[i].off), len = ld64(&E[i].len);
		if (!H || !is_holder(s) || !range_ok(c, off, len)) {
			drop_entry(c, i);
			continue;
		}
		H[nh++] = (struct holder){ .off = off, .len = len, .i = i };
	}
	if (nh)
		qsort(H, nh, sizeof(*H), by_offset);
	uint64_t used = 0, end = 0;
	uint32_t prev = NONE, kept = 0;
	h->first = NONE;
	for (uint32_t k = 0; k < nh; k++) {
		uint32_t i = H[k].i;
		if (prev != NONE && H[k].off < end) {
			/* Overlap: only corruption makes one. Keep the range that starts first. */
			drop_entry(c, i);
			continue;
		}
		E[i].prev = prev;
		E[i].next = NONE;
		if (prev == NONE)
			h->first = i;
		else
			E[prev].next = i;
		prev = i;
		end = H[k].off + H[k].len;
		used += H[k].len;
		H[kept++] = H[k];
	}
	h->last = prev;
	uint64_t head = ld64(&h->head);
	if (head > c->arena_size)
		head = 0;
	/* The head must not lie inside a range: move it to that range's end. */
	uint32_t cursor = NONE;
	for (uint32_t k = 0; k < kept; k++) {
		if (H[k].off < head && H[k].off + H[k].len > head)
			head = H[k].off + H[k].len;
		if (H[k].off >= head) {
			cursor = H[k].i;
			break;
		}
	}
	h->head = head;
	h->cursor = cursor;
	atomic_store_explicit(&h->bytes_in_use, used, memory_order_relaxed);
	free(H);
}

/* ---- lookup -------------------------------------------------------------------- */

struct probe {
	uint32_t slot;      /* found entry, or NONE */
	uint64_t word;      /* its word when found */
	uint32_t free_slot; /* first EMPTY/TOMB in the window, or NONE */
};

/* Under the lock: find k (FILLING or READY) in its probe window. */
static void probe(struct ts_cache *c, const struct ts_cache_key *k, uint64_t hash, struct probe *p)
{
	uint32_t mask = c->nentries - 1;
	p->slot = NONE;
	p->free_slot = NONE;
	for (uint32_t d = 0; d < TS_CACHE_PROBE; d++) {
		uint32_t i = (uint32_t)(hash + d) & mask;
		struct ts_cache_entry *e = &c->ents[i];
		/* acquire: pairs with the release of commit (lock-free) */
		uint64_t w = atomic_load_explicit(&e->word, memory_order_acquire);
		switch (TS_CENT_STATE(w)) {
		case TS_CENT_EMPTY:
			if (p->free_slot == NONE)
				p->free_slot = i;
			return; /* end of every chain through here */
		case TS_CENT_TOMB:
			if (p->free_slot == NONE)
				p->free_slot = i;
			break;
		case TS_CENT_FILLING:
		case TS_CENT_READY:
			/* The full key decides; the hash only saves the compare. */
			if (e->hash == hash && memcmp(&e->key, k, sizeof(*k)) == 0) {
				p->slot = i;
				p->word = w;
				return;
			}
			break;
		case TS_CENT_ORPHAN:
		case TS_CENT_DROPPED:
			break;
		default:
			corrupt(c);
			break;
		}
	}
}

/*
 * Every slot of k's window holds a range: free one. Aborted entries first,
 * then the least recently hit READY one, then fills of dead processes.
 */
static uint32_t make_room(struct ts_cache *c, uint64_t hash)
{
	uint32_t mask = c->nentries - 1, best = NONE, dead = NONE;
	uint64_t best_hit = UINT64_MAX;
	for (uint32_t d = 0; d < TS_CACHE_PROBE; d++) {
		uint32_t i = (uint32_t)(hash + d) & mask;
		struct ts_cache_entry *e = &c->ents[i];
		uint32_t s = TS_CENT_STATE(atomic_load_explicit(&e->word, memory_order_acquire));
		if (s == TS_CENT_DROPPED) {
			best = i;
			break;
		}
		if (s == TS_CENT_READY) {
			uint64_t t = atomic_load_explicit(&e->last_hit, memory_order_relaxed);
			if (t < best_hit) {
				best_hit = t;
				best = i;
			}
		} else if ((s == TS_CENT_FILLING || s == TS_CENT_ORPHAN) && dead == NONE && !filler_alive(e)) {
			dead = i;
		}
	}
	if (best == NONE)
		best = dead;
	if (best == NONE)
		return NONE;
	int old = remove_holder(c, best);
	if (old < 0)
		return NONE;
	count_removal(c, old);
	return best;
}

/* ---- allocation ----------------------------------------------------------------- */

enum { V_EVICT = 0, V_SKIP = 1 };

/* What the hand does with holder e on pass 0 (second chance) or 1 (none). */
static int classify(struct ts_cache *c, struct ts_cache_entry *e, int pass)
{
	uint32_t s = TS_CENT_STATE(atomic_load_explicit(&e->word, memory_order_acquire));
	switch (s) {
	case TS_CENT_READY:
		/* CLOCK: a hit since the hand last passed buys one more lap. */
		if (pass == 0 && atomic_exchange_explicit(&e->ref, 0, memory_order_relaxed))
			return V_SKIP;
		return V_EVICT;
	case TS_CENT_DROPPED:
		return V_EVICT;
	case TS_CENT_FILLING:
	case TS_CENT_ORPHAN:
		return filler_alive(e) ? V_SKIP : V_EVICT;
	default:
		return -EBADMSG;
	}
}

/*
 * Phase 1: where does a range of len go? Walks the list from the cursor
 * without changing anything but reference bits. *vstart: first list entry
 * that may overlap the placement.
 */
static int place(struct ts_cache *c, uint64_t len, int pass, uint64_t *start, uint32_t *vstart)
{
	struct ts_cache_header *h = c->hdr;
	uint64_t A = c->arena_size, s = ld64(&h->head), prev_off;
	uint32_t cur = ld32(&h->cursor), first = cur;
	bool wrapped = false;

	if (s > A || !link_ok(c, cur))
		return -EBADMSG;
	/* The range before the cursor must end at or before the head, or we
	 * would allocate over it (the head is only ever set by us, but it lives
	 * in shared memory). */
	uint32_t before = ld32(cur == NONE ? &h->last : &c->ents[cur].prev);
	if (!link_ok(c, before))
		return -EBADMSG;
	if (before != NONE) {
		const struct ts_cache_entry *b = &c->ents[before];
		uint64_t boff = ld64(&b->off), blen = ld64(&b->len);
		if (!is_holder(TS_CENT_STATE(atomic_load_explicit(&b->word, memory_order_relaxed))) ||
		    !range_ok(c, boff, blen) || boff + blen > s || ld32(&b->next) != cur)
			return -EBADMSG;
	}
	prev_off = s;
	for (uint64_t steps = 0; steps <= 2 * (uint64_t)c->nentries + 4; steps++) {
		if (len > A - s) {
			if (wrapped)
				return -ENOSPC;
			wrapped = true;
			s = 0;
			cur = first = ld32(&h->first);
			prev_off = 0;
			if (!link_ok(c, cur))
				return -EBADMSG;
			continue;
		}
		if (cur == NONE)
			goto found;
		struct ts_cache_entry *e = &c->ents[cur];
		uint32_t st = TS_CENT_STATE(atomic_load_explicit(&e->word, memory_order_acquire));
		uint64_t off = ld64(&e->off), elen = ld64(&e->len);
		uint32_t next = ld32(&e->next);
		if (!is_holder(st) || !range_ok(c, off, elen) || off < prev_off || !link_ok(c, next))
			return -EBADMSG;
		prev_off = off;
		if (off >= s + len)
			goto found;
		int v = classify(c, e, pass);
		if (v < 0)
			return v;
		if (v == V_SKIP) {
			s = off + elen;
			first = next;
		}
		cur = next;
	}
	return -EBADMSG; /* a cycle */
found:
	*start = s;
	*vstart = first;
	return 0;
}

/* Is fd our segment file? */
static bool fd_is_ours(const struct ts_cache *c, int fd)
{
	struct stat sb;
	return fd >= 0 && fstat(fd, &sb) == 0 && sb.st_dev == c->dev && sb.st_ino == c->ino;
}

/*
 * Map the pages of a fresh fill in one call rather than a fault per page as
 * the decoder's rows arrive (tmpfs clears a reserved page on first touch
 * either way). Only a hint: before Linux 5.14 it fails and changes nothing.
 * The pages are reserved, so populating them cannot fail for want of memory.
 */
static void populate(void *p, uint64_t len)
{
#ifdef MADV_POPULATE_WRITE
	uintptr_t page = (uintptr_t)page_size(), start = (uintptr_t)p & ~(page - 1);
	int saved = errno;
	(void)madvise((void *)start, (uintptr_t)p + len - start, MADV_POPULATE_WRITE);
	errno = saved;
#else
	(void)p;
	(void)len;
#endif
}

/* Raise falloc_hwm to nhwm unless it is there already. Only ever raised,
 * and only by a process that reserved [seen, nhwm) itself, so the pages
 * below it always exist. release: they exist before anyone trusts them. */
static void raise_hwm(struct ts_cache_header *h, uint64_t seen, uint64_t nhwm)
{
	while (seen < nhwm &&
	       !atomic_compare_exchange_weak_explicit(&h->falloc_hwm, &seen, nhwm, memory_order_release,
						      memory_order_relaxed))
		;
}

/* Note [off, off + len) of the arena as reserved by this process. */
static void own_mark(struct ts_cache *c, uint64_t off, uint64_t len)
{
	if (!c->own_chunks || len == 0)
		return;
	for (uint64_t k = off / c->chunk_size, last = (off + len - 1) / c->chunk_size; k <= last; k++)
		atomic_fetch_or_explicit(&c->own_chunks[k / 64], 1ull << (k % 64), memory_order_relaxed);
}

/*
 * Reserve the arena's [from, to) in /dev/shm now and note it as ours (outside
 * the lock). Through our descriptor, or, when the program closed it, our file
 * opened again by name (same inode only). 0, or -E_SHM.
 */
static int reserve_pages(struct ts_cache *c, uint64_t from, uint64_t to)
{
	int fd = c->fd, own = -1; /* read once: reserve() may replace it under the lock */
	if (!fd_is_ours(c, fd))
		fd = own = open(c->path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
	int r = fd_is_ours(c, fd) && ts_shm_within_quarter(to) ? ts_prim_reserve(fd, c->arena_off + from, to - from)
								: -E_SHM;
	if (own >= 0)
		close(own);
	if (r)
		return -E_SHM;
	own_mark(c, from, to - from);
	return 0;
}

/*
 * Before this process touches [off, off + len) of the arena (a fill's
 * decoder writes it, a hit reads it): are its pages there? On a full
 * /dev/shm a fault on a missing tmpfs page, read or write, is a SIGBUS in
 * the host program, and the shared falloc_hwm that says the pages are
 * there is the peers' word. A chunk not yet reserved by this process is
 * reserved again (pages already there cost a walk: 5.3 ms per 32 MiB
 * chunk here, once per chunk and process). 0, or -E_SHM: not reserved.
 */
static int own_range(struct ts_cache *c, uint64_t off, uint64_t len)
{
	if (!c->own_chunks)
		return -E_SHM;
	for (uint64_t k = off / c->chunk_size, last = (off + len - 1) / c->chunk_size; k <= last; k++) {
		if (atomic_load_explicit(&c->own_chunks[k / 64], memory_order_relaxed) & (1ull << (k % 64)))
			continue;
		uint64_t from = k * c->chunk_size;
		if (reserve_pages(c, from, min_u64(from + c->chunk_size, c->arena_size)))
			return -E_SHM;
	}
	return 0;
}

/*
 * Outside the lock, after a FILL that came within half a chunk of the
 * reserved part: reserve the next chunk ahead of need, so that the next
 * reserve() under the lock finds nothing to do. One process per chunk does
 * it. It publishes the chunk only if nobody moved falloc_hwm meanwhile (it
 * then knows every page below the chunk exists); otherwise reserve()
 * reserves again what it needs (on tmpfs, reserving pages that are there
 * costs about twice reserving them the first time: 5.7 vs 2.5 ms for
 * 32 MiB here). If it fails, reserve() fails the same way later.
 */
static void reserve_ahead(struct ts_cache *c, uint64_t hwm)
{
	struct ts_cache_header *h = c->hdr;
	uint64_t seen = atomic_load_explicit(&h->ahead, memory_order_relaxed);
	if (seen >= hwm + 1 ||
	    !atomic_compare_exchange_strong_explicit(&h->ahead, &seen, hwm + 1, memory_order_relaxed,
						     memory_order_relaxed))
		return;
	uint64_t to = min_u64(hwm + c->chunk_size, c->arena_size);
	if (hwm < to && reserve_pages(c, hwm, to) == 0) {
		uint64_t expect = hwm;
		(void)atomic_compare_exchange_strong_explicit(&h->falloc_hwm, &expect, to, memory_order_release,
							      memory_order_relaxed);
	}
}

/* Reserve the arena up to `end` in /dev/shm (under the lock). */
static int reserve(struct ts_cache *c, uint64_t end)
{
	struct ts_cache_header *h = c->hdr;
	uint64_t hwm = atomic_load_explicit(&h->falloc_hwm, memory_order_relaxed);
	if (end <= hwm)
		return 0;
	uint64_t nhwm = min_u64(round_up(end, c->chunk_size), c->arena_size);
	/*
	 * The host program may have closed our descriptor and reused the
	 * number: never grow a file that is not ours. Open our own file again
	 * by name (same inode only) and leave that number to the program.
	 */
	if (!fd_is_ours(c, c->fd)) {
		int nfd = open(c->path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
		if (!fd_is_ours(c, nfd)) {
			static _Atomic int warned;
			if (nfd >= 0)
				close(nfd);
			if (!atomic_exchange(&warned, 1))
				ts_warn("cache %s: our descriptor was closed by the program and the cache file is gone; not growing the cache",
					c->session);
			return -E_SHM;
		}
		c->fd = nfd;
	}
	int r = ts_shm_within_quarter(nhwm) ? 0 : -ENOSPC;
	if (!r)
		r = ts_prim_reserve(c->fd, c->arena_off + hwm, nhwm - hwm);
	if (r) {
		static _Atomic int warned;
		if (!atomic_exchange(&warned, 1))
			ts_warn("cache %s: cannot reserve %llu more bytes in %s (%s): decoding privately",
				c->session, (unsigned long long)(nhwm - hwm), ts_shm_dir(), strerror(-r));
		return -E_SHM;
	}
	own_mark(c, hwm, nhwm - hwm);
	raise_hwm(h, hwm, nhwm); /* reserve_ahead() may have raised it meanwhile */
	return 0;
}

/*
 * Find room for len bytes (under the lock): find the place (second chance
 * first, then without), reserve its pages, evict what overlaps it. Returns
 * the start and the first list entry after the range; the caller links
 * the new entry in front of it and advances the head.
 */
static int alloc_range(struct ts_cache *c, uint64_t len, uint64_t *start, uint32_t *succ)
{
	uint64_t s = 0;
	uint32_t cur = NONE;
	int r = -ENOSPC, pass = 0;

	for (int attempt = 0; attempt < 4; attempt++) {
		r = place(c, len, pass, &s, &cur);
		if (r == -EBADMSG) {
			repair(c);
			continue;
		}
		if (r == -ENOSPC && pass == 0) {
			pass = 1; /* everything left is hot or pinned: hot goes after all */
			continue;
		}
		break;
	}
	if (r)
		return r;
	uint64_t end = s + len;
	if ((r = reserve(c, end)) != 0)
		return r;
	/* Phase 2: evict everything in [s, end); phase 1 saw no live fill there. */
	for (uint32_t steps = 0; cur != NONE; steps++) {
		struct ts_cache_entry *e = &c->ents[cur];
		uint64_t off = ld64(&e->off), elen = ld64(&e->len);
		if (off >= end)
			break;
		uint32_t nx = ld32(&e->next);
		if (steps > c->nentries)
			return -EBADMSG; /* a cycle */
		if (off >= s || elen > s - off) { /* overlaps [s, end) */
			uint32_t st = TS_CENT_STATE(atomic_load_explicit(&e->word, memory_order_acquire));
			if ((st == TS_CENT_FILLING || st == TS_CENT_ORPHAN) && filler_alive(e))
				return -EAGAIN; /* cannot happen unless the list lied: no harm done */
			count_removal(c, remove_holder(c, cur));
		}
		if (c->need_repair || !link_ok(c, nx))
			return -EBADMSG;
		cur = nx;
	}
	*start = s;
	*succ = cur;
	return 0;
}

/* ---- get / commit / abort ------------------------------------------------------ */

static int bypass(struct ts_cache *c, _Atomic uint64_t *reason, int saved_errno)
{
	count(&c->hdr->counters.bypasses);
	if (reason)
		count(reason);
	errno = saved_errno;
	return TS_CACHE_BYPASS;
}

/*
 * Fill this miss (the miss-th)? Until the cache first evicts, everything
 * may yet be hit; after, only while hits keep up with fills, plus a sample
 * of misses, so that entries keep arriving and a pattern that starts to
 * hit (a later epoch, a job in step with this one) is seen.
 */
static bool admitted(const struct ts_cache *c, uint64_t miss)
{
	const struct ts_cache_counters *k = &c->hdr->counters;
	if (c->admit_ratio == 0 || atomic_load_explicit(&k->evictions, memory_order_relaxed) == 0)
		return true;
	uint64_t hits = atomic_load_explicit(&k->hits, memory_order_relaxed);
	uint64_t fills = atomic_load_explicit(&k->fills, memory_order_relaxed);
	uint64_t earned;
	if (__builtin_mul_overflow(hits, (uint64_t)c->admit_ratio, &earned))
		earned = UINT64_MAX;
	return earned >= fills || miss % TS_CACHE_SAMPLE_MISSES == 0;
}

static void note_hit(struct ts_cache *c, struct ts_cache_entry *e)
{
	uint64_t t = atomic_fetch_add_explicit(&c->hdr->tick, 1, memory_order_relaxed);
	atomic_store_explicit(&e->last_hit, t, memory_order_relaxed);
	atomic_store_explicit(&e->ref, 1, memory_order_relaxed);
}

/* Seqlock read of a READY entry whose word was w: 1 copied intact, 0 torn. */
static int copy_out(struct ts_cache *c, uint32_t slot, uint64_t w, uint64_t off, uint64_t len, void *dst)
{
	struct ts_cache_entry *e = &c->ents[slot];
	uint64_t decode_ns = atomic_load_explicit(&e->decode_ns, memory_order_relaxed);
	tsan_ignore_reads_begin();
	memcpy(dst, c->arena + off, len);
	tsan_ignore_reads_end();
	if (c->after_copy)
		c->after_copy(c, c->after_copy_arg);
	/* acquire fence: if the copy saw a new owner's bytes, we see its generation */
	atomic_thread_fence(memory_order_acquire);
	if (atomic_load_explicit(&e->word, memory_order_relaxed) != w) {
		count(&c->hdr->counters.torn);
		return 0;
	}
	count(&c->hdr->counters.hits);
	atomic_fetch_add_explicit(&c->hdr->counters.saved_decode_ns, decode_ns, memory_order_relaxed);
	return 1;
}

enum { W_READY, W_ABORTED, W_TIMEOUT, W_CHANGED };

static uint64_t fill_age(const struct ts_cache_entry *e)
{
	uint64_t now = ts_now_ns();
	return now > e->fill_start_ns ? now - e->fill_start_ns : 0;
}

/* Wait (lock-free) for the fill with word w to change. */
static int wait_fill(struct ts_cache *c, uint32_t slot, uint64_t w, uint32_t pid, uint64_t start,
		     uint64_t deadline)
{
	struct ts_cache_entry *e = &c->ents[slot];
	uint64_t next_check = 0;
	for (;;) {
		/* acquire the counter before re-checking: no lost wake-up */
		uint32_t ev = atomic_load_explicit(&e->wake, memory_order_acquire);
		uint64_t cur = atomic_load_explicit(&e->word, memory_order_acquire);
		if (cur != w) {
			if (cur == TS_CENT_WORD(TS_CENT_GEN(w), TS_CENT_READY))
				return W_READY;
			if (cur == TS_CENT_WORD(TS_CENT_GEN(w) + 1, TS_CENT_DROPPED))
				return W_ABORTED;
			return W_CHANGED;
		}
		uint64_t now = ts_now_ns();
		if (now >= deadline)
			return W_TIMEOUT;
		if (now >= next_check) {
			if (ts_proc_liveness(pid, start) != TS_PROC_ALIVE)
				return W_CHANGED; /* dead filler: look again and reclaim */
			next_check = now + SLICE_NS;
		}
		(void)ts_futex_wait(&e->wake, ev, min_u64(deadline - now, SLICE_NS));
	}
}

/*
 * Under the lock, k known absent: make a FILLING entry of k. The slot is
 * chosen only after the allocation, whose evictions may turn tombstones
 * into EMPTY: an entry must never sit behind an EMPTY in its own chain.
 */
static int insert(struct ts_cache *c, const struct ts_cache_key *k, uint64_t hash, uint64_t len,
		  uint32_t slot, const struct ts_ident *me, struct ts_cache_fill *fill)
{
	struct ts_cache_header *h = c->hdr;
	if (slot == NONE && make_room(c, hash) == NONE)
		return -ENOSPC;
	uint64_t start;
	uint32_t succ;
	int r = alloc_range(c, len, &start, &succ);
	if (r)
		return r;
	struct probe p;
	probe(c, k, hash, &p);
	if (p.slot != NONE || p.free_slot == NONE)
		return -EAGAIN; /* cannot happen: we hold the lock and freed a slot */
	slot = p.free_slot;
	struct ts_cache_entry *e = &c->ents[slot];
	uint64_t w = atomic_load_explicit(&e->word, memory_order_relaxed);
	e->hash = hash;
	e->key = *k;
	e->off = start;
	e->len = len;
	e->filler_pid = me->pid;
	e->filler_start = me->start_time;
	e->fill_start_ns = ts_now_ns();
	atomic_store_explicit(&e->decode_ns, 0, memory_order_relaxed);
	/* an insertion counts as a use: least recently inserted-or-hit goes first */
	atomic_store_explicit(&e->last_hit, atomic_fetch_add_explicit(&h->tick, 1, memory_order_relaxed),
			      memory_order_relaxed);
	atomic_store_explicit(&e->ref, 0, memory_order_relaxed);
	list_insert_before(c, slot, succ);
	h->head = start + len;
	h->cursor = succ;
	atomic_fetch_add_explicit(&h->bytes_in_use, len, memory_order_relaxed);
	uint64_t nw = TS_CENT_WORD(TS_CENT_GEN(w) + 1, TS_CENT_FILLING);
	/* release: the fields above are complete before the entry is findable */
	atomic_store_explicit(&e->word, nw, memory_order_release);
	*fill = (struct ts_cache_fill){ .ptr = c->arena + start, .len = len, .word = nw, .slot = slot,
					.owner = (uint32_t)getpid() };
	return 0;
}

int ts_cache_get(struct ts_cache *c, const struct ts_cache_key *k, uint64_t len, void *dst,
		 uint64_t wait_ns, struct ts_cache_fill *fill)
{
	int saved = errno;
	if (fill)
		*fill = (struct ts_cache_fill){ .slot = NONE };
	if (!c || !c->hdr || !k || !dst || !fill || len == 0)
		return -EINVAL;
	struct ts_cache_counters *ctr = &c->hdr->counters;
	struct ts_ident me;
	if (len > c->arena_size || ts_self_ident(&me) != 0)
		return bypass(c, &ctr->bypass_other, saved);
	uint64_t hash = ts_cache_hash_fn(k);
	uint64_t deadline = deadline_after(wait_ns);
	bool waited = false;
	unsigned wakes = 0;

	for (int round = 0; round < MAX_ROUNDS; round++) {
		if (cache_lock(c, c->lock_timeout_ns) != 0)
			return bypass(c, &ctr->bypass_lock, saved);
		struct probe p;
		probe(c, k, hash, &p);
		if (p.slot != NONE) {
			struct ts_cache_entry *e = &c->ents[p.slot];
			uint32_t s = TS_CENT_STATE(p.word);
			uint64_t off = e->off, elen = e->len;
			if (!range_ok(c, off, elen)) {
				/* Corrupted: never read through it. */
				count_removal(c, remove_holder(c, p.slot));
				repair(c);
				probe(c, k, hash, &p);
			} else if (elen != len) {
				/* Same key, other size: the caller's key misses a parameter. */
				cache_unlock(c);
				return bypass(c, &ctr->bypass_other, saved);
			} else if (s == TS_CENT_READY) {
				note_hit(c, e);
				cache_unlock(c);
				if (own_range(c, off, len))
					return bypass(c, &ctr->bypass_shm, saved);
				if (copy_out(c, p.slot, p.word, off, len, dst)) {
					errno = saved;
					return TS_CACHE_HIT;
				}
				continue; /* evicted while we copied: look again */
			} else if (!filler_alive(e)) {
				/* Its filler died: take the entry back and fill it ourselves. */
				count_removal(c, remove_holder(c, p.slot));
				probe(c, k, hash, &p);
			} else if (fill_age(e) > c->stale_fill_ns) {
				/*
				 * Alive but far too slow (stopped, or it lost its fill
				 * handle): orphan it. Its range stays pinned while it lives,
				 * but the key can be filled again right away.
				 */
				uint64_t w = p.word;
				if (atomic_compare_exchange_strong_explicit(&e->word, &w,
									    TS_CENT_WORD(TS_CENT_GEN(w), TS_CENT_ORPHAN),
									    memory_order_acq_rel, memory_order_acquire)) {
					count(&ctr->orphans);
					bump_wake(&e->wake);
				}
				probe(c, k, hash, &p);
			} else {
				uint32_t pid = e->filler_pid;
				uint64_t start = e->filler_start;
				cache_unlock(c);
				if (!waited)
					count(&ctr->waits);
				waited = true;
				switch (wait_fill(c, p.slot, p.word, pid, start, deadline)) {
				case W_READY: {
					uint64_t rw = TS_CENT_WORD(TS_CENT_GEN(p.word), TS_CENT_READY);
					note_hit(c, e);
					if (own_range(c, off, len))
						return bypass(c, &ctr->bypass_shm, saved);
					if (copy_out(c, p.slot, rw, off, len, dst)) {
						errno = saved;
						return TS_CACHE_HIT;
					}
					continue;
				}
				case W_ABORTED:
					return bypass(c, &ctr->bypass_aborted, saved);
				case W_TIMEOUT:
					return bypass(c, &ctr->bypass_wait, saved);
				default:
					/* Orphaned, reclaimed or its filler died: look again. A
					 * wake-up is not a retry, but a bounded number of them. */
					if (++wakes < 64)
						round--;
					continue;
				}
			}
			if (p.slot != NONE) {
				/* The key reappeared between our two probes: never two entries for a key. */
				cache_unlock(c);
				continue;
			}
		}
		uint64_t miss = count(&ctr->misses); /* once: every path from here returns */
		if (!admitted(c, miss)) {
			cache_unlock(c);
			*fill = (struct ts_cache_fill){ .slot = NONE };
			return bypass(c, &ctr->bypass_cold, saved);
		}
		int r = insert(c, k, hash, len, p.free_slot, &me, fill);
		uint64_t hwm = atomic_load_explicit(&c->hdr->falloc_hwm, memory_order_relaxed);
		bool ahead = r == 0 && hwm < c->arena_size &&
			     c->hdr->head + c->chunk_size / 2 > hwm;
		cache_unlock(c);
		if (r == 0 && own_range(c, (uint64_t)((unsigned char *)fill->ptr - c->arena), len)) {
			ts_cache_abort(c, fill);
			return bypass(c, &ctr->bypass_shm, saved);
		}
		if (r == 0) {
			count(&ctr->fills);
			if (ahead)
				reserve_ahead(c, hwm);
			populate(fill->ptr, len);
			/*
			 * release fence: every generation bump we (or the removers
			 * before us) made to the range we now own is ordered before
			 * the caller's first store into it (see the top of the file).
			 */
			atomic_thread_fence(memory_order_release);
			errno = saved;
			return TS_CACHE_FILL;
		}
		*fill = (struct ts_cache_fill){ .slot = NONE };
		if (r == -ENOSPC)
			return bypass(c, &ctr->bypass_nospace, saved);
		return bypass(c, r == -E_SHM ? &ctr->bypass_shm : &ctr->bypass_other, saved);
	}
	return bypass(c, &ctr->bypass_other, saved);
}

/*
 * A fill of ours. A forked child inherits its parent's fill handles; its
 * commit or abort would end a fill the parent still writes, and the range
 * would be given to another image under the parent's rows.
 */
static bool fill_ok(const struct ts_cache *c, const struct ts_cache_fill *f)
{
	return c && c->hdr && f && f->slot < c->nentries && TS_CENT_STATE(f->word) == TS_CENT_FILLING &&
	       f->owner == (uint32_t)getpid();
}

int ts_cache_commit(struct ts_cache *c, struct ts_cache_fill *fill, uint64_t decode_ns)
{
	int saved = errno;
	if (!fill_ok(c, fill))
		return -EINVAL;
	struct ts_cache_entry *e = &c->ents[fill->slot];
	uint64_t w = fill->word;
	/* Our slot is never reused before we commit or abort (see the top of the
	 * file), so this store cannot land on somebody else's entry; the release
	 * CAS below publishes it with the bytes. */
	atomic_store_explicit(&e->decode_ns, decode_ns, memory_order_relaxed);
	int ret = 0;
	if (atomic_compare_exchange_strong_explicit(&e->word, &w, TS_CENT_WORD(TS_CENT_GEN(w), TS_CENT_READY),
						    memory_order_release, memory_order_acquire)) {
		count(&c->hdr->counters.commits);
	} else {
		ret = -ESTALE;
		uint64_t orphan = TS_CENT_WORD(TS_CENT_GEN(fill->word), TS_CENT_ORPHAN);
		if (w == orphan)
			atomic_compare_exchange_strong_explicit(&e->word, &w,
								TS_CENT_WORD(TS_CENT_GEN(orphan) + 1, TS_CENT_DROPPED),
								memory_order_release, memory_order_relaxed);
	}
	bump_wake(&e->wake);
	*fill = (struct ts_cache_fill){ .slot = NONE };
	errno = saved;
	return ret;
}

void ts_cache_abort(struct ts_cache *c, struct ts_cache_fill *fill)
{
	int saved = errno;
	if (!fill_ok(c, fill))
		return;
	struct ts_cache_entry *e = &c->ents[fill->slot];
	uint64_t g = TS_CENT_GEN(fill->word);
	uint64_t dropped = TS_CENT_WORD(g + 1, TS_CENT_DROPPED);
	uint64_t w = fill->word;
	if (atomic_compare_exchange_strong_explicit(&e->word, &w, dropped, memory_order_release, memory_order_relaxed) ||
	    (w == TS_CENT_WORD(g, TS_CENT_ORPHAN) &&
	     atomic_compare_exchange_strong_explicit(&e->word, &w, dropped, memory_order_release, memory_order_relaxed)))
		count(&c->hdr->counters.aborts);
	bump_wake(&e->wake);
	*fill = (struct ts_cache_fill){ .slot = NONE };
	errno = saved;
}

int ts_cache_peek(struct ts_cache *c, const struct ts_cache_key *k)
{
	int saved = errno;
	if (!c || !c->hdr || !k)
		return -EINVAL;
	int r = cache_lock(c, c->lock_timeout_ns);
	if (r) {
		errno = saved;
		return r;
	}
	struct probe p;
	probe(c, k, ts_cache_hash_fn(k), &p);
	r = p.slot != NONE && TS_CENT_STATE(p.word) == TS_CENT_READY &&
	    range_ok(c, c->ents[p.slot].off, c->ents[p.slot].len);
	cache_unlock(c);
	errno = saved;
	return r;
}

/* ---- segment files ---------------------------------------------------------------- */

/* Build a segment under a temporary name, with us as its first user, then
 * link it into place: nobody ever maps a half-initialised one. */
static int create_segment(const char *path, const char *session, uint64_t budget, const struct ts_ident *me,
			  char *why, size_t whylen)
{
	static _Atomic unsigned counter;
	char tmp[TS_PATH_MAX];
	struct ts_cache_static geo = { 0 };
	geometry(budget, &geo);
	/* Same prefix as session.c's temporaries: ts_clean_temp_files() removes ours too. */
	snprintf(tmp, sizeof(tmp), "%s/tsshim-tmp.%u.%u.cache%u", ts_shm_dir(), (unsigned)getuid(),
		 (unsigned)getpid(), atomic_fetch_add(&counter, 1));
	int fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0)
		return fail(why, whylen, -errno, "cannot create %s: %s", tmp, strerror(errno));
	int ret = 0;
	void *map = MAP_FAILED;
	/* The arena stays sparse; header and index are reserved now so that
	 * touching them can never SIGBUS. */
	if (fchmod(fd, 0600) != 0 || ftruncate(fd, (off_t)geo.segment_size) != 0) {
		ret = fail(why, whylen, -errno, "cannot size %s: %s", tmp, strerror(errno));
		goto out;
	}
	/* a first chunk of images must fit our share of /dev/shm, or the cache is no use */
	if (!ts_shm_within_quarter(min_u64(geo.chunk_size, geo.arena_size))) {
		ret = fail(why, whylen, -ENOSPC, "%llu MiB of images would be more than a quarter of %s",
			   (unsigned long long)(min_u64(geo.chunk_size, geo.arena_size) >> 20), ts_shm_dir());
		goto out;
	}
	if ((ret = ts_prim_reserve(fd, 0, geo.arena_off)) != 0) {
		ret = fail(why, whylen, ret, "cannot reserve %llu bytes in %s: %s", (unsigned long long)geo.arena_off,
			   ts_shm_dir(), strerror(-ret));
		goto out;
	}
	map = mmap(NULL, geo.arena_off, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (map == MAP_FAILED) {
		ret = fail(why, whylen, -errno, "cannot map %s: %s", tmp, strerror(errno));
		goto out;
	}
	struct ts_cache_header *h = map;
	struct ts_cache_static *st = &h->st;
	*st = geo;
	st->magic = TS_CACHE_MAGIC;
	st->layout_version = TS_CACHE_LAYOUT_VERSION;
	st->header_size = sizeof(*h);
	st->entry_size = sizeof(struct ts_cache_entry);
	st->lock_size = sizeof(struct ts_shm_lock);
	st->uid = (uint32_t)getuid();
	st->created_unix_ns = ts_prim_realtime_ns();
	st->creator_pid = me->pid;
	snprintf(st->session, sizeof(st->session), "%s", session);
	st->checksum = ts_cache_static_checksum(st);
	ts_shm_lock_init(&h->lock);
	h->head = 0;
	h->first = h->last = h->cursor = NONE;
	/* Entries are all zero: EMPTY, generation 0. */
	atomic_store(&h->users[0].start_time, me->start_time);
	atomic_store(&h->users[0].pid, me->pid);
	atomic_store(&h->state, TS_CACHE_SEG_OPEN);
	munmap(map, geo.arena_off);
	map = MAP_FAILED;
	if (link(tmp, path) != 0) {
		ret = -errno;
		if (ret != -EEXIST)
			fail(why, whylen, ret, "cannot create %s: %s", path, strerror(-ret));
		goto out;
	}
	unlink(tmp);
	return fd;
out:
	if (map != MAP_FAILED)
		munmap(map, geo.arena_off);
	unlink(tmp);
	close(fd);
	return ret;
}

/*
 * 0 and *map, *size set, or a negative error. The failures return their
 * error themselves, not fail()'s result: the analyser does not follow the
 * variadic fail() and would take 0 for possible.
 */
static int map_checked(int fd, int prot, void **map, size_t *size, struct stat *sbo, struct ts_cache_static *snap,
		       char *why, size_t whylen)
{
	struct stat sb;
	int ret;
	if (fstat(fd, &sb) != 0) {
		ret = ts_neg_errno();
		fail(why, whylen, ret, "cannot stat: %s", strerror(-ret));
		return ret;
	}
	if ((ret = ts_shm_file_ours(&sb)) != 0) {
		fail(why, whylen, ret, "refused: not a 0600 file owned by uid %u", (unsigned)getuid());
		return ret;
	}
	if ((uint64_t)sb.st_size < sizeof(struct ts_cache_header)) {
		fail(why, whylen, -EBADMSG, "truncated: %lld bytes", (long long)sb.st_size);
		return -EBADMSG;
	}
	void *m = mmap(NULL, (size_t)sb.st_size, prot, MAP_SHARED, fd, 0);
	if (m == MAP_FAILED) {
		ret = ts_neg_errno();
		fail(why, whylen, ret, "cannot map: %s", strerror(-ret));
		return ret;
	}
	ret = validate_snapshot(m, (size_t)sb.st_size, getuid(), snap, why, whylen);
	if (ret) {
		munmap(m, (size_t)sb.st_size);
		return ret;
	}
	*map = m;
	*size = (size_t)sb.st_size;
	if (sbo)
		*sbo = sb;
	return 0;
}

/* The handle's geometry from the validated snapshot, never from the file again. */
static void attach_handle(struct ts_cache *c, void *map, size_t size, const struct stat *sb,
			  const struct ts_cache_static *st)
{
	c->hdr = map;
	c->map_size = size;
	c->ents = (struct ts_cache_entry *)((unsigned char *)map + st->index_off);
	c->arena = (unsigned char *)map + st->arena_off;
	c->arena_off = st->arena_off;
	c->arena_size = st->arena_size;
	c->chunk_size = st->chunk_size;
	c->nentries = st->nentries;
	c->dev = sb->st_dev;
	c->ino = sb->st_ino;
	/* none reserved by us yet; without the bitmap, every hit and fill bypasses */
	c->own_chunks = calloc((st->arena_size / st->chunk_size + 1 + 63) / 64, sizeof(*c->own_chunks));
}

static void detach_handle(struct ts_cache *c)
{
	if (c->hdr)
		munmap(c->hdr, c->map_size);
	/* Close only our own file: the program may have taken the number over. */
	if (c->fd >= 0 && (!c->hdr || fd_is_ours(c, c->fd)))
		close(c->fd);
	free((void *)c->own_chunks);
	c->own_chunks = NULL;
	c->hdr = NULL;
	c->ents = NULL;
	c->arena = NULL;
	c->fd = -1;
}

/* Is pid a live job among the users: adopted by its workers, or listed as
 * an opener when it decodes itself too (adopt then adds no second slot)? */
static bool live_job(const struct ts_cache_header *h, uint32_t pid)
{
	for (unsigned i = 0; i < TS_CACHE_MAX_USERS; i++) {
		const struct ts_cache_user *u = &h->users[i];
		if (u->kind != TS_CACHE_USER_WORKER && atomic_load_explicit(&u->pid, memory_order_acquire) == pid)
			return ts_proc_liveness(pid, atomic_load_explicit(&u->start_time, memory_order_relaxed)) ==
			       TS_PROC_ALIVE;
	}
	return false;
}

/* A user that still counts: its process lives and, for a WORKER, so does
 * the job that forked it (an orphaned worker is on its way out). */
static bool user_counts(const struct ts_cache_header *h, const struct ts_cache_user *u, uint32_t pid)
{
	uint64_t st = atomic_load_explicit(&u->start_time, memory_order_relaxed);
	if (ts_proc_liveness(pid, st) != TS_PROC_ALIVE)
		return false;
	if (u->kind != TS_CACHE_USER_WORKER)
		return true;
	uint64_t start;
	uint32_t ppid = 0;
	int r = ts_prim_read_stat(pid, &start, &ppid);
	return r ? !ts_proc_gone(r) : live_job(h, ppid);
}

/* Free the slots of users that no longer count (under the lock); count the rest. */
static unsigned reap_users(struct ts_cache_header *h, bool reap)
{
	unsigned alive = 0;
	for (unsigned i = 0; i < TS_CACHE_MAX_USERS; i++) {
		uint32_t pid = atomic_load_explicit(&h->users[i].pid, memory_order_acquire);
		if (pid == 0)
			continue;
		if (user_counts(h, &h->users[i], pid))
			alive++;
		else if (reap)
			atomic_store_explicit(&h->users[i].pid, 0, memory_order_release);
	}
	return alive;
}

static bool is_user(const struct ts_cache_user *u, const struct ts_ident *who)
{
	return atomic_load_explicit(&u->pid, memory_order_acquire) == who->pid &&
	       atomic_load_explicit(&u->start_time, memory_order_relaxed) == who->start_time;
}

/* Clear the slots that forked children adopted for `who` (under the lock). */
static void unregister_adopted(struct ts_cache_header *h, const struct ts_ident *who)
{
	for (unsigned i = 0; i < TS_CACHE_MAX_USERS; i++)
		if (h->users[i].kind == TS_CACHE_USER_JOB && is_user(&h->users[i], who))
			atomic_store_explicit(&h->users[i].pid, 0, memory_order_release);
}

static int register_user(struct ts_cache_header *h, const struct ts_ident *me, uint32_t kind)
{
	for (unsigned i = 0; i < TS_CACHE_MAX_USERS; i++) {
		struct ts_cache_user *u = &h->users[i];
		if (atomic_load_explicit(&u->pid, memory_order_relaxed) != 0)
			continue;
		u->kind = kind;
		atomic_store_explicit(&u->start_time, me->start_time, memory_order_relaxed);
		/* release: the start time is visible before the pid */
		atomic_store_explicit(&u->pid, me->pid, memory_order_release);
		return (int)i;
	}
	return -EUSERS;
}

/* Is path still the file we have open? (Do not unlink a successor.) */
static bool path_is_ours(const struct ts_cache *c, const char *path)
{
	struct stat sb;
	return lstat(path, &sb) == 0 && sb.st_dev == c->dev && sb.st_ino == c->ino;
}

static int open_once(struct ts_cache *c, uint64_t budget, const struct ts_ident *me, char *why, size_t whylen)
{
	bool created = false;
	int fd = open(c->path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0 && errno == ENOENT) {
		fd = create_segment(c->path, c->session, budget, me, why, whylen);
		if (fd == -EEXIST)
			return -EAGAIN;
		created = fd >= 0;
	} else if (fd < 0 && errno == ELOOP) {
		fd = fail(why, whylen, -ELOOP, "%s: refused: a symbolic link", c->path);
	} else if (fd < 0 && errno == EACCES) { /* another user's, or not rw for us */
		fd = fail(why, whylen, -EACCES, "%s: refused: not a 0600 file owned by uid %u", c->path,
			  (unsigned)getuid());
	} else if (fd < 0) {
		int e = errno;
		fd = fail(why, whylen, -e, "cannot open %s: %s", c->path, strerror(e));
	}
	if (fd < 0)
		return fd;
	c->fd = fd;
	void *map;
	size_t size;
	struct stat sb;
	struct ts_cache_static st;
	int ret = map_checked(fd, PROT_READ | PROT_WRITE, &map, &size, &sb, &st, why, whylen);
	if (ret) {
		char tmp[200];
		snprintf(tmp, sizeof(tmp), "%s", why ? why : "");
		fail(why, whylen, ret, "%s: %s", c->path, tmp);
		return ret;
	}
	attach_handle(c, map, size, &sb, &st);
	ret = cache_lock(c, TS_CACHE_OPEN_TIMEOUT_NS);
	if (ret)
		return fail(why, whylen, ret == -ETIMEDOUT ? -ETIMEDOUT : ret, "%s: the cache lock is %s", c->path,
			    ret == -ETIMEDOUT ? "held by a stopped process" : "unusable");
	if (fstat(fd, &sb) != 0 || sb.st_nlink == 0 ||
	    atomic_load(&c->hdr->state) != TS_CACHE_SEG_OPEN) {
		cache_unlock(c);
		return -EAGAIN; /* removed by the last user while we got here */
	}
	unsigned alive = reap_users(c->hdr, true);
	if (created) {
		c->user_slot = 0; /* registered in the image before it was linked */
	} else if (alive == 0) {
		/* Every user died without closing: start afresh rather than
		 * inherit a cache nobody looks after (and free its memory). */
		atomic_store(&c->hdr->state, TS_CACHE_SEG_CLOSED);
		if (path_is_ours(c, c->path))
			unlink(c->path);
		cache_unlock(c);
		return -EAGAIN;
	} else {
		c->user_slot = register_user(c->hdr, me, TS_CACHE_USER_OPENER);
		if (c->user_slot < 0) {
			cache_unlock(c);
			return fail(why, whylen, -EUSERS, "%s: too many users (%u)", c->path, TS_CACHE_MAX_USERS);
		}
	}
	cache_unlock(c);
	return 0;
}

int ts_cache_open(struct ts_cache *c, const char *session, uint64_t budget_bytes, char *why, size_t whylen)
{
	int saved = errno, ret;
	memset(c, 0, sizeof(*c));
	c->fd = -1;
	c->user_slot = -1;
	c->lock_timeout_ns = TS_CACHE_LOCK_TIMEOUT_NS;
	c->stale_fill_ns = TS_CACHE_STALE_FILL_NS;
	c->admit_ratio = TS_CACHE_ADMIT_RATIO;
	if (why && whylen)
		why[0] = '\0';
	if (!session || !ts_session_name_valid(session))
		return fail(why, whylen, -EINVAL, "invalid session name");
	if (budget_bytes < TS_CACHE_MIN_BUDGET || budget_bytes > TS_CACHE_MAX_BUDGET)
		return fail(why, whylen, -EINVAL, "cache budget %llu bytes out of range (%llu..%llu)",
			    (unsigned long long)budget_bytes, (unsigned long long)TS_CACHE_MIN_BUDGET,
			    (unsigned long long)TS_CACHE_MAX_BUDGET);
	struct ts_ident me;
	if ((ret = ts_self_ident(&me)) != 0)
		return fail(why, whylen, ret, "cannot read our own process identity");
	snprintf(c->session, sizeof(c->session), "%s", session);
	if ((ret = ts_cache_path(c->path, sizeof(c->path), getuid(), session)) != 0)
		return fail(why, whylen, ret, "invalid cache path");
	for (int attempt = 0; attempt < OPEN_ATTEMPTS; attempt++) {
		ret = open_once(c, budget_bytes, &me, why, whylen);
		if (ret == 0) {
			c->opener_pid = me.pid;
			errno = saved;
			return 0;
		}
		detach_handle(c);
		c->need_repair = 0;
		if (ret != -EAGAIN) {
			errno = saved;
			return ret;
		}
	}
	errno = saved;
	return fail(why, whylen, -EBUSY, "%s keeps changing under us", c->path);
}

/* Unregister; the last live user out removes the segment. Keeps the mapping. */
static void leave(struct ts_cache *c)
{
	struct ts_ident me;
	if ((uint32_t)getpid() != c->opener_pid || ts_self_ident(&me) != 0)
		return; /* a forked child never leaves for its parent */
	struct ts_cache_header *h = c->hdr;
	bool locked = cache_lock(c, TS_CACHE_OPEN_TIMEOUT_NS) == 0;
	if (c->user_slot >= 0 && (unsigned)c->user_slot < TS_CACHE_MAX_USERS) {
		struct ts_cache_user *u = &h->users[c->user_slot];
		if (is_user(u, &me))
			atomic_store_explicit(&u->pid, 0, memory_order_release);
	}
	if (locked)
		unregister_adopted(h, &me); /* the process is leaving: its workers' hold on it too */
	/* Only under the lock may we decide that we were the last one out. */
	if (locked && reap_users(h, true) == 0) {
		atomic_store(&h->state, TS_CACHE_SEG_CLOSED);
		if (path_is_ours(c, c->path))
			unlink(c->path);
	}
	if (locked)
		cache_unlock(c);
	c->user_slot = -1;
	c->opener_pid = 0; /* left: a later close only unmaps */
}

void ts_cache_leave(struct ts_cache *c)
{
	if (!c || !c->hdr)
		return;
	int saved = errno;
	leave(c);
	errno = saved;
}

void ts_cache_close(struct ts_cache *c)
{
	if (!c || !c->hdr)
		return;
	int saved = errno;
	leave(c);
	detach_handle(c);
	errno = saved;
}

/* ---- statistics and inspection --------------------------------------------------- */

/* nentries: the index size as validated, not the file's (the entries are counted up to it). */
static void collect(const struct ts_cache_header *h, const struct ts_cache_entry *ents, uint32_t nentries,
		    struct ts_cache_stats *o)
{
	const struct ts_cache_counters *k = &h->counters;
	memset(o, 0, sizeof(*o));
#define GET(f) o->f = atomic_load_explicit(&k->f, memory_order_relaxed)
	GET(hits);
	GET(misses);
	GET(fills);
	GET(commits);
	GET(aborts);
	GET(bypasses);
	GET(bypass_lock);
	GET(bypass_nospace);
	GET(bypass_shm);
	GET(bypass_wait);
	GET(bypass_aborted);
	GET(bypass_other);
	GET(waits);
	GET(evictions);
	GET(reclaims);
	GET(orphans);
	GET(torn);
	GET(repairs);
	GET(saved_decode_ns);
	GET(bypass_cold);
#undef GET
	o->bytes_in_use = atomic_load_explicit(&h->bytes_in_use, memory_order_relaxed);
	o->reserved_bytes = atomic_load_explicit(&h->falloc_hwm, memory_order_relaxed);
	o->capacity = nentries;
	o->budget = h->st.arena_size; /* reported only */
	o->created_unix_ns = h->st.created_unix_ns;
	for (uint32_t i = 0; i < nentries; i++) {
		uint32_t s = TS_CENT_STATE(atomic_load_explicit(&ents[i].word, memory_order_relaxed));
		o->entries += s == TS_CENT_READY;
		o->filling += s == TS_CENT_FILLING;
	}
	for (unsigned i = 0; i < TS_CACHE_MAX_USERS; i++)
		o->users += atomic_load_explicit(&h->users[i].pid, memory_order_relaxed) != 0;
}

void ts_cache_set_scope(struct ts_cache *c, const char *scope)
{
	if (!c || !c->hdr || !scope)
		return;
	struct ts_cache_header *h = c->hdr;
	uint32_t s = atomic_load(&h->scope_seq);
	/* odd: another writer is at it; its scope is as good as ours */
	if ((s & 1) || !atomic_compare_exchange_strong(&h->scope_seq, &s, s + 1))
		return;
	snprintf(h->scope, sizeof(h->scope), "%s", scope);
	atomic_store_explicit(&h->scope_seq, s + 2, memory_order_release);
}

/* Copy the scope note; "" if it is being written or is not a string. */
static void read_scope(const struct ts_cache_header *h, char *out, size_t n)
{
	uint32_t s = atomic_load_explicit(&h->scope_seq, memory_order_acquire);
	memcpy(out, h->scope, n < sizeof(h->scope) ? n : sizeof(h->scope));
	atomic_thread_fence(memory_order_acquire);
	if ((s & 1) || s != atomic_load_explicit(&h->scope_seq, memory_order_relaxed) || !memchr(out, '\0', n))
		out[0] = '\0';
}

void ts_cache_stats(const struct ts_cache *c, struct ts_cache_stats *out)
{
	if (!c || !c->hdr) {
		memset(out, 0, sizeof(*out));
		return;
	}
	collect(c->hdr, c->ents, c->nentries, out);
	read_scope(c->hdr, out->scope, sizeof(out->scope));
}

int ts_cache_view(const char *path, struct ts_cache_stats *out, char *why, size_t whylen)
{
	int saved = errno;
	/* O_NONBLOCK: a FIFO planted at the path must not hang the reader. */
	int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0) {
		int e = errno;
		errno = saved;
		return fail(why, whylen, -e, "cannot open %s: %s", path, strerror(e));
	}
	void *map;
	size_t size;
	struct ts_cache_static st;
	int ret = map_checked(fd, PROT_READ, &map, &size, NULL, &st, why, whylen);
	close(fd);
	if (ret == 0) {
		const struct ts_cache_header *h = map;
		collect(h, (const struct ts_cache_entry *)((const unsigned char *)map + st.index_off), st.nentries, out);
		read_scope(h, out->scope, sizeof(out->scope));
		munmap(map, size);
	}
	errno = saved;
	return ret;
}

/*
 * Register `who`, the process this one was forked from, as a user too (once):
 * the segment then outlives this process for as long as `who` lives.
 */
int ts_cache_adopt(struct ts_cache *c, const struct ts_ident *who)
{
	if (!c || !c->hdr || !who || who->pid == 0)
		return -EINVAL;
	int saved = errno;
	int ret = cache_lock(c, TS_CACHE_OPEN_TIMEOUT_NS);
	if (ret) {
		errno = saved;
		return ret; /* -ETIMEDOUT, or the lock is unusable */
	}
	struct ts_cache_header *h = c->hdr;
	bool listed = false;
	for (unsigned i = 0; i < TS_CACHE_MAX_USERS && !listed; i++)
		listed = is_user(&h->users[i], who);
	if (listed)
		ret = 0;
	else if (ts_proc_liveness(who->pid, who->start_time) != TS_PROC_ALIVE)
		ret = -ESRCH; /* it is gone: keeping its slot would only delay the reap */
	else
		ret = register_user(h, who, TS_CACHE_USER_JOB) < 0 ? -EUSERS : 0;
	/* A process adopting itself stays what it is; a child becomes a worker. */
	if (ret == 0 && who->pid != (uint32_t)getpid() && c->user_slot >= 0 &&
	    (unsigned)c->user_slot < TS_CACHE_MAX_USERS)
		h->users[c->user_slot].kind = TS_CACHE_USER_WORKER;
	cache_unlock(c);
	errno = saved;
	return ret;
}

/*
 * Remove the segment at path if no user is alive, after taking off the list
 * the registrations that forked children adopted for `self` (NULL: none).
 */
static int remove_unless_used(const char *path, const struct ts_ident *self, struct ts_cache_stats *last)
{
	int saved = errno, ret;
	char why[160];
	struct ts_cache c;
	memset(&c, 0, sizeof(c));
	c.fd = open(path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
	if (c.fd < 0) {
		ret = errno == ENOENT ? 0 : -errno;
		errno = saved;
		return ret;
	}
	void *map;
	size_t size;
	struct stat sb;
	struct ts_cache_static st;
	ret = map_checked(c.fd, PROT_READ | PROT_WRITE, &map, &size, &sb, &st, why, sizeof(why));
	if (ret == 0) {
		attach_handle(&c, map, size, &sb, &st);
		snprintf(c.session, sizeof(c.session), "%s", st.session); /* the snapshot's: NUL-terminated, validated */
		ret = cache_lock(&c, 100000000ull);
		if (ret == 0) {
			bool linked = fstat(c.fd, &sb) == 0 && sb.st_nlink > 0;
			if (linked && self)
				unregister_adopted(c.hdr, self);
			if (linked && reap_users(c.hdr, false) == 0) {
				/* Nobody alive: nobody will mind (a live cache is never written). */
				atomic_store(&c.hdr->state, TS_CACHE_SEG_CLOSED);
				ret = path_is_ours(&c, path) && unlink(path) == 0 ? 1 : 0;
				if (ret == 1 && last)
					collect(c.hdr, c.ents, c.nentries, last);
			}
			cache_unlock(&c);
		}
	}
	detach_handle(&c);
	errno = saved;
	return ret;
}

int ts_cache_remove_if_stale(const char *path)
{
	return remove_unless_used(path, NULL, NULL);
}

int ts_cache_depart(const char *path, struct ts_cache_stats *last)
{
	struct ts_ident me;
	int ret = ts_self_ident(&me);
	return ret ? ret : remove_unless_used(path, &me, last);
}
