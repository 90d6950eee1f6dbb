/* SPDX-License-Identifier: MIT */
/*
 * libFuzzer target: the GPU ring's shared table (core/gpuring.c), in one
 * process on a table image in memory, with fake process liveness and time.
 * Several members are modelled by the pid and start time their records and
 * segment rows carry (as in fuzz_ring.c); nothing waits, nothing calls CUDA.
 *
 * Input: a header (depth, members), then operations, one selector byte each
 * (low nibble the operation, high nibble the member) plus arguments: add a
 * buffer record (fuzzer-chosen size and device), remove one (with its own or
 * a wrong identity), reclaim dead records, begin / make ready / drop a slot
 * (fuzzer-chosen seq, buffer, layout, sometimes out of bounds), hold and
 * hold again (a published seq or a neighbour, sometimes mapping the buffer
 * after), unhold or unmap (one or all), retire a record, kill or revive a
 * member, beat or move the clock, ask who holds a buffer and
 * whether a seq is pending, another process claiming a record half-way, a
 * whole producer step, and rarely a scribble over the table.
 *
 * Invariants, checked against a model after every call while only the API
 * has written the table:
 *   - buf_add takes the lowest free record, else the lowest one whose owner
 *     or claimer is dead and that no live member holds, else -ENOSPC: never
 *     a record a live process owns or claims, never one a live member holds;
 *   - reclaim_dead frees exactly the dead owners' unheld records and dead
 *     claims; the live-buffer counters match the records;
 *   - slot_ready refuses exactly the layouts that do not fit the buffer, or
 *     a slot that is not being written into that very record;
 *   - hold succeeds exactly for a READY slot of that seq and writer whose
 *     record is still the one published, and returns what was published
 *     (buffer, identity, layout, device, size, both handles), bit for bit;
 *     a successful hold shows in buf_held until unheld or its member dies;
 *   - a failed hold leaves no bit behind, hold_again keeps one it had;
 *   - buf_in_use is exactly "a live member other than self holds or maps
 *     it"; buf_serving is exactly "the record is that identity, not retired"
 *     (a record reused after retire serves again).
 * After a scribble only memory safety and the checks that need no model
 * remain: whatever hold returns lies inside its buffer on a valid device.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <string.h>
#include <unistd.h>

#include "fuzz_common.h"
#include "fuzz_members.h"
#include "gpuring.h"

#define MS      1000000ull
#define NBUF    TS_GPU_MAX_BUFS
#define SEQMASK ((1ULL << 46) - 1)

static struct ts_segment *seg;
static struct ts_gpuring g;

/* ---- the model ------------------------------------------------------------ */

enum rec_state { REC_FREE, REC_OWNED, REC_CLAIMED };

struct rec {
	enum rec_state state;
	int owner;      /* member that owns or claims it */
	uint64_t uniq;  /* OWNED: its identity */
	uint32_t device;
	uint64_t size;
	bool retired;
	unsigned char mem[TS_GPU_HANDLE], event[TS_GPU_HANDLE];
};

struct slot {
	uint64_t word;
	uint64_t uniq;
	uint32_t npos;
	uint64_t off[TS_MAX_POSITIONS], len[TS_MAX_POSITIONS];
};

static struct {
	uint32_t depth, nmem;
	bool strict;            /* only the API has written the table */
	uint32_t handles;       /* makes every record's handles different */
	struct rec r[NBUF];
	struct slot s[TS_MAX_DEPTH];
	uint64_t held[FZ_MAXMEM][NBUF / 64];
	uint64_t mapped[FZ_MAXMEM][NBUF / 64];
} M;

static bool alive(int m)
{
	return m >= 0 && m < (int)M.nmem && !fz_dead[m];
}

static bool held_by_live(unsigned b, int except)
{
	for (int m = 0; m < (int)M.nmem; m++)
		if (m != except && alive(m) && (M.held[m][b / 64] >> (b % 64) & 1))
			return true;
	return false;
}

static bool in_use_by_live(unsigned b, int except)
{
	for (int m = 0; m < (int)M.nmem; m++)
		if (m != except && alive(m) && ((M.held[m][b / 64] | M.mapped[m][b / 64]) >> (b % 64) & 1))
			return true;
	return false;
}

/* What buf_add's second pass and reclaim_dead may take. */
static bool reclaimable(unsigned b)
{
	const struct rec *r = &M.r[b];
	if (r->state == REC_CLAIMED)
		return !alive(r->owner);
	return r->state == REC_OWNED && !alive(r->owner) && !held_by_live(b, -1);
}

/* A record as another member left it: its pid and start time, not ours. */
static void own_as(unsigned b, int m)
{
	struct ts_gpu_buf *t = &g.t->bufs[b];
	t->owner_pid = FZ_PID0 + (uint32_t)m;
	t->owner_start = FZ_START(m);
}

static void check_counters(void)
{
	uint64_t live = 0, bytes = 0;
	for (unsigned b = 0; b < NBUF; b++)
		if (M.r[b].state == REC_OWNED) {
			live++;
			bytes += M.r[b].size;
		}
	uint64_t l = atomic_load(&g.t->counters.buffers_live), y = atomic_load(&g.t->counters.buffer_bytes);
	FUZZ_CHECK(l == live && y == bytes, "counters say %llu buffers of %llu bytes, records %llu of %llu",
		   (unsigned long long)l, (unsigned long long)y, (unsigned long long)live, (unsigned long long)bytes);
}

static void check_held_bits(void)
{
	for (int m = 0; m < (int)M.nmem; m++)
		for (unsigned i = 0; i < NBUF / 64; i++) {
			FUZZ_CHECK(atomic_load(&g.t->held[m][i]) == M.held[m][i], "member %d hold word %u: %#llx, model %#llx",
				   m, i, (unsigned long long)atomic_load(&g.t->held[m][i]), (unsigned long long)M.held[m][i]);
			FUZZ_CHECK(atomic_load(&g.t->mapped[m][i]) == M.mapped[m][i],
				   "member %d mapped word %u: %#llx, model %#llx", m, i,
				   (unsigned long long)atomic_load(&g.t->mapped[m][i]), (unsigned long long)M.mapped[m][i]);
		}
}

/* buf_serving(b, uniq) against the model. */
static void check_serving(unsigned b, uint64_t uniq)
{
	bool want = b < NBUF && M.r[b].state == REC_OWNED && M.r[b].uniq == uniq && ts_gpu_uniq_is_identity(uniq) &&
		    !M.r[b].retired;
	FUZZ_CHECK(!!ts_gpuring_buf_serving(&g, b, uniq) == want, "buf_serving(%u, %#llx) says %d", b,
		   (unsigned long long)uniq, !want);
}

/* ---- records ---------------------------------------------------------------- */

static void op_add(struct fz *f, int who)
{
	uint8_t how = fz_u8(f);
	uint64_t size = how & 0x80 ? fz_u64(f) : 1 + (uint64_t)fz_u16(f) * 256;
	uint32_t device = how & 0x40 ? fz_u8(f) : how & 3;
	unsigned char mem[TS_GPU_HANDLE], event[TS_GPU_HANDLE];
	M.handles++;
	for (unsigned i = 0; i < TS_GPU_HANDLE; i++) {
		mem[i] = (unsigned char)(M.handles * 7 + i);
		event[i] = (unsigned char)(M.handles * 13 + i * 3);
	}
	/* what the model expects: the lowest free record, else the lowest reclaimable one */
	int want = -ENOSPC;
	for (unsigned b = 0; b < NBUF && want < 0; b++)
		if (M.r[b].state == REC_FREE)
			want = (int)b;
	for (unsigned b = 0; b < NBUF && want < 0; b++)
		if (reclaimable(b))
			want = (int)b;
	if (device >= TS_GPU_MAX_DEVICE || size == 0)
		want = -EINVAL;
	uint64_t uniq = 0;
	int ret = ts_gpuring_buf_add(&g, seg, (unsigned)who, device, size, mem, event, &uniq);
	FUZZ_TRACE("add by %d (size %llu, device %u): %d\n", who, (unsigned long long)size, device, ret);
	FUZZ_CHECK(ret < (int)NBUF, "buf_add returned %d", ret);
	if (!M.strict)
		return;
	FUZZ_CHECK(ret == want, "buf_add returned %d, the model expected %d", ret, want);
	if (ret < 0)
		return;
	unsigned b = (unsigned)ret;
	FUZZ_CHECK(uniq != 0 && !(uniq & 1), "identity %#llx", (unsigned long long)uniq);
	FUZZ_CHECK(atomic_load(&g.t->bufs[b].uniq) == uniq, "record %u not published", b);
	own_as(b, who);
	M.r[b] = (struct rec){ .state = REC_OWNED, .owner = who, .uniq = uniq, .device = device, .size = size };
	memcpy(M.r[b].mem, mem, sizeof(mem));
	memcpy(M.r[b].event, event, sizeof(event));
	check_counters();
	check_serving(b, uniq);
}

static void op_remove(struct fz *f, int who)
{
	unsigned b = fz_u8(f) % NBUF;
	uint8_t how = fz_u8(f);
	bool own = !(how & 1);
	uint64_t uniq = own ? M.r[b].uniq : M.r[b].uniq ^ 2;
	if (how & 2) { /* retire: it stays, its mappers close it */
		ts_gpuring_buf_retire(&g, b, uniq);
		FUZZ_TRACE("retire %u by %d (%s identity)\n", b, who, own ? "its" : "a wrong");
		if (!M.strict)
			return;
		if (own && M.r[b].state == REC_OWNED)
			M.r[b].retired = true;
		check_serving(b, M.r[b].uniq);
		check_serving(b, uniq);
		return;
	}
	ts_gpuring_buf_remove(&g, b, uniq);
	FUZZ_TRACE("remove %u by %d (%s identity)\n", b, who, own ? "its" : "a wrong");
	if (!M.strict)
		return;
	if (own && M.r[b].state == REC_OWNED)
		M.r[b].state = REC_FREE;
	FUZZ_CHECK((atomic_load(&g.t->bufs[b].uniq) == 0) == (M.r[b].state == REC_FREE),
		   "record %u: uniq %#llx after remove", b, (unsigned long long)atomic_load(&g.t->bufs[b].uniq));
	check_counters();
}

static void op_reclaim(void)
{
	int want = 0;
	bool gone[NBUF];
	for (unsigned b = 0; b < NBUF; b++) {
		gone[b] = reclaimable(b);
		want += gone[b];
	}
	int ret = ts_gpuring_reclaim_dead(&g, seg);
	FUZZ_TRACE("reclaim: %d\n", ret);
	if (!M.strict)
		return;
	FUZZ_CHECK(ret == want, "reclaim_dead freed %d records, the model %d", ret, want);
	for (unsigned b = 0; b < NBUF; b++) {
		if (gone[b])
			M.r[b].state = REC_FREE;
		FUZZ_CHECK((atomic_load(&g.t->bufs[b].uniq) == 0) == (M.r[b].state == REC_FREE),
			   "record %u %s by reclaim_dead", b, gone[b] ? "kept" : "freed");
	}
	check_counters();
}

/* Another process claims a free record and stops half-way (or is still filling it in). */
static void op_foreign_claim(struct fz *f, int who)
{
	unsigned b = fz_u8(f) % NBUF;
	if (M.r[b].state != REC_FREE)
		return;
	uint64_t claim = (uint64_t)(FZ_PID0 + (uint32_t)who) << 32 | FZ_START(who) << 1 | 1;
	atomic_store(&g.t->bufs[b].uniq, claim);
	M.r[b] = (struct rec){ .state = REC_CLAIMED, .owner = who };
}

/* ---- slots ------------------------------------------------------------------ */

static uint64_t pick_seq(struct fz *f)
{
	uint8_t how = fz_u8(f);
	if (how & 0x80)
		return fz_u64(f) & SEQMASK;
	return how & 0x7f;
}

static void op_begin(struct fz *f, int who)
{
	uint64_t seq = pick_seq(f);
	uint8_t bsel = fz_u8(f);
	/* mostly a record this member owns; sometimes any index, even past the table */
	unsigned b = bsel;
	if (!(bsel & 0x80))
		for (unsigned k = 0; k < NBUF; k++) {
			unsigned c = (bsel + k) % NBUF;
			if (M.r[c].state == REC_OWNED && M.r[c].owner == who) {
				b = c;
				break;
			}
		}
	unsigned slot = fz_u8(f) & 1 ? (unsigned)(seq % M.depth) : fz_u8(f) % (M.depth + 1);
	ts_gpuring_slot_begin(&g, slot, (unsigned)who, seq, b);
	FUZZ_TRACE("begin slot %u seq %llu buf %u by %d\n", slot, (unsigned long long)seq, b, who);
	if (slot < M.depth)
		M.s[slot].word = ts_gpu_slot_word(TS_GPU_WRITING, (unsigned)who, b, seq);
	if (M.strict)
		for (unsigned k = 0; k < M.depth; k++)
			FUZZ_CHECK(atomic_load(&g.t->slots[k].word) == M.s[k].word, "slot %u word after begin", k);
}

/* A layout for `size` bytes, mostly fitting; *fits says whether it does. */
static uint32_t pick_layout(struct fz *f, uint64_t size, uint64_t *off, uint64_t *len, bool *fits)
{
	uint8_t how = fz_u8(f);
	uint32_t npos = how & 0x80 ? fz_u8(f) % (TS_MAX_POSITIONS + 2) : 1 + how % 4;
	*fits = npos >= 1 && npos <= TS_MAX_POSITIONS;
	uint64_t at = 0;
	for (uint32_t p = 0; p < npos && p < TS_MAX_POSITIONS; p++) {
		uint8_t k = fz_u8(f);
		if (k >= 0xf0) { /* arbitrary */
			off[p] = fz_u64(f);
			len[p] = fz_u64(f);
		} else {
			off[p] = at;
			len[p] = size / (npos + 1) + (k & 0x0f);
			at = off[p] + len[p];
		}
		if (off[p] > size || len[p] > size - off[p])
			*fits = false;
	}
	return npos;
}

static void op_ready(struct fz *f)
{
	unsigned slot = fz_u8(f) % (M.depth + 1);
	bool right = !(fz_u8(f) & 1);
	const struct slot *s = slot < M.depth ? &M.s[slot] : NULL;
	unsigned b = s ? ts_gpu_slot_buf(s->word) : 0;
	const struct rec *r = b < NBUF ? &M.r[b] : NULL;
	uint64_t uniq = r && right ? r->uniq : fz_u64(f);
	uint64_t off[TS_MAX_POSITIONS] = { 0 }, len[TS_MAX_POSITIONS] = { 0 };
	bool fits;
	uint32_t npos = pick_layout(f, r ? r->size : 0, off, len, &fits);
	int ret = ts_gpuring_slot_ready(&g, slot, uniq, npos, off, len);
	FUZZ_TRACE("ready slot %u (buf %u, npos %u): %d\n", slot, b, npos, ret);
	FUZZ_CHECK(ret == 0 || ret == -EINVAL, "slot_ready %d", ret);
	if (!M.strict)
		return;
	bool ok = s && ts_gpu_slot_state(s->word) == TS_GPU_WRITING && r && r->state == REC_OWNED && r->uniq == uniq &&
		  npos >= 1 && npos <= TS_MAX_POSITIONS && fits;
	FUZZ_CHECK(ok == (ret == 0), "slot_ready returned %d, the model expected %s", ret, ok ? "0" : "-EINVAL");
	if (!ok)
		return;
	struct slot *w = &M.s[slot];
	w->word = ts_gpu_slot_word(TS_GPU_READY, (unsigned)ts_gpu_slot_writer(s->word), b, ts_gpu_slot_seq(s->word));
	w->uniq = uniq;
	w->npos = npos;
	memcpy(w->off, off, sizeof(off));
	memcpy(w->len, len, sizeof(len));
}

static void op_drop(struct fz *f)
{
	unsigned slot = fz_u8(f) % (M.depth + 1);
	ts_gpuring_slot_drop(&g, slot);
	if (slot < M.depth)
		M.s[slot].word = ts_gpu_slot_word(TS_GPU_FREE, 0, 0, 0);
}

static void op_pending(struct fz *f, int who)
{
	uint64_t seq = pick_seq(f);
	int ret = ts_gpuring_slot_pending(&g, seq, who);
	int passed = ts_gpuring_slot_passed(&g, seq);
	if (!M.strict)
		return;
	uint64_t w = M.s[seq % M.depth].word;
	bool want = ts_gpu_slot_state(w) == TS_GPU_WRITING && ts_gpu_slot_writer(w) == who && ts_gpu_slot_seq(w) == seq;
	FUZZ_CHECK(!!ret == want, "slot_pending(%llu, %d) = %d", (unsigned long long)seq, who, ret);
	FUZZ_CHECK(!!passed == (ts_gpu_slot_seq(w) > seq), "slot_passed(%llu) = %d", (unsigned long long)seq, passed);
}

/* ---- holds ------------------------------------------------------------------ */

/* What hold() must return for (seq, writer), from the model. */
static int expected_hold(uint64_t seq, int writer)
{
	const struct slot *s = &M.s[seq % M.depth];
	if (ts_gpu_slot_seq(s->word) != seq || ts_gpu_slot_writer(s->word) != writer)
		return ts_gpu_slot_seq(s->word) > seq ? -ESTALE : -EAGAIN;
	if (ts_gpu_slot_state(s->word) != TS_GPU_READY)
		return -EAGAIN;
	const struct rec *r = &M.r[ts_gpu_slot_buf(s->word)];
	return r->state == REC_OWNED && r->uniq == s->uniq ? 0 : -ESTALE;
}

/* Whatever the table holds, a successful hold names a reachable range on a valid device. */
static void check_held_generic(int ret, const struct ts_gpu_held *h)
{
	if (ret)
		return;
	FUZZ_CHECK(h->buf < NBUF && h->npos >= 1 && h->npos <= TS_MAX_POSITIONS, "held buf %u npos %u", h->buf, h->npos);
	FUZZ_CHECK(h->device < TS_GPU_MAX_DEVICE && h->size > 0, "held device %u size %llu", h->device,
		   (unsigned long long)h->size);
	for (uint32_t p = 0; p < h->npos; p++)
		FUZZ_CHECK(h->off[p] <= h->size && h->len[p] <= h->size - h->off[p], "position %u: off %llu len %llu in %llu",
			   p, (unsigned long long)h->off[p], (unsigned long long)h->len[p], (unsigned long long)h->size);
}

static void op_hold(struct fz *f, int who, bool again)
{
	uint8_t how = fz_u8(f);
	const struct slot *s = &M.s[(how & 0x3f) % M.depth];
	uint64_t seq = ts_gpu_slot_seq(s->word);
	if (how & 0x40)
		seq = (how & 0x80 ? seq + M.depth : seq >= M.depth ? seq - M.depth : seq + 1) & SEQMASK;
	uint8_t wb = fz_u8(f);
	int writer = wb & 1 ? ts_gpu_slot_writer(s->word) : who;
	struct ts_gpu_held h;
	memset(&h, 0, sizeof(h));
	int ret = again ? ts_gpuring_hold_again(&g, who, seq, writer, &h) : ts_gpuring_hold(&g, who, seq, writer, &h);
	FUZZ_TRACE("hold%s seq %llu writer %d by %d: %d (buf %u)\n", again ? "_again" : "", (unsigned long long)seq,
		   writer, who, ret, ret ? 0 : h.buf);
	check_held_generic(ret, &h);
	if (!M.strict)
		return;
	int want = expected_hold(seq, writer);
	FUZZ_CHECK(ret == want, "hold of seq %llu by writer %d returned %d, the model %d", (unsigned long long)seq, writer,
		   ret, want);
	if (ret) {
		check_held_bits(); /* nothing left behind (hold_again keeps what it had) */
		return;
	}
	unsigned b = ts_gpu_slot_buf(M.s[seq % M.depth].word);
	const struct slot *w = &M.s[seq % M.depth];
	const struct rec *r = &M.r[b];
	FUZZ_CHECK(h.buf == b && h.uniq == r->uniq && h.device == r->device && h.size == r->size &&
			   h.owner_pid == FZ_PID0 + (uint32_t)r->owner && h.npos == w->npos,
		   "hold of seq %llu: buf %u uniq %#llx device %u size %llu pid %u npos %u differ from the published ones",
		   (unsigned long long)seq, h.buf, (unsigned long long)h.uniq, h.device, (unsigned long long)h.size,
		   h.owner_pid, h.npos);
	FUZZ_CHECK(memcmp(h.off, w->off, w->npos * sizeof(*h.off)) == 0 && memcmp(h.len, w->len, w->npos * sizeof(*h.len)) == 0,
		   "hold of seq %llu: layout differs from the published one", (unsigned long long)seq);
	FUZZ_CHECK(memcmp(h.mem, r->mem, TS_GPU_HANDLE) == 0 && memcmp(h.event, r->event, TS_GPU_HANDLE) == 0,
		   "hold of seq %llu: handles differ from the record's", (unsigned long long)seq);
	M.held[who][b / 64] |= 1ull << (b % 64);
	if (wb & 2) { /* opened while held, as a consumer does */
		ts_gpuring_map(&g, who, b);
		M.mapped[who][b / 64] |= 1ull << (b % 64);
	}
	check_held_bits();
	check_serving(b, r->uniq);
	if (alive(who))
		FUZZ_CHECK(ts_gpuring_buf_held(&g, seg, b, -1), "buffer %u held by live member %d, buf_held says no", b, who);
}

static void op_unhold(struct fz *f, int who)
{
	uint8_t sel = fz_u8(f);
	unsigned b = sel & 0x80 ? fz_u8(f) : ts_gpu_slot_buf(M.s[fz_u8(f) % M.depth].word);
	if ((sel & 0x60) == 0x60) { /* every mapping of ours gone (a reused member slot) */
		ts_gpuring_unmap_all(&g, who);
		memset(M.mapped[who], 0, sizeof(M.mapped[who]));
	} else if (sel & 0x40) { /* closed our mapping */
		ts_gpuring_unmap(&g, who, b);
		if (b < NBUF)
			M.mapped[who][b / 64] &= ~(1ull << (b % 64));
	} else {
		ts_gpuring_unhold(&g, who, b);
		if (b < NBUF)
			M.held[who][b / 64] &= ~(1ull << (b % 64));
	}
	if (M.strict)
		check_held_bits();
}

static void op_unhold_all(int who)
{
	ts_gpuring_unhold_all(&g, who);
	memset(M.held[who], 0, sizeof(M.held[who]));
	if (M.strict)
		check_held_bits();
}

static void op_held(struct fz *f, int who)
{
	unsigned b = fz_u8(f) & 0x80 ? fz_u8(f) : ts_gpu_slot_buf(M.s[fz_u8(f) % M.depth].word);
	uint8_t how = fz_u8(f);
	int self = how & 1 ? who : -1;
	if (how & 2) {
		int ret = ts_gpuring_buf_in_use(&g, seg, b, self);
		if (M.strict)
			FUZZ_CHECK(!!ret == (b < NBUF && in_use_by_live(b, self)), "buf_in_use(%u, %d) = %d", b, self, ret);
		return;
	}
	int ret = ts_gpuring_buf_held(&g, seg, b, self);
	if (M.strict)
		FUZZ_CHECK(!!ret == (b < NBUF && held_by_live(b, self)), "buf_held(%u, %d) = %d", b, self, ret);
}

/* ---- the rest ----------------------------------------------------------------- */

/* A producer's whole step: a record, a slot begun for it, made ready. */
static void op_produce(struct fz *f, int who)
{
	uint64_t seq = fz_u8(f);
	uint64_t size = 4096 + (uint64_t)fz_u8(f) * 1024;
	unsigned char mem[TS_GPU_HANDLE], event[TS_GPU_HANDLE];
	M.handles++;
	for (unsigned i = 0; i < TS_GPU_HANDLE; i++) {
		mem[i] = (unsigned char)(M.handles * 7 + i);
		event[i] = (unsigned char)(M.handles * 13 + i * 3);
	}
	uint64_t uniq;
	int b = ts_gpuring_buf_add(&g, seg, (unsigned)who, 0, size, mem, event, &uniq);
	if (b < 0 || !M.strict)
		return;
	own_as((unsigned)b, who);
	M.r[b] = (struct rec){ .state = REC_OWNED, .owner = who, .uniq = uniq, .device = 0, .size = size };
	memcpy(M.r[b].mem, mem, sizeof(mem));
	memcpy(M.r[b].event, event, sizeof(event));
	unsigned slot = (unsigned)(seq % M.depth);
	ts_gpuring_slot_begin(&g, slot, (unsigned)who, seq, (unsigned)b);
	uint64_t off[2] = { 0, size / 2 }, len[2] = { size / 2, size - size / 2 };
	int ret = ts_gpuring_slot_ready(&g, slot, uniq, 2, off, len);
	FUZZ_TRACE("produce seq %llu by %d in buf %d: %d\n", (unsigned long long)seq, who, b, ret);
	FUZZ_CHECK(ret == 0, "a producer's own slot_ready failed: %d", ret);
	M.s[slot] = (struct slot){ .word = ts_gpu_slot_word(TS_GPU_READY, (unsigned)who, (unsigned)b, seq), .uniq = uniq,
				   .npos = 2 };
	memcpy(M.s[slot].off, off, sizeof(off));
	memcpy(M.s[slot].len, len, sizeof(len));
	check_counters();
}

static void op_scribble(struct fz *f)
{
	/* anywhere in the table: a hostile or buggy peer */
	size_t at = (size_t)fz_u32(f) % (sizeof(struct ts_gpu_table) / 8) * 8;
	uint64_t v = fz_u64(f);
	memcpy((char *)g.t + at, &v, sizeof(v));
	M.strict = false;
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	seg = fz_members_init();
	fz_self_start = 999; /* buf_add names this process while it fills a record in */
	g.size = (sizeof(struct ts_gpu_table) + 63) / 64 * 64;
	g.t = aligned_alloc(64, g.size);
	if (!g.t)
		abort();
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct fz f = { data, size };
	memset(&M, 0, sizeof(M));
	M.depth = 1 + fz_u8(&f) % TS_MAX_DEPTH;
	M.nmem = 2 + fz_u8(&f) % (FZ_MAXMEM - 1);
	M.strict = true;
	fz_members_reset(seg, M.depth, M.nmem);
	/* the table as ts_gpuring_open() creates it */
	memset(g.t, 0, g.size);
	g.t->magic = TS_GPU_MAGIC;
	g.t->version = TS_GPU_VERSION;
	g.t->depth = M.depth;
	g.t->size = g.size;
	g.t->uid = (uint32_t)getuid();
	g.t->nbufs = TS_GPU_MAX_BUFS;
	g.depth = M.depth; /* as ts_gpuring_open() leaves it */
	g.uid = (uint32_t)getuid();
	FUZZ_CHECK(ts_gpuring_valid(g.t, g.size, (uint32_t)getuid()) == 0, "a fresh table is invalid");

	for (unsigned steps = 0; f.n && steps < 2000; steps++) {
		uint8_t op = fz_u8(&f);
		int who = (op >> 4) % M.nmem;
		switch (op & 15) {
		case 0: op_add(&f, who); break;
		case 1: op_remove(&f, who); break;
		case 2: op_reclaim(); break;
		case 3: op_begin(&f, who); break;
		case 4: op_ready(&f); break;
		case 5: op_drop(&f); break;
		case 6: op_hold(&f, who, false); break;
		case 7: op_hold(&f, who, true); break;
		case 8: op_unhold(&f, who); break;
		case 9: op_unhold_all(who); break;
		case 10: fz_dead[who] = !fz_dead[who]; break;
		case 11:
			if (op >> 4 & 8)
				fz_clock_ns += (uint64_t)fz_u16(&f) * MS / 16;
			else
				atomic_store(&seg->members[who].heartbeat_ns, fz_clock_ns);
			break;
		case 12: op_held(&f, who); break;
		case 13: op_pending(&f, who); break;
		case 14: op_produce(&f, who); break;
		case 15:
			if (op >> 4 == 15)
				op_scribble(&f);
			else
				op_foreign_claim(&f, who);
			break;
		}
	}
	return 0;
}
