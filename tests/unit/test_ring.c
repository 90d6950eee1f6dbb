/* SPDX-License-Identifier: MIT */
/*
 * Ring bookkeeping, in process: a segment image in calloc'd memory, fake
 * time and liveness through ts_prim. The byte streams are checked through
 * the ranges: a batch's tag is the stream index of its first sample, so
 * every range maps back to stream offsets.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "prim.h"
#include "ring.h"
#include "session.h"

#define PID0  4000u
#define NMEM  8
#define MS    1000000ull

/* Stream used by most tests: 64-sample producer batches. */
#define S0    (3 * 8 * 8 * 4)
#define S1    8
static const uint64_t S[2] = { S0, S1 };

static struct ts_segment *seg;
static _Atomic uint64_t skew;                 /* added to the real monotonic clock */
static _Atomic int dead[TS_MAX_MEMBERS];      /* fake: member's process is gone */
static struct ts_prim_ops saved_prim;

/*
 * One shot: the clock read that brings the countdown to 0 first runs
 * on_clock (when set; its own clock reads do nothing), then installs this
 * producer word.
 */
static _Atomic uint64_t on_clock_producer;
static _Atomic int clock_countdown;
static void (*on_clock)(void);

/* Every clock read, while set: a peer that acts as often as we look. */
static void (*every_clock)(void);
/* Every liveness look at a member, while set. */
static void (*every_start)(uint32_t pid);

static uint64_t fake_now(void)
{
	if (every_clock)
		every_clock();
	if (atomic_load(&clock_countdown) > 0 && atomic_fetch_sub(&clock_countdown, 1) == 1) {
		if (on_clock)
			on_clock();
		atomic_store(&seg->producer, atomic_load(&on_clock_producer));
	}
	return ts_prim_monotonic_ns() + atomic_load(&skew);
}

static int fake_start(uint32_t pid, uint64_t *out)
{
	if (every_start)
		every_start(pid);
	if (pid < PID0 || pid >= PID0 + TS_MAX_MEMBERS || atomic_load(&dead[pid - PID0]))
		return -ESRCH;
	*out = 1000 + (pid - PID0);
	return 0;
}

static void beat(int k)
{
	atomic_store(&seg->members[k].heartbeat_ns, fake_now());
}

static void make_seg(uint32_t depth)
{
	free(seg);
	seg = calloc(1, sizeof(*seg));
	cr_assert(seg);
	ts_segment_init(seg, sizeof(*seg), "t", getuid(),
			&(struct ts_session_params){ .depth = depth, .timeout_ms = 1000 });
	for (int k = 0; k < NMEM; k++) {
		atomic_store(&seg->members[k].pid, PID0 + k);
		atomic_store(&seg->members[k].start_time, 1000 + k);
		beat(k);
	}
	atomic_store(&seg->producer, ts_producer_word(1, 0));
}

static void setup(void)
{
	saved_prim = ts_prim;
	ts_prim.now_ns = fake_now;
	ts_prim.proc_start_time = fake_start;
	make_seg(4);
}

static void teardown(void)
{
	on_clock = NULL;
	every_clock = NULL;
	every_start = NULL;
	ts_prim = saved_prim;
	free(seg);
	seg = NULL;
}

TestSuite(ring, .init = setup, .fini = teardown, .timeout = 30);

/* ---- helpers ------------------------------------------------------------ */

/* Publish n samples of the S stream starting at stream sample `first`. */
static int produce_s(struct ts_ring_writer *w, const uint64_t *sz, uint64_t first, uint64_t n,
		     uint32_t flags, uint64_t timeout_ns)
{
	struct ts_batch_meta *m;
	int ret = ts_ring_begin(seg, w, timeout_ns, &m);
	if (ret)
		return ret;
	m->npos = 2;
	m->flags = flags;
	m->nsamples = n;
	m->len[0] = n * sz[0];
	m->len[1] = n * sz[1];
	m->tag = first;
	return ts_ring_publish(seg, w);
}

static int produce(struct ts_ring_writer *w, uint64_t first, uint64_t n, uint32_t flags, uint64_t timeout_ns)
{
	return produce_s(w, S, first, n, flags, timeout_ns);
}

static int peek_samples(struct ts_ring_reader *r, uint64_t samples, struct ts_read *rd, uint64_t timeout_ns)
{
	uint64_t want[2] = { samples * S0, samples * S1 };
	return ts_ring_peek(seg, r, 2, want, rd, timeout_ns);
}

/*
 * Check a read against the stream: contiguous from sample `next`, whole
 * samples, positions paired range by range. 0 or -1 with `why`.
 */
static int verify_read(const struct ts_read *rd, const uint64_t *sz, uint64_t next, uint64_t *samples,
		       char *why, size_t n)
{
#define FAIL(...) do { snprintf(why, n, __VA_ARGS__); return -1; } while (0)
	if (rd->npos != 2 || rd->nranges == 0 || rd->nranges > TS_READ_MAX_RANGES)
		FAIL("npos %u nranges %u", rd->npos, rd->nranges);
	if (rd->got[0] == 0 || rd->got[0] % sz[0])
		FAIL("got[0] %llu not whole samples", (unsigned long long)rd->got[0]);
	uint64_t k = rd->got[0] / sz[0];
	if (rd->got[1] != k * sz[1])
		FAIL("unpaired: got %llu/%llu", (unsigned long long)rd->got[0], (unsigned long long)rd->got[1]);
	uint64_t pos[2] = { next * sz[0], next * sz[1] };
	for (uint32_t i = 0; i < rd->nranges; i++) {
		const struct ts_range *g0 = &rd->r[0][i];
		for (int p = 0; p < 2; p++) {
			const struct ts_range *g = &rd->r[p][i];
			if (g->seq != g0->seq || g->tag != g0->tag || g->writer != g0->writer || g->slot != g0->slot)
				FAIL("range %u: positions disagree on the slot", i);
			if (g->tag * sz[p] + g->off != pos[p])
				FAIL("range %u pos %d: stream offset %llu, expected %llu (seq %llu)", i, p,
				     (unsigned long long)(g->tag * sz[p] + g->off), (unsigned long long)pos[p],
				     (unsigned long long)g->seq);
			if (g->off % sz[p] || g->len % sz[p] || g->len == 0)
				FAIL("range %u pos %d cuts a sample", i, p);
			if (g->len / sz[p] != g0->len / sz[0])
				FAIL("range %u: unpaired", i);
			if (g->off + g->len > g->slot_len)
				FAIL("range %u beyond its slot", i);
			pos[p] += g->len;
		}
		if (i && g0->seq != rd->r[0][i - 1].seq + 1)
			FAIL("range %u: seq %llu does not follow", i, (unsigned long long)g0->seq);
	}
	*samples = k;
	return 0;
#undef FAIL
}

struct batch_rec {
	uint64_t n;
	int eoe;
};

/* A consumer that gathers batches of B samples, one peek/advance at a time. */
struct cons {
	struct ts_ring_reader r;
	uint64_t B, next, have, nbatches;
	uint32_t max_ranges;
	struct batch_rec *rec;
	uint64_t maxrec;
};

static int cons_step(struct cons *c, struct ts_read *rd, uint64_t timeout_ns)
{
	char why[256];
	uint64_t n;
	int ret = peek_samples(&c->r, c->B - c->have, rd, timeout_ns);
	if (ret)
		return ret;
	cr_assert_eq(verify_read(rd, S, c->next, &n, why, sizeof(why)), 0, "%s", why);
	cr_assert_leq(n, c->B - c->have);
	cr_assert_eq(ts_ring_advance(seg, &c->r, rd, rd->got), 0);
	if (rd->nranges > c->max_ranges)
		c->max_ranges = rd->nranges;
	c->next += n;
	c->have += n;
	if (c->have == c->B || rd->end_of_epoch) {
		cr_assert_lt(c->nbatches, c->maxrec);
		c->rec[c->nbatches++] = (struct batch_rec){ c->have, rd->end_of_epoch };
		c->have = 0;
	}
	return 0;
}

/*
 * One producer (member 0) and one consumer (member 1) interleaved in this
 * thread: publish while the ring has room, then one consumer step.
 */
static void drive(uint32_t depth, const uint64_t *bsz, const uint32_t *bfl, uint64_t nb, struct cons *c)
{
	static struct ts_read rd;
	struct ts_ring_writer w;
	uint64_t b = 0, first = 0, total = 0;

	for (uint64_t i = 0; i < nb; i++)
		total += bsz[i];
	make_seg(depth);
	cr_assert_eq(ts_ring_writer_init(seg, 0, &w), 0);
	cr_assert_eq(ts_ring_attach(seg, 1, &c->r), 0);
	for (int idle = 0; c->next < total; ) {
		int progress = 0, ret = 0;
		while (b < nb && (ret = produce(&w, first, bsz[b], bfl[b], 0)) == 0) {
			first += bsz[b++];
			progress = 1;
		}
		if (b < nb)
			cr_assert_eq(ret, -ETIMEDOUT);
		ret = cons_step(c, &rd, 0);
		if (ret == 0)
			progress = 1;
		else
			cr_assert_eq(ret, -ETIMEDOUT);
		idle = progress ? 0 : idle + 1;
		cr_assert_lt(idle, 3, "no progress at sample %llu", (unsigned long long)c->next);
	}
	cr_assert_eq(c->next, total);
	cr_assert_eq(atomic_load(&seg->ring.pub_seq), nb);
}

/* ---- stream slicing ------------------------------------------------------ */

static void slicing_case(uint32_t depth, uint64_t B)
{
	enum { NB = 150 };
	uint64_t bsz[NB];
	uint32_t bfl[NB] = { 0 };
	struct batch_rec rec[NB * 64 + 1];
	struct cons c = { .B = B, .rec = rec, .maxrec = NB * 64 + 1 };

	for (int i = 0; i < NB; i++)
		bsz[i] = 64;
	bfl[NB - 1] = TS_BATCH_END_OF_EPOCH;
	drive(depth, bsz, bfl, NB, &c);

	uint64_t total = NB * 64, full = total / B, rest = total % B;
	cr_assert_eq(c.nbatches, full + (rest != 0), "B=%llu: %llu batches", (unsigned long long)B,
		     (unsigned long long)c.nbatches);
	for (uint64_t i = 0; i < c.nbatches; i++) {
		int last = i == c.nbatches - 1;
		cr_assert_eq(rec[i].n, last && rest ? rest : B, "B=%llu batch %llu: %llu samples",
			     (unsigned long long)B, (unsigned long long)i, (unsigned long long)rec[i].n);
		cr_assert_eq(rec[i].eoe, last);
	}
	cr_assert_eq(atomic_load(&seg->members[1].read_seq), NB);
	cr_assert_eq(atomic_load(&seg->members[1].batches_read), NB);
	if (B > depth * 64u)
		cr_assert_eq(c.max_ranges, depth, "a big batch reads the whole ring at once");
}

Test(ring, slicing_batch_1) { slicing_case(4, 1); }
Test(ring, slicing_batch_48) { slicing_case(4, 48); }
Test(ring, slicing_batch_64) { slicing_case(4, 64); }
Test(ring, slicing_batch_100) { slicing_case(4, 100); }
Test(ring, slicing_batch_bigger_than_ring) { slicing_case(4, 4 * 64 + 37); }
Test(ring, slicing_depth_1) { slicing_case(1, 100); }
Test(ring, slicing_depth_max) { slicing_case(TS_MAX_DEPTH, 4000); }

/* Exact ranges of one read that spans slots and starts mid-slot. */
Test(ring, ranges_exact)
{
	struct ts_ring_writer w;
	struct ts_ring_reader r;
	static struct ts_read rd;

	cr_assert_eq(ts_ring_writer_init(seg, 0, &w), 0);
	cr_assert_eq(ts_ring_attach(seg, 1, &r), 0);
	for (int i = 0; i < 3; i++)
		cr_assert_eq(produce(&w, 64u * i, 64, 0, 0), 0);
	cr_assert_eq(peek_samples(&r, 10, &rd, 0), 0);
	cr_assert_eq(ts_ring_advance(seg, &r, &rd, rd.got), 0);
	cr_assert_eq(r.seq, 0);
	cr_assert_eq(r.off[0], 10 * S0);
	cr_assert_eq(r.off[1], 10 * S1);

	cr_assert_eq(peek_samples(&r, 100, &rd, 0), 0);
	cr_assert_eq(rd.nranges, 2);
	cr_assert_eq(rd.got[0], 100 * S0);
	cr_assert_eq(rd.got[1], 100 * S1);
	const struct ts_range *a = &rd.r[1][0], *b = &rd.r[1][1];
	cr_assert(a->seq == 0 && a->slot == 0 && a->writer == 0 && a->tag == 0);
	cr_assert(a->off == 10 * S1 && a->len == 54 * S1 && a->slot_len == 64 * S1);
	cr_assert(b->seq == 1 && b->slot == 1 && b->tag == 64 && b->off == 0 && b->len == 46 * S1);
	cr_assert(rd.r[0][1].off == 0 && rd.r[0][1].len == 46 * S0);
	cr_assert_eq(rd.end_of_epoch, 0);
	/* peek consumes nothing */
	cr_assert_eq(r.seq, 0);
	cr_assert_eq(atomic_load(&seg->members[1].read_seq), 0);

	/* consume part of it: 30 samples, all from slot 0's 54 */
	uint64_t got[2] = { 30 * S0, 30 * S1 };
	cr_assert_eq(ts_ring_advance(seg, &r, &rd, got), 0);
	cr_assert(r.seq == 0 && r.off[0] == 40 * S0 && r.off[1] == 40 * S1);
	/* rd no longer starts where we are */
	cr_assert_eq(ts_ring_advance(seg, &r, &rd, got), -EINVAL);

	/* the rest of slot 0 plus 6 of slot 1 */
	cr_assert_eq(peek_samples(&r, 30, &rd, 0), 0);
	cr_assert_eq(ts_ring_advance(seg, &r, &rd, rd.got), 0);
	cr_assert(r.seq == 1 && r.off[0] == 6 * S0 && r.off[1] == 6 * S1);
	cr_assert_eq(atomic_load(&seg->members[1].read_seq), 1);
	cr_assert_eq(atomic_load(&seg->members[1].batches_read), 1);
}

/* ---- epochs --------------------------------------------------------------- */

static void epoch_case(uint64_t B, const struct batch_rec *expect, uint64_t nexpect)
{
	static const uint64_t bsz[] = { 64, 64, 20, 64, 64, 20 };
	static const uint32_t bfl[] = { 0, 0, TS_BATCH_END_OF_EPOCH, 0, 0, TS_BATCH_END_OF_EPOCH };
	struct batch_rec rec[32];
	struct cons c = { .B = B, .rec = rec, .maxrec = 32 };

	drive(4, bsz, bfl, 6, &c);
	cr_assert_eq(c.nbatches, nexpect, "B=%llu: %llu batches", (unsigned long long)B,
		     (unsigned long long)c.nbatches);
	for (uint64_t i = 0; i < nexpect; i++)
		cr_assert(rec[i].n == expect[i].n && rec[i].eoe == expect[i].eoe,
			  "B=%llu batch %llu: %llu samples eoe %d, expected %llu eoe %d",
			  (unsigned long long)B, (unsigned long long)i, (unsigned long long)rec[i].n,
			  rec[i].eoe, (unsigned long long)expect[i].n, expect[i].eoe);
}

Test(ring, partial_last_batch)
{
	static const struct batch_rec b48[] = { { 48, 0 }, { 48, 0 }, { 48, 0 }, { 4, 1 },
						{ 48, 0 }, { 48, 0 }, { 48, 0 }, { 4, 1 } };
	static const struct batch_rec b64[] = { { 64, 0 }, { 64, 0 }, { 20, 1 },
						{ 64, 0 }, { 64, 0 }, { 20, 1 } };
	static const struct batch_rec b200[] = { { 148, 1 }, { 148, 1 } };
	static const struct batch_rec b1000[] = { { 148, 1 }, { 148, 1 } };
	epoch_case(48, b48, 8);
	epoch_case(64, b64, 6);
	epoch_case(200, b200, 2);
	epoch_case(1000, b1000, 2);
}

/* ---- protocol errors ------------------------------------------------------ */

Test(ring, protocol_errors)
{
	struct ts_ring_writer w;
	struct ts_ring_reader r;
	static struct ts_read rd;

	cr_assert_eq(ts_ring_writer_init(seg, 0, &w), 0);
	cr_assert_eq(ts_ring_attach(seg, 1, &r), 0);
	cr_assert_eq(produce(&w, 0, 64, 0, 0), 0);

	uint64_t bad[2] = { 48 * S0, 48 * S1 + 1 };
	cr_assert_eq(ts_ring_peek(seg, &r, 2, bad, &rd, 0), -EPROTO);
	uint64_t one[3] = { 48 * S0, 48 * S1, 8 };
	cr_assert_eq(ts_ring_peek(seg, &r, 1, one, &rd, 0), -EPROTO);
	cr_assert_eq(ts_ring_peek(seg, &r, 3, one, &rd, 0), -EPROTO);
	uint64_t zero[2] = { 0, 0 };
	cr_assert_eq(ts_ring_peek(seg, &r, 2, zero, &rd, 0), -EINVAL);
	cr_assert_eq(ts_ring_peek(seg, &r, 0, one, &rd, 0), -EINVAL);
	cr_assert_eq(ts_ring_peek(seg, &r, TS_MAX_POSITIONS + 1, one, &rd, 0), -EINVAL);

	/* a reader cut in the middle of a sample (position 0 ahead of position 1) */
	struct ts_ring_reader cut = r;
	cut.off[0] = 1;
	cr_assert_eq(peek_samples(&cut, 1, &rd, 0), -EPROTO);

	/* advance: more than peeked, or not proportional */
	cr_assert_eq(peek_samples(&r, 10, &rd, 0), 0);
	uint64_t more[2] = { 11 * S0, 11 * S1 }, skew_got[2] = { 5 * S0, 4 * S1 };
	cr_assert_eq(ts_ring_advance(seg, &r, &rd, more), -EINVAL);
	cr_assert_eq(ts_ring_advance(seg, &r, &rd, skew_got), -EINVAL);
	cr_assert_eq(r.seq, 0);
	cr_assert_eq(r.off[0], 0);

	/* a slot whose sizes are not in the same ratio as the ones before */
	static const uint64_t other[2] = { S0, S1 * 2 };
	cr_assert_eq(produce_s(&w, other, 64, 64, 0, 0), 0);
	cr_assert_eq(peek_samples(&r, 64, &rd, 0), 0); /* slot 0 alone is fine */
	cr_assert_eq(peek_samples(&r, 65, &rd, 0), -EPROTO);

	/* the reader was left untouched by all of it */
	cr_assert_eq(peek_samples(&r, 64, &rd, 0), 0);
	cr_assert_eq(ts_ring_advance(seg, &r, &rd, rd.got), 0);
	cr_assert_eq(r.seq, 1);
}

Test(ring, meta_validation)
{
	struct ts_batch_meta m = { .npos = 2, .len = { 64, 8 }, .nsamples = 8 };
	cr_assert_eq(ts_batch_meta_valid(&m), 0);
	m.npos = 0;
	cr_assert_eq(ts_batch_meta_valid(&m), -EBADMSG);
	m.npos = TS_MAX_POSITIONS + 1;
	cr_assert_eq(ts_batch_meta_valid(&m), -EBADMSG);
	m.npos = 2;
	m.len[0] = 0;
	cr_assert_eq(ts_batch_meta_valid(&m), -EBADMSG);
	m.len[0] = 64;
	m.len[1] = 1ull << 48;
	cr_assert_eq(ts_batch_meta_valid(&m), -EBADMSG);
	m.len[1] = 0; /* an empty position is fine */
	cr_assert_eq(ts_batch_meta_valid(&m), 0);
	m.flags = 2;
	cr_assert_eq(ts_batch_meta_valid(&m), -EBADMSG);
	m.flags = TS_BATCH_END_OF_EPOCH;
	cr_assert_eq(ts_batch_meta_valid(&m), 0);
}

/* publish() refuses an invalid row; abort() puts the slot back as it was. */
Test(ring, invalid_publish_and_abort)
{
	struct ts_ring_writer w;
	struct ts_batch_meta *m;

	cr_assert_eq(ts_ring_writer_init(seg, 0, &w), 0);
	uint64_t before = atomic_load(&seg->ring.slots[0].word);
	cr_assert_eq(ts_ring_begin(seg, &w, 0, &m), 0);
	cr_assert_eq(ts_ring_begin(seg, &w, 0, &m), -EBUSY);
	cr_assert_eq(ts_slot_state(atomic_load(&seg->ring.slots[0].word)), TS_SLOT_WRITING);
	m->npos = 0;
	cr_assert_eq(ts_ring_publish(seg, &w), -EINVAL);
	cr_assert_eq(ts_slot_state(atomic_load(&seg->ring.slots[0].word)), TS_SLOT_WRITING);
	cr_assert_eq(ts_ring_abort(seg, &w), 0);
	cr_assert_eq(atomic_load(&seg->ring.slots[0].word), before);
	cr_assert_eq(ts_ring_abort(seg, &w), -EINVAL);
	cr_assert_eq(atomic_load(&seg->ring.pub_seq), 0);
	/* the same seq is claimed again */
	cr_assert_eq(produce(&w, 0, 64, 0, 0), 0);
	cr_assert_eq(atomic_load(&seg->ring.slots[0].word), ts_slot_word(TS_SLOT_PUBLISHED, 1, 1, 0));
	cr_assert_eq(atomic_load(&seg->ring.pub_seq), 1);
}

/* ---- backpressure and attachment ---------------------------------------- */

Test(ring, backpressure)
{
	struct ts_ring_writer w;
	struct ts_ring_reader r, late;
	static struct ts_read rd;
	struct ts_batch_meta *m;

	cr_assert_eq(ts_ring_writer_init(seg, 0, &w), 0);
	cr_assert_eq(ts_ring_attach(seg, 1, &r), 0);
	/* member 2 is live but never attached: it never holds the producer */
	for (int i = 0; i < 4; i++)
		cr_assert_eq(produce(&w, 64u * i, 64, 0, 0), 0);

	uint64_t slot0 = atomic_load(&seg->ring.slots[0].word), t0 = ts_prim_monotonic_ns();
	cr_assert_eq(ts_ring_begin(seg, &w, 30 * MS, &m), -ETIMEDOUT);
	uint64_t dt = ts_prim_monotonic_ns() - t0;
	cr_assert(dt >= 30 * MS && dt < 900 * MS, "waited %llu ns", (unsigned long long)dt);
	cr_assert_eq(atomic_load(&seg->ring.slots[0].word), slot0, "a timed-out begin claims nothing");
	cr_assert_eq(w.claimed, 0);
	cr_assert_eq(atomic_load(&seg->counters.evictions), 0);

	/* consuming only part of slot 0 releases nothing */
	cr_assert_eq(peek_samples(&r, 63, &rd, 0), 0);
	cr_assert_eq(ts_ring_advance(seg, &r, &rd, rd.got), 0);
	cr_assert_eq(ts_ring_begin(seg, &w, 0, &m), -ETIMEDOUT);
	cr_assert_eq(peek_samples(&r, 1, &rd, 0), 0);
	cr_assert_eq(ts_ring_advance(seg, &r, &rd, rd.got), 0);
	cr_assert_eq(produce(&w, 256, 64, 0, 0), 0);
	cr_assert_eq(atomic_load(&seg->members[2].attach), 0);
	cr_assert_eq(ts_member_health(seg, 2, fake_now()), TS_MEMBER_LIVE);

	/* a late joiner starts at the head: none of seqs 0..4 */
	cr_assert_eq(ts_ring_attach(seg, 3, &late), 0);
	cr_assert_eq(late.seq, 5);
	cr_assert_eq(peek_samples(&late, 1, &rd, 0), -ETIMEDOUT);
	cr_assert_eq(ts_ring_begin(seg, &w, 0, &m), -ETIMEDOUT); /* seq 5 needs r past 1 */
	cr_assert_eq(peek_samples(&r, 64, &rd, 0), 0);
	cr_assert_eq(ts_ring_advance(seg, &r, &rd, rd.got), 0);
	cr_assert_eq(produce(&w, 320, 64, 0, 0), 0);
	cr_assert_eq(peek_samples(&late, 1000, &rd, 0), 0);
	cr_assert(rd.nranges == 1 && rd.r[0][0].seq == 5 && rd.r[0][0].tag == 320 && rd.r[0][0].off == 0);

	/* now both hold: the joiner at 5, r at 2 */
	cr_assert_eq(ts_ring_begin(seg, &w, 0, &m), -ETIMEDOUT);
	cr_assert_eq(peek_samples(&r, 64, &rd, 0), 0);
	cr_assert_eq(ts_ring_advance(seg, &r, &rd, rd.got), 0);
	cr_assert_eq(produce(&w, 384, 64, 0, 0), 0); /* seq 6 needs read_seq >= 3 */
	cr_assert_eq(atomic_load(&seg->members[1].read_seq), 3);
	cr_assert_eq(atomic_load(&seg->members[3].read_seq), 5);
	/* detach releases everything */
	cr_assert_eq(ts_ring_detach(seg, &r), 0);
	cr_assert_eq(produce(&w, 448, 64, 0, 0), 0); /* seq 7: needs 4 of r: detached */
	cr_assert_eq(produce(&w, 512, 64, 0, 0), 0); /* seq 8: needs 5 of the joiner */
	cr_assert_eq(ts_ring_begin(seg, &w, 0, &m), -ETIMEDOUT); /* seq 9: needs 6 */
	cr_assert_eq(atomic_load(&seg->counters.evictions), 0);
	cr_assert_eq(peek_samples(&r, 1, &rd, 0), -ESTALE);
}

/* The producer waits for real and wakes when the consumer releases. */
static void *release_later(void *arg)
{
	struct ts_ring_reader *r = arg;
	static struct ts_read rd;
	ts_sleep_ns(20 * MS);
	if (peek_samples(r, 64, &rd, 0) || ts_ring_advance(seg, r, &rd, rd.got))
		return (void *)1;
	return NULL;
}

Test(ring, backpressure_wakeup)
{
	struct ts_ring_writer w;
	struct ts_ring_reader r;
	pthread_t t;
	void *res;

	cr_assert_eq(ts_ring_writer_init(seg, 0, &w), 0);
	cr_assert_eq(ts_ring_attach(seg, 1, &r), 0);
	for (int i = 0; i < 4; i++)
		cr_assert_eq(produce(&w, 64u * i, 64, 0, 0), 0);
	cr_assert_eq(pthread_create(&t, NULL, release_later, &r), 0);
	uint64_t t0 = ts_prim_monotonic_ns();
	cr_assert_eq(produce(&w, 256, 64, 0, 2000 * MS), 0);
	uint64_t dt = ts_prim_monotonic_ns() - t0;
	pthread_join(t, &res);
	cr_assert_null(res);
	cr_assert(dt >= 15 * MS && dt < 1000 * MS, "waited %llu ns", (unsigned long long)dt);
}

static void eviction_case(int how)
{
	struct ts_ring_writer w;
	struct ts_ring_reader r;
	static struct ts_read rd;

	cr_assert_eq(ts_ring_writer_init(seg, 0, &w), 0);
	cr_assert_eq(ts_ring_attach(seg, 1, &r), 0);
	cr_assert_eq(ts_ring_attach(seg, 2, &(struct ts_ring_reader){ 0 }), 0);
	for (int i = 0; i < 4; i++)
		cr_assert_eq(produce(&w, 64u * i, 64, 0, 0), 0);
	cr_assert_eq(peek_samples(&r, 10, &rd, 0), 0);

	uint64_t a = atomic_load(&seg->members[1].attach);
	if (how == 0) {
		atomic_store(&dead[1], 1);
		atomic_store(&dead[2], 1);
	} else {
		atomic_store(&skew, 10500 * MS); /* everybody silent for longer than the stall time */
	}
	uint64_t t0 = ts_prim_monotonic_ns();
	cr_assert_eq(produce(&w, 256, 64, 0, 1000 * MS), 0);
	cr_assert_lt(ts_prim_monotonic_ns() - t0, 500 * MS, "evicting must not wait");
	cr_assert_eq(atomic_load(&seg->counters.evictions), 2);
	uint64_t b = atomic_load(&seg->members[1].attach);
	cr_assert_eq(b & 1, 0);
	cr_assert_neq(b >> 1, a >> 1, "eviction is a new generation");

	/* the evicted reader notices, whatever it was doing */
	cr_assert_eq(ts_ring_advance(seg, &r, &rd, rd.got), -ESTALE);
	cr_assert_eq(peek_samples(&r, 10, &rd, 0), -ESTALE);

	/* alive again, it re-attaches at the head and reads on */
	atomic_store(&dead[1], 0);
	atomic_store(&skew, 0);
	beat(1);
	cr_assert_eq(ts_ring_attach(seg, 1, &r), 0);
	cr_assert_eq(r.seq, 5);
	cr_assert_eq(produce(&w, 320, 64, 0, 0), 0);
	cr_assert_eq(peek_samples(&r, 64, &rd, 0), 0);
	cr_assert(rd.r[0][0].seq == 5 && rd.r[0][0].tag == 320);
	cr_assert_eq(ts_ring_advance(seg, &r, &rd, rd.got), 0);
	/* re-attached, it holds the producer again */
	for (int i = 6; i < 10; i++)
		cr_assert_eq(produce(&w, 64u * i, 64, 0, 0), 0);
	cr_assert_eq(produce(&w, 640, 64, 0, 0), -ETIMEDOUT);
}

Test(ring, evict_dead) { eviction_case(0); }

static void *die_later(void *arg)
{
	ts_sleep_ns(30 * MS);
	atomic_store(&dead[1], 1);
	return NULL;
}

/* A consumer that dies while the producer waits on it is noticed within a slice or two. */
Test(ring, evict_while_waiting)
{
	struct ts_ring_writer w;
	struct ts_ring_reader r;
	pthread_t t;

	cr_assert_eq(ts_ring_writer_init(seg, 0, &w), 0);
	cr_assert_eq(ts_ring_attach(seg, 1, &r), 0);
	for (int i = 0; i < 4; i++)
		cr_assert_eq(produce(&w, 64u * i, 64, 0, 0), 0);
	cr_assert_eq(pthread_create(&t, NULL, die_later, NULL), 0);
	uint64_t t0 = ts_prim_monotonic_ns();
	cr_assert_eq(produce(&w, 256, 64, 0, 2000 * MS), 0);
	uint64_t dt = ts_prim_monotonic_ns() - t0;
	pthread_join(t, NULL);
	cr_assert(dt >= 25 * MS && dt < 500 * MS, "waited %llu ns", (unsigned long long)dt);
	cr_assert_eq(atomic_load(&seg->counters.evictions), 1);
}
Test(ring, evict_stale) { eviction_case(1); }

static void *elect_member_1_later(void *arg)
{
	(void)arg;
	ts_sleep_ns(30 * MS);
	atomic_store(&seg->producer, ts_producer_word(2, 1));
	return NULL;
}

/*
 * A reader elected producer while it waits for a batch: only it can publish
 * now, so peek and wait_next give the wait up within a slice (-ETIMEDOUT,
 * the caller then produces) instead of sleeping out their timeout.
 */
static void elected_while_waiting_case(int next)
{
	struct ts_ring_writer w;
	struct ts_ring_reader r;
	static struct ts_read rd;
	struct ts_batch_meta m;
	unsigned writer;
	pthread_t t;

	cr_assert_eq(ts_ring_writer_init(seg, 0, &w), 0);
	cr_assert_eq(produce(&w, 0, 64, 0, 0), 0);
	cr_assert_eq(ts_ring_attach(seg, 1, &r), 0);
	cr_assert_eq(r.seq, 1, "attached at the head");
	cr_assert_eq(pthread_create(&t, NULL, elect_member_1_later, NULL), 0);
	uint64_t t0 = ts_prim_monotonic_ns();
	int ret = next ? ts_ring_wait_next(seg, &r, 5000 * MS, &m, &writer) : peek_samples(&r, 64, &rd, 5000 * MS);
	uint64_t dt = ts_prim_monotonic_ns() - t0;
	pthread_join(t, NULL);
	cr_assert_eq(ret, -ETIMEDOUT);
	cr_assert(dt >= 25 * MS && dt < 1000 * MS, "waited %llu ms for a batch only the reader can publish",
		  (unsigned long long)(dt / MS));
	/* an election of somebody else does not end the wait early */
	atomic_store(&seg->producer, ts_producer_word(3, 2));
	t0 = ts_prim_monotonic_ns();
	ret = next ? ts_ring_wait_next(seg, &r, 60 * MS, &m, &writer) : peek_samples(&r, 64, &rd, 60 * MS);
	cr_assert_eq(ret, -ETIMEDOUT);
	cr_assert_geq(ts_prim_monotonic_ns() - t0, 55 * MS, "a consumer's wait must last its timeout");
}

Test(ring, peek_elected_while_waiting) { elected_while_waiting_case(0); }
Test(ring, wait_next_elected_while_waiting) { elected_while_waiting_case(1); }

static struct ts_ring_writer *last_words_writer;

static void publish_then_leave(void)
{
	cr_assert_eq(produce(last_words_writer, 64, 64, TS_BATCH_END_OF_EPOCH, 0), 0);
}

/*
 * The producer publishes its last batch and leaves, electing the reader,
 * while the reader waits for that batch (both before the reader runs again:
 * on a loaded machine, a slow consumer). The batch is the reader's to read;
 * only after it is there nothing more to wait for. Seen in exact mode: the
 * consumer made its epoch's last batch itself.
 */
static void published_before_election_case(int next)
{
	struct ts_ring_writer w;
	struct ts_ring_reader r;
	static struct ts_read rd;
	struct ts_batch_meta m;
	unsigned writer;

	cr_assert_eq(ts_ring_writer_init(seg, 0, &w), 0);
	cr_assert_eq(produce(&w, 0, 64, 0, 0), 0);
	cr_assert_eq(ts_ring_attach(seg, 1, &r), 0);
	cr_assert_eq(r.seq, 1, "attached at the head");
	/* the wait's clock reads: its deadline, then its first slice, when seq 1 is not there yet */
	last_words_writer = &w;
	on_clock = publish_then_leave;
	atomic_store(&on_clock_producer, ts_producer_word(2, 1));
	atomic_store(&clock_countdown, 2);
	int ret = next ? ts_ring_wait_next(seg, &r, 5000 * MS, &m, &writer) : peek_samples(&r, 64, &rd, 5000 * MS);
	cr_assert_eq(atomic_load(&clock_countdown), 0, "the batch came and the reader was elected inside its wait");
	cr_assert_eq(ret, 0, "the last batch was published before the election: %d", ret);
	if (next)
		cr_assert_eq(m.nsamples, 64);
	else
		cr_assert(rd.r[0][0].seq == 1 && rd.got[0] == 64 * S0 && rd.end_of_epoch);
}

Test(ring, peek_reads_what_came_before_its_election) { published_before_election_case(0); }
Test(ring, wait_next_reads_what_came_before_its_election) { published_before_election_case(1); }

/* Silent for longer than the timeout but not the stall time (a stopped
 * process, a debugger): it keeps its place, the producer waits. */
Test(ring, a_briefly_silent_reader_keeps_its_place)
{
	struct ts_ring_writer w;
	struct ts_ring_reader r;
	static struct ts_read rd;

	cr_assert_eq(ts_ring_writer_init(seg, 0, &w), 0);
	cr_assert_eq(ts_ring_attach(seg, 1, &r), 0);
	for (int i = 0; i < 4; i++)
		cr_assert_eq(produce(&w, 64u * i, 64, 0, 0), 0);
	atomic_store(&skew, 2500 * MS); /* > timeout (1 s), < stall (5 s) */
	cr_assert_eq(produce(&w, 256, 64, 0, 200 * MS), -ETIMEDOUT, "the producer waits");
	cr_assert_eq(atomic_load(&seg->counters.evictions), 0);
	atomic_store(&skew, 0);
	beat(1);
	cr_assert_eq(peek_samples(&r, 64, &rd, 0), 0, "its place is still its own");
	cr_assert(rd.r[0][0].seq == 0 && rd.r[0][0].tag == 0);
}

/* Evicted between peek and advance: the slot was reused under it. */
Test(ring, evicted_while_copying)
{
	struct ts_ring_writer w;
	struct ts_ring_reader r;
	static struct ts_read rd;

	cr_assert_eq(ts_ring_writer_init(seg, 0, &w), 0);
	cr_assert_eq(ts_ring_attach(seg, 1, &r), 0);
	for (int i = 0; i < 4; i++)
		cr_assert_eq(produce(&w, 64u * i, 64, 0, 0), 0);
	cr_assert_eq(peek_samples(&r, 64, &rd, 0), 0);
	atomic_store(&skew, 10500 * MS); /* silent past the stall time */
	cr_assert_eq(produce(&w, 256, 64, 0, 0), 0); /* overwrites slot 0 */
	atomic_store(&skew, 0);
	cr_assert_eq(ts_ring_advance(seg, &r, &rd, rd.got), -ESTALE);
	/* a forged attach word does not make the overrun readable */
	r.attach = atomic_load(&seg->members[1].attach);
	cr_assert_eq(peek_samples(&r, 64, &rd, 0), -ESTALE);
}

/* ---- producer identity ---------------------------------------------------- */

Test(ring, not_producer)
{
	struct ts_ring_writer w;
	struct ts_batch_meta *m;

	cr_assert_eq(ts_ring_writer_init(seg, 1, &w), -EPERM);
	cr_assert_eq(ts_ring_writer_init(seg, -1, &w), -EINVAL);
	cr_assert_eq(ts_ring_writer_init(seg, TS_MAX_MEMBERS, &w), -EINVAL);
	cr_assert_eq(ts_ring_writer_init(seg, 0, &w), 0);
	cr_assert_eq(produce(&w, 0, 64, 0, 0), 0);
	atomic_store(&seg->producer, ts_producer_word(2, 0)); /* same member, new epoch */
	cr_assert_eq(ts_ring_begin(seg, &w, 0, &m), -EPERM);
	atomic_store(&seg->producer, 0);
	cr_assert_eq(ts_ring_begin(seg, &w, 0, &m), -EPERM);
	cr_assert_eq(atomic_load(&seg->ring.pub_seq), 1);
}

Test(ring, takeover_steals_claim)
{
	struct ts_ring_writer a, b;
	struct ts_ring_reader r;
	static struct ts_read rd, rd2;
	struct ts_batch_meta *ma, *mb;

	cr_assert_eq(ts_ring_writer_init(seg, 0, &a), 0);
	for (int i = 0; i < 5; i++)
		cr_assert_eq(produce(&a, 64u * i, 64, 0, 0), 0);
	cr_assert_eq(ts_ring_attach(seg, 2, &r), 0);
	cr_assert_eq(r.seq, 5);

	/* A claims seq 5 and is replaced (by member 1, epoch 2) before publishing */
	cr_assert_eq(ts_ring_begin(seg, &a, 0, &ma), 0);
	*ma = (struct ts_batch_meta){ .npos = 2, .len = { 64 * S0, 64 * S1 }, .tag = 0xA, .nsamples = 64 };
	atomic_store(&seg->producer, ts_producer_word(2, 1));
	cr_assert_eq(ts_ring_writer_init(seg, 1, &b), 0);
	cr_assert_eq(b.next_seq, 5);
	cr_assert_eq(ts_ring_begin(seg, &b, 0, &mb), 0);
	cr_assert_eq(b.seq, 5);
	cr_assert_eq(mb, &seg->ring.meta[1][1]);
	cr_assert_neq(ma, mb);

	cr_assert_eq(ts_ring_publish(seg, &a), -EPERM);
	cr_assert_eq(ts_ring_begin(seg, &a, 0, &ma), -EPERM);

	*mb = (struct ts_batch_meta){ .npos = 2, .len = { 32 * S0, 32 * S1 }, .tag = 0xB, .nsamples = 32 };
	cr_assert_eq(ts_ring_publish(seg, &b), 0);
	cr_assert_eq(atomic_load(&seg->ring.pub_seq), 6);

	cr_assert_eq(peek_samples(&r, 100, &rd, 0), 0);
	cr_assert_eq(rd.nranges, 1);
	cr_assert(rd.r[0][0].seq == 5 && rd.r[0][0].writer == 1 && rd.r[0][0].tag == 0xB);
	cr_assert_eq(rd.got[0], 32 * S0);
	cr_assert_eq(rd.got[1], 32 * S1);

	/* A scribbles its own row for that slot: nobody reads it */
	*ma = (struct ts_batch_meta){ .npos = 9999, .len = { 1, 2, 3 }, .tag = 0xBAD };
	cr_assert_eq(peek_samples(&r, 100, &rd2, 0), 0);
	cr_assert_eq(memcmp(&rd, &rd2, sizeof(rd)), 0);
	cr_assert_eq(ts_ring_advance(seg, &r, &rd2, rd2.got), 0);

	/* A, still believing, cannot take B's newer claim either */
	cr_assert_eq(ts_ring_begin(seg, &b, 0, &mb), 0); /* B claims seq 6 */
	atomic_store(&seg->producer, ts_producer_word(1, 0));
	cr_assert_eq(ts_ring_begin(seg, &a, 0, &ma), -EPERM);
	atomic_store(&seg->producer, ts_producer_word(2, 1));
	*mb = (struct ts_batch_meta){ .npos = 2, .len = { 64 * S0, 64 * S1 }, .tag = 0xB6, .nsamples = 64 };
	cr_assert_eq(ts_ring_publish(seg, &b), 0);
	cr_assert_eq(peek_samples(&r, 64, &rd, 0), 0);
	cr_assert(rd.r[0][0].seq == 6 && rd.r[0][0].tag == 0xB6);
}

/*
 * A consumer elected producer before it read its predecessor's last batches
 * (the predecessor ended while it trained): the next slot waits on its own
 * place. begin() says so at once instead of waiting forever on itself; once
 * it has read them, it publishes.
 */
Test(ring, successor_with_unread_batches)
{
	struct ts_ring_writer a, b;
	struct ts_ring_reader r;
	static struct ts_read rd;
	struct ts_batch_meta *m;

	cr_assert_eq(ts_ring_writer_init(seg, 0, &a), 0);
	cr_assert_eq(ts_ring_attach(seg, 1, &r), 0);
	for (int i = 0; i < 4; i++)
		cr_assert_eq(produce(&a, 64u * i, 64, 0, 0), 0);
	/* member 0 ends; member 1, which read none of seqs 0..3, is elected */
	atomic_store(&seg->producer, ts_producer_word(2, 1));
	cr_assert_eq(ts_ring_writer_init(seg, 1, &b), 0);
	uint64_t t0 = ts_prim_monotonic_ns();
	cr_assert_eq(ts_ring_begin(seg, &b, 5000 * MS, &m), -EDEADLK);
	cr_assert(ts_prim_monotonic_ns() - t0 < 1000 * MS, "begin() waited on its own place");
	cr_assert_eq(b.claimed, 0);
	cr_assert_eq(atomic_load(&seg->members[1].attach) & 1, 1, "not evicted: it is alive");
	cr_assert_eq(atomic_load(&seg->counters.evictions), 0);

	/* it reads seq 0 (all four are still there), then seq 4 may take slot 0 */
	cr_assert_eq(peek_samples(&r, 64, &rd, 0), 0);
	cr_assert(rd.r[0][0].seq == 0 && rd.r[0][0].tag == 0);
	cr_assert_eq(ts_ring_advance(seg, &r, &rd, rd.got), 0);
	cr_assert_eq(produce(&b, 256, 64, 0, 0), 0);
	cr_assert_eq(ts_ring_begin(seg, &b, 0, &m), -EDEADLK); /* seq 5 needs seq 1 read */
	for (uint64_t want = 1; want <= 4; want++) {
		cr_assert_eq(peek_samples(&r, 64, &rd, 0), 0);
		cr_assert(rd.r[0][0].seq == want && rd.r[0][0].tag == 64 * want);
		cr_assert_eq(ts_ring_advance(seg, &r, &rd, rd.got), 0);
	}
	cr_assert_eq(produce(&b, 320, 64, 0, 0), 0);
}

/*
 * Replaced after begin()'s first check but before its claim (begin reads the
 * clock in between, when it scans the consumers): the claim is undone.
 */
Test(ring, replaced_between_check_and_claim)
{
	struct ts_ring_writer w;
	struct ts_batch_meta *m;

	cr_assert_eq(ts_ring_writer_init(seg, 0, &w), 0);
	for (int i = 0; i < 4; i++)
		cr_assert_eq(produce(&w, 64u * i, 64, 0, 0), 0);
	uint64_t before = atomic_load(&seg->ring.slots[0].word);
	/* clock reads in begin: its deadline, then the consumer scan */
	atomic_store(&on_clock_producer, ts_producer_word(2, 1));
	atomic_store(&clock_countdown, 2);
	cr_assert_eq(ts_ring_begin(seg, &w, 0, &m), -EPERM);
	cr_assert_eq(atomic_load(&clock_countdown), 0, "the takeover happened inside begin");
	cr_assert_eq(atomic_load(&seg->ring.slots[0].word), before);
	cr_assert_eq(w.claimed, 0);
	cr_assert_eq(atomic_load(&seg->ring.pub_seq), 4);
}

/* A claim re-made by B after a takeover is B's, and B's abort gives it back. */
/*
 * A successor that took over a replaced producer's claim and gives it up
 * (its stream count failed) must not hand the claim back: the replaced
 * producer, stopped rather than dead, would then publish behind the fence.
 */
Test(ring, takeover_abort_fences_the_replaced_producer)
{
	struct ts_ring_writer a, b;
	struct ts_batch_meta *ma, *mb;

	cr_assert_eq(ts_ring_writer_init(seg, 0, &a), 0);
	cr_assert_eq(ts_ring_begin(seg, &a, 0, &ma), 0);
	ma->npos = 2;
	ma->nsamples = 64;
	ma->len[0] = 64 * S0;
	ma->len[1] = 64 * S1;
	atomic_store(&seg->producer, ts_producer_word(2, 1));
	cr_assert_eq(ts_ring_writer_init(seg, 1, &b), 0);
	cr_assert_eq(ts_ring_begin(seg, &b, 0, &mb), 0);
	cr_assert_eq(ts_ring_abort(seg, &b), 0);
	cr_assert_eq(atomic_load(&seg->ring.slots[0].word), ts_slot_word(TS_SLOT_FREE, 0, 0, 0),
		     "seq 0 reads as not published, and is nobody's claim");
	cr_assert_eq(ts_ring_publish(seg, &a), -EPERM, "the replaced producer cannot publish behind the fence");
	cr_assert_eq(atomic_load(&seg->ring.pub_seq), 0);
	cr_assert_eq(produce(&b, 0, 64, 0, 0), 0);
	cr_assert_eq(atomic_load(&seg->ring.slots[0].word), ts_slot_word(TS_SLOT_PUBLISHED, 2, 2, 0));
	cr_assert_eq(ts_ring_abort(seg, &a), -EINVAL, "its claim ended with the failed publish");
	cr_assert_eq(atomic_load(&seg->ring.slots[0].word), ts_slot_word(TS_SLOT_PUBLISHED, 2, 2, 0));
}

/*
 * An aborted claim over a slot whose batch we published: begin() cleared
 * that row, so the old seq reads as overwritten, never as published with
 * the aborted claim's row (found by tests/fuzz/fuzz_ring.c).
 */
Test(ring, abort_over_own_batch_reads_stale)
{
	struct ts_ring_writer w;
	struct ts_ring_reader r;
	struct ts_batch_meta *m, got;
	static struct ts_read rd;
	unsigned writer;

	make_seg(1);
	cr_assert_eq(ts_ring_writer_init(seg, 0, &w), 0);
	cr_assert_eq(ts_ring_attach(seg, 1, &r), 0);
	cr_assert_eq(produce(&w, 0, 64, 0, 0), 0);
	cr_assert_eq(peek_samples(&r, 64, &rd, 0), 0);
	cr_assert_eq(ts_ring_advance(seg, &r, &rd, rd.got), 0);
	cr_assert_eq(ts_ring_begin(seg, &w, 0, &m), 0); /* seq 1, in seq 0's slot */
	m->npos = 2;
	m->nsamples = 32;
	m->len[0] = 32 * S0;
	m->len[1] = 32 * S1;
	m->tag = 999;
	cr_assert_eq(ts_ring_abort(seg, &w), 0);
	cr_assert_eq(ts_ring_slot_meta(seg, 0, &got, &writer), -ESTALE);
	cr_assert_eq(ts_ring_slot_meta(seg, 1, &got, &writer), -EAGAIN);
	cr_assert_eq(peek_samples(&r, 32, &rd, 0), -ETIMEDOUT);
	/* the seq is claimed again and read as usual */
	cr_assert_eq(produce(&w, 64, 32, 0, 0), 0);
	cr_assert_eq(ts_ring_slot_meta(seg, 1, &got, &writer), 0);
	cr_assert_eq(got.tag, 64);
	cr_assert_eq(peek_samples(&r, 32, &rd, 0), 0);
	cr_assert_eq(rd.got[0], 32 * S0);
	cr_assert_eq(rd.r[0][0].tag, 64);
}

Test(ring, predecessor_died_after_publish)
{
	struct ts_ring_writer a, b;
	struct ts_ring_reader r;
	static struct ts_read rd;
	char why[256];
	uint64_t n;

	cr_assert_eq(ts_ring_writer_init(seg, 0, &a), 0);
	cr_assert_eq(ts_ring_attach(seg, 1, &r), 0);
	for (int i = 0; i < 4; i++)
		cr_assert_eq(produce(&a, 64u * i, 64, 0, 0), 0);
	/* A published seq 3's slot but died before moving pub_seq on */
	atomic_store(&seg->ring.pub_seq, 3);
	atomic_store(&seg->producer, ts_producer_word(2, 1));
	cr_assert_eq(ts_ring_writer_init(seg, 1, &b), 0);
	cr_assert_eq(b.next_seq, 3);
	cr_assert_eq(peek_samples(&r, 64, &rd, 0), 0);
	cr_assert_eq(ts_ring_advance(seg, &r, &rd, rd.got), 0);
	cr_assert_eq(produce(&b, 256, 64, 0, 0), 0);
	cr_assert_eq(b.seq, 4);
	cr_assert_eq(atomic_load(&seg->ring.pub_seq), 5);

	cr_assert_eq(peek_samples(&r, 1000, &rd, 0), 0);
	cr_assert_eq(verify_read(&rd, S, 64, &n, why, sizeof(why)), 0, "%s", why);
	cr_assert_eq(n, 256);
	cr_assert_eq(rd.nranges, 4);
	cr_assert(rd.r[0][2].seq == 3 && rd.r[0][2].writer == 0);
	cr_assert(rd.r[0][3].seq == 4 && rd.r[0][3].writer == 1);
}

/* ---- hostile segment contents ---------------------------------------------- */

Test(ring, hostile_meta)
{
	struct ts_ring_writer w;
	struct ts_ring_reader r;
	static struct ts_read rd;
	struct ts_batch_meta *m;

	cr_assert_eq(ts_ring_writer_init(seg, 0, &w), 0);
	cr_assert_eq(ts_ring_attach(seg, 1, &r), 0);
	cr_assert_eq(produce(&w, 0, 64, 0, 0), 0);
	struct ts_batch_meta *row = &seg->ring.meta[0][0], good = *row;
	_Atomic uint64_t *word = &seg->ring.slots[0].word;
	uint64_t gw = atomic_load(word);

	row->npos = 0;
	cr_assert_eq(peek_samples(&r, 1, &rd, 0), -EBADMSG);
	row->npos = 0xffffffffu;
	cr_assert_eq(peek_samples(&r, 1, &rd, 0), -EBADMSG);
	*row = good;
	row->len[0] = 0;
	cr_assert_eq(peek_samples(&r, 1, &rd, 0), -EBADMSG);
	*row = good;
	row->len[1] = ~0ull;
	cr_assert_eq(peek_samples(&r, 1, &rd, 0), -EBADMSG);
	*row = good;
	row->flags = 0x80000000u;
	cr_assert_eq(peek_samples(&r, 1, &rd, 0), -EBADMSG);
	*row = good;

	atomic_store(word, ts_slot_word(TS_SLOT_PUBLISHED, 100, 1, 0));
	cr_assert_eq(peek_samples(&r, 1, &rd, 0), -EBADMSG);
	atomic_store(word, ts_slot_word(TS_SLOT_PUBLISHED, 0, 1, 0));
	cr_assert_eq(peek_samples(&r, 1, &rd, 0), -EBADMSG);
	atomic_store(word, ts_slot_word(3, 1, 1, 0));
	cr_assert_eq(peek_samples(&r, 1, &rd, 0), -EBADMSG);
	atomic_store(word, ts_slot_word(TS_SLOT_PUBLISHED, 1, 1, 4)); /* overrun */
	cr_assert_eq(peek_samples(&r, 1, &rd, 0), -ESTALE);
	atomic_store(word, gw);

	/* a reader never reads another reader's memory through a bad depth */
	seg->st.depth = 0;
	cr_assert_eq(peek_samples(&r, 1, &rd, 0), -EBADMSG);
	cr_assert_eq(ts_ring_attach(seg, 2, &r), -EBADMSG);
	seg->st.depth = TS_MAX_DEPTH + 1;
	cr_assert_eq(ts_ring_begin(seg, &w, 0, &m), -EBADMSG);
	cr_assert_eq(ts_ring_writer_init(seg, 0, &w), -EBADMSG);
	seg->st.depth = 4;
	cr_assert_eq(peek_samples(&r, 64, &rd, 0), 0);
}

/* The producer refuses a slot word it cannot explain, and changes nothing. */
Test(ring, hostile_slot_word_producer)
{
	struct ts_ring_writer w;
	struct ts_batch_meta *m;
	_Atomic uint64_t *word = &seg->ring.slots[0].word;

	cr_assert_eq(ts_ring_writer_init(seg, 0, &w), 0);
	for (int i = 0; i < 4; i++)
		cr_assert_eq(produce(&w, 64u * i, 64, 0, 0), 0);
	uint64_t gw = atomic_load(word);
	const struct { uint64_t word; int err; } cases[] = {
		{ ts_slot_word(3, 1, 1, 0), -EBADMSG },
		{ ts_slot_word(TS_SLOT_WRITING, 1, 1, 0), -EBADMSG },   /* a claim of an old seq */
		{ ts_slot_word(TS_SLOT_PUBLISHED, 1, 1, 1), -EBADMSG }, /* neither n - D nor n */
		{ ts_slot_word(TS_SLOT_PUBLISHED, 1, 1, 9), -EPERM },   /* someone is ahead */
		{ ts_slot_word(TS_SLOT_WRITING, 2, 5, 4), -EPERM },     /* a newer epoch's claim */
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		atomic_store(word, cases[i].word);
		cr_assert_eq(ts_ring_begin(seg, &w, 0, &m), cases[i].err, "case %zu", i);
		cr_assert_eq(atomic_load(word), cases[i].word);
		cr_assert_eq(w.claimed, 0);
	}
	atomic_store(word, gw);
	cr_assert_eq(produce(&w, 256, 64, 0, 0), 0);
	cr_assert_eq(w.seq, 4);
}

/*
 * A peer that publishes the producer's next seq in its slot each time the
 * producer looks: each slot is one a dead predecessor could have left, so
 * begin() skips it. A predecessor leaves at most D: past that, begin() says
 * the ring is not sane instead of skipping for ever (it did).
 */
static struct ts_ring_writer *ahead_of;

static void publish_ahead(void)
{
	uint64_t n = ahead_of->next_seq;
	atomic_store(&seg->ring.slots[n % 4].word, ts_slot_word(TS_SLOT_PUBLISHED, 3, 1, n));
}

Test(ring, a_peer_publishing_ahead_does_not_keep_begin_skipping)
{
	struct ts_ring_writer w;
	struct ts_batch_meta *m;

	cr_assert_eq(ts_ring_writer_init(seg, 0, &w), 0);
	for (int i = 0; i < 4; i++)
		cr_assert_eq(produce(&w, 64u * i, 64, 0, 0), 0);
	ahead_of = &w;
	every_clock = publish_ahead;
	int ret = ts_ring_begin(seg, &w, 1000 * MS, &m);
	every_clock = NULL;
	cr_assert_eq(ret, -EBADMSG);
	cr_assert_eq(w.claimed, 0);
	cr_assert_leq(w.next_seq, 4u + 4u + 1u, "skipped %llu seqs", (unsigned long long)(w.next_seq - 4));
}

/*
 * A dead reader holds the producer back; the producer evicts it by CAS of
 * its attach word. A peer that rewrites that word at every look (here, at
 * every liveness check of the reader) made the CAS fail for ever, and the
 * producer spin without a deadline. It counts as holding for that look now,
 * and the wait runs out.
 */
static void flip_attach_of_1(uint32_t pid)
{
	if (pid == PID0 + 1)
		atomic_fetch_add(&seg->members[1].attach, 2);
}

Test(ring, a_peer_rewriting_an_attach_word_does_not_keep_the_producer_evicting)
{
	struct ts_ring_writer w;
	struct ts_ring_reader r;
	struct ts_batch_meta *m;

	cr_assert_eq(ts_ring_writer_init(seg, 0, &w), 0);
	cr_assert_eq(ts_ring_attach(seg, 1, &r), 0);
	for (int i = 0; i < 4; i++)
		cr_assert_eq(produce(&w, 64u * i, 64, 0, 0), 0);
	atomic_store(&dead[1], 1); /* seq 4 needs seq 0 read: member 1, dead, is to be evicted */
	every_start = flip_attach_of_1;
	uint64_t t0 = ts_prim_monotonic_ns();
	int ret = ts_ring_begin(seg, &w, 50 * MS, &m);
	uint64_t dt = ts_prim_monotonic_ns() - t0;
	every_start = NULL;
	cr_assert_eq(ret, -ETIMEDOUT);
	cr_assert_lt(dt, 1000 * MS, "waited %llu ms for a 50 ms timeout", (unsigned long long)(dt / MS));
	cr_assert_eq(atomic_load(&seg->members[1].attach) & 1, 1, "still attached: every eviction lost its CAS");
	/* the peer stops: the dead reader is evicted and the producer goes on */
	cr_assert_eq(produce(&w, 256, 64, 0, 1000 * MS), 0);
	cr_assert_eq(atomic_load(&seg->members[1].attach) & 1, 0);
}

/* ---- threads ------------------------------------------------------------------ */

#define ST_NB    3000
#define ST_D     4
#define ST_MAXS  64
static const uint64_t SS[2] = { 96, 8 };

/* the data plane: one buffer per slot and position, filled by the producer */
static uint8_t st_data[ST_D][2][ST_MAXS * 96];
static _Atomic uint64_t st_published;
static _Atomic int st_ready; /* consumers attached from the start */

static inline uint8_t pat(int p, uint64_t off)
{
	return (uint8_t)(((off + (uint64_t)p * 0x1234567) * 0x9E3779B97F4A7C15ull) >> 56);
}

/* batch b's size; every 50th batch ends an epoch with a partial batch */
static uint64_t st_size(uint64_t b, uint32_t *flags)
{
	int eoe = b % 50 == 49 || b == ST_NB - 1;
	*flags = eoe ? TS_BATCH_END_OF_EPOCH : 0;
	return eoe ? 1 + (b * 7) % 63 : 64;
}

struct st_arg {
	int self;
	uint64_t B;
	int late;
	int slow;
	char why[256];
	uint64_t samples, batches;
};

static void *st_producer(void *p)
{
	struct st_arg *a = p;
	struct ts_ring_writer w;
	uint64_t first = 0;
	int ret = ts_ring_writer_init(seg, 0, &w);

	for (int i = 0; atomic_load(&st_ready) < 3; i++) {
		if (i == 50000) {
			snprintf(a->why, sizeof(a->why), "consumers never attached");
			return NULL;
		}
		ts_sleep_ns(100000);
	}

	for (uint64_t b = 0; !ret && b < ST_NB; b++) {
		struct ts_batch_meta *m;
		uint32_t flags;
		uint64_t n = st_size(b, &flags);
		if ((ret = ts_ring_begin(seg, &w, 1000 * MS, &m)))
			break;
		for (int q = 0; q < 2; q++)
			for (uint64_t i = 0; i < n * SS[q]; i++)
				st_data[w.slot][q][i] = pat(q, first * SS[q] + i);
		*m = (struct ts_batch_meta){ .npos = 2, .flags = flags, .nsamples = n, .len = { n * SS[0], n * SS[1] },
					     .tag = first };
		if ((ret = ts_ring_publish(seg, &w)))
			break;
		first += n;
		atomic_store(&st_published, b + 1);
	}
	if (ret)
		snprintf(a->why, sizeof(a->why), "producer: %d at sample %llu", ret, (unsigned long long)first);
	a->samples = first;
	return NULL;
}

/* stream samples where epochs end, ascending */
static uint64_t st_ends[ST_NB];
static uint64_t st_nends, st_total;

static void st_plan(void)
{
	st_nends = st_total = 0;
	for (uint64_t b = 0; b < ST_NB; b++) {
		uint32_t flags;
		st_total += st_size(b, &flags);
		if (flags)
			st_ends[st_nends++] = st_total;
	}
}

static void *st_consumer(void *p)
{
	struct st_arg *a = p;
	struct ts_ring_reader r;
	struct ts_read *rd = malloc(sizeof(*rd));
	uint8_t *buf[2] = { malloc(a->B * SS[0]), malloc(a->B * SS[1]) };
	uint64_t total = st_total, next = 0, have = 0, steps = 0, e = 0;
	int ret, attached = 0;

	if (a->late)
		while (atomic_load(&st_published) < ST_NB / 3)
			ts_sleep_ns(MS);
	beat(a->self);
	if ((ret = ts_ring_attach(seg, a->self, &r)))
		goto fail;
	attached = 1;
	if (!a->late)
		atomic_fetch_add(&st_ready, 1);
	for (int started = !a->late; next < total; steps++) {
		uint64_t want[2] = { (a->B - have) * SS[0], (a->B - have) * SS[1] }, n;
		beat(a->self);
		if ((ret = ts_ring_peek(seg, &r, 2, want, rd, 1000 * MS)))
			goto fail;
		if (!started) {
			/* a late joiner starts at a slot's start, wherever the head was */
			if (rd->r[0][0].off != 0) {
				snprintf(a->why, sizeof(a->why), "late joiner starts mid-slot");
				break;
			}
			next = rd->r[0][0].tag;
			started = 1;
		}
		if (verify_read(rd, SS, next, &n, a->why, sizeof(a->why)))
			break;
		for (uint32_t k = 0; k < rd->nranges; k++)
			for (int q = 0; q < 2; q++) {
				const struct ts_range *g = &rd->r[q][k];
				memcpy(buf[q] + (g->tag * SS[q] + g->off - (next - have) * SS[q]),
				       st_data[g->slot][q] + g->off, g->len);
			}
		if (a->slow && steps % 64 == 0)
			ts_sleep_ns(200000);
		if ((ret = ts_ring_advance(seg, &r, rd, rd->got)))
			goto fail;
		/* only now are the bytes known to be the batch's */
		for (int q = 0; q < 2; q++)
			for (uint64_t i = 0; i < n * SS[q]; i++) {
				uint64_t off = next * SS[q] + i;
				if (buf[q][have * SS[q] + i] != pat(q, off)) {
					snprintf(a->why, sizeof(a->why), "pos %d byte %llu is wrong", q,
						 (unsigned long long)off);
					goto out;
				}
			}
		next += n;
		have += n;
		a->samples += n;
		while (e < st_nends && st_ends[e] < next)
			e++;
		uint64_t end = st_ends[e];
		if (rd->end_of_epoch != (next == end)) {
			snprintf(a->why, sizeof(a->why), "end_of_epoch %u at sample %llu (epoch ends at %llu)",
				 rd->end_of_epoch, (unsigned long long)next, (unsigned long long)end);
			break;
		}
		if (have == a->B || rd->end_of_epoch) {
			have = 0;
			a->batches++;
		}
	}
	goto out;
fail:
	snprintf(a->why, sizeof(a->why), "consumer %d: %d at sample %llu", a->self, ret, (unsigned long long)next);
out:
	if (attached)
		ts_ring_detach(seg, &r);
	free(buf[0]);
	free(buf[1]);
	free(rd);
	return NULL;
}

Test(ring, threaded_stress, .timeout = 60)
{
	struct st_arg args[5] = {
		{ .self = 0 },
		{ .self = 1, .B = 7 },
		{ .self = 2, .B = 64, .slow = 1 },
		{ .self = 3, .B = ST_D * 64 + 44 },
		{ .self = 4, .B = 64, .late = 1 },
	};
	pthread_t t[5];

	make_seg(ST_D);
	st_plan();
	atomic_store(&st_ready, 0);
	atomic_store(&st_published, 0);
	uint64_t t0 = ts_prim_monotonic_ns();
	for (int i = 4; i >= 0; i--)
		cr_assert_eq(pthread_create(&t[i], NULL, i ? st_consumer : st_producer, &args[i]), 0);
	for (int i = 0; i < 5; i++)
		pthread_join(t[i], NULL);
	uint64_t dt = ts_prim_monotonic_ns() - t0;
	for (int i = 0; i < 5; i++)
		cr_assert_eq(args[i].why[0], 0, "thread %d: %s", i, args[i].why);
	uint64_t total = args[0].samples;
	for (int i = 1; i < 4; i++)
		cr_assert_eq(args[i].samples, total, "consumer %d got %llu of %llu", i,
			     (unsigned long long)args[i].samples, (unsigned long long)total);
	cr_assert(args[4].samples > 0 && args[4].samples < total * 3 / 4);
	cr_assert_eq(atomic_load(&seg->counters.evictions), 0);
	cr_log_info("stress: %llu samples, %.0f ms", (unsigned long long)total, dt / 1e6);
}

/* nsamples tells the ring the sample size: a consumer batch of 1.5 samples is refused. */
Test(ring, consumer_batch_must_hold_whole_samples)
{
	struct ts_ring_writer w;
	struct ts_ring_reader r;
	static struct ts_read rd;

	cr_assert_eq(ts_ring_writer_init(seg, 0, &w), 0);
	cr_assert_eq(ts_ring_attach(seg, 1, &r), 0);
	cr_assert_eq(produce(&w, 0, 64, 0, 0), 0);
	uint64_t half[2] = { 3 * S0 / 2, 3 * S1 / 2 };
	cr_assert_eq(ts_ring_peek(seg, &r, 2, half, &rd, 0), -EPROTO, "1.5 samples cut a sample");
	/* a single position has no partner to catch the cut: nsamples does */
	struct ts_batch_meta *m;
	cr_assert_eq(ts_ring_begin(seg, &w, 0, &m), 0);
	m->npos = 1;
	m->nsamples = 3;
	m->len[0] = 3 * 10;
	cr_assert_eq(ts_ring_publish(seg, &w), 0);
	cr_assert_eq(peek_samples(&r, 64, &rd, 0), 0);
	cr_assert_eq(ts_ring_advance(seg, &r, &rd, rd.got), 0);
	uint64_t one[1] = { 15 };
	cr_assert_eq(ts_ring_peek(seg, &r, 1, one, &rd, 0), -EPROTO, "15 bytes are 1.5 samples of 10");
	one[0] = 20;
	cr_assert_eq(ts_ring_peek(seg, &r, 1, one, &rd, 0), 0);
	cr_assert_eq(rd.got[0], 20);
	/* and a producer row whose sizes are not whole samples is refused at publish */
	cr_assert_eq(ts_ring_begin(seg, &w, 0, &m), 0);
	m->npos = 1;
	m->nsamples = 3;
	m->len[0] = 31;
	cr_assert_eq(ts_ring_publish(seg, &w), -EINVAL);
	cr_assert_eq(ts_ring_abort(seg, &w), 0);
}
