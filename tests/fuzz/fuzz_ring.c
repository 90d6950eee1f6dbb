/* SPDX-License-Identifier: MIT */
/*
 * libFuzzer target: the ring's byte-stream slicing (core/ring.c), in one
 * process on a segment image in memory, with fake time and liveness (as in
 * tests/unit/test_ring.c). Every call uses a zero timeout, so nothing waits.
 *
 * Input: a header (depth, members, the stream's positions and bytes per
 * sample), then operations, one selector byte each plus arguments: begin
 * and commit a batch (fuzzer-chosen samples, end-of-epoch flag, sometimes
 * an arbitrary meta row), abort, attach / attach_at / detach a consumer,
 * peek at a fuzzer-chosen batch size (sometimes arbitrary want[]), advance
 * by all or part of the last peek (sometimes arbitrary got[], sometimes a
 * stale read), kill / revive / beat a member, move the clock, hand the
 * producer role over, evict laggards, slot_meta, wait_next, and rarely a
 * scribble over the ring's shared words.
 *
 * Each batch's tag is the stream index of its first sample, so every range
 * maps back to the stream. Invariants, checked after every call while the
 * ring has only seen well-formed batches (abort = finding):
 *   - a range lies inside its slot's published length for that position and
 *     carries that batch's tag and writer; ranges are contiguous in the
 *     stream, start where the reader stands, cut whole samples, and every
 *     position's range is proportional to position 0's (samples paired);
 *   - got[] is the sum of the ranges, never more than want[]; a read stops
 *     short only at an epoch's end, the last published batch or the range
 *     limit, and end_of_epoch only at the end of a batch that says so;
 *   - advance() leaves the reader right after what it consumed; consumed
 *     slots were not reclaimed by the producer under an attached reader;
 *   - begin() never claims a slot that an attached consumer still reads;
 *   - publish() refuses exactly the invalid rows.
 * After a scribble or an arbitrary row only memory safety and the
 * shape checks that need no model remain.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <string.h>
#include <unistd.h>

#include "fuzz_common.h"
#include "fuzz_members.h"
#include "ring.h"

#define MAXSEQ   1024
#define MS       1000000ull
#define LEN_LIMIT (1ull << 48)

static struct ts_segment *seg;

/* ---- the model ------------------------------------------------------------ */

struct batch {
	bool published;
	uint32_t npos, flags, writer;
	uint64_t nsamples, tag, len[TS_MAX_POSITIONS];
};

struct consumer {
	bool attached;
	struct ts_ring_reader r;
	bool have_read, fresh; /* a peek result; fresh: nothing advanced since */
	bool raw_want;
	bool tainted; /* advanced by an arbitrary got[]: may stand inside a sample (its peeks say -EPROTO) */
	struct ts_read rd;
};

static struct {
	uint32_t depth, nmem, npos;
	uint64_t unit[TS_MAX_POSITIONS]; /* bytes per sample, per position */
	bool strict;                     /* only well-formed batches so far */
	struct batch b[MAXSEQ];
	uint64_t cum[MAXSEQ + 1];        /* samples before seq */
	struct ts_ring_writer w[FZ_MAXMEM];
	bool has_writer[FZ_MAXMEM];
	struct ts_batch_meta *row[FZ_MAXMEM];
	bool raw_row[FZ_MAXMEM];
	struct consumer c[FZ_MAXMEM];
} M;

static bool row_valid(const struct ts_batch_meta *m)
{
	if (m->npos < 1 || m->npos > TS_MAX_POSITIONS || (m->flags & ~TS_BATCH_END_OF_EPOCH) || m->len[0] == 0 ||
	    m->nsamples == 0)
		return false;
	for (uint32_t p = 0; p < m->npos; p++)
		if (m->len[p] >= LEN_LIMIT || m->len[p] % m->nsamples)
			return false;
	return true;
}

static int producer_index(void)
{
	return ts_producer_index(atomic_load(&seg->producer));
}

static bool still_attached(int c)
{
	return atomic_load(&seg->members[c].attach) == M.c[c].r.attach;
}

/* ---- checks ----------------------------------------------------------------- */

/* Shape checks that hold whatever the segment holds. */
static void check_read_generic(const struct ts_read *rd, uint32_t npos, const uint64_t *want)
{
	FUZZ_CHECK(rd->npos == npos, "npos %u, asked %u", rd->npos, npos);
	FUZZ_CHECK(rd->nranges >= 1 && rd->nranges <= TS_READ_MAX_RANGES, "nranges %u", rd->nranges);
	for (uint32_t p = 0; p < npos; p++) {
		uint64_t sum = 0;
		for (uint32_t k = 0; k < rd->nranges; k++) {
			const struct ts_range *r = &rd->r[p][k];
			FUZZ_CHECK(r->len <= r->slot_len && r->off <= r->slot_len - r->len,
				   "range %u/%u off %llu len %llu slot_len %llu", p, k, (unsigned long long)r->off,
				   (unsigned long long)r->len, (unsigned long long)r->slot_len);
			FUZZ_CHECK(r->slot < M.depth && r->slot == r->seq % M.depth, "slot %u seq %llu", r->slot,
				   (unsigned long long)r->seq);
			FUZZ_CHECK(r->writer < TS_MAX_MEMBERS, "writer %u", r->writer);
			FUZZ_CHECK(sum + r->len >= sum, "overflow");
			sum += r->len;
		}
		FUZZ_CHECK(sum == rd->got[p], "position %u: got %llu, ranges sum %llu", p,
			   (unsigned long long)rd->got[p], (unsigned long long)sum);
		FUZZ_CHECK(rd->got[p] <= want[p], "position %u: got %llu > want %llu", p,
			   (unsigned long long)rd->got[p], (unsigned long long)want[p]);
	}
	FUZZ_CHECK(rd->got[0] > 0, "a successful peek returned nothing");
}

/* Against the model: contiguous, paired, within the published batches. */
static void check_read_strict(int c, const struct ts_read *rd, const uint64_t *want)
{
	const struct ts_ring_reader *r = &M.c[c].r;
	uint64_t pub = atomic_load(&seg->ring.pub_seq);
	for (uint32_t k = 0; k < rd->nranges; k++) {
		const struct ts_range *r0 = &rd->r[0][k];
		FUZZ_CHECK(r0->seq < MAXSEQ && M.b[r0->seq].published, "range %u: seq %llu never published", k,
			   (unsigned long long)r0->seq);
		const struct batch *b = &M.b[r0->seq];
		FUZZ_CHECK(r0->len > 0, "empty range %u", k);
		for (uint32_t p = 0; p < M.npos; p++) {
			const struct ts_range *rp = &rd->r[p][k];
			FUZZ_CHECK(rp->seq == r0->seq, "positions in different slots");
			FUZZ_CHECK(rp->slot_len == b->len[p], "range %u/%u: slot_len %llu, published %llu", p, k,
				   (unsigned long long)rp->slot_len, (unsigned long long)b->len[p]);
			FUZZ_CHECK(rp->tag == b->tag && rp->writer == b->writer, "range %u/%u: tag %llu writer %u, published %llu by %u",
				   p, k, (unsigned long long)rp->tag, rp->writer, (unsigned long long)b->tag, b->writer);
			FUZZ_CHECK(rp->off % M.unit[p] == 0 && rp->len % M.unit[p] == 0, "range %u/%u cuts a sample", p, k);
			FUZZ_CHECK(rp->off / M.unit[p] == r0->off / M.unit[0] && rp->len / M.unit[p] == r0->len / M.unit[0],
				   "range %u/%u unpaired with position 0", p, k);
			if (k == 0)
				FUZZ_CHECK(rp->seq == r->seq && rp->off == r->off[p],
					   "read starts at seq %llu off %llu, reader at %llu off %llu",
					   (unsigned long long)rp->seq, (unsigned long long)rp->off,
					   (unsigned long long)r->seq, (unsigned long long)r->off[p]);
			else
				FUZZ_CHECK(rp->seq == rd->r[p][k - 1].seq + 1 && rp->off == 0 &&
						   rd->r[p][k - 1].off + rd->r[p][k - 1].len == rd->r[p][k - 1].slot_len,
					   "range %u/%u does not follow the previous one", p, k);
		}
		if (k + 1 < rd->nranges)
			FUZZ_CHECK(!(b->flags & TS_BATCH_END_OF_EPOCH), "read spans an epoch's end");
	}
	for (uint32_t p = 0; p < M.npos; p++)
		FUZZ_CHECK(rd->got[p] / M.unit[p] == rd->got[0] / M.unit[0], "got[] unpaired");
	const struct ts_range *last = &rd->r[0][rd->nranges - 1];
	bool ends = last->off + last->len == last->slot_len;
	bool eoe_slot = M.b[last->seq].flags & TS_BATCH_END_OF_EPOCH;
	FUZZ_CHECK(rd->end_of_epoch == (ends && eoe_slot), "end_of_epoch %u, last range ends %d its slot, eoe %d",
		   rd->end_of_epoch, ends, eoe_slot);
	if (rd->got[0] < want[0])
		FUZZ_CHECK(rd->end_of_epoch || rd->nranges == TS_READ_MAX_RANGES || (ends && last->seq + 1 >= pub),
			   "short read (%llu of %llu) with more published", (unsigned long long)rd->got[0],
			   (unsigned long long)want[0]);
	else
		FUZZ_CHECK(rd->got[0] == want[0], "over-read");
}

/* ---- operations ------------------------------------------------------------- */

static void op_begin(struct fz *f)
{
	int m = producer_index();
	if (m < 0 || m >= (int)M.nmem)
		return;
	if (!M.has_writer[m] || M.w[m].epoch != ts_producer_epoch(atomic_load(&seg->producer))) {
		if (M.w[m].claimed)
			return; /* finish or abort that claim first */
		int ret = ts_ring_writer_init(seg, m, &M.w[m]);
		if (M.strict)
			FUZZ_CHECK(ret == 0, "writer_init %d", ret);
		if (ret)
			return;
		M.has_writer[m] = true;
	}
	struct ts_batch_meta *row;
	int ret = ts_ring_begin(seg, &M.w[m], 0, &row);
	FUZZ_TRACE("begin by %d: %d seq %llu\n", m, ret, (unsigned long long)M.w[m].seq);
	if (M.strict)
		FUZZ_CHECK(ret == 0 || ret == -ETIMEDOUT || ret == -EBUSY || ret == -EDEADLK, "begin %d", ret);
	/* EDEADLK exactly when the writer's own place holds the slot it wants */
	if (M.strict && ret == -EDEADLK)
		FUZZ_CHECK(M.c[m].attached && still_attached(m) && M.c[m].r.seq + M.depth <= M.w[m].next_seq,
			   "begin EDEADLK by %d at seq %llu, its reader at %llu", m,
			   (unsigned long long)M.w[m].next_seq, (unsigned long long)M.c[m].r.seq);
	if (M.strict && ret == -ETIMEDOUT && M.c[m].attached && still_attached(m))
		FUZZ_CHECK(M.c[m].r.seq + M.depth > M.w[m].next_seq, "begin waited on its own place");
	if (ret) {
		(void)fz_u8(f);
		return;
	}
	uint64_t n = M.w[m].seq;
	/* never a slot an attached reader still stands in */
	for (int c = 0; c < (int)M.nmem; c++)
		if (M.strict && M.c[c].attached && still_attached(c))
			FUZZ_CHECK(M.c[c].r.seq + M.depth > n, "claimed seq %llu over consumer %d at seq %llu (depth %u)",
				   (unsigned long long)n, c, (unsigned long long)M.c[c].r.seq, M.depth);
	M.row[m] = row;
	M.raw_row[m] = false;
	uint8_t how = fz_u8(f);
	uint64_t ns = 1 + (how & 0x3f);
	if ((how & 0xc0) == 0xc0) {
		/* an arbitrary row: publish must judge it */
		M.raw_row[m] = true;
		row->npos = fz_u8(f) % 18;
		row->flags = fz_u8(f) % 3;
		row->nsamples = fz_bytes(f, fz_u8(f) % 9);
		for (unsigned p = 0; p < TS_MAX_POSITIONS; p++)
			row->len[p] = p < 4 ? fz_bytes(f, fz_u8(f) % 9) : 0;
		return;
	}
	row->npos = M.npos;
	row->nsamples = ns;
	row->flags = how & 0x40 ? TS_BATCH_END_OF_EPOCH : 0;
	for (uint32_t p = 0; p < M.npos; p++)
		row->len[p] = ns * M.unit[p];
}

static void op_commit(int m)
{
	if (m >= (int)M.nmem || !M.w[m].claimed)
		return;
	struct ts_batch_meta *row = M.row[m];
	uint64_t seq = M.w[m].seq;
	bool current = producer_index() == m && M.w[m].epoch == ts_producer_epoch(atomic_load(&seg->producer));
	row->tag = seq < MAXSEQ ? M.cum[seq] : 0;
	struct ts_batch_meta copy = *row;
	bool valid = row_valid(&copy);
	int ret = ts_ring_publish(seg, &M.w[m]);
	FUZZ_TRACE("publish by %d of seq %llu: %d (row %s)\n", m, (unsigned long long)seq, ret, valid ? "valid" : "invalid");
	FUZZ_CHECK(valid ? ret != -EINVAL : ret == -EINVAL, "publish of a %s row returned %d", valid ? "valid" : "invalid",
		   ret);
	if (ret == -EINVAL) {
		ret = ts_ring_abort(seg, &M.w[m]);
		FUZZ_CHECK(ret == -EINVAL || !M.strict || ret == 0 || !current, "abort %d", ret);
		return;
	}
	if (M.strict && current)
		FUZZ_CHECK(ret == 0, "the producer's publish of seq %llu failed: %d", (unsigned long long)seq, ret);
	if (ret)
		return;
	if (M.raw_row[m] || seq >= MAXSEQ || (seq > 0 && !M.b[seq - 1].published)) {
		M.strict = false; /* the stream is no longer one shape: memory safety only */
		return;
	}
	FUZZ_CHECK(!M.b[seq].published, "seq %llu published twice", (unsigned long long)seq);
	struct batch *b = &M.b[seq];
	*b = (struct batch){ .published = true, .npos = copy.npos, .flags = copy.flags, .writer = (uint32_t)m,
			     .nsamples = copy.nsamples, .tag = copy.tag };
	memcpy(b->len, copy.len, sizeof(b->len));
	M.cum[seq + 1] = M.cum[seq] + copy.nsamples;
	if (M.strict)
		FUZZ_CHECK(atomic_load(&seg->ring.pub_seq) == seq + 1, "pub_seq %llu after publishing %llu",
			   (unsigned long long)atomic_load(&seg->ring.pub_seq), (unsigned long long)seq);
}

static void op_abort(int m)
{
	if (m < (int)M.nmem && M.w[m].claimed)
		(void)ts_ring_abort(seg, &M.w[m]);
}

static void op_attach(struct fz *f, int c)
{
	struct consumer *k = &M.c[c];
	uint8_t how = fz_u8(f);
	uint64_t head = atomic_load(&seg->ring.claim_seq);
	uint64_t back = how >> 1;
	uint64_t from = how & 1 ? head - (back < head ? back : head) : UINT64_MAX;
	int ret = ts_ring_attach_at(seg, c, &k->r, from);
	FUZZ_TRACE("attach %d from %lld: %d at seq %llu\n", c, (long long)from, ret, (unsigned long long)k->r.seq);
	if (M.strict)
		FUZZ_CHECK(ret == 0, "attach %d", ret);
	if (ret)
		return;
	FUZZ_CHECK(k->r.seq <= atomic_load(&seg->ring.claim_seq), "attached past the head");
	if (M.strict && from != UINT64_MAX)
		FUZZ_CHECK(k->r.seq == from || k->r.seq == atomic_load(&seg->ring.claim_seq),
			   "attach_at %llu landed at %llu", (unsigned long long)from, (unsigned long long)k->r.seq);
	if (M.strict && from != UINT64_MAX && k->r.seq == from && from < head)
		FUZZ_CHECK(head - from <= M.depth, "attached at %llu, %llu behind the head (depth %u)",
			   (unsigned long long)from, (unsigned long long)(head - from), M.depth);
	k->attached = true;
	k->have_read = false;
	k->tainted = false;
}

static void want_for(struct fz *f, int c, uint64_t *want)
{
	uint8_t how = fz_u8(f);
	M.c[c].raw_want = (how & 0xe0) == 0xe0;
	if (M.c[c].raw_want) {
		for (unsigned p = 0; p < TS_MAX_POSITIONS; p++)
			want[p] = fz_bytes(f, fz_u8(f) % 9);
		return;
	}
	uint64_t k = how & 0x80 ? 1 + fz_u16(f) : 1 + (how & 0x7f);
	for (uint32_t p = 0; p < TS_MAX_POSITIONS; p++)
		want[p] = p < M.npos ? k * M.unit[p] : 0;
}

static void op_peek(struct fz *f, int c)
{
	struct consumer *k = &M.c[c];
	uint64_t want[TS_MAX_POSITIONS];
	want_for(f, c, want);
	if (!k->attached)
		return;
	uint32_t npos = k->raw_want ? 1 + fz_u8(f) % TS_MAX_POSITIONS : M.npos;
	if (want[0] == 0)
		return;
	int ret = ts_ring_peek(seg, &k->r, npos, want, &k->rd, 0);
	FUZZ_TRACE("peek %d want %llu: %d, %u ranges, got %llu%s\n", c, (unsigned long long)want[0], ret,
		   ret ? 0 : k->rd.nranges, ret ? 0ull : (unsigned long long)k->rd.got[0],
		   ret == 0 && k->rd.end_of_epoch ? " (end of epoch)" : "");
	if (ret == -ESTALE) {
		/* a slot overwritten under an attached reader: only a scribble does that */
		FUZZ_CHECK(!M.strict || !still_attached(c), "-ESTALE while still attached");
		k->attached = false;
		k->have_read = false;
		return;
	}
	if (M.strict && !k->raw_want && !k->tainted)
		FUZZ_CHECK(ret == 0 || ret == -ETIMEDOUT, "peek %d", ret);
	if (ret) {
		k->have_read = false;
		return;
	}
	check_read_generic(&k->rd, npos, want);
	if (M.strict && !k->raw_want && !k->tainted)
		check_read_strict(c, &k->rd, want);
	k->have_read = true;
	k->fresh = true;
}

/* Where the reader must stand after consuming got[] of rd (position 0 decides). */
static void expected_position(const struct ts_read *rd, const uint64_t *got, uint64_t *seq, uint64_t *off)
{
	uint64_t left = got[0];
	for (uint32_t k = 0; k < rd->nranges && left; k++) {
		const struct ts_range *r0 = &rd->r[0][k];
		uint64_t take = left < r0->len ? left : r0->len;
		left -= take;
		*seq = r0->seq;
		for (uint32_t p = 0; p < M.npos; p++)
			off[p] = rd->r[p][k].off + take / M.unit[0] * M.unit[p];
		if (off[0] == r0->slot_len) {
			*seq = r0->seq + 1;
			memset(off, 0, TS_MAX_POSITIONS * sizeof(*off));
		}
	}
}

static void op_advance(struct fz *f, int c)
{
	struct consumer *k = &M.c[c];
	uint8_t how = fz_u8(f);
	if (!k->attached || !k->have_read)
		return;
	const struct ts_read *rd = &k->rd;
	uint64_t got[TS_MAX_POSITIONS] = {0};
	bool raw = (how & 0xc0) == 0xc0, checked = M.strict && !k->raw_want && !raw && k->fresh && !k->tainted;
	if (raw) {
		for (unsigned p = 0; p < rd->npos; p++)
			got[p] = fz_bytes(f, fz_u8(f) % 9);
	} else if (how & 1 || k->raw_want) {
		memcpy(got, rd->got, sizeof(got));
	} else {
		uint64_t samples = rd->got[0] / M.unit[0];
		uint64_t s = samples ? fz_u16(f) % (samples + 1) : 0;
		for (uint32_t p = 0; p < M.npos; p++)
			got[p] = s * M.unit[p];
	}
	uint64_t seq0 = k->r.seq, off0[TS_MAX_POSITIONS];
	memcpy(off0, k->r.off, sizeof(off0));
	int ret = ts_ring_advance(seg, &k->r, rd, got);
	FUZZ_TRACE("advance %d by %llu: %d, now seq %llu off %llu\n", c, (unsigned long long)got[0], ret,
		   (unsigned long long)k->r.seq, (unsigned long long)k->r.off[0]);
	if (ret == -ESTALE) {
		FUZZ_CHECK(!still_attached(c), "advance -ESTALE while still attached");
		k->attached = false;
		k->have_read = false;
		return;
	}
	if (ret) {
		FUZZ_CHECK(k->r.seq == seq0 && memcmp(k->r.off, off0, sizeof(off0)) == 0, "a failed advance moved the reader");
		if (checked)
			FUZZ_CHECK(false, "advance of a fresh read by %llu bytes failed: %d", (unsigned long long)got[0], ret);
		return;
	}
	if (!k->fresh && got[0])
		FUZZ_CHECK(!M.strict, "advance accepted a stale read");
	if (checked && got[0]) {
		uint64_t seq = seq0, off[TS_MAX_POSITIONS];
		memcpy(off, off0, sizeof(off));
		expected_position(rd, got, &seq, off);
		FUZZ_CHECK(k->r.seq == seq && memcmp(k->r.off, off, sizeof(off)) == 0,
			   "advance left the reader at seq %llu off %llu, expected seq %llu off %llu",
			   (unsigned long long)k->r.seq, (unsigned long long)k->r.off[0], (unsigned long long)seq,
			   (unsigned long long)off[0]);
		/* what was consumed was still there: the producer did not reuse those slots */
		for (uint32_t i = 0; i < rd->nranges && rd->r[0][i].seq < k->r.seq + (k->r.off[0] ? 1 : 0); i++) {
			uint64_t w = atomic_load(&seg->ring.slots[rd->r[0][i].seq % M.depth].word);
			FUZZ_CHECK(ts_slot_seq(w) == rd->r[0][i].seq, "slot of seq %llu reused (now seq %llu) under an attached reader",
				   (unsigned long long)rd->r[0][i].seq, (unsigned long long)ts_slot_seq(w));
		}
		if (k->r.seq > seq0)
			FUZZ_CHECK(atomic_load(&seg->members[c].read_seq) == k->r.seq, "read_seq %llu, reader at %llu",
				   (unsigned long long)atomic_load(&seg->members[c].read_seq), (unsigned long long)k->r.seq);
	}
	if (got[0])
		k->fresh = false;
	if (raw && got[0])
		k->tainted = true; /* the ring cannot tell a cut sample: callers pass peek's got[] */
}

static void op_slot_meta(struct fz *f)
{
	uint64_t pub = atomic_load(&seg->ring.pub_seq);
	uint64_t seq = pub ? pub - 1 - fz_u8(f) % pub : fz_u8(f);
	struct ts_batch_meta m;
	unsigned writer;
	int ret = ts_ring_slot_meta(seg, seq, &m, &writer);
	FUZZ_TRACE("slot_meta %llu: %d (writer %u, tag %llu, word %#llx)\n", (unsigned long long)seq, ret, writer,
		   (unsigned long long)m.tag, (unsigned long long)atomic_load(&seg->ring.slots[seq % M.depth].word));
	if (ret == 0) {
		FUZZ_CHECK(row_valid(&m) && writer < TS_MAX_MEMBERS, "slot_meta returned an invalid row");
		if (M.strict) {
			const struct batch *b = seq < MAXSEQ ? &M.b[seq] : NULL;
			FUZZ_CHECK(b && b->published && b->tag == m.tag && b->nsamples == m.nsamples && b->writer == writer,
				   "slot_meta of seq %llu differs from what was published", (unsigned long long)seq);
		}
	} else if (M.strict) {
		FUZZ_CHECK(ret == -EAGAIN || ret == -ESTALE, "slot_meta %d", ret);
	}
}

static void op_wait_next(int c)
{
	struct consumer *k = &M.c[c];
	struct ts_batch_meta m;
	unsigned writer;
	if (!k->attached)
		return;
	int ret = ts_ring_wait_next(seg, &k->r, 0, &m, &writer);
	if (ret == 0) {
		FUZZ_CHECK(row_valid(&m), "wait_next returned an invalid row");
		if (M.strict)
			FUZZ_CHECK(k->r.seq < MAXSEQ && M.b[k->r.seq].published && M.b[k->r.seq].tag == m.tag,
				   "wait_next row differs from the published one");
	} else if (ret == -ESTALE) {
		FUZZ_CHECK(!M.strict || !still_attached(c), "wait_next -ESTALE while still attached");
		k->attached = false;
		k->have_read = false;
	}
}

static void op_takeover(struct fz *f)
{
	int m = fz_u8(f) % M.nmem;
	uint64_t w = atomic_load(&seg->producer);
	atomic_store(&seg->producer, ts_producer_word(ts_producer_epoch(w) + 1, m));
}

static void op_scribble(struct fz *f)
{
	/* anywhere in the members and the ring: hostile or buggy peers */
	size_t lo = offsetof(struct ts_segment, members), hi = sizeof(struct ts_segment);
	size_t at = lo + (size_t)fz_u32(f) % ((hi - lo) / 8) * 8;
	uint64_t v = fz_u64(f);
	memcpy((char *)seg + at, &v, sizeof(v));
	M.strict = false;
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	seg = fz_members_init();
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct fz f = { data, size };
	memset(&M, 0, sizeof(M));
	M.depth = 1 + fz_u8(&f) % TS_MAX_DEPTH;
	M.nmem = 2 + fz_u8(&f) % (FZ_MAXMEM - 1);
	M.npos = 1 + fz_u8(&f) % 4;
	for (uint32_t p = 0; p < M.npos; p++) {
		uint8_t u = fz_u8(&f);
		/* mostly small samples, sometimes huge ones (2^20..2^35 bytes) near the length limit */
		M.unit[p] = u & 0x80 ? (uint64_t)(1 + (u & 0xf)) << (20 + fz_u8(&f) % 16) : 1 + (u & 0x7f);
	}
	M.strict = true;
	fz_members_reset(seg, M.depth, M.nmem);
	atomic_store(&seg->producer, ts_producer_word(1, 0));

	for (unsigned steps = 0; f.n && steps < 2000; steps++) {
		uint8_t op = fz_u8(&f);
		FUZZ_TRACE("op %#x (%zu bytes left)\n", op, f.n);
		int who = (op >> 4) % M.nmem;
		switch (op & 15) {
		case 0: op_begin(&f); break;
		case 1: op_commit(producer_index() >= 0 ? producer_index() : 0); break;
		case 2: op_begin(&f); op_commit(producer_index() >= 0 ? producer_index() : 0); break;
		case 3: op_attach(&f, who); break;
		case 4: op_peek(&f, who); break;
		case 5: op_advance(&f, who); break;
		case 6: op_peek(&f, who); op_advance(&f, who); break;
		case 7:
			if (M.c[who].attached)
				ts_ring_detach(seg, &M.c[who].r);
			M.c[who].attached = false;
			break;
		case 8: fz_dead[who] = !fz_dead[who]; break;
		case 9: atomic_store(&seg->members[who].heartbeat_ns, fz_clock_ns); break;
		case 10: fz_clock_ns += (uint64_t)fz_u16(&f) * MS / 16; break;
		case 11: op_takeover(&f); break;
		case 12:
			if (producer_index() >= 0 && producer_index() < (int)M.nmem && M.has_writer[producer_index()])
				(void)ts_ring_evict_laggards(seg, &M.w[producer_index()]);
			break;
		case 13: op_slot_meta(&f); break;
		case 14: op_wait_next(who); break;
		case 15:
			if (op >> 4 == 15)
				op_scribble(&f);
			else if (op >> 4 == 14)
				op_commit(who); /* a replaced producer finishing its claim */
			else
				op_abort(who);
			break;
		}
	}
	return 0;
}
