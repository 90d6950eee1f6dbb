/* SPDX-License-Identifier: MIT */
/*
 * Data feeds (core/feed.c): what a consumer reads is what the producer
 * published, at any batch size; a successor learns exactly which samples of
 * an unfinished epoch are left; bad slot files are refused; nothing is left
 * in /dev/shm. Consumers are other processes (a process is one member):
 * tests/helpers/ts-feedpeer, started with posix_spawn. Not fork(): the test
 * runs threads (the producer's heartbeat, Criterion's) and a forked child
 * inherits any lock one of them held at that moment; the child's heartbeat
 * thread then waited forever on gcc 12 ASan's allocator lock.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../helpers/feedfiles.h"
#include "../helpers/feedpeer.h"

static char name[64];

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

static int publish_within(struct ts_feed *f, const int64_t *idx, uint64_t n, uint64_t epoch, int eoe, const char *sch,
			  uint64_t timeout_ns)
{
	uint32_t p0[3 * 64];
	uint64_t p1[64];
	fill(p0, p1, idx, n);
	uint64_t len[2] = { n * 12, n * 8 };
	const void *src[2] = { p0, p1 };
	struct ts_feed_batch b = { .npos = 2, .flags = eoe ? TS_BATCH_END_OF_EPOCH : 0, .nsamples = n, .len = len,
				   .src = src, .index = idx, .stream_epoch = epoch, .schema = sch,
				   .schema_len = (uint32_t)strlen(sch), .cpu_ns = 1000 * n };
	return ts_feed_publish(f, &b, timeout_ns);
}

static int publish(struct ts_feed *f, const int64_t *idx, uint64_t n, uint64_t epoch, int eoe, const char *sch)
{
	return publish_within(f, idx, n, epoch, eoe, sch, 5 * SEC);
}

extern char **environ;

/* A pipe for a peer: it inherits end child_end (0: it reads, 1: it writes);
 * the test's end is close-on-exec. */
static void peer_pipe(int p[2], int child_end)
{
	cr_assert_eq(pipe(p), 0);
	cr_assert_eq(fcntl(p[!child_end], F_SETFD, FD_CLOEXEC), 0);
}

/* Start ts-feedpeer ROLE <feed> ARGS... (nargs numbers: descriptors, batch
 * sizes), found next to this program (build/tests/, build-asan/tests/ ...). */
static pid_t spawn_peer(const char *role, int nargs, ...)
{
	char exe[4096], num[3][16], *argv[7] = { "ts-feedpeer", (char *)role, name };
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	cr_assert_gt(n, 0);
	exe[n] = 0;
	char *slash = strrchr(exe, '/');
	cr_assert_not_null(slash);
	snprintf(slash + 1, sizeof(exe) - (size_t)(slash + 1 - exe), "ts-feedpeer");
	cr_assert_eq(access(exe, X_OK), 0, "%s not built (make check-build)", exe);
	va_list ap;
	va_start(ap, nargs);
	for (int k = 0; k < nargs && k < 3; k++) {
		snprintf(num[k], sizeof(num[k]), "%d", va_arg(ap, int));
		argv[3 + k] = num[k];
	}
	va_end(ap);
	pid_t pid;
	int err = posix_spawn(&pid, exe, NULL, NULL, argv, environ);
	cr_assert_eq(err, 0, "posix_spawn %s: %s", exe, strerror(err));
	return pid;
}

static void hear(int fd, const char *what)
{
	char c;
	cr_assert_eq(read(fd, &c, 1), 1, "%s", what);
}

static void say(int fd)
{
	cr_assert_eq(write(fd, "g", 1), 1);
}

/* A consumer (ts-feedpeer consumer): reads one epoch at batch size bs and
 * exits 0 iff every sample is right and in order (10 open/attach, 11 first
 * batch's layout or schema, 12 read error, 13 batch size, 14 a wrong sample,
 * 15 not the whole epoch). Returns once it is attached. */
static pid_t start_consumer(int bs)
{
	int pfd[2];
	peer_pipe(pfd, 1);
	pid_t pid = spawn_peer("consumer", 2, bs, pfd[1]);
	close(pfd[1]);
	hear(pfd[0], "consumer did not attach");
	close(pfd[0]);
	return pid;
}

/* Start ts-feedpeer ROLE with a "ready" pipe it writes once attached and a
 * "go" pipe it waits on; returns once it is attached, *go_fd the test's end. */
static pid_t start_held_peer(const char *role, int *go_fd)
{
	int ready[2], go[2];
	peer_pipe(ready, 1);
	peer_pipe(go, 0);
	pid_t pid = spawn_peer(role, 2, ready[1], go[0]);
	close(ready[1]);
	close(go[0]);
	hear(ready[0], "consumer did not attach");
	close(ready[0]);
	*go_fd = go[1];
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
	cr_expect_eq(count_feed_files(name), 0, "the last member out removes the feed's files");
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

	/* The count alone (a consumer joining in mid-epoch) agrees, with no list. */
	uint64_t cepoch = 0, cnrest = 0, cnpub = 0;
	int cended = 1;
	cr_assert_eq(ts_feed_stream_count(&f, &cepoch, &cended, &cnrest, &cnpub, SEC), 0);
	cr_expect(cepoch == 2 && !cended);
	cr_expect_eq(cnrest, 8u, "counted without a list");
	cr_expect_eq(cnpub, 42u);
	ts_feed_close(&f);
}

/*
 * What was published, as a reader sees it, also for a member that was
 * elected producer while it was away (the others left): the same count as
 * ts_feed_stream_state, with no slot claimed. Before, a producer's loss was
 * not noted at all, and its epoch lacked what was published while it was
 * stopped (a consumer evicted, woken after the producer had left: 4 of 13
 * batches, then StopIteration; found by a differential run).
 */
Test(feed, stream_seen_counts_as_a_reader_and_claims_nothing)
{
	struct ts_feed f;
	int64_t rest[NINDEX], idx[7];
	uint64_t epoch, nrest, npub;
	int ended;
	cr_assert_eq(ts_feed_open(&f, name, &params, NINDEX), 0);
	for (uint64_t b = 0; b < 3; b++) {
		for (uint64_t k = 0; k < 7; k++)
			idx[k] = perm(b * 7 + k);
		cr_assert_eq(publish(&f, idx, 7, 4, 0, schema), 0);
	}
	cr_assert_eq(ts_session_role(&f.s), TS_ROLE_PRODUCER);
	cr_assert_eq(ts_feed_stream_seen(&f, &epoch, &ended, rest, &nrest, &npub), 0);
	cr_expect(epoch == 4 && !ended);
	cr_expect_eq(npub, 21u);
	cr_expect_eq(nrest, (uint64_t)NINDEX - 21);
	cr_expect(!f.w.claimed, "no slot claimed");
	cr_assert_eq(ts_feed_stream_state(&f, &epoch, &ended, rest, &nrest, &npub, SEC), 0);
	cr_expect_eq(npub, 21u, "the producer's own count agrees");
	cr_expect(f.w.claimed, "and claims the next slot (its fence)");
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

/*
 * A producer killed between its publish and its mark leaves a batch only the
 * ring knows of. Its successor counts it, and writes it into the ledger: once
 * the successor has published a full turn the ring forgets the batch, and a
 * second successor made it again (every consumer trained on it twice).
 */
static int publish5(struct ts_feed *f, uint64_t b, uint64_t epoch)
{
	int64_t idx[5];
	for (uint64_t k = 0; k < 5; k++)
		idx[k] = perm(b * 5 + k);
	return publish(f, idx, 5, epoch, 0, schema);
}

Test(feed, a_batch_only_the_ring_knows_of_is_not_made_again_after_a_second_takeover)
{
	struct ts_feed a, b, c;
	int64_t rest[NINDEX];
	uint64_t epoch, nrest, npub;
	int ended;
	cr_assert_eq(ts_feed_open(&a, name, &params, NINDEX), 0);
	cr_assert_eq(ts_feed_open(&b, name, &params, NINDEX), 0);
	cr_assert_eq(ts_feed_open(&c, name, &params, NINDEX), 0);
	cr_assert_eq(ts_feed_role(&a), TS_ROLE_PRODUCER);
	for (uint64_t s = 0; s < 4; s++)
		cr_assert_eq(publish5(&a, s, 1), 0);
	/* a's last batch was published, never marked: a died in between */
	_Atomic uint64_t *bits = (_Atomic uint64_t *)a.ledger + 8; /* the ledger's bits: after 8 header words */
	for (uint64_t k = 15; k < 20; k++)
		atomic_fetch_and(&bits[perm(k) / 64], ~(1ull << (perm(k) % 64)));
	ts_feed_close(&a);
	struct ts_feed *s1 = ts_feed_role(&b) == TS_ROLE_PRODUCER ? &b : &c, *s2 = s1 == &b ? &c : &b;
	cr_assert_eq(ts_feed_role(s1), TS_ROLE_PRODUCER);
	cr_assert_eq(ts_feed_stream_state(s1, &epoch, &ended, rest, &nrest, &npub, SEC), 0);
	cr_expect_eq(npub, 20u, "the first successor counts the ring's batch");
	for (uint64_t s = 4; s < 8; s++) /* a full turn of the ring: it forgets a's last batch */
		cr_assert_eq(publish5(s1, s, 1), 0);
	ts_feed_close(s1); /* the successor's job ends mid-epoch */
	cr_assert_eq(ts_feed_role(s2), TS_ROLE_PRODUCER);
	cr_assert_eq(ts_feed_stream_state(s2, &epoch, &ended, rest, &nrest, &npub, SEC), 0);
	cr_expect_eq(npub, 40u, "40 samples were published");
	cr_expect_eq(nrest, (uint64_t)NINDEX - 40);
	for (uint64_t k = 0; k < nrest; k++)
		for (uint64_t j = 15; j < 20; j++)
			cr_expect_neq(rest[k], perm(j), "sample %ld of a's last batch would be made again", (long)rest[k]);
	ts_feed_close(s2);
}

/*
 * The ledger's nbits was checked equal to the dataset's size at open; a peer
 * that rewrites it since must not make the producer clear bits past the end
 * of the file (it used to loop to the file's nbits: SIGSEGV).
 */
Test(feed, a_ledger_rewritten_after_open_is_written_only_within_its_file)
{
	struct ts_feed f;
	int64_t rest[NINDEX], idx[5] = { 1, 2, 3, 4, 5 };
	uint64_t epoch, nrest, npub;
	int ended;
	cr_assert_eq(ts_feed_open(&f, name, &params, NINDEX), 0);
	cr_assert_eq(publish(&f, idx, 5, 1, 0, schema), 0);
	atomic_store(&((_Atomic uint64_t *)f.ledger)[2], 1ull << 40); /* nbits: 2^34 words to clear */
	/* a new stream epoch: the producer clears the ledger's bits before it marks the batch */
	cr_assert_eq(publish(&f, idx, 5, 2, 0, schema), 0);
	cr_assert_eq(ts_feed_stream_state(&f, &epoch, &ended, rest, &nrest, &npub, SEC), 0);
	cr_expect_eq(epoch, 2u);
	cr_expect_eq(npub, 5u, "the new epoch's batch is marked, the old one's bits cleared");
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

	/* A consumer that learnt one schema refuses another (ts-feedpeer schema). */
	int ready[2];
	peer_pipe(ready, 1);
	pid_t pid = spawn_peer("schema", 1, ready[1]);
	close(ready[1]);
	hear(ready[0], "consumer did not attach");
	close(ready[0]);
	cr_assert_eq(publish(&f, idx, 4, 1, 0, schema), 0);
	cr_assert_eq(publish(&f, idx, 4, 1, 0, "{\"other\":1}"), 0);
	cr_expect_eq(wait_exit(pid), 0, "second schema refused with -EPROTO after the first batch");
	ts_feed_close(&f);
}

Test(feed, corrupt_slot_header_is_refused_not_trusted)
{
	struct ts_feed f;
	int64_t idx[4] = { 0, 1, 2, 3 };
	int go;
	cr_assert_eq(ts_feed_open(&f, name, &params, NINDEX), 0);
	/* ts-feedpeer corrupt: attached, it reads the batch when told: -EBADMSG, exit 0 */
	pid_t pid = start_held_peer("corrupt", &go);
	cr_assert_eq(publish(&f, idx, 4, 1, 0, schema), 0);
	/* Scribble over the published slot's header. */
	uint64_t *h = f.own[0].base;
	h[4] ^= 0xffffff; /* nsamples: no longer what the ring says */
	say(go);
	close(go);
	cr_expect_eq(wait_exit(pid), 0, "a header that disagrees with the ring is -EBADMSG");
	ts_feed_close(&f);
}

/* Open f as producer and fill its ring (4 batches of samples 0 and 1) with
 * ts-feedpeer MODE attached and not reading: the next publish is held back.
 * The peer's pid; *go tells it to go on (let_go). */
static pid_t held_back_by(struct ts_feed *f, const char *mode, int *go)
{
	int64_t idx[2] = { 0, 1 };
	cr_assert_eq(ts_feed_open(f, name, &params, NINDEX), 0);
	pid_t pid = start_held_peer(mode, go);
	for (int k = 0; k < 4; k++)
		cr_assert_eq(publish(f, idx, 2, 1, 0, schema), 0);
	cr_expect_eq(publish_within(f, idx, 2, 1, 0, schema, SEC / 10), -ETIMEDOUT, "held back by the peer");
	return pid;
}

/* The next publish goes through now. */
static void free_again(struct ts_feed *f)
{
	int64_t idx[2] = { 0, 1 };
	cr_expect_eq(publish_within(f, idx, 2, 1, 0, schema, SEC / 10), 0, "free again");
}

/* Let the peer go on; it must exit 0 (what says why). */
static void let_go(struct ts_feed *f, pid_t pid, int go, const char *what)
{
	say(go);
	cr_expect_eq(wait_exit(pid), 0, "%s", what);
	close(go);
	ts_feed_close(f);
}

Test(feed, a_consumer_that_stops_reading_is_evicted_on_request)
{
	struct ts_feed f;
	int go;
	/* ts-feedpeer stall: attaches, stalls until told, then looks: -ESTALE, detached, attaches again: exit 0 */
	pid_t pid = held_back_by(&f, "stall", &go);
	cr_expect_eq(ts_feed_evict_laggards(&f), 1);
	free_again(&f);
	let_go(&f, pid, go, "the evicted consumer learns it with -ESTALE");
}

/* A laggard away from the feed (its job waits in another feed, maybe on us)
 * is evicted without the stall time; one that is merely behind is not. */
Test(feed, a_consumer_away_and_waiting_elsewhere_is_evicted_at_once)
{
	struct ts_feed f;
	int go;
	pid_t pid = held_back_by(&f, "stall", &go);
	cr_expect_eq(ts_feed_evict_away(&f, SEC / 10), 0, "not away: it keeps its place");
	int peer = -1;
	for (unsigned m = 0; m < TS_MAX_MEMBERS; m++)
		if ((int)m != f.s.self && (atomic_load(&f.s.seg->members[m].attach) & 1))
			peer = (int)m;
	cr_assert_geq(peer, 0, "the consumer is attached");
	struct ts_member *mb = &f.s.seg->members[peer];
	atomic_store(&mb->away_ns, ts_now_ns()); /* as its ts_feed_set_away() would */
	cr_expect_eq(ts_feed_evict_away(&f, SEC / 10), 0, "away for less than asked: it keeps its place");
	atomic_store(&mb->away_ns, ts_now_ns() - SEC / 5);
	cr_expect_eq(ts_feed_evict_away(&f, SEC / 10), 1, "away long enough: evicted");
	free_again(&f);
	let_go(&f, pid, go, "the evicted consumer learns it with -ESTALE");
}

/* A reader that is about to stop reading (it makes part of its epoch
 * privately) asks whether the producer waits on it, to detach if so. */
Test(feed, a_reader_knows_when_the_producer_waits_on_it)
{
	struct ts_feed f;
	int go;
	pid_t pid = held_back_by(&f, "holding", &go);
	let_go(&f, pid, go, "the reader saw itself holding the producer, then free once it read");
}

Test(feed, stale_files_of_an_ended_session_are_removed)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/" TS_FEED_PREFIX "%u.%s.1234.w0.e1.s0.g0", ts_shm_dir(), (unsigned)getuid(), name);
	int fd = open(path, O_CREAT | O_EXCL | O_RDWR, 0600);
	cr_assert_geq(fd, 0);
	close(fd);
	cr_expect_eq(count_feed_files(name), 1);
	struct ts_feed f;
	cr_assert_eq(ts_feed_open(&f, name, &params, NINDEX), 0);
	cr_expect_eq(access(path, F_OK), -1, "a file of another incarnation is removed at open");
	ts_feed_close(&f);
	cr_expect_eq(count_feed_files(name), 0);

	/* A session made anew while a sweep looks: its files carry an incarnation
	 * of a moment ago, and the sweep that found no segment leaves them. */
	snprintf(path, sizeof(path), "%s/" TS_FEED_PREFIX "%u.%s.%llx.ledger", ts_shm_dir(), (unsigned)getuid(), name,
		 (unsigned long long)ts_prim_realtime_ns());
	fd = open(path, O_CREAT | O_EXCL | O_RDWR, 0600);
	cr_assert_geq(fd, 0);
	close(fd);
	cr_expect_eq(ts_feed_clean_stale(name, 0), 0);
	cr_expect_eq(access(path, F_OK), 0, "a file of an incarnation younger than a second is not removed");
	unlink(path);
}

/*
 * Session names hold dots: the files of a live feed "NAME.2" start like
 * those of NAME. A sweep of NAME (no segment: ended) took the "2" for an
 * incarnation of NAME and removed the live feed's ledger and slot files.
 */
Test(feed, the_sweep_of_a_name_leaves_a_live_feed_whose_name_extends_it)
{
	char other[160];
	int64_t idx[2] = { 0, 1 };
	snprintf(other, sizeof(other), "%s.2", name);
	struct ts_feed f;
	cr_assert_eq(ts_feed_open(&f, other, &params, NINDEX), 0);
	for (int k = 0; k < 2; k++)
		cr_assert_eq(publish(&f, idx, 2, 1, 0, schema), 0);
	int files = count_feed_files(other);
	cr_assert_geq(files, 3, "the ledger and two slot files");
	cr_expect_eq(ts_feed_clean_stale(name, 0), 0, "nothing of %s is %s's", other, name);
	cr_expect_eq(count_feed_files(other), files, "the live feed keeps every file");
	ts_feed_close(&f);
}

/*
 * The last member of a feed can be SIGKILLed after every other member left:
 * a job that ended first had left while it was still alive (the PyTorch
 * layer closes its feeds in an atexit handler, the process lives on a while),
 * so no one was there to remove the segment, the ledger and the slot files.
 * A process that was in the feed sweeps it once more on its way out
 * (ts_feed_clean_stale from the shim's destructor): a feed whose members are
 * all dead is gone, files and segment.
 */
Test(feed, a_feed_whose_last_member_was_killed_after_we_left_is_removed_by_the_sweep)
{
	struct ts_feed f;
	int64_t idx[2] = { 0, 1 };
	int go;
	char seg[TS_PATH_MAX];
	cr_assert_eq(ts_segment_path(seg, sizeof(seg), getuid(), name), 0);
	cr_assert_eq(ts_feed_open(&f, name, &params, NINDEX), 0);
	/* ts-feedpeer stall: attached, it waits on go (it will never hear) */
	pid_t pid = start_held_peer("stall", &go);
	for (int k = 0; k < 2; k++)
		cr_assert_eq(publish(&f, idx, 2, 1, 0, schema), 0);
	ts_feed_close(&f);
	cr_assert_eq(access(seg, F_OK), 0, "a live member is left: the feed stays");
	cr_assert_geq(count_feed_files(name), 3, "ledger and two slot files stay while a member lives");
	cr_expect_eq(ts_feed_clean_stale(name, 0), 0, "the member lives: nothing of its feed is stale");
	cr_expect_geq(count_feed_files(name), 3);
	cr_assert_eq(kill(pid, SIGKILL), 0);
	cr_expect_eq(wait_exit(pid), 100 + SIGKILL);
	close(go);
	cr_expect_geq(ts_feed_clean_stale(name, 0), 3, "every member is dead: the ledger and slot files go");
	cr_expect_eq(count_feed_files(name), 0, "nothing of the feed is left in /dev/shm");
	cr_expect_eq(access(seg, F_OK), -1, "the segment is removed with its files");
}

Test(feed, at_depth_1_a_producer_still_reads_the_stream_it_continues)
{
	struct ts_feed f;
	int64_t idx[4] = { 0, 1, 2, 3 };
	struct ts_session_params one = params;
	one.depth = 1; /* TSSHIM_DEPTH=1 */
	cr_assert_eq(ts_feed_open(&f, name, &one, NINDEX), 0);
	cr_assert_eq(publish(&f, idx, 4, 1, 0, schema), 0);
	uint64_t epoch, nrest, npub;
	int ended;
	cr_expect_eq(ts_feed_stream_state(&f, &epoch, &ended, NULL, &nrest, &npub, SEC), 0,
		     "the fence's claim must not take the slot of the batch it reads");
	cr_expect_eq(epoch, 1u);
	cr_expect_eq(ended, 0);
	ts_feed_close(&f);
}

Test(feed, successor_fences_a_replaced_producers_open_claim)
{
	struct ts_feed f;
	struct ts_batch_meta *meta;
	int64_t idx[4] = { 0, 1, 2, 3 };
	int go[2], done[2];
	cr_assert_eq(ts_feed_open(&f, name, &params, NINDEX), 0);
	cr_assert_eq(publish(&f, idx, 4, 1, 0, schema), 0);
	/* The producer is half-way through its next publish: slot claimed, row filled. */
	cr_assert_eq(ts_ring_begin(f.s.seg, &f.w, SEC, &meta), 0);
	*meta = (struct ts_batch_meta){ .npos = 1, .len = { 8 }, .nsamples = 1, .tag = f.w.epoch };
	peer_pipe(go, 1);
	peer_pipe(done, 0);
	/* ts-feedpeer fence: it replaces the producer (it went silent, say) and
	 * counts the stream, says so, then waits; exit 0 if it counted epoch 1
	 * unfinished with 4 samples published (10 open, 11 takeover, 20 count). */
	pid_t pid = spawn_peer("fence", 2, go[1], done[0]);
	close(go[1]);
	close(done[0]);
	hear(go[0], "the successor did not take over");
	cr_expect_eq(ts_ring_publish(f.s.seg, &f.w), -EPERM,
		     "the successor counted the stream after taking the open claim: the old publish must fail");
	say(done[1]);
	cr_expect_eq(wait_exit(pid), 0, "the successor sees the stream as it was at its fence");
	ts_feed_close(&f);
}

/* A reader (ts-feedpeer tail): attaches (at the epoch start or the head),
 * reads to the end of the epoch at batch size 10; exits with the number of
 * samples read, which must be the epoch's last ones in the stream's order,
 * each with its dataset index in read_index (else 200+). Returns once it is
 * attached. */
static pid_t start_tail_reader(int at_epoch_start)
{
	int pfd[2];
	peer_pipe(pfd, 1);
	pid_t pid = spawn_peer("tail", 2, at_epoch_start, pfd[1]);
	close(pfd[1]);
	hear(pfd[0], "reader did not attach");
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

	/*
	 * Between epochs with the next one's first batch claimed, not yet
	 * published (the producer's fence, or a publish under way): that claim
	 * reuses the oldest slot. Before, its meta row failing to read made the
	 * epoch start look overwritten, and the head was past the batch in
	 * flight: both joiners lost the next epoch's first batch.
	 */
	publish_epoch(&f, 6, 10);
	uint64_t epoch, nrest, npub;
	int was_ended;
	cr_assert_eq(ts_feed_stream_state(&f, &epoch, &was_ended, NULL, &nrest, &npub, SEC), 0, "claims the next slot");
	cr_expect(was_ended);
	pid_t next = start_tail_reader(1), at_head = start_tail_reader(0);
	publish_batches(&f, 7, 0, 5);
	cr_expect_eq(wait_exit(next), NINDEX, "a batch in flight at the epoch start: the next epoch, whole");
	cr_expect_eq(wait_exit(at_head), NINDEX, "at the head: the batch in flight is ours to read");
	ts_feed_close(&f);
}

/* Batch b (10 samples of the permutation) of epoch, noted as made (ts_feed_made). */
static int made(struct ts_feed *f, uint64_t epoch, uint64_t b)
{
	int64_t idx[10];
	for (uint64_t k = 0; k < 10; k++)
		idx[k] = perm(b * 10 + k);
	struct ts_feed_batch mb = { .flags = b == NINDEX / 10 - 1 ? TS_BATCH_END_OF_EPOCH : 0, .nsamples = 10,
				    .index = idx, .stream_epoch = epoch };
	return ts_feed_made(f, &mb);
}

/*
 * A producer alone in its feed publishes nothing (the brief: nothing is
 * published until someone reads it; the layer still publishes an epoch's
 * first ring depth of batches, tsshim_feed_made); what it made is in the
 * ledger only.
 * The stream's state and a joiner's place count it: the joiner starts at
 * the head and not at an old epoch the ring still holds, a successor makes
 * exactly the rest. Before, every batch of a job alone was published (10,000
 * tiny batches: 2.0-2.4 s against 0.4-0.55 s without the shim).
 */
Test(feed, a_producer_alone_publishes_nothing_and_the_stream_counts_what_it_made)
{
	struct ts_feed f;
	int64_t rest[NINDEX];
	uint64_t epoch, nrest, npub;
	int ended;
	cr_assert_eq(ts_feed_open(&f, name, &params, NINDEX), 0);
	publish_epoch(&f, 1, 25);     /* an epoch the ring holds whole: a joiner would read it */
	uint64_t pub = atomic_load(&f.s.seg->ring.pub_seq);
	for (uint64_t b = 0; b < 2; b++)
		cr_assert_eq(made(&f, 2, b), 1, "alone: noted, nothing to publish");
	cr_expect_eq(atomic_load(&f.s.seg->ring.pub_seq), pub, "nothing in the ring");
	cr_assert_eq(ts_feed_stream_state(&f, &epoch, &ended, rest, &nrest, &npub, SEC), 0);
	cr_expect(epoch == 2 && !ended, "epoch %lu ended %d: the epoch made, under way", (unsigned long)epoch, ended);
	cr_expect_eq(npub, 20u);
	cr_assert_eq(nrest, NINDEX - 20u);
	for (uint64_t k = 0; k < nrest; k++)
		for (uint64_t s = 0; s < 20; s++)
			cr_expect_neq(rest[k], perm(s), "index %ld was made", (long)rest[k]);

	/* A joiner at the epoch start: not epoch 1's (old), nor 2's (never in the ring): the head. */
	pid_t late = start_tail_reader(1);
	cr_expect_eq(made(&f, 2, 2), 0, "someone is here: publish it, nothing noted");
	publish_batches(&f, 2, 2, 5);
	cr_expect_eq(wait_exit(late), NINDEX - 20, "the joiner read the rest of the epoch, from the head");

	/* Alone again (the joiner has exited): a whole epoch made, none of it published. */
	pub = atomic_load(&f.s.seg->ring.pub_seq);
	for (uint64_t b = 0; b < 5; b++)
		cr_assert_eq(made(&f, 3, b), 1);
	cr_expect_eq(atomic_load(&f.s.seg->ring.pub_seq), pub, "nothing in the ring");
	cr_assert_eq(ts_feed_stream_state(&f, &epoch, &ended, rest, &nrest, &npub, SEC), 0);
	cr_expect(epoch == 3 && ended, "its last batch noted: the epoch ended");
	pid_t next = start_tail_reader(1);
	publish_batches(&f, 4, 0, 5);
	cr_expect_eq(wait_exit(next), NINDEX, "between epochs: the next one, whole");

	int64_t bad = NINDEX;
	struct ts_feed_batch out = { .nsamples = 1, .index = &bad, .stream_epoch = 5 };
	cr_expect_eq(ts_feed_made(&f, &out), -EINVAL, "an index outside the dataset");
	ts_feed_close(&f);
}

/*
 * ts_feed_noted (core/feed.c's is a weak no-op) opens `joiner` as a member
 * of the feed when set: a job that joins between a lone producer's note of
 * a batch and its look at the members.
 */
static struct ts_feed *joiner;

void ts_feed_noted(struct ts_feed *f)
{
	(void)f;
	if (joiner)
		cr_assert_eq(ts_feed_open(joiner, name, &params, NINDEX), 0);
	joiner = NULL;
}

/*
 * The producer sees the joiner after its note: the batch is published as
 * well (2), and it is out of the ledger again. Should the producer be
 * replaced before that publish (stopped there for a takeover's timeout), its
 * successor counts the batch among the rest of the epoch and makes it.
 * Before, it stayed in the ledger until the publish failed: the successor
 * counted it as made, nobody made it, and every reader's epoch was a batch
 * short.
 */
Test(feed, a_batch_noted_as_a_job_joined_is_made_by_the_successor_if_never_published)
{
	struct ts_feed f, j;
	int64_t rest[NINDEX];
	uint64_t epoch, nrest, npub;
	int ended;
	cr_assert_eq(ts_feed_open(&f, name, &params, NINDEX), 0);
	cr_assert_eq(made(&f, 5, 0), 1, "alone: noted, nothing to publish");
	joiner = &j;
	cr_assert_eq(made(&f, 5, 1), 2, "a job joined between the note and the look: publish it");
	/* replaced before that publish: the producer leaves, the joiner succeeds it */
	ts_feed_close(&f);
	cr_assert_eq(ts_feed_role(&j), TS_ROLE_PRODUCER);
	cr_assert_eq(ts_feed_stream_state(&j, &epoch, &ended, rest, &nrest, &npub, SEC), 0);
	cr_expect(epoch == 5 && !ended, "epoch %lu ended %d", (unsigned long)epoch, ended);
	cr_expect_eq(npub, 10u, "batch 0 made; batch 1 never published");
	cr_assert_eq(nrest, NINDEX - 10u);
	uint64_t of_batch1 = 0;
	for (uint64_t k = 0; k < nrest; k++)
		for (uint64_t s = 0; s < 20; s++)
			if (rest[k] == perm(s)) {
				cr_expect_geq(s, 10u, "index %ld of batch 0 would be made again", (long)rest[k]);
				of_batch1++;
			}
	cr_expect_eq(of_batch1, 10u, "the successor makes batch 1");
	ts_feed_close(&j);
}

/* ---- views: batches without a copy ---------------------------------------- */

Test(feed, a_view_keeps_its_bytes_while_the_producer_writes_on)
{
	struct ts_feed f;
	int pfd[2];
	cr_assert_eq(ts_feed_open(&f, name, &params, NINDEX), 0);
	peer_pipe(pfd, 1);
	/* ts-feedpeer view-keeper: views batch 0, reads 9 more batches (the
	 * producer writes slot 0 twice more meanwhile), then the view must still
	 * hold batch 0; it writes over it (copy-on-write) and releases it twice. */
	pid_t pid = spawn_peer("view-keeper", 1, pfd[1]);
	close(pfd[1]);
	hear(pfd[0], "consumer did not attach");
	close(pfd[0]);
	publish_batches(&f, 1, 0, 5);
	publish_batches(&f, 2, 0, 5); /* slot 0 again at batches 4 and 8: a fresh file each time it is held */
	cr_expect_eq(wait_exit(pid), 0, "the viewed batch stayed intact (exit 11 view, 12 reads, 13 overwritten, "
					"14 ranges reported, 15 pages written before, 16 not written after, 17 read_index)");
	cr_expect_geq(f.gen[0], 1u, "slot 0's held file was replaced, not written");
	ts_feed_close(&f);
	cr_expect_eq(count_feed_files(name), 0, "replaced files leave nothing behind");
}

Test(feed, a_request_across_two_slots_is_not_a_view_and_consumes_nothing)
{
	struct ts_feed f;
	int go;
	cr_assert_eq(ts_feed_open(&f, name, &params, NINDEX), 0);
	/* ts-feedpeer across: once told both batches are published, it asks for
	 * a view of 15 samples (-EXDEV, nothing consumed), then copies 15. */
	pid_t pid = start_held_peer("across", &go);
	publish_batches(&f, 1, 0, 2);
	say(go);
	close(go);
	cr_expect_eq(wait_exit(pid), 0, "-EXDEV, then the same bytes by copy (exit 11: not EXDEV, 12: copy wrong)");
	ts_feed_close(&f);
}

Test(feed, views_outlive_the_feed_as_private_memory)
{
	struct ts_feed f;
	int state[2], done[2];
	cr_assert_eq(ts_feed_open(&f, name, &params, NINDEX), 0);
	peer_pipe(state, 1);
	peer_pipe(done, 0);
	/* ts-feedpeer outlive: attaches ('r'), views batch 0, closes its feed
	 * ('c'), and when told checks that its view still holds batch 0. */
	pid_t pid = spawn_peer("outlive", 2, state[1], done[0]);
	close(state[1]);
	close(done[0]);
	hear(state[0], "consumer did not attach");
	publish_batches(&f, 1, 0, 1);
	hear(state[0], "consumer did not view and close");
	close(state[0]);
	publish_batches(&f, 1, 1, 5); /* slot 0 rewritten in place: its holder has left */
	cr_expect_eq(f.gen[0], 0u, "a holder that left holds nothing");
	say(done[1]);
	close(done[1]);
	cr_expect_eq(wait_exit(pid), 0, "the closed feed's view still holds batch 0");
	ts_feed_close(&f);
}

/*
 * A member elected producer while batches of its predecessor are still
 * unread at its place (the predecessor ended while it trained): publishing
 * now would put its batch behind those, and a caller that reads past its own
 * batch would take the predecessor's for it. It is told to read first.
 */
Test(feed, a_successor_behind_the_head_reads_before_it_publishes)
{
	struct ts_feed a, b;
	int64_t idx[10];
	uint32_t p0[30];
	uint64_t p1[10], want[2] = { 10 * 12, 10 * 8 }, got[2];
	void *dst[2] = { p0, p1 };
	int eoe;

	cr_assert_eq(ts_feed_open(&a, name, &params, NINDEX), 0);
	cr_assert_eq(ts_feed_open(&b, name, &params, NINDEX), 0);
	cr_assert_eq(ts_feed_attach(&b, 0), 0);
	for (uint64_t s = 0; s < 2; s++) {
		for (uint64_t k = 0; k < 10; k++)
			idx[k] = perm(s * 10 + k);
		cr_assert_eq(publish(&a, idx, 10, 1, 0, schema), 0);
	}
	ts_feed_close(&a);
	cr_assert_eq(ts_feed_role(&b), TS_ROLE_PRODUCER, "the one left is elected");
	for (uint64_t k = 0; k < 10; k++)
		idx[k] = perm(20 + k);
	cr_expect_eq(publish(&b, idx, 10, 1, 0, schema), -EDEADLK, "two batches unread");
	for (uint64_t s = 0; s < 2; s++) {
		got[0] = got[1] = 0; /* ts_feed_read adds to got[] */
		cr_assert_eq(ts_feed_read(&b, 2, want, dst, got, &eoe, SEC), 0);
		cr_expect(got[0] == want[0] && p0[0] == (uint32_t)perm(s * 10) && p1[9] == 1000u * (uint64_t)perm(s * 10 + 9),
			  "batch %lu is the predecessor's (got %lu bytes, sample %u, %lu)", (unsigned long)s,
			  (unsigned long)got[0], p0[0], (unsigned long)p1[9]);
		if (s == 0)
			cr_expect_eq(publish(&b, idx, 10, 1, 0, schema), -EDEADLK, "one batch unread");
	}
	cr_expect_eq(publish(&b, idx, 10, 1, 0, schema), 0, "at the head: it publishes");
	got[0] = got[1] = 0;
	cr_expect_eq(ts_feed_read(&b, 2, want, dst, got, &eoe, SEC), 0);
	cr_expect(got[0] == want[0] && p0[0] == (uint32_t)perm(20), "and reads its own batch next");
	ts_feed_close(&b);
}

/* ---- what a peer's slot headers may not do ---------------------------------------- */

static int publish_bytes(struct ts_feed *f, uint64_t nsamples, uint64_t len0, int64_t first)
{
	static unsigned char src[64];
	int64_t idx[64];
	for (uint64_t i = 0; i < nsamples; i++)
		idx[i] = first + (int64_t)i;
	uint64_t len[1] = { len0 };
	const void *s[1] = { src };
	struct ts_feed_batch b = { .npos = 1, .nsamples = nsamples, .len = len, .src = s, .index = idx,
				   .schema = "S", .schema_len = 1 };
	return ts_feed_publish(f, &b, SEC);
}

/*
 * A consumer sizes its read_index by the sample size ts_feed_next told it;
 * a later slot of the same schema may cut its bytes into smaller samples
 * (a peer chooses). Before, copy_index wrote one index per such sample
 * past the caller's room (ASan: heap-buffer-overflow in copy_index). The
 * consumer is a second member in this process: no peer program needed.
 */
Test(feed, a_slot_of_smaller_samples_writes_no_index_past_the_room_given)
{
	struct ts_feed p, c;
	cr_assert_eq(ts_feed_open(&p, name, &params, 2000), 0);
	cr_assert_eq(ts_feed_open(&c, name, &params, 2000), 0);
	cr_assert_eq(ts_feed_attach(&c, 0), 0);
	cr_assert_eq(publish_bytes(&p, 1, 4, 0), 0, "one sample of 4 bytes");
	struct ts_feed_info info;
	cr_assert_eq(ts_feed_next(&c, SEC, &info), 0);
	cr_assert_eq(info.sample_bytes[0], 4u);
	cr_assert_eq(publish_bytes(&p, 8, 8, 100), 0, "8 samples of 1 byte, the same schema");

	int64_t index[2 + 16];
	for (int i = 0; i < 18; i++)
		index[i] = i < 2 ? -1 : 77;
	unsigned char dst[8];
	void *d[1] = { dst };
	uint64_t want[1] = { 8 }, got[1] = { 0 };
	int eoe;
	c.read_index = index;
	c.read_index_len = 2; /* room for the 2 samples of 4 bytes asked for */
	cr_expect_eq(ts_feed_read(&c, 1, want, d, got, &eoe, SEC), 0);
	c.read_index = NULL;
	cr_expect_eq(got[0], 8u);
	cr_expect_eq(index[0], 0, "the first slot's sample");
	cr_expect_eq(index[1], -1, "the second slot numbers its samples by its own size (4 to 7): none fits");
	for (int i = 2; i < 18; i++)
		cr_expect_eq(index[i], 77, "index[%d] written past the room given: %ld", i, (long)index[i]);
	ts_feed_close(&c);
	ts_feed_close(&p);
}

/*
 * ts_feed_next tells the dataset index of the sample at the reader's place,
 * also part-way into a slot: a sequential loader's reader that made samples
 * privately reads past those the stream repeats, and no further.
 */
Test(feed, next_tells_the_index_of_the_sample_at_our_place)
{
	struct ts_feed p, c;
	cr_assert_eq(ts_feed_open(&p, name, &params, 2000), 0);
	cr_assert_eq(ts_feed_open(&c, name, &params, 2000), 0);
	cr_assert_eq(ts_feed_attach(&c, 0), 0);
	cr_assert_eq(publish_bytes(&p, 8, 8, 40), 0, "samples 40..47, a byte each");
	struct ts_feed_info info;
	cr_assert_eq(ts_feed_next(&c, SEC, &info), 0);
	cr_expect_eq(info.next_index, 40);
	unsigned char dst[8];
	void *d[1] = { dst };
	uint64_t want[1] = { 3 }, got[1] = { 0 };
	int eoe;
	cr_assert_eq(ts_feed_read(&c, 1, want, d, got, &eoe, SEC), 0);
	cr_assert_eq(ts_feed_next(&c, SEC, &info), 0);
	cr_expect_eq(info.next_index, 43, "three read: the fourth sample's");
	want[0] = 5;
	got[0] = 0;
	cr_assert_eq(ts_feed_read(&c, 1, want, NULL, got, &eoe, SEC), 0);
	cr_assert_eq(publish_bytes(&p, 1, 1, 1999), 0);
	cr_assert_eq(ts_feed_next(&c, SEC, &info), 0);
	cr_expect_eq(info.next_index, 1999, "the next slot's first");
	got[0] = 0;
	want[0] = 1;
	cr_assert_eq(ts_feed_read(&c, 1, want, NULL, got, &eoe, SEC), 0);
	ts_feed_close(&c);
	ts_feed_close(&p);
}

/*
 * A batch read without a copy is read like any other: the epoch of the last
 * sample read is its. An evicted reader's loss is noted against that epoch
 * (tsshim_feed_note_loss); before, views left it at the last copied read's
 * (0 for a reader that only viewed), and an eviction in mid-epoch was taken
 * for one after the stream's epoch ended: the rest of the epoch was made
 * privately instead of read from the stream.
 */
Test(feed, a_view_is_read_in_its_stream_epoch)
{
	struct ts_feed p, c;
	cr_assert_eq(ts_feed_open(&p, name, &params, NINDEX), 0);
	cr_assert_eq(ts_feed_open(&c, name, &params, NINDEX), 0);
	cr_assert_eq(ts_feed_attach(&c, 0), 0);
	int64_t idx[4] = { 8, 9, 10, 11 };
	cr_assert_eq(publish(&p, idx, 4, 3, 0, schema), 0);
	uint64_t want[2] = { 4 * 12, 4 * 8 }, got[2] = { 0, 0 }, id;
	void *ptr[2];
	int eoe;
	cr_assert_eq(ts_feed_read_view(&c, 2, want, ptr, got, &eoe, &id, SEC), 0);
	cr_expect_eq(got[0], want[0]);
	cr_expect_eq(c.read_epoch, 3u, "the view's stream epoch: %lu", (unsigned long)c.read_epoch);
	cr_expect(c.read_any, "something was read");
	ts_feed_release_view(&c, id);
	ts_feed_close(&c);
	ts_feed_close(&p);
}

/*
 * A slot file's name is predictable: a peer that hard-links another object
 * of ours under it (a session segment, the cache) must not get a batch
 * written into that object. The producer refuses a slot file with a second
 * name (found in review: it opened it with O_CREAT and wrote on).
 */
Test(feed, a_slot_file_linked_to_another_object_is_not_written)
{
	struct ts_feed f;
	cr_assert_eq(ts_feed_open(&f, name, &params, NINDEX), 0);
	char victim[TS_PATH_MAX + 64], slot[TS_PATH_MAX + 128];
	snprintf(victim, sizeof(victim), "%s/%s-victim", ts_shm_dir(), name);
	snprintf(slot, sizeof(slot), "%s/" TS_FEED_PREFIX "%u.%s.%llx.w%u.e%u.s0.g0", ts_shm_dir(), (unsigned)getuid(),
		 f.s.name, (unsigned long long)f.incarnation, (unsigned)f.s.self,
		 ts_producer_epoch(atomic_load(&f.s.seg->producer)));
	int fd = open(victim, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	cr_assert_geq(fd, 0);
	cr_assert_eq(write(fd, "VICTIM", 6), 6);
	close(fd);
	cr_assert_eq(link(victim, slot), 0, "%s", slot);
	int64_t idx[4] = { 0, 1, 2, 3 };
	int r = publish(&f, idx, 4, 1, 0, schema);
	cr_expect_neq(r, 0, "a batch published into a file with two names");
	char buf[16] = { 0 };
	fd = open(victim, O_RDONLY | O_CLOEXEC);
	cr_assert_geq(fd, 0);
	ssize_t n = read(fd, buf, sizeof(buf));
	close(fd);
	cr_expect(n == 6 && memcmp(buf, "VICTIM", 6) == 0, "the other object was written: %zd bytes", n);
	unlink(slot);
	unlink(victim);
	ts_feed_close(&f);
}
