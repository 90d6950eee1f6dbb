/* SPDX-License-Identifier: MIT */
/*
 * The shared decoded-image cache: keys, fill/commit/hit, abort, waiting,
 * eviction (FIFO + second chance), index pressure, dead and orphaned
 * fills, the seqlock check, corruption, lazy reservation, the robust lock,
 * users and removal. One process: other "processes" are threads, a second
 * handle on the same segment, or fake identities (ts_prim overrides).
 *
 * Real segments use session names "uc-<pid>-<n>"; the suite fini removes
 * their files whatever happens in the test and undoes every override.
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cache.h"
#include "prim.h"

#define KIB 1024ull
#define MIB (1024ull * 1024ull)
#define WAIT_LONG 5000000000ull /* 5 s: "forever" for a test, still bounded */

/* ---- overrides and bookkeeping --------------------------------------------------- */

static struct ts_prim_ops saved_prim;
static uint64_t (*saved_hash)(const struct ts_cache_key *);

/* Fake processes: pid FAKE_PID0 + i, alive while fake_start[i] != 0. */
#define FAKE_PID0  3900000u
#define FAKE_PROCS 8
static _Atomic uint64_t fake_start[FAKE_PROCS];

static int fake_proc_start_time(uint32_t pid, uint64_t *out)
{
	if (pid >= FAKE_PID0 && pid < FAKE_PID0 + FAKE_PROCS) {
		uint64_t v = atomic_load(&fake_start[pid - FAKE_PID0]);
		if (v == 0)
			return -ESRCH;
		*out = v;
		return 0;
	}
	return saved_prim.proc_start_time(pid, out);
}

static void use_fake_procs(void)
{
	for (unsigned i = 0; i < FAKE_PROCS; i++)
		atomic_store(&fake_start[i], 500000u + i);
	ts_prim.proc_start_time = fake_proc_start_time;
}

#define MAX_PATHS 16
static char made[MAX_PATHS][TS_PATH_MAX];
static int nmade;
static unsigned name_counter;
static char why[256];

static void suite_init(void)
{
	saved_prim = ts_prim;
	saved_hash = ts_cache_hash_fn;
	nmade = 0;
}

static void suite_fini(void)
{
	ts_prim = saved_prim;
	ts_cache_hash_fn = saved_hash;
	for (int i = 0; i < nmade; i++)
		unlink(made[i]);
	nmade = 0;
}

TestSuite(cache, .init = suite_init, .fini = suite_fini, .timeout = 60);

/* A unique session name; its cache file is removed by the fini. */
static void unique_name(char *name, size_t n, char *path)
{
	snprintf(name, n, "uc-%d-%u", (int)getpid(), name_counter++);
	cr_assert_eq(ts_cache_path(path, TS_PATH_MAX, getuid(), name), 0);
	cr_assert(nmade < MAX_PATHS, "test bug: too many paths");
	snprintf(made[nmade++], TS_PATH_MAX, "%s", path);
	unlink(path);
}

static void open_ok(struct ts_cache *c, const char *name, uint64_t budget)
{
	memset(why, 0, sizeof(why));
	int rc = ts_cache_open(c, name, budget, why, sizeof(why));
	cr_assert_eq(rc, 0, "ts_cache_open(%s): %d (%s)", name, rc, why);
}

/* A fresh cache of `budget` bytes. */
static void fresh(struct ts_cache *c, char *name, char *path, uint64_t budget)
{
	unique_name(name, TS_NAME_MAX, path);
	open_ok(c, name, budget);
}

static struct ts_cache_key key_of(uint64_t i)
{
	struct ts_cache_key k;
	memset(&k, 0, sizeof(k));
	k.dev = 0x801;
	k.ino = 1000 + i;
	k.size = 4096 + i;
	k.mtime_ns = 1700000000000000000ll + (int64_t)i;
	k.params[0] = 1;  /* scale 1/1 */
	k.params[1] = 2;  /* JCS_RGB */
	return k;
}

/* Deterministic bytes for (key i, version v): every hit can be checked. */
static void payload(uint64_t i, uint64_t v, void *buf, uint64_t len)
{
	uint64_t x = (i + 1) * 0x9e3779b97f4a7c15ull ^ (v + 7) * 0xbf58476d1ce4e5b9ull;
	unsigned char *p = buf;
	for (uint64_t o = 0; o < len; o++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		p[o] = (unsigned char)(x >> 24);
	}
}

static int same_as_payload(uint64_t i, uint64_t v, const void *buf, uint64_t len)
{
	unsigned char *want = malloc(len);
	cr_assert(want != NULL);
	payload(i, v, want, len);
	int same = memcmp(want, buf, len) == 0;
	free(want);
	return same;
}

static const char *result_name(int r)
{
	switch (r) {
	case TS_CACHE_HIT: return "HIT";
	case TS_CACHE_FILL: return "FILL";
	case TS_CACHE_BYPASS: return "BYPASS";
	default: return "error";
	}
}

/* get() must say FILL; write payload (i, v) and commit. */
static void fill_commit(struct ts_cache *c, const struct ts_cache_key *k, uint64_t i, uint64_t v, uint64_t len)
{
	struct ts_cache_fill f;
	void *dst = malloc(len);
	cr_assert(dst != NULL);
	int r = ts_cache_get(c, k, len, dst, 0, &f);
	cr_assert_eq(r, TS_CACHE_FILL, "key %llu: expected FILL, got %s (%d)", (unsigned long long)i, result_name(r), r);
	cr_assert(f.ptr != NULL && f.len == len);
	payload(i, v, f.ptr, len);
	cr_assert_eq(ts_cache_commit(c, &f, 1000 + i), 0);
	free(dst);
}

/* get() must say HIT with exactly payload (i, v). */
static void expect_hit(struct ts_cache *c, const struct ts_cache_key *k, uint64_t i, uint64_t v, uint64_t len)
{
	struct ts_cache_fill f;
	void *dst = malloc(len);
	cr_assert(dst != NULL);
	memset(dst, 0xa5, len);
	int r = ts_cache_get(c, k, len, dst, 0, &f);
	cr_assert_eq(r, TS_CACHE_HIT, "key %llu: expected HIT, got %s (%d)", (unsigned long long)i, result_name(r), r);
	cr_assert(same_as_payload(i, v, dst, len), "key %llu: HIT returned other bytes than committed",
		  (unsigned long long)i);
	free(dst);
}

static int present(struct ts_cache *c, const struct ts_cache_key *k)
{
	int r = ts_cache_peek(c, k);
	cr_assert(r == 0 || r == 1, "peek failed: %d", r);
	return r;
}

static struct ts_cache_stats stats(const struct ts_cache *c)
{
	struct ts_cache_stats s;
	ts_cache_stats(c, &s);
	return s;
}

/* Slot of k (FILLING or READY), by scanning the index. */
static uint32_t slot_of(const struct ts_cache *c, const struct ts_cache_key *k)
{
	for (uint32_t i = 0; i < c->nentries; i++) {
		uint32_t s = TS_CENT_STATE(atomic_load(&c->ents[i].word));
		if ((s == TS_CENT_FILLING || s == TS_CENT_READY) && memcmp(&c->ents[i].key, k, sizeof(*k)) == 0)
			return i;
	}
	return TS_CACHE_NONE;
}

static uint64_t mono_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/*
 * Allocator invariants, under the lock: the list holds exactly the range
 * holders, sorted by offset, without overlap, inside the reserved arena;
 * bytes_in_use is their sum; the cursor is the first one at or after head.
 */
static void check_invariants(struct ts_cache *c)
{
	struct ts_cache_header *h = c->hdr;
	cr_assert_eq(ts_shm_lock(&h->lock, 1000000000ull), 0);
	uint64_t holders = 0, linked = 0, used = 0, end = 0, hwm = atomic_load(&h->falloc_hwm);
	for (uint32_t i = 0; i < c->nentries; i++) {
		uint32_t s = TS_CENT_STATE(atomic_load(&c->ents[i].word));
		cr_assert(s <= TS_CENT_DROPPED, "slot %u: invalid state %u", i, s);
		holders += s >= TS_CENT_FILLING;
	}
	uint32_t prev = TS_CACHE_NONE, cursor = TS_CACHE_NONE;
	for (uint32_t i = h->first; i != TS_CACHE_NONE; i = c->ents[i].next) {
		cr_assert(i < c->nentries, "list link out of range: %u", i);
		cr_assert(linked++ < c->nentries, "list has a cycle");
		struct ts_cache_entry *e = &c->ents[i];
		uint32_t s = TS_CENT_STATE(atomic_load(&e->word));
		cr_assert(s >= TS_CENT_FILLING, "slot %u on the list in state %u", i, s);
		cr_assert_eq(e->prev, prev, "slot %u: prev %u, expected %u", i, e->prev, prev);
		cr_assert(e->off >= end, "slot %u at %llu overlaps the previous range ending at %llu", i,
			  (unsigned long long)e->off, (unsigned long long)end);
		cr_assert(e->len > 0 && e->off + e->len <= hwm && hwm <= c->arena_size);
		if (cursor == TS_CACHE_NONE && e->off >= h->head)
			cursor = i;
		end = e->off + e->len;
		used += e->len;
		prev = i;
	}
	cr_assert_eq(h->last, prev);
	cr_assert_eq(linked, holders, "%llu holders but %llu on the list", (unsigned long long)holders,
		     (unsigned long long)linked);
	cr_assert_eq(atomic_load(&h->bytes_in_use), used);
	cr_assert_eq(h->cursor, cursor, "cursor %u, expected %u", h->cursor, cursor);
	ts_shm_unlock(&h->lock);
}

/* ---- paths, open, users ------------------------------------------------------------ */

Test(cache, path_and_file_mode)
{
	char buf[TS_PATH_MAX];
	cr_assert_eq(ts_cache_path(buf, sizeof(buf), 1234, "exp-1"), 0);
	cr_expect_str_eq(buf, "/dev/shm/tsshim-cache.1234.exp-1");
	cr_expect_eq(ts_cache_path(buf, sizeof(buf), 1234, "a/b"), -EINVAL);
	cr_expect_eq(ts_cache_path(buf, 20, 1234, "exp-1"), -ENAMETOOLONG);

	struct ts_cache c;
	char name[TS_NAME_MAX], path[TS_PATH_MAX];
	fresh(&c, name, path, 4 * MIB);
	struct stat sb;
	cr_assert_eq(lstat(path, &sb), 0, "the segment must exist at %s", path);
	cr_expect(S_ISREG(sb.st_mode));
	cr_expect_eq(sb.st_mode & 07777, 0600, "mode must be 0600, is %o", sb.st_mode & 07777);
	cr_expect_eq(sb.st_uid, getuid());
	cr_expect_eq((uint64_t)sb.st_size, c.hdr->st.segment_size);
	cr_expect_eq(c.arena_size, 4 * MIB);
	cr_expect_eq(c.nentries, TS_CACHE_MIN_ENTRIES);
	ts_cache_close(&c);
	cr_expect_neq(lstat(path, &sb), 0, "the last user out must remove the segment");
}

Test(cache, open_rejects_bad_arguments)
{
	struct ts_cache c;
	cr_expect_eq(ts_cache_open(&c, "a/b", 4 * MIB, why, sizeof(why)), -EINVAL);
	cr_expect_eq(ts_cache_open(&c, ".x", 4 * MIB, why, sizeof(why)), -EINVAL);
	cr_expect_eq(ts_cache_open(&c, "ok", TS_CACHE_MIN_BUDGET - 1, why, sizeof(why)), -EINVAL);
	cr_expect(strstr(why, "budget") != NULL, "reason must mention the budget: %s", why);
	cr_expect_eq(ts_cache_open(&c, "ok", TS_CACHE_MAX_BUDGET + 1, why, sizeof(why)), -EINVAL);
	cr_expect_null(c.hdr);
	/* Calls on a closed handle are refused or ignored, never a crash. */
	struct ts_cache_key k = key_of(0);
	struct ts_cache_fill f;
	char buf[16];
	cr_expect_eq(ts_cache_get(&c, &k, 16, buf, 0, &f), -EINVAL);
	cr_expect_eq(ts_cache_commit(&c, &f, 0), -EINVAL);
	ts_cache_abort(&c, &f);
	ts_cache_close(&c);
}

Test(cache, creator_budget_wins_and_last_out_removes)
{
	struct ts_cache a, b;
	char name[TS_NAME_MAX], path[TS_PATH_MAX];
	fresh(&a, name, path, 8 * MIB);
	open_ok(&b, name, 64 * MIB);
	cr_expect_eq(b.arena_size, 8 * MIB, "the creator's budget must win");
	cr_expect_eq(stats(&b).users, 2u);
	struct ts_cache_key k = key_of(1);
	fill_commit(&a, &k, 1, 0, 100 * KIB);
	expect_hit(&b, &k, 1, 0, 100 * KIB); /* the same segment */
	ts_cache_close(&a);
	struct stat sb;
	cr_expect_eq(lstat(path, &sb), 0, "a user is left: the segment must stay");
	ts_cache_close(&b);
	cr_expect_neq(lstat(path, &sb), 0, "the last user out must remove the segment");
}

/*
 * A forked child holds a copy of its parent's fill handle (a decode in
 * progress when the program forked). Its abort (or commit) must not end the
 * parent's fill: the range would be given to another image while the parent
 * still writes its rows there, and a later hit of that image served them.
 */
Test(cache, a_forked_childs_copy_of_a_fill_ends_nothing)
{
	struct ts_cache c;
	char name[TS_NAME_MAX], path[TS_PATH_MAX];
	fresh(&c, name, path, 4 * MIB);
	struct ts_cache_key k = key_of(7);
	struct ts_cache_fill f;
	char *buf = malloc(64 * KIB);
	cr_assert_eq(ts_cache_get(&c, &k, 64 * KIB, buf, 0, &f), TS_CACHE_FILL);
	pid_t p = fork();
	cr_assert_geq(p, 0);
	if (p == 0) {
		struct ts_cache_fill copy = f;
		ts_cache_abort(&c, &f);
		_exit(ts_cache_commit(&c, &copy, 1) == -EINVAL ? 0 : 1);
	}
	int st = 0;
	cr_assert_eq(waitpid(p, &st, 0), p);
	cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the child's commit was refused");
	cr_expect_eq(stats(&c).aborts, 0u, "the child's abort ended nothing");
	payload(7, 1, f.ptr, 64 * KIB);
	cr_expect_eq(ts_cache_commit(&c, &f, 1), 0, "the parent's fill is still its own");
	expect_hit(&c, &k, 7, 1, 64 * KIB);
	free(buf);
	ts_cache_close(&c);
}

Test(cache, leave_keeps_the_mapping_usable)
{
	struct ts_cache c;
	char name[TS_NAME_MAX], path[TS_PATH_MAX];
	fresh(&c, name, path, 4 * MIB);
	struct ts_cache_key k = key_of(1), k2 = key_of(2);
	fill_commit(&c, &k, 1, 0, 64 * KIB);
	struct ts_cache_fill f;
	char *buf = malloc(64 * KIB);
	cr_assert_eq(ts_cache_get(&c, &k2, 64 * KIB, buf, 0, &f), TS_CACHE_FILL); /* a thread mid-fill */
	errno = 4242;
	ts_cache_leave(&c);
	cr_expect_eq(errno, 4242);
	struct stat sb;
	cr_expect_neq(lstat(path, &sb), 0, "the last user out must remove the segment");
	cr_expect_eq(stats(&c).users, 0u);
	/* The fill in flight completes, hits still work, nothing is unmapped. */
	payload(2, 0, f.ptr, 64 * KIB);
	cr_expect_eq(ts_cache_commit(&c, &f, 1), 0);
	expect_hit(&c, &k, 1, 0, 64 * KIB);
	expect_hit(&c, &k2, 2, 0, 64 * KIB);
	ts_cache_leave(&c); /* twice: harmless */
	ts_cache_close(&c);
	cr_expect_null(c.hdr);
	free(buf);
}

Test(cache, segment_of_dead_users_is_replaced)
{
	struct ts_cache a, b;
	char name[TS_NAME_MAX], path[TS_PATH_MAX];
	fresh(&a, name, path, 4 * MIB);
	struct ts_cache_key k = key_of(1);
	fill_commit(&a, &k, 1, 0, 10 * KIB);
	struct stat before, after;
	cr_assert_eq(lstat(path, &before), 0);
	/* Its only user "dies" without closing. */
	atomic_store(&a.hdr->users[a.user_slot].pid, 0x3ffffff0u);
	open_ok(&b, name, 4 * MIB);
	cr_assert_eq(lstat(path, &after), 0);
	cr_expect_neq(before.st_ino, after.st_ino, "a segment whose users all died must be replaced");
	cr_expect_eq(present(&b, &k), 0, "the replacement starts empty");
	ts_cache_close(&b);
	cr_expect_neq(lstat(path, &after), 0);
	/* Closing the old handle must not remove anything that is not its own. */
	open_ok(&b, name, 4 * MIB);
	ts_cache_close(&a);
	cr_expect_eq(lstat(path, &after), 0, "an old handle's close must leave the successor alone");
	ts_cache_close(&b);
}

/*
 * A DataLoader-like worker: a forked child opens the cache, adopts `job`,
 * then fills key i (want_fill) or expects it as a hit, and ends with _exit
 * as DataLoader workers do (it never leaves). Exit status 0: as expected.
 */
static int worker_generation(const char *name, const struct ts_ident *job, uint64_t i, bool want_fill)
{
	pid_t pid = fork();
	if (pid == 0) {
		struct ts_cache w;
		char err[200];
		if (ts_cache_open(&w, name, 4 * MIB, err, sizeof(err)) != 0)
			_exit(10);
		if (job && ts_cache_adopt(&w, job) != 0)
			_exit(11);
		struct ts_cache_key k = key_of(i);
		struct ts_cache_fill f;
		unsigned char *dst = malloc(64 * KIB);
		int r = ts_cache_get(&w, &k, 64 * KIB, dst, 0, &f);
		if (want_fill) {
			if (r != TS_CACHE_FILL)
				_exit(12);
			payload(i, 0, f.ptr, 64 * KIB);
			_exit(ts_cache_commit(&w, &f, 1) == 0 ? 0 : 13);
		}
		_exit(r == TS_CACHE_HIT && same_as_payload(i, 0, dst, 64 * KIB) ? 0 : 14);
	}
	cr_assert(pid > 0);
	int st;
	cr_assert_eq(waitpid(pid, &st, 0), pid);
	cr_assert(WIFEXITED(st));
	return WEXITSTATUS(st);
}

Test(cache, adopted_job_keeps_the_cache_between_worker_generations)
{
	char name[TS_NAME_MAX], path[TS_PATH_MAX];
	unique_name(name, sizeof(name), path);
	struct ts_ident job;
	cr_assert_eq(ts_self_ident(&job), 0);
	struct stat first, later;

	/* Epoch 1's worker decodes and dies; epoch 2's finds its decode. */
	cr_assert_eq(worker_generation(name, &job, 1, true), 0);
	cr_assert_eq(lstat(path, &first), 0, "the job lives: its cache must stay");
	cr_expect_eq(worker_generation(name, &job, 1, false), 0,
		     "the next generation of workers must hit what the last one decoded");
	cr_assert_eq(lstat(path, &later), 0);
	cr_expect_eq(first.st_ino, later.st_ino, "the same segment, not a replacement");

	/* Adopted once however many workers adopt it; a dead job is refused. */
	struct ts_cache c;
	open_ok(&c, name, 4 * MIB);
	cr_expect_eq(ts_cache_adopt(&c, &job), 0);
	cr_expect_eq(stats(&c).users, 2u, "the job once, this handle once (dead workers reaped)");
	struct ts_ident gone = { .pid = 0x3ffffff0u, .start_time = 1 };
	cr_expect_eq(ts_cache_adopt(&c, &gone), -ESRCH);
	cr_expect_eq(ts_cache_adopt(&c, NULL), -EINVAL);

	/* The job's exit path: closing what it opened itself (its decodes in the
	 * main process) also takes off the registration its workers adopted,
	 * so with nobody left the segment goes; depart has nothing to do. */
	errno = 4242;
	ts_cache_close(&c);
	cr_expect_eq(errno, 4242);
	cr_expect_neq(lstat(path, &later), 0, "the job's close was the last one out");
	cr_expect_eq(ts_cache_depart(path, NULL), 0);
}

Test(cache, job_departing_removes_what_its_workers_left)
{
	char name[TS_NAME_MAX], path[TS_PATH_MAX];
	unique_name(name, sizeof(name), path);
	struct ts_ident job;
	cr_assert_eq(ts_self_ident(&job), 0);
	cr_assert_eq(worker_generation(name, &job, 3, true), 0);
	struct stat sb;
	cr_assert_eq(lstat(path, &sb), 0);
	cr_expect_eq(ts_cache_remove_if_stale(path), 0, "the job is registered and alive: not stale");
	struct ts_cache_stats last;
	memset(&last, 0xff, sizeof(last));
	cr_expect_eq(ts_cache_depart(path, &last), 1, "the job was the only user left: removed");
	cr_expect_neq(lstat(path, &sb), 0);
	cr_expect_eq(last.fills, 1u, "the counters the segment ended with");
	cr_expect_eq(last.commits, 1u);
	cr_expect_eq(last.hits, 0u);
	cr_expect_eq(ts_cache_depart(path, NULL), 0, "nothing there: nothing to do");

	/* Without adoption, a generation of workers dies with the cache. */
	cr_assert_eq(worker_generation(name, NULL, 3, true), 0);
	cr_expect_eq(worker_generation(name, NULL, 3, true), 0, "no job registered: the next one starts afresh");
	cr_expect_eq(ts_cache_depart(path, NULL), 1);
}

/*
 * The body of a forked DataLoader-like worker: open cache `name`, adopt `job`,
 * say on ready whether both worked, then wait until the test closes release
 * (EOF), and leave with _exit as workers do. ready/release: pipes made
 * before the fork; the test keeps ready[0] and release[1].
 */
__attribute__((noreturn)) static void adopting_worker(const char *name, const struct ts_ident *job, int ready[2], int release[2])
{
	close(release[1]); /* EOF on release[0] once the test closes its end */
	close(ready[0]);
	struct ts_cache w;
	char err[200], b = 0;
	if (ts_cache_open(&w, name, 4 * MIB, err, sizeof(err)) == 0 && ts_cache_adopt(&w, job) == 0)
		b = 1;
	(void)!write(ready[1], &b, 1);
	(void)!read(release[0], &b, 1);
	_exit(0);
}

/* The test's side: 1 when the worker said it opened the cache and adopted its job. */
static int worker_adopted(int ready[2], int release[2])
{
	char ok = 0;
	close(ready[1]);
	close(release[0]);
	return read(ready[0], &ok, 1) == 1 && ok == 1;
}

/*
 * A job killed with its worker still running (a DataLoader worker notices
 * its parent's death only within seconds): the orphan must not keep the
 * last job out from removing the cache.
 */
Test(cache, orphaned_worker_does_not_keep_the_cache)
{
	char name[TS_NAME_MAX], path[TS_PATH_MAX];
	unique_name(name, sizeof(name), path);
	int ready[2], release[2];
	cr_assert_eq(pipe(ready), 0);
	cr_assert_eq(pipe(release), 0);
	pid_t job = fork();
	if (job == 0) {
		struct ts_ident me;
		if (ts_self_ident(&me) != 0)
			_exit(1);
		if (fork() == 0)
			adopting_worker(name, &me, ready, release);
		pause(); /* killed */
		_exit(0);
	}
	cr_assert(job > 0);
	cr_assert(worker_adopted(ready, release), "the worker opened the cache and adopted its job");

	struct ts_cache c;
	open_ok(&c, name, 4 * MIB);
	cr_expect_eq(stats(&c).users, 3u, "job, worker, this opener");
	ts_cache_close(&c);
	struct stat sb;
	cr_expect_eq(lstat(path, &sb), 0, "the job and its worker live: the cache stays");

	kill(job, SIGKILL);
	cr_assert_eq(waitpid(job, NULL, 0), job);
	open_ok(&c, name, 4 * MIB);
	ts_cache_close(&c);
	cr_expect_neq(lstat(path, &sb), 0, "the job is dead, its orphaned worker does not count: removed");

	close(release[1]); /* the worker ends (reaped by init) */
	close(ready[0]);
}

/*
 * A job that decodes in its main process too is listed as an opener; its
 * worker's adoption adds no slot, and the worker must still count as a user
 * (not be reaped as an orphan by the next process that opens the cache).
 */
Test(cache, worker_of_a_job_that_opened_the_cache_counts)
{
	struct ts_cache c, d;
	char name[TS_NAME_MAX], path[TS_PATH_MAX];
	fresh(&c, name, path, 4 * MIB);
	struct ts_ident me;
	cr_assert_eq(ts_self_ident(&me), 0);
	int ready[2], release[2];
	cr_assert_eq(pipe(ready), 0);
	cr_assert_eq(pipe(release), 0);
	pid_t worker = fork();
	if (worker == 0)
		adopting_worker(name, &me, ready, release);
	cr_assert(worker > 0);
	cr_assert(worker_adopted(ready, release));
	open_ok(&d, name, 4 * MIB); /* reaps whoever no longer counts */
	cr_expect_eq(stats(&d).users, 3u, "the job (an opener), its worker, this handle: none reaped");
	close(release[1]);
	cr_assert_eq(waitpid(worker, NULL, 0), worker);
	close(ready[0]);
	ts_cache_close(&d);
	ts_cache_close(&c);
}

/* ---- keys and hits -------------------------------------------------------------------- */

Test(cache, fill_commit_hit_identical_bytes)
{
	struct ts_cache c;
	char name[TS_NAME_MAX], path[TS_PATH_MAX];
	fresh(&c, name, path, 16 * MIB);
	uint64_t lens[] = { 1, 7, 4096, 150528, 3 * MIB + 5 };
	for (unsigned i = 0; i < 5; i++) {
		struct ts_cache_key k = key_of(i);
		cr_expect_eq(present(&c, &k), 0);
		fill_commit(&c, &k, i, 0, lens[i]);
		cr_expect_eq(present(&c, &k), 1);
	}
	for (unsigned i = 0; i < 5; i++) {
		struct ts_cache_key k = key_of(i);
		expect_hit(&c, &k, i, 0, lens[i]);
		expect_hit(&c, &k, i, 0, lens[i]);
	}
	struct ts_cache_stats s = stats(&c);
	cr_expect_eq(s.fills, 5u);
	cr_expect_eq(s.commits, 5u);
	cr_expect_eq(s.hits, 10u);
	cr_expect_eq(s.misses, 5u);
	cr_expect_eq(s.entries, 5u);
	cr_expect_eq(s.bypasses, 0u);
	cr_expect_eq(s.saved_decode_ns, 2 * (1000 + 1001 + 1002 + 1003 + 1004u));
	uint64_t total = 1 + 7 + 4096 + 150528 + 3 * MIB + 5;
	cr_expect_eq(s.bytes_in_use, total);
	/* Asking with another length for the same key is the caller's bug: bypass. */
	struct ts_cache_key k = key_of(2);
	char buf[4100];
	struct ts_cache_fill f;
	cr_expect_eq(ts_cache_get(&c, &k, 4097, buf, 0, &f), TS_CACHE_BYPASS);
	check_invariants(&c);
	ts_cache_close(&c);
}

static uint64_t constant_hash(const struct ts_cache_key *k)
{
	(void)k;
	return 42;
}

Test(cache, key_equality_needs_the_whole_blob)
{
	ts_cache_hash_fn = constant_hash; /* every key collides */
	struct ts_cache c;
	char name[TS_NAME_MAX], path[TS_PATH_MAX];
	fresh(&c, name, path, 4 * MIB);
	struct ts_cache_key k[6];
	for (unsigned i = 0; i < 6; i++)
		k[i] = key_of(1);
	k[1].params[31] ^= 1;   /* last byte of the parameters */
	k[2].dev ^= 1;          /* another device */
	k[3].mtime_ns += 1;     /* rewritten file */
	k[4].size += 1;
	k[5].params[0] = 2;     /* another scale */
	for (unsigned i = 0; i < 6; i++) {
		for (unsigned j = 0; j < i; j++)
			cr_expect_eq(present(&c, &k[j]) + 0, 1);
		cr_expect_eq(present(&c, &k[i]), 0, "key %u collides in hash only: it must miss", i);
		fill_commit(&c, &k[i], i, 0, 8 * KIB);
	}
	for (unsigned i = 0; i < 6; i++)
		expect_hit(&c, &k[i], i, 0, 8 * KIB);
	check_invariants(&c);
	ts_cache_close(&c);
}

Test(cache, too_large_and_bad_arguments)
{
	struct ts_cache c;
	char name[TS_NAME_MAX], path[TS_PATH_MAX];
	fresh(&c, name, path, 1 * MIB);
	struct ts_cache_key k = key_of(1);
	struct ts_cache_fill f;
	char *buf = malloc(2 * MIB);
	cr_assert(buf != NULL);
	cr_expect_eq(ts_cache_get(&c, &k, 1 * MIB + 1, buf, 0, &f), TS_CACHE_BYPASS, "larger than the arena");
	cr_expect_null(f.ptr);
	cr_expect_eq(ts_cache_commit(&c, &f, 1), -EINVAL, "committing a BYPASS must be refused");
	cr_expect_eq(ts_cache_get(&c, &k, 0, buf, 0, &f), -EINVAL);
	cr_expect_eq(ts_cache_get(&c, &k, 10, NULL, 0, &f), -EINVAL);
	cr_expect_eq(ts_cache_get(&c, NULL, 10, buf, 0, &f), -EINVAL);
	cr_expect_eq(ts_cache_get(&c, &k, 10, buf, 0, NULL), -EINVAL);
	/* Exactly the arena fits. */
	fill_commit(&c, &k, 1, 0, 1 * MIB);
	expect_hit(&c, &k, 1, 0, 1 * MIB);
	struct ts_cache_stats s = stats(&c);
	cr_expect_eq(s.bypasses, 1u);
	cr_expect_eq(s.bypass_other, 1u);
	free(buf);
	ts_cache_close(&c);
}

Test(cache, errno_is_preserved)
{
	struct ts_cache c;
	char name[TS_NAME_MAX], path[TS_PATH_MAX];
	unique_name(name, sizeof(name), path);
	errno = 4242;
	open_ok(&c, name, 2 * MIB);
	cr_expect_eq(errno, 4242, "open changed errno");
	struct ts_cache_key k = key_of(1);
	struct ts_cache_fill f;
	char buf[64];
	errno = 4242;
	cr_assert_eq(ts_cache_get(&c, &k, 64, buf, 0, &f), TS_CACHE_FILL);
	cr_expect_eq(errno, 4242, "get changed errno");
	memset(f.ptr, 1, 64);
	cr_assert_eq(ts_cache_commit(&c, &f, 1), 0);
	cr_expect_eq(errno, 4242, "commit changed errno");
	cr_assert_eq(ts_cache_get(&c, &k, 64, buf, 0, &f), TS_CACHE_HIT);
	cr_expect_eq(errno, 4242, "a hit changed errno");
	cr_assert_eq(ts_cache_get(&c, &k, 10 * MIB, buf, 0, &f), TS_CACHE_BYPASS);
	cr_expect_eq(errno, 4242, "a bypass changed errno");
	ts_cache_close(&c);
	cr_expect_eq(errno, 4242, "close changed errno");
}

/* ---- abort, waiting ----------------------------------------------------------------- */

struct getter {
	struct ts_cache *c;
	struct ts_cache_key key;
	uint64_t id, version, len, wait_ns, fill_delay_ms;
	pthread_barrier_t *barrier;
	int result;
	int bytes_ok;
	uint64_t elapsed_ms;
};

/* get(); on FILL write payload (after fill_delay_ms) and commit; on HIT verify. */
static void *getter_main(void *arg)
{
	struct getter *g = arg;
	unsigned char *dst = malloc(g->len);
	struct ts_cache_fill f;
	if (g->barrier)
		pthread_barrier_wait(g->barrier);
	uint64_t t0 = mono_ms();
	g->result = ts_cache_get(g->c, &g->key, g->len, dst, g->wait_ns, &f);
	g->elapsed_ms = mono_ms() - t0;
	if (g->result == TS_CACHE_FILL) {
		if (g->fill_delay_ms)
			ts_sleep_ns(g->fill_delay_ms * 1000000ull);
		payload(g->id, g->version, f.ptr, g->len);
		g->bytes_ok = ts_cache_commit(g->c, &f, 5000) == 0;
	} else if (g->result == TS_CACHE_HIT) {
		g->bytes_ok = same_as_payload(g->id, g->version, dst, g->len);
	}
	free(dst);
	return NULL;
}

Test(cache, abort_makes_waiters_bypass_and_key_refillable)
{
	struct ts_cache c;
	char name[TS_NAME_MAX], path[TS_PATH_MAX];
	fresh(&c, name, path, 4 * MIB);
	struct ts_cache_key k = key_of(3);
	struct ts_cache_fill f;
	char buf[4096];
	cr_assert_eq(ts_cache_get(&c, &k, sizeof(buf), buf, 0, &f), TS_CACHE_FILL);

	struct getter g = { .c = &c, .key = k, .id = 3, .len = sizeof(buf), .wait_ns = WAIT_LONG };
	pthread_t t;
	cr_assert_eq(pthread_create(&t, NULL, getter_main, &g), 0);
	ts_sleep_ns(100000000ull); /* the waiter is waiting */
	ts_cache_abort(&c, &f);
	pthread_join(t, NULL);
	cr_expect_eq(g.result, TS_CACHE_BYPASS, "a waiter of an aborted fill must bypass, got %s", result_name(g.result));
	cr_expect_lt(g.elapsed_ms, 2000u, "the waiter must be woken by the abort (took %llu ms)",
		     (unsigned long long)g.elapsed_ms);
	struct ts_cache_stats s = stats(&c);
	cr_expect_eq(s.aborts, 1u);
	cr_expect_eq(s.bypass_aborted, 1u);
	cr_expect_eq(s.waits, 1u);
	cr_expect_eq(present(&c, &k), 0);
	/* The key can be filled again. */
	fill_commit(&c, &k, 3, 1, sizeof(buf));
	expect_hit(&c, &k, 3, 1, sizeof(buf));
	check_invariants(&c);
	ts_cache_close(&c);
}

Test(cache, eight_threads_one_fill)
{
	struct ts_cache c;
	char name[TS_NAME_MAX], path[TS_PATH_MAX];
	fresh(&c, name, path, 8 * MIB);
	pthread_barrier_t barrier;
	pthread_barrier_init(&barrier, NULL, 8);
	struct getter g[8];
	pthread_t t[8];
	for (int i = 0; i < 8; i++) {
		g[i] = (struct getter){ .c = &c, .key = key_of(9), .id = 9, .len = 600 * KIB, .wait_ns = WAIT_LONG,
					.fill_delay_ms = 200, .barrier = &barrier };
		cr_assert_eq(pthread_create(&t[i], NULL, getter_main, &g[i]), 0);
	}
	int fills = 0, hits = 0;
	for (int i = 0; i < 8; i++) {
		pthread_join(t[i], NULL);
		fills += g[i].result == TS_CACHE_FILL;
		hits += g[i].result == TS_CACHE_HIT;
		cr_expect(g[i].bytes_ok, "thread %d (%s): wrong bytes or failed commit", i, result_name(g[i].result));
	}
	pthread_barrier_destroy(&barrier);
	cr_expect_eq(fills, 1, "exactly one thread must fill, %d did", fills);
	cr_expect_eq(hits, 7, "the other seven must wait and hit, %d did", hits);
	struct ts_cache_stats s = stats(&c);
	cr_expect_eq(s.waits, 7u);
	cr_expect_eq(s.bypasses, 0u);
	ts_cache_close(&c);
}

Test(cache, filler_that_never_commits_makes_waiters_bypass)
{
	struct ts_cache c;
	char name[TS_NAME_MAX], path[TS_PATH_MAX];
	fresh(&c, name, path, 4 * MIB);
	struct ts_cache_key k = key_of(4);
	struct ts_cache_fill f;
	char buf[1000];
	cr_assert_eq(ts_cache_get(&c, &k, sizeof(buf), buf, 0, &f), TS_CACHE_FILL);
	/* Never committed: the waiters give up after wait_ns each. */
	struct getter g[3];
	pthread_t t[3];
	for (int i = 0; i < 3; i++) {
		g[i] = (struct getter){ .c = &c, .key = k, .id = 4, .len = sizeof(buf), .wait_ns = 150000000ull };
		cr_assert_eq(pthread_create(&t[i], NULL, getter_main, &g[i]), 0);
	}
	for (int i = 0; i < 3; i++) {
		pthread_join(t[i], NULL);
		cr_expect_eq(g[i].result, TS_CACHE_BYPASS, "waiter %d: %s", i, result_name(g[i].result));
		cr_expect_geq(g[i].elapsed_ms, 149u, "waiter %d gave up early (%llu ms)", i,
			      (unsigned long long)g[i].elapsed_ms);
		cr_expect_lt(g[i].elapsed_ms, 1500u, "waiter %d waited far too long (%llu ms)", i,
			     (unsigned long long)g[i].elapsed_ms);
	}
	/* wait_ns 0: no wait at all. */
	uint64_t t0 = mono_ms();
	cr_expect_eq(ts_cache_get(&c, &k, sizeof(buf), buf, 0, &f), TS_CACHE_BYPASS);
	cr_expect_lt(mono_ms() - t0, 100u);
	struct ts_cache_stats s = stats(&c);
	cr_expect_eq(s.bypass_wait, 4u);
	cr_expect_eq(s.filling, 1u);
	ts_cache_close(&c);
}

/* ---- dead and orphaned fills ---------------------------------------------------------- */

Test(cache, dead_fillers_entry_is_reclaimed)
{
	use_fake_procs();
	struct ts_cache c;
	char name[TS_NAME_MAX], path[TS_PATH_MAX];
	fresh(&c, name, path, 4 * MIB);
	struct ts_cache_key k = key_of(5);
	struct ts_cache_fill f;
	char buf[2048];
	cr_assert_eq(ts_cache_get(&c, &k, sizeof(buf), buf, 0, &f), TS_CACHE_FILL);
	/* Make the filler a fake process, then let a waiter wait for it. */
	uint32_t slot = slot_of(&c, &k);
	cr_assert_neq(slot, TS_CACHE_NONE);
	cr_assert_eq(ts_shm_lock(&c.hdr->lock, 1000000000ull), 0);
	c.ents[slot].filler_pid = FAKE_PID0 + 1;
	c.ents[slot].filler_start = atomic_load(&fake_start[1]);
	ts_shm_unlock(&c.hdr->lock);
	struct getter g = { .c = &c, .key = k, .id = 5, .len = sizeof(buf), .wait_ns = WAIT_LONG };
	pthread_t t;
	cr_assert_eq(pthread_create(&t, NULL, getter_main, &g), 0);
	ts_sleep_ns(100000000ull);
	atomic_store(&fake_start[1], 0); /* the filler dies mid-fill */
	pthread_join(t, NULL);
	cr_expect_eq(g.result, TS_CACHE_FILL, "the waiter must reclaim the dead fill and fill it, got %s",
		     result_name(g.result));
	cr_expect_lt(g.elapsed_ms, 1500u, "the death must be noticed quickly (%llu ms)",
		     (unsigned long long)g.elapsed_ms);
	cr_expect(g.bytes_ok);
	cr_expect_eq(stats(&c).reclaims, 1u);
	/* The dead filler's handle cannot publish anything any more. */
	cr_expect_eq(ts_cache_commit(&c, &f, 1), -ESTALE);
	expect_hit(&c, &k, 5, 0, sizeof(buf));

	/* A dead fill found by a plain get (no waiter) is reclaimed too. */
	struct ts_cache_key k2 = key_of(6);
	cr_assert_eq(ts_cache_get(&c, &k2, sizeof(buf), buf, 0, &f), TS_CACHE_FILL);
	slot = slot_of(&c, &k2);
	c.ents[slot].filler_pid = 0x3ffffff0u; /* no such process */
	fill_commit(&c, &k2, 6, 0, sizeof(buf));
	expect_hit(&c, &k2, 6, 0, sizeof(buf));
	cr_expect_eq(stats(&c).reclaims, 2u);
	check_invariants(&c);
	ts_cache_close(&c);
}

Test(cache, stale_live_fill_is_orphaned)
{
	struct ts_cache c;
	char name[TS_NAME_MAX], path[TS_PATH_MAX];
	fresh(&c, name, path, 4 * MIB);
	c.stale_fill_ns = 30000000ull; /* 30 ms */
	struct ts_cache_key k = key_of(7);
	struct ts_cache_fill old, f;
	char buf[8192];
	cr_assert_eq(ts_cache_get(&c, &k, sizeof(buf), buf, 0, &old), TS_CACHE_FILL);
	payload(7, 0, old.ptr, sizeof(buf) / 2); /* half-written */
	ts_sleep_ns(60000000ull);
	cr_assert_eq(ts_cache_get(&c, &k, sizeof(buf), buf, 0, &f), TS_CACHE_FILL,
		     "a fill older than the bound must be orphaned and the key filled again");
	cr_expect_neq(f.ptr, old.ptr, "the orphan's range must stay its own while it lives");
	cr_expect_eq(stats(&c).orphans, 1u);
	payload(7, 1, f.ptr, sizeof(buf));
	cr_assert_eq(ts_cache_commit(&c, &f, 1), 0);
	/* The slow filler finishes late: refused, and its bytes never served. */
	payload(7, 0, old.ptr, sizeof(buf));
	cr_expect_eq(ts_cache_commit(&c, &old, 1), -ESTALE);
	expect_hit(&c, &k, 7, 1, sizeof(buf));
	check_invariants(&c);
	ts_cache_close(&c);
}

/* ---- eviction ---------------------------------------------------------------------------- */

Test(cache, eviction_fifo_with_second_chance)
{
	struct ts_cache c;
	char name[TS_NAME_MAX], path[TS_PATH_MAX];
	fresh(&c, name, path, 1 * MIB);
	c.admit_ratio = 0; /* eviction itself, whatever the hit rate */
	const uint64_t L = 128 * KIB; /* 8 fit */
	struct ts_cache_key k[45];
	for (unsigned i = 0; i < 45; i++)
		k[i] = key_of(100 + i);
	for (unsigned i = 0; i < 8; i++)
		fill_commit(&c, &k[i], i, 0, L);
	for (unsigned i = 0; i < 8; i++)
		cr_expect_eq(present(&c, &k[i]), 1, "key %u must fit", i);
	cr_expect_eq(stats(&c).evictions, 0u);

	/* Full: the next fill evicts the oldest (FIFO). */
	fill_commit(&c, &k[8], 8, 0, L);
	cr_expect_eq(present(&c, &k[0]), 0, "the oldest entry must be evicted first");
	for (unsigned i = 1; i <= 8; i++)
		cr_expect_eq(present(&c, &k[i]), 1, "key %u must survive", i);

	/* Second chance: k1 is hit, so the hand skips it and takes k2. */
	expect_hit(&c, &k[1], 1, 0, L);
	fill_commit(&c, &k[9], 9, 0, L);
	cr_expect_eq(present(&c, &k[1]), 1, "a hit entry must get a second chance");
	cr_expect_eq(present(&c, &k[2]), 0, "the next cold entry must go instead");

	/* k1 hit between every fill survives sweep after sweep; the cold ones go. */
	for (unsigned i = 10; i < 34; i++) {
		expect_hit(&c, &k[1], 1, 0, L);
		fill_commit(&c, &k[i], i, 0, L);
		check_invariants(&c);
	}
	cr_expect_eq(present(&c, &k[1]), 1, "a repeatedly hit entry must survive every sweep");
	for (unsigned i = 2; i < 27; i++)
		cr_expect_eq(present(&c, &k[i]), 0, "cold key %u must have been evicted", i);
	for (unsigned i = 27; i < 34; i++)
		cr_expect_eq(present(&c, &k[i]), 1, "recent key %u must be there", i);
	/*
	 * Once it is no longer hit, it goes like any other: its last hit buys it
	 * one more pass of the hand (8 slots, the hand is 5 slots past it), and
	 * then it is evicted in its turn.
	 */
	for (unsigned i = 34; i < 44; i++) {
		fill_commit(&c, &k[i], i, 0, L);
		cr_expect_eq(present(&c, &k[1]), 1, "key 1 must still have its last chance after key %u", i);
	}
	fill_commit(&c, &k[44], 44, 0, L);
	cr_expect_eq(present(&c, &k[1]), 0, "an entry no longer hit must be evicted in its turn");
	for (unsigned i = 37; i < 45; i++)
		expect_hit(&c, &k[i], i, 0, L);
	struct ts_cache_stats s = stats(&c);
	cr_expect_eq(s.entries, 8u);
	cr_expect_eq(s.evictions, 45u - 8u, "every fill past the first 8 evicts exactly one entry");
	check_invariants(&c);
	ts_cache_close(&c);
}

Test(cache, misses_are_admitted_while_the_cache_earns_its_fills)
{
	struct ts_cache c;
	char name[TS_NAME_MAX], path[TS_PATH_MAX];
	fresh(&c, name, path, 1 * MIB);
	cr_expect_eq(c.admit_ratio, TS_CACHE_ADMIT_RATIO);
	/* A scan larger than the budget: filled until the first eviction ... */
	uint64_t i = 0, filled = 0, cold = 0;
	for (; i < 12; i++) {
		struct ts_cache_key k = key_of(i);
		struct ts_cache_fill f;
		char *dst = malloc(200 * KIB);
		int r = ts_cache_get(&c, &k, 200 * KIB, dst, 0, &f);
		if (r == TS_CACHE_FILL) {
			payload(i, 0, f.ptr, 200 * KIB);
			cr_assert_eq(ts_cache_commit(&c, &f, 1), 0);
			filled++;
		} else {
			cr_assert_eq(r, TS_CACHE_BYPASS);
			cold++;
		}
		free(dst);
	}
	struct ts_cache_stats s = stats(&c);
	cr_expect_gt(s.evictions, 0u);
	/* ... then, never hit, no more fills: each would cost a copy for nothing. */
	cr_expect_eq(filled, 6u, "5 fit in 1 MiB, the 6th evicted the first (%llu filled)", (unsigned long long)filled);
	cr_expect_eq(cold, 6u);
	cr_expect_eq(s.bypass_cold, 6u);
	cr_expect_eq(s.bypasses, 6u);
	/* What is cached is still served, and once hits keep up, misses are
	 * filled again. */
	for (uint64_t h = 2; h < 6; h++) {
		struct ts_cache_key k = key_of(h);
		expect_hit(&c, &k, h, 0, 200 * KIB);
	}
	cr_expect_eq(stats(&c).hits, 4u);
	struct ts_cache_key k = key_of(100);
	fill_commit(&c, &k, 100, 0, 200 * KIB);
	/* A sample of misses is filled whatever the hit rate (4 hits, 7 fills:
	 * short of one hit per fill). */
	c.admit_ratio = 1;
	unsigned sampled = 0;
	for (uint64_t m = 0; m < 2 * TS_CACHE_SAMPLE_MISSES; m++) {
		struct ts_cache_key km = key_of(200 + m);
		struct ts_cache_fill f;
		char dst[64];
		int r = ts_cache_get(&c, &km, sizeof(dst), dst, 0, &f);
		if (r == TS_CACHE_FILL) {
			sampled++;
			ts_cache_abort(&c, &f);
		}
	}
	cr_expect_eq(sampled, 2u, "one miss in %u is filled (%u)", TS_CACHE_SAMPLE_MISSES, sampled);
	ts_cache_close(&c);
}

Test(cache, live_fill_is_never_evicted)
{
	struct ts_cache c;
	char name[TS_NAME_MAX], path[TS_PATH_MAX];
	fresh(&c, name, path, 1 * MIB);
	c.admit_ratio = 0; /* eviction itself, whatever the hit rate */
	const uint64_t L = 256 * KIB;
	struct ts_cache_key k[8];
	for (unsigned i = 0; i < 8; i++)
		k[i] = key_of(200 + i);
	struct ts_cache_fill pinned, f;
	char *buf = malloc(1 * MIB);
	cr_assert(buf != NULL);
	cr_assert_eq(ts_cache_get(&c, &k[0], L, buf, 0, &pinned), TS_CACHE_FILL);
	payload(0, 0, pinned.ptr, L);
	for (unsigned i = 1; i < 8; i++)
		fill_commit(&c, &k[i], i, 0, L); /* laps around the pinned one */
	cr_expect_eq(present(&c, &k[0]), 0, "still filling: not a hit");
	/* The pinned fill blocks any range over it: a full-arena request bypasses. */
	struct ts_cache_key big = key_of(299);
	cr_expect_eq(ts_cache_get(&c, &big, 1 * MIB, buf, 0, &f), TS_CACHE_BYPASS);
	cr_expect_eq(stats(&c).bypass_nospace, 1u);
	cr_assert_eq(ts_cache_commit(&c, &pinned, 1), 0);
	expect_hit(&c, &k[0], 0, 0, L);
	check_invariants(&c);
	free(buf);
	ts_cache_close(&c);
}

Test(cache, index_window_full)
{
	ts_cache_hash_fn = constant_hash; /* one window for every key */
	struct ts_cache c;
	char name[TS_NAME_MAX], path[TS_PATH_MAX];
	fresh(&c, name, path, 4 * MIB);
	struct ts_cache_key k[TS_CACHE_PROBE + 2];
	for (unsigned i = 0; i < TS_CACHE_PROBE + 2; i++)
		k[i] = key_of(300 + i);
	for (unsigned i = 0; i < TS_CACHE_PROBE; i++)
		fill_commit(&c, &k[i], i, 0, 1024);
	expect_hit(&c, &k[0], 0, 0, 1024); /* k0 recently used, k1 least */
	fill_commit(&c, &k[TS_CACHE_PROBE], TS_CACHE_PROBE, 0, 1024);
	cr_expect_eq(present(&c, &k[1]), 0, "the least recently used entry of the window must make room");
	cr_expect_eq(present(&c, &k[0]), 1);
	expect_hit(&c, &k[TS_CACHE_PROBE], TS_CACHE_PROBE, 0, 1024);
	check_invariants(&c);
	ts_cache_close(&c);

	/* A window full of live fills: bypass. */
	fresh(&c, name, path, 4 * MIB);
	struct ts_cache_fill f[TS_CACHE_PROBE], g;
	char buf[1024];
	for (unsigned i = 0; i < TS_CACHE_PROBE; i++)
		cr_assert_eq(ts_cache_get(&c, &k[i], 1024, buf, 0, &f[i]), TS_CACHE_FILL);
	cr_expect_eq(ts_cache_get(&c, &k[TS_CACHE_PROBE], 1024, buf, 0, &g), TS_CACHE_BYPASS);
	cr_expect_eq(stats(&c).bypass_nospace, 1u);
	for (unsigned i = 0; i < TS_CACHE_PROBE; i++)
		ts_cache_abort(&c, &f[i]);
	fill_commit(&c, &k[TS_CACHE_PROBE], TS_CACHE_PROBE, 0, 1024);
	check_invariants(&c);
	ts_cache_close(&c);
}

/* ---- the seqlock check ------------------------------------------------------------------ */

struct overwrite {
	int done;
	struct ts_cache_key key;
};

/* Between a hit's copy and its check: a full-arena fill evicts everything. */
static void overwrite_all(struct ts_cache *c, void *arg)
{
	struct overwrite *o = arg;
	if (o->done++)
		return;
	c->after_copy = NULL;
	struct ts_cache_fill f;
	char *buf = malloc(1 * MIB);
	cr_assert(buf != NULL);
	cr_assert_eq(ts_cache_get(c, &o->key, 1 * MIB, buf, 0, &f), TS_CACHE_FILL);
	memset(f.ptr, 0xee, 1 * MIB);
	cr_assert_eq(ts_cache_commit(c, &f, 1), 0);
	free(buf);
}

Test(cache, copy_overwritten_during_hit_is_rejected)
{
	struct ts_cache c;
	char name[TS_NAME_MAX], path[TS_PATH_MAX];
	fresh(&c, name, path, 1 * MIB);
	c.admit_ratio = 0; /* a miss is filled, whatever the hit rate */
	struct ts_cache_key a = key_of(1), b = key_of(2);
	fill_commit(&c, &a, 1, 0, 512 * KIB);
	fill_commit(&c, &b, 2, 0, 512 * KIB);
	struct overwrite o = { .key = key_of(3) };
	c.after_copy = overwrite_all;
	c.after_copy_arg = &o;
	struct ts_cache_fill f;
	char *buf = malloc(512 * KIB);
	cr_assert(buf != NULL);
	int r = ts_cache_get(&c, &a, 512 * KIB, buf, 0, &f);
	cr_expect_eq(o.done, 1);
	cr_expect_neq(r, TS_CACHE_HIT, "a copy of an entry evicted during the copy must not be a hit");
	cr_expect_eq(stats(&c).torn, 1u);
	cr_expect_eq(r, TS_CACHE_FILL, "it is a miss now, got %s", result_name(r));
	if (r == TS_CACHE_FILL)
		ts_cache_abort(&c, &f);
	free(buf);
	ts_cache_close(&c);
}

/* ---- concurrency stress ------------------------------------------------------------------ */

struct stress {
	struct ts_cache *c;
	unsigned seed;
	_Atomic unsigned *bad;
	unsigned hits, fills;
};

static uint64_t stress_len(unsigned key)
{
	return 8 * KIB + (key * 7919u) % (100 * KIB);
}

static void *stress_main(void *arg)
{
	struct stress *s = arg;
	unsigned char *dst = malloc(128 * KIB);
	unsigned x = s->seed;
	for (int op = 0; op < 3000; op++) {
		x = x * 1103515245u + 12345u;
		unsigned key = (x >> 16) % 48;
		struct ts_cache_key k = key_of(key);
		uint64_t len = stress_len(key);
		struct ts_cache_fill f;
		int r = ts_cache_get(s->c, &k, len, dst, 1000000000ull, &f);
		if (r == TS_CACHE_FILL) {
			s->fills++;
			payload(key, 0, f.ptr, len / 2);
			if ((x >> 8) % 4 == 0)
				sched_yield();
			payload(key, 0, f.ptr, len);
			if ((x >> 10) % 20 == 0)
				ts_cache_abort(s->c, &f);
			else if (ts_cache_commit(s->c, &f, 1) != 0)
				atomic_fetch_add(s->bad, 1);
		} else if (r == TS_CACHE_HIT) {
			s->hits++;
			if (!same_as_payload(key, 0, dst, len))
				atomic_fetch_add(s->bad, 1);
		} else if (r != TS_CACHE_BYPASS) {
			atomic_fetch_add(s->bad, 1);
		}
	}
	free(dst);
	return NULL;
}

Test(cache, threads_stress_never_see_wrong_bytes)
{
	struct ts_cache c;
	char name[TS_NAME_MAX], path[TS_PATH_MAX];
	fresh(&c, name, path, 1 * MIB); /* far smaller than the working set: constant eviction */
	_Atomic unsigned bad = 0;
	struct stress s[4];
	pthread_t t[4];
	for (int i = 0; i < 4; i++) {
		s[i] = (struct stress){ .c = &c, .seed = 77u + (unsigned)i, .bad = &bad };
		cr_assert_eq(pthread_create(&t[i], NULL, stress_main, &s[i]), 0);
	}
	unsigned hits = 0, fills = 0;
	for (int i = 0; i < 4; i++) {
		pthread_join(t[i], NULL);
		hits += s[i].hits;
		fills += s[i].fills;
	}
	cr_expect_eq(atomic_load(&bad), 0u, "%u wrong results", atomic_load(&bad));
	cr_expect_gt(hits, 100u, "too few hits (%u) for the test to mean anything", hits);
	struct ts_cache_stats st = stats(&c);
	cr_expect_gt(st.evictions, 100u);
	cr_expect_eq(st.fills, fills);
	cr_expect_eq(st.filling, 0u);
	check_invariants(&c);
	ts_cache_close(&c);
}

/* ---- corruption ----------------------------------------------------------------------------- */

static void fix_checksum(struct ts_cache *c)
{
	c->hdr->st.checksum = ts_cache_static_checksum(&c->hdr->st);
}

static void expect_refused(const char *name, const char *path, int err, const char *reason, const char *what)
{
	struct ts_cache b;
	memset(why, 0, sizeof(why));
	int rc = ts_cache_open(&b, name, 4 * MIB, why, sizeof(why));
	cr_expect_eq(rc, err, "%s: open must fail with %d, got %d (%s)", what, err, rc, why);
	cr_expect(why[0] != '\0', "%s: no reason given", what);
	if (reason)
		cr_expect(strstr(why, reason) != NULL, "%s: reason '%s' does not mention '%s'", what, why, reason);
	if (rc == 0)
		ts_cache_close(&b);
	struct ts_cache_stats s;
	rc = ts_cache_view(path, &s, why, sizeof(why));
	cr_expect_eq(rc, err, "%s: view must fail with %d, got %d (%s)", what, err, rc, why);
}

Test(cache, corrupted_header_is_refused)
{
	struct ts_cache a;
	char name[TS_NAME_MAX], path[TS_PATH_MAX];
	fresh(&a, name, path, 4 * MIB);
	struct ts_cache_static *st = &a.hdr->st, saved = *st;

	st->magic ^= 1;
	expect_refused(name, path, -EBADMSG, "magic", "bad magic");
	*st = saved;
	st->layout_version++;
	fix_checksum(&a);
	expect_refused(name, path, -EPROTO, "another tsshim build", "other version");
	*st = saved;
	st->entry_size += 8;
	fix_checksum(&a);
	expect_refused(name, path, -EPROTO, NULL, "other entry size");
	*st = saved;
	st->checksum ^= 0x100;
	expect_refused(name, path, -EBADMSG, "checksum", "bad checksum");
	*st = saved;
	st->uid ^= 0x5555;
	fix_checksum(&a);
	expect_refused(name, path, -EACCES, "uid", "other uid");
	*st = saved;
	st->nentries = 3000;
	fix_checksum(&a);
	expect_refused(name, path, -EBADMSG, "index", "index size not a power of two");
	*st = saved;
	st->arena_size *= 2;
	st->segment_size = st->arena_off + st->arena_size;
	fix_checksum(&a);
	expect_refused(name, path, -EBADMSG, "truncated", "arena larger than the file");
	*st = saved;
	st->arena_off = st->index_off;
	st->segment_size = st->arena_off + st->arena_size;
	fix_checksum(&a);
	expect_refused(name, path, -EBADMSG, "geometry", "arena overlapping the index");
	*st = saved;
	st->session[5] = '/';
	fix_checksum(&a);
	expect_refused(name, path, -EBADMSG, "session", "bad name");
	*st = saved;
	atomic_store(&a.hdr->state, 77);
	expect_refused(name, path, -EBADMSG, "state", "bad state");
	atomic_store(&a.hdr->state, TS_CACHE_SEG_OPEN);

	/* Restored: usable again. */
	struct ts_cache b;
	open_ok(&b, name, 4 * MIB);
	ts_cache_close(&b);
	ts_cache_close(&a);
}

Test(cache, unsafe_files_are_refused)
{
	char name[TS_NAME_MAX], path[TS_PATH_MAX];
	unique_name(name, sizeof(name), path);
	struct ts_cache c;
	/* Too short to hold a header. */
	int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
	cr_assert(fd >= 0);
	cr_assert_eq(write(fd, "tsshim", 6), 6);
	fchmod(fd, 0600);
	close(fd);
	expect_refused(name, path, -EBADMSG, "truncated", "tiny file");
	/* Readable by others. */
	chmod(path, 0644);
	expect_refused(name, path, -EACCES, "0600", "mode 0644");
	unlink(path);
	/* A symlink is never followed. */
	cr_assert_eq(symlink("/etc/passwd", path), 0);
	cr_expect_eq(ts_cache_open(&c, name, 4 * MIB, why, sizeof(why)), -ELOOP);
	unlink(path);
	/* A FIFO neither hangs nor passes. */
	cr_assert_eq(mkfifo(path, 0600), 0);
	expect_refused(name, path, -EINVAL, NULL, "fifo");
	unlink(path);
}

Test(cache, corrupted_entry_is_a_miss)
{
	struct ts_cache c;
	char name[TS_NAME_MAX], path[TS_PATH_MAX];
	fresh(&c, name, path, 4 * MIB);
	c.admit_ratio = 0; /* eviction itself, whatever the hit rate */
	struct ts_cache_key k[4];
	for (unsigned i = 0; i < 4; i++) {
		k[i] = key_of(400 + i);
		fill_commit(&c, &k[i], i, 0, 64 * KIB);
	}
	char *buf = malloc(64 * KIB);
	struct ts_cache_fill f;
	/* Offset beyond the arena. */
	uint32_t s0 = slot_of(&c, &k[0]);
	c.ents[s0].off = c.arena_size + 4096;
	int r = ts_cache_get(&c, &k[0], 64 * KIB, buf, 0, &f);
	cr_expect_eq(r, TS_CACHE_FILL, "an entry with an offset out of range must be a miss, got %s", result_name(r));
	if (r == TS_CACHE_FILL)
		ts_cache_abort(&c, &f);
	/* Length wrapping around. */
	uint32_t s1 = slot_of(&c, &k[1]);
	c.ents[s1].len = UINT64_MAX - 10;
	r = ts_cache_get(&c, &k[1], 64 * KIB, buf, 0, &f);
	cr_expect_neq(r, TS_CACHE_HIT, "an entry with a huge length must not hit");
	if (r == TS_CACHE_FILL)
		ts_cache_abort(&c, &f);
	/* Beyond the reserved part of the arena (would SIGBUS if read). */
	uint32_t s2 = slot_of(&c, &k[2]);
	c.ents[s2].off = atomic_load(&c.hdr->falloc_hwm) - 100;
	cr_expect_neq(ts_cache_get(&c, &k[2], 64 * KIB, buf, 0, &f), TS_CACHE_HIT);
	cr_expect_gt(stats(&c).repairs, 0u);
	/* An unknown state word. */
	uint32_t s3 = slot_of(&c, &k[3]);
	atomic_store(&c.ents[s3].word, TS_CENT_WORD(9, 77));
	r = ts_cache_get(&c, &k[3], 64 * KIB, buf, 0, &f);
	cr_expect_eq(r, TS_CACHE_FILL, "got %s", result_name(r));
	if (r == TS_CACHE_FILL)
		ts_cache_abort(&c, &f);
	check_invariants(&c);
	free(buf);
	ts_cache_close(&c);
}

Test(cache, entry_beyond_the_reserved_arena_is_a_miss)
{
	struct ts_cache c;
	char name[TS_NAME_MAX], path[TS_PATH_MAX];
	fresh(&c, name, path, 64 * MIB); /* only the first 32 MiB chunk gets reserved */
	c.admit_ratio = 0; /* a miss is filled, whatever the hit rate */
	struct ts_cache_key k = key_of(1);
	fill_commit(&c, &k, 1, 0, 64 * KIB);
	cr_assert_eq(stats(&c).reserved_bytes, TS_CACHE_CHUNK);
	/* Inside the arena, but in pages never reserved: reading them would give
	 * zeros (or SIGBUS once /dev/shm is full), never the committed bytes. */
	c.ents[slot_of(&c, &k)].off = TS_CACHE_CHUNK + 4096;
	char *buf = malloc(64 * KIB);
	struct ts_cache_fill f;
	int r = ts_cache_get(&c, &k, 64 * KIB, buf, 0, &f);
	cr_expect_eq(r, TS_CACHE_FILL, "an entry beyond the reserved arena must be a miss, got %s", result_name(r));
	if (r == TS_CACHE_FILL)
		ts_cache_abort(&c, &f);
	check_invariants(&c);
	free(buf);
	ts_cache_close(&c);
}

Test(cache, corrupted_allocator_state_is_repaired)
{
	struct ts_cache c;
	char name[TS_NAME_MAX], path[TS_PATH_MAX];
	fresh(&c, name, path, 1 * MIB);
	struct ts_cache_key k[6];
	for (unsigned i = 0; i < 6; i++) {
		k[i] = key_of(500 + i);
		fill_commit(&c, &k[i], i, 0, 100 * KIB);
	}
	/* Garbage links and head: the next allocation must repair, not crash. */
	c.hdr->first = 0xdeadbeef;
	c.hdr->cursor = 17;
	c.ents[slot_of(&c, &k[2])].next = slot_of(&c, &k[0]); /* a cycle */
	c.hdr->head = c.arena_size * 3;
	struct ts_cache_key n = key_of(600);
	fill_commit(&c, &n, 600, 0, 100 * KIB);
	cr_expect_gt(stats(&c).repairs, 0u);
	check_invariants(&c);
	for (unsigned i = 0; i < 6; i++)
		if (present(&c, &k[i]))
			expect_hit(&c, &k[i], i, 0, 100 * KIB);
	expect_hit(&c, &n, 600, 0, 100 * KIB);
	ts_cache_close(&c);
}

/* ---- lazy reservation ---------------------------------------------------------------------- */

static uint64_t file_bytes(const char *path)
{
	struct stat sb;
	cr_assert_eq(stat(path, &sb), 0);
	return (uint64_t)sb.st_blocks * 512u;
}

Test(cache, arena_is_reserved_lazily)
{
	struct ts_cache c;
	char name[TS_NAME_MAX], path[TS_PATH_MAX];
	fresh(&c, name, path, 256 * MIB);
	uint64_t index = c.hdr->st.arena_off;
	uint64_t at_open = file_bytes(path);
	cr_expect_geq(at_open, index, "header and index must be reserved up front (%llu < %llu)",
		      (unsigned long long)at_open, (unsigned long long)index);
	cr_expect_lt(at_open, index + 1 * MIB, "the arena must not be reserved at creation (%llu bytes)",
		     (unsigned long long)at_open);
	cr_expect_eq(stats(&c).reserved_bytes, 0u);
	struct ts_cache_key k = key_of(1);
	fill_commit(&c, &k, 1, 0, 1 * MIB);
	uint64_t after = file_bytes(path);
	cr_expect_geq(after, index + TS_CACHE_CHUNK, "the first chunk must be reserved (%llu)", (unsigned long long)after);
	cr_expect_lt(after, index + 2 * TS_CACHE_CHUNK, "only the first chunk (%llu)", (unsigned long long)after);
	cr_expect_eq(stats(&c).reserved_bytes, TS_CACHE_CHUNK);
	/* Crossing into the second chunk reserves exactly one more. */
	struct ts_cache_key k2 = key_of(2);
	fill_commit(&c, &k2, 2, 0, 40 * MIB);
	cr_expect_eq(stats(&c).reserved_bytes, 2 * TS_CACHE_CHUNK);
	cr_expect_geq(file_bytes(path), index + 2 * TS_CACHE_CHUNK);
	/* A fill within half a chunk of the end reserves the next chunk ahead
	 * of need and publishes it (the next reserve() has nothing to do). */
	struct ts_cache_key k3 = key_of(3), k4 = key_of(4);
	fill_commit(&c, &k3, 3, 0, 10 * MIB); /* head 51 MiB: within 16 MiB of 64 */
	cr_expect_eq(stats(&c).reserved_bytes, 3 * TS_CACHE_CHUNK, "the chunk ahead must be published");
	cr_expect_geq(file_bytes(path), index + 3 * TS_CACHE_CHUNK);
	fill_commit(&c, &k4, 4, 0, 20 * MIB); /* head 71 MiB: inside the chunk reserved ahead */
	cr_expect_eq(stats(&c).reserved_bytes, 3 * TS_CACHE_CHUNK);
	expect_hit(&c, &k4, 4, 0, 20 * MIB);
	ts_cache_close(&c);
}

/*
 * The header was validated at open; a peer that rewrites it since (checksum
 * and all) must not steer an open handle: the reservation chunk (divided
 * by: 0 was SIGFPE), the arena's offset (reserved at), the index size
 * (counted up to) stay what was validated.
 */
Test(cache, a_header_rewritten_after_open_does_not_steer_an_open_handle)
{
	struct ts_cache c;
	char name[TS_NAME_MAX], path[TS_PATH_MAX];
	fresh(&c, name, path, 256 * MIB);
	struct ts_cache_static *st = &c.hdr->st;
	uint64_t arena_off = st->arena_off;
	uint32_t nentries = st->nentries;
	st->chunk_size = 0;
	st->arena_off = 1ull << 40;
	st->nentries = 1u << 30;
	fix_checksum(&c);
	struct ts_cache_key k = key_of(1);
	fill_commit(&c, &k, 1, 0, 1 * MIB);
	expect_hit(&c, &k, 1, 0, 1 * MIB);
	struct ts_cache_stats s = stats(&c);
	cr_expect_eq(s.reserved_bytes, TS_CACHE_CHUNK, "one chunk, as validated");
	cr_expect_eq(s.capacity, nentries, "the index size as validated");
	cr_expect_eq(s.entries, 1u);
	cr_expect_lt(file_bytes(path), arena_off + 2 * TS_CACHE_CHUNK, "reserved in the arena, not at the offset written (%llu bytes)",
		     (unsigned long long)file_bytes(path));
	/* a new open, and a view, refuse the rewritten header */
	expect_refused(name, path, -EBADMSG, "invalid index size", "rewritten geometry");
	ts_cache_close(&c);
}

/*
 * falloc_hwm, how far the file is reserved, is a peer's word too: raised
 * over pages that do not exist, it must not make a fill write into them
 * (on a full /dev/shm, a SIGBUS in the decoder: shmfull.sh's lie case).
 * Each handle reserves the chunks it touches itself.
 */
Test(cache, a_lied_reservation_mark_is_reserved_again_before_use)
{
	struct ts_cache c;
	char name[TS_NAME_MAX], path[TS_PATH_MAX];
	fresh(&c, name, path, 128 * MIB);
	uint64_t before = file_bytes(path);
	atomic_store(&c.hdr->falloc_hwm, c.arena_size); /* nothing of the arena is reserved */
	struct ts_cache_key k = key_of(1);
	fill_commit(&c, &k, 1, 0, 1 * MIB);
	cr_expect_geq(file_bytes(path), before + TS_CACHE_CHUNK, "the fill's chunk reserved by the filler (%llu -> %llu bytes)",
		      (unsigned long long)before, (unsigned long long)file_bytes(path));
	expect_hit(&c, &k, 1, 0, 1 * MIB);
	ts_cache_close(&c);
}

static void expect_untouched(const char *file)
{
	struct stat sb;
	cr_assert_eq(stat(file, &sb), 0);
	cr_expect_eq(sb.st_size, 0, "the program's file must not be touched");
	cr_expect_eq(sb.st_blocks, 0, "the program's file must not be touched");
}

Test(cache, descriptor_reused_by_the_program_is_never_grown)
{
	struct ts_cache c;
	char name[TS_NAME_MAX], path[TS_PATH_MAX];
	fresh(&c, name, path, 128 * MIB);
	struct ts_cache_key k = key_of(1);
	fill_commit(&c, &k, 1, 0, 1 * MIB);
	/* The program closes "its" descriptors and opens a file that gets our number. */
	char other[] = "/tmp/tsshim-cache-test.XXXXXX";
	int ofd = mkstemp(other);
	cr_assert(ofd >= 0);
	int ours = c.fd;
	cr_assert_eq(dup2(ofd, ours), ours);
	char *buf = malloc(40 * MIB);
	cr_assert(buf != NULL);
	/* Needs the second chunk: our file is reopened by name, theirs left alone. */
	struct ts_cache_key big = key_of(2);
	fill_commit(&c, &big, 2, 0, 40 * MIB);
	cr_expect_neq(c.fd, ours, "the cache must use a descriptor of its own again");
	cr_expect_eq(stats(&c).reserved_bytes, 2 * TS_CACHE_CHUNK);
	expect_untouched(other);
	/* Descriptor taken again and the file gone from /dev/shm: no growth at all. */
	cr_assert_eq(dup2(ofd, c.fd), c.fd);
	cr_assert_eq(unlink(path), 0);
	struct ts_cache_key big2 = key_of(3);
	struct ts_cache_fill f;
	int r = ts_cache_get(&c, &big2, 40 * MIB, buf, 0, &f); /* needs the third chunk */
	cr_expect_eq(r, TS_CACHE_BYPASS, "got %s", result_name(r));
	cr_expect_eq(stats(&c).bypass_shm, 1u);
	expect_untouched(other);
	/* What is already reserved keeps working. */
	expect_hit(&c, &k, 1, 0, 1 * MIB);
	expect_hit(&c, &big, 2, 0, 40 * MIB);
	int theirs = c.fd;
	ts_cache_close(&c);
	cr_expect_eq(fcntl(theirs, F_GETFD), 0, "close must leave the program's descriptor open");
	close(theirs);
	close(ofd);
	close(ours);
	unlink(other);
	free(buf);
}

/* ---- the lock ------------------------------------------------------------------------ */

static void *lock_and_exit(void *arg)
{
	struct ts_cache *c = arg;
	cr_assert_eq(ts_shm_lock(&c->hdr->lock, 1000000000ull), 0);
	/* half-way through something: a garbage head and cursor */
	c->hdr->head = 12345;
	c->hdr->cursor = 999999;
	return NULL; /* exits holding the lock */
}

Test(cache, lock_owner_death_is_repaired)
{
	struct ts_cache c;
	char name[TS_NAME_MAX], path[TS_PATH_MAX];
	fresh(&c, name, path, 4 * MIB);
	struct ts_cache_key a = key_of(1), b = key_of(2);
	fill_commit(&c, &a, 1, 0, 50 * KIB);
	pthread_t t;
	cr_assert_eq(pthread_create(&t, NULL, lock_and_exit, &c), 0);
	pthread_join(t, NULL);
	uint64_t t0 = mono_ms();
	expect_hit(&c, &a, 1, 0, 50 * KIB);
	cr_expect_lt(mono_ms() - t0, 1000u);
	cr_expect_eq(stats(&c).repairs, 1u, "a dead holder's lock must be taken over with one repair");
	fill_commit(&c, &b, 2, 0, 50 * KIB);
	expect_hit(&c, &b, 2, 0, 50 * KIB);
	check_invariants(&c);
	ts_cache_close(&c);
}

struct holder {
	struct ts_cache *c;
	pthread_barrier_t locked, release;
};

static void *lock_and_hold(void *arg)
{
	struct holder *h = arg;
	cr_assert_eq(ts_shm_lock(&h->c->hdr->lock, 1000000000ull), 0);
	pthread_barrier_wait(&h->locked);
	pthread_barrier_wait(&h->release);
	ts_shm_unlock(&h->c->hdr->lock);
	return NULL;
}

Test(cache, busy_lock_means_bypass_not_hang)
{
	struct ts_cache c;
	char name[TS_NAME_MAX], path[TS_PATH_MAX];
	fresh(&c, name, path, 4 * MIB);
	struct holder h = { .c = &c };
	pthread_barrier_init(&h.locked, NULL, 2);
	pthread_barrier_init(&h.release, NULL, 2);
	pthread_t t;
	cr_assert_eq(pthread_create(&t, NULL, lock_and_hold, &h), 0);
	pthread_barrier_wait(&h.locked);
	struct ts_cache_key k = key_of(1);
	struct ts_cache_fill f;
	char buf[100];
	uint64_t t0 = mono_ms();
	cr_expect_eq(ts_cache_get(&c, &k, sizeof(buf), buf, WAIT_LONG, &f), TS_CACHE_BYPASS);
	uint64_t took = mono_ms() - t0;
	cr_expect_geq(took, 45u);
	cr_expect_lt(took, 1000u, "a busy lock must cost the lock timeout, not more (%llu ms)", (unsigned long long)took);
	cr_expect_eq(stats(&c).bypass_lock, 1u);
	pthread_barrier_wait(&h.release);
	pthread_join(t, NULL);
	fill_commit(&c, &k, 1, 0, sizeof(buf));
	pthread_barrier_destroy(&h.locked);
	pthread_barrier_destroy(&h.release);
	ts_cache_close(&c);
}

/* ---- inspection ---------------------------------------------------------------------------- */

static uint64_t file_digest(const char *path, uint64_t len)
{
	int fd = open(path, O_RDONLY);
	cr_assert(fd >= 0);
	unsigned char *buf = malloc(len);
	cr_assert(buf != NULL);
	cr_assert_eq(pread(fd, buf, len, 0), (ssize_t)len);
	close(fd);
	uint64_t h = 1469598103934665603ull;
	for (uint64_t i = 0; i < len; i++)
		h = (h ^ buf[i]) * 1099511628211ull;
	free(buf);
	return h;
}

Test(cache, view_reads_without_changing)
{
	struct ts_cache c;
	char name[TS_NAME_MAX], path[TS_PATH_MAX];
	fresh(&c, name, path, 4 * MIB);
	struct ts_cache_key k = key_of(1);
	fill_commit(&c, &k, 1, 0, 10 * KIB);
	expect_hit(&c, &k, 1, 0, 10 * KIB);
	struct ts_cache_fill f;
	char buf[64];
	struct ts_cache_key k2 = key_of(2);
	cr_assert_eq(ts_cache_get(&c, &k2, sizeof(buf), buf, 0, &f), TS_CACHE_FILL);
	uint64_t len = c.hdr->st.arena_off + 64 * KIB;
	uint64_t before = file_digest(path, len);
	struct ts_cache_stats s;
	cr_assert_eq(ts_cache_view(path, &s, why, sizeof(why)), 0, "%s", why);
	cr_expect_eq(file_digest(path, len), before, "the view must not change a byte");
	cr_expect_eq(s.hits, 1u);
	cr_expect_eq(s.fills, 2u);
	cr_expect_eq(s.commits, 1u);
	cr_expect_eq(s.entries, 1u);
	cr_expect_eq(s.filling, 1u);
	cr_expect_eq(s.bytes_in_use, 10 * KIB + 64);
	cr_expect_eq(s.budget, 4 * MIB);
	cr_expect_eq(s.users, 1u);
	cr_expect_eq(s.saved_decode_ns, 1001u);
	cr_expect_eq(s.capacity, TS_CACHE_MIN_ENTRIES);
	ts_cache_abort(&c, &f);
	cr_expect_eq(ts_cache_view("/dev/shm/tsshim-cache.no-such", &s, why, sizeof(why)), -ENOENT);
	/* A live cache is not stale. */
	cr_expect_eq(ts_cache_remove_if_stale(path), 0);
	struct stat sb;
	cr_expect_eq(lstat(path, &sb), 0);
	atomic_store(&c.hdr->users[c.user_slot].pid, 0x3ffffff0u);
	cr_expect_eq(ts_cache_remove_if_stale(path), 1, "a cache whose users are dead must be removed");
	cr_expect_neq(lstat(path, &sb), 0);
	ts_cache_close(&c);
}

/* ---- a peer that writes the list links while we use them ----------------------- */

struct scribbler {
	struct ts_cache_entry *ents;
	uint32_t n, value; /* value: what every next becomes; UINT32_MAX: each entry itself */
	atomic_int stop;
};

static void *scribble_links(void *arg)
{
	struct scribbler *s = arg;
	while (!atomic_load_explicit(&s->stop, memory_order_relaxed))
		for (uint32_t i = 0; i < s->n; i++)
			__atomic_store_n(&s->ents[i].next, s->value == UINT32_MAX ? i : s->value, __ATOMIC_RELAXED);
	return NULL;
}

/*
 * Another process of the user writes every entry's next link without the
 * lock, over and over, while a job fills and hits: each link is checked
 * where it is loaded, and repair() sorts a private copy instead of following
 * the links. Before, a self-link made repair's merge sort loop forever with
 * the lock held (the job hung), and an out-of-range link crashed it (found
 * in review). Every hit must still be the committed bytes.
 */
static void survives_scribbled_links(uint32_t value)
{
	struct ts_cache c;
	char name[TS_NAME_MAX], path[TS_PATH_MAX];
	fresh(&c, name, path, 1 * MIB);
	struct scribbler s = { .ents = c.ents, .n = c.nentries, .value = value };
	pthread_t t;
	unsigned char *dst = malloc(8 * KIB);
	cr_assert(dst != NULL);
	uint64_t hits = 0;
	for (uint64_t i = 0; i < 150000; i++) {
		if (i == 1000)
			cr_assert_eq(pthread_create(&t, NULL, scribble_links, &s), 0);
		uint64_t id = i % 600, len = 4 * KIB + id;
		struct ts_cache_key k = key_of(id);
		struct ts_cache_fill f;
		int r = ts_cache_get(&c, &k, len, dst, 0, &f);
		if (r == TS_CACHE_FILL) {
			payload(id, 0, f.ptr, len);
			ts_cache_commit(&c, &f, 1000);
		} else if (r == TS_CACHE_HIT) {
			hits++;
			cr_assert(same_as_payload(id, 0, dst, len), "key %llu: a hit returned other bytes than committed",
				  (unsigned long long)id);
		}
	}
	atomic_store(&s.stop, 1);
	pthread_join(t, NULL);
	cr_expect_gt(stats(&c).repairs, 0u, "the scribbled links were seen and repaired");
	cr_expect_gt(hits, 0u);
	free(dst);
	ts_cache_close(&c);
}

Test(cache, links_a_peer_makes_into_cycles_do_not_hang_a_job)
{
	survives_scribbled_links(UINT32_MAX);
}

Test(cache, links_a_peer_points_out_of_the_table_are_not_followed)
{
	survives_scribbled_links(0x7ffffff0u);
}
