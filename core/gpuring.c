/* SPDX-License-Identifier: MIT */
/* The GPU ring's shared bookkeeping (see gpuring.h). */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "feed.h"
#include "gpuring.h"
#include "prim.h"
#include "session.h"

/*
 * A record's uniq word: 0 free; odd while a process fills the record in (the
 * claim names it: pid, and the low 31 bits of its start time); else even,
 * the record's identity. A claimer that dies half-way is seen dead by its
 * claim, and the record is free again.
 */
static inline int uniq_is_claim(uint64_t u)
{
	return (u & 1) != 0;
}

static uint64_t claim_word(const struct ts_ident *me)
{
	return (uint64_t)me->pid << 32 | (me->start_time & 0x7fffffffull) << 1 | 1;
}

/* The process a claim names is gone (or is another one with the pid since). */
static int claimer_dead(uint64_t claim)
{
	uint64_t start;
	int r = ts_prim.proc_start_time((uint32_t)(claim >> 32), &start);
	if (r)
		return ts_proc_gone(r);
	return (start & 0x7fffffffull) != (claim >> 1 & 0x7fffffffull);
}

static size_t table_bytes(void)
{
	long page = sysconf(_SC_PAGESIZE);
	size_t p = page > 0 ? (size_t)page : 4096;
	return (sizeof(struct ts_gpu_table) + p - 1) / p * p;
}

int ts_gpuring_path(char *buf, size_t n, const char *session, uint64_t incarnation)
{
	int len = snprintf(buf, n, "%s/" TS_FEED_PREFIX "%u.%s.%llx.gpu", ts_shm_dir(), (unsigned)getuid(), session,
			   (unsigned long long)incarnation);
	return len < 0 || (size_t)len >= n ? -ENAMETOOLONG : 0;
}

int ts_gpuring_valid(const struct ts_gpu_table *t, size_t size, uint32_t uid)
{
	if (size < sizeof(*t) || t->magic != TS_GPU_MAGIC || t->version != TS_GPU_VERSION)
		return -EPROTO;
	if (t->size != size || t->uid != uid || t->depth < 1 || t->depth > TS_MAX_DEPTH ||
	    t->nbufs != TS_GPU_MAX_BUFS)
		return -EBADMSG;
	return 0;
}

int ts_gpuring_intact(const struct ts_gpuring *g)
{
	if (!g->t || ts_gpuring_valid(g->t, g->size, g->uid) ||
	    __atomic_load_n(&g->t->depth, __ATOMIC_RELAXED) != g->depth)
		return -EBADMSG;
	return 0;
}

static int map_fd(struct ts_gpuring *g, int fd)
{
	struct stat sb;
	if (fstat(fd, &sb))
		return ts_neg_errno();
	int ret = ts_shm_file_ours(&sb);
	if (ret)
		return ret;
	if ((uint64_t)sb.st_size != table_bytes())
		return -EPROTO;
	void *m = mmap(NULL, (size_t)sb.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (m == MAP_FAILED)
		return ts_neg_errno();
	/* the depth is read once, after validation, and range-checked again: a peer may write it in between */
	uint32_t depth = 0;
	if (!(ret = ts_gpuring_valid(m, (size_t)sb.st_size, (uint32_t)getuid()))) {
		depth = __atomic_load_n(&((struct ts_gpu_table *)m)->depth, __ATOMIC_RELAXED);
		if (depth < 1 || depth > TS_MAX_DEPTH)
			ret = -EBADMSG;
	}
	if (ret) {
		munmap(m, (size_t)sb.st_size);
		return ret;
	}
	g->t = m;
	g->size = (size_t)sb.st_size;
	g->depth = depth;
	g->uid = (uint32_t)getuid();
	return 0;
}

/* Created under a temporary name and linked into place: nobody maps a half-made table. */
static int create(const char *path, uint32_t depth)
{
	char tmp[TS_PATH_MAX + 48];
	size_t size = table_bytes();
	int fd = ts_shm_create_tmp(path, tmp, sizeof(tmp));
	if (fd < 0)
		return fd;
	int ret = ts_prim_reserve(fd, 0, size);
	if (ret == -EOPNOTSUPP || ret == -EINVAL)
		ret = ftruncate(fd, (off_t)size) ? ts_neg_errno() : 0;
	struct ts_gpu_table *t = ret ? MAP_FAILED : mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (t != MAP_FAILED) {
		t->magic = TS_GPU_MAGIC;
		t->version = TS_GPU_VERSION;
		t->depth = depth;
		t->size = size;
		t->uid = (uint32_t)getuid();
		t->nbufs = TS_GPU_MAX_BUFS;
		munmap(t, size);
		ret = link(tmp, path) && errno != EEXIST ? ts_neg_errno() : 0;
	} else if (!ret) {
		ret = ts_neg_errno();
	}
	unlink(tmp);
	close(fd);
	return ret;
}

int ts_gpuring_open(struct ts_gpuring *g, const char *path, uint32_t depth)
{
	memset(g, 0, sizeof(*g));
	if (depth < 1 || depth > TS_MAX_DEPTH)
		return -EINVAL;
	for (int tries = 0; tries < 4; tries++) {
		int fd = open(path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
		if (fd >= 0) {
			int ret = map_fd(g, fd);
			close(fd);
			return ret;
		}
		if (errno != ENOENT)
			return ts_neg_errno();
		int ret = create(path, depth);
		if (ret)
			return ret;
	}
	return -EAGAIN;
}

void ts_gpuring_close(struct ts_gpuring *g)
{
	if (g->t)
		munmap(g->t, g->size);
	memset(g, 0, sizeof(*g));
}

/*
 * The depth validated at open, while the table still says so: a table whose
 * depth was rewritten since (a buggy or hostile peer) is corrupt, and every
 * call refuses it rather than index slots by another geometry. 0 then.
 */
static uint32_t depth_of(const struct ts_gpuring *g)
{
	uint32_t d = __atomic_load_n(&g->t->depth, __ATOMIC_RELAXED);
	return d == g->depth ? d : 0; /* g->depth is 1..TS_MAX_DEPTH, or 0 before open */
}

/* ---- holds ------------------------------------------------------------------------------ */

static inline uint64_t bit(unsigned buf)
{
	return 1ull << (buf % 64);
}

/* A member whose holds count: present and not dead (a stopped one may still copy when it wakes). */
static int holder_counts(const struct ts_segment *seg, unsigned m)
{
	return ts_member_alive(ts_member_health(seg, m, ts_now_ns()));
}

int ts_gpuring_buf_held(const struct ts_gpuring *g, const struct ts_segment *seg, unsigned buf, int self)
{
	if (buf >= TS_GPU_MAX_BUFS)
		return 0;
	for (unsigned m = 0; m < TS_MAX_MEMBERS; m++) {
		if ((int)m == self)
			continue;
		/* seq_cst: pairs with the consumer's hold-then-recheck (header comment) */
		if ((atomic_load(&g->t->held[m][buf / 64]) & bit(buf)) && holder_counts(seg, m))
			return 1;
	}
	return 0;
}

/*
 * Held, then mapped, per member, both seq_cst: a consumer sets its mapped
 * bit before it clears its hold, so a hold we see cleared means its mapped
 * bit (if it mapped the buffer) is there to see.
 */
int ts_gpuring_buf_in_use(const struct ts_gpuring *g, const struct ts_segment *seg, unsigned buf, int self)
{
	if (buf >= TS_GPU_MAX_BUFS)
		return 0;
	for (unsigned m = 0; m < TS_MAX_MEMBERS; m++) {
		if ((int)m == self)
			continue;
		uint64_t h = atomic_load(&g->t->held[m][buf / 64]);
		uint64_t mp = atomic_load(&g->t->mapped[m][buf / 64]);
		if (((h | mp) & bit(buf)) && holder_counts(seg, m))
			return 1;
	}
	return 0;
}

/* held[] and mapped[] rows: member self's word with buffer buf's bit, or NULL out of range. */
typedef _Atomic uint64_t member_rows[TS_MAX_MEMBERS][TS_GPU_MAX_BUFS / 64];

static _Atomic uint64_t *member_word(member_rows *rows, int self, unsigned buf)
{
	return self < 0 || self >= (int)TS_MAX_MEMBERS || buf >= TS_GPU_MAX_BUFS ? NULL : &(*rows)[self][buf / 64];
}

static void member_clear(member_rows *rows, int self)
{
	if (self < 0 || self >= (int)TS_MAX_MEMBERS)
		return;
	for (unsigned i = 0; i < TS_GPU_MAX_BUFS / 64; i++)
		atomic_store_explicit(&(*rows)[self][i], 0, memory_order_release);
}

void ts_gpuring_map(struct ts_gpuring *g, int self, unsigned buf)
{
	_Atomic uint64_t *w = member_word(&g->t->mapped, self, buf);
	if (w)
		atomic_fetch_or(w, bit(buf)); /* seq_cst: before the unhold */
}

void ts_gpuring_unmap(struct ts_gpuring *g, int self, unsigned buf)
{
	_Atomic uint64_t *w = member_word(&g->t->mapped, self, buf);
	if (w) /* release: after our close of the mapping */
		atomic_fetch_and_explicit(w, ~bit(buf), memory_order_release);
}

void ts_gpuring_unmap_all(struct ts_gpuring *g, int self)
{
	member_clear(&g->t->mapped, self);
}

void ts_gpuring_unhold(struct ts_gpuring *g, int self, unsigned buf)
{
	_Atomic uint64_t *w = member_word(&g->t->held, self, buf);
	if (w)
		atomic_fetch_and_explicit(w, ~bit(buf), memory_order_release);
}

void ts_gpuring_unhold_all(struct ts_gpuring *g, int self)
{
	member_clear(&g->t->held, self);
}

/*
 * Seqlock copies: the fields of records and slots are written while readers
 * may copy them (a reader then drops its copy at the re-check), so both
 * sides use relaxed atomic accesses, ordered by a release fence after the
 * claim (writer) and an acquire fence before the re-check (reader).
 */
static void load_u64s(uint64_t *dst, const uint64_t *src, size_t n)
{
	for (size_t i = 0; i < n; i++)
		dst[i] = __atomic_load_n(&src[i], __ATOMIC_RELAXED);
}

static void store_u64s(uint64_t *dst, const uint64_t *src, size_t n)
{
	for (size_t i = 0; i < n; i++)
		__atomic_store_n(&dst[i], src[i], __ATOMIC_RELAXED);
}

static void load_bytes(unsigned char *dst, const unsigned char *src, size_t n)
{
	for (size_t i = 0; i < n; i++)
		dst[i] = __atomic_load_n(&src[i], __ATOMIC_RELAXED);
}

static void store_bytes(unsigned char *dst, const unsigned char *src, size_t n)
{
	for (size_t i = 0; i < n; i++)
		__atomic_store_n(&dst[i], src[i], __ATOMIC_RELAXED);
}

/* ---- buffer records ------------------------------------------------------------------------ */

static uint64_t next_uniq(void)
{
	static _Atomic uint64_t counter;
	/* unique across processes: pid, a per-process counter, the time */
	uint64_t u = ((uint64_t)getpid() << 40 ^ (atomic_fetch_add(&counter, 1) + 1) << 20 ^ ts_prim_realtime_ns()) & ~1ull;
	return u ? u : 2;
}

/* A record another process left behind: its owner is gone and no live member holds it. */
static int reclaimable(const struct ts_gpuring *g, const struct ts_segment *seg, unsigned b)
{
	const struct ts_gpu_buf *r = &g->t->bufs[b];
	uint64_t u = atomic_load_explicit(&r->uniq, memory_order_acquire);
	if (u == 0 || uniq_is_claim(u))
		return 0;
	if (ts_proc_liveness(__atomic_load_n(&r->owner_pid, __ATOMIC_RELAXED),
			     __atomic_load_n(&r->owner_start, __ATOMIC_RELAXED)) == TS_PROC_ALIVE)
		return 0;
	return !ts_gpuring_buf_held(g, seg, b, -1);
}

int ts_gpuring_reclaim_dead(struct ts_gpuring *g, const struct ts_segment *seg)
{
	int n = 0;
	for (unsigned b = 0; b < TS_GPU_MAX_BUFS; b++) {
		_Atomic uint64_t *word = &g->t->bufs[b].uniq;
		uint64_t u = atomic_load_explicit(word, memory_order_acquire);
		if (uniq_is_claim(u) ? claimer_dead(u) && atomic_compare_exchange_strong(word, &u, 0)
				     : u && reclaimable(g, seg, b) && (ts_gpuring_buf_remove(g, b, u), 1))
			n++;
	}
	return n;
}

int ts_gpuring_buf_add(struct ts_gpuring *g, const struct ts_segment *seg, unsigned owner, uint32_t device,
		       uint64_t size, const void *mem, const void *event, uint64_t *uniq)
{
	struct ts_ident me;
	int ret = ts_self_ident(&me);
	if (ret)
		return ret;
	if (owner >= TS_MAX_MEMBERS || device >= TS_GPU_MAX_DEVICE || size == 0)
		return -EINVAL;
	for (int pass = 0; pass < 2; pass++) {
		for (unsigned b = 0; b < TS_GPU_MAX_BUFS; b++) {
			struct ts_gpu_buf *r = &g->t->bufs[b];
			uint64_t expected = atomic_load_explicit(&r->uniq, memory_order_acquire);
			/* free; or (second pass) a dead owner's record, or a dead claimer's claim */
			if (expected != 0 && !(pass == 1 && (uniq_is_claim(expected) ? claimer_dead(expected)
										  : reclaimable(g, seg, b))))
				continue;
			if (!atomic_compare_exchange_strong(&r->uniq, &expected, claim_word(&me)))
				continue;
			if (expected != 0 && !uniq_is_claim(expected)) { /* a dead owner's record: it stops counting */
				atomic_fetch_sub_explicit(&g->t->counters.buffers_live, 1, memory_order_relaxed);
				atomic_fetch_sub_explicit(&g->t->counters.buffer_bytes,
							  __atomic_load_n(&r->size, __ATOMIC_RELAXED), memory_order_relaxed);
			}
			/* release fence: a reader whose copy sees a store below sees the claim at its re-check */
			atomic_thread_fence(memory_order_release);
			__atomic_store_n(&r->owner, owner, __ATOMIC_RELAXED);
			__atomic_store_n(&r->owner_pid, me.pid, __ATOMIC_RELAXED);
			__atomic_store_n(&r->owner_start, me.start_time, __ATOMIC_RELAXED);
			__atomic_store_n(&r->device, device, __ATOMIC_RELAXED);
			__atomic_store_n(&r->size, size, __ATOMIC_RELAXED);
			atomic_store_explicit(&r->retired, 0, memory_order_relaxed);
			store_bytes(r->mem, mem, TS_GPU_HANDLE);
			store_bytes(r->event, event, TS_GPU_HANDLE);
			/* counted before it is published: a claimer that dies in between leaves
			 * the count one high, never below what the records hold */
			atomic_fetch_add_explicit(&g->t->counters.buffers_live, 1, memory_order_relaxed);
			atomic_fetch_add_explicit(&g->t->counters.buffer_bytes, size, memory_order_relaxed);
			*uniq = next_uniq();
			atomic_store_explicit(&r->uniq, *uniq, memory_order_release);
			return (int)b;
		}
	}
	return -ENOSPC;
}

void ts_gpuring_buf_remove(struct ts_gpuring *g, unsigned buf, uint64_t uniq)
{
	/* 0 or a claim would "remove" a free or half-made record and skew the counters */
	if (buf >= TS_GPU_MAX_BUFS || !ts_gpu_uniq_is_identity(uniq))
		return;
	struct ts_gpu_buf *r = &g->t->bufs[buf];
	uint64_t size = __atomic_load_n(&r->size, __ATOMIC_RELAXED);
	if (atomic_compare_exchange_strong(&r->uniq, &uniq, 0)) {
		atomic_fetch_sub_explicit(&g->t->counters.buffers_live, 1, memory_order_relaxed);
		atomic_fetch_sub_explicit(&g->t->counters.buffer_bytes, size, memory_order_relaxed);
	}
}

int ts_gpuring_buf_current(const struct ts_gpuring *g, unsigned buf, uint64_t uniq)
{
	return buf < TS_GPU_MAX_BUFS && ts_gpu_uniq_is_identity(uniq) &&
	       atomic_load_explicit(&g->t->bufs[buf].uniq, memory_order_acquire) == uniq;
}

void ts_gpuring_buf_retire(struct ts_gpuring *g, unsigned buf, uint64_t uniq)
{
	if (ts_gpuring_buf_current(g, buf, uniq))
		atomic_store_explicit(&g->t->bufs[buf].retired, 1, memory_order_release);
}

int ts_gpuring_buf_serving(const struct ts_gpuring *g, unsigned buf, uint64_t uniq)
{
	/* a record reused since reads as not current, whatever its flag says */
	return ts_gpuring_buf_current(g, buf, uniq) &&
	       !atomic_load_explicit(&g->t->bufs[buf].retired, memory_order_acquire);
}

/* ---- slots ------------------------------------------------------------------------------------- */

void ts_gpuring_slot_begin(struct ts_gpuring *g, unsigned slot, unsigned writer, uint64_t seq, unsigned buf)
{
	if (slot >= depth_of(g))
		return;
	/* seq_cst: the caller checks holds of `buf` only after this is visible */
	atomic_store(&g->t->slots[slot].word, ts_gpu_slot_word(TS_GPU_WRITING, writer, buf, seq));
}

int ts_gpuring_slot_ready(struct ts_gpuring *g, unsigned slot, uint64_t uniq, uint32_t npos, const uint64_t *off,
			  const uint64_t *len)
{
	if (slot >= depth_of(g) || npos < 1 || npos > TS_MAX_POSITIONS)
		return -EINVAL;
	struct ts_gpu_slot *s = &g->t->slots[slot];
	uint64_t w = atomic_load_explicit(&s->word, memory_order_relaxed);
	unsigned b = ts_gpu_slot_buf(w);
	if (ts_gpu_slot_state(w) != TS_GPU_WRITING || b >= TS_GPU_MAX_BUFS || !ts_gpuring_buf_current(g, b, uniq))
		return -EINVAL;
	uint64_t size = __atomic_load_n(&g->t->bufs[b].size, __ATOMIC_RELAXED);
	for (uint32_t p = 0; p < npos; p++)
		if (off[p] > size || len[p] > size - off[p])
			return -EINVAL;
	/* release fence: a consumer whose copy sees a store below sees WRITING at its re-check */
	atomic_thread_fence(memory_order_release);
	__atomic_store_n(&s->uniq, uniq, __ATOMIC_RELAXED);
	__atomic_store_n(&s->npos, npos, __ATOMIC_RELAXED);
	store_u64s(s->off, off, npos);
	store_u64s(s->len, len, npos);
	/* release: the fields above (and the event recorded before) come first */
	atomic_store_explicit(&s->word,
			      ts_gpu_slot_word(TS_GPU_READY, (unsigned)ts_gpu_slot_writer(w), b, ts_gpu_slot_seq(w)),
			      memory_order_release);
	return 0;
}

void ts_gpuring_slot_drop(struct ts_gpuring *g, unsigned slot)
{
	if (slot < depth_of(g))
		atomic_store(&g->t->slots[slot].word, ts_gpu_slot_word(TS_GPU_FREE, 0, 0, 0));
}

int ts_gpuring_slot_pending(const struct ts_gpuring *g, uint64_t seq, int writer)
{
	uint32_t depth = depth_of(g);
	if (!depth)
		return 0;
	uint64_t w = atomic_load_explicit(&g->t->slots[seq % depth].word, memory_order_acquire);
	return ts_gpu_slot_state(w) == TS_GPU_WRITING && ts_gpu_slot_writer(w) == writer &&
	       ts_gpu_slot_seq(w) == (seq & ((1ULL << 46) - 1));
}

int ts_gpuring_slot_passed(const struct ts_gpuring *g, uint64_t seq)
{
	uint32_t depth = depth_of(g);
	if (!depth)
		return 1;
	uint64_t w = atomic_load_explicit(&g->t->slots[seq % depth].word, memory_order_acquire);
	return ts_gpu_slot_seq(w) > ts_gpu_slot_seq(seq);
}

/* The snapshot `out` of a READY slot and its buffer, checked against itself. */
static int snapshot(const struct ts_gpuring *g, const struct ts_gpu_slot *s, unsigned b, struct ts_gpu_held *out)
{
	const struct ts_gpu_buf *r = &g->t->bufs[b];
	out->buf = b;
	out->uniq = __atomic_load_n(&s->uniq, __ATOMIC_RELAXED);
	out->npos = __atomic_load_n(&s->npos, __ATOMIC_RELAXED);
	if (out->npos < 1 || out->npos > TS_MAX_POSITIONS)
		return -EBADMSG;
	load_u64s(out->off, s->off, TS_MAX_POSITIONS);
	load_u64s(out->len, s->len, TS_MAX_POSITIONS);
	if (atomic_load_explicit(&r->uniq, memory_order_acquire) != out->uniq)
		return -ESTALE;
	out->device = __atomic_load_n(&r->device, __ATOMIC_RELAXED);
	out->owner_pid = __atomic_load_n(&r->owner_pid, __ATOMIC_RELAXED);
	out->size = __atomic_load_n(&r->size, __ATOMIC_RELAXED);
	load_bytes(out->mem, r->mem, TS_GPU_HANDLE);
	load_bytes(out->event, r->event, TS_GPU_HANDLE);
	if (out->device >= TS_GPU_MAX_DEVICE || out->size == 0)
		return -EBADMSG;
	for (uint32_t p = 0; p < out->npos; p++)
		if (out->off[p] > out->size || out->len[p] > out->size - out->off[p])
			return -EBADMSG;
	return 0;
}

static int hold(struct ts_gpuring *g, int self, uint64_t seq, int writer, struct ts_gpu_held *out, int keep)
{
	if (self < 0 || self >= (int)TS_MAX_MEMBERS)
		return -EINVAL;
	uint32_t depth = depth_of(g);
	if (!depth)
		return -EBADMSG;
	struct ts_gpu_slot *s = &g->t->slots[seq % depth];
	uint64_t w = atomic_load_explicit(&s->word, memory_order_acquire);
	if (ts_gpu_slot_seq(w) != (seq & ((1ULL << 46) - 1)) || ts_gpu_slot_writer(w) != writer)
		return ts_gpu_slot_seq(w) > seq ? -ESTALE : -EAGAIN;
	if (ts_gpu_slot_state(w) != TS_GPU_READY)
		return -EAGAIN;
	unsigned b = ts_gpu_slot_buf(w);
	if (b >= TS_GPU_MAX_BUFS)
		return -EBADMSG;
	int ret = snapshot(g, s, b, out);
	/* acquire fence: the copy's loads come before the re-checks (a torn copy is caught there) */
	atomic_thread_fence(memory_order_acquire);
	if (ret) /* a copy that tore while the slot or record was rewritten is stale, not invalid */
		return atomic_load_explicit(&s->word, memory_order_relaxed) != w ||
				       !ts_gpuring_buf_current(g, b, out->uniq) ? -ESTALE : ret;
	/* seq_cst hold, then seq_cst recheck: see the protocol in gpuring.h */
	atomic_fetch_or(&g->t->held[self][b / 64], bit(b));
	if (atomic_load(&s->word) != w || !ts_gpuring_buf_current(g, b, out->uniq)) {
		if (!keep)
			ts_gpuring_unhold(g, self, b);
		return -ESTALE;
	}
	return 0;
}

int ts_gpuring_hold(struct ts_gpuring *g, int self, uint64_t seq, int writer, struct ts_gpu_held *out)
{
	return hold(g, self, seq, writer, out, 0);
}

int ts_gpuring_hold_again(struct ts_gpuring *g, int self, uint64_t seq, int writer, struct ts_gpu_held *out)
{
	return hold(g, self, seq, writer, out, 1);
}
