/* SPDX-License-Identifier: MIT */
/*
 * Session segments: creation, validation, membership and election.
 *
 * Concurrency model
 *  - Creation: the segment is built under a temporary name and link()ed to
 *    its final name, so nobody ever maps a half-initialised segment.
 *  - Join/leave/reap: under flock() on the segment file. The kernel drops the
 *    lock when its holder dies; we only ever poll it with a timeout, so a
 *    stopped holder costs a joiner its membership, never a hang. A leaver
 *    that removes the segment unlinks it under the lock; a joiner that got
 *    the lock on an unlinked file (st_nlink == 0) starts over.
 *  - Election and heartbeats: lock-free. The producer word holds (epoch,
 *    member); replacing a dead or silent producer is one CAS from the word
 *    every contender read, so exactly one contender wins.
 */
#include "session.h"
#include "hash.h"
#include "log.h"

#include <dirent.h>
#include <stdarg.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define LOCK_POLL_NS 200000ull /* 0.2 ms between flock attempts */
#define JOIN_ATTEMPTS 32

static size_t segment_bytes(void)
{
	long page = sysconf(_SC_PAGESIZE);
	size_t p = page > 0 ? (size_t)page : 4096;
	return (sizeof(struct ts_segment) + p - 1) / p * p;
}

int ts_session_name_valid(const char *name)
{
	size_t n = 0;
	if (!name || !name[0] || name[0] == '.' || name[0] == '-')
		return 0;
	for (; name[n]; n++) {
		char c = name[n];
		if (n >= TS_NAME_MAX - 1)
			return 0;
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		      c == '.' || c == '_' || c == '-'))
			return 0;
	}
	return 1;
}

int ts_segment_path(char *buf, size_t n, uid_t uid, const char *name)
{
	if (!ts_session_name_valid(name))
		return -EINVAL;
	int len = snprintf(buf, n, "%s/" TS_SEG_PREFIX "%u.%s", ts_shm_dir(), (unsigned)uid, name);
	return len < 0 || (size_t)len >= n ? -ENAMETOOLONG : 0;
}

uint32_t ts_static_checksum(const struct ts_static *st)
{
	return ts_fnv1a32(st, offsetof(struct ts_static, checksum));
}

void ts_segment_init(struct ts_segment *seg, size_t size, const char *name, uid_t uid,
		     const struct ts_session_params *p)
{
	memset(seg, 0, sizeof(*seg));
	struct ts_static *st = &seg->st;
	st->magic = TS_MAGIC;
	st->layout_version = TS_LAYOUT_VERSION;
	st->header_size = sizeof(struct ts_segment);
	st->segment_size = size;
	st->max_members = TS_MAX_MEMBERS;
	st->max_depth = TS_MAX_DEPTH;
	st->max_positions = TS_MAX_POSITIONS;
	st->depth = p->depth;
	st->timeout_ms = p->timeout_ms;
	st->uid = (uint32_t)uid;
	st->created_unix_ns = ts_prim_realtime_ns();
	st->creator_pid = (uint32_t)getpid();
	snprintf(st->name, sizeof(st->name), "%s", name);
	snprintf(st->label, sizeof(st->label), "%s", p->label ? p->label : "");
	st->checksum = ts_static_checksum(st);
	atomic_store_explicit(&seg->state, TS_SEG_OPEN, memory_order_relaxed);
}

/* Record why something was refused; returns err so callers can `return fail(...)`. */
__attribute__((format(printf, 4, 5)))
static int fail(char *why, size_t whylen, int err, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(why, whylen, fmt, ap);
	va_end(ap);
	return err;
}

int ts_segment_validate(const struct ts_segment *seg, size_t size, uid_t uid, char *why, size_t whylen)
{
	const struct ts_static *st = &seg->st;
	if (size < sizeof(*st))
		return fail(why, whylen, -EBADMSG, "truncated: %zu bytes, smaller than its header", size);
	if (st->magic != TS_MAGIC)
		return fail(why, whylen, -EBADMSG, "not a tsshim segment (bad magic)");
	if (st->layout_version != TS_LAYOUT_VERSION || st->header_size != sizeof(*seg) ||
	    st->max_members != TS_MAX_MEMBERS || st->max_depth != TS_MAX_DEPTH ||
	    st->max_positions != TS_MAX_POSITIONS)
		return fail(why, whylen, -EPROTO, "written by another tsshim build (layout %u, %u bytes; this build: layout %u, %zu bytes)",
			   st->layout_version, st->header_size, TS_LAYOUT_VERSION, sizeof(*seg));
	if (st->checksum != ts_static_checksum(st))
		return fail(why, whylen, -EBADMSG, "header checksum mismatch (corrupted)");
	if (size < sizeof(*seg) || st->segment_size > size || st->segment_size < sizeof(*seg))
		return fail(why, whylen, -EBADMSG, "truncated: %zu bytes, header says %llu", size,
			   (unsigned long long)st->segment_size);
	if (st->uid != (uint32_t)uid)
		return fail(why, whylen, -EACCES, "belongs to uid %u", st->uid);
	if (st->depth < 1 || st->depth > TS_MAX_DEPTH || st->timeout_ms < TS_TIMEOUT_MIN_MS ||
	    st->timeout_ms > TS_TIMEOUT_MAX_MS)
		return fail(why, whylen, -EBADMSG, "out-of-range depth %u or timeout %u", st->depth, st->timeout_ms);
	if (memchr(st->name, '\0', sizeof(st->name)) == NULL || !ts_session_name_valid(st->name))
		return fail(why, whylen, -EBADMSG, "invalid session name in header");
	if (memchr(st->label, '\0', sizeof(st->label)) == NULL)
		return fail(why, whylen, -EBADMSG, "unterminated label in header");
	uint32_t state = atomic_load_explicit(&seg->state, memory_order_relaxed);
	if (state != TS_SEG_OPEN && state != TS_SEG_CLOSED)
		return fail(why, whylen, -EBADMSG, "invalid state %u", state);
	return 0;
}

enum ts_member_health ts_member_health(const struct ts_segment *seg, unsigned idx, uint64_t now_ns)
{
	if (idx >= TS_MAX_MEMBERS)
		return TS_MEMBER_DEAD;
	const struct ts_member *m = &seg->members[idx];
	uint32_t pid = atomic_load_explicit(&m->pid, memory_order_acquire);
	if (pid == 0)
		return TS_MEMBER_FREE;
	uint64_t start = atomic_load_explicit(&m->start_time, memory_order_relaxed);
	if (ts_proc_liveness(pid, start) != TS_PROC_ALIVE)
		return TS_MEMBER_DEAD;
	uint64_t hb = atomic_load_explicit(&m->heartbeat_ns, memory_order_relaxed);
	uint64_t limit = ts_timeout_ns(seg);
	if (now_ns > hb && now_ns - hb > limit)
		return TS_MEMBER_STALE;
	return TS_MEMBER_LIVE;
}

static const char *health_name(enum ts_member_health h)
{
	static const char *const names[] = { "free", "live", "stale", "dead" };
	return (unsigned)h < 4 ? names[h] : "?";
}

/* ---- file-level helpers ------------------------------------------------ */

static int lock_timed(int fd, uint64_t timeout_ns)
{
	uint64_t waited = 0;
	for (;;) {
		if (flock(fd, LOCK_EX | LOCK_NB) == 0)
			return 0;
		if (errno != EWOULDBLOCK && errno != EINTR)
			return -errno;
		if (waited >= timeout_ns)
			return -ETIMEDOUT;
		ts_sleep_ns(LOCK_POLL_NS);
		waited += LOCK_POLL_NS;
	}
}

static void unlock(int fd)
{
	flock(fd, LOCK_UN);
}

static int create_segment(const char *path, const char *name, const struct ts_session_params *p)
{
	static _Atomic unsigned counter;
	char tmp[TS_PATH_MAX];
	size_t size = segment_bytes();
	snprintf(tmp, sizeof(tmp), "%s/tsshim-tmp.%u.%u.%u", ts_shm_dir(), (unsigned)getuid(),
		 (unsigned)getpid(), atomic_fetch_add(&counter, 1));
	int fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0)
		return -errno;
	int ret = 0;
	void *map = MAP_FAILED;
	/* umask may have narrowed the mode; reserve the pages now so a full
	 * /dev/shm fails here instead of SIGBUS in the host program later. */
	if (fchmod(fd, 0600) != 0 || (ret = ts_prim_reserve(fd, 0, size)) != 0) {
		ret = ret ? ret : -errno;
		goto fail;
	}
	map = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (map == MAP_FAILED) {
		ret = -errno;
		goto fail;
	}
	ts_segment_init(map, size, name, getuid(), p);
	munmap(map, size);
	if (link(tmp, path) != 0) {
		ret = -errno;
		goto fail;
	}
	unlink(tmp);
	return fd;
fail:
	unlink(tmp);
	close(fd);
	return ret;
}

/*
 * 0 and *map, *size set, or a negative error. The failures return their
 * error themselves, not fail()'s result: the analyser does not follow the
 * variadic fail() and would take 0 for possible.
 */
static int map_checked(int fd, int prot, void **map, size_t *size, char *why, size_t whylen)
{
	struct stat sb;
	if (fstat(fd, &sb) != 0)
		return ts_neg_errno();
	int ret = ts_shm_file_ours(&sb);
	if (ret) {
		fail(why, whylen, ret, "refused: not a 0600 file owned by uid %u", (unsigned)getuid());
		return ret;
	}
	if ((size_t)sb.st_size < sizeof(struct ts_static)) {
		fail(why, whylen, -EBADMSG, "truncated: %lld bytes", (long long)sb.st_size);
		return -EBADMSG;
	}
	void *m = mmap(NULL, (size_t)sb.st_size, prot, MAP_SHARED, fd, 0);
	if (m == MAP_FAILED)
		return ts_neg_errno();
	ret = ts_segment_validate(m, (size_t)sb.st_size, getuid(), why, whylen);
	if (ret) {
		munmap(m, (size_t)sb.st_size);
		return ret;
	}
	*map = m;
	*size = (size_t)sb.st_size;
	return 0;
}

/* ---- membership (callers hold the flock) -------------------------------- */

static void evict_from_ring(struct ts_segment *seg, unsigned idx)
{
	_Atomic uint64_t *attach = &seg->members[idx].attach;
	uint64_t v = atomic_load(attach);
	while ((v & 1) && !atomic_compare_exchange_weak(attach, &v, (v + 2) & ~1ull))
		;
	atomic_fetch_add(&seg->ring.rel_ev, 1);
	ts_futex_wake_all(&seg->ring.rel_ev);
}

/* Free the slots of members whose process is gone; count the rest. */
static unsigned reap_dead(struct ts_segment *seg, uint64_t now)
{
	unsigned alive = 0;
	for (unsigned i = 0; i < TS_MAX_MEMBERS; i++) {
		enum ts_member_health h = ts_member_health(seg, i, now);
		if (h == TS_MEMBER_DEAD) {
			evict_from_ring(seg, i);
			atomic_store_explicit(&seg->members[i].pid, 0, memory_order_release);
		} else if (h != TS_MEMBER_FREE) {
			alive++;
		}
	}
	return alive;
}

static unsigned count_alive(const struct ts_segment *seg, uint64_t now)
{
	unsigned alive = 0;
	for (unsigned i = 0; i < TS_MAX_MEMBERS; i++)
		alive += ts_member_alive(ts_member_health(seg, i, now));
	return alive;
}

static int claim_member(struct ts_segment *seg, const struct ts_ident *me, uint64_t now)
{
	for (unsigned i = 0; i < TS_MAX_MEMBERS; i++) {
		struct ts_member *m = &seg->members[i];
		if (atomic_load_explicit(&m->pid, memory_order_relaxed) != 0)
			continue;
		atomic_store_explicit(&m->start_time, me->start_time, memory_order_relaxed);
		atomic_store_explicit(&m->heartbeat_ns, now, memory_order_relaxed);
		atomic_store_explicit(&m->joined_ns, now, memory_order_relaxed);
		atomic_store_explicit(&m->read_seq, 0, memory_order_relaxed);
		atomic_store_explicit(&m->batches_read, 0, memory_order_relaxed);
		atomic_fetch_and(&m->attach, ~1ull);
		/* release: the identity fields above are visible before the pid. */
		atomic_store_explicit(&m->pid, me->pid, memory_order_release);
		return (int)i;
	}
	return -EUSERS;
}

/*
 * After a CAS of the producer word: wake the heartbeat threads (a successor
 * starts at once) and the readers waiting in the ring, which stop waiting
 * when the new producer is their own member (ring.c, elected_meanwhile).
 */
static void producer_changed(struct ts_segment *seg)
{
	atomic_fetch_add(&seg->election_ev, 1);
	ts_futex_wake_all(&seg->election_ev);
	atomic_fetch_add(&seg->ring.pub_ev, 1);
	ts_futex_wake_all(&seg->ring.pub_ev);
}

/*
 * Take the producer role if the holder in `w` is missing, dead or silent.
 * joining: our slot was just claimed, so a word naming it names the slot's
 * previous, dead occupant, which must be replaced under a new epoch.
 */
static int try_takeover(struct ts_segment *seg, int self, uint64_t w, uint64_t now, int joining)
{
	int idx = ts_producer_index(w);
	if (idx == self && !joining)
		return 1;
	enum ts_member_health h = TS_MEMBER_FREE;
	if (idx != self && idx >= 0) {
		h = ts_member_health(seg, (unsigned)idx, now);
		if (h == TS_MEMBER_LIVE)
			return 0;
	}
	uint64_t next = ts_producer_word(ts_producer_epoch(w) + 1, self);
	/* Every contender CASes from the same observed word: one wins. */
	if (!atomic_compare_exchange_strong(&seg->producer, &w, next))
		return 0;
	if (idx >= 0 && idx != self)
		ts_info("took over from member %d (pid %u): %s, heartbeat %llu ms old", idx,
			atomic_load(&seg->members[idx].pid), health_name(h),
			(unsigned long long)((now - atomic_load(&seg->members[idx].heartbeat_ns)) / 1000000));
	if (idx >= 0)
		atomic_fetch_add(&seg->counters.takeovers, 1);
	producer_changed(seg);
	return 1;
}

/* A live successor for a leaving producer: the longest-standing member. */
static int pick_successor(const struct ts_segment *seg, int self, uint64_t now)
{
	int best = -1;
	uint64_t best_joined = UINT64_MAX;
	for (unsigned i = 0; i < TS_MAX_MEMBERS; i++) {
		if ((int)i == self || ts_member_health(seg, i, now) != TS_MEMBER_LIVE)
			continue;
		uint64_t j = atomic_load_explicit(&seg->members[i].joined_ns, memory_order_relaxed);
		if (j < best_joined) {
			best_joined = j;
			best = (int)i;
		}
	}
	return best;
}

/*
 * The session descriptors this process has open (fd + 1; 0: empty), for
 * ts_session_atfork_child(). A descriptor is listed right after its open and
 * unlisted before its close, so a child never closes a number that was
 * reused for a file not ours; one opened or closed across the fork may be
 * left open in the child, unlocked.
 */
#define SESSION_FDS 128
static _Atomic int session_fds[SESSION_FDS];
static _Atomic unsigned session_fds_top; /* slots at and above it were never used */

static void fd_list(int fd)
{
	for (unsigned i = 0; i < SESSION_FDS; i++) {
		int empty = 0;
		if (atomic_compare_exchange_strong(&session_fds[i], &empty, fd + 1)) {
			unsigned top = atomic_load(&session_fds_top);
			while (top < i + 1 && !atomic_compare_exchange_weak(&session_fds_top, &top, i + 1))
				;
			return;
		}
	}
}

static void fd_unlist(int fd)
{
	for (unsigned i = 0; i < SESSION_FDS; i++) {
		int mine = fd + 1;
		if (atomic_compare_exchange_strong(&session_fds[i], &mine, 0))
			return;
	}
}

int ts_session_holds_fd(int fd)
{
	unsigned top = atomic_load_explicit(&session_fds_top, memory_order_acquire);
	if (fd < 0)
		return 0;
	for (unsigned i = 0; i < top; i++)
		if (atomic_load_explicit(&session_fds[i], memory_order_relaxed) == fd + 1)
			return 1;
	return 0;
}

unsigned ts_session_fds_in(unsigned first, unsigned last, int *out, unsigned max)
{
	unsigned top = atomic_load_explicit(&session_fds_top, memory_order_acquire), n = 0;
	for (unsigned i = 0; i < top && n < max; i++) {
		int v = atomic_load_explicit(&session_fds[i], memory_order_relaxed) - 1;
		if (v >= 0 && (unsigned)v >= first && (unsigned)v <= last) {
			unsigned j = n++;
			for (; j > 0 && out[j - 1] > v; j--) /* kept in order: a handful at most */
				out[j] = out[j - 1];
			out[j] = v;
		}
	}
	return n;
}

void ts_session_atfork_child(void)
{
	for (unsigned i = 0; i < SESSION_FDS; i++) {
		int v = atomic_exchange(&session_fds[i], 0);
		if (v > 0)
			close(v - 1); /* our copy only: the parent's lock stays its own */
	}
}

static void close_map(struct ts_session *s)
{
	if (s->seg)
		munmap(s->seg, s->map_size);
	/* in a forked child the descriptor was closed at the fork (its number may be another file's now) */
	if (s->fd >= 0 && (uint32_t)getpid() == s->me.pid) {
		fd_unlist(s->fd);
		close(s->fd);
	}
	s->seg = NULL;
	s->fd = -1;
	s->self = -1;
}

/*
 * One attempt: open (or create) and lock the segment, then join it.
 * -EAGAIN: the segment went away under us or was stale and removed; retry.
 */
static int join_once(struct ts_session *s, const struct ts_session_params *p, char *why, size_t whylen)
{
	int created = 0;
	int fd = open(s->path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0 && errno == ENOENT) {
		fd = create_segment(s->path, s->name, p);
		created = fd >= 0;
		if (fd == -EEXIST)
			return -EAGAIN;
	} else if (fd < 0) {
		fd = -errno;
	}
	if (fd < 0)
		return fail(why, whylen, fd, "cannot open or create %s: %s", s->path, strerror(-fd));
	fd_list(fd);
	s->fd = fd;
	int ret = lock_timed(fd, (uint64_t)p->timeout_ms * 1000000ull);
	if (ret)
		return fail(why, whylen, ret, "%s is locked by a stopped process", s->path);
	struct stat sb, mb;
	if (fstat(fd, &sb) != 0 || sb.st_nlink == 0)
		return -EAGAIN; /* removed by the last leaver while we waited */
	/*
	 * A mapping holds its open file for as long as it lives, in every
	 * process that inherits it, and with the open file its flock: mapped
	 * from `fd`, the segment of a member killed inside its locked section
	 * would stay locked while a child it forked lives. The mapping comes
	 * from a second open of the same file; the lock's open file is held by
	 * `fd` alone, which a child closes at the fork (ts_session_atfork_child).
	 */
	int mfd = open(s->path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
	if (mfd < 0)
		return errno == ENOENT ? -EAGAIN : fail(why, whylen, ts_neg_errno(), "cannot open %s", s->path);
	if (fstat(mfd, &mb) != 0 || mb.st_ino != sb.st_ino || mb.st_dev != sb.st_dev) {
		close(mfd);
		return -EAGAIN; /* replaced under us */
	}
	void *map;
	ret = map_checked(mfd, PROT_READ | PROT_WRITE, &map, &s->map_size, why, whylen);
	close(mfd);
	if (ret)
		return ret;
	s->seg = map;
	struct ts_segment *seg = s->seg;
	uint64_t now = ts_now_ns();
	unsigned alive = reap_dead(seg, now);
	/* A segment nobody is in yet may be a racing creator's brand-new one. */
	uint64_t age = ts_prim_realtime_ns() - seg->st.created_unix_ns;
	int fresh = created || age < ts_timeout_ns(seg);
	if (atomic_load(&seg->state) != TS_SEG_OPEN || (alive == 0 && !fresh)) {
		/* Stale (every member dead) or abandoned half-way through removal:
		 * remove it and start a fresh one rather than inherit its state. */
		atomic_store(&seg->state, TS_SEG_CLOSED);
		unlink(s->path);
		return -EAGAIN;
	}
	return 0;
}

static int join_existing_or_new(struct ts_session *s, const struct ts_session_params *p)
{
	char why[160] = "";
	for (int attempt = 0; attempt < JOIN_ATTEMPTS; attempt++) {
		int ret = join_once(s, p, why, sizeof(why));
		if (ret == 0)
			return 0;
		if (s->fd >= 0)
			unlock(s->fd);
		close_map(s);
		if (ret != -EAGAIN) {
			snprintf(s->why, sizeof(s->why), "%s", why);
			return ret;
		}
	}
	snprintf(s->why, sizeof(s->why), "%s keeps changing under us", s->path);
	return -EBUSY;
}

int ts_session_join(struct ts_session *s, const char *name, const struct ts_session_params *p)
{
	memset(s, 0, sizeof(*s));
	s->fd = -1;
	s->self = -1;
	if (!ts_session_name_valid(name) || p->depth < 1 || p->depth > TS_MAX_DEPTH ||
	    p->timeout_ms < TS_TIMEOUT_MIN_MS || p->timeout_ms > TS_TIMEOUT_MAX_MS)
		return -EINVAL;
	int ret = ts_self_ident(&s->me);
	if (ret)
		return ret;
	snprintf(s->name, sizeof(s->name), "%s", name);
	ret = ts_segment_path(s->path, sizeof(s->path), getuid(), name);
	if (ret)
		return ret;
	ret = join_existing_or_new(s, p);
	if (ret)
		return ret;
	struct ts_segment *seg = s->seg;
	s->timeout_ns = ts_timeout_ns(seg);
	uint64_t now = ts_now_ns();
	ret = claim_member(seg, &s->me, now);
	if (ret < 0) {
		snprintf(s->why, sizeof(s->why), "session is full (%u members)", TS_MAX_MEMBERS);
		unlock(s->fd);
		close_map(s);
		return ret;
	}
	s->self = ret;
	try_takeover(seg, s->self, atomic_load(&seg->producer), now, 1);
	unlock(s->fd);
	return 0;
}

void ts_session_forget(struct ts_session *s)
{
	close_map(s);
}

void ts_session_leave(struct ts_session *s)
{
	if (!s->seg)
		return;
	if ((uint32_t)getpid() != s->me.pid) { /* a forked child never leaves for its parent */
		ts_session_forget(s);
		return;
	}
	struct ts_segment *seg = s->seg;
	int self = s->self;
	int locked = lock_timed(s->fd, s->timeout_ns) == 0;
	uint64_t now = ts_now_ns();
	if (self >= 0) {
		evict_from_ring(seg, (unsigned)self);
		uint64_t w = atomic_load(&seg->producer);
		if (ts_producer_index(w) == self) {
			/* Hand over at once instead of making consumers wait out the timeout. */
			int next = pick_successor(seg, self, now);
			uint64_t nw = ts_producer_word(ts_producer_epoch(w) + 1, next);
			if (atomic_compare_exchange_strong(&seg->producer, &w, nw)) {
				producer_changed(seg);
			}
		}
		atomic_store_explicit(&seg->members[self].pid, 0, memory_order_release);
	}
	/* Only under the lock may we decide we were the last one out. */
	if (locked && reap_dead(seg, now) == 0) {
		atomic_store(&seg->state, TS_SEG_CLOSED);
		unlink(s->path);
	}
	if (locked)
		unlock(s->fd);
	close_map(s);
}

enum ts_role ts_session_role(const struct ts_session *s)
{
	if (!s->seg || s->self < 0)
		return TS_ROLE_NONE;
	uint64_t w = atomic_load_explicit(&s->seg->producer, memory_order_acquire);
	return ts_producer_index(w) == s->self ? TS_ROLE_PRODUCER : TS_ROLE_CONSUMER;
}

unsigned ts_session_others(const struct ts_session *s)
{
	if (!s->seg || s->self < 0)
		return 0;
	uint64_t now = 0;
	unsigned n = 0;
	/* free slots first, without a look at /proc: a producer alone asks at every batch */
	for (unsigned i = 0; i < TS_MAX_MEMBERS; i++) {
		if ((int)i == s->self || !atomic_load_explicit(&s->seg->members[i].pid, memory_order_acquire))
			continue;
		if (!now)
			now = ts_now_ns();
		n += ts_member_alive(ts_member_health(s->seg, i, now));
	}
	return n;
}

enum ts_role ts_session_tick(struct ts_session *s)
{
	if (!s->seg || s->self < 0)
		return TS_ROLE_NONE;
	struct ts_segment *seg = s->seg;
	uint64_t now = ts_now_ns();
	atomic_store_explicit(&seg->members[s->self].heartbeat_ns, now, memory_order_relaxed);
	uint64_t w = atomic_load(&seg->producer);
	return try_takeover(seg, s->self, w, now, 0) ? TS_ROLE_PRODUCER : TS_ROLE_CONSUMER;
}

void ts_session_set_idle(struct ts_session *s, int idle)
{
	if (!s->seg || s->self < 0)
		return;
	struct ts_segment *seg = s->seg;
	uint64_t w = atomic_load(&seg->producer);
	if (!idle) {
		atomic_store(&seg->idle_word, 0);
		return;
	}
	if (ts_producer_index(w) != s->self)
		return;
	/* the time first: whoever sees our word also sees a time at least this new */
	atomic_store(&seg->idle_ns, ts_now_ns());
	atomic_store(&seg->idle_word, w);
}

int ts_session_idle_while_away(struct ts_session *s, int away)
{
	if (!s->seg || s->self < 0)
		return 0;
	struct ts_segment *seg = s->seg;
	uint64_t w = atomic_load(&seg->producer), iw = atomic_load(&seg->idle_word);
	if (!away) {
		/* ours only: a successor's mark, or the one our epoch's end set, stays */
		return iw && ts_producer_index(iw) == s->self && atomic_compare_exchange_strong(&seg->idle_word, &iw, 0);
	}
	if (ts_producer_index(w) != s->self || iw == w)
		return 0; /* not ours to produce, or idle already (since the epoch's end: its time stands) */
	atomic_store(&seg->idle_ns, ts_now_ns());
	/* a CAS: an end-of-epoch mark set meanwhile by another thread of ours is kept */
	return atomic_compare_exchange_strong(&seg->idle_word, &iw, w);
}

int ts_session_take_idle(struct ts_session *s, uint64_t idle_min_ns)
{
	if (!s->seg || s->self < 0)
		return 0;
	struct ts_segment *seg = s->seg;
	uint64_t w = atomic_load(&seg->producer);
	int idx = ts_producer_index(w);
	if (idx == s->self)
		return 1;
	if (idx >= 0) {
		uint64_t iw = atomic_load(&seg->idle_word);
		uint64_t since = atomic_load(&seg->idle_ns), now = ts_now_ns();
		if (iw != w || now < since || now - since < idle_min_ns)
			return 0;
	}
	/* The same CAS as an election: a producer that woke up meanwhile changed nothing, so
	 * we win; it learns at its next claim (the ring refuses a replaced producer). */
	if (!atomic_compare_exchange_strong(&seg->producer, &w, ts_producer_word(ts_producer_epoch(w) + 1, s->self)))
		return 0;
	if (idx >= 0) {
		ts_info("took over from idle member %d (pid %u)", idx, atomic_load(&seg->members[idx].pid));
		atomic_fetch_add(&seg->counters.takeovers, 1);
	}
	atomic_store(&seg->idle_word, 0);
	producer_changed(seg);
	return 1;
}

/* ---- inspection ---------------------------------------------------------- */

int ts_view_open(struct ts_view *v, const char *path, char *why, size_t whylen)
{
	memset(v, 0, sizeof(*v));
	snprintf(v->path, sizeof(v->path), "%s", path);
	/* O_NONBLOCK: a FIFO planted at the path must not hang the reader. */
	int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0) {
		int e = errno;
		return fail(why, whylen, -e, "cannot open %s: %s", path, strerror(e));
	}
	void *map;
	int ret = map_checked(fd, PROT_READ, &map, &v->map_size, why, whylen);
	close(fd);
	if (ret)
		return ret;
	v->seg = map;
	snprintf(v->name, sizeof(v->name), "%.*s", (int)sizeof(v->seg->st.name), v->seg->st.name); /* bounded: a peer may remove the NUL since */
	return 0;
}

void ts_view_close(struct ts_view *v)
{
	if (v->seg)
		munmap((void *)v->seg, v->map_size);
	v->seg = NULL;
}

int ts_session_list(void (*fn)(const char *path, const char *name, void *arg), void *arg)
{
	char prefix[64], path[TS_PATH_MAX];
	int plen = snprintf(prefix, sizeof(prefix), TS_SEG_PREFIX "%u.", (unsigned)getuid());
	DIR *d = opendir(ts_shm_dir());
	if (!d)
		return -errno;
	struct dirent *e;
	while ((e = readdir(d)) != NULL) {
		if (strncmp(e->d_name, prefix, (size_t)plen) != 0 || !ts_session_name_valid(e->d_name + plen))
			continue;
		snprintf(path, sizeof(path), "%s/%s", ts_shm_dir(), e->d_name);
		fn(path, e->d_name + plen, arg);
	}
	closedir(d);
	return 0;
}

int ts_session_remove_if_stale(const char *path)
{
	char why[160];
	int fd = open(path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return errno == ENOENT ? 0 : -errno;
	int ret = lock_timed(fd, 100000000ull), locked = ret == 0;
	void *map = NULL;
	size_t size = 0;
	struct stat sb;
	if (ret == 0 && (fstat(fd, &sb) != 0 || sb.st_nlink == 0))
		ret = -ENOENT; /* removed meanwhile */
	if (ret == 0)
		ret = map_checked(fd, PROT_READ | PROT_WRITE, &map, &size, why, sizeof(why));
	if (ret == 0) {
		struct ts_segment *seg = map;
		/* Count without reaping: a live session is never written to. */
		if (count_alive(seg, ts_now_ns()) == 0) {
			atomic_store(&seg->state, TS_SEG_CLOSED);
			ret = unlink(path) == 0 ? 1 : -errno;
		}
		munmap(map, size);
	} else if (ret == -ENOENT) {
		ret = 0;
	}
	/* Unlock before closing: a child forked meanwhile shares the open file,
	 * and the lock with it, until it exits; close() alone would leave it held. */
	if (locked)
		unlock(fd);
	close(fd);
	return ret;
}

int ts_clean_temp_files(void)
{
	char prefix[64], path[TS_PATH_MAX];
	int plen = snprintf(prefix, sizeof(prefix), "tsshim-tmp.%u.", (unsigned)getuid());
	int removed = 0;
	DIR *d = opendir(ts_shm_dir());
	if (!d)
		return -errno;
	struct dirent *e;
	while ((e = readdir(d)) != NULL) {
		unsigned pid;
		/* NOLINTNEXTLINE(cert-err34-c): names we wrote with %u: never out of range */
		if (strncmp(e->d_name, prefix, (size_t)plen) != 0 || sscanf(e->d_name + plen, "%u.", &pid) != 1)
			continue;
		uint64_t st;
		if (!ts_proc_gone(ts_prim.proc_start_time(pid, &st)))
			continue; /* its creator is still at work, or cannot be told */
		snprintf(path, sizeof(path), "%s/%s", ts_shm_dir(), e->d_name);
		removed += unlink(path) == 0;
	}
	closedir(d);
	return removed;
}
