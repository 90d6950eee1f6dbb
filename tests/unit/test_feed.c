/* SPDX-License-Identifier: MIT */
/*
 * Data feeds (core/feed.c): what a consumer reads is what the producer
 * published, at any batch size; a successor learns exactly which samples of
 * an unfinished epoch are left; bad slot files are refused; nothing is left
 * in /dev/shm. Consumers run in forked children (a process is one member).
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "feed.h"

#define NINDEX 50
#define SEC    1000000000ull

static char name[64];
static const struct ts_session_params params = { .depth = 4, .timeout_ms = 1000, .label = "unit" };
static const char schema[] = "{\"tuple\":[{\"t\":0},{\"t\":1}]}";

static void setup(void)
{
	static int n;
	snprintf(name, sizeof(name), "feedtest-%d-%d", (int)getpid(), n++);
}

TestSuite(feed, .init = setup, .timeout = 60);

/* Sample i: position 0 holds 3 uint32 (i, 2i, 3i), position 1 one uint64 (i * 1000). */
static void fill(uint32_t *p0, uint64_t *p1, const int64_t *idx, uint64_t n)
{
	for (uint64_t k = 0; k < n; k++) {
		p0[3 * k] = (uint32_t)idx[k];
		p0[3 * k + 1] = 2 * (uint32_t)idx[k];
		p0[3 * k + 2] = 3 * (uint32_t)idx[k];
		p1[k] = (uint64_t)idx[k] * 1000;
	}
}

static int publish(struct ts_feed *f, const int64_t *idx, uint64_t n, uint64_t epoch, int eoe, const char *sch)
{
	uint32_t p0[3 * 64];
	uint64_t p1[64];
	fill(p0, p1, idx, n);
	uint64_t len[2] = { n * 12, n * 8 };
	const void *src[2] = { p0, p1 };
	struct ts_feed_batch b = { .npos = 2, .flags = eoe ? TS_BATCH_END_OF_EPOCH : 0, .nsamples = n, .len = len,
				   .src = src, .index = idx, .stream_epoch = epoch, .schema = sch,
				   .schema_len = (uint32_t)strlen(sch), .cpu_ns = 1000 * n };
	return ts_feed_publish(f, &b, 5 * SEC);
}

/* The permutation every test publishes: i -> (7i + 3) mod 50. */
static int64_t perm(uint64_t k)
{
	return (int64_t)((7 * k + 3) % NINDEX);
}

/* Child: read one epoch at batch size bs; exit 0 iff every sample is right and in order. */
static void consumer_child(int bs, int ready_fd)
{
	struct ts_feed f;
	if (ts_feed_open(&f, name, &params, NINDEX) || ts_feed_attach(&f, 0))
		_exit(10);
	(void)!write(ready_fd, "r", 1);
	struct ts_feed_info info;
	int ret;
	while ((ret = ts_feed_next(&f, 5 * SEC, &info)) == -ETIMEDOUT)
		;
	if (ret || info.npos != 2 || info.sample_bytes[0] != 12 || info.sample_bytes[1] != 8 ||
	    info.schema_len != strlen(schema) || memcmp(info.schema, schema, info.schema_len))
		_exit(11);
	uint64_t seen = 0;
	for (int eoe = 0; !eoe;) {
		uint32_t p0[3 * 64];
		uint64_t p1[64], got[2] = { 0, 0 }, want[2] = { (uint64_t)bs * 12, (uint64_t)bs * 8 };
		void *dst[2] = { p0, p1 };
		if (ts_feed_read(&f, 2, want, dst, got, &eoe, 5 * SEC))
			_exit(12);
		uint64_t n = got[0] / 12;
		if (got[1] != n * 8 || (n != (uint64_t)bs && !eoe) || n == 0)
			_exit(13);
		for (uint64_t k = 0; k < n; k++, seen++) {
			uint64_t i = (uint64_t)perm(seen);
			if (p0[3 * k] != i || p0[3 * k + 1] != 2 * i || p0[3 * k + 2] != 3 * i || p1[k] != i * 1000)
				_exit(14);
		}
	}
	ts_feed_close(&f);
	_exit(seen == NINDEX ? 0 : 15);
}

static pid_t start_consumer(int bs)
{
	int pfd[2];
	char c;
	cr_assert_eq(pipe(pfd), 0);
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		close(pfd[0]);
		consumer_child(bs, pfd[1]);
	}
	close(pfd[1]);
	cr_assert_eq(read(pfd[0], &c, 1), 1, "consumer did not attach");
	close(pfd[0]);
	return pid;
}

static int wait_exit(pid_t pid)
{
	int st;
	cr_assert_eq(waitpid(pid, &st, 0), pid);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 100 + WTERMSIG(st);
}

/* Publish one epoch of the permutation in batches of pbs. */
static void publish_epoch(struct ts_feed *f, uint64_t epoch, uint64_t pbs)
{
	int64_t idx[64];
	for (uint64_t at = 0; at < NINDEX; at += pbs) {
		uint64_t n = NINDEX - at < pbs ? NINDEX - at : pbs;
		for (uint64_t k = 0; k < n; k++)
			idx[k] = perm(at + k);
		cr_assert_eq(publish(f, idx, n, epoch, at + n == NINDEX, schema), 0, "publish at %lu", (unsigned long)at);
	}
}

static int count_files(void)
{
	char prefix[128];
	int n = 0, plen = snprintf(prefix, sizeof(prefix), TS_FEED_PREFIX "%u.%s.", (unsigned)getuid(), name);
	DIR *d = opendir(ts_shm_dir());
	struct dirent *e;
	while (d && (e = readdir(d)) != NULL)
		n += strncmp(e->d_name, prefix, (size_t)plen) == 0;
	if (d)
		closedir(d);
	return n;
}

Test(feed, consumers_at_other_batch_sizes_read_the_stream_in_order)
{
	struct ts_feed f;
	cr_assert_eq(ts_feed_open(&f, name, &params, NINDEX), 0);
	cr_assert_eq(ts_feed_role(&f), TS_ROLE_PRODUCER, "the first member produces");
	pid_t a = start_consumer(7), b = start_consumer(10), c = start_consumer(64);
	publish_epoch(&f, 1, 10); /* depth 4 < 5 batches: the consumers must keep up */
	cr_expect_eq(wait_exit(a), 0, "batch size 7");
	cr_expect_eq(wait_exit(b), 0, "batch size 10");
	cr_expect_eq(wait_exit(c), 0, "batch size 64 (one short batch)");
	cr_expect_eq(atomic_load(&f.s.seg->counters.samples_produced), (uint64_t)NINDEX);
	cr_expect_eq(atomic_load(&f.s.seg->counters.produce_cpu_ns), 1000ull * NINDEX);
	cr_expect_str_eq(f.s.seg->st.label, "unit");
	ts_feed_close(&f);
	cr_expect_eq(count_files(), 0, "the last member out removes the feed's files");
}

Test(feed, successor_learns_exactly_the_rest_of_an_epoch)
{
	struct ts_feed f;
	int64_t rest[NINDEX], idx[10];
	uint64_t epoch, nrest, npub;
	int ended;
	cr_assert_eq(ts_feed_open(&f, name, &params, NINDEX), 0);
	cr_assert_eq(ts_feed_stream_state(&f, &epoch, &ended, rest, &nrest, &npub, SEC), 0);
	cr_expect(epoch == 0 && ended, "nothing published: epoch 0, ended");

	publish_epoch(&f, 1, 10);
	cr_assert_eq(ts_feed_stream_state(&f, &epoch, &ended, rest, &nrest, &npub, SEC), 0);
	cr_expect(epoch == 1 && ended, "a full epoch ends with its last batch");

	/* Epoch 2: 6 batches of 7 published (more than the ring holds: the ledger counts). */
	for (uint64_t b = 0; b < 6; b++) {
		for (uint64_t k = 0; k < 7; k++)
			idx[k] = perm(b * 7 + k);
		cr_assert_eq(publish(&f, idx, 7, 2, 0, schema), 0);
	}
	cr_assert_eq(ts_feed_stream_state(&f, &epoch, &ended, rest, &nrest, &npub, SEC), 0);
	cr_expect(epoch == 2 && !ended);
	cr_expect_eq(npub, 42u);
	cr_assert_eq(nrest, 8u, "50 - 42 samples left");
	for (uint64_t k = 0; k < nrest; k++)
		for (uint64_t s = 0; s < 42; s++)
			cr_expect_neq(rest[k], perm(s), "index %ld was published", (long)rest[k]);
	for (uint64_t k = 1; k < nrest; k++)
		cr_expect_lt(rest[k - 1], rest[k], "ascending");
	ts_feed_close(&f);
}

Test(feed, ledger_lag_is_covered_by_the_ring)
{
	struct ts_feed f;
	int64_t rest[NINDEX], idx[5] = { 1, 2, 3, 4, 5 };
	uint64_t epoch, nrest, npub;
	int ended;
	cr_assert_eq(ts_feed_open(&f, name, &params, NINDEX), 0);
	cr_assert_eq(publish(&f, idx, 5, 1, 0, schema), 0);
	/* A producer that died between publishing and marking: wipe the ledger. */
	atomic_store(&((_Atomic uint64_t *)f.ledger)[3], UINT64_MAX - 1);
	cr_assert_eq(ts_feed_stream_state(&f, &epoch, &ended, rest, &nrest, &npub, SEC), 0);
	cr_expect_eq(npub, 5u, "what the ring still holds counts as published");
	cr_expect_eq(nrest, (uint64_t)NINDEX - 5);
	ts_feed_close(&f);
}

Test(feed, refuses_bad_batches_and_other_schemas)
{
	struct ts_feed f;
	int64_t idx[4] = { 0, 1, 2, NINDEX };
	cr_assert_eq(ts_feed_open(&f, name, &params, NINDEX), 0);
	cr_expect_eq(publish(&f, idx, 4, 1, 0, schema), -EINVAL, "index beyond the dataset");
	idx[3] = 3;
	uint64_t len[2] = { 4 * 12, 7 };
	const void *src[2] = { idx, idx };
	struct ts_feed_batch b = { .npos = 2, .nsamples = 4, .len = len, .src = src, .schema = "" };
	cr_expect_eq(ts_feed_publish(&f, &b, SEC), -EINVAL, "a position that is not whole samples");

	/* A consumer that learnt one schema refuses another. */
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		struct ts_feed g;
		struct ts_feed_info info;
		if (ts_feed_open(&g, name, &params, NINDEX) || ts_feed_attach(&g, 0))
			_exit(10);
		while (ts_feed_next(&g, 5 * SEC, &info) == -ETIMEDOUT)
			;
		uint32_t p0[3 * 8];
		uint64_t p1[8], got[2] = { 0, 0 }, want[2] = { 8 * 12, 8 * 8 };
		void *dst[2] = { p0, p1 };
		int eoe, ret = ts_feed_read(&g, 2, want, dst, got, &eoe, 5 * SEC);
		_exit(ret == -EPROTO && got[0] <= 4 * 12 ? 0 : 20 + (ret < 0 ? -ret % 50 : 0));
	}
	usleep(200000);
	cr_assert_eq(publish(&f, idx, 4, 1, 0, schema), 0);
	cr_assert_eq(publish(&f, idx, 4, 1, 0, "{\"other\":1}"), 0);
	cr_expect_eq(wait_exit(pid), 0, "second schema refused with -EPROTO after the first batch");
	ts_feed_close(&f);
}

Test(feed, corrupt_slot_header_is_refused_not_trusted)
{
	struct ts_feed f;
	int64_t idx[4] = { 0, 1, 2, 3 };
	cr_assert_eq(ts_feed_open(&f, name, &params, NINDEX), 0);
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		struct ts_feed g;
		struct ts_feed_info info;
		if (ts_feed_open(&g, name, &params, NINDEX) || ts_feed_attach(&g, 0))
			_exit(10);
		int ret;
		while ((ret = ts_feed_next(&g, 5 * SEC, &info)) == -ETIMEDOUT)
			;
		_exit(ret == -EBADMSG ? 0 : 20);
	}
	usleep(200000);
	cr_assert_eq(publish(&f, idx, 4, 1, 0, schema), 0);
	/* Scribble over the published slot's header. */
	uint64_t *h = f.own[0].base;
	h[4] ^= 0xffffff; /* nsamples: no longer what the ring says */
	cr_expect_eq(wait_exit(pid), 0, "a header that disagrees with the ring is -EBADMSG");
	ts_feed_close(&f);
}

Test(feed, a_consumer_that_stops_reading_is_evicted_on_request)
{
	struct ts_feed f;
	int64_t idx[2] = { 0, 1 };
	int pfd[2];
	cr_assert_eq(ts_feed_open(&f, name, &params, NINDEX), 0);
	cr_assert_eq(pipe(pfd), 0);
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		struct ts_feed g;
		char c;
		close(pfd[1]);
		if (ts_feed_open(&g, name, &params, NINDEX) || ts_feed_attach(&g, 0))
			_exit(10);
		(void)!read(pfd[0], &c, 1); /* stalls until told */
		uint32_t p0[6];
		uint64_t p1[2], got[2] = { 0, 0 }, want[2] = { 24, 16 };
		void *dst[2] = { p0, p1 };
		int eoe, ret = ts_feed_read(&g, 2, want, dst, got, &eoe, SEC);
		_exit(ret == -ESTALE ? 0 : 20);
	}
	close(pfd[0]);
	usleep(300000);
	for (int k = 0; k < 4; k++)
		cr_assert_eq(publish(&f, idx, 2, 1, 0, schema), 0);
	uint64_t len[2] = { 24, 16 };
	uint32_t p0[6];
	uint64_t p1[2];
	const void *src[2] = { p0, p1 };
	struct ts_feed_batch b = { .npos = 2, .nsamples = 2, .len = len, .src = src, .index = idx, .stream_epoch = 1,
				   .schema = schema, .schema_len = (uint32_t)strlen(schema) };
	cr_expect_eq(ts_feed_publish(&f, &b, SEC / 10), -ETIMEDOUT, "held back by the stalled consumer");
	cr_expect_eq(ts_feed_evict_laggards(&f), 1);
	cr_expect_eq(ts_feed_publish(&f, &b, SEC / 10), 0, "free again");
	(void)!write(pfd[1], "g", 1);
	cr_expect_eq(wait_exit(pid), 0, "the evicted consumer learns it with -ESTALE");
	close(pfd[1]);
	ts_feed_close(&f);
}

Test(feed, stale_files_of_an_ended_session_are_removed)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/" TS_FEED_PREFIX "%u.%s.1234.w0.e1.s0", ts_shm_dir(), (unsigned)getuid(), name);
	int fd = open(path, O_CREAT | O_EXCL | O_RDWR, 0600);
	cr_assert_geq(fd, 0);
	close(fd);
	cr_expect_eq(count_files(), 1);
	struct ts_feed f;
	cr_assert_eq(ts_feed_open(&f, name, &params, NINDEX), 0);
	cr_expect_eq(access(path, F_OK), -1, "a file of another incarnation is removed at open");
	ts_feed_close(&f);
	cr_expect_eq(count_files(), 0);
}

Test(feed, successor_fences_a_replaced_producers_open_claim)
{
	struct ts_feed f;
	struct ts_batch_meta *meta;
	int64_t idx[4] = { 0, 1, 2, 3 };
	int go[2], done[2];
	char c;
	cr_assert_eq(ts_feed_open(&f, name, &params, NINDEX), 0);
	cr_assert_eq(publish(&f, idx, 4, 1, 0, schema), 0);
	/* The producer is half-way through its next publish: slot claimed, row filled. */
	cr_assert_eq(ts_ring_begin(f.s.seg, &f.w, SEC, &meta), 0);
	*meta = (struct ts_batch_meta){ .npos = 1, .len = { 8 }, .nsamples = 1, .tag = f.w.epoch };
	cr_assert_eq(pipe(go), 0);
	cr_assert_eq(pipe(done), 0);
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		struct ts_feed g;
		int64_t rest[NINDEX];
		uint64_t epoch, nrest, npub;
		int ended;
		if (ts_feed_open(&g, name, &params, NINDEX))
			_exit(10);
		/* It is replaced (it went silent, say): g takes over. */
		uint64_t w = atomic_load(&g.s.seg->producer);
		if (!atomic_compare_exchange_strong(&g.s.seg->producer, &w,
						    ts_producer_word(ts_producer_epoch(w) + 1, g.s.self)))
			_exit(11);
		int ret = ts_feed_stream_state(&g, &epoch, &ended, rest, &nrest, &npub, SEC);
		(void)!write(go[1], "x", 1);
		(void)!read(done[0], &c, 1);
		_exit(ret == 0 && epoch == 1 && !ended && npub == 4 && nrest == NINDEX - 4 ? 0 : 20);
	}
	cr_assert_eq(read(go[0], &c, 1), 1);
	cr_expect_eq(ts_ring_publish(f.s.seg, &f.w), -EPERM,
		     "the successor counted the stream after taking the open claim: the old publish must fail");
	(void)!write(done[1], "x", 1);
	cr_expect_eq(wait_exit(pid), 0, "the successor sees the stream as it was at its fence");
	ts_feed_close(&f);
}

/* Child: attach (at the epoch start or the head), read to the end of the
 * epoch at batch size 10; exit with the number of samples read, which must
 * be the epoch's last ones in the stream's order (else 200+). */
static void tail_reader_child(int at_epoch_start, int ready_fd)
{
	struct ts_feed f;
	if (ts_feed_open(&f, name, &params, NINDEX) || ts_feed_attach(&f, at_epoch_start))
		_exit(201);
	(void)!write(ready_fd, "r", 1);
	uint64_t seen = 0, k = 0;
	for (int eoe = 0; !eoe;) {
		uint32_t p0[3 * 10];
		uint64_t p1[10], got[2] = { 0, 0 }, want[2] = { 10 * 12, 10 * 8 };
		void *dst[2] = { p0, p1 };
		int ret;
		while ((ret = ts_feed_read(&f, 2, want, dst, got, &eoe, 5 * SEC)) == -ETIMEDOUT)
			;
		if (ret)
			_exit(202);
		for (uint64_t j = 0; j < got[0] / 12; j++, seen++) {
			if (seen == 0) /* where in the permutation we start */
				while (k < NINDEX && (uint64_t)perm(k) != p1[0] / 1000)
					k++;
			if (k + seen >= NINDEX || p1[j] != (uint64_t)perm(k + seen) * 1000)
				_exit(203);
		}
	}
	ts_feed_close(&f);
	_exit(k + seen == NINDEX ? (int)seen : 204);
}

static pid_t start_tail_reader(int at_epoch_start)
{
	int pfd[2];
	char c;
	cr_assert_eq(pipe(pfd), 0);
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		close(pfd[0]);
		tail_reader_child(at_epoch_start, pfd[1]);
	}
	close(pfd[1]);
	cr_assert_eq(read(pfd[0], &c, 1), 1, "reader did not attach");
	close(pfd[0]);
	return pid;
}

static void publish_batches(struct ts_feed *f, uint64_t epoch, uint64_t from, uint64_t to)
{
	int64_t idx[10];
	for (uint64_t b = from; b < to; b++) {
		for (uint64_t k = 0; k < 10; k++)
			idx[k] = perm(b * 10 + k);
		cr_assert_eq(publish(f, idx, 10, epoch, b == NINDEX / 10 - 1, schema), 0);
	}
}

Test(feed, a_joiner_reads_the_current_epoch_from_its_start_while_the_ring_holds_it)
{
	struct ts_feed f;
	cr_assert_eq(ts_feed_open(&f, name, &params, NINDEX), 0);
	publish_epoch(&f, 1, 10);      /* 5 batches, more than the ring holds */
	publish_batches(&f, 2, 0, 2);  /* epoch 2 under way: its start is in the ring */
	pid_t whole = start_tail_reader(1), head = start_tail_reader(0);
	publish_batches(&f, 2, 2, 5);
	cr_expect_eq(wait_exit(whole), NINDEX, "at the epoch start: the whole epoch, in order");
	cr_expect_eq(wait_exit(head), NINDEX - 20, "at the head: the rest after the 2 batches published");

	publish_batches(&f, 3, 0, 4);  /* epoch 3's start has left the ring's window */
	pid_t late = start_tail_reader(1);
	publish_batches(&f, 3, 4, 5);
	cr_expect_eq(wait_exit(late), 10, "start overwritten: the joiner falls back to the head");

	pid_t between = start_tail_reader(1); /* epoch 3 ended, not whole in the ring: the next one */
	publish_batches(&f, 4, 0, 5);
	cr_expect_eq(wait_exit(between), NINDEX, "between epochs: the next epoch, whole");

	publish_epoch(&f, 5, 25);      /* 2 batches: an ended epoch the ring holds whole */
	pid_t ended = start_tail_reader(1);
	cr_expect_eq(wait_exit(ended), NINDEX, "just after an epoch ended: that epoch, whole, at once");
	ts_feed_close(&f);
}

/* ---- views: batches without a copy ---------------------------------------- */

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

/* Child: view batch 0, read 9 more batches (the producer writes slot 0 twice
 * more meanwhile), then the view must still hold batch 0; exit 0 if so. */
static void view_keeper_child(int ready_fd)
{
	struct ts_feed f;
	if (ts_feed_open(&f, name, &params, NINDEX) || ts_feed_attach(&f, 0))
		_exit(10);
	(void)!write(ready_fd, "r", 1);
	uint64_t want[2] = { 120, 80 }, got[2], id;
	void *ptr[2];
	int eoe, ret;
	while ((ret = ts_feed_read_view(&f, 2, want, ptr, got, &eoe, &id, 5 * SEC)) == -ETIMEDOUT)
		;
	if (ret || got[0] != 120 || got[1] != 80 || !id || !batch_is(ptr, 10, 0))
		_exit(11);
	if (!read_batches(&f, 9, 10))
		_exit(12);
	if (!batch_is(ptr, 10, 0))
		_exit(13); /* overwritten under us */
	memset(ptr[0], 0, 120); /* ours to write: copy-on-write */
	ts_feed_release_view(&f, id);
	ts_feed_release_view(&f, id); /* twice: ignored */
	ts_feed_close(&f);
	_exit(0);
}

Test(feed, a_view_keeps_its_bytes_while_the_producer_writes_on)
{
	struct ts_feed f;
	int pfd[2];
	char c;
	cr_assert_eq(ts_feed_open(&f, name, &params, NINDEX), 0);
	cr_assert_eq(pipe(pfd), 0);
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		close(pfd[0]);
		view_keeper_child(pfd[1]);
	}
	close(pfd[1]);
	cr_assert_eq(read(pfd[0], &c, 1), 1);
	close(pfd[0]);
	publish_batches(&f, 1, 0, 5);
	publish_batches(&f, 2, 0, 5); /* slot 0 again at batches 4 and 8: a fresh file each time it is held */
	cr_expect_eq(wait_exit(pid), 0, "the viewed batch stayed intact (exit 11 view, 12 reads, 13 overwritten)");
	cr_expect_geq(f.gen[0], 1u, "slot 0's held file was replaced, not written");
	ts_feed_close(&f);
	cr_expect_eq(count_files(), 0, "replaced files leave nothing behind");
}

Test(feed, a_request_across_two_slots_is_not_a_view_and_consumes_nothing)
{
	struct ts_feed f;
	cr_assert_eq(ts_feed_open(&f, name, &params, NINDEX), 0);
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		struct ts_feed g;
		if (ts_feed_open(&g, name, &params, NINDEX) || ts_feed_attach(&g, 0))
			_exit(10);
		usleep(300000); /* both batches published */
		uint64_t want[2] = { 15 * 12, 15 * 8 }, got[2] = { 0, 0 }, id;
		void *ptr[2];
		int eoe;
		if (ts_feed_read_view(&g, 2, want, ptr, got, &eoe, &id, SEC) != -EXDEV || id)
			_exit(11);
		uint32_t p0[45];
		uint64_t p1[15];
		void *dst[2] = { p0, p1 };
		got[0] = got[1] = 0;
		if (ts_feed_read(&g, 2, want, dst, got, &eoe, SEC) || got[0] != 15 * 12 || !batch_is(dst, 15, 0))
			_exit(12);
		ts_feed_close(&g);
		_exit(0);
	}
	usleep(100000);
	publish_batches(&f, 1, 0, 2);
	cr_expect_eq(wait_exit(pid), 0, "-EXDEV, then the same bytes by copy (exit 11: not EXDEV, 12: copy wrong)");
	ts_feed_close(&f);
}

Test(feed, views_outlive_the_feed_as_private_memory)
{
	struct ts_feed f;
	int go[2], done[2];
	char c;
	cr_assert_eq(ts_feed_open(&f, name, &params, NINDEX), 0);
	cr_assert_eq(pipe(go), 0);
	cr_assert_eq(pipe(done), 0);
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		struct ts_feed g;
		if (ts_feed_open(&g, name, &params, NINDEX) || ts_feed_attach(&g, 0))
			_exit(10);
		uint64_t want[2] = { 120, 80 }, got[2], id;
		void *ptr[2];
		int eoe, ret;
		(void)!write(go[1], "r", 1);
		while ((ret = ts_feed_read_view(&g, 2, want, ptr, got, &eoe, &id, 5 * SEC)) == -ETIMEDOUT)
			;
		if (ret || !batch_is(ptr, 10, 0))
			_exit(11);
		ts_feed_close(&g); /* the program keeps its batch */
		(void)!write(go[1], "c", 1);
		(void)!read(done[0], &c, 1);
		_exit(batch_is(ptr, 10, 0) ? 0 : 12);
	}
	cr_assert_eq(read(go[0], &c, 1), 1);
	publish_batches(&f, 1, 0, 1);
	cr_assert_eq(read(go[0], &c, 1), 1);
	publish_batches(&f, 1, 1, 5); /* slot 0 rewritten in place: its holder has left */
	cr_expect_eq(f.gen[0], 0u, "a holder that left holds nothing");
	(void)!write(done[1], "d", 1);
	cr_expect_eq(wait_exit(pid), 0, "the closed feed's view still holds batch 0");
	ts_feed_close(&f);
}
