/* SPDX-License-Identifier: MIT */
/*
 * Ring bookkeeping (see ring.h). Memory-ordering map:
 *
 *  - Slot word: the producer fills its meta row (and the data plane its
 *    buffers), then publishes with a release CAS; a consumer loads the word
 *    with acquire before reading the row. Reading the row is a seqlock
 *    read: relaxed loads, acquire fence, re-load the word and our attach
 *    word.
 *  - Release of a slot: a consumer's advance() stores read_seq with release
 *    after it is done with the bytes; the producer loads it with acquire
 *    before it reuses the slot.
 *  - Attach vs claim is a Dekker pair (both sides seq_cst): the producer
 *    raises claim_seq and then loads the attach words; a consumer stores its
 *    attach word and then loads claim_seq. At least one sees the other.
 *  - Claim vs takeover is another: the producer CASes the slot word and then
 *    loads the producer word; the new producer (session.c) CASes the
 *    producer word and then loads the slot word. Both seq_cst.
 *  - Futex counters are bumped with release after the change they announce,
 *    and read with acquire *before* the condition is re-checked, so a wake
 *    between check and wait turns the wait into -EAGAIN, never a lost wake.
 *
 * Everything read from the segment is validated: another member may be
 * buggy, stopped half-way, or hostile.
 */
#include "ring.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>

#include "prim.h"
#include "session.h"

#define SLICE_NS     10000000ull /* longest single wait: liveness is rechecked this often */
#define SEQ_MASK     ((1ull << TS_SLOT_SEQ_BITS) - 1)
#define EPOCH_MASK   ((1u << TS_SLOT_EPOCH_BITS) - 1)
#define LEN_LIMIT    (1ull << 48)
#define META_RETRIES 8           /* seqlock re-reads before calling the slot corrupt */
#define EVICT_TRIES  8           /* CASes at one attach word per look before it counts as holding */

typedef unsigned __int128 u128;

/* ---- small helpers ------------------------------------------------------ */

static inline int ring_depth(const struct ts_segment *seg, uint32_t *d)
{
	*d = ts_ring_depth(seg); /* read once: the whole call uses one value */
	return *d ? 0 : -EBADMSG;
}

static inline bool member_ok(int idx)
{
	return idx >= 0 && (unsigned)idx < TS_MAX_MEMBERS;
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

/* Raise *a to at least v (claim_seq and pub_seq only ever grow). */
static inline void raise_to(_Atomic uint64_t *a, uint64_t v, memory_order mo)
{
	uint64_t cur = atomic_load_explicit(a, mo == memory_order_seq_cst ? mo : memory_order_relaxed);
	while (cur < v && !atomic_compare_exchange_weak_explicit(a, &cur, v, mo, memory_order_relaxed))
		;
}

/* release: whatever we changed before the bump is visible to a waiter that acquires it */
static inline void bump_wake(_Atomic uint32_t *ev)
{
	atomic_fetch_add_explicit(ev, 1, memory_order_release);
	ts_futex_wake_all(ev);
}

/*
 * One bounded wait on a futex counter whose value `seen` was read before
 * the caller checked its condition. Any return of the futex is fine: the
 * caller re-checks. -ETIMEDOUT once the deadline has passed.
 */
static int wait_slice(_Atomic uint32_t *ev, uint32_t seen, uint64_t deadline)
{
	uint64_t now = ts_now_ns();
	if (now >= deadline)
		return -ETIMEDOUT;
	(void)ts_futex_wait(ev, seen, min_u64(deadline - now, SLICE_NS));
	return 0;
}

/*
 * A reader that was elected producer while it waited: nobody else publishes
 * now, so its wait can only run out. `was` is the producer word it saw first.
 * Asked before the reader looks at its slot, not after its wait: a producer
 * may publish its last batch and leave while a slow reader sleeps, and that
 * batch is still the reader's. acquire: pairs with the hand-over's seq_cst
 * CAS, which comes after the old producer's publishes; a read of the slot
 * after a look that saw us elected sees every batch that will ever come.
 */
static inline bool elected_meanwhile(const struct ts_segment *seg, const struct ts_ring_reader *r, uint64_t was)
{
	uint64_t w = atomic_load_explicit(&seg->producer, memory_order_acquire);
	return w != was && ts_producer_index(w) == r->self;
}

static inline bool still_producer(const struct ts_segment *seg, const struct ts_ring_writer *w)
{
	/* seq_cst: the second half of the claim/takeover Dekker pair (see top) */
	return atomic_load_explicit(&seg->producer, memory_order_seq_cst) ==
	       ts_producer_word(w->epoch, w->self);
}

static inline uint64_t writing_word(const struct ts_ring_writer *w)
{
	return ts_slot_word(TS_SLOT_WRITING, (unsigned)w->self + 1, w->epoch, w->seq);
}

int ts_batch_meta_valid(const struct ts_batch_meta *m)
{
	if (m->npos < 1 || m->npos > TS_MAX_POSITIONS)
		return -EBADMSG;
	if (m->flags & ~TS_BATCH_END_OF_EPOCH)
		return -EBADMSG;
	if (m->len[0] == 0 || m->nsamples == 0)
		return -EBADMSG;
	for (uint32_t p = 0; p < m->npos; p++)
		if (m->len[p] >= LEN_LIMIT || m->len[p] % m->nsamples)
			return -EBADMSG;
	return 0;
}

/* ---- producer ----------------------------------------------------------- */

int ts_ring_writer_init(struct ts_segment *seg, int self, struct ts_ring_writer *w)
{
	uint32_t d;
	int ret;

	if (!member_ok(self))
		return -EINVAL;
	if ((ret = ring_depth(seg, &d)))
		return ret;
	uint64_t pw = atomic_load_explicit(&seg->producer, memory_order_seq_cst);
	if (ts_producer_index(pw) != self)
		return -EPERM;
	/* A successor continues at the first seq nobody finished publishing. */
	uint64_t next = atomic_load_explicit(&seg->ring.pub_seq, memory_order_acquire);
	if (next > SEQ_MASK)
		return -EBADMSG;
	*w = (struct ts_ring_writer){ .self = self, .epoch = ts_producer_epoch(pw), .next_seq = next };
	return 0;
}

/*
 * Take member m's attachment away (it is dead, gone or silent): a new
 * generation with bit 0 clear, so even a later re-attach tells it apart.
 * false if the word moved under us (the caller looks again).
 */
static bool evict(struct ts_segment *seg, struct ts_member *mb, uint64_t *a)
{
	uint64_t v = *a;
	/* seq_cst: ordered before our later claim of the slot the member held */
	if (!atomic_compare_exchange_strong_explicit(&mb->attach, a, (v + 2) & ~1ull,
						     memory_order_seq_cst, memory_order_seq_cst))
		return false;
	atomic_fetch_add_explicit(&seg->counters.evictions, 1, memory_order_relaxed);
	bump_wake(&seg->ring.rel_ev);
	return true;
}

/*
 * May the producer evict this laggard? Dead or gone: yes. Alive but silent
 * (heartbeat older than the timeout: a stopped process): only once it has
 * been silent for the stall time, as long as we wait on a reader that does
 * not read; a pause of a second or two must not cost a job its place.
 */
static bool evictable(struct ts_segment *seg, unsigned m, uint64_t now)
{
	enum ts_member_health h = ts_member_health(seg, m, now);
	if (h != TS_MEMBER_STALE)
		return h != TS_MEMBER_LIVE;
	uint64_t hb = atomic_load_explicit(&seg->members[m].heartbeat_ns, memory_order_relaxed);
	return now > hb && now - hb > ts_stall_ns(seg);
}

/*
 * Does any attached member still need seq < need? With `health`, laggards
 * that are dead, gone or silent for the stall time are evicted instead;
 * without, every laggard holds (a liveness check reads /proc: not on every
 * wake-up). 1 held, 0 free, -EDEADLK when the writer's own attachment is
 * behind: it would wait for itself forever (a consumer elected producer
 * that has not read its predecessor's last batches must read them first).
 */
static int held_back(struct ts_segment *seg, unsigned self, uint64_t need, bool health, uint64_t now)
{
	int held = 0;

	for (unsigned m = 0; m < TS_MAX_MEMBERS; m++) {
		struct ts_member *mb = &seg->members[m];
		/* seq_cst: the producer half of the attach Dekker pair */
		uint64_t a = atomic_load_explicit(&mb->attach, memory_order_seq_cst);
		/* a word that keeps moving under our CAS (a peer rewriting it)
		 * holds us for this look: the caller's wait has a deadline */
		for (int tries = 0; a & 1; tries++) {
			/* acquire: its reads of the old slot happen before our reuse */
			if (atomic_load_explicit(&mb->read_seq, memory_order_acquire) >= need)
				break;
			if (m == self)
				return -EDEADLK;
			if (!health || tries == EVICT_TRIES || !evictable(seg, m, now)) {
				held = 1;
				break;
			}
			if (evict(seg, mb, &a))
				break;
		}
	}
	return held;
}

/* Wait until seq n's slot (last holding n - d) is released by every attached member. */
static int wait_released(struct ts_segment *seg, const struct ts_ring_writer *w, uint64_t n,
			 uint32_t d, uint64_t deadline)
{
	uint64_t checked = 0;

	if (n + 1 <= d)
		return 0;
	for (bool first = true;; first = false) {
		uint32_t ev = atomic_load_explicit(&seg->ring.rel_ev, memory_order_acquire);
		uint64_t now = ts_now_ns();
		/* liveness on the first look, then at most once a slice */
		bool health = first || now - checked >= SLICE_NS;
		if (health)
			checked = now;
		int held = held_back(seg, (unsigned)w->self, n + 1 - d, health, now);
		if (held <= 0)
			return held;
		if (!still_producer(seg, w))
			return -EPERM;
		int ret = wait_slice(&seg->ring.rel_ev, ev, deadline);
		if (ret)
			return ret;
	}
}

enum { SLOT_CLAIM = 0, SLOT_SKIP = 1 };

/* What may we do with slot word x when we want seq n? SLOT_* or -errno. */
static int slot_verdict(uint64_t x, uint64_t n, uint32_t d, const struct ts_ring_writer *w)
{
	unsigned st = ts_slot_state(x);
	uint64_t sq = ts_slot_seq(x);

	if (st > TS_SLOT_PUBLISHED)
		return -EBADMSG;
	if (sq > n)
		return -EPERM; /* a newer producer is already past us */
	if (st == TS_SLOT_FREE)
		return SLOT_CLAIM;
	if (st == TS_SLOT_PUBLISHED)
		/* sq == n: a predecessor published it, then died before pub_seq */
		return sq == n ? SLOT_SKIP : sq + d == n ? SLOT_CLAIM : -EBADMSG;
	if (sq != n)
		return -EBADMSG;
	/*
	 * An unfinished claim of seq n. Ours (same writer and epoch: the writer
	 * state was re-initialised) or an older producer's: take it over, which
	 * is safe because its meta row is its own. A newer epoch's claim is
	 * not ours to take: we are the stale one.
	 */
	uint32_t diff = (ts_slot_epoch(x) - w->epoch) & EPOCH_MASK;
	return diff != 0 && diff <= EPOCH_MASK / 2 ? -EPERM : SLOT_CLAIM;
}

int ts_ring_begin(struct ts_segment *seg, struct ts_ring_writer *w, uint64_t timeout_ns,
		  struct ts_batch_meta **meta)
{
	uint32_t d;
	int ret;

	if (!member_ok(w->self))
		return -EINVAL;
	if (w->claimed)
		return -EBUSY;
	if ((ret = ring_depth(seg, &d)))
		return ret;
	uint64_t deadline = deadline_after(timeout_ns);
	uint32_t skipped = 0;

	for (;;) {
		uint64_t n = w->next_seq;
		if (n >= SEQ_MASK)
			return -EOVERFLOW;
		if (!still_producer(seg, w))
			return -EPERM;
		/* Announce before looking at the consumers: the attach Dekker pair. */
		raise_to(&seg->ring.claim_seq, n + 1, memory_order_seq_cst);
		if ((ret = wait_released(seg, w, n, d, deadline)))
			return ret;

		struct ts_slot *s = &seg->ring.slots[n % d];
		uint64_t x = atomic_load_explicit(&s->word, memory_order_seq_cst);
		ret = slot_verdict(x, n, d, w);
		if (ret < 0)
			return ret;
		if (ret == SLOT_SKIP) {
			/* a dead predecessor left at most d of them; more is a peer
			 * publishing ahead of us as fast as we skip */
			if (++skipped > d)
				return -EBADMSG;
			raise_to(&seg->ring.pub_seq, n + 1, memory_order_release);
			w->next_seq = n + 1;
			continue;
		}
		w->seq = n;
		uint64_t mine = writing_word(w);
		if (!atomic_compare_exchange_strong_explicit(&s->word, &x, mine, memory_order_seq_cst,
							     memory_order_relaxed)) {
			if (ts_now_ns() >= deadline)
				return -ETIMEDOUT;
			continue;
		}
		/* Replaced between our check and the claim: give the slot back. */
		if (!still_producer(seg, w)) {
			atomic_compare_exchange_strong_explicit(&s->word, &mine, x, memory_order_release,
								memory_order_relaxed);
			return -EPERM;
		}
		/*
		 * release fence: a seqlock reader that sees any of the writes
		 * below also sees our claim when it re-loads the word.
		 */
		atomic_thread_fence(memory_order_release);
		w->claimed = 1;
		w->slot = (unsigned)(n % d);
		w->prev = x;
		*meta = &seg->ring.meta[w->self][w->slot];
		memset(*meta, 0, sizeof(**meta));
		return 0;
	}
}

int ts_ring_publish(struct ts_segment *seg, struct ts_ring_writer *w)
{
	if (!w->claimed || !member_ok(w->self) || w->slot >= TS_MAX_DEPTH)
		return -EINVAL;
	if (ts_batch_meta_valid(&seg->ring.meta[w->self][w->slot]))
		return -EINVAL;
	uint64_t mine = writing_word(w);
	uint64_t pub = ts_slot_word(TS_SLOT_PUBLISHED, (unsigned)w->self + 1, w->epoch, w->seq);
	/* release: the meta row and the batch's bytes before the word */
	bool ok = atomic_compare_exchange_strong_explicit(&seg->ring.slots[w->slot].word, &mine, pub,
							  memory_order_release, memory_order_relaxed);
	w->claimed = 0;
	if (!ok)
		return -EPERM; /* a new producer took the claim over */
	w->next_seq = w->seq + 1;
	raise_to(&seg->ring.pub_seq, w->seq + 1, memory_order_release);
	bump_wake(&seg->ring.pub_ev);
	return 0;
}

int ts_ring_abort(struct ts_segment *seg, struct ts_ring_writer *w)
{
	if (!w->claimed || w->slot >= TS_MAX_DEPTH)
		return -EINVAL;
	w->claimed = 0;
	uint64_t mine = writing_word(w), back = w->prev;
	/*
	 * Put the previous word back. A reader that raced with our meta writes
	 * would see the same word again (ABA), but only an evicted reader can be
	 * in this slot, and peek() re-checks the attach word after the row.
	 * A free word with the aborted seq goes back instead, which readers of
	 * that seq take as not published yet and the next begin() claims like
	 * any free slot, when the previous word was
	 *  - a row of ours (any epoch): begin() cleared the row, so its seq must
	 *    never read as published with this claim's row;
	 *  - a claim we took over from a replaced producer: given back, it would
	 *    let that producer (stopped, not dead) publish behind the fence
	 *    ts_feed_stream_state() raised, and its publish must fail instead.
	 */
	if (ts_slot_state(back) == TS_SLOT_WRITING ||
	    (ts_slot_state(back) != TS_SLOT_FREE && ts_slot_writer1(back) == (unsigned)w->self + 1))
		back = ts_slot_word(TS_SLOT_FREE, 0, 0, w->seq);
	if (!atomic_compare_exchange_strong_explicit(&seg->ring.slots[w->slot].word, &mine, back,
						     memory_order_release, memory_order_relaxed))
		return -EPERM;
	return 0;
}

/* ---- consumer ----------------------------------------------------------- */

static inline struct ts_member *reader_member(struct ts_segment *seg, const struct ts_ring_reader *r)
{
	return &seg->members[r->self];
}

static inline bool evicted(struct ts_segment *seg, const struct ts_ring_reader *r)
{
	return atomic_load_explicit(&reader_member(seg, r)->attach, memory_order_acquire) != r->attach;
}

int ts_ring_attach(struct ts_segment *seg, int self, struct ts_ring_reader *r)
{
	return ts_ring_attach_at(seg, self, r, UINT64_MAX);
}

int ts_ring_attach_at(struct ts_segment *seg, int self, struct ts_ring_reader *r, uint64_t from)
{
	uint32_t d;
	int ret;

	if (!member_ok(self))
		return -EINVAL;
	if ((ret = ring_depth(seg, &d)))
		return ret;
	struct ts_member *mb = &seg->members[self];
	uint64_t h = atomic_load_explicit(&seg->ring.claim_seq, memory_order_seq_cst);
	if (from < h)
		h = from;
	/* relaxed: published by the attach CAS below, which is a release */
	atomic_store_explicit(&mb->read_seq, h, memory_order_relaxed);
	uint64_t a = atomic_load_explicit(&mb->attach, memory_order_relaxed), na;
	do
		na = (a + 2) | 1;
	while (!atomic_compare_exchange_weak_explicit(&mb->attach, &a, na, memory_order_seq_cst,
						      memory_order_relaxed));
	/*
	 * Dekker with begin(): a producer whose scan missed our attach word
	 * announced its claim before this load, so it claims only seqs < h2
	 * and overwrites only seqs < h2 - d. Producers that see us honour
	 * read_seq. So h is safe if h >= h2 - d; otherwise h2 is (one retry
	 * suffices: the bound above does not move). The same holds for a
	 * `from` behind the head: it is kept only while still in the ring.
	 */
	uint64_t h2 = atomic_load_explicit(&seg->ring.claim_seq, memory_order_seq_cst);
	if (h2 - h > d) {
		h = h2;
		atomic_store_explicit(&mb->read_seq, h, memory_order_release);
	}
	*r = (struct ts_ring_reader){ .self = self, .attach = na, .seq = h };
	return 0;
}

int ts_ring_detach(struct ts_segment *seg, struct ts_ring_reader *r)
{
	if (!member_ok(r->self))
		return -EINVAL;
	uint64_t a = r->attach;
	/* release: our reads of held slots happen before the producer reuses them.
	 * Failure means we were evicted already, which is just as good. */
	atomic_compare_exchange_strong_explicit(&reader_member(seg, r)->attach, &a, (a + 2) & ~1ull,
						memory_order_release, memory_order_relaxed);
	bump_wake(&seg->ring.rel_ev);
	return 0;
}

/* Seqlock copy: relaxed loads, the caller validates with fence + re-load. */
static void meta_copy(struct ts_batch_meta *dst, const struct ts_batch_meta *src)
{
	dst->npos = __atomic_load_n(&src->npos, __ATOMIC_RELAXED);
	dst->flags = __atomic_load_n(&src->flags, __ATOMIC_RELAXED);
	for (unsigned p = 0; p < TS_MAX_POSITIONS; p++)
		dst->len[p] = __atomic_load_n(&src->len[p], __ATOMIC_RELAXED);
	dst->tag = __atomic_load_n(&src->tag, __ATOMIC_RELAXED);
	dst->nsamples = __atomic_load_n(&src->nsamples, __ATOMIC_RELAXED);
}

/*
 * A consistent copy of seq's meta row, and its writer. -EAGAIN: not
 * published yet; -ESTALE: overrun or evicted; -EBADMSG: corrupt.
 */
static int read_slot(struct ts_segment *seg, const struct ts_ring_reader *r, uint32_t d,
		     uint64_t seq, struct ts_batch_meta *m, unsigned *writer)
{
	_Atomic uint64_t *word = &seg->ring.slots[seq % d].word;

	for (int tries = 0; tries < META_RETRIES; tries++) {
		/* acquire: pairs with publish()'s release CAS */
		uint64_t x = atomic_load_explicit(word, memory_order_acquire);
		if (ts_slot_state(x) > TS_SLOT_PUBLISHED)
			return -EBADMSG;
		if (ts_slot_seq(x) > seq)
			return -ESTALE;
		if (ts_slot_state(x) != TS_SLOT_PUBLISHED || ts_slot_seq(x) != seq)
			return -EAGAIN;
		unsigned w1 = ts_slot_writer1(x);
		if (w1 == 0 || w1 > TS_MAX_MEMBERS)
			return -EBADMSG;
		meta_copy(m, &seg->ring.meta[w1 - 1][seq % d]);
		/* acquire fence: the row loads above happen before the re-checks */
		atomic_thread_fence(memory_order_acquire);
		if (atomic_load_explicit(word, memory_order_relaxed) != x)
			continue;
		/* An evicted reader's slot may be reclaimed and restored (ABA). */
		if (r && evicted(seg, r))
			return -ESTALE;
		*writer = w1 - 1;
		return 0;
	}
	return -EBADMSG;
}

/* Do want[] (and our offsets) cut this slot's positions at the same sample? */
static int check_shape(const struct ts_batch_meta *m, uint32_t npos, const uint64_t *want,
		       const uint64_t *off)
{
	if (ts_batch_meta_valid(m))
		return -EBADMSG;
	if (m->npos != npos)
		return -EPROTO;
	if (off[0] >= m->len[0])
		return -EBADMSG; /* sizes changed under an attached reader */
	uint64_t sample0 = m->len[0] / m->nsamples;
	if (want[0] % sample0 || off[0] % sample0)
		return -EPROTO; /* a consumer batch must hold whole samples */
	for (uint32_t p = 1; p < npos; p++) {
		if ((u128)want[p] * m->len[0] != (u128)want[0] * m->len[p])
			return -EPROTO;
		if ((u128)off[p] * m->len[0] != (u128)off[0] * m->len[p] || off[p] > m->len[p])
			return -EPROTO;
	}
	return 0;
}

/*
 * How much of each position to take from this slot: as much of position 0
 * as we still want, the others in proportion. Returns 1 when the take
 * reaches the end of the slot, 0 when not, -EPROTO for a cut that would
 * split a position's bytes unevenly.
 */
static int slot_take(const struct ts_batch_meta *m, uint32_t npos, const uint64_t *want,
		     const uint64_t *got, const uint64_t *off, uint64_t *take)
{
	uint64_t avail0 = m->len[0] - off[0];
	bool ends = want[0] - got[0] >= avail0;

	take[0] = ends ? avail0 : want[0] - got[0];
	for (uint32_t p = 1; p < npos; p++) {
		if (ends) {
			take[p] = m->len[p] - off[p];
		} else {
			u128 t = (u128)take[0] * m->len[p];
			if (t % m->len[0])
				return -EPROTO;
			take[p] = (uint64_t)(t / m->len[0]);
		}
		if (take[p] > want[p] - got[p] || take[p] > m->len[p] - off[p])
			return -EPROTO;
	}
	return ends;
}

static void add_ranges(struct ts_read *out, const struct ts_batch_meta *m, uint64_t seq,
		       uint32_t d, unsigned writer, const uint64_t *off, const uint64_t *take)
{
	uint32_t k = out->nranges++;
	for (uint32_t p = 0; p < out->npos; p++) {
		out->r[p][k] = (struct ts_range){
			.seq = seq, .slot = (uint32_t)(seq % d), .writer = writer, .tag = m->tag,
			.off = off[p], .len = take[p], .slot_len = m->len[p],
		};
		out->got[p] += take[p];
	}
}

int ts_ring_peek(struct ts_segment *seg, struct ts_ring_reader *r, uint32_t npos,
		 const uint64_t *want, struct ts_read *out, uint64_t timeout_ns)
{
	uint64_t off[TS_MAX_POSITIONS], take[TS_MAX_POSITIONS];
	uint32_t d;
	int ret;

	if (!member_ok(r->self) || npos < 1 || npos > TS_MAX_POSITIONS || want[0] == 0)
		return -EINVAL;
	if ((ret = ring_depth(seg, &d)))
		return ret;
	if (evicted(seg, r))
		return -ESTALE;

	out->npos = npos;
	out->end_of_epoch = 0;
	out->nranges = 0;
	memset(out->got, 0, sizeof(out->got));
	memcpy(off, r->off, sizeof(off));
	uint64_t seq = r->seq, deadline = deadline_after(timeout_ns);
	uint64_t was = atomic_load_explicit(&seg->producer, memory_order_acquire);

	while (out->got[0] < want[0] && out->nranges < TS_READ_MAX_RANGES) {
		/* read the counter before looking: a publish in between makes the wait return */
		uint32_t ev = atomic_load_explicit(&seg->ring.pub_ev, memory_order_acquire);
		struct ts_batch_meta m;
		unsigned writer;

		bool elected = elected_meanwhile(seg, r, was);
		ret = read_slot(seg, r, d, seq, &m, &writer);
		if (ret == -EAGAIN) {
			if (out->nranges)
				break;
			if (elected)
				return -ETIMEDOUT; /* the caller produces now */
			if ((ret = wait_slice(&seg->ring.pub_ev, ev, deadline)))
				return ret;
			if (evicted(seg, r))
				return -ESTALE;
			continue;
		}
		if (ret)
			return ret;
		if ((ret = check_shape(&m, npos, want, off)))
			return ret;
		int ends = slot_take(&m, npos, want, out->got, off, take);
		if (ends < 0)
			return ends;
		add_ranges(out, &m, seq, d, writer, off, take);
		if (!ends)
			break;
		if (m.flags & TS_BATCH_END_OF_EPOCH) {
			/* a consumer batch never spans epochs: the next peek starts the next one */
			out->end_of_epoch = 1;
			break;
		}
		seq++;
		memset(off, 0, sizeof(off));
	}
	return 0;
}

/* Position after consuming got[] of rd's ranges: seq/off, and slots fully passed. */
static int advance_to(const struct ts_read *rd, const uint64_t *got, uint64_t *seq, uint64_t *off,
		      uint64_t *passed)
{
	uint64_t left[TS_MAX_POSITIONS];
	uint32_t npos = rd->npos;

	memcpy(left, got, npos * sizeof(*left));
	for (uint32_t k = 0; left[0] > 0; k++) {
		if (k >= rd->nranges)
			return -EINVAL;
		const struct ts_range *r0 = &rd->r[0][k];
		if (r0->len == 0 || r0->off + r0->len > r0->slot_len)
			return -EINVAL;
		uint64_t c0 = min_u64(left[0], r0->len);
		bool whole = c0 == r0->len;
		for (uint32_t p = 0; p < npos; p++) {
			const struct ts_range *rp = &rd->r[p][k];
			u128 t = (u128)c0 * rp->len;
			if (!whole && t % r0->len)
				return -EINVAL;
			uint64_t c = whole ? rp->len : (uint64_t)(t / r0->len);
			if (c > left[p])
				return -EINVAL;
			left[p] -= c;
			off[p] = rp->off + c;
		}
		*seq = r0->seq;
		if (whole && r0->off + r0->len == r0->slot_len) {
			*seq = r0->seq + 1;
			memset(off, 0, TS_MAX_POSITIONS * sizeof(*off));
			++*passed;
		}
	}
	for (uint32_t p = 0; p < npos; p++)
		if (left[p])
			return -EINVAL;
	return 0;
}

int ts_ring_advance(struct ts_segment *seg, struct ts_ring_reader *r, const struct ts_read *rd,
		    const uint64_t *got)
{
	uint64_t off[TS_MAX_POSITIONS], seq = r->seq, passed = 0;
	uint32_t npos = rd->npos;
	int ret;

	if (!member_ok(r->self) || npos < 1 || npos > TS_MAX_POSITIONS ||
	    rd->nranges > TS_READ_MAX_RANGES)
		return -EINVAL;
	for (uint32_t p = 0; p < npos; p++)
		if (got[p] > rd->got[p] || (u128)got[p] * rd->got[0] != (u128)got[0] * rd->got[p])
			return -EINVAL;
	if (rd->nranges) {
		for (uint32_t p = 0; p < npos; p++)
			if (rd->r[p][0].seq != r->seq || rd->r[p][0].off != r->off[p])
				return -EINVAL; /* not a read from where we are */
	} else if (got[0]) {
		return -EINVAL;
	}
	memcpy(off, r->off, sizeof(off));
	if ((ret = advance_to(rd, got, &seq, off, &passed)))
		return ret;

	/*
	 * acquire fence: the caller's copy of the bytes happens before this
	 * check. Still attached here means the producer had not reclaimed our
	 * slots while we copied (it evicts before it reuses).
	 */
	atomic_thread_fence(memory_order_acquire);
	if (evicted(seg, r))
		return -ESTALE;
	r->seq = seq;
	memcpy(r->off, off, sizeof(off));
	if (!passed)
		return 0;
	struct ts_member *mb = reader_member(seg, r);
	/* release: our reads of the passed slots happen before the producer reuses them */
	atomic_store_explicit(&mb->read_seq, seq, memory_order_release);
	atomic_fetch_add_explicit(&mb->batches_read, passed, memory_order_relaxed);
	bump_wake(&seg->ring.rel_ev);
	return 0;
}

int ts_ring_slot_meta(struct ts_segment *seg, uint64_t seq, struct ts_batch_meta *m, unsigned *writer)
{
	uint32_t d;
	int ret;

	if ((ret = ring_depth(seg, &d)))
		return ret;
	if ((ret = read_slot(seg, NULL, d, seq, m, writer)))
		return ret;
	return ts_batch_meta_valid(m) ? -EBADMSG : 0;
}

int ts_ring_wait_next(struct ts_segment *seg, struct ts_ring_reader *r, uint64_t timeout_ns,
		      struct ts_batch_meta *m, unsigned *writer)
{
	uint64_t deadline = deadline_after(timeout_ns);
	uint32_t d;
	int ret;

	if (!member_ok(r->self))
		return -EINVAL;
	if ((ret = ring_depth(seg, &d)))
		return ret;
	uint64_t was = atomic_load_explicit(&seg->producer, memory_order_acquire);
	for (;;) {
		uint32_t ev = atomic_load_explicit(&seg->ring.pub_ev, memory_order_acquire);
		if (evicted(seg, r))
			return -ESTALE;
		bool elected = elected_meanwhile(seg, r, was);
		ret = read_slot(seg, r, d, r->seq, m, writer);
		if (ret == 0)
			return ts_batch_meta_valid(m) ? -EBADMSG : 0;
		if (ret != -EAGAIN)
			return ret;
		if (elected)
			return -ETIMEDOUT;
		if ((ret = wait_slice(&seg->ring.pub_ev, ev, deadline)))
			return ret;
	}
}

/* Evict the laggards holding the slot the writer's next begin() needs; with
 * away_min_ns, only those away that long (0: all of them). */
static int evict_holding(struct ts_segment *seg, const struct ts_ring_writer *w, uint64_t away_min_ns)
{
	uint32_t d;
	int ret, n = 0;

	if ((ret = ring_depth(seg, &d)))
		return ret;
	if (w->next_seq + 1 <= d)
		return 0;
	uint64_t need = w->next_seq + 1 - d, now = ts_now_ns();
	for (unsigned m = 0; m < TS_MAX_MEMBERS; m++) {
		struct ts_member *mb = &seg->members[m];
		uint64_t a = atomic_load_explicit(&mb->attach, memory_order_seq_cst);
		if ((int)m == w->self || !(a & 1) ||
		    atomic_load_explicit(&mb->read_seq, memory_order_acquire) >= need)
			continue;
		if (away_min_ns) {
			/* from shared memory: a bogus time only makes its writer lose its place */
			uint64_t since = atomic_load_explicit(&mb->away_ns, memory_order_acquire);
			if (!since || now < since || now - since < away_min_ns)
				continue;
		}
		n += evict(seg, mb, &a);
	}
	return n;
}

int ts_ring_evict_laggards(struct ts_segment *seg, const struct ts_ring_writer *w)
{
	return evict_holding(seg, w, 0);
}

int ts_ring_evict_away(struct ts_segment *seg, const struct ts_ring_writer *w, uint64_t min_ns)
{
	return evict_holding(seg, w, min_ns ? min_ns : 1);
}
