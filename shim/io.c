/* SPDX-License-Identifier: MIT */
/*
 * File-read interposition. Every hook calls the real function first and
 * returns exactly what it returned, errno included; tracking happens after,
 * only for read-only regular files in the dataset scope (or, while the
 * scope is still being detected, for JPEG files), and never changes what
 * the program sees.
 *
 * Tracked per descriptor: the file's identity and a hash of the first read
 * at offset 0. Per thread: the last tracked descriptor read. The JPEG layer
 * asks ts_io_provenance() whether the buffer it is about to decode starts
 * with those bytes: if so, the decode is of that file.
 *
 * The descriptor table is a static array (no allocation in any hook, safe
 * after fork); entries are published with a sequence counter so a reader on
 * another thread never mixes two files' fields.
 */
#include "io.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "exact.h"
#include "hash.h"
#include "log.h"
#include "real.h"
#include "scope.h"
#include "session.h"
#include "shim.h"

#define TS_EXPORT __attribute__((visibility("default")))

#define MAX_TRACKED_FD 65536
#define READ_HASH_MAX (16u << 20) /* a file's bytes hashed as read; a longer one is never proven */
#define PATH_SLOTS 256

struct fd_entry {
	_Atomic uint32_t seq;   /* odd while being written */
	uint32_t tracked;
	struct ts_file_id id;
	uint64_t first_len;     /* 0 until the first read at offset 0 */
	uint64_t contig;        /* bytes read so far contiguously from offset 0 */
	struct ts_hash_stream read_hash; /* of those contig bytes, as they were read */
	uint32_t path_slot;     /* index into paths[] + 1, 0 when none */
	uint32_t path_gen;
};

static struct fd_entry fds[MAX_TRACKED_FD];
static _Atomic int fds_top; /* one past the highest descriptor ever tracked */

/* Paths of tracked files, for scope detection and messages (a ring). */
static struct {
	_Atomic uint32_t gen;
	char path[TS_SCOPE_PATH_MAX];
} paths[PATH_SLOTS];
static _Atomic uint32_t path_next;

/*
 * What this thread read last from a dataset file: a copy, because loaders
 * often close the file before they decode the bytes.
 */
static __thread struct {
	int valid;
	int fd;                 /* the descriptor it was read from (perhaps closed since) */
	struct ts_file_id id;
	uint64_t first_len, contig;
	struct ts_hash_stream read_hash;
	uint32_t path_slot, path_gen;
} last_read;

/*
 * The scope: given (TSSHIM_DATA, fixed) or detected. A detected scope keeps
 * widening as decodes arrive from outside it, so it is double-buffered:
 * the detector fills the idle copy, then flips `current`. A reader racing
 * a flip may judge one open by the previous scope; that only decides what
 * is tracked, never what a program reads.
 */
static struct ts_scope scopes[2];
static char scope_texts[2][TS_SCOPE_PATH_MAX * 2];
static _Atomic int current = -1;  /* index into scopes[], -1 while unknown */
static int given;                 /* TSSHIM_DATA */
static struct ts_scope_detector detector;
static _Atomic int detector_busy;

/* ---- helpers ------------------------------------------------------------ */

static int valid_fd(int fd)
{
	return fd >= 0 && fd < MAX_TRACKED_FD;
}

/*
 * The process whose descriptors the table follows. A vfork or posix_spawn
 * child shares our memory until it execs (no fork handler runs there):
 * its close_range, close and dup2 are not ours to follow.
 */
static _Atomic pid_t table_pid;

static int table_foreign(void)
{
	pid_t p = atomic_load_explicit(&table_pid, memory_order_relaxed);
	return p && p != getpid();
}

void ts_io_fork_child(void)
{
	atomic_store(&table_pid, getpid());
	/*
	 * An entry another thread was writing when we forked stays odd in the
	 * child for ever (that thread is not here to finish): every later
	 * update adds 2, so the descriptor would never prove a decode again.
	 * Nobody else runs in the child yet: forget those entries.
	 */
	int top = atomic_load_explicit(&fds_top, memory_order_relaxed);
	for (int fd = 0; fd < top && fd < MAX_TRACKED_FD; fd++) {
		uint32_t seq = atomic_load_explicit(&fds[fd].seq, memory_order_relaxed);
		if (seq & 1) {
			fds[fd].tracked = 0;
			atomic_store_explicit(&fds[fd].seq, seq + 1, memory_order_relaxed);
		}
	}
}

static void note_top(int fd)
{
	int top = atomic_load_explicit(&fds_top, memory_order_relaxed);
	while (top <= fd &&
	       !atomic_compare_exchange_weak_explicit(&fds_top, &top, fd + 1, memory_order_relaxed, memory_order_relaxed))
		;
}

static void entry_clear(int fd)
{
	if (!valid_fd(fd) || !fds[fd].tracked || table_foreign())
		return;
	struct fd_entry *e = &fds[fd];
	atomic_fetch_add_explicit(&e->seq, 1, memory_order_acq_rel);
	e->tracked = 0;
	atomic_fetch_add_explicit(&e->seq, 1, memory_order_release);
}

static void entry_copy(int from, int to)
{
	if (!valid_fd(from) || !valid_fd(to) || from == to || (!fds[from].tracked && !fds[to].tracked) ||
	    table_foreign())
		return;
	struct fd_entry snap;
	uint32_t s;
	int tries = 0;
	do {
		/* Bounded: a writer frozen mid-update (a fork copied it odd) must
		 * not hang dup(); the copy is then simply not followed. */
		if (++tries > 1000) {
			entry_clear(to);
			return;
		}
		s = atomic_load_explicit(&fds[from].seq, memory_order_acquire);
		memcpy(&snap, &fds[from], sizeof(snap));
		atomic_thread_fence(memory_order_acquire);
	} while ((s & 1) || s != atomic_load_explicit(&fds[from].seq, memory_order_relaxed));
	struct fd_entry *e = &fds[to];
	atomic_fetch_add_explicit(&e->seq, 1, memory_order_acq_rel);
	e->tracked = snap.tracked;
	if (snap.tracked)
		note_top(to);
	e->id = snap.id;
	e->first_len = snap.first_len;
	e->contig = snap.contig;
	e->read_hash = snap.read_hash;
	e->path_slot = snap.path_slot;
	e->path_gen = snap.path_gen;
	atomic_fetch_add_explicit(&e->seq, 1, memory_order_release);
}

static uint32_t store_path(const char *abs, uint32_t *gen)
{
	uint32_t i = atomic_fetch_add(&path_next, 1) % PATH_SLOTS;
	*gen = atomic_fetch_add(&paths[i].gen, 2) + 2; /* even: stable */
	snprintf(paths[i].path, sizeof(paths[i].path), "%s", abs);
	return i + 1;
}

/* Absolute, normalised path for (dirfd, path); 0 or -errno. */
static int absolute_path(int dirfd, const char *path, char *out, size_t outlen)
{
	char base[TS_SCOPE_PATH_MAX];
	if (path[0] == '/')
		return ts_path_normalize(NULL, path, out, outlen);
	if (dirfd == AT_FDCWD) {
		if (!getcwd(base, sizeof(base)))
			return -errno;
	} else {
		char link[32];
		snprintf(link, sizeof(link), "/proc/self/fd/%d", dirfd);
		ssize_t n = readlink(link, base, sizeof(base) - 1);
		if (n <= 0)
			return -EINVAL;
		base[n] = '\0';
	}
	return ts_path_normalize(base, path, out, outlen);
}

static const struct ts_scope *scope_now(void)
{
	int i = atomic_load_explicit(&current, memory_order_acquire);
	return i < 0 ? NULL : &scopes[i];
}

/* Should a file at this path be tracked? Given scope: exactly it. Else
 * every JPEG (decodes prove what they are) and the detected scope. */
static int wanted(const char *abs)
{
	const struct ts_scope *s = scope_now();
	if (given)
		return ts_scope_contains(s, abs);
	return ts_path_is_jpeg(abs) || (s && ts_scope_contains(s, abs));
}

/* ---- the tracking half of every hook -------------------------------------- */

static struct ts_file_id file_id_of(const struct stat *sb)
{
	return (struct ts_file_id){ (uint64_t)sb->st_dev, (uint64_t)sb->st_ino, (uint64_t)sb->st_size,
				    (uint64_t)sb->st_mtim.tv_sec * 1000000000ull + (uint64_t)sb->st_mtim.tv_nsec,
				    (uint64_t)sb->st_ctim.tv_sec * 1000000000ull + (uint64_t)sb->st_ctim.tv_nsec };
}

static void track_open(int dirfd, const char *path, int flags, int fd)
{
	if (fd < 0 || !valid_fd(fd))
		return;
	/* A fresh descriptor: whatever we knew of this number (closed behind our
	 * back by close_range, freopen, a raw syscall) is stale. */
	if (fds[fd].tracked) {
		int saved = errno;
		entry_clear(fd);
		errno = saved;
	}
	if ((flags & O_ACCMODE) != O_RDONLY || !path || !ts_hook_enter())
		return;
	/* The common case, no scope and not a JPEG, costs a suffix compare. */
	if (!scope_now() && !ts_path_is_jpeg(path)) {
		ts_hook_leave();
		return;
	}
	int saved = errno;
	char abs[TS_SCOPE_PATH_MAX];
	struct stat sb;
	if (absolute_path(dirfd, path, abs, sizeof(abs)) == 0 && wanted(abs) && !table_foreign() &&
	    syscall(SYS_fstat, fd, &sb) == 0 && S_ISREG(sb.st_mode)) {
		struct fd_entry *e = &fds[fd];
		atomic_fetch_add_explicit(&e->seq, 1, memory_order_acq_rel);
		e->id = file_id_of(&sb);
		e->first_len = 0;
		e->contig = 0;
		e->path_slot = store_path(abs, &e->path_gen);
		e->tracked = 1;
		note_top(fd);
		atomic_fetch_add_explicit(&e->seq, 1, memory_order_release);
	}
	errno = saved;
	ts_hook_leave();
}

/*
 * Is descriptor fd still the file it was opened as? Asked at its first read:
 * freopen, close_range, fcntl(F_DUPFD) and raw syscalls close and reuse a
 * number without a hook of ours, and the bytes read would be proven under
 * the old file's identity (a later decode of that file served another's
 * pixels). A file changed since its open is not it either; asked again at
 * every later read that is hashed, for a rewrite while it is read.
 */
static int still_the_file(int fd, const struct ts_file_id *id)
{
	struct stat sb;
	if (syscall(SYS_fstat, fd, &sb) != 0)
		return 0;
	struct ts_file_id now = file_id_of(&sb);
	return memcmp(&now, id, sizeof(now)) == 0;
}

/* `off` is where the read started; -1: ask the kernel (read(2)); < -1: unknown. */
static void track_read(int fd, const void *buf, ssize_t n, off_t off)
{
	if (n <= 0 || !valid_fd(fd) || !fds[fd].tracked || !ts_hook_enter())
		return;
	int saved = errno;
	struct fd_entry *e = &fds[fd];
	if (off == -1) { /* where this read started: one lseek, dataset files only */
		off_t now = (off_t)syscall(SYS_lseek, fd, 0, SEEK_CUR);
		off = now >= n ? now - n : -2;
	}
	/*
	 * The bytes read are the file's as it is now: checked at the first read
	 * (the number reused behind our back: another file now) and at every
	 * later one that is hashed (rewritten in place since: its bytes are no
	 * longer one version of the file, and a decode of them is not the one
	 * its identity names). A write changes mtime and ctime before any byte,
	 * so a read that saw a new byte is followed by a stat that sees them.
	 */
	int first = off == 0 && e->first_len == 0;
	/* this read goes into the hash: every byte read in order from the start, so
	 * that a buffer later decoded is proven whole; not past READ_HASH_MAX (a
	 * large file in the scope that is no JPEG must not cost a hash of every read) */
	int hashing = (first || (off > 0 && (uint64_t)off == e->contig && e->read_hash.len == e->contig)) &&
		      (uint64_t)n <= READ_HASH_MAX - e->contig;
	if ((first || hashing) && !still_the_file(fd, &e->id)) {
		entry_clear(fd);
		if (last_read.fd == fd)
			last_read.valid = 0;
		errno = saved;
		ts_hook_leave();
		return;
	}
	if (off >= 0 && (uint64_t)off == e->contig) {
		atomic_fetch_add_explicit(&e->seq, 1, memory_order_acq_rel);
		if (first) {
			ts_hash_stream_init(&e->read_hash);
			e->first_len = (uint64_t)n;
		}
		if (hashing)
			ts_hash_stream_add(&e->read_hash, buf, (size_t)n);
		e->contig += (uint64_t)n;
		atomic_fetch_add_explicit(&e->seq, 1, memory_order_release);
	}
	struct fd_entry snap;
	uint32_t s = atomic_load_explicit(&e->seq, memory_order_acquire);
	memcpy(&snap, e, sizeof(snap));
	atomic_thread_fence(memory_order_acquire);
	if (!(s & 1) && s == atomic_load_explicit(&e->seq, memory_order_relaxed) && snap.first_len) {
		last_read.fd = fd;
		last_read.id = snap.id;
		last_read.first_len = snap.first_len;
		last_read.contig = snap.contig;
		last_read.read_hash = snap.read_hash;
		last_read.path_slot = snap.path_slot;
		last_read.path_gen = snap.path_gen;
		last_read.valid = 1;
	}
	errno = saved;
	ts_hook_leave();
}

static void track_readv(int fd, const struct iovec *iov, int cnt, ssize_t n, off_t off)
{
	/* Only the first buffer is hashed: enough to recognise the file. */
	if (n <= 0 || cnt <= 0 || iov[0].iov_len == 0 || !valid_fd(fd) || !fds[fd].tracked)
		return;
	if (off == -1 && fds[fd].first_len == 0) { /* where the whole readv started */
		int saved = errno;
		off_t now = (off_t)syscall(SYS_lseek, fd, 0, SEEK_CUR);
		off = now >= n ? now - n : -2;
		errno = saved;
	}
	ssize_t first = (size_t)n < iov[0].iov_len ? n : (ssize_t)iov[0].iov_len;
	track_read(fd, iov[0].iov_base, first, off == -1 ? -2 : off);
}

/* ---- provenance and scope --------------------------------------------------- */

/*
 * A buffer that holds only the start of the file is the file being fed to
 * the decoder as it is read (Pillow) only while the file is still open
 * there, where the buffer ends, and only when the decoder's source can ask
 * for more (not libjpeg's memory source): more is coming. A loader that
 * read a prefix and stopped (a capped read, a file cut short) decodes just
 * that, a partial image with warnings; the whole image from the cache is
 * not it.
 */
static int still_reading(const struct ts_file_id *id, int fd, uint64_t len)
{
	if (!valid_fd(fd) || !fds[fd].tracked || memcmp(&fds[fd].id, id, sizeof(*id)) != 0)
		return 0;
	int saved = errno;
	off_t at = (off_t)syscall(SYS_lseek, fd, 0, SEEK_CUR);
	errno = saved;
	return at >= 0 && (uint64_t)at == len;
}

int ts_io_provenance(const void *buf, size_t len, int source_grows, struct ts_file_id *id, char *path,
		     size_t pathlen)
{
	if (!last_read.valid || !buf || len == 0)
		return 0;
	/*
	 * The buffer must be the stream as read: exactly the bytes read so far
	 * from offset 0, in order. Either that is the whole file (read, then
	 * decode from memory), or the file is being fed to the decoder as it is
	 * read (Pillow). A buffer cut short is neither, and decodes for real.
	 */
	if (len != last_read.contig || len != last_read.read_hash.len)
		return 0; /* not what was read, or more than was hashed */
	if (len < last_read.id.size && (!source_grows || !still_reading(&last_read.id, last_read.fd, len)))
		return 0;
	/* ...and it holds exactly the bytes this thread read, every one of
	 * them (hashed as they were read): it is that file's content. */
	if (ts_hash_bulk(buf, len) != ts_hash_stream_value(&last_read.read_hash))
		return 0;
	*id = last_read.id;
	if (path && pathlen) {
		path[0] = '\0';
		uint32_t i = last_read.path_slot, gen = last_read.path_gen;
		if (i && i <= PATH_SLOTS && atomic_load(&paths[i - 1].gen) == gen) {
			snprintf(path, pathlen, "%s", paths[i - 1].path);
			if (atomic_load(&paths[i - 1].gen) != gen)
				path[0] = '\0'; /* recycled while we copied */
		}
	}
	return 1;
}

static void format_scope(int i)
{
	size_t off = 0;
	scope_texts[i][0] = '\0';
	for (uint32_t r = 0; r < scopes[i].n && off < sizeof(scope_texts[i]); r++)
		off += (size_t)snprintf(scope_texts[i] + off, sizeof(scope_texts[i]) - off, "%s%s", r ? ":" : "",
					scopes[i].root[r]);
}

/* Install `root` as the detected scope (caller holds detector_busy). */
static int publish_detected(const char *root)
{
	int next = atomic_load(&current) == 0 ? 1 : 0;
	if (ts_scope_set(&scopes[next], &root, 1) != 0)
		return 0;
	format_scope(next);
	int first = atomic_load(&current) < 0;
	atomic_store_explicit(&current, next, memory_order_release);
	ts_exact_note_scope(scope_texts[next]);
	if (first)
		ts_info("dataset scope detected: %s (from %u decoded files)", scope_texts[next], detector.files);
	else
		ts_info("dataset scope widened to %s", scope_texts[next]);
	return first;
}

void ts_io_decoded(const char *path)
{
	const struct ts_scope *s = scope_now();
	if (given || !path || path[0] != '/' || (s && ts_scope_contains(s, path)))
		return;
	int expected = 0;
	if (!atomic_compare_exchange_strong(&detector_busy, &expected, 1))
		return; /* another thread is at it; one sample fewer does not matter */
	int first = 0;
	if (ts_scope_detect_add(&detector, path) == 1)
		first = publish_detected(detector.common);
	atomic_store(&detector_busy, 0);
	if (first)
		ts_shim_scope_known();
}

unsigned ts_io_scope_roots(const char **roots, unsigned max)
{
	const struct ts_scope *s = scope_now();
	if (!s)
		return 0;
	unsigned n = s->n < max ? s->n : max;
	for (unsigned i = 0; i < n; i++)
		roots[i] = s->root[i];
	return n;
}

const char *ts_io_scope_string(void)
{
	int i = atomic_load_explicit(&current, memory_order_acquire);
	return i < 0 ? "" : scope_texts[i];
}

void ts_io_init(void)
{
	atomic_store(&table_pid, getpid());
	if (ts_cfg.ndata == 0)
		return;
	if (ts_scope_set(&scopes[0], ts_cfg.data, ts_cfg.ndata) == 0) {
		format_scope(0);
		given = 1;
		atomic_store(&current, 0);
		ts_info("dataset scope: %s (TSSHIM_DATA)", scope_texts[0]);
	}
}

/* ---- hooks ------------------------------------------------------------------ */

/* glibc's fortified entry points have no public prototypes. */
int __open_2(const char *path, int flags);
int __open64_2(const char *path, int flags);
int __openat_2(int dirfd, const char *path, int flags);
ssize_t __read_chk(int fd, void *buf, size_t count, size_t buflen);
ssize_t __pread64_chk(int fd, void *buf, size_t count, off_t off, size_t buflen);

#define OPEN_MODE(flags, mode)                                  \
	do {                                                    \
		if (__OPEN_NEEDS_MODE(flags)) {                 \
			va_list ap;                             \
			va_start(ap, flags);                    \
			(mode) = va_arg(ap, mode_t);            \
			va_end(ap);                             \
		}                                               \
	} while (0)

/* Resolve the real function or fail the call the way libc would. */
#define REAL_OR_FAIL(name, failval)                  \
	do {                                         \
		if (!TS_RESOLVE(name)) {             \
			errno = ENOSYS;              \
			return failval;              \
		}                                    \
	} while (0)

TS_REAL(int, open, (const char *, int, ...));
TS_EXPORT int open(const char *path, int flags, ...)
{
	mode_t mode = 0;
	OPEN_MODE(flags, mode);
	REAL_OR_FAIL(open, -1);
	int fd = real_open(path, flags, mode);
	track_open(AT_FDCWD, path, flags, fd);
	return fd;
}

TS_REAL(int, open64, (const char *, int, ...));
TS_EXPORT int open64(const char *path, int flags, ...)
{
	mode_t mode = 0;
	OPEN_MODE(flags, mode);
	REAL_OR_FAIL(open64, -1);
	int fd = real_open64(path, flags, mode);
	track_open(AT_FDCWD, path, flags, fd);
	return fd;
}

TS_REAL(int, openat, (int, const char *, int, ...));
TS_EXPORT int openat(int dirfd, const char *path, int flags, ...)
{
	mode_t mode = 0;
	OPEN_MODE(flags, mode);
	REAL_OR_FAIL(openat, -1);
	int fd = real_openat(dirfd, path, flags, mode);
	track_open(dirfd, path, flags, fd);
	return fd;
}

TS_REAL(int, openat64, (int, const char *, int, ...));
TS_EXPORT int openat64(int dirfd, const char *path, int flags, ...)
{
	mode_t mode = 0;
	OPEN_MODE(flags, mode);
	REAL_OR_FAIL(openat64, -1);
	int fd = real_openat64(dirfd, path, flags, mode);
	track_open(dirfd, path, flags, fd);
	return fd;
}

/* Fortified variants (_FORTIFY_SOURCE): no mode argument. */
TS_REAL(int, __open_2, (const char *, int));
TS_EXPORT int __open_2(const char *path, int flags)
{
	REAL_OR_FAIL(__open_2, -1);
	int fd = real___open_2(path, flags);
	track_open(AT_FDCWD, path, flags, fd);
	return fd;
}

TS_REAL(int, __open64_2, (const char *, int));
TS_EXPORT int __open64_2(const char *path, int flags)
{
	REAL_OR_FAIL(__open64_2, -1);
	int fd = real___open64_2(path, flags);
	track_open(AT_FDCWD, path, flags, fd);
	return fd;
}

TS_REAL(int, __openat_2, (int, const char *, int));
TS_EXPORT int __openat_2(int dirfd, const char *path, int flags)
{
	REAL_OR_FAIL(__openat_2, -1);
	int fd = real___openat_2(dirfd, path, flags);
	track_open(dirfd, path, flags, fd);
	return fd;
}

TS_REAL(ssize_t, read, (int, void *, size_t));
TS_EXPORT ssize_t read(int fd, void *buf, size_t count)
{
	REAL_OR_FAIL(read, -1);
	ssize_t n = real_read(fd, buf, count);
	track_read(fd, buf, n, -1);
	return n;
}

TS_REAL(ssize_t, __read_chk, (int, void *, size_t, size_t));
TS_EXPORT ssize_t __read_chk(int fd, void *buf, size_t count, size_t buflen)
{
	REAL_OR_FAIL(__read_chk, -1);
	ssize_t n = real___read_chk(fd, buf, count, buflen);
	track_read(fd, buf, n, -1);
	return n;
}

TS_REAL(ssize_t, pread, (int, void *, size_t, off_t));
TS_EXPORT ssize_t pread(int fd, void *buf, size_t count, off_t off)
{
	REAL_OR_FAIL(pread, -1);
	ssize_t n = real_pread(fd, buf, count, off);
	track_read(fd, buf, n, off);
	return n;
}

TS_REAL(ssize_t, pread64, (int, void *, size_t, off_t));
TS_EXPORT ssize_t pread64(int fd, void *buf, size_t count, off_t off)
{
	REAL_OR_FAIL(pread64, -1);
	ssize_t n = real_pread64(fd, buf, count, off);
	track_read(fd, buf, n, off);
	return n;
}

TS_REAL(ssize_t, __pread64_chk, (int, void *, size_t, off_t, size_t));
TS_EXPORT ssize_t __pread64_chk(int fd, void *buf, size_t count, off_t off, size_t buflen)
{
	REAL_OR_FAIL(__pread64_chk, -1);
	ssize_t n = real___pread64_chk(fd, buf, count, off, buflen);
	track_read(fd, buf, n, off);
	return n;
}

TS_REAL(ssize_t, readv, (int, const struct iovec *, int));
TS_EXPORT ssize_t readv(int fd, const struct iovec *iov, int cnt)
{
	REAL_OR_FAIL(readv, -1);
	ssize_t n = real_readv(fd, iov, cnt);
	track_readv(fd, iov, cnt, n, -1);
	return n;
}

TS_REAL(ssize_t, preadv, (int, const struct iovec *, int, off_t));
TS_EXPORT ssize_t preadv(int fd, const struct iovec *iov, int cnt, off_t off)
{
	REAL_OR_FAIL(preadv, -1);
	ssize_t n = real_preadv(fd, iov, cnt, off);
	track_readv(fd, iov, cnt, n, off);
	return n;
}

TS_REAL(int, close, (int));
TS_EXPORT int close(int fd)
{
	REAL_OR_FAIL(close, -1);
	if (ts_session_holds_fd(fd)) { /* not the program's to close: not open, as far as it knows */
		errno = EBADF;
		return -1;
	}
	/* Forget first: once closed, another thread may get this number back. */
	entry_clear(fd);
	return real_close(fd);
}

TS_REAL(int, dup, (int));
TS_EXPORT int dup(int fd)
{
	REAL_OR_FAIL(dup, -1);
	int nfd = real_dup(fd);
	if (nfd >= 0)
		entry_copy(fd, nfd);
	return nfd;
}

TS_REAL(int, dup2, (int, int));
TS_EXPORT int dup2(int fd, int nfd)
{
	REAL_OR_FAIL(dup2, -1);
	int saved = errno;
	if (fd != nfd)
		entry_clear(nfd);
	errno = saved;
	int r = real_dup2(fd, nfd);
	if (r >= 0)
		entry_copy(fd, r);
	return r;
}

TS_REAL(int, dup3, (int, int, int));
TS_EXPORT int dup3(int fd, int nfd, int flags)
{
	REAL_OR_FAIL(dup3, -1);
	if (fd != nfd)
		entry_clear(nfd);
	int r = real_dup3(fd, nfd, flags);
	if (r >= 0)
		entry_copy(fd, r);
	return r;
}

/* stdio: fread never reaches read(), so follow FILE streams too. */
TS_REAL(FILE *, fopen, (const char *, const char *));
TS_EXPORT FILE *fopen(const char *path, const char *mode)
{
	REAL_OR_FAIL(fopen, NULL);
	FILE *f = real_fopen(path, mode);
	if (f && mode && mode[0] == 'r' && !strchr(mode, '+'))
		track_open(AT_FDCWD, path, O_RDONLY, fileno(f));
	return f;
}

TS_REAL(FILE *, fopen64, (const char *, const char *));
TS_EXPORT FILE *fopen64(const char *path, const char *mode)
{
	REAL_OR_FAIL(fopen64, NULL);
	FILE *f = real_fopen64(path, mode);
	if (f && mode && mode[0] == 'r' && !strchr(mode, '+'))
		track_open(AT_FDCWD, path, O_RDONLY, fileno(f));
	return f;
}

TS_REAL(size_t, fread, (void *, size_t, size_t, FILE *));
TS_EXPORT size_t fread(void *buf, size_t size, size_t n, FILE *f)
{
	REAL_OR_FAIL(fread, 0);
	int saved = errno;
	/* ftell before the read tells whether this read starts the file. */
	int fd = f ? fileno(f) : -1;
	long start = valid_fd(fd) && fds[fd].tracked && fds[fd].first_len == 0 ? ftell(f) : -1;
	errno = saved;
	size_t got = real_fread(buf, size, n, f);
	if (valid_fd(fd) && fds[fd].tracked && got > 0)
		track_read(fd, buf, (ssize_t)(got * size), start == 0 ? 0 : -2);
	return got;
}

TS_REAL(int, fclose, (FILE *));
TS_EXPORT int fclose(FILE *f)
{
	REAL_OR_FAIL(fclose, EOF);
	if (f) {
		/* fileno() sets EBADF for a stream without a descriptor (fmemopen). */
		int saved = errno;
		entry_clear(fileno(f));
		errno = saved;
	}
	return real_fclose(f);
}

/* freopen closes the stream's descriptor and opens the new file, often under
 * the same number, with no call of ours in between. */
static FILE *reopened(FILE *nf, const char *path, const char *mode)
{
	if (nf && path && mode && mode[0] == 'r' && !strchr(mode, '+'))
		track_open(AT_FDCWD, path, O_RDONLY, fileno(nf));
	return nf;
}

static void forget_stream(FILE *f)
{
	int saved = errno;
	entry_clear(f ? fileno(f) : -1);
	errno = saved;
}

TS_REAL(FILE *, freopen, (const char *, const char *, FILE *));
TS_EXPORT FILE *freopen(const char *path, const char *mode, FILE *f)
{
	REAL_OR_FAIL(freopen, NULL);
	forget_stream(f);
	return reopened(real_freopen(path, mode, f), path, mode);
}

TS_REAL(FILE *, freopen64, (const char *, const char *, FILE *));
TS_EXPORT FILE *freopen64(const char *path, const char *mode, FILE *f)
{
	REAL_OR_FAIL(freopen64, NULL);
	forget_stream(f);
	return reopened(real_freopen64(path, mode, f), path, mode);
}

static void forget_range(unsigned first, unsigned last)
{
	for (unsigned fd = first; fd <= last && fd < MAX_TRACKED_FD; fd++)
		entry_clear((int)fd);
}

/*
 * Before the host closes descriptors it does not know: our own threads'
 * (the prefetch's) must be let go first. Not in a vfork child (it shares
 * our memory and its close_range is not ours to follow, see
 * table_foreign()), nor within a hook of ours. errno is the caller's.
 */
static void closing_range(unsigned first, unsigned last)
{
	if (first > last || table_foreign() || !ts_hook_enter())
		return;
	int saved = errno;
	ts_shim_fds_closing();
	errno = saved;
	ts_hook_leave();
}

TS_REAL(int, close_range, (unsigned, unsigned, int));

/*
 * close_range of [first, last] but our session descriptors (the program
 * closes every number it did not open; see ts_session_holds_fd): the gaps
 * between them. -1 with errno at the first that fails; 1 when there was
 * none of ours in the range (nothing done).
 */
static int close_range_around_ours(unsigned first, unsigned last, int flags)
{
	int ours[128];
	unsigned n = ts_session_fds_in(first, last, ours, sizeof(ours) / sizeof(ours[0]));
	if (!n)
		return 1;
	/* 64 bits: the last gap of [first, ~0u], closefrom's, ends past ~0u */
	uint64_t from = first;
	for (unsigned i = 0; i <= n; i++) {
		uint64_t to = i < n ? (uint64_t)ours[i] : (uint64_t)last + 1; /* the gap [from, to) */
		if (to > from && real_close_range((unsigned)from, (unsigned)(to - 1), flags) != 0)
			return -1;
		if (i < n)
			from = (uint64_t)ours[i] + 1;
	}
	return 0;
}

/* What close_range refuses (EINVAL) closes nothing: the real call answers it. */
static int close_range_valid(unsigned first, unsigned last, int flags)
{
	return first <= last && !((unsigned)flags & ~(unsigned)(CLOSE_RANGE_UNSHARE | CLOSE_RANGE_CLOEXEC));
}

TS_EXPORT int close_range(unsigned first, unsigned last, int flags)
{
	REAL_OR_FAIL(close_range, -1);
	if (close_range_valid(first, last, flags) && !(flags & CLOSE_RANGE_CLOEXEC)) {
		/* (CLOEXEC closes nothing until exec) */
		closing_range(first, last);
		forget_range(first, last);
		int r = close_range_around_ours(first, last, flags); /* none of ours in an empty range */
		if (r <= 0)
			return r;
	}
	return real_close_range(first, last, flags);
}

TS_REAL(void, closefrom, (int));
TS_EXPORT void closefrom(int lowfd)
{
	if (!TS_RESOLVE(closefrom))
		return;
	unsigned low = lowfd < 0 ? 0 : (unsigned)lowfd;
	closing_range(low, ~0u);
	forget_range(low, ~0u);
	int saved = errno;
	/* around ours when close_range is there (Linux 5.9); else all, as before */
	if (TS_RESOLVE(close_range) && close_range_around_ours(low, ~0u, 0) == 0) {
		errno = saved;
		return;
	}
	errno = saved;
	real_closefrom(lowfd);
}
