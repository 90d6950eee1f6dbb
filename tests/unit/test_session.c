/* SPDX-License-Identifier: MIT */
/*
 * Sessions: names and paths, header validation, member health, election
 * (on in-memory images with faked time and liveness), real segments in
 * /dev/shm, and the heartbeat thread.
 *
 * Real segments use names "ut-<pid>-<n>" and are removed by the suite fini
 * whatever happens in the test. ts_prim overrides are undone by the fini.
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "heartbeat.h"
#include "layout.h"
#include "prim.h"
#include "session.h"

/* ---- prim overrides -------------------------------------------------------- */

static struct ts_prim_ops saved_prim;

/* Fake processes: pid FAKE_PID0 + i with start time fake_start[i] (0: gone). */
#define FAKE_PID0  3900000u
#define FAKE_PROCS (TS_MAX_MEMBERS + 8)
static _Atomic uint64_t fake_start[FAKE_PROCS];
#define FAKE_UNREADABLE UINT64_MAX
static _Atomic uint64_t fake_clock;

static uint64_t fake_now(void)
{
	return atomic_load(&fake_clock);
}

static int fake_proc_start_time(uint32_t pid, uint64_t *out)
{
	if (pid >= FAKE_PID0 && pid < FAKE_PID0 + FAKE_PROCS) {
		uint64_t v = atomic_load(&fake_start[pid - FAKE_PID0]);
		if (v == 0)
			return -ESRCH;
		if (v == FAKE_UNREADABLE)
			return -EMFILE; /* the asker is out of descriptors */
		*out = v;
		return 0;
	}
	return saved_prim.proc_start_time(pid, out);
}

static uint64_t ident_start(unsigned i)
{
	return 100000u + i;
}

/* Fake the clock (starting at 10 s) and the liveness of the fake pids. */
static void use_fakes(void)
{
	atomic_store(&fake_clock, 10000000000ull);
	for (unsigned i = 0; i < FAKE_PROCS; i++)
		atomic_store(&fake_start[i], 0);
	ts_prim.now_ns = fake_now;
	ts_prim.proc_start_time = fake_proc_start_time;
}

static void advance_ms(uint64_t ms)
{
	atomic_fetch_add(&fake_clock, ms * 1000000ull);
}

/* ---- real segment bookkeeping ------------------------------------------------ */

#define MAX_PATHS 16
static char made[MAX_PATHS][TS_PATH_MAX];
static int nmade;
static unsigned name_counter;

/* A unique session name; its path is removed by the fini. */
static void unique_name(char *name, size_t n, char *path)
{
	snprintf(name, n, "ut-%d-%u", (int)getpid(), name_counter++);
	cr_assert_eq(ts_segment_path(path, TS_PATH_MAX, getuid(), name), 0);
	cr_assert(nmade < MAX_PATHS, "test bug: too many paths");
	snprintf(made[nmade++], TS_PATH_MAX, "%s", path);
	unlink(path);
}

/* Any other file the test creates in /dev/shm. */
static void remember_path(const char *path)
{
	cr_assert(nmade < MAX_PATHS, "test bug: too many paths");
	snprintf(made[nmade++], TS_PATH_MAX, "%s", path);
}

static void suite_init(void)
{
	saved_prim = ts_prim;
	nmade = 0;
}

static void suite_fini(void)
{
	ts_prim = saved_prim;
	for (int i = 0; i < nmade; i++)
		unlink(made[i]);
	nmade = 0;
}

static int path_exists(const char *path)
{
	struct stat sb;
	return lstat(path, &sb) == 0;
}

static size_t seg_bytes(void)
{
	size_t p = (size_t)sysconf(_SC_PAGESIZE);
	return (sizeof(struct ts_segment) + p - 1) / p * p;
}

static const struct ts_session_params default_params = { .depth = 4, .timeout_ms = 1000 };

/* A fresh segment image of a page-rounded size, as the creator makes it. */
static struct ts_segment *file_image(const char *name)
{
	struct ts_segment *seg = calloc(1, seg_bytes());
	cr_assert(seg != NULL);
	ts_segment_init(seg, seg_bytes(), name, getuid(), &default_params);
	return seg;
}

static void write_file(const char *path, const void *buf, size_t n, mode_t mode)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	cr_assert(fd >= 0, "cannot create %s: %s", path, strerror(errno));
	size_t off = 0;
	while (off < n) {
		ssize_t w = write(fd, (const char *)buf + off, n - off);
		cr_assert(w > 0, "write %s: %s", path, strerror(errno));
		off += (size_t)w;
	}
	cr_assert_eq(fchmod(fd, mode), 0);
	close(fd);
}

static void *slurp(const char *path, size_t *n)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	cr_assert(fd >= 0, "cannot open %s: %s", path, strerror(errno));
	struct stat sb;
	cr_assert_eq(fstat(fd, &sb), 0);
	char *buf = malloc((size_t)sb.st_size + 1);
	cr_assert(buf != NULL);
	size_t off = 0;
	while (off < (size_t)sb.st_size) {
		ssize_t r = read(fd, buf + off, (size_t)sb.st_size - off);
		cr_assert(r > 0);
		off += (size_t)r;
	}
	close(fd);
	*n = off;
	return buf;
}

static void fix_checksum(struct ts_segment *seg)
{
	seg->st.checksum = ts_static_checksum(&seg->st);
}

static uint64_t mono_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* ---- in-memory images ------------------------------------------------------------ */

static struct ts_segment *image_new(uint32_t timeout_ms)
{
	struct ts_segment *seg = calloc(1, sizeof(*seg));
	cr_assert(seg != NULL);
	struct ts_session_params p = { .depth = 4, .timeout_ms = timeout_ms };
	ts_segment_init(seg, sizeof(*seg), "unit", getuid(), &p);
	return seg;
}

/* Member i: fake pid FAKE_PID0 + i, alive, heartbeat now. */
static void member_put(struct ts_segment *seg, unsigned i)
{
	struct ts_member *m = &seg->members[i];
	atomic_store(&fake_start[i], ident_start(i));
	atomic_store(&m->start_time, ident_start(i));
	atomic_store(&m->heartbeat_ns, ts_now_ns());
	atomic_store(&m->joined_ns, ts_now_ns());
	atomic_store(&m->pid, FAKE_PID0 + i);
}

static void member_kill(unsigned i)
{
	atomic_store(&fake_start[i], 0);
}

/* The pid lives on, but in another process (pid reuse). */
static void member_pid_reused(unsigned i)
{
	atomic_store(&fake_start[i], ident_start(i) + 777);
}

static void member_revive(unsigned i)
{
	atomic_store(&fake_start[i], ident_start(i));
}

static struct ts_session handle(struct ts_segment *seg, int i)
{
	struct ts_session s;
	memset(&s, 0, sizeof(s));
	s.seg = seg;
	s.timeout_ns = ts_timeout_ns(seg);
	s.map_size = sizeof(*seg);
	s.fd = -1;
	s.self = i;
	s.me.pid = FAKE_PID0 + (uint32_t)i;
	s.me.start_time = ident_start((unsigned)i);
	snprintf(s.name, sizeof(s.name), "unit");
	return s;
}

static uint64_t producer_word(const struct ts_segment *seg)
{
	return atomic_load(&seg->producer);
}

TestSuite(names, .init = suite_init, .fini = suite_fini);
TestSuite(validate, .init = suite_init, .fini = suite_fini);
TestSuite(health, .init = suite_init, .fini = suite_fini);
TestSuite(election, .init = suite_init, .fini = suite_fini);
TestSuite(shm, .init = suite_init, .fini = suite_fini);
TestSuite(heartbeat, .init = suite_init, .fini = suite_fini);

/* ---- names and paths --------------------------------------------------------------- */

Test(names, valid_names)
{
	static const char *const ok[] = { "a", "Z", "0", "exp-1.a_b", "a.", "a..b", "x-", "sweep_07-lr0.1", NULL };
	for (int i = 0; ok[i]; i++)
		cr_expect(ts_session_name_valid(ok[i]), "'%s' must be a valid session name", ok[i]);
	char max[64];
	memset(max, 'n', 63);
	max[63] = '\0';
	cr_expect(ts_session_name_valid(max), "a 63-character name must be valid");
}

Test(names, invalid_names)
{
	static const char *const bad[] = { "",   ".",    "..",  ".hidden", "-x", "--json", "a/b", "/a",     "a b",
					   "a:b", "a\n",  "\ta", "caf\xc3\xa9", "a*", "a\\b", "a%s", NULL };
	for (int i = 0; bad[i]; i++)
		cr_expect(!ts_session_name_valid(bad[i]), "'%s' must be an invalid session name", bad[i]);
	cr_expect(!ts_session_name_valid(NULL), "NULL must be an invalid session name");
	char over[65];
	memset(over, 'n', 64);
	over[64] = '\0';
	cr_expect(!ts_session_name_valid(over), "a 64-character name must be invalid (max 63)");
}

Test(names, segment_path_format)
{
	char buf[TS_PATH_MAX];
	cr_assert_eq(ts_segment_path(buf, sizeof(buf), 1234, "exp-1"), 0);
	cr_expect_str_eq(buf, "/dev/shm/tsshim.1234.exp-1");
	cr_assert_eq(ts_segment_path(buf, sizeof(buf), 0, "default"), 0);
	cr_expect_str_eq(buf, "/dev/shm/tsshim.0.default");
	cr_expect_eq(ts_segment_path(buf, sizeof(buf), 1234, "a/b"), -EINVAL, "invalid name must give -EINVAL");
	cr_expect_eq(ts_segment_path(buf, sizeof(buf), 1234, ".x"), -EINVAL, "hidden name must give -EINVAL");
	/* "/dev/shm/tsshim.1234.exp-1" is 26 characters. */
	cr_expect_eq(ts_segment_path(buf, 27, 1234, "exp-1"), 0, "27 bytes hold 26 characters and the NUL");
	cr_expect_eq(ts_segment_path(buf, 26, 1234, "exp-1"), -ENAMETOOLONG, "26 bytes must be too short");
}

/* ---- header validation ---------------------------------------------------------------- */

static char why[256];

static int validate(const struct ts_segment *seg, size_t size, uid_t uid)
{
	memset(why, 0, sizeof(why));
	return ts_segment_validate(seg, size, uid, why, sizeof(why));
}

static void expect_invalid(const struct ts_segment *seg, size_t size, int err, const char *reason, const char *what)
{
	int rc = validate(seg, size, getuid());
	cr_expect_eq(rc, err, "%s: expected %d, got %d (%s)", what, err, rc, why);
	cr_expect(why[0] != '\0', "%s: no reason given", what);
	if (reason)
		cr_expect(strstr(why, reason) != NULL, "%s: reason '%s' does not mention '%s'", what, why, reason);
}

Test(validate, fresh_image_is_valid)
{
	struct ts_segment *seg = image_new(1000);
	int rc = validate(seg, sizeof(*seg), getuid());
	cr_expect_eq(rc, 0, "fresh image refused: %d %s", rc, why);
	cr_expect_eq(seg->st.magic, TS_MAGIC);
	cr_expect_eq(seg->st.layout_version, TS_LAYOUT_VERSION);
	cr_expect_eq(seg->st.header_size, sizeof(struct ts_segment));
	cr_expect_eq(seg->st.segment_size, sizeof(struct ts_segment));
	cr_expect_eq(seg->st.depth, 4u);
	cr_expect_eq(seg->st.timeout_ms, 1000u);
	cr_expect_eq(seg->st.uid, (uint32_t)getuid());
	cr_expect_eq(seg->st.creator_pid, (uint32_t)getpid());
	cr_expect_str_eq(seg->st.name, "unit");
	cr_expect_eq(seg->st.checksum, ts_static_checksum(&seg->st));
	cr_expect_eq(atomic_load(&seg->state), TS_SEG_OPEN);
	cr_expect_eq(atomic_load(&seg->producer), 0u, "a fresh segment has no producer");
	uint64_t now = (uint64_t)time(NULL) * 1000000000ull;
	cr_expect(seg->st.created_unix_ns + 5000000000ull > now && seg->st.created_unix_ns < now + 5000000000ull,
		  "created_unix_ns must be the wall clock now");
	free(seg);
}

Test(validate, bad_magic)
{
	struct ts_segment *seg = image_new(1000);
	seg->st.magic ^= 1;
	expect_invalid(seg, sizeof(*seg), -EBADMSG, "magic", "bad magic");
	free(seg);
}

Test(validate, other_layout_version)
{
	struct ts_segment *seg = image_new(1000);
	seg->st.layout_version = TS_LAYOUT_VERSION + 1;
	expect_invalid(seg, sizeof(*seg), -EPROTO, "another tsshim build", "layout_version + 1");
	fix_checksum(seg);
	expect_invalid(seg, sizeof(*seg), -EPROTO, "another tsshim build", "layout_version + 1, checksum fixed");
	free(seg);
}

Test(validate, other_header_size)
{
	struct ts_segment *seg = image_new(1000);
	seg->st.header_size = (uint32_t)sizeof(*seg) + 8;
	fix_checksum(seg);
	expect_invalid(seg, sizeof(*seg), -EPROTO, "another tsshim build", "header_size changed");
	free(seg);
	seg = image_new(1000);
	seg->st.max_members = TS_MAX_MEMBERS * 2;
	fix_checksum(seg);
	expect_invalid(seg, sizeof(*seg), -EPROTO, "another tsshim build", "max_members changed");
	free(seg);
}

Test(validate, checksum_mismatch)
{
	struct ts_segment *seg = image_new(1000);
	seg->st.name[0] ^= 0x01; /* "unit" -> "tnit": still a valid name */
	expect_invalid(seg, sizeof(*seg), -EBADMSG, "checksum", "flipped byte in name");
	free(seg);
	seg = image_new(1000);
	seg->st.timeout_ms = 5;
	expect_invalid(seg, sizeof(*seg), -EBADMSG, "checksum", "timeout changed without checksum");
	free(seg);
}

Test(validate, smaller_than_header)
{
	struct ts_segment *seg = image_new(1000);
	expect_invalid(seg, sizeof(struct ts_static) - 1, -EBADMSG, "truncated", "smaller than the static header");
	expect_invalid(seg, 0, -EBADMSG, "truncated", "zero bytes");
	expect_invalid(seg, sizeof(struct ts_static), -EBADMSG, "truncated", "static header only");
	expect_invalid(seg, sizeof(*seg) - 1, -EBADMSG, "truncated", "one byte short of the segment");
	free(seg);
}

Test(validate, segment_size_larger_than_mapping)
{
	struct ts_segment *seg = image_new(1000);
	seg->st.segment_size = sizeof(*seg) + 4096;
	fix_checksum(seg);
	expect_invalid(seg, sizeof(*seg), -EBADMSG, "truncated", "segment_size larger than the mapping");
	seg->st.segment_size = sizeof(*seg) - 8;
	fix_checksum(seg);
	expect_invalid(seg, sizeof(*seg), -EBADMSG, NULL, "segment_size smaller than the segment");
	free(seg);
}

Test(validate, other_uid)
{
	struct ts_segment *seg = image_new(1000);
	int rc = validate(seg, sizeof(*seg), getuid() + 1);
	cr_expect_eq(rc, -EACCES, "a segment of another uid must give -EACCES, got %d", rc);
	char want[64];
	snprintf(want, sizeof(want), "uid %u", (unsigned)getuid());
	cr_expect(strstr(why, want) != NULL, "reason '%s' must name the owner (%s)", why, want);
	free(seg);
}

Test(validate, depth_out_of_range)
{
	struct ts_segment *seg = image_new(1000);
	seg->st.depth = 0;
	fix_checksum(seg);
	expect_invalid(seg, sizeof(*seg), -EBADMSG, "depth", "depth 0");
	seg->st.depth = TS_MAX_DEPTH + 1;
	fix_checksum(seg);
	expect_invalid(seg, sizeof(*seg), -EBADMSG, "depth", "depth 65");
	seg->st.depth = TS_MAX_DEPTH;
	fix_checksum(seg);
	cr_expect_eq(validate(seg, sizeof(*seg), getuid()), 0, "depth 64 must be valid: %s", why);
	seg->st.depth = 4;
	seg->st.timeout_ms = 0;
	fix_checksum(seg);
	expect_invalid(seg, sizeof(*seg), -EBADMSG, "timeout", "timeout 0");
	free(seg);
}

Test(validate, unterminated_or_invalid_name)
{
	struct ts_segment *seg = image_new(1000);
	memset(seg->st.name, 'a', sizeof(seg->st.name));
	fix_checksum(seg);
	expect_invalid(seg, sizeof(*seg), -EBADMSG, "name", "unterminated name");
	snprintf(seg->st.name, sizeof(seg->st.name), "../etc");
	fix_checksum(seg);
	expect_invalid(seg, sizeof(*seg), -EBADMSG, "name", "name '../etc'");
	memset(seg->st.name, 0, sizeof(seg->st.name));
	fix_checksum(seg);
	expect_invalid(seg, sizeof(*seg), -EBADMSG, "name", "empty name");
	free(seg);
}

Test(validate, invalid_state_word)
{
	struct ts_segment *seg = image_new(1000);
	atomic_store(&seg->state, 3);
	expect_invalid(seg, sizeof(*seg), -EBADMSG, "state", "state 3");
	atomic_store(&seg->state, 0);
	expect_invalid(seg, sizeof(*seg), -EBADMSG, "state", "state 0");
	atomic_store(&seg->state, TS_SEG_CLOSED);
	cr_expect_eq(validate(seg, sizeof(*seg), getuid()), 0, "a CLOSED segment is still well-formed: %s", why);
	free(seg);
}

/* ---- member health ---------------------------------------------------------------------- */

Test(health, free_live_stale_dead)
{
	use_fakes();
	struct ts_segment *seg = image_new(100);
	cr_expect_eq(ts_member_health(seg, 0, ts_now_ns()), TS_MEMBER_FREE, "empty slot must be FREE");
	member_put(seg, 0);
	uint64_t hb = ts_now_ns();
	cr_expect_eq(ts_member_health(seg, 0, hb), TS_MEMBER_LIVE, "fresh heartbeat must be LIVE");
	cr_expect_eq(ts_member_health(seg, 0, hb + 100000000ull), TS_MEMBER_LIVE,
		     "heartbeat exactly timeout_ms old must still be LIVE");
	cr_expect_eq(ts_member_health(seg, 0, hb + 100000001ull), TS_MEMBER_STALE,
		     "heartbeat older than timeout_ms must be STALE");
	cr_expect_eq(ts_member_health(seg, 0, hb - 5), TS_MEMBER_LIVE, "heartbeat in the future must count as LIVE");
	member_kill(0);
	cr_expect_eq(ts_member_health(seg, 0, hb), TS_MEMBER_DEAD, "process gone (-ESRCH) must be DEAD");
	cr_expect_eq(ts_member_health(seg, 0, hb + 200000000ull), TS_MEMBER_DEAD, "gone and silent must be DEAD, not STALE");
	cr_expect_eq(ts_member_health(seg, TS_MAX_MEMBERS, hb), TS_MEMBER_DEAD, "an out-of-range index must be DEAD");
	free(seg);
}

Test(health, pid_reuse_is_dead)
{
	use_fakes();
	struct ts_segment *seg = image_new(100);
	member_put(seg, 3);
	cr_expect_eq(ts_member_health(seg, 3, ts_now_ns()), TS_MEMBER_LIVE);
	member_pid_reused(3);
	cr_expect_eq(ts_member_health(seg, 3, ts_now_ns()), TS_MEMBER_DEAD,
		     "a live pid with another start time is another process: DEAD");
	member_revive(3);
	cr_expect_eq(ts_member_health(seg, 3, ts_now_ns()), TS_MEMBER_LIVE);
	free(seg);
}

Test(health, a_process_that_cannot_be_read_is_not_dead)
{
	/* Before: an asker out of descriptors (EMFILE on /proc/PID/stat) took
	 * every member for dead, evicted them and removed the segment. */
	use_fakes();
	struct ts_segment *seg = image_new(100);
	member_put(seg, 2);
	atomic_store(&fake_start[2], FAKE_UNREADABLE);
	uint64_t hb = ts_now_ns();
	cr_expect_eq(ts_member_health(seg, 2, hb), TS_MEMBER_LIVE, "unreadable, beating: LIVE, not DEAD");
	cr_expect_eq(ts_member_health(seg, 2, hb + 200000000ull), TS_MEMBER_STALE,
		     "unreadable and silent: STALE (the heartbeat still tells)");
	free(seg);
}

Test(election, a_consumer_out_of_descriptors_does_not_take_over_a_live_producer)
{
	use_fakes();
	struct ts_segment *seg = image_new(100);
	member_put(seg, 0);
	member_put(seg, 1);
	struct ts_session p = handle(seg, 0), c = handle(seg, 1);
	cr_assert_eq(ts_session_tick(&p), TS_ROLE_PRODUCER);
	cr_assert_eq(ts_session_tick(&c), TS_ROLE_CONSUMER);
	atomic_store(&fake_start[0], FAKE_UNREADABLE);
	cr_expect_eq(ts_session_tick(&c), TS_ROLE_CONSUMER, "the producer beats: no takeover");
	cr_expect_eq(ts_session_tick(&p), TS_ROLE_PRODUCER);
	free(seg);
}

Test(health, real_liveness_of_this_process)
{
	/* Not faked: our own pid and start time from /proc. */
	struct ts_ident me;
	cr_assert_eq(ts_self_ident(&me), 0);
	cr_expect_eq(me.pid, (uint32_t)getpid());
	cr_expect_eq(ts_proc_liveness(me.pid, me.start_time), TS_PROC_ALIVE);
	cr_expect_eq(ts_proc_liveness(me.pid, me.start_time + 1), TS_PROC_DEAD, "other start time: pid reused");
	cr_expect_eq(ts_proc_liveness(0, 0), TS_PROC_DEAD, "pid 0 is never a member");
	uint64_t st = 0;
	cr_expect_eq(ts_prim_read_start_time(0x3ffffff0u, &st), -ESRCH, "a pid that cannot exist must be -ESRCH");
}

/* ---- election (in-memory image) ----------------------------------------------------------- */

Test(election, first_tick_becomes_producer_epoch_1)
{
	use_fakes();
	struct ts_segment *seg = image_new(100);
	member_put(seg, 0);
	struct ts_session a = handle(seg, 0);
	cr_expect_eq(ts_session_role(&a), TS_ROLE_CONSUMER, "no producer yet: not producer");
	uint32_t ev = atomic_load(&seg->election_ev);
	advance_ms(5);
	cr_expect_eq(ts_session_tick(&a), TS_ROLE_PRODUCER, "first ticker with no producer must become producer");
	uint64_t w = producer_word(seg);
	cr_expect_eq(ts_producer_index(w), 0);
	cr_expect_eq(ts_producer_epoch(w), 1u, "first producer has epoch 1");
	cr_expect_eq(atomic_load(&seg->counters.takeovers), 0u, "no previous producer: not a takeover");
	cr_expect_neq(atomic_load(&seg->election_ev), ev, "election_ev must change when the producer changes");
	cr_expect_eq(atomic_load(&seg->members[0].heartbeat_ns), ts_now_ns(), "tick must refresh the heartbeat");
	cr_expect_eq(ts_session_role(&a), TS_ROLE_PRODUCER);
	/* Ticking again changes nothing. */
	cr_expect_eq(ts_session_tick(&a), TS_ROLE_PRODUCER);
	cr_expect_eq(producer_word(seg), w, "a producer's own tick must not change the word");
	free(seg);
}

Test(election, second_member_stays_consumer)
{
	use_fakes();
	struct ts_segment *seg = image_new(100);
	member_put(seg, 0);
	member_put(seg, 1);
	struct ts_session a = handle(seg, 0), b = handle(seg, 1);
	cr_assert_eq(ts_session_tick(&a), TS_ROLE_PRODUCER);
	uint64_t w = producer_word(seg);
	for (int i = 0; i < 5; i++) {
		advance_ms(50);
		cr_expect_eq(ts_session_tick(&b), TS_ROLE_CONSUMER, "round %d: a LIVE producer must not be replaced", i);
		cr_expect_eq(ts_session_tick(&a), TS_ROLE_PRODUCER, "round %d", i);
	}
	cr_expect_eq(producer_word(seg), w, "the producer word must not change while the producer is LIVE");
	cr_expect_eq(ts_session_role(&b), TS_ROLE_CONSUMER);
	free(seg);
}

/* "Am I alone?": the members other than us that are alive or only silent. */
Test(election, others_counts_live_and_silent_members_but_not_us_or_the_dead)
{
	use_fakes();
	struct ts_segment *seg = image_new(100);
	member_put(seg, 0);
	struct ts_session a = handle(seg, 0);
	cr_expect_eq(ts_session_others(&a), 0u, "alone");
	member_put(seg, 1);
	member_put(seg, 5);
	cr_expect_eq(ts_session_others(&a), 2u);
	struct ts_session b = handle(seg, 1);
	cr_expect_eq(ts_session_others(&b), 2u, "the same from another member");
	advance_ms(150); /* 1.5 timeouts without a heartbeat: silent, not gone */
	cr_expect_eq(ts_session_others(&a), 2u, "silent members still count");
	member_kill(5);
	cr_expect_eq(ts_session_others(&a), 1u, "a dead member does not count");
	member_kill(1);
	cr_expect_eq(ts_session_others(&a), 0u);
	struct ts_session none = { .seg = NULL, .self = -1 };
	cr_expect_eq(ts_session_others(&none), 0u, "no session: nobody");
	free(seg);
}

Test(election, stale_producer_is_replaced)
{
	use_fakes();
	struct ts_segment *seg = image_new(100);
	member_put(seg, 0);
	member_put(seg, 1);
	struct ts_session a = handle(seg, 0), b = handle(seg, 1);
	cr_assert_eq(ts_session_tick(&a), TS_ROLE_PRODUCER);
	/* Exactly the timeout: still tolerated. */
	advance_ms(100);
	cr_expect_eq(ts_session_tick(&b), TS_ROLE_CONSUMER, "a producer silent for exactly timeout_ms is tolerated");
	advance_ms(1);
	cr_expect_eq(ts_session_tick(&b), TS_ROLE_PRODUCER, "a producer silent for more than timeout_ms is replaced");
	uint64_t w = producer_word(seg);
	cr_expect_eq(ts_producer_index(w), 1);
	cr_expect_eq(ts_producer_epoch(w), 2u, "takeover must bump the epoch by one");
	cr_expect_eq(atomic_load(&seg->counters.takeovers), 1u, "counters.takeovers must count the takeover");
	/* The old producer wakes up (e.g. SIGCONT): it is a consumer now. */
	cr_expect_eq(ts_session_role(&a), TS_ROLE_CONSUMER, "a revived old producer must see it is a consumer");
	cr_expect_eq(ts_session_tick(&a), TS_ROLE_CONSUMER, "a revived old producer must not take back the role");
	cr_expect_eq(producer_word(seg), w, "the revived producer's tick must not change the word");
	cr_expect_eq(atomic_load(&seg->counters.takeovers), 1u);
	free(seg);
}

Test(election, dead_producer_is_replaced)
{
	use_fakes();
	struct ts_segment *seg = image_new(1000);
	member_put(seg, 0);
	member_put(seg, 1);
	member_put(seg, 2);
	struct ts_session a = handle(seg, 0), b = handle(seg, 1), c = handle(seg, 2);
	cr_assert_eq(ts_session_tick(&a), TS_ROLE_PRODUCER);
	cr_assert_eq(ts_session_tick(&b), TS_ROLE_CONSUMER);
	member_kill(0);
	advance_ms(1); /* well within the timeout: death is noticed at once */
	cr_expect_eq(ts_session_tick(&c), TS_ROLE_PRODUCER, "a DEAD producer must be replaced without waiting");
	cr_expect_eq(ts_producer_epoch(producer_word(seg)), 2u);
	cr_expect_eq(ts_producer_index(producer_word(seg)), 2);
	cr_expect_eq(atomic_load(&seg->counters.takeovers), 1u);
	cr_expect_eq(ts_session_tick(&b), TS_ROLE_CONSUMER, "the others follow the new producer");
	cr_expect_eq(ts_session_role(&b), TS_ROLE_CONSUMER);
	/* And again: the new producer dies. */
	member_kill(2);
	cr_expect_eq(ts_session_tick(&b), TS_ROLE_PRODUCER);
	cr_expect_eq(ts_producer_epoch(producer_word(seg)), 3u);
	cr_expect_eq(atomic_load(&seg->counters.takeovers), 2u);
	free(seg);
}

Test(election, producer_pid_reused_is_replaced)
{
	use_fakes();
	struct ts_segment *seg = image_new(1000);
	member_put(seg, 0);
	member_put(seg, 1);
	struct ts_session a = handle(seg, 0), b = handle(seg, 1);
	cr_assert_eq(ts_session_tick(&a), TS_ROLE_PRODUCER);
	member_pid_reused(0);
	cr_expect_eq(ts_session_tick(&b), TS_ROLE_PRODUCER,
		     "a producer whose pid now belongs to another process must be replaced");
	cr_expect_eq(ts_producer_epoch(producer_word(seg)), 2u);
	cr_expect_eq(atomic_load(&seg->counters.takeovers), 1u);
	free(seg);
}

Test(election, no_producer_after_leave_is_not_a_takeover)
{
	use_fakes();
	struct ts_segment *seg = image_new(1000);
	member_put(seg, 4);
	struct ts_session s = handle(seg, 4);
	atomic_store(&seg->producer, ts_producer_word(7, -1)); /* left without a successor */
	cr_expect_eq(ts_session_tick(&s), TS_ROLE_PRODUCER);
	cr_expect_eq(producer_word(seg), ts_producer_word(8, 4), "epoch 7 with no producer -> epoch 8, member 4");
	cr_expect_eq(atomic_load(&seg->counters.takeovers), 0u, "replacing nobody is not a takeover");
	free(seg);
}

Test(election, producer_in_free_slot_or_garbage_index_is_replaced)
{
	use_fakes();
	struct ts_segment *seg = image_new(1000);
	member_put(seg, 1);
	struct ts_session s = handle(seg, 1);
	atomic_store(&seg->producer, ts_producer_word(3, 9)); /* slot 9 is FREE */
	cr_expect_eq(ts_session_tick(&s), TS_ROLE_PRODUCER, "a producer word naming a free slot must be replaced");
	cr_expect_eq(producer_word(seg), ts_producer_word(4, 1));
	atomic_store(&seg->producer, (uint64_t)5 << 32 | 200u); /* index 199: out of range */
	cr_expect_eq(ts_session_tick(&s), TS_ROLE_PRODUCER, "an out-of-range producer index must be replaced");
	cr_expect_eq(producer_word(seg), ts_producer_word(6, 1));
	free(seg);
}

Test(election, not_a_member)
{
	use_fakes();
	struct ts_segment *seg = image_new(1000);
	struct ts_session s = handle(seg, -1);
	cr_expect_eq(ts_session_tick(&s), TS_ROLE_NONE, "a handle without a slot has no role");
	cr_expect_eq(ts_session_role(&s), TS_ROLE_NONE);
	cr_expect_eq(producer_word(seg), 0u, "a non-member's tick must not elect anyone");
	struct ts_session none;
	memset(&none, 0, sizeof(none));
	none.self = -1;
	none.fd = -1;
	cr_expect_eq(ts_session_tick(&none), TS_ROLE_NONE);
	cr_expect_eq(ts_session_role(&none), TS_ROLE_NONE);
	free(seg);
}

/* Race: RACE_THREADS members tick at once against a dead producer. */
#define RACE_THREADS 8
#define RACE_ROUNDS  2000

struct racer {
	struct ts_session s;
	int idx;
	_Atomic int result;
};

static pthread_barrier_t race_go, race_done;
static _Atomic int race_sitout; /* the dead member: it does not tick */
static _Atomic int race_stop;

static void *racer_main(void *arg)
{
	struct racer *r = arg;
	for (;;) {
		pthread_barrier_wait(&race_go);
		if (atomic_load(&race_stop))
			break;
		int role = TS_ROLE_NONE;
		if (atomic_load(&race_sitout) != r->idx)
			role = (int)ts_session_tick(&r->s);
		atomic_store(&r->result, role);
		pthread_barrier_wait(&race_done);
	}
	return NULL;
}

Test(election, concurrent_takeover_has_exactly_one_winner)
{
	use_fakes();
	ts_prim.now_ns = saved_prim.now_ns; /* real clock: the threads really race */
	struct ts_segment *seg = image_new(1000);
	static struct racer rs[RACE_THREADS];
	for (int i = 0; i <= RACE_THREADS; i++)
		member_put(seg, (unsigned)i);
	/* Member RACE_THREADS is the producer, and dead. */
	atomic_store(&seg->producer, ts_producer_word(1, RACE_THREADS));
	member_kill(RACE_THREADS);
	atomic_store(&race_sitout, -1);
	atomic_store(&race_stop, 0);
	cr_assert_eq(pthread_barrier_init(&race_go, NULL, RACE_THREADS + 1), 0);
	cr_assert_eq(pthread_barrier_init(&race_done, NULL, RACE_THREADS + 1), 0);
	pthread_t th[RACE_THREADS];
	for (int i = 0; i < RACE_THREADS; i++) {
		rs[i].s = handle(seg, i);
		rs[i].idx = i;
		cr_assert_eq(pthread_create(&th[i], NULL, racer_main, &rs[i]), 0);
	}
	int bad = 0, first_bad = -1, first_winners = 0;
	uint32_t epoch = 1, first_epoch = 0, first_prev = 0;
	for (int round = 0; round < RACE_ROUNDS; round++) {
		pthread_barrier_wait(&race_go);
		pthread_barrier_wait(&race_done);
		int winners = 0, winner = -1;
		for (int i = 0; i < RACE_THREADS; i++)
			if (atomic_load(&rs[i].result) == TS_ROLE_PRODUCER) {
				winners++;
				winner = i;
			}
		uint64_t w = producer_word(seg);
		int ok = winners == 1 && ts_producer_index(w) == winner && ts_producer_epoch(w) == epoch + 1;
		for (int i = 0; ok && i < RACE_THREADS; i++)
			ok = ts_session_role(&rs[i].s) == (i == winner ? TS_ROLE_PRODUCER : TS_ROLE_CONSUMER);
		if (!ok && bad++ == 0) {
			first_bad = round;
			first_winners = winners;
			first_prev = epoch;
			first_epoch = ts_producer_epoch(w);
		}
		epoch = ts_producer_epoch(w);
		/* The previous dead member comes back as a live member; the winner dies. */
		int prev = atomic_load(&race_sitout);
		if (prev >= 0)
			member_revive((unsigned)prev);
		if (winner >= 0) {
			member_kill((unsigned)winner);
			atomic_store(&race_sitout, winner);
		}
	}
	atomic_store(&race_stop, 1);
	pthread_barrier_wait(&race_go);
	for (int i = 0; i < RACE_THREADS; i++)
		pthread_join(th[i], NULL);
	pthread_barrier_destroy(&race_go);
	pthread_barrier_destroy(&race_done);
	cr_expect_eq(bad, 0,
		     "%d of %d rounds broke 'exactly one winner, epoch + 1'; first: round %d, %d winners, epoch %u -> %u",
		     bad, RACE_ROUNDS, first_bad, first_winners, first_prev, first_epoch);
	cr_expect_eq(ts_producer_epoch(producer_word(seg)), 1u + RACE_ROUNDS, "epoch must be 1 + one per round");
	cr_expect_eq(atomic_load(&seg->counters.takeovers), (uint64_t)RACE_ROUNDS, "one takeover per round");
	free(seg);
}

/* ---- real segments in /dev/shm ------------------------------------------------------------- */

Test(shm, join_creates_private_segment_first_is_producer)
{
	char name[64], path[TS_PATH_MAX];
	unique_name(name, sizeof(name), path);
	struct ts_session a;
	int rc = ts_session_join(&a, name, &default_params);
	cr_assert_eq(rc, 0, "join failed: %d %s", rc, a.why);
	struct stat sb;
	cr_assert_eq(stat(path, &sb), 0, "%s must exist after join", path);
	cr_expect(S_ISREG(sb.st_mode));
	cr_expect_eq(sb.st_mode & 07777, 0600, "segment mode must be 0600, got %o", (unsigned)(sb.st_mode & 07777));
	cr_expect_eq(sb.st_uid, getuid(), "segment must be owned by us");
	cr_expect_eq((size_t)sb.st_size, seg_bytes(), "segment size must be the page-rounded segment");
	cr_expect_eq(sb.st_nlink, 1, "no temporary name may be left linked");
	cr_expect_eq(a.self, 0, "first joiner takes slot 0");
	cr_expect_eq(ts_session_role(&a), TS_ROLE_PRODUCER, "first joiner must be producer");
	cr_expect_eq(ts_producer_epoch(producer_word(a.seg)), 1u);
	cr_expect_str_eq(a.seg->st.name, name);
	cr_expect_eq(a.seg->st.depth, 4u);
	cr_expect_eq(a.seg->st.timeout_ms, 1000u);
	cr_expect_eq(atomic_load(&a.seg->members[0].pid), (uint32_t)getpid());
	cr_expect_eq(atomic_load(&a.seg->counters.takeovers), 0u);
	ts_session_leave(&a);
	cr_expect(!path_exists(path), "the last leave must remove %s", path);
	cr_expect_eq(a.seg, NULL, "leave must drop the mapping");
	cr_expect_eq(a.fd, -1);
}

/*
 * A member killed inside its locked section (join, leave) while a child it
 * forked lives: the lock goes with the member, not with the child. A flock
 * belongs to the open file, which the child shares through its copy of the
 * descriptor: the child closes that copy at the fork. Before, the lock stayed
 * until the child exited, and every joiner waited out its timeout.
 */
Test(shm, a_forked_child_does_not_keep_a_lock_its_killed_parent_held)
{
	char name[64], path[TS_PATH_MAX];
	unique_name(name, sizeof(name), path);
	struct ts_session a;
	cr_assert_eq(ts_session_join(&a, name, &default_params), 0, "%s", a.why);
	int ready[2], done[2];
	cr_assert_eq(pipe(ready), 0);
	cr_assert_eq(pipe(done), 0);
	pid_t c = fork();
	cr_assert_geq(c, 0);
	if (c == 0) {
		close(ready[0]);
		close(done[1]);
		ts_session_atfork_child(); /* what the shim's fork handler does */
		char ok = fcntl(a.fd, F_GETFD) == -1 && errno == EBADF ? 'y' : 'n';
		ts_session_leave(&a); /* in a child: forgets, touches nothing of the parent's */
		if (write(ready[1], &ok, 1) != 1)
			_exit(2);
		char x;
		(void)!read(done[0], &x, 1); /* lives on until the parent is done */
		_exit(0);
	}
	close(ready[1]);
	close(done[0]);
	char ok = 0;
	cr_assert_eq(read(ready[0], &ok, 1), 1);
	cr_expect_eq(ok, 'y', "the child closed its copy of the session descriptor");
	cr_expect(path_exists(path), "the child's leave removed nothing");
	cr_expect_eq(atomic_load(&a.seg->members[a.self].pid), (uint32_t)getpid(), "nor our member slot");

	/* we take the lock (a join or leave), then "die" holding it: our descriptor goes */
	cr_assert_eq(flock(a.fd, LOCK_EX), 0);
	close(a.fd);
	int fd = open(path, O_RDWR);
	cr_assert_geq(fd, 0);
	cr_expect_eq(flock(fd, LOCK_EX | LOCK_NB), 0, "the lock went with its holder (errno %d)", errno);

	close(done[1]);
	int st = 0;
	cr_assert_eq(waitpid(c, &st, 0), c);
	cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	close(ready[0]);
	a.fd = fd; /* our session again, locked by us: leave removes it */
	ts_session_leave(&a);
	cr_expect(!path_exists(path));
}

/*
 * posix_fallocate as tmpfs gives it while a signal is pending, on kernels
 * that stop it then for any signal: EINTR, as often as asked.
 */
int __real_posix_fallocate(int fd, off_t off, off_t len);
int __wrap_posix_fallocate(int fd, off_t off, off_t len);
static _Atomic int fallocate_eintr, fallocate_calls;
int __wrap_posix_fallocate(int fd, off_t off, off_t len)
{
	atomic_fetch_add(&fallocate_calls, 1);
	if (atomic_load(&fallocate_eintr) > 0) {
		atomic_fetch_sub(&fallocate_eintr, 1);
		return EINTR;
	}
	return __real_posix_fallocate(fd, off, len);
}

/* A signal during the segment's reservation does not cost the job its session. */
Test(shm, join_survives_eintr_while_reserving)
{
	char name[64], path[TS_PATH_MAX];
	unique_name(name, sizeof(name), path);
	struct ts_session a;
	atomic_store(&fallocate_calls, 0);
	atomic_store(&fallocate_eintr, 3);
	int rc = ts_session_join(&a, name, &default_params);
	cr_assert_eq(rc, 0, "join failed: %d %s", rc, a.why);
	cr_expect_eq(atomic_load(&fallocate_calls), 4, "three EINTRs, then the reservation");
	struct stat sb;
	cr_assert_eq(stat(path, &sb), 0);
	cr_expect_eq((size_t)sb.st_size, seg_bytes());
	ts_session_leave(&a);

	/* a reservation that keeps being interrupted fails, and leaves nothing behind */
	atomic_store(&fallocate_eintr, 1000);
	rc = ts_session_join(&a, name, &default_params);
	atomic_store(&fallocate_eintr, 0);
	cr_expect_eq(rc, -EINTR, "got %d", rc);
	cr_expect(!path_exists(path), "%s must not exist after a failed join", path);
}

Test(shm, second_join_is_consumer_and_producer_leave_hands_over)
{
	char name[64], path[TS_PATH_MAX];
	unique_name(name, sizeof(name), path);
	struct ts_session a, b;
	cr_assert_eq(ts_session_join(&a, name, &default_params), 0, "%s", a.why);
	int rc = ts_session_join(&b, name, &default_params);
	cr_assert_eq(rc, 0, "second join failed: %d %s", rc, b.why);
	cr_expect_eq(b.self, 1, "second joiner takes the next slot");
	cr_expect_eq(ts_session_role(&b), TS_ROLE_CONSUMER, "second joiner must be consumer");
	cr_expect_eq(ts_session_role(&a), TS_ROLE_PRODUCER);
	uint32_t ev = atomic_load(&b.seg->election_ev), pub_ev = atomic_load(&b.seg->ring.pub_ev);
	ts_session_leave(&a);
	cr_expect(path_exists(path), "the segment must stay while a member remains");
	cr_expect_eq(ts_session_role(&b), TS_ROLE_PRODUCER, "the producer's leave must hand over at once, no tick");
	cr_expect_eq(ts_producer_epoch(producer_word(b.seg)), 2u, "hand-over must bump the epoch");
	cr_expect_neq(atomic_load(&b.seg->election_ev), ev, "hand-over must signal election_ev");
	cr_expect_neq(atomic_load(&b.seg->ring.pub_ev), pub_ev, "hand-over must wake readers waiting in the ring");
	cr_expect_eq(atomic_load(&b.seg->members[0].pid), 0u, "the leaver's slot must be free");
	ts_session_leave(&b);
	cr_expect(!path_exists(path), "the last leave must remove %s", path);
}

/*
 * A leave waits for the segment's lock at most the session's timeout as
 * joined. Before, it read the timeout from the segment again: a peer that
 * held the lock and wrote UINT32_MAX there kept the job in its exit for
 * 49 days (found in review).
 */
Test(shm, a_rewritten_timeout_does_not_stretch_the_wait_of_a_leave)
{
	char name[64], path[TS_PATH_MAX];
	unique_name(name, sizeof(name), path);
	struct ts_session_params p = { .depth = 4, .timeout_ms = 100 };
	struct ts_session a, b;
	cr_assert_eq(ts_session_join(&a, name, &p), 0, "%s", a.why);
	cr_assert_eq(ts_session_join(&b, name, &p), 0, "%s", b.why);
	int fd = open(path, O_RDWR | O_CLOEXEC);
	cr_assert_geq(fd, 0);
	cr_assert_eq(flock(fd, LOCK_EX | LOCK_NB), 0, "the peer holds the lock");
	a.seg->st.timeout_ms = UINT32_MAX;
	uint64_t t0 = ts_now_ns();
	ts_session_leave(&b);
	uint64_t took = ts_now_ns() - t0;
	cr_expect_lt(took, 10 * 1000000000ull, "the leave waited %llu ms for a lock held by a peer",
		     (unsigned long long)(took / 1000000));
	cr_expect_eq(atomic_load(&a.seg->members[1].pid), 0u, "left without the lock, all the same");
	flock(fd, LOCK_UN);
	close(fd);
	a.seg->st.timeout_ms = 100;
	ts_session_leave(&a);
	cr_expect(!path_exists(path));
}

/*
 * A producer waiting in another session marks this one idle while it is away,
 * and a consumer takes it over once that has lasted the idle time; an idle
 * mark already there (the producer's epoch ended) keeps its time, and coming
 * back clears only a mark that names us.
 */
Test(shm, a_producer_away_is_idle_and_taken_over_and_its_return_clears_only_its_mark)
{
	char name[64], path[TS_PATH_MAX];
	unique_name(name, sizeof(name), path);
	struct ts_session a, b;
	cr_assert_eq(ts_session_join(&a, name, &default_params), 0, "%s", a.why);
	cr_assert_eq(ts_session_join(&b, name, &default_params), 0, "%s", b.why);
	cr_expect_eq(ts_session_idle_while_away(&b, 1), 0, "a consumer has nothing to mark");
	cr_expect_eq(ts_session_take_idle(&b, 0), 0, "a producer not marked idle is not taken over");
	cr_expect_eq(ts_session_idle_while_away(&a, 1), 1);
	cr_expect_eq(ts_session_take_idle(&b, 60ull * 1000000000ull), 0, "idle for less than the idle time");
	cr_expect_eq(ts_session_idle_while_away(&a, 0), 1, "back: our mark is cleared");
	cr_expect_eq(ts_session_take_idle(&b, 0), 0, "back: not taken over");

	ts_session_set_idle(&a, 1); /* its epoch ended */
	uint64_t since = atomic_load(&a.seg->idle_ns);
	struct timespec ms = { 0, 2000000 };
	nanosleep(&ms, NULL);
	cr_expect_eq(ts_session_idle_while_away(&a, 1), 0, "idle already");
	cr_expect_eq(atomic_load(&a.seg->idle_ns), since, "the epoch's end's mark keeps its time");
	cr_expect_eq(ts_session_idle_while_away(&a, 1), 0);
	ts_session_set_idle(&a, 0);

	cr_expect_eq(ts_session_idle_while_away(&a, 1), 1);
	cr_expect_eq(ts_session_take_idle(&b, 0), 1, "away: taken over");
	cr_expect_eq(ts_session_role(&b), TS_ROLE_PRODUCER);
	cr_expect_eq(ts_session_idle_while_away(&b, 1), 1, "the successor, away in turn");
	cr_expect_eq(ts_session_idle_while_away(&a, 0), 0, "our return leaves the successor's mark");
	cr_expect_neq(atomic_load(&a.seg->idle_word), 0u);
	ts_session_leave(&b);
	ts_session_leave(&a);
	cr_expect(!path_exists(path));
}

Test(shm, consumer_leave_keeps_producer)
{
	char name[64], path[TS_PATH_MAX];
	unique_name(name, sizeof(name), path);
	struct ts_session a, b;
	cr_assert_eq(ts_session_join(&a, name, &default_params), 0, "%s", a.why);
	cr_assert_eq(ts_session_join(&b, name, &default_params), 0, "%s", b.why);
	uint64_t w = producer_word(a.seg);
	ts_session_leave(&b);
	cr_expect_eq(producer_word(a.seg), w, "a consumer leaving must not touch the producer word");
	cr_expect_eq(atomic_load(&a.seg->members[1].pid), 0u);
	cr_expect(path_exists(path));
	/* Its slot is reused by the next joiner. */
	cr_assert_eq(ts_session_join(&b, name, &default_params), 0, "%s", b.why);
	cr_expect_eq(b.self, 1);
	ts_session_leave(&b);
	ts_session_leave(&a);
	cr_expect(!path_exists(path));
}

Test(shm, join_reaps_dead_member)
{
	char name[64], path[TS_PATH_MAX];
	unique_name(name, sizeof(name), path);
	struct ts_session a, b;
	cr_assert_eq(ts_session_join(&a, name, &default_params), 0, "%s", a.why);
	/* Slot 5: our pid with another start time (pid reuse), attached to the ring. */
	struct ts_member *m = &a.seg->members[5];
	atomic_store(&m->start_time, a.me.start_time + 1);
	atomic_store(&m->heartbeat_ns, ts_now_ns());
	atomic_store(&m->attach, 3); /* attached, generation 1 */
	atomic_store(&m->pid, a.me.pid);
	int rc = ts_session_join(&b, name, &default_params);
	cr_assert_eq(rc, 0, "%d %s", rc, b.why);
	cr_expect_eq(b.self, 1);
	cr_expect_eq(atomic_load(&m->pid), 0u, "join must free the slot of a dead member");
	uint64_t att = atomic_load(&m->attach);
	cr_expect_eq(att & 1, 0u, "a reaped member must be detached from the ring");
	cr_expect_neq(att >> 1, 1u, "eviction must change the attach generation");
	cr_expect_eq(ts_session_role(&a), TS_ROLE_PRODUCER, "reaping a consumer must not change the producer");
	cr_expect_eq(ts_producer_epoch(producer_word(a.seg)), 1u);
	ts_session_leave(&b);
	ts_session_leave(&a);
	cr_expect(!path_exists(path));
}

Test(shm, joiner_in_dead_producers_slot_gets_new_epoch)
{
	char name[64], path[TS_PATH_MAX];
	unique_name(name, sizeof(name), path);
	struct ts_session a, b;
	cr_assert_eq(ts_session_join(&a, name, &default_params), 0, "%s", a.why);
	cr_assert_eq(ts_session_role(&a), TS_ROLE_PRODUCER);
	/* The producer dies (its pid now names another process). */
	atomic_store(&a.seg->members[0].start_time, a.me.start_time + 1);
	int rc = ts_session_join(&b, name, &default_params);
	cr_assert_eq(rc, 0, "%d %s", rc, b.why);
	cr_expect_eq(b.self, 0, "the dead producer's slot is reused");
	cr_expect_eq(ts_session_role(&b), TS_ROLE_PRODUCER);
	/*
	 * Another process now produces: (epoch, index) must differ from the dead
	 * producer's, or consumers cannot tell that the producer (and its buffers)
	 * changed.
	 */
	cr_expect_eq(ts_producer_epoch(producer_word(b.seg)), 2u,
		     "a new process in the dead producer's slot must get a new epoch");
	cr_expect_eq(atomic_load(&b.seg->counters.takeovers), 1u, "replacing a dead producer is a takeover");
	ts_session_forget(&a); /* it is "dead": it never leaves */
	ts_session_leave(&b);
	cr_expect(!path_exists(path));
}

/* A hand-made segment file whose only member (slot 0) is dead. */
static struct ts_segment *dead_image(const char *name, uint64_t created_unix_ns)
{
	struct ts_ident me;
	cr_assert_eq(ts_self_ident(&me), 0);
	struct ts_segment *img = file_image(name);
	img->st.created_unix_ns = created_unix_ns;
	fix_checksum(img);
	atomic_store(&img->members[0].pid, me.pid);
	atomic_store(&img->members[0].start_time, me.start_time + 1);
	atomic_store(&img->counters.takeovers, 7);
	atomic_store(&img->counters.batches_shared, 1234);
	atomic_store(&img->producer, ts_producer_word(9, 3));
	return img;
}

Test(shm, stale_segment_is_replaced_by_a_fresh_one)
{
	char name[64], path[TS_PATH_MAX];
	unique_name(name, sizeof(name), path);
	struct ts_segment *img = dead_image(name, 1000000000ull); /* 1970 */
	write_file(path, img, seg_bytes(), 0600);
	free(img);
	int old = open(path, O_RDONLY | O_CLOEXEC); /* keeps the old inode from being reused */
	cr_assert(old >= 0);
	struct stat before, after, oldsb;
	cr_assert_eq(fstat(old, &before), 0);
	struct ts_session s;
	int rc = ts_session_join(&s, name, &default_params);
	cr_assert_eq(rc, 0, "%d %s", rc, s.why);
	cr_assert_eq(stat(path, &after), 0);
	cr_expect_neq(after.st_ino, before.st_ino, "a stale segment must be replaced by a new file");
	cr_expect_eq(atomic_load(&s.seg->counters.takeovers), 0u, "the fresh segment must start with zero counters");
	cr_expect_eq(atomic_load(&s.seg->counters.batches_shared), 0u);
	cr_expect_eq(s.self, 0);
	cr_expect_eq(producer_word(s.seg), ts_producer_word(1, 0), "fresh segment: we are producer, epoch 1");
	cr_assert_eq(fstat(old, &oldsb), 0);
	cr_expect_eq(oldsb.st_nlink, 0, "the stale file must be unlinked");
	uint32_t state = 0;
	cr_expect_eq(pread(old, &state, sizeof(state), offsetof(struct ts_segment, state)), (ssize_t)sizeof(state));
	cr_expect_eq(state, TS_SEG_CLOSED, "the stale segment must be marked CLOSED for anyone still mapping it");
	close(old);
	ts_session_leave(&s);
	cr_expect(!path_exists(path));
}

Test(shm, young_segment_without_live_members_is_joined_not_replaced)
{
	/* A creator that has not claimed its slot yet looks like this: keep it. */
	char name[64], path[TS_PATH_MAX];
	unique_name(name, sizeof(name), path);
	struct timespec now;
	clock_gettime(CLOCK_REALTIME, &now);
	struct ts_segment *img = dead_image(name, (uint64_t)now.tv_sec * 1000000000ull + (uint64_t)now.tv_nsec);
	write_file(path, img, seg_bytes(), 0600);
	free(img);
	struct stat before, after;
	cr_assert_eq(stat(path, &before), 0);
	struct ts_session s;
	int rc = ts_session_join(&s, name, &default_params);
	cr_assert_eq(rc, 0, "%d %s", rc, s.why);
	cr_assert_eq(stat(path, &after), 0);
	cr_expect_eq(after.st_ino, before.st_ino, "a segment younger than the timeout must be joined, not replaced");
	cr_expect_eq(atomic_load(&s.seg->counters.batches_shared), 1234u, "counters must be kept");
	cr_expect_eq(s.self, 0, "the dead member's slot is reaped and reused");
	cr_expect_eq(producer_word(s.seg), ts_producer_word(10, 0), "dead producer (slot 3) replaced: epoch 9 -> 10");
	cr_expect_eq(atomic_load(&s.seg->counters.takeovers), 8u);
	ts_session_leave(&s);
	cr_expect(!path_exists(path));
}

Test(shm, refuses_file_with_mode_0644_and_leaves_it_alone)
{
	char name[64], path[TS_PATH_MAX];
	unique_name(name, sizeof(name), path);
	struct ts_segment *img = file_image(name);
	write_file(path, img, seg_bytes(), 0644);
	free(img);
	size_t n0, n1;
	void *before = slurp(path, &n0);
	struct stat sb0, sb1;
	cr_assert_eq(stat(path, &sb0), 0);
	struct ts_session s;
	int rc = ts_session_join(&s, name, &default_params);
	cr_expect_eq(rc, -EACCES, "a 0644 file must be refused with -EACCES, got %d", rc);
	cr_expect(strstr(s.why, "0600") != NULL, "reason must say what is accepted: '%s'", s.why);
	cr_expect_eq(s.seg, NULL);
	cr_expect_eq(s.fd, -1, "a refused join must not keep the file open");
	cr_assert_eq(stat(path, &sb1), 0, "a refused file must not be removed");
	cr_expect_eq(sb1.st_ino, sb0.st_ino);
	cr_expect_eq(sb1.st_mode & 07777, 0644, "mode must be left as it was");
	void *after = slurp(path, &n1);
	cr_expect(n0 == n1 && memcmp(before, after, n0) == 0, "a refused file must not be modified");
	free(before);
	free(after);
}

Test(shm, refuses_bad_magic)
{
	char name[64], path[TS_PATH_MAX];
	unique_name(name, sizeof(name), path);
	struct ts_segment *img = file_image(name);
	img->st.magic = 0x4141414141414141ull;
	write_file(path, img, seg_bytes(), 0600);
	free(img);
	size_t n0, n1;
	void *before = slurp(path, &n0);
	struct ts_session s;
	int rc = ts_session_join(&s, name, &default_params);
	cr_expect_eq(rc, -EBADMSG, "bad magic must be refused with -EBADMSG, got %d", rc);
	cr_expect(strstr(s.why, "magic") != NULL, "reason must mention the magic: '%s'", s.why);
	cr_expect(path_exists(path), "a file we do not understand must not be removed");
	void *after = slurp(path, &n1);
	cr_expect(n0 == n1 && memcmp(before, after, n0) == 0, "a refused file must not be modified");
	free(before);
	free(after);
}

Test(shm, refuses_other_build)
{
	char name[64], path[TS_PATH_MAX];
	unique_name(name, sizeof(name), path);
	struct ts_segment *img = file_image(name);
	img->st.layout_version = TS_LAYOUT_VERSION + 1;
	fix_checksum(img);
	write_file(path, img, seg_bytes(), 0600);
	free(img);
	struct ts_session s;
	int rc = ts_session_join(&s, name, &default_params);
	cr_expect_eq(rc, -EPROTO, "a segment of another build must be refused with -EPROTO, got %d", rc);
	cr_expect(strstr(s.why, "another tsshim build") != NULL, "reason: '%s'", s.why);
	cr_expect(path_exists(path), "another build's live segment must not be removed");
}

Test(shm, refuses_symlink)
{
	char name[64], path[TS_PATH_MAX], target[TS_PATH_MAX];
	unique_name(name, sizeof(name), path);
	snprintf(target, sizeof(target), "/dev/shm/ut-target-%d", (int)getpid());
	remember_path(target);
	unlink(target);
	struct ts_segment *img = file_image(name);
	write_file(target, img, seg_bytes(), 0600);
	free(img);
	cr_assert_eq(symlink(target, path), 0);
	size_t n0, n1;
	void *before = slurp(target, &n0);
	struct ts_session s;
	int rc = ts_session_join(&s, name, &default_params);
	cr_expect_eq(rc, -ELOOP, "a symlink at the session path must be refused (-ELOOP), got %d", rc);
	void *after = slurp(target, &n1);
	cr_expect(n0 == n1 && memcmp(before, after, n0) == 0, "the symlink's target must not be modified");
	free(before);
	free(after);
}

Test(shm, refuses_segment_of_another_owner)
{
	if (geteuid() != 0)
		cr_skip_test("needs root to chown a file to another uid");
	char name[64], path[TS_PATH_MAX];
	unique_name(name, sizeof(name), path);
	struct ts_segment *img = file_image(name);
	write_file(path, img, seg_bytes(), 0600);
	free(img);
	cr_assert_eq(chown(path, 12345, 12345), 0);
	struct ts_session s;
	int rc = ts_session_join(&s, name, &default_params);
	cr_expect_eq(rc, -EACCES, "a file owned by another uid must be refused, got %d", rc);
	struct stat sb;
	cr_assert_eq(stat(path, &sb), 0);
	cr_expect_eq(sb.st_uid, 12345u);
}

Test(shm, invalid_join_arguments)
{
	struct ts_session s;
	struct ts_session_params p = default_params;
	cr_expect_eq(ts_session_join(&s, "a/b", &p), -EINVAL);
	cr_expect_eq(ts_session_join(&s, ".x", &p), -EINVAL);
	cr_expect_eq(ts_session_join(&s, "", &p), -EINVAL);
	char name[64], path[TS_PATH_MAX];
	unique_name(name, sizeof(name), path);
	p.depth = 0;
	cr_expect_eq(ts_session_join(&s, name, &p), -EINVAL, "depth 0");
	p.depth = TS_MAX_DEPTH + 1;
	cr_expect_eq(ts_session_join(&s, name, &p), -EINVAL, "depth 65");
	p.depth = 4;
	p.timeout_ms = 0;
	cr_expect_eq(ts_session_join(&s, name, &p), -EINVAL, "timeout 0");
	cr_expect(!path_exists(path), "a refused join must not create anything");
	cr_expect_eq(s.self, -1);
	cr_expect_eq(s.seg, NULL);
}

Test(shm, session_full_at_64_members)
{
	char name[64], path[TS_PATH_MAX];
	unique_name(name, sizeof(name), path);
	struct ts_session *s = calloc(TS_MAX_MEMBERS + 1, sizeof(*s));
	cr_assert(s != NULL);
	int joined = 0;
	for (unsigned i = 0; i < TS_MAX_MEMBERS; i++) {
		int rc = ts_session_join(&s[i], name, &default_params);
		cr_expect_eq(rc, 0, "join %u: %d %s", i, rc, s[i].why);
		if (rc)
			break;
		cr_expect_eq(s[i].self, (int)i);
		joined++;
	}
	int rc = ts_session_join(&s[TS_MAX_MEMBERS], name, &default_params);
	cr_expect_eq(rc, -EUSERS, "the 65th member must be refused with -EUSERS, got %d", rc);
	cr_expect(strstr(s[TS_MAX_MEMBERS].why, "full") != NULL, "reason: '%s'", s[TS_MAX_MEMBERS].why);
	cr_expect_eq(s[TS_MAX_MEMBERS].seg, NULL);
	cr_expect_eq(s[TS_MAX_MEMBERS].fd, -1);
	for (int i = 0; i < joined; i++)
		ts_session_leave(&s[i]);
	cr_expect(!path_exists(path));
	free(s);
}

Test(shm, remove_if_stale)
{
	char name[64], path[TS_PATH_MAX];
	unique_name(name, sizeof(name), path);
	struct ts_session a;
	cr_assert_eq(ts_session_join(&a, name, &default_params), 0, "%s", a.why);
	cr_expect_eq(ts_session_remove_if_stale(path), 0, "a session with a live member must be left alone");
	cr_expect(path_exists(path));
	cr_expect_eq(atomic_load(&a.seg->state), TS_SEG_OPEN);
	cr_expect_eq(atomic_load(&a.seg->members[0].pid), (uint32_t)getpid());
	/* The member dies. */
	atomic_store(&a.seg->members[0].start_time, a.me.start_time + 1);
	cr_expect_eq(ts_session_remove_if_stale(path), 1, "a session whose members are all dead must be removed");
	cr_expect(!path_exists(path));
	cr_expect_eq(atomic_load(&a.seg->state), TS_SEG_CLOSED);
	ts_session_forget(&a);
	cr_expect_eq(ts_session_remove_if_stale(path), 0, "a path that does not exist: nothing to do");
}

/* Permissions of the mapping that holds addr, from /proc/self/maps. */
static int mapping_perms(const void *addr, char perms[8])
{
	FILE *f = fopen("/proc/self/maps", "r");
	if (!f)
		return -1;
	char line[512];
	int found = -1;
	while (fgets(line, sizeof(line), f)) {
		unsigned long lo, hi;
		char p[8];
		if (sscanf(line, "%lx-%lx %7s", &lo, &hi, p) == 3 && (unsigned long)addr >= lo &&
		    (unsigned long)addr < hi) {
			snprintf(perms, 8, "%s", p);
			found = 0;
			break;
		}
	}
	fclose(f);
	return found;
}

Test(shm, view_open_is_read_only_and_changes_nothing)
{
	char name[64], path[TS_PATH_MAX];
	unique_name(name, sizeof(name), path);
	struct ts_session a;
	cr_assert_eq(ts_session_join(&a, name, &default_params), 0, "%s", a.why);
	size_t n0, n1;
	void *before = slurp(path, &n0);
	struct ts_view v;
	char vwhy[160] = "";
	int rc = ts_view_open(&v, path, vwhy, sizeof(vwhy));
	cr_assert_eq(rc, 0, "view of a valid segment failed: %d %s", rc, vwhy);
	cr_expect_str_eq(v.name, name);
	cr_expect_str_eq(v.path, path);
	cr_expect_eq(v.map_size, seg_bytes());
	cr_expect_eq(v.seg->st.magic, TS_MAGIC);
	cr_expect_eq(atomic_load(&v.seg->members[0].pid), (uint32_t)getpid(), "the view must show the live member");
	cr_expect_eq(ts_producer_index(atomic_load(&v.seg->producer)), 0);
	char perms[8] = "";
	cr_assert_eq(mapping_perms(v.seg, perms), 0, "view mapping not found in /proc/self/maps");
	cr_expect_str_eq(perms, "r--s", "the view must be a shared read-only mapping, got %s", perms);
	ts_view_close(&v);
	cr_expect_eq(v.seg, NULL);
	void *after = slurp(path, &n1);
	cr_expect(n0 == n1 && memcmp(before, after, n0) == 0, "viewing must not change the segment");
	free(before);
	free(after);
	ts_session_leave(&a);
	cr_expect(!path_exists(path));
}

Test(shm, view_open_refuses_truncated_and_missing)
{
	char name[64], path[TS_PATH_MAX];
	unique_name(name, sizeof(name), path);
	struct ts_view v;
	char vwhy[160];
	/* Smaller than the static header. */
	char junk[100];
	memset(junk, 0, sizeof(junk));
	write_file(path, junk, sizeof(junk), 0600);
	memset(vwhy, 0, sizeof(vwhy));
	int rc = ts_view_open(&v, path, vwhy, sizeof(vwhy));
	cr_expect_eq(rc, -EBADMSG, "a 100-byte file: expected -EBADMSG, got %d", rc);
	cr_expect(strstr(vwhy, "truncated") != NULL, "reason: '%s'", vwhy);
	cr_expect_eq(v.seg, NULL);
	unlink(path);
	/* A valid header, but cut to one page. */
	struct ts_segment *img = file_image(name);
	write_file(path, img, 4096, 0600);
	free(img);
	memset(vwhy, 0, sizeof(vwhy));
	rc = ts_view_open(&v, path, vwhy, sizeof(vwhy));
	cr_expect_eq(rc, -EBADMSG, "a segment cut to 4096 bytes: expected -EBADMSG, got %d", rc);
	cr_expect(strstr(vwhy, "truncated") != NULL, "reason: '%s'", vwhy);
	cr_expect_eq(v.seg, NULL);
	unlink(path);
	/* Missing. */
	memset(vwhy, 0, sizeof(vwhy));
	rc = ts_view_open(&v, path, vwhy, sizeof(vwhy));
	cr_expect_eq(rc, -ENOENT, "a missing file: expected -ENOENT, got %d", rc);
	cr_expect(strstr(vwhy, path) != NULL, "reason must name the path: '%s'", vwhy);
}

struct listed {
	const char *want;
	int hits;
	char path[TS_PATH_MAX];
};

static void on_listed(const char *path, const char *name, void *arg)
{
	struct listed *l = arg;
	if (strcmp(name, l->want) == 0) {
		l->hits++;
		snprintf(l->path, sizeof(l->path), "%s", path);
	}
}

Test(shm, session_list_finds_ours)
{
	char name[64], path[TS_PATH_MAX];
	unique_name(name, sizeof(name), path);
	struct ts_session a;
	cr_assert_eq(ts_session_join(&a, name, &default_params), 0, "%s", a.why);
	struct listed l = { .want = name };
	cr_expect_eq(ts_session_list(on_listed, &l), 0);
	cr_expect_eq(l.hits, 1, "our session must be listed exactly once");
	cr_expect_str_eq(l.path, path);
	ts_session_leave(&a);
	l.hits = 0;
	cr_expect_eq(ts_session_list(on_listed, &l), 0);
	cr_expect_eq(l.hits, 0, "a removed session must not be listed");
}

Test(shm, clean_temp_files_removes_only_dead_creators)
{
	char dead[TS_PATH_MAX], alive[TS_PATH_MAX];
	/* 0x3ffffff0 is above any pid_max: its creator cannot be alive. */
	snprintf(dead, sizeof(dead), "/dev/shm/tsshim-tmp.%u.%u.%d", (unsigned)getuid(), 0x3ffffff0u, (int)getpid());
	snprintf(alive, sizeof(alive), "/dev/shm/tsshim-tmp.%u.%u.999", (unsigned)getuid(), (unsigned)getpid());
	remember_path(dead);
	remember_path(alive);
	char x = 0;
	unlink(dead);
	unlink(alive);
	write_file(dead, &x, 1, 0600);
	write_file(alive, &x, 1, 0600);
	int rc = ts_clean_temp_files();
	cr_expect_geq(rc, 1, "at least our dead creator's file must be removed, got %d", rc);
	cr_expect(!path_exists(dead), "a temp file of a dead creator must be removed");
	cr_expect(path_exists(alive), "a temp file of a live creator must be kept");
}

/* ---- heartbeat thread ------------------------------------------------------------------------ */

struct role_log {
	_Atomic int calls;
	_Atomic int first_role;
	_Atomic int last_role;
	_Atomic uint32_t first_epoch;
	_Atomic uint32_t last_epoch;
	_Atomic uint64_t last_ns; /* ts_now_ns() at the last report */
};

static void on_role(enum ts_role role, uint32_t epoch, void *arg)
{
	struct role_log *l = arg;
	if (atomic_fetch_add(&l->calls, 1) == 0) {
		atomic_store(&l->first_role, (int)role);
		atomic_store(&l->first_epoch, epoch);
	}
	atomic_store(&l->last_epoch, epoch);
	atomic_store(&l->last_ns, ts_now_ns());
	atomic_store(&l->last_role, (int)role);
}

Test(heartbeat, takes_over_from_silent_producer)
{
	char name[64], path[TS_PATH_MAX];
	unique_name(name, sizeof(name), path);
	const struct ts_session_params p = { .depth = 4, .timeout_ms = 40 };
	struct ts_session a, b;
	cr_assert_eq(ts_session_join(&a, name, &p), 0, "%s", a.why);
	cr_assert_eq(ts_session_join(&b, name, &p), 0, "%s", b.why);
	cr_assert_eq(ts_session_role(&a), TS_ROLE_PRODUCER);
	struct role_log log = { 0 };
	struct ts_heartbeat hb;
	uint64_t t0 = mono_ms();
	cr_assert_eq(ts_heartbeat_start(&hb, &b, on_role, &log), 0);
	cr_expect_eq(hb.interval_ns, 10000000ull, "interval must be a quarter of the 40 ms timeout");
	cr_expect_geq(atomic_load(&log.calls), 1, "the callback must report the initial role");
	cr_expect_eq(atomic_load(&log.first_role), TS_ROLE_CONSUMER, "initial role: consumer");
	cr_expect_eq(atomic_load(&log.first_epoch), 1u);
	/* a never ticks: after 40 ms it is stale and b's heartbeat takes over. */
	uint64_t deadline = t0 + 3000;
	while (atomic_load(&log.last_role) != TS_ROLE_PRODUCER && mono_ms() < deadline)
		ts_sleep_ns(1000000);
	cr_assert_eq(atomic_load(&log.last_role), TS_ROLE_PRODUCER,
		     "heartbeat did not take over from a silent producer within 3 s");
	cr_expect_eq(atomic_load(&log.last_epoch), 2u, "the callback must report the new epoch");
	uint64_t silent = atomic_load(&log.last_ns) - atomic_load(&a.seg->members[0].heartbeat_ns);
	cr_expect_gt(silent, 40000000ull, "took over after the producer was silent %llu us, not more than 40 ms",
		     (unsigned long long)(silent / 1000));
	cr_expect_eq(ts_session_role(&b), TS_ROLE_PRODUCER);
	cr_expect_eq(ts_session_role(&a), TS_ROLE_CONSUMER, "the silent old producer is a consumer now");
	cr_expect_eq(atomic_load(&b.seg->counters.takeovers), 1u);
	/* The thread keeps b alive well past the timeout. */
	ts_sleep_ns(150000000);
	cr_expect_eq(ts_member_health(b.seg, (unsigned)b.self, ts_now_ns()), TS_MEMBER_LIVE,
		     "the heartbeat thread must keep its member LIVE");
	cr_expect_eq(ts_member_health(a.seg, (unsigned)a.self, ts_now_ns()), TS_MEMBER_STALE);
	uint64_t s0 = mono_ms();
	ts_heartbeat_stop(&hb);
	uint64_t stop_ms = mono_ms() - s0;
	cr_expect_leq(stop_ms, 500, "ts_heartbeat_stop took %llu ms", (unsigned long long)stop_ms);
	cr_expect_eq(hb.running, 0);
	cr_expect_eq(atomic_load(&log.calls), 2, "exactly two role reports: initial consumer, then producer");
	ts_session_leave(&b);
	ts_session_leave(&a);
	cr_expect(!path_exists(path));
}

Test(heartbeat, stop_is_prompt_even_with_a_long_interval)
{
	char name[64], path[TS_PATH_MAX];
	unique_name(name, sizeof(name), path);
	const struct ts_session_params p = { .depth = 4, .timeout_ms = 60000 }; /* 15 s interval */
	struct ts_session a;
	cr_assert_eq(ts_session_join(&a, name, &p), 0, "%s", a.why);
	struct role_log log = { 0 };
	struct ts_heartbeat hb;
	cr_assert_eq(ts_heartbeat_start(&hb, &a, on_role, &log), 0);
	cr_expect_eq(atomic_load(&log.first_role), TS_ROLE_PRODUCER);
	ts_sleep_ns(50000000); /* let the thread go to sleep */
	uint64_t hb0 = atomic_load(&a.seg->members[0].heartbeat_ns);
	cr_expect_neq(hb0, 0u);
	uint64_t s0 = mono_ms();
	ts_heartbeat_stop(&hb);
	uint64_t stop_ms = mono_ms() - s0;
	cr_expect_leq(stop_ms, 1000, "stop must wake the thread, not wait out its 15 s sleep (took %llu ms)",
		      (unsigned long long)stop_ms);
	cr_expect_eq(atomic_load(&log.calls), 1, "no role change: only the initial report");
	ts_session_leave(&a);
	cr_expect(!path_exists(path));
}

/*
 * A fork() right after ts_heartbeat_start must not catch the new thread
 * starting (holding an allocator lock the child would inherit held): start
 * returns once the thread has beaten. With a 15 s interval, only that first
 * beat can have moved the member's heartbeat by the time start returns.
 */
Test(heartbeat, start_returns_once_the_thread_has_beaten)
{
	char name[64], path[TS_PATH_MAX];
	unique_name(name, sizeof(name), path);
	const struct ts_session_params p = { .depth = 4, .timeout_ms = 60000 }; /* 15 s interval */
	struct ts_session a;
	cr_assert_eq(ts_session_join(&a, name, &p), 0, "%s", a.why);
	for (int round = 0; round < 20; round++) {
		uint64_t before = atomic_load(&a.seg->members[a.self].heartbeat_ns);
		ts_sleep_ns(1000000); /* a beat now stamps a later time */
		struct ts_heartbeat hb;
		cr_assert_eq(ts_heartbeat_start(&hb, &a, NULL, NULL), 0);
		uint64_t after = atomic_load(&a.seg->members[a.self].heartbeat_ns);
		cr_expect_gt(after, before, "round %d: start returned before its thread's first beat", round);
		ts_heartbeat_stop(&hb);
	}
	ts_session_leave(&a);
	cr_expect(!path_exists(path));
}

Test(heartbeat, successor_of_leaving_producer_reports_at_once)
{
	char name[64], path[TS_PATH_MAX];
	unique_name(name, sizeof(name), path);
	const struct ts_session_params p = { .depth = 4, .timeout_ms = 60000 }; /* 15 s interval */
	struct ts_session a, b;
	cr_assert_eq(ts_session_join(&a, name, &p), 0, "%s", a.why);
	cr_assert_eq(ts_session_join(&b, name, &p), 0, "%s", b.why);
	struct role_log log = { 0 };
	struct ts_heartbeat hb;
	cr_assert_eq(ts_heartbeat_start(&hb, &b, on_role, &log), 0);
	ts_sleep_ns(50000000);
	cr_expect_eq(atomic_load(&log.calls), 1);
	uint64_t t0 = mono_ms();
	ts_session_leave(&a); /* hands over to b and bumps election_ev */
	while (atomic_load(&log.last_role) != TS_ROLE_PRODUCER && mono_ms() < t0 + 3000)
		ts_sleep_ns(1000000);
	uint64_t took = mono_ms() - t0;
	cr_expect_eq(atomic_load(&log.last_role), TS_ROLE_PRODUCER, "the successor must be told it is producer");
	cr_expect_leq(took, 1000, "the successor must hear of it at once, not after its 15 s beat (%llu ms)",
		      (unsigned long long)took);
	cr_expect_eq(atomic_load(&log.last_epoch), 2u);
	ts_heartbeat_stop(&hb);
	ts_session_leave(&b);
	cr_expect(!path_exists(path));
}

/*
 * The session descriptors a process holds are known to the close hooks
 * (ts_session_holds_fd): a program closing every number from 3 must not
 * close them. Listed while joined, in order within a range, gone at leave.
 */
Test(shm, the_session_descriptors_held_are_known_until_leave)
{
	char n1[64], n2[64], path[TS_PATH_MAX];
	unique_name(n1, sizeof(n1), path);
	unique_name(n2, sizeof(n2), path);
	struct ts_session a, b;
	cr_assert_eq(ts_session_join(&a, n1, &default_params), 0, "%s", a.why);
	cr_assert_eq(ts_session_join(&b, n2, &default_params), 0, "%s", b.why);
	cr_assert(ts_session_holds_fd(a.fd) && ts_session_holds_fd(b.fd));
	int other = dup(0);
	cr_assert_geq(other, 0);
	cr_assert(!ts_session_holds_fd(other) && !ts_session_holds_fd(-1));
	int lo = a.fd < b.fd ? a.fd : b.fd, hi = a.fd < b.fd ? b.fd : a.fd, got[4];
	cr_assert_eq(ts_session_fds_in(0, ~0u, got, 4), 2);
	cr_assert(got[0] == lo && got[1] == hi, "in order: %d %d", got[0], got[1]);
	cr_assert_eq(ts_session_fds_in((unsigned)hi, (unsigned)hi, got, 4), 1);
	cr_assert_eq(got[0], hi);
	cr_assert_eq(ts_session_fds_in((unsigned)hi + 1, ~0u, got, 4), 0);
	int afd = a.fd;
	ts_session_leave(&a);
	cr_assert(!ts_session_holds_fd(afd) || afd == b.fd);
	cr_assert_eq(ts_session_fds_in(0, ~0u, got, 4), 1);
	cr_assert_eq(got[0], b.fd);
	ts_session_leave(&b);
	cr_assert_eq(ts_session_fds_in(0, ~0u, got, 4), 0);
	close(other);
}
