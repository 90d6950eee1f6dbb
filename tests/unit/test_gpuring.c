/* SPDX-License-Identifier: MIT */
/*
 * The GPU ring's shared table (core/gpuring.c): files that are not ours are
 * refused; a consumer holds exactly what a producer published; holds keep a
 * buffer from reuse for as long as their member lives; records of dead
 * owners are reclaimed, held ones are not; a hostile table never makes a
 * reader go out of bounds; and, with threads, a held buffer is never
 * rewritten (the Dekker pair of gpuring.h).
 *
 * Members are slots of a segment image in calloc'd memory: a live one has
 * our pid and start time, a dead one a wrong start time or a pid that cannot
 * exist. Each test gets its own session name; fini removes its files.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "feed.h"
#include "gpuring.h"
#include "prim.h"
#include "session.h"

#include "../helpers/feedfiles.h"

#define DEPTH   4u
#define INCARN  0xabc123ull
#define NO_PID  0x3ffffff0u /* above any pid_max: never a process */
#define MS      1000000ull
#define NEXTRA  4

static char session[64];
static char path[TS_PATH_MAX];
static char extra[NEXTRA][TS_PATH_MAX]; /* other files a test makes, removed by fini */
static struct ts_segment *seg;
static struct ts_ident me;

static void set_member(unsigned k, uint32_t pid, uint64_t start)
{
	atomic_store(&seg->members[k].pid, pid);
	atomic_store(&seg->members[k].start_time, start);
	atomic_store(&seg->members[k].heartbeat_ns, ts_now_ns());
}

static void live(unsigned k)
{
	set_member(k, me.pid, me.start_time);
}

static void setup(void)
{
	static int n;
	snprintf(session, sizeof(session), "gputest-%d-%d", (int)getpid(), n++);
	cr_assert_eq(ts_gpuring_path(path, sizeof(path), session, INCARN), 0);
	for (int i = 0; i < NEXTRA; i++)
		snprintf(extra[i], sizeof(extra[i]), "%s.x%d", path, i);
	cr_assert_eq(ts_self_ident(&me), 0);
	seg = calloc(1, sizeof(*seg));
	cr_assert(seg);
	ts_segment_init(seg, sizeof(*seg), "gt", getuid(),
			&(struct ts_session_params){ .depth = DEPTH, .timeout_ms = 1000 });
	for (unsigned k = 0; k < 4; k++)
		live(k); /* 0: the producer, 1..3: consumers */
}

static void teardown(void)
{
	unlink(path);
	for (int i = 0; i < NEXTRA; i++)
		if (unlink(extra[i]))
			rmdir(extra[i]);
	free(seg);
	seg = NULL;
}

TestSuite(gpuring, .init = setup, .fini = teardown, .timeout = 30);

/* ---- helpers ------------------------------------------------------------------ */

static void handles(unsigned char *mem, unsigned char *ev, unsigned tag)
{
	for (unsigned i = 0; i < TS_GPU_HANDLE; i++) {
		mem[i] = (unsigned char)(tag * 7 + i);
		ev[i] = (unsigned char)(tag * 13 + 3 * i + 1);
	}
}

/* A record of `size` bytes on `device` owned by member 0: its index, *uniq its identity. */
static int add(struct ts_gpuring *g, uint32_t device, uint64_t size, uint64_t *uniq)
{
	unsigned char mem[TS_GPU_HANDLE], ev[TS_GPU_HANDLE];
	handles(mem, ev, (unsigned)size);
	return ts_gpuring_buf_add(g, seg, 0, device, size, mem, ev, uniq);
}

/* Producer (member 0) publishes seq in its slot: buffer b, one layout. */
static int publish(struct ts_gpuring *g, uint64_t seq, unsigned b, uint64_t uniq, uint32_t npos, const uint64_t *off,
		   const uint64_t *len)
{
	ts_gpuring_slot_begin(g, (unsigned)(seq % g->t->depth), 0, seq, b);
	return ts_gpuring_slot_ready(g, (unsigned)(seq % g->t->depth), uniq, npos, off, len);
}

static int held_bit(const struct ts_gpuring *g, unsigned m, unsigned b)
{
	return (int)(atomic_load(&g->t->held[m][b / 64]) >> (b % 64) & 1);
}

/* Write `len` bytes at `off` of the file at `p`. */
static void poke(const char *p, off_t off, const void *v, size_t len)
{
	int fd = open(p, O_RDWR);
	cr_assert_geq(fd, 0);
	cr_assert_eq(pwrite(fd, v, len, off), (ssize_t)len);
	close(fd);
}

/* ---- files ---------------------------------------------------------------------- */

Test(gpuring, path_names_the_uid_session_and_incarnation)
{
	char want[TS_PATH_MAX], got[TS_PATH_MAX];
	snprintf(want, sizeof(want), "/dev/shm/tsshim-feed.%u.abc.1f.gpu", (unsigned)getuid());
	cr_assert_eq(ts_gpuring_path(got, sizeof(got), "abc", 0x1f), 0);
	cr_expect_str_eq(got, want);
	cr_expect_eq(ts_gpuring_path(got, strlen(want), "abc", 0x1f), -ENAMETOOLONG, "no room for the NUL");
	cr_expect_eq(ts_gpuring_path(got, strlen(want) + 1, "abc", 0x1f), 0);
}

Test(gpuring, open_creates_a_private_table_that_a_second_open_shares)
{
	struct ts_gpuring a, b;
	struct stat sb;
	cr_assert_eq(ts_gpuring_open(&a, path, DEPTH), 0);
	cr_assert_eq(lstat(path, &sb), 0);
	cr_expect(S_ISREG(sb.st_mode));
	cr_expect_eq(sb.st_mode & 07777, 0600u, "mode %o", (unsigned)(sb.st_mode & 07777));
	cr_expect_eq(sb.st_uid, getuid());
	cr_expect_eq(count_feed_files(session), 1, "no temporary file left behind");
	cr_expect_eq(a.t->magic, TS_GPU_MAGIC);
	cr_expect_eq(a.t->version, TS_GPU_VERSION);
	cr_expect_eq(a.t->depth, DEPTH);
	cr_expect_eq(a.t->nbufs, TS_GPU_MAX_BUFS);
	cr_expect_eq(a.t->size, (uint64_t)sb.st_size);
	cr_expect_eq(a.size, (size_t)sb.st_size);

	/* a second open (another depth asked) maps the same table: the creator's depth */
	cr_assert_eq(ts_gpuring_open(&b, path, 9), 0);
	cr_expect_neq((void *)a.t, (void *)b.t, "two mappings");
	cr_expect_eq(b.t->depth, DEPTH);
	cr_expect_eq(ts_gpuring_depth(&a), DEPTH);
	cr_expect_eq(ts_gpuring_depth(&b), DEPTH, "the geometry is the table's, not the one asked for");
	atomic_store(&a.t->counters.replaced, 4242);
	cr_expect_eq(atomic_load(&b.t->counters.replaced), 4242u, "a write through one is seen in the other");
	ts_gpuring_slot_begin(&b, 2, 1, 6, 5);
	cr_expect_eq(atomic_load(&a.t->slots[2].word), ts_gpu_slot_word(TS_GPU_WRITING, 1, 5, 6));
	ts_gpuring_close(&b);
	cr_expect_null(b.t);
	ts_gpuring_close(&a);
	cr_expect_eq(count_feed_files(session), 1, "close leaves the file (its owner unlinks it)");
}

Test(gpuring, depth_out_of_range_is_einval_and_creates_nothing)
{
	struct ts_gpuring g;
	cr_expect_eq(ts_gpuring_open(&g, path, 0), -EINVAL);
	cr_expect_null(g.t);
	cr_expect_eq(ts_gpuring_open(&g, path, TS_MAX_DEPTH + 1), -EINVAL);
	cr_expect_null(g.t);
	cr_expect_eq(access(path, F_OK), -1);
	cr_expect_eq(count_feed_files(session), 0);
	cr_assert_eq(ts_gpuring_open(&g, path, TS_MAX_DEPTH), 0);
	cr_expect_eq(g.t->depth, TS_MAX_DEPTH);
	ts_gpuring_close(&g);
}

Test(gpuring, a_planted_file_that_is_not_ours_is_refused)
{
	struct ts_gpuring g;
	struct stat sb;
	/* a genuine table with mode 0644: someone else could write it */
	cr_assert_eq(ts_gpuring_open(&g, path, DEPTH), 0);
	ts_gpuring_close(&g);
	cr_assert_eq(chmod(path, 0644), 0);
	cr_expect_eq(ts_gpuring_open(&g, path, DEPTH), -EACCES);
	cr_expect_null(g.t);
	cr_assert_eq(chmod(path, 0600), 0);
	cr_expect_eq(ts_gpuring_open(&g, path, DEPTH), 0, "the same file at 0600 is ours");
	ts_gpuring_close(&g);

	/* a symlink to a genuine table: O_NOFOLLOW */
	cr_assert_eq(symlink(path, extra[0]), 0);
	cr_expect_eq(ts_gpuring_open(&g, extra[0], DEPTH), -ELOOP);
	cr_expect_null(g.t);
	cr_expect_eq(lstat(extra[0], &sb), 0);
	cr_expect(S_ISLNK(sb.st_mode), "the link is left as it was");

	/* a dangling symlink is not followed to create its target either */
	cr_assert_eq(symlink(extra[2], extra[1]), 0);
	cr_expect_neq(ts_gpuring_open(&g, extra[1], DEPTH), 0);
	cr_expect_eq(access(extra[2], F_OK), -1, "nothing created through the link");

	/* a directory in the way */
	cr_assert_eq(mkdir(extra[3], 0700), 0);
	cr_expect_neq(ts_gpuring_open(&g, extra[3], DEPTH), 0);
	rmdir(extra[3]);
}

Test(gpuring, truncated_or_foreign_tables_are_refused)
{
	struct ts_gpuring g;
	cr_assert_eq(ts_gpuring_open(&g, path, DEPTH), 0);
	size_t size = g.size;
	ts_gpuring_close(&g);

	/* truncated */
	cr_assert_eq(truncate(path, (off_t)size / 2), 0);
	cr_expect_eq(ts_gpuring_open(&g, path, DEPTH), -EPROTO);
	cr_expect_null(g.t);
	cr_assert_eq(truncate(path, 0), 0);
	cr_expect_eq(ts_gpuring_open(&g, path, DEPTH), -EPROTO, "empty");
	cr_expect_null(g.t);
	/* right size, all zero: no magic */
	cr_assert_eq(truncate(path, (off_t)size), 0);
	cr_expect_eq(ts_gpuring_open(&g, path, DEPTH), -EPROTO);
	cr_assert_eq(truncate(path, (off_t)size + 4096), 0);
	cr_expect_eq(ts_gpuring_open(&g, path, DEPTH), -EPROTO, "too long");
	unlink(path);

	struct {
		size_t off;
		uint64_t v;
		size_t len;
		int want;
		const char *what;
	} cases[] = {
		{ offsetof(struct ts_gpu_table, magic), TS_GPU_MAGIC ^ 1, 8, -EPROTO, "magic" },
		{ offsetof(struct ts_gpu_table, version), TS_GPU_VERSION + 1, 4, -EPROTO, "version" },
		{ offsetof(struct ts_gpu_table, depth), 0, 4, -EBADMSG, "depth 0" },
		{ offsetof(struct ts_gpu_table, depth), TS_MAX_DEPTH + 1, 4, -EBADMSG, "depth too large" },
		{ offsetof(struct ts_gpu_table, size), 4096, 8, -EBADMSG, "size field" },
		{ offsetof(struct ts_gpu_table, uid), 12345678, 4, -EBADMSG, "uid field" },
		{ offsetof(struct ts_gpu_table, nbufs), TS_GPU_MAX_BUFS + 1, 4, -EBADMSG, "nbufs" },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		cr_assert_eq(ts_gpuring_open(&g, path, DEPTH), 0);
		ts_gpuring_close(&g);
		poke(path, (off_t)cases[i].off, &cases[i].v, cases[i].len);
		cr_expect_eq(ts_gpuring_open(&g, path, DEPTH), cases[i].want, "%s", cases[i].what);
		cr_expect_null(g.t, "%s", cases[i].what);
		unlink(path);
	}

	/* ts_gpuring_valid on its own: too small a mapping is refused before any field is read */
	struct ts_gpu_table *t = calloc(1, sizeof(*t));
	cr_assert(t);
	t->magic = TS_GPU_MAGIC;
	t->version = TS_GPU_VERSION;
	t->depth = 1;
	t->size = sizeof(*t);
	t->uid = 7;
	t->nbufs = TS_GPU_MAX_BUFS;
	cr_expect_eq(ts_gpuring_valid(t, sizeof(*t), 7), 0);
	cr_expect_eq(ts_gpuring_valid(t, sizeof(*t) - 1, 7), -EPROTO);
	cr_expect_eq(ts_gpuring_valid(t, sizeof(*t), 8), -EBADMSG, "another user's");
	free(t);
}

/* ---- slots ------------------------------------------------------------------------ */

Test(gpuring, hold_returns_exactly_what_the_producer_published)
{
	struct ts_gpuring g;
	struct ts_gpu_held h;
	uint64_t uniq, seq = 9, off[2] = { 0, 4096 }, len[2] = { 4000, 8192 };
	unsigned char mem[TS_GPU_HANDLE], ev[TS_GPU_HANDLE];
	cr_assert_eq(ts_gpuring_open(&g, path, DEPTH), 0);
	int b = add(&g, 3, 1 << 20, &uniq);
	cr_assert_geq(b, 0);

	ts_gpuring_slot_begin(&g, seq % DEPTH, 0, seq, (unsigned)b);
	cr_expect_eq(ts_gpuring_hold(&g, 1, seq, 0, &h), -EAGAIN, "WRITING");
	cr_expect_eq(held_bit(&g, 1, (unsigned)b), 0);
	cr_assert_eq(ts_gpuring_slot_ready(&g, seq % DEPTH, uniq, 2, off, len), 0);

	memset(&h, 0xee, sizeof(h));
	cr_assert_eq(ts_gpuring_hold(&g, 1, seq, 0, &h), 0);
	handles(mem, ev, 1 << 20);
	cr_expect_eq(h.buf, (unsigned)b);
	cr_expect_eq(h.uniq, uniq);
	cr_expect_eq(h.device, 3u);
	cr_expect_eq(h.owner_pid, me.pid);
	cr_expect_eq(h.size, 1u << 20);
	cr_expect_eq(h.npos, 2u);
	cr_expect(h.off[0] == 0 && h.off[1] == 4096 && h.len[0] == 4000 && h.len[1] == 8192);
	cr_expect_eq(memcmp(h.mem, mem, TS_GPU_HANDLE), 0);
	cr_expect_eq(memcmp(h.event, ev, TS_GPU_HANDLE), 0);
	cr_expect_eq(held_bit(&g, 1, (unsigned)b), 1, "the hold is set");
	cr_expect(ts_gpuring_buf_current(&g, (unsigned)b, uniq));
	cr_expect_not(ts_gpuring_buf_current(&g, (unsigned)b, uniq + 1));
	ts_gpuring_unhold(&g, 1, (unsigned)b);

	cr_expect_eq(ts_gpuring_hold(&g, 2, seq, 1, &h), -EAGAIN, "another writer's seq");
	cr_expect_eq(ts_gpuring_hold(&g, 2, seq + DEPTH, 0, &h), -EAGAIN, "not there yet");
	cr_expect_eq(ts_gpuring_hold(&g, 2, seq - DEPTH, 0, &h), -ESTALE, "overwritten");
	cr_expect_eq(ts_gpuring_hold(&g, -1, seq, 0, &h), -EINVAL);
	cr_expect_eq(ts_gpuring_hold(&g, TS_MAX_MEMBERS, seq, 0, &h), -EINVAL);
	cr_expect_eq(held_bit(&g, 2, (unsigned)b), 0, "failed holds leave no bit");

	/* the producer begins a newer seq in that slot: seq is gone */
	ts_gpuring_slot_begin(&g, seq % DEPTH, 0, seq + DEPTH, (unsigned)b);
	int r = ts_gpuring_hold(&g, 2, seq, 0, &h);
	cr_expect(r == -ESTALE || r == -EAGAIN, "hold of an overwritten seq: %d", r);
	cr_expect_eq(held_bit(&g, 2, (unsigned)b), 0);
	/* and dropped: nothing there */
	ts_gpuring_slot_drop(&g, seq % DEPTH);
	cr_expect_eq(ts_gpu_slot_state(atomic_load(&g.t->slots[seq % DEPTH].word)), (unsigned)TS_GPU_FREE);
	cr_expect_neq(ts_gpuring_hold(&g, 2, seq + DEPTH, 0, &h), 0);
	cr_expect_eq(ts_gpuring_slot_ready(&g, seq % DEPTH, uniq, 2, off, len), -EINVAL, "ready after drop");
	ts_gpuring_close(&g);
}

Test(gpuring, a_seq_is_passed_once_a_later_batch_takes_its_slot)
{
	struct ts_gpuring g;
	uint64_t uniq, seq = 9, off[1] = { 0 }, len[1] = { 4000 };
	cr_assert_eq(ts_gpuring_open(&g, path, DEPTH), 0);
	int b = add(&g, 0, 1 << 20, &uniq);
	cr_assert_geq(b, 0);

	cr_expect_not(ts_gpuring_slot_passed(&g, seq), "a free slot: seq may still come");
	ts_gpuring_slot_begin(&g, seq % DEPTH, 0, seq - DEPTH, (unsigned)b);
	cr_expect_not(ts_gpuring_slot_passed(&g, seq), "an earlier batch in the slot");
	ts_gpuring_slot_begin(&g, seq % DEPTH, 0, seq, (unsigned)b);
	cr_expect_not(ts_gpuring_slot_passed(&g, seq), "WRITING seq");
	cr_assert_eq(ts_gpuring_slot_ready(&g, seq % DEPTH, uniq, 1, off, len), 0);
	cr_expect_not(ts_gpuring_slot_passed(&g, seq), "READY seq");
	cr_expect(ts_gpuring_slot_passed(&g, seq - DEPTH), "its slot holds a later batch");
	ts_gpuring_slot_begin(&g, seq % DEPTH, 1, seq + DEPTH, (unsigned)b);
	cr_expect(ts_gpuring_slot_passed(&g, seq), "a later batch is WRITING in the slot, whoever writes it");
	ts_gpuring_close(&g);
}

Test(gpuring, ready_with_a_layout_that_does_not_fit_is_refused_and_never_ready)
{
	struct ts_gpuring g;
	struct ts_gpu_held h;
	uint64_t uniq, other, seq = 5;
	cr_assert_eq(ts_gpuring_open(&g, path, DEPTH), 0);
	int b = add(&g, 0, 1000, &uniq);
	int b2 = add(&g, 0, 1000, &other);
	cr_assert(b >= 0 && b2 >= 0);
	unsigned slot = seq % DEPTH;
	uint64_t w0;

	cr_expect_eq(ts_gpuring_slot_ready(&g, slot, uniq, 1, (uint64_t[]){ 0 }, (uint64_t[]){ 10 }), -EINVAL,
		     "a slot never begun");
	ts_gpuring_slot_begin(&g, slot, 0, seq, (unsigned)b);
	w0 = atomic_load(&g.t->slots[slot].word);
	struct {
		uint64_t uniq;
		uint32_t npos;
		uint64_t off[2], len[2];
		const char *what;
	} bad[] = {
		{ uniq, 1, { 1000, 0 }, { 1, 0 }, "starts at the end" },
		{ uniq, 1, { 0, 0 }, { 1001, 0 }, "one byte too long" },
		{ uniq, 2, { 0, 8 }, { 10, UINT64_MAX }, "off + len wraps" },
		{ uniq, 2, { 0, UINT64_MAX }, { 10, 2 }, "off beyond" },
		{ uniq, 0, { 0, 0 }, { 1, 1 }, "npos 0" },
		{ uniq, TS_MAX_POSITIONS + 1, { 0, 0 }, { 1, 1 }, "npos too large" },
		{ other, 1, { 0, 0 }, { 1, 0 }, "another record's uniq" },
		{ uniq + 1, 1, { 0, 0 }, { 1, 0 }, "no record's uniq" },
	};
	uint64_t off[TS_MAX_POSITIONS + 1] = { 0 }, len[TS_MAX_POSITIONS + 1] = { 0 };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		memcpy(off, bad[i].off, sizeof(bad[i].off));
		memcpy(len, bad[i].len, sizeof(bad[i].len));
		cr_expect_eq(ts_gpuring_slot_ready(&g, slot, bad[i].uniq, bad[i].npos, off, len), -EINVAL, "%s",
			     bad[i].what);
		cr_expect_eq(atomic_load(&g.t->slots[slot].word), w0, "%s: still WRITING", bad[i].what);
		cr_expect_eq(ts_gpuring_hold(&g, 1, seq, 0, &h), -EAGAIN, "%s", bad[i].what);
	}
	cr_expect_eq(ts_gpuring_slot_ready(&g, DEPTH, uniq, 1, off, len), -EINVAL, "slot beyond depth");
	/* the buffer's last byte, and an empty position at its very end, fit */
	cr_expect_eq(ts_gpuring_slot_ready(&g, slot, uniq, 2, (uint64_t[]){ 999, 1000 }, (uint64_t[]){ 1, 0 }), 0);
	cr_assert_eq(ts_gpuring_hold(&g, 1, seq, 0, &h), 0);
	cr_expect(h.npos == 2 && h.off[0] == 999 && h.len[0] == 1 && h.off[1] == 1000 && h.len[1] == 0);
	ts_gpuring_unhold(&g, 1, (unsigned)b);
	ts_gpuring_close(&g);
}

/* ---- holds --------------------------------------------------------------------------- */

Test(gpuring, a_hold_counts_while_its_member_lives)
{
	struct ts_gpuring g;
	struct ts_gpu_held h;
	uint64_t uniq;
	cr_assert_eq(ts_gpuring_open(&g, path, DEPTH), 0);
	int b = add(&g, 0, 4096, &uniq);
	cr_assert_geq(b, 0);
	cr_assert_eq(publish(&g, 1, (unsigned)b, uniq, 1, (uint64_t[]){ 0 }, (uint64_t[]){ 4096 }), 0);
	cr_expect_eq(ts_gpuring_buf_held(&g, seg, (unsigned)b, 0), 0, "nobody holds it yet");

	cr_assert_eq(ts_gpuring_hold(&g, 3, 1, 0, &h), 0);
	cr_expect_eq(ts_gpuring_buf_held(&g, seg, (unsigned)b, 0), 1, "live member 3 holds it");
	cr_expect_eq(ts_gpuring_buf_held(&g, seg, (unsigned)b, 3), 0, "our own hold does not count");
	cr_expect_eq(ts_gpuring_buf_held(&g, seg, (unsigned)b + 1, 0), 0, "only that buffer");
	cr_expect_eq(ts_gpuring_buf_held(&g, seg, TS_GPU_MAX_BUFS, 0), 0, "out of range");

	/* stopped (silent past the timeout) still counts: it may copy when it wakes */
	atomic_store(&seg->members[3].heartbeat_ns, ts_now_ns() - 10000 * MS);
	cr_assert_eq(ts_member_health(seg, 3, ts_now_ns()), TS_MEMBER_STALE);
	cr_expect_eq(ts_gpuring_buf_held(&g, seg, (unsigned)b, 0), 1, "a stale member's hold counts");

	/* dead: another process now (wrong start time), a pid that does not exist, a free slot */
	set_member(3, me.pid, me.start_time + 1);
	cr_expect_eq(ts_gpuring_buf_held(&g, seg, (unsigned)b, 0), 0, "pid reused by another process");
	set_member(3, NO_PID, me.start_time);
	cr_expect_eq(ts_gpuring_buf_held(&g, seg, (unsigned)b, 0), 0, "no such process");
	set_member(3, 0, 0);
	cr_expect_eq(ts_gpuring_buf_held(&g, seg, (unsigned)b, 0), 0, "free member slot");
	live(3);
	cr_expect_eq(ts_gpuring_buf_held(&g, seg, (unsigned)b, 0), 1, "alive again (the bit was never cleared)");

	ts_gpuring_unhold(&g, 3, (unsigned)b);
	cr_expect_eq(ts_gpuring_buf_held(&g, seg, (unsigned)b, 0), 0, "unhold lets go");
	ts_gpuring_unhold(&g, -1, (unsigned)b);              /* ignored */
	ts_gpuring_unhold(&g, 3, TS_GPU_MAX_BUFS + 100);     /* ignored */
	ts_gpuring_close(&g);
}

Test(gpuring, unhold_all_clears_every_hold_of_that_member_only)
{
	struct ts_gpuring g;
	struct ts_gpu_held h;
	uint64_t uniq;
	cr_assert_eq(ts_gpuring_open(&g, path, DEPTH), 0);
	int b = add(&g, 0, 4096, &uniq);
	cr_assert_geq(b, 0);
	cr_assert_eq(publish(&g, 2, (unsigned)b, uniq, 1, (uint64_t[]){ 0 }, (uint64_t[]){ 4096 }), 0);
	cr_assert_eq(ts_gpuring_hold(&g, 1, 2, 0, &h), 0);
	cr_assert_eq(ts_gpuring_hold(&g, 2, 2, 0, &h), 0);
	/* member 1 also holds buffers in every word of its row */
	atomic_fetch_or(&g.t->held[1][0], 1ull << 63);
	atomic_fetch_or(&g.t->held[1][1], 1ull << 6);
	atomic_fetch_or(&g.t->held[1][TS_GPU_MAX_BUFS / 64 - 1], 1ull << 63);
	cr_expect(ts_gpuring_buf_held(&g, seg, TS_GPU_MAX_BUFS - 1, 0));

	ts_gpuring_unhold_all(&g, 1);
	for (unsigned i = 0; i < TS_GPU_MAX_BUFS / 64; i++)
		cr_expect_eq(atomic_load(&g.t->held[1][i]), 0u, "word %u", i);
	cr_expect_eq(held_bit(&g, 2, (unsigned)b), 1, "member 2's hold stays");
	cr_expect_eq(ts_gpuring_buf_held(&g, seg, (unsigned)b, 0), 1);
	cr_expect_eq(ts_gpuring_buf_held(&g, seg, TS_GPU_MAX_BUFS - 1, 0), 0);
	ts_gpuring_unhold_all(&g, 2);
	cr_expect_eq(ts_gpuring_buf_held(&g, seg, (unsigned)b, 0), 0);
	ts_gpuring_unhold_all(&g, -1);             /* ignored */
	ts_gpuring_unhold_all(&g, TS_MAX_MEMBERS); /* ignored */
	ts_gpuring_close(&g);
}

Test(gpuring, a_mapped_buffer_stays_in_use_until_unmapped_or_its_member_dies)
{
	struct ts_gpuring g;
	struct ts_gpu_held h;
	uint64_t uniq;
	cr_assert_eq(ts_gpuring_open(&g, path, DEPTH), 0);
	int b = add(&g, 0, 4096, &uniq);
	cr_assert_geq(b, 0);
	cr_assert_eq(publish(&g, 1, (unsigned)b, uniq, 1, (uint64_t[]){ 0 }, (uint64_t[]){ 4096 }), 0);
	cr_expect_eq(ts_gpuring_buf_in_use(&g, seg, (unsigned)b, 0), 0);

	/* a consumer holds, maps (while holding), copies, lets go: still open there */
	cr_assert_eq(ts_gpuring_hold(&g, 2, 1, 0, &h), 0);
	ts_gpuring_map(&g, 2, (unsigned)b);
	ts_gpuring_unhold(&g, 2, (unsigned)b);
	cr_expect_eq(ts_gpuring_buf_held(&g, seg, (unsigned)b, 0), 0, "nobody holds it");
	cr_expect_eq(ts_gpuring_buf_in_use(&g, seg, (unsigned)b, 0), 1, "member 2 has it open");
	cr_expect_eq(ts_gpuring_buf_in_use(&g, seg, (unsigned)b, 2), 0, "our own mapping does not count");
	cr_expect_eq(ts_gpuring_buf_in_use(&g, seg, (unsigned)b + 1, 0), 0, "only that buffer");

	set_member(2, NO_PID, me.start_time);
	cr_expect_eq(ts_gpuring_buf_in_use(&g, seg, (unsigned)b, 0), 0, "a dead member's mapping went with it");
	live(2);
	ts_gpuring_unmap(&g, 2, (unsigned)b);
	cr_expect_eq(ts_gpuring_buf_in_use(&g, seg, (unsigned)b, 0), 0, "closed");

	/* a reused member slot starts with no mappings, another member's stay */
	ts_gpuring_map(&g, 2, (unsigned)b);
	ts_gpuring_map(&g, 3, TS_GPU_MAX_BUFS - 1);
	ts_gpuring_map(&g, 1, (unsigned)b);
	ts_gpuring_unmap_all(&g, 3);
	cr_expect_eq(ts_gpuring_buf_in_use(&g, seg, TS_GPU_MAX_BUFS - 1, 0), 0);
	ts_gpuring_unmap(&g, 2, (unsigned)b);
	cr_expect_eq(ts_gpuring_buf_in_use(&g, seg, (unsigned)b, 0), 1, "member 1's mapping stays");
	ts_gpuring_map(&g, -1, 0);                        /* ignored */
	ts_gpuring_unmap(&g, 3, TS_GPU_MAX_BUFS + 100);   /* ignored */
	ts_gpuring_unmap_all(&g, TS_MAX_MEMBERS);         /* ignored */
	ts_gpuring_close(&g);
}

Test(gpuring, a_retired_record_stops_serving_until_the_index_is_reused)
{
	struct ts_gpuring g;
	uint64_t u1, u2;
	cr_assert_eq(ts_gpuring_open(&g, path, DEPTH), 0);
	int b = add(&g, 0, 4096, &u1);
	cr_assert_geq(b, 0);
	cr_expect(ts_gpuring_buf_serving(&g, (unsigned)b, u1));
	ts_gpuring_buf_retire(&g, (unsigned)b, u1 + 2); /* not this record: ignored */
	cr_expect(ts_gpuring_buf_serving(&g, (unsigned)b, u1));
	ts_gpuring_buf_retire(&g, (unsigned)b, u1);
	cr_expect(ts_gpuring_buf_current(&g, (unsigned)b, u1), "still allocated");
	cr_expect_not(ts_gpuring_buf_serving(&g, (unsigned)b, u1), "but retired: mappers close it");
	ts_gpuring_buf_remove(&g, (unsigned)b, u1);
	int b2 = add(&g, 0, 8192, &u2);
	cr_assert_eq(b2, b, "the index is reused");
	cr_expect(ts_gpuring_buf_serving(&g, (unsigned)b, u2), "the new record is not retired");
	cr_expect_not(ts_gpuring_buf_serving(&g, (unsigned)b, u1), "the old one is gone");
	ts_gpuring_close(&g);
}

/* ---- buffer records ------------------------------------------------------------------ */

Test(gpuring, records_fill_up_to_enospc_and_remove_needs_the_right_uniq)
{
	struct ts_gpuring g;
	uint64_t uniq[TS_GPU_MAX_BUFS], u, bytes = 0;
	unsigned char mem[TS_GPU_HANDLE] = { 0 }, ev[TS_GPU_HANDLE] = { 0 };
	cr_assert_eq(ts_gpuring_open(&g, path, DEPTH), 0);
	cr_expect_eq(ts_gpuring_buf_add(&g, seg, TS_MAX_MEMBERS, 0, 1, mem, ev, &u), -EINVAL, "owner");
	cr_expect_eq(ts_gpuring_buf_add(&g, seg, 0, TS_GPU_MAX_DEVICE, 1, mem, ev, &u), -EINVAL, "device");
	cr_expect_eq(ts_gpuring_buf_add(&g, seg, 0, 0, 0, mem, ev, &u), -EINVAL, "size 0");
	cr_expect_eq(atomic_load(&g.t->counters.buffers_live), 0u);

	for (unsigned i = 0; i < TS_GPU_MAX_BUFS; i++) {
		int b = add(&g, i % 8, 1000 + i, &uniq[i]);
		cr_assert_eq(b, (int)i, "record %u", i);
		bytes += 1000 + i;
		cr_expect(uniq[i] > 1, "uniq %llu", (unsigned long long)uniq[i]);
		for (unsigned j = 0; j < i; j++)
			cr_assert_neq(uniq[i], uniq[j], "uniq of %u and %u", i, j);
		cr_expect(ts_gpuring_buf_current(&g, i, uniq[i]));
		cr_expect_eq(g.t->bufs[i].owner_pid, me.pid);
		cr_expect_eq(g.t->bufs[i].owner_start, me.start_time);
		cr_expect_eq(g.t->bufs[i].device, i % 8);
	}
	cr_expect_eq(atomic_load(&g.t->counters.buffers_live), (uint64_t)TS_GPU_MAX_BUFS);
	cr_expect_eq(atomic_load(&g.t->counters.buffer_bytes), bytes);
	cr_expect_eq(add(&g, 0, 1, &u), -ENOSPC);

	ts_gpuring_buf_remove(&g, 17, uniq[18]);
	ts_gpuring_buf_remove(&g, 17, 0);
	ts_gpuring_buf_remove(&g, TS_GPU_MAX_BUFS, uniq[17]);
	cr_expect(ts_gpuring_buf_current(&g, 17, uniq[17]), "a wrong uniq leaves it");
	cr_expect_eq(add(&g, 0, 1, &u), -ENOSPC);
	cr_expect_eq(atomic_load(&g.t->counters.buffers_live), (uint64_t)TS_GPU_MAX_BUFS);

	ts_gpuring_buf_remove(&g, 17, uniq[17]);
	cr_expect_not(ts_gpuring_buf_current(&g, 17, uniq[17]));
	cr_expect_eq(atomic_load(&g.t->counters.buffers_live), (uint64_t)TS_GPU_MAX_BUFS - 1);
	cr_expect_eq(atomic_load(&g.t->counters.buffer_bytes), bytes - 1017);
	ts_gpuring_buf_remove(&g, 17, uniq[17]);
	cr_expect_eq(atomic_load(&g.t->counters.buffers_live), (uint64_t)TS_GPU_MAX_BUFS - 1, "removed once");
	/* a free record's word is 0 and a claim is odd: neither is an identity to remove or to publish with */
	ts_gpuring_buf_remove(&g, 17, 0);
	cr_expect_eq(atomic_load(&g.t->counters.buffers_live), (uint64_t)TS_GPU_MAX_BUFS - 1, "0 removes nothing");
	cr_expect_eq(atomic_load(&g.t->counters.buffer_bytes), bytes - 1017);
	cr_expect_not(ts_gpuring_buf_current(&g, 17, 0), "a free record is no allocation");
	ts_gpuring_slot_begin(&g, 1, 0, 1, 17);
	cr_expect_eq(ts_gpuring_slot_ready(&g, 1, 0, 1, (uint64_t[]){ 0 }, (uint64_t[]){ 0 }), -EINVAL,
		     "READY over a free record");
	atomic_store(&g.t->bufs[17].uniq, 0x1235ull);
	ts_gpuring_buf_remove(&g, 17, 0x1235ull);
	cr_expect_eq(atomic_load(&g.t->bufs[17].uniq), 0x1235ull, "a claim is not removed by its word");
	atomic_store(&g.t->bufs[17].uniq, 0);

	cr_expect_eq(add(&g, 0, 77, &u), 17, "the freed record is used again");
	cr_expect(u != uniq[17] && u > 1);
	cr_expect_eq(atomic_load(&g.t->counters.buffer_bytes), bytes - 1017 + 77);
	cr_expect_eq(add(&g, 0, 1, &u), -ENOSPC);
	ts_gpuring_close(&g);
}

Test(gpuring, dead_owners_records_are_reclaimed_unless_a_live_member_holds_them)
{
	struct ts_gpuring g;
	struct ts_gpu_held h;
	uint64_t uniq[TS_GPU_MAX_BUFS], u;
	cr_assert_eq(ts_gpuring_open(&g, path, DEPTH), 0);
	for (unsigned i = 0; i < TS_GPU_MAX_BUFS; i++)
		cr_assert_eq(add(&g, 0, 100, &uniq[i]), (int)i);
	cr_expect_eq(add(&g, 0, 100, &u), -ENOSPC, "every owner alive");

	/* 9: its owner died, but live member 1 holds it (published in a slot, held) */
	cr_assert_eq(publish(&g, 1, 9, uniq[9], 1, (uint64_t[]){ 0 }, (uint64_t[]){ 100 }), 0);
	cr_assert_eq(ts_gpuring_hold(&g, 1, 1, 0, &h), 0);
	g.t->bufs[9].owner_pid = NO_PID;
	cr_expect_eq(add(&g, 0, 100, &u), -ENOSPC, "a held record of a dead owner stays");
	cr_expect(ts_gpuring_buf_current(&g, 9, uniq[9]));

	/* 40: owner pid reused by another process (our pid, another start time) */
	g.t->bufs[40].owner_start = me.start_time + 1;
	cr_expect_eq(add(&g, 0, 300, &u), 40);
	cr_expect(u != uniq[40] && u > 1);
	cr_expect_not(ts_gpuring_buf_current(&g, 40, uniq[40]), "the dead owner's record is gone");
	cr_expect_eq(g.t->bufs[40].owner_pid, me.pid);
	cr_expect_eq(g.t->bufs[40].size, 300u);
	cr_expect_eq(atomic_load(&g.t->counters.buffers_live), (uint64_t)TS_GPU_MAX_BUFS,
		     "a reclaimed record replaces one, it does not add one");
	cr_expect_eq(atomic_load(&g.t->counters.buffer_bytes), (uint64_t)TS_GPU_MAX_BUFS * 100 + 200);
	cr_expect_eq(add(&g, 0, 100, &u), -ENOSPC);

	/* the holder dies: 9 goes too */
	set_member(1, NO_PID, 1);
	cr_expect_eq(add(&g, 0, 100, &u), 9);
	cr_expect_eq(atomic_load(&g.t->counters.buffers_live), (uint64_t)TS_GPU_MAX_BUFS);
	cr_expect_eq(atomic_load(&g.t->counters.buffer_bytes), (uint64_t)TS_GPU_MAX_BUFS * 100 + 200);
	cr_expect_eq(add(&g, 0, 100, &u), -ENOSPC, "every owner alive again");
	ts_gpuring_close(&g);
}

/* The word a process writes into a record while it fills it in (gpuring.c). */
static uint64_t claim_of(uint32_t pid, uint64_t start)
{
	return (uint64_t)pid << 32 | (start & 0x7fffffffull) << 1 | 1;
}

/*
 * A process that died between claiming a record and publishing it (a few
 * stores) left it claimed: once it stayed so for good. A claim names its
 * claimer, so a dead claimer's record is free again; a live one's is not.
 */
Test(gpuring, a_claimer_that_died_half_way_leaves_the_record_free)
{
	struct ts_gpuring g;
	uint64_t uniq[TS_GPU_MAX_BUFS], u;
	cr_assert_eq(ts_gpuring_open(&g, path, DEPTH), 0);
	for (unsigned i = 0; i < TS_GPU_MAX_BUFS; i++) {
		cr_assert_eq(add(&g, 0, 100, &uniq[i]), (int)i);
		cr_assert_eq(uniq[i] & 1, 0u, "identities are even, claims odd");
	}
	atomic_store(&g.t->bufs[7].uniq, claim_of(me.pid, me.start_time + 1)); /* our pid, another process */
	atomic_store(&g.t->bufs[8].uniq, claim_of(me.pid, me.start_time));     /* a live claimer: us */
	atomic_store(&g.t->bufs[9].uniq, claim_of(NO_PID, 5));                 /* no such process */
	cr_expect_eq(ts_gpuring_reclaim_dead(&g, seg), 2, "the two dead claims, not the live one");
	cr_expect_eq(atomic_load(&g.t->bufs[7].uniq), 0u);
	cr_expect_eq(atomic_load(&g.t->bufs[9].uniq), 0u);
	cr_expect_eq(atomic_load(&g.t->bufs[8].uniq), claim_of(me.pid, me.start_time));
	cr_expect_eq(add(&g, 0, 100, &u), 7);
	cr_expect_eq(add(&g, 0, 100, &u), 9);
	atomic_store(&g.t->bufs[7].uniq, claim_of(NO_PID, 5));
	cr_expect_eq(add(&g, 0, 100, &u), 7, "a new record takes a dead claim's place directly");
	cr_expect_eq(add(&g, 0, 100, &u), -ENOSPC, "the live claim is not taken");
	ts_gpuring_close(&g);
}

/* ---- a hostile table ---------------------------------------------------------------- */

/* Publish seq 1 in buffer b afresh; the consumer's hold must then succeed. */
static void republish(struct ts_gpuring *g, unsigned b, uint64_t uniq)
{
	struct ts_gpu_held h;
	g->t->bufs[b].device = 1;
	g->t->bufs[b].size = 4096;
	cr_assert_eq(publish(g, 1, b, uniq, 2, (uint64_t[]){ 0, 256 }, (uint64_t[]){ 256, 1024 }), 0);
	cr_assert_eq(ts_gpuring_hold(g, 1, 1, 0, &h), 0);
	ts_gpuring_unhold(g, 1, b);
}

Test(gpuring, a_hostile_table_is_refused_never_read_out_of_bounds)
{
	struct ts_gpuring g;
	struct ts_gpu_held h;
	uint64_t uniq;
	cr_assert_eq(ts_gpuring_open(&g, path, DEPTH), 0);
	int ib = add(&g, 1, 4096, &uniq);
	cr_assert_geq(ib, 0);
	unsigned b = (unsigned)ib;
	struct ts_gpu_slot *s = &g.t->slots[1];

#define EXPECT_REFUSED(what)                                                                       \
	do {                                                                                       \
		int r_ = ts_gpuring_hold(&g, 1, 1, 0, &h);                                         \
		cr_expect(r_ == -EBADMSG || r_ == -ESTALE, "%s: %d", what, r_);                    \
		for (unsigned i_ = 0; i_ < TS_GPU_MAX_BUFS / 64; i_++)                             \
			cr_expect_eq(atomic_load(&g.t->held[1][i_]), 0u, "%s: a hold left", what); \
	} while (0)

	republish(&g, b, uniq);
	s->npos = 0;
	EXPECT_REFUSED("npos 0");
	republish(&g, b, uniq);
	s->npos = TS_MAX_POSITIONS + 1;
	EXPECT_REFUSED("npos too large");
	republish(&g, b, uniq);
	s->npos = UINT32_MAX;
	EXPECT_REFUSED("npos huge");
	republish(&g, b, uniq);
	s->off[1] = 4096;
	EXPECT_REFUSED("off + len beyond the size");
	republish(&g, b, uniq);
	s->len[0] = UINT64_MAX;
	EXPECT_REFUSED("len wraps");
	republish(&g, b, uniq);
	s->off[0] = UINT64_MAX;
	EXPECT_REFUSED("off beyond");
	republish(&g, b, uniq);
	g.t->bufs[b].size = 0;
	EXPECT_REFUSED("size 0");
	republish(&g, b, uniq);
	g.t->bufs[b].size = 1000;
	EXPECT_REFUSED("record smaller than the layout");
	republish(&g, b, uniq);
	g.t->bufs[b].device = TS_GPU_MAX_DEVICE;
	EXPECT_REFUSED("device");
	republish(&g, b, uniq);
	s->uniq = uniq ^ 4;
	EXPECT_REFUSED("slot names another record");
	republish(&g, b, uniq);
	atomic_store(&s->word, ts_gpu_slot_word(TS_GPU_READY, 0, 255, 1));
	EXPECT_REFUSED("buffer index 255");
	atomic_store(&s->word, ts_gpu_slot_word(TS_GPU_READY, 0, TS_GPU_MAX_BUFS, 1));
	EXPECT_REFUSED("buffer index one past the records");
	atomic_store(&s->word, ts_gpu_slot_word(3, 0, b, 1));
	cr_expect_neq(ts_gpuring_hold(&g, 1, 1, 0, &h), 0, "state 3");
	atomic_store(&s->word, UINT64_MAX);
	cr_expect_neq(ts_gpuring_hold(&g, 1, 1, 0, &h), 0, "all ones");

	/* the depth changed under us after open: never a division by 0 or a slot past the array */
	republish(&g, b, uniq);
	uint32_t depths[] = { 0, TS_MAX_DEPTH + 1, UINT32_MAX, DEPTH - 1, DEPTH + 1 };
	for (size_t i = 0; i < sizeof(depths) / sizeof(depths[0]); i++) {
		g.t->depth = depths[i];
		cr_expect_eq(ts_gpuring_depth(&g), DEPTH, "the geometry stays the one validated at open");
		cr_expect_eq(ts_gpuring_intact(&g), -EBADMSG, "depth %u: the table is no longer intact", depths[i]);
		cr_expect_neq(ts_gpuring_hold(&g, 1, 1, 0, &h), 0, "depth %u", depths[i]);
		cr_expect_neq(ts_gpuring_hold(&g, 1, (uint64_t)TS_MAX_DEPTH * 1000 + 7, 0, &h), 0, "depth %u",
			      depths[i]);
		uint64_t before = atomic_load(&g.t->bufs[0].uniq);
		ts_gpuring_slot_begin(&g, TS_MAX_DEPTH, 0, 3, b);
		ts_gpuring_slot_begin(&g, TS_MAX_DEPTH + 20, 0, 3, b);
		ts_gpuring_slot_drop(&g, TS_MAX_DEPTH + 20);
		cr_expect_eq(ts_gpuring_slot_ready(&g, TS_MAX_DEPTH, uniq, 1, (uint64_t[]){ 0 }, (uint64_t[]){ 1 }),
			     -EINVAL);
		cr_expect_eq(atomic_load(&g.t->bufs[0].uniq), before, "no slot written past the array");
	}
	g.t->depth = DEPTH;
	cr_expect_eq(ts_gpuring_intact(&g), 0, "the depth as it was");
	g.t->magic ^= 1;
	cr_expect_eq(ts_gpuring_intact(&g), -EBADMSG, "magic rewritten");
	g.t->magic ^= 1;
	g.t->uid ^= 1;
	cr_expect_eq(ts_gpuring_intact(&g), -EBADMSG, "uid rewritten");
	g.t->uid ^= 1;
	cr_expect_eq(ts_gpuring_intact(&g), 0);
	republish(&g, b, uniq);
#undef EXPECT_REFUSED
	ts_gpuring_close(&g);
}

/* ---- the Dekker pair, with threads ---------------------------------------------------- */

#define RACE_NS   (500 * MS)
#define RACE_SIZE 4096u
#define NCONS     2

static struct ts_gpuring rg;
static _Atomic uint64_t stamp[TS_GPU_MAX_BUFS]; /* the "device buffer": seq of its last write */
static _Atomic uint64_t latest;                 /* highest seq READY */
static _Atomic int stop;
static _Atomic uint64_t holds_ok, mismatches, bad_results, replaced, producer_err, freed_open, closes;

/* A layout that fits `size`, different for every seq: torn snapshots would not fit. */
static uint32_t layout(uint64_t seq, uint64_t size, uint64_t *off, uint64_t *len)
{
	uint32_t npos = 1 + (uint32_t)(seq % TS_MAX_POSITIONS);
	uint64_t step = size / npos / TS_GPU_ALIGN * TS_GPU_ALIGN;
	for (uint32_t p = 0; p < npos; p++) {
		off[p] = p * step + (seq % 2) * (step / 2);
		len[p] = 1 + (seq * 7 + p) % (step / 2); /* off + len <= (p + 1) * step */
	}
	return npos;
}

/* Retired records nobody holds or has open any more are freed. */
static void sweep(int *retired, uint64_t *retired_uniq, int *n)
{
	for (int i = 0; i < *n; i++)
		if (!ts_gpuring_buf_in_use(&rg, seg, (unsigned)retired[i], 0)) {
			ts_gpuring_buf_remove(&rg, (unsigned)retired[i], retired_uniq[i]);
			--*n;
			retired[i] = retired[*n];
			retired_uniq[i] = retired_uniq[*n];
			i--;
		}
}

static void *race_producer(void *arg)
{
	(void)arg;
	int slot_buf[DEPTH];
	uint64_t slot_uniq[DEPTH], retired_uniq[TS_GPU_MAX_BUFS];
	int retired[TS_GPU_MAX_BUFS], nretired = 0;
	uint64_t off[TS_MAX_POSITIONS], len[TS_MAX_POSITIONS];
	for (unsigned k = 0; k < DEPTH; k++)
		slot_buf[k] = add(&rg, 0, RACE_SIZE * (1 + k % 2), &slot_uniq[k]);
	for (uint64_t seq = 1; !atomic_load(&stop); seq++) {
		unsigned k = (unsigned)(seq % DEPTH);
		for (;;) {
			ts_gpuring_slot_begin(&rg, k, 0, seq, (unsigned)slot_buf[k]);
			if (!ts_gpuring_buf_held(&rg, seg, (unsigned)slot_buf[k], 0))
				break;
			/* held: retire it, give the slot a fresh record */
			ts_gpuring_buf_retire(&rg, (unsigned)slot_buf[k], slot_uniq[k]);
			retired[nretired] = slot_buf[k];
			retired_uniq[nretired++] = slot_uniq[k];
			atomic_fetch_add(&replaced, 1);
			int b;
			while ((b = add(&rg, 0, RACE_SIZE * (1 + seq % 3), &slot_uniq[k])) == -ENOSPC) {
				sweep(retired, retired_uniq, &nretired);
				sched_yield();
			}
			if (b < 0) {
				atomic_fetch_add(&producer_err, 1);
				return NULL;
			}
			slot_buf[k] = b;
		}
		/* the "device write" */
		atomic_store_explicit(&stamp[slot_buf[k]], seq, memory_order_relaxed);
		uint32_t npos = layout(seq, rg.t->bufs[slot_buf[k]].size, off, len);
		if (ts_gpuring_slot_ready(&rg, k, slot_uniq[k], npos, off, len)) {
			atomic_fetch_add(&producer_err, 1);
			return NULL;
		}
		atomic_store(&latest, seq);
		sweep(retired, retired_uniq, &nretired);
	}
	return NULL;
}

static void *race_consumer(void *arg)
{
	int self = (int)(intptr_t)arg;
	uint64_t off[TS_MAX_POSITIONS], len[TS_MAX_POSITIONS];
	uint64_t open_uniq[TS_GPU_MAX_BUFS] = {0}; /* our "mappings", kept across copies */
	for (unsigned n = 0; !atomic_load(&stop); n++) {
		/* close mappings of retired records; one freed while open is the bug */
		for (unsigned b = 0; b < TS_GPU_MAX_BUFS; b++) {
			if (!open_uniq[b] || ts_gpuring_buf_serving(&rg, b, open_uniq[b]))
				continue;
			if (!ts_gpuring_buf_current(&rg, b, open_uniq[b]))
				atomic_fetch_add(&freed_open, 1);
			open_uniq[b] = 0;
			ts_gpuring_unmap(&rg, self, b);
			atomic_fetch_add(&closes, 1);
		}
		uint64_t top = atomic_load(&latest), seq = top - n % DEPTH;
		if (top < DEPTH)
			continue;
		struct ts_gpu_held h;
		int r = ts_gpuring_hold(&rg, self, seq, 0, &h);
		if (r == -EAGAIN || r == -ESTALE)
			continue;
		if (r) {
			atomic_fetch_add(&bad_results, 1);
			continue;
		}
		atomic_fetch_add(&holds_ok, 1);
		if (open_uniq[h.buf] != h.uniq) {
			if (open_uniq[h.buf])
				atomic_fetch_add(&freed_open, 1); /* the index was reused under our mapping */
			open_uniq[h.buf] = h.uniq;
			ts_gpuring_map(&rg, self, h.buf); /* while holding */
		}
		uint32_t npos = layout(seq, h.size, off, len);
		if (h.npos != npos || memcmp(h.off, off, npos * 8) || memcmp(h.len, len, npos * 8))
			atomic_fetch_add(&mismatches, 1);
		/* "copy" for a while: the buffer must keep seq's bytes as long as we hold it */
		for (int i = 0; i < 4; i++) {
			if (atomic_load_explicit(&stamp[h.buf], memory_order_relaxed) != seq)
				atomic_fetch_add(&mismatches, 1);
			sched_yield();
		}
		ts_gpuring_unhold(&rg, self, h.buf);
	}
	return NULL;
}

Test(gpuring, a_held_buffer_is_never_rewritten_nor_an_open_one_freed)
{
	pthread_t p, c[NCONS];
	cr_assert_eq(ts_gpuring_open(&rg, path, DEPTH), 0);
	cr_assert_eq(pthread_create(&p, NULL, race_producer, NULL), 0);
	for (int i = 0; i < NCONS; i++)
		cr_assert_eq(pthread_create(&c[i], NULL, race_consumer, (void *)(intptr_t)(i + 1)), 0);
	ts_sleep_ns(RACE_NS);
	atomic_store(&stop, 1);
	pthread_join(p, NULL);
	for (int i = 0; i < NCONS; i++)
		pthread_join(c[i], NULL);
	cr_log_info("seqs %llu, holds %llu, replaced %llu", (unsigned long long)atomic_load(&latest),
		    (unsigned long long)atomic_load(&holds_ok), (unsigned long long)atomic_load(&replaced));
	cr_expect_eq(atomic_load(&producer_err), 0u);
	cr_expect_eq(atomic_load(&mismatches), 0u, "a held buffer was rewritten, or a hold returned a torn layout");
	cr_expect_eq(atomic_load(&bad_results), 0u, "hold said the table was invalid while it was only being written");
	cr_expect_gt(atomic_load(&holds_ok), 100u);
	cr_expect_gt(atomic_load(&replaced), 0u, "the producer met held buffers");
	cr_expect_eq(atomic_load(&freed_open), 0u, "a record was freed while a consumer had it open");
	cr_expect_gt(atomic_load(&closes), 0u, "consumers closed retired records");
	cr_expect_gt(atomic_load(&latest), 1000u);
	ts_gpuring_close(&rg);
}
