/* SPDX-License-Identifier: MIT */
/*
 * ts-feedpeer: the consumers of tests/unit/test_feed.c, one process each.
 *
 *   ts-feedpeer ROLE FEED [ARGS...]
 *
 * The unit suite starts them with posix_spawn instead of fork(): a fork()
 * from a test whose producer already runs a heartbeat thread (and under
 * Criterion, which runs threads of its own) copies whatever lock another
 * thread held at that moment; gcc 12's ASan allocator is one, and the child's
 * first allocation (its own heartbeat thread) then waits forever. A fresh
 * program has no such state. Pipe ends are passed as descriptor numbers.
 *
 * Each role exits 0 when what it saw is right, else the code test_feed.c
 * names in its assertion (2: bad usage).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "feedpeer.h"

static const char *name;

static int open_attached(struct ts_feed *f, int at_epoch_start)
{
	return ts_feed_open(f, name, &params, NINDEX) || ts_feed_attach(f, at_epoch_start);
}

static void say(int fd, char c)
{
	(void)!write(fd, &c, 1);
}

static void hear(int fd)
{
	char c;
	(void)!read(fd, &c, 1);
}

/* Does a batch of n samples at ptr[] hold the permutation from stream sample k? */
static int batch_is(void *const *ptr, uint64_t n, uint64_t k)
{
	const uint32_t *p0 = ptr[0];
	const uint64_t *p1 = ptr[1];
	for (uint64_t j = 0; j < n; j++) {
		uint64_t i = (uint64_t)perm(k + j);
		if (p0[3 * j] != i || p0[3 * j + 1] != 2 * i || p0[3 * j + 2] != 3 * i || p1[j] != i * 1000)
			return 0;
	}
	return 1;
}

/* Read and check n10 batches of 10 by copy, from stream sample k. */
static int read_batches(struct ts_feed *f, int n10, uint64_t k)
{
	for (int b = 0; b < n10; b++, k += 10) {
		uint32_t p0[30];
		uint64_t p1[10], got[2] = { 0, 0 }, want[2] = { 120, 80 };
		void *dst[2] = { p0, p1 };
		int eoe, ret;
		while ((ret = ts_feed_read(f, 2, want, dst, got, &eoe, 5 * SEC)) == -ETIMEDOUT)
			;
		if (ret || got[0] != 120 || !batch_is(dst, 10, k % NINDEX))
			return 0;
	}
	return 1;
}

/* consumer BS READY: read one epoch at batch size bs; 0 iff every sample is right and in order. */
static int consumer(int bs, int ready_fd)
{
	struct ts_feed f;
	if (open_attached(&f, 0))
		return 10;
	say(ready_fd, 'r');
	struct ts_feed_info info;
	int ret;
	while ((ret = ts_feed_next(&f, 5 * SEC, &info)) == -ETIMEDOUT)
		;
	if (ret || info.npos != 2 || info.sample_bytes[0] != 12 || info.sample_bytes[1] != 8 ||
	    info.schema_len != strlen(schema) || memcmp(info.schema, schema, info.schema_len))
		return 11;
	uint64_t seen = 0;
	for (int eoe = 0; !eoe;) {
		uint32_t p0[3 * 64];
		uint64_t p1[64], got[2] = { 0, 0 }, want[2] = { (uint64_t)bs * 12, (uint64_t)bs * 8 };
		void *dst[2] = { p0, p1 };
		if (ts_feed_read(&f, 2, want, dst, got, &eoe, 5 * SEC))
			return 12;
		uint64_t n = got[0] / 12;
		if (got[1] != n * 8 || (n != (uint64_t)bs && !eoe) || n == 0)
			return 13;
		for (uint64_t k = 0; k < n; k++, seen++) {
			uint64_t i = (uint64_t)perm(seen);
			if (p0[3 * k] != i || p0[3 * k + 1] != 2 * i || p0[3 * k + 2] != 3 * i || p1[k] != i * 1000)
				return 14;
		}
	}
	ts_feed_close(&f);
	return seen == NINDEX ? 0 : 15;
}

/* schema READY: learn the first batch's schema, then a batch of another
 * schema must be refused with -EPROTO after the first batch's 4 samples. */
static int other_schema(int ready_fd)
{
	struct ts_feed g;
	struct ts_feed_info info;
	if (open_attached(&g, 0))
		return 10;
	say(ready_fd, 'r');
	while (ts_feed_next(&g, 5 * SEC, &info) == -ETIMEDOUT)
		;
	uint32_t p0[3 * 8];
	uint64_t p1[8], got[2] = { 0, 0 }, want[2] = { 8 * 12, 8 * 8 };
	void *dst[2] = { p0, p1 };
	int eoe, ret = ts_feed_read(&g, 2, want, dst, got, &eoe, 5 * SEC);
	return ret == -EPROTO && got[0] <= 4 * 12 ? 0 : 20 + (ret < 0 ? -ret % 50 : 0);
}

/* corrupt READY GO: told to read once the batch published is scribbled
 * over (its header no longer what the ring says): -EBADMSG. */
static int corrupt(int ready_fd, int go_fd)
{
	struct ts_feed g;
	struct ts_feed_info info;
	if (open_attached(&g, 0))
		return 10;
	say(ready_fd, 'r');
	hear(go_fd);
	int ret;
	while ((ret = ts_feed_next(&g, 5 * SEC, &info)) == -ETIMEDOUT)
		;
	return ret == -EBADMSG ? 0 : 20;
}

/* stall READY GO: attach, stall until told, then look for the next batch:
 * evicted meanwhile, -ESTALE, and detached, so that it can attach again (the
 * shim attaches only a detached feed: before, it retried -ESTALE three
 * times, then stopped sharing for good). */
static int stall(int ready_fd, int go_fd)
{
	struct ts_feed g;
	struct ts_feed_info info;
	if (open_attached(&g, 0))
		return 10;
	say(ready_fd, 'r');
	hear(go_fd); /* stalls until told */
	if (ts_feed_next(&g, SEC, &info) != -ESTALE)
		return 20;
	if (g.attached)
		return 21;
	return ts_feed_attach(&g, 0) == 0 ? 0 : 22;
}

/* holding READY GO: attach at the head; not holding the producer yet. Told
 * that its publish timed out on us: holding it. Read the first batch (2
 * samples): free again, and so it must say. Exit 0 iff all three hold. */
static int holding(int ready_fd, int go_fd)
{
	struct ts_feed g;
	if (open_attached(&g, 0))
		return 10;
	if (ts_feed_holds_producer(&g) != 0)
		return 11;
	say(ready_fd, 'r');
	hear(go_fd);
	if (ts_feed_holds_producer(&g) != 1)
		return 12;
	uint32_t p0[6];
	uint64_t p1[2], got[2] = { 0, 0 }, want[2] = { 24, 16 };
	void *dst[2] = { p0, p1 };
	int eoe;
	if (ts_feed_read(&g, 2, want, dst, got, &eoe, 5 * SEC) || got[0] != 24)
		return 13;
	if (ts_feed_holds_producer(&g) != 0)
		return 14;
	ts_feed_detach(&g);
	return ts_feed_holds_producer(&g) == 0 ? 0 : 15;
}

/* fence GO DONE: take the producer role over from a producer that holds an
 * open claim, count the stream (4 samples of epoch 1 published), tell the
 * test, wait until it tried to publish. */
static int fence(int go_fd, int done_fd)
{
	struct ts_feed g;
	int64_t rest[NINDEX];
	uint64_t epoch, nrest, npub;
	int ended;
	if (ts_feed_open(&g, name, &params, NINDEX))
		return 10;
	/* It is replaced (it went silent, say): g takes over. */
	uint64_t w = atomic_load(&g.s.seg->producer);
	if (!atomic_compare_exchange_strong(&g.s.seg->producer, &w, ts_producer_word(ts_producer_epoch(w) + 1, g.s.self)))
		return 11;
	int ret = ts_feed_stream_state(&g, &epoch, &ended, rest, &nrest, &npub, SEC);
	say(go_fd, 'x');
	hear(done_fd);
	return ret == 0 && epoch == 1 && !ended && npub == 4 && nrest == NINDEX - 4 ? 0 : 20;
}

/* tail AT_EPOCH_START READY: attach (at the epoch start or the head), read to
 * the end of the epoch at batch size 10; exit with the number of samples
 * read, which must be the epoch's last ones in the stream's order (else 200+). */
static int tail_reader(int at_epoch_start, int ready_fd)
{
	struct ts_feed f;
	if (open_attached(&f, at_epoch_start))
		return 201;
	say(ready_fd, 'r');
	uint64_t seen = 0, k = 0;
	int64_t index[10];
	f.read_index = index;
	f.read_index_len = 10;
	for (int eoe = 0; !eoe;) {
		uint32_t p0[3 * 10];
		uint64_t p1[10], got[2] = { 0, 0 }, want[2] = { 10 * 12, 10 * 8 };
		void *dst[2] = { p0, p1 };
		int ret;
		memset(index, 0xee, sizeof(index));
		while ((ret = ts_feed_read(&f, 2, want, dst, got, &eoe, 5 * SEC)) == -ETIMEDOUT)
			;
		if (ret)
			return 202;
		for (uint64_t j = 0; j < got[0] / 12; j++, seen++) {
			if (seen == 0) /* where in the permutation we start */
				while (k < NINDEX && (uint64_t)perm(k) != p1[0] / 1000)
					k++;
			if (k + seen >= NINDEX || p1[j] != (uint64_t)perm(k + seen) * 1000)
				return 203;
			if (index[j] != (int64_t)(p1[j] / 1000)) /* read_index: each sample's dataset index */
				return 207;
		}
	}
	/* the feed says whether it attached where an epoch starts: the first sample of the permutation */
	int at_start = f.at_epoch_start, read_any = f.read_any;
	ts_feed_close(&f);
	if (at_start != (at_epoch_start && k == 0))
		return 205;
	if (seen && !read_any)
		return 206;
	return k + seen == NINDEX ? (int)seen : 204;
}

/* What on_range told of a view: position p's ranges (GPU serving relies on them). */
struct seen_ranges {
	unsigned n[2];
	struct ts_range r[2];
	uint64_t at[2];
};

static void note_range(void *arg, uint32_t p, const struct ts_range *r, uint64_t at)
{
	struct seen_ranges *s = arg;
	if (p < 2 && s->n[p]++ == 0) {
		s->r[p] = *r;
		s->at[p] = at;
	}
}

/* view-keeper READY: view batch 0, read 9 more batches (the producer writes
 * slot 0 twice more meanwhile), then the view must still hold batch 0. The
 * view is reported as one range per position (seq 0, at 0, whole), and its
 * pages count as unwritten until we write them. */
static int view_keeper(int ready_fd)
{
	struct ts_feed f;
	struct seen_ranges seen = {0};
	if (open_attached(&f, 0))
		return 10;
	say(ready_fd, 'r');
	uint64_t want[2] = { 120, 80 }, got[2], id;
	int64_t index[10] = {0};
	void *ptr[2];
	int eoe, ret;
	f.on_range = note_range;
	f.on_range_arg = &seen;
	f.read_index = index;
	f.read_index_len = 10;
	while ((ret = ts_feed_read_view(&f, 2, want, ptr, got, &eoe, &id, 5 * SEC)) == -ETIMEDOUT)
		;
	f.on_range = NULL;
	f.read_index = NULL;
	if (ret || got[0] != 120 || got[1] != 80 || !id || !batch_is(ptr, 10, 0))
		return 11;
	for (int j = 0; j < 10; j++)
		if (index[j] != perm((uint64_t)j))
			return 17; /* read_index: each viewed sample's dataset index */
	for (int p = 0; p < 2; p++)
		if (seen.n[p] != 1 || seen.r[p].seq != 0 || seen.r[p].off != 0 || seen.r[p].len != got[p] ||
		    seen.at[p] != 0)
			return 14;
	if (ts_pages_unwritten(ptr[0], 120) != 1)
		return 15;
	if (!read_batches(&f, 9, 10))
		return 12;
	if (!batch_is(ptr, 10, 0))
		return 13; /* overwritten under us */
	memset(ptr[0], 0, 120); /* ours to write: copy-on-write */
	if (ts_pages_unwritten(ptr[0], 120) != 0 || ts_pages_unwritten(ptr[1], 80) != ((char *)ptr[1] - (char *)ptr[0] >= 4096 ? 1 : 0))
		return 16; /* the write shows in the pages it touched, and only there */
	ts_feed_release_view(&f, id);
	ts_feed_release_view(&f, id); /* twice: ignored */
	ts_feed_close(&f);
	return 0;
}

/* across READY GO: once two batches of 10 are published, a view of 15
 * samples is -EXDEV and consumes nothing; a copy of 15 gets them. */
static int across(int ready_fd, int go_fd)
{
	struct ts_feed g;
	if (open_attached(&g, 0))
		return 10;
	say(ready_fd, 'r');
	hear(go_fd); /* both batches published */
	uint64_t want[2] = { 15 * 12, 15 * 8 }, got[2] = { 0, 0 }, id;
	void *ptr[2];
	int eoe;
	if (ts_feed_read_view(&g, 2, want, ptr, got, &eoe, &id, SEC) != -EXDEV || id)
		return 11;
	uint32_t p0[45];
	uint64_t p1[15];
	void *dst[2] = { p0, p1 };
	got[0] = got[1] = 0;
	if (ts_feed_read(&g, 2, want, dst, got, &eoe, SEC) || got[0] != 15 * 12 || !batch_is(dst, 15, 0))
		return 12;
	ts_feed_close(&g);
	return 0;
}

/* outlive STATE DONE: view batch 0, close the feed (say 'c'), wait until the
 * producer rewrote slot 0, and the view must still hold batch 0. */
static int outlive(int state_fd, int done_fd)
{
	struct ts_feed g;
	if (open_attached(&g, 0))
		return 10;
	uint64_t want[2] = { 120, 80 }, got[2], id;
	void *ptr[2];
	int eoe, ret;
	say(state_fd, 'r');
	while ((ret = ts_feed_read_view(&g, 2, want, ptr, got, &eoe, &id, 5 * SEC)) == -ETIMEDOUT)
		;
	if (ret || !batch_is(ptr, 10, 0))
		return 11;
	ts_feed_close(&g); /* the program keeps its batch */
	say(state_fd, 'c');
	hear(done_fd);
	return batch_is(ptr, 10, 0) ? 0 : 12;
}

static int fd_arg(const char *s)
{
	char *end;
	long v = strtol(s, &end, 10);
	return *s && !*end && v >= 0 && v < 1024 ? (int)v : -1;
}

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: ts-feedpeer consumer|schema|corrupt|stall|holding|fence|tail|view-keeper|across|outlive FEED ARGS...\n"
				"(started by tests/unit/test_feed.c; see there)\n");
		return 2;
	}
	const char *role = argv[1];
	int a[3] = { -1, -1, -1 }, n = argc - 3;
	name = argv[2];
	for (int k = 0; k < n && k < 3; k++)
		if ((a[k] = fd_arg(argv[3 + k])) < 0)
			return 2;
	/* _exit: leave as the forked children did, without exit-time clean-up
	 * (a feed some roles leave open is the test's point, not a leak). */
	if (!strcmp(role, "consumer") && n == 2)
		_exit(consumer(a[0], a[1]));
	if (!strcmp(role, "schema") && n == 1)
		_exit(other_schema(a[0]));
	if (!strcmp(role, "corrupt") && n == 2)
		_exit(corrupt(a[0], a[1]));
	if (!strcmp(role, "stall") && n == 2)
		_exit(stall(a[0], a[1]));
	if (!strcmp(role, "holding") && n == 2)
		_exit(holding(a[0], a[1]));
	if (!strcmp(role, "fence") && n == 2)
		_exit(fence(a[0], a[1]));
	if (!strcmp(role, "tail") && n == 2)
		_exit(tail_reader(a[0], a[1]));
	if (!strcmp(role, "view-keeper") && n == 1)
		_exit(view_keeper(a[0]));
	if (!strcmp(role, "across") && n == 2)
		_exit(across(a[0], a[1]));
	if (!strcmp(role, "outlive") && n == 2)
		_exit(outlive(a[0], a[1]));
	fprintf(stderr, "ts-feedpeer: bad usage: %s with %d arguments\n", role, n);
	return 2;
}
