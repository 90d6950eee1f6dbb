/* SPDX-License-Identifier: MIT */
/*
 * Prefetch (see prefetch.h). Three parts:
 *
 *  - The walk yields candidate files one at a time, directory by directory:
 *    a level holds one batch of names (at most PF_BATCH_BYTES), sorted, and
 *    an open directory stream; at most PF_MAX_LEVELS levels. Memory is
 *    bounded by those two, not by the size of the tree.
 *  - The io_uring engine keeps queue_depth reads in flight. Slot i owns
 *    buffer i of the pool for the whole run; a slot names its file, offset
 *    and length, and its index is the request's user data, so completions
 *    may arrive in any order. A file stays open while any of its chunks is
 *    in flight and is closed by whichever completion comes last.
 *  - The plain engine does the same walk with pread into one buffer.
 *
 * The buffers are written by the kernel until a request completes, so the
 * pool is unmapped only once nothing is in flight. If reads do not drain
 * in time after a stop (storage that stopped answering), the pool is left
 * mapped: a bounded leak is better than the kernel writing into memory
 * that has been handed out again.
 *
 * Descriptors. The background thread first gives itself an empty
 * descriptor table of its own (close_range(CLOSE_RANGE_UNSHARE), 5.9+):
 * its files, directories and ring then never take a number from the host,
 * never reach a forked child, and a host that sanitises its table
 * (close_range(3, ~0U), closefrom) cannot close them, nor can we ever
 * close a number the host reused. Where that is not possible (an older
 * kernel, a seccomp filter, or the synchronous ts_prefetch_run() on the
 * caller's thread) we share the host's table and keep out of its way:
 * numbers near RLIMIT_NOFILE are left to the host (fds are allocated
 * lowest-first, so a high number means a full table), fewer files are open
 * at once, and the shim stops us before the host's close_range (see
 * ts_prefetch_shares_fds()). A submit that fails because the ring's number
 * now names another file marks every number of ours as lost: none is
 * closed or used again.
 *
 * Seccomp. A filter may kill the process on io_uring_setup (systemd's
 * SystemCallFilter= without SystemCallErrorNumber=); whether it would
 * cannot be asked without the risk. Under any filter we use plain reads
 * (and the shared table: close_range is no safer to try).
 */
#include "prefetch.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "log.h"
#include "prim.h"

#define PF_MAX_LEVELS  32          /* directory nesting followed below a root */
#define PF_BATCH_BYTES (1u << 20)  /* names of one directory held at once */
#define PF_NAME_RESERVE 256        /* NAME_MAX + 1: room checked before each readdir */
#define PF_WAIT_NS     5000000ll   /* longest wait for completions: stop is polled this often */
#define PF_DRAIN_NS    500000000ull /* after a stop: how long reads in flight may take */
#define PF_RETRIES     8           /* -EAGAIN/-EINTR on one read before it counts as an error */
#define PF_FD_RESERVE  64          /* shared table: numbers below the limit left to the host (or limit / 4) */
#define PF_SHARED_FILES 16         /* shared table: files open at once (io_uring engine) */
#define PF_ROOT_MAX    4096        /* PATH_MAX: longer roots are -EINVAL */
#define PF_LOST_POLL_NS 1000000ull /* fds lost: how often the completion ring is looked at */

#ifndef SYS_close_range
#define SYS_close_range 436        /* the same number on every architecture */
#endif
#ifndef CLOSE_RANGE_UNSHARE
#define CLOSE_RANGE_UNSHARE (1u << 1)
#endif

/* ---- small helpers ------------------------------------------------------ */

/*
 * Our own opens, reads and closes go straight to the kernel: linked into
 * the shim, libc's names are the shim's hooks, and the prefetcher's reads
 * of scope files must not look like the host's dataset reads. The io_uring
 * path never passes the hooks either, so both engines see the same thing.
 * These return the syscall's result and leave the error in errno; the
 * public entry points restore errno.
 */
static inline int sys_openat(int dirfd, const char *name, int flags)
{
	return (int)syscall(SYS_openat, dirfd, name, flags, 0);
}

static inline ssize_t sys_pread(int fd, void *buf, size_t n, uint64_t off)
{
	return (ssize_t)syscall(SYS_pread64, fd, buf, n, (off_t)off);
}

static inline void sys_close(int fd)
{
	(void)syscall(SYS_close, fd);
}

static inline int sys_fstat(int fd, struct stat *s)
{
	return (int)syscall(SYS_fstat, fd, s);
}

static inline int sys_fstatat(int dirfd, const char *name, struct stat *s, int flags)
{
	return (int)syscall(SYS_newfstatat, dirfd, name, s, flags);
}

static inline ssize_t sys_read(int fd, void *buf, size_t n)
{
	return (ssize_t)syscall(SYS_read, fd, buf, n);
}

/*
 * The calling thread's seccomp mode from its /proc status (filters are per
 * thread; a thread inherits its creator's): 0 none, 1 strict, 2 filter;
 * -errno when it cannot be told. Raw syscalls like the rest of this file.
 */
static int seccomp_mode(void)
{
	static const char *const paths[] = { "/proc/thread-self/status", "/proc/self/status" };
	static const char key[] = "\nSeccomp:";
	char buf[8192];
	int fd = -1, ret = -ENOENT;

	for (unsigned i = 0; i < sizeof(paths) / sizeof(paths[0]) && fd < 0; i++)
		fd = sys_openat(AT_FDCWD, paths[i], O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	size_t len = 0;
	for (;;) {
		ssize_t n = sys_read(fd, buf + len, sizeof(buf) - 1 - len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			ret = -errno;
		if (n <= 0 || (len += (size_t)n) == sizeof(buf) - 1)
			break;
	}
	sys_close(fd);
	buf[len] = '\0';
	const char *p = strstr(buf, key);
	if (p) {
		p += sizeof(key) - 1;
		while (*p == ' ' || *p == '\t')
			p++;
		ret = *p >= '0' && *p <= '9' ? *p - '0' : -EPROTO;
	} else if (ret == -ENOENT) {
		ret = -ENOSYS; /* a kernel without CONFIG_SECCOMP lists no field */
	}
	return ret;
}

/*
 * How high our descriptor numbers may go in a table shared with the host:
 * the soft RLIMIT_NOFILE less max(PF_FD_RESERVE, limit / 4). INT_MAX when
 * unlimited or unknown.
 */
static int fd_ceiling(void)
{
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur > INT32_MAX)
		return INT32_MAX;
	uint64_t lim = rl.rlim_cur, reserve = lim / 4 > PF_FD_RESERVE ? lim / 4 : PF_FD_RESERVE;
	return lim > reserve ? (int)(lim - reserve) : 0;
}

static inline uint64_t min_u64(uint64_t a, uint64_t b)
{
	return a < b ? a : b;
}

static inline uint64_t now_ns(void)
{
	/* the real clock, not ts_now_ns(): tests that fake time must not slow us */
	return ts_prim_monotonic_ns();
}

static int resolve_opts(const struct ts_prefetch_opts *o, unsigned *depth, size_t *buf)
{
	unsigned d = o && o->queue_depth ? o->queue_depth : TS_PREFETCH_DEPTH_DEFAULT;
	size_t b = o && o->buf_size ? o->buf_size : TS_PREFETCH_BUF_DEFAULT;
	if (d > TS_PREFETCH_DEPTH_MAX || b < TS_PREFETCH_BUF_MIN || b > TS_PREFETCH_BUF_MAX ||
	    (uint64_t)d * b > TS_PREFETCH_POOL_MAX)
		return -EINVAL;
	*depth = d;
	*buf = b;
	return 0;
}

static int check_roots(const char *const *roots, unsigned nroots)
{
	if (nroots && !roots)
		return -EINVAL;
	for (unsigned i = 0; i < nroots; i++)
		if (!roots[i] || !roots[i][0] || strnlen(roots[i], PF_ROOT_MAX) == PF_ROOT_MAX)
			return -EINVAL;
	return 0;
}

/*
 * DataLoader workers are forked from the producer while we run: the pool
 * is kept out of them (no page tables to copy, no copy-on-write of pages
 * the kernel is filling for us). No child ever touches it.
 */
static void *pool_map(size_t len)
{
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return NULL;
	(void)madvise(p, len, MADV_DONTFORK);
	return p;
}

/* ---- run context ------------------------------------------------------- */

/* Progress that another thread may read while the run goes on. */
struct pf_live {
	_Atomic uint64_t files, bytes, errors, skipped;
	_Atomic int used_uring;
};

/* What a descriptor of ours names: told apart from a number the host reused. */
struct pf_fid {
	dev_t dev;
	ino_t ino;
};

static inline struct pf_fid fid_of(const struct stat *s)
{
	return (struct pf_fid){ .dev = s->st_dev, .ino = s->st_ino };
}

struct pf_level {
	DIR *d;
	struct pf_fid id;
	char *names;            /* NUL-terminated names, back to back */
	size_t used, cap;
	struct pf_ent { uint32_t off; unsigned char type; } *ents;
	size_t n, ncap, next;
	bool more;              /* the stream holds entries past this batch */
};

/* A file to open: a name in an open directory, or a root given by path. */
struct pf_cand {
	int dirfd;
	const char *name;       /* valid until the next walk_next() */
	bool follow;            /* roots only: the caller named it, links and all */
};

struct pf_ctx {
	unsigned depth;
	size_t buf;
	uint64_t budget;        /* bytes still to read (UINT64_MAX: no limit) */
	_Atomic int *stop;
	struct ts_prefetch_stats *st;
	struct pf_live *live;   /* may be NULL */
	bool noatime;           /* O_NOATIME still worth asking for */
	bool stopping;          /* no new reads: draining after a stop */
	bool abandoned;         /* a stop left a file unfinished */
	bool shared;            /* our descriptors live in the host's table */
	bool fds_lost;          /* the host closed our numbers: never close or use one again */
	int fd_max;             /* shared: highest number we keep (fd_ceiling() - 1) */

	/* walk */
	const char *const *roots;
	unsigned nroots, next_root;
	dev_t root_dev;         /* the file system of the root being walked: never left */
	int top;                /* levels in use */
	struct pf_level lv[PF_MAX_LEVELS];
	bool walk_done;         /* no more candidates (the end, or a stop) */
	bool walk_end;          /* the walk really reached its end */
	bool have_pending;      /* pending: walked but not opened yet (fd limit) */
	struct pf_cand pending;
};

static inline bool stopped(const struct pf_ctx *c)
{
	return c->stop && atomic_load_explicit(c->stop, memory_order_relaxed);
}

static void publish(const struct pf_ctx *c)
{
	struct pf_live *l = c->live;
	if (!l)
		return;
	atomic_store_explicit(&l->files, c->st->files, memory_order_relaxed);
	atomic_store_explicit(&l->bytes, c->st->bytes, memory_order_relaxed);
	atomic_store_explicit(&l->errors, c->st->errors, memory_order_relaxed);
	atomic_store_explicit(&l->skipped, c->st->skipped, memory_order_relaxed);
	atomic_store_explicit(&l->used_uring, c->st->used_uring, memory_order_relaxed);
}

/*
 * O_NOATIME spares an inode write per file, but only the owner (or
 * CAP_FOWNER) may ask. A dataset usually has one owner: after the first
 * refusal we stop asking rather than pay two opens per file.
 */
static int open_raw(struct pf_ctx *c, int dirfd, const char *name, int flags)
{
	int fd;
	if (c->noatime) {
		fd = sys_openat(dirfd, name, flags | O_NOATIME);
		if (fd >= 0 || errno != EPERM)
			return fd < 0 ? -errno : fd;
		c->noatime = false;
	}
	fd = sys_openat(dirfd, name, flags);
	return fd < 0 ? -errno : fd;
}

/*
 * In a shared table, a number above fd_max says the host's table is nearly
 * full: the descriptor goes back at once and we act as if out of them
 * (-EMFILE: wait for our own reads to free some, or skip the file), so the
 * host meets EMFILE where it would without us.
 */
static int open_at(struct pf_ctx *c, int dirfd, const char *name, int flags)
{
	int fd = open_raw(c, dirfd, name, flags);
	if (fd > c->fd_max) {
		sys_close(fd);
		return -EMFILE;
	}
	return fd;
}

/*
 * Is fd still the file we opened? Only a shared table can change under us:
 * a host's close_range (or closefrom, or a raw syscall past the shim) and
 * its next opens can give the number to another file. The first mismatch
 * says our numbers were taken: from then on none is closed or used (see
 * fds_lost), so we never close a descriptor of the host's. A host that
 * reopens the very same file under the very same number is not told apart.
 */
static bool still_ours(struct pf_ctx *c, int fd, const struct pf_fid *id)
{
	struct stat s;
	if (c->fds_lost)
		return false;
	if (!c->shared)
		return true;
	if (sys_fstat(fd, &s) == 0 && s.st_dev == id->dev && s.st_ino == id->ino)
		return true;
	c->fds_lost = true;
	return false;
}

static inline void close_ours(struct pf_ctx *c, int fd, const struct pf_fid *id)
{
	if (still_ours(c, fd, id))
		sys_close(fd);
}

/*
 * A descriptor we just opened whose fstat failed (s NULL) or told us what
 * it is. EBADF: the number was closed under us, and may be the host's by
 * now: lost, not closed.
 */
static void close_new(struct pf_ctx *c, int fd, const struct stat *s)
{
	if (s) {
		struct pf_fid id = fid_of(s);
		close_ours(c, fd, &id);
	} else if (errno == EBADF && c->shared) {
		c->fds_lost = true;
	} else if (!c->fds_lost) {
		sys_close(fd);
	}
}

/* ---- walk ---------------------------------------------------------------- */

static int ent_cmp(const void *a, const void *b, void *names)
{
	const struct pf_ent *x = a, *y = b;
	return strcmp((const char *)names + x->off, (const char *)names + y->off);
}

static bool level_grow(struct pf_level *l, size_t namelen)
{
	if (l->used + namelen + 1 > l->cap) {
		size_t cap = l->cap ? l->cap * 2 : 4096;
		while (cap < l->used + namelen + 1)
			cap *= 2;
		char *p = realloc(l->names, cap);
		if (!p)
			return false;
		l->names = p;
		l->cap = cap;
	}
	if (l->n == l->ncap) {
		size_t ncap = l->ncap ? l->ncap * 2 : 64;
		struct pf_ent *e = realloc(l->ents, ncap * sizeof(*e));
		if (!e)
			return false;
		l->ents = e;
		l->ncap = ncap;
	}
	return true;
}

/*
 * Read the next batch of the level's directory and sort it. A directory
 * bigger than one batch is walked in several sorted runs: deterministic
 * still, and memory stays bounded.
 */
static void level_fill(struct pf_ctx *c, struct pf_level *l)
{
	l->n = l->next = l->used = 0;
	l->more = false;
	for (;;) {
		if (l->used + PF_NAME_RESERVE > PF_BATCH_BYTES || stopped(c)) {
			l->more = true;
			break;
		}
		errno = 0;
		struct dirent *de = readdir(l->d);
		if (!de) {
			if (errno)
				c->st->errors++;
			break;
		}
		const char *nm = de->d_name;
		if (nm[0] == '.' && (!nm[1] || (nm[1] == '.' && !nm[2])))
			continue;
		size_t len = strlen(nm);
		if (!level_grow(l, len)) {
			/* this entry is lost; keep what we hold and try again with the next batch */
			c->st->errors++;
			l->more = l->n > 0;
			break;
		}
		memcpy(l->names + l->used, nm, len + 1);
		l->ents[l->n++] = (struct pf_ent){ .off = (uint32_t)l->used, .type = de->d_type };
		l->used += len + 1;
	}
	qsort_r(l->ents, l->n, sizeof(*l->ents), ent_cmp, l->names);
}

/* Takes fd (a directory, s its fstat) in every case. */
static void level_push(struct pf_ctx *c, int fd, const struct stat *s)
{
	if (c->top == PF_MAX_LEVELS) {
		c->st->errors++;
		sys_close(fd);
		return;
	}
	struct pf_level *l = &c->lv[c->top];
	l->d = fdopendir(fd);
	if (!l->d) {
		c->st->errors++;
		sys_close(fd);
		return;
	}
	l->id = fid_of(s);
	c->top++;
	level_fill(c, l);
}

static void level_pop(struct pf_ctx *c)
{
	struct pf_level *l = &c->lv[--c->top];
	/* libc's internal close: no hook involved. Lost numbers: the stream is
	 * left behind (a few KiB) rather than closing what the host holds now. */
	if (still_ours(c, dirfd(l->d), &l->id))
		closedir(l->d);
	l->d = NULL;
	l->n = l->next = 0;
}

/* A root: a directory becomes the first level, a regular file a candidate. */
static bool walk_root(struct pf_ctx *c, const char *root, struct pf_cand *out)
{
	struct stat s;
	/* O_NONBLOCK: a FIFO named as a root must not block the open */
	int fd = open_at(c, AT_FDCWD, root, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
	if (fd < 0) {
		c->st->errors++;
		return false;
	}
	if (sys_fstat(fd, &s) != 0) {
		c->st->errors++;
		close_new(c, fd, NULL);
		return false;
	}
	if (S_ISDIR(s.st_mode)) {
		c->root_dev = s.st_dev;
		level_push(c, fd, &s);
		return false;
	}
	close_new(c, fd, &s);
	if (S_ISREG(s.st_mode)) {
		*out = (struct pf_cand){ .dirfd = AT_FDCWD, .name = root, .follow = true };
		return true;
	}
	c->st->skipped++;
	return false;
}

/* Next candidate regular file in walk order; false at the end or on stop. */
static bool walk_next(struct pf_ctx *c, struct pf_cand *out)
{
	while (!stopped(c)) {
		if (c->top == 0) {
			if (c->next_root == c->nroots) {
				c->walk_end = true;
				return false;
			}
			if (walk_root(c, c->roots[c->next_root++], out))
				return true;
			continue;
		}
		struct pf_level *l = &c->lv[c->top - 1];
		if (l->next == l->n) {
			if (l->more)
				level_fill(c, l);
			if (l->next == l->n)
				level_pop(c);
			continue;
		}
		const struct pf_ent *e = &l->ents[l->next++];
		const char *name = l->names + e->off;
		int dfd = dirfd(l->d);
		unsigned type = e->type;
		if (type == DT_UNKNOWN) { /* file systems that do not fill d_type */
			struct stat s;
			if (sys_fstatat(dfd, name, &s, AT_SYMLINK_NOFOLLOW) != 0) {
				c->st->errors++;
				continue;
			}
			type = IFTODT(s.st_mode);
		}
		if (type == DT_REG) {
			*out = (struct pf_cand){ .dirfd = dfd, .name = name, .follow = false };
			return true;
		}
		if (type == DT_DIR) {
			/* NOFOLLOW: an entry swapped for a link since we listed it is not followed */
			int fd = open_at(c, dfd, name,
					 O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
			struct stat s;
			if (fd < 0) {
				c->st->errors++;
			} else if (sys_fstat(fd, &s) != 0) {
				c->st->errors++;
				close_new(c, fd, NULL);
			} else if (s.st_dev != c->root_dev) {
				/* another file system mounted inside the dataset (/proc, a network share): not ours to read */
				c->st->skipped++;
				close_new(c, fd, &s);
			} else {
				level_push(c, fd, &s);
			}
			continue;
		}
		c->st->skipped++; /* links, FIFOs, sockets, devices */
	}
	return false;
}

static void walk_fini(struct pf_ctx *c)
{
	while (c->top)
		level_pop(c);
	for (int i = 0; i < PF_MAX_LEVELS; i++) {
		free(c->lv[i].names);
		free(c->lv[i].ents);
	}
}

/*
 * Open a candidate. O_NONBLOCK and O_NOFOLLOW because the entry may have
 * turned into a FIFO or a link since it was listed; the open fd's own type
 * decides. O_NONBLOCK then comes off: io_uring answers -EAGAIN instead of
 * waiting when a file is nonblocking.
 *   1: *fd, *size set;  0: not a regular file (skipped);  -errno
 */
static int open_cand(struct pf_ctx *c, const struct pf_cand *k, int *fd, uint64_t *size,
		     struct pf_fid *id)
{
	int flags = O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY | (k->follow ? 0 : O_NOFOLLOW);
	int f = open_at(c, k->dirfd, k->name, flags);
	struct stat s;
	int ret, fl;

	if (f < 0)
		return f == -ELOOP ? 0 : f; /* ELOOP under O_NOFOLLOW: it became a link */
	if (sys_fstat(f, &s) != 0) {
		ret = -errno;
		close_new(c, f, NULL);
		return ret;
	}
	if (!S_ISREG(s.st_mode))
		ret = 0;
	else if ((fl = (int)syscall(SYS_fcntl, f, F_GETFL)) < 0 ||
		 syscall(SYS_fcntl, f, F_SETFL, fl & ~O_NONBLOCK) != 0)
		ret = -errno;
	else {
		*fd = f;
		*size = (uint64_t)s.st_size;
		*id = fid_of(&s);
		return 1;
	}
	close_new(c, f, &s);
	return ret;
}

/*
 * The next file to read. 1: opened; 0: no more files; -EMFILE/-ENFILE: we
 * hold too many descriptors; the candidate stays pending so the caller can
 * retry once reads in flight have closed some.
 */
static int next_file(struct pf_ctx *c, int *fd, uint64_t *size, struct pf_fid *id)
{
	for (;;) {
		if (!c->have_pending) {
			if (c->walk_done || !walk_next(c, &c->pending)) {
				c->walk_done = true;
				return 0;
			}
			c->have_pending = true;
		}
		int r = open_cand(c, &c->pending, fd, size, id);
		if (r == -EMFILE || r == -ENFILE)
			return r;
		c->have_pending = false;
		if (r == 1)
			return 1;
		if (r == 0)
			c->st->skipped++;
		else
			c->st->errors++;
	}
}

/* next_file() failed for lack of descriptors and nothing will free one. */
static void drop_pending(struct pf_ctx *c)
{
	c->have_pending = false;
	c->st->errors++;
}

/* ---- plain engine ---------------------------------------------------------- */

/* Read [0, size) of fd; a file that shrank ends at the first empty read. */
static int read_plain(struct pf_ctx *c, int fd, uint64_t size, char *buf)
{
	uint64_t off = 0;
	unsigned retries = 0;
	while (off < size) {
		if (stopped(c)) {
			c->abandoned = true;
			return -ECANCELED;
		}
		uint64_t len = min_u64(min_u64(c->buf, size - off), c->budget);
		if (len == 0)
			return -EDQUOT; /* max_bytes reached mid-file: not a whole file */
		ssize_t n = sys_pread(fd, buf, len, off);
		if (n < 0) {
			if ((errno == EINTR || errno == EAGAIN) && retries++ < PF_RETRIES)
				continue;
			return -EIO;
		}
		if (n == 0)
			break;
		retries = 0;
		off += (uint64_t)n;
		c->st->bytes += (uint64_t)n;
		if (c->budget != UINT64_MAX)
			c->budget -= (uint64_t)n;
		publish(c); /* a big file takes a while: progress per chunk */
	}
	return 0;
}

static int run_plain(struct pf_ctx *c)
{
	char *buf = pool_map(c->buf);
	int fd = -1, r;
	uint64_t size = 0;
	struct pf_fid id = { 0 };

	if (!buf)
		return -ENOMEM;
	while (c->budget && !stopped(c) && !c->fds_lost) {
		r = next_file(c, &fd, &size, &id);
		if (r == 0)
			break;
		if (r < 0) { /* out of descriptors with none of ours open: the host holds them */
			drop_pending(c);
			continue;
		}
		r = read_plain(c, fd, size, buf);
		close_ours(c, fd, &id);
		if (r == 0)
			c->st->files++;
		else if (r == -EIO)
			c->st->errors++;
		publish(c);
	}
	munmap(buf, c->buf);
	return c->fds_lost ? -EBADF : 0;
}

/* ---- io_uring engine ------------------------------------------------------ */

struct pf_file {
	int fd;
	struct pf_fid id;
	uint64_t end;           /* read [0, end): the size at open, lowered on early EOF or cut */
	uint64_t next;          /* first offset not yet handed to a read */
	unsigned inflight;      /* chunks in the kernel */
	bool busy;              /* open: this entry is not on the free list */
	bool failed;            /* a read failed: counted as one error */
	bool cut;               /* max_bytes or stop cut it short: neither file nor error */
};

struct pf_slot {
	struct pf_file *f;
	uint64_t off;
	uint32_t len;
	uint8_t retries;
};

struct pf_uring {
	struct io_uring ring;
	char *pool;
	size_t pool_len;
	struct pf_slot *slots;
	unsigned *free_slots, nfree;
	struct pf_file *files;
	struct pf_file **free_files;
	unsigned nfree_files;
	unsigned inflight;
	struct pf_file *cur;    /* the file whose next chunk we issue */
	bool submit_failed;
	bool cancel_unsent;     /* the cancel request sits in the SQ, not in the kernel */
};

/* user data: slot index + 1; 0 is our cancel request, ~0 liburing's own timeouts */
static inline uint64_t slot_data(unsigned i) { return (uint64_t)i + 1; }

static inline char *slot_buf(const struct pf_uring *u, const struct pf_ctx *c, unsigned i)
{
	return u->pool + (size_t)i * c->buf;
}

static int ring_setup(struct io_uring *ring, unsigned depth)
{
	int r = io_uring_queue_init(depth, ring, 0);
	if (r < 0)
		return r;
	(void)io_uring_ring_dontfork(ring); /* like the pool: children never use it */
	/* IORING_OP_READ came with 5.6, the probe too: no probe, no READ */
	struct io_uring_probe *p = io_uring_get_probe_ring(ring);
	bool ok = p && io_uring_opcode_supported(p, IORING_OP_READ);
	if (p)
		io_uring_free_probe(p);
	if (!ok) {
		io_uring_queue_exit(ring);
		return -EOPNOTSUPP;
	}
	return 0;
}

static int uring_init(struct pf_uring *u, struct pf_ctx *c)
{
	unsigned d = c->depth;
	int r;

	memset(u, 0, sizeof(*u));
	u->pool_len = (size_t)d * c->buf;
	u->slots = calloc(d, sizeof(*u->slots));
	u->free_slots = calloc(d, sizeof(*u->free_slots));
	/* a file in use holds a slot, except the one just opened: d + 1 */
	u->files = calloc(d + 1, sizeof(*u->files));
	/* NOLINTNEXTLINE(bugprone-sizeof-expression): an array of pointers */
	u->free_files = calloc(d + 1, sizeof(*u->free_files));
	u->pool = pool_map(u->pool_len);
	if (!u->slots || !u->free_slots || !u->files || !u->free_files || !u->pool) {
		r = -ENOMEM;
		goto fail;
	}
	if ((r = ring_setup(&u->ring, d)) < 0)
		goto fail;
	for (unsigned i = 0; i < d; i++)
		u->free_slots[i] = d - 1 - i;
	u->nfree = d;
	for (unsigned i = 0; i <= d; i++)
		u->free_files[i] = &u->files[d - i];
	u->nfree_files = d + 1;
	return 0;
fail:
	if (u->pool)
		munmap(u->pool, u->pool_len);
	free(u->slots);
	free(u->free_slots);
	free(u->files);
	free(u->free_files);
	memset(u, 0, sizeof(*u));
	return r;
}

static inline unsigned files_open(const struct pf_uring *u, const struct pf_ctx *c)
{
	return c->depth + 1 - u->nfree_files;
}

static void finish_file(struct pf_uring *u, struct pf_ctx *c, struct pf_file *f)
{
	close_ours(c, f->fd, &f->id);
	f->busy = false;
	if (f->failed)
		c->st->errors++;
	else if (!f->cut)
		c->st->files++;
	u->free_files[u->nfree_files++] = f;
}

/* Put slot i's read into the submission queue. */
static void queue_read(struct pf_uring *u, struct pf_ctx *c, unsigned i)
{
	struct pf_slot *s = &u->slots[i];
	struct io_uring_sqe *sqe = io_uring_get_sqe(&u->ring);
	if (!sqe) { /* cannot happen with depth sqes and depth slots; be safe anyway */
		io_uring_submit(&u->ring);
		sqe = io_uring_get_sqe(&u->ring);
	}
	if (!sqe) {
		u->submit_failed = true;
		return;
	}
	io_uring_prep_read(sqe, s->f->fd, slot_buf(u, c, i), s->len, s->off);
	io_uring_sqe_set_data64(sqe, slot_data(i));
}

static inline void refund(struct pf_ctx *c, uint64_t n)
{
	if (c->budget != UINT64_MAX)
		c->budget += n;
}

/* Hand the next chunk of u->cur to a free slot. */
static void issue(struct pf_uring *u, struct pf_ctx *c)
{
	struct pf_file *f = u->cur;
	unsigned i = u->free_slots[--u->nfree];
	struct pf_slot *s = &u->slots[i];
	uint64_t len = min_u64(min_u64(c->buf, f->end - f->next), c->budget);

	*s = (struct pf_slot){ .f = f, .off = f->next, .len = (uint32_t)len };
	f->next += len;
	f->inflight++;
	u->inflight++;
	if (c->budget != UINT64_MAX)
		c->budget -= len;
	queue_read(u, c, i);
}

/* Stop issuing for u->cur; close it now if nothing of it is in flight. */
static void release_cur(struct pf_uring *u, struct pf_ctx *c)
{
	struct pf_file *f = u->cur;
	u->cur = NULL;
	if (f->inflight == 0)
		finish_file(u, c, f);
}

/* Fill free slots with reads: the current file's chunks, then the next files. */
static void fill(struct pf_uring *u, struct pf_ctx *c)
{
	while (u->nfree > 0 && !u->submit_failed) {
		if (u->cur && (u->cur->failed || u->cur->next >= u->cur->end))
			release_cur(u, c);
		if (!u->cur) {
			int fd = -1;
			uint64_t size = 0;
			struct pf_fid id = { 0 };
			if (c->budget == 0 || stopped(c) || c->fds_lost)
				return;
			/* in the host's table: a few files at a time (see the top) */
			if (c->shared && u->inflight > 0 && files_open(u, c) >= PF_SHARED_FILES)
				return;
			int r = next_file(c, &fd, &size, &id);
			if (r == 0)
				return;
			if (r < 0) {
				if (u->inflight > 0)
					return; /* completions will close files: retry then */
				drop_pending(c);
				continue;
			}
			struct pf_file *f = u->free_files[--u->nfree_files];
			*f = (struct pf_file){ .fd = fd, .id = id, .end = size, .busy = true };
			u->cur = f;
			continue; /* a 0-byte file is released (and counted) at the top */
		}
		if (c->budget == 0) {
			u->cur->cut = true;
			u->cur->end = u->cur->next;
			continue;
		}
		issue(u, c);
	}
}

static void complete(struct pf_uring *u, struct pf_ctx *c, unsigned i, int res)
{
	struct pf_slot *s = &u->slots[i];
	struct pf_file *f = s->f;

	if (res > 0) {
		c->st->bytes += (uint64_t)res;
		if ((uint32_t)res < s->len) {
			if (!c->stopping) { /* short read: the rest from where it ended */
				s->off += (uint64_t)res;
				s->len -= (uint32_t)res;
				s->retries = 0;
				queue_read(u, c, i);
				return;
			}
			f->cut = true;
		}
	} else if (res == 0) {
		/* end of file before the size we saw: it shrank, nothing lies past here */
		if (f->end > s->off)
			f->end = s->off;
		refund(c, s->len);
	} else if ((res == -EAGAIN || res == -EINTR) && s->retries < PF_RETRIES && !c->stopping) {
		s->retries++;
		queue_read(u, c, i);
		return;
	} else {
		if (res != -ECANCELED)
			f->failed = true;
		else
			f->cut = true;
		refund(c, s->len);
	}
	f->inflight--;
	u->inflight--;
	u->free_slots[u->nfree++] = i;
	if (f->inflight == 0 && f != u->cur &&
	    (f->failed || f->cut || f->next >= f->end || c->stopping))
		finish_file(u, c, f);
}

static void reap(struct pf_uring *u, struct pf_ctx *c)
{
	struct io_uring_cqe *cqe;
	unsigned head, n = 0;
	io_uring_for_each_cqe(&u->ring, head, cqe) {
		uint64_t d = io_uring_cqe_get_data64(cqe);
		n++;
		if (d >= 1 && d <= c->depth)
			complete(u, c, (unsigned)(d - 1), cqe->res);
	}
	io_uring_cq_advance(&u->ring, n);
}

/*
 * EBADF: the ring's number was closed; EOPNOTSUPP: it names a file that is
 * not an io_uring, the host's since a close_range of its own. Either way
 * the host closed our numbers and may have reused every one of them.
 */
static inline bool ring_fd_lost(int r)
{
	return r == -EBADF || r == -EOPNOTSUPP;
}

/* After a failed submit, or once our numbers are lost, the ring's number
 * is not used again (wait_reap() then polls the mapped ring). */
static inline bool ring_unusable(const struct pf_uring *u, const struct pf_ctx *c)
{
	return u->submit_failed || c->fds_lost;
}

static void submit(struct pf_uring *u, struct pf_ctx *c)
{
	if (!io_uring_sq_ready(&u->ring) || ring_unusable(u, c))
		return;
	int r = io_uring_submit(&u->ring);
	if (r >= 0) {
		u->cancel_unsent = false; /* sqes go in order: the cancel came last */
		return;
	}
	/* busy or interrupted: the sqes stay queued for the next round */
	if (r != -EAGAIN && r != -EBUSY && r != -EINTR) {
		u->submit_failed = true;
		if (ring_fd_lost(r))
			c->fds_lost = true;
	}
}

/* One bounded wait for completions, then handle all that are there. */
static void wait_reap(struct pf_uring *u, struct pf_ctx *c)
{
	if (ring_unusable(u, c)) {
		/*
		 * No more syscalls on the ring's number: it may be the host's.
		 * Completions still arrive in the mapped ring (the mappings keep
		 * the ring alive however its number fares): look, then sleep.
		 */
		reap(u, c);
		ts_sleep_ns(PF_LOST_POLL_NS);
		reap(u, c);
		return;
	}
	struct io_uring_cqe *cqe;
	struct __kernel_timespec ts = { .tv_sec = 0, .tv_nsec = PF_WAIT_NS };
	(void)io_uring_wait_cqe_timeout(&u->ring, &cqe, &ts); /* -ETIME: fine, we poll stop */
	reap(u, c);
}

/*
 * Reads the kernel holds. After a failed submit the sqes still in the SQ
 * never reached it (the kernel's head has not passed them) and never will:
 * those slots are ours again, only the rest may still be written to.
 */
static unsigned kernel_inflight(const struct pf_uring *u, const struct pf_ctx *c)
{
	if (!ring_unusable(u, c))
		return u->inflight;
	unsigned unsent = io_uring_sq_ready(&u->ring) - (u->cancel_unsent ? 1u : 0u);
	return u->inflight > unsent ? u->inflight - unsent : 0;
}

/*
 * After a stop or a failed submit: cancel what the kernel has not started
 * yet, wait (bounded) for the rest. true when the kernel holds no read,
 * so the pool may go.
 */
static bool drain(struct pf_uring *u, struct pf_ctx *c)
{
	c->stopping = true;
	submit(u, c);
	if (u->inflight && !ring_unusable(u, c)) {
		struct io_uring_sqe *sqe = io_uring_get_sqe(&u->ring);
		if (sqe) { /* -EINVAL before 5.19: then we simply wait */
			io_uring_prep_cancel64(sqe, 0, IORING_ASYNC_CANCEL_ANY);
			io_uring_sqe_set_data64(sqe, 0);
			u->cancel_unsent = true;
			submit(u, c);
		}
	}
	uint64_t deadline = now_ns() + PF_DRAIN_NS;
	while (kernel_inflight(u, c) && now_ns() < deadline)
		wait_reap(u, c);
	return kernel_inflight(u, c) == 0;
}

static int run_uring(struct pf_ctx *c, struct pf_uring *u)
{
	int ret = 0;

	c->st->used_uring = 1;
	for (;;) {
		if (stopped(c)) {
			c->abandoned |= u->inflight || u->cur;
			break;
		}
		fill(u, c);
		submit(u, c);
		if (ring_unusable(u, c)) {
			ret = c->fds_lost ? -EBADF : -EIO;
			break;
		}
		if (u->inflight == 0 && !u->cur)
			break; /* fill found no more files (or the budget is spent) */
		wait_reap(u, c);
		publish(c);
	}
	bool drained = u->inflight == 0 || drain(u, c);
	/* files still open: the cut current one, or ones whose reads did not drain */
	for (unsigned i = 0; i <= c->depth; i++) {
		struct pf_file *f = &u->files[i];
		if (f->busy) {
			f->cut = !f->failed;
			finish_file(u, c, f);
		}
	}
	u->cur = NULL;
	if (c->fds_lost)
		u->ring.ring_fd = -1; /* unmap the rings, close nothing: see ring_fd_lost() */
	io_uring_queue_exit(&u->ring);
	if (drained)
		munmap(u->pool, u->pool_len);
	/* else: see the top of this file */
	free(u->slots);
	free(u->free_slots);
	free(u->files);
	free(u->free_files);
	return ret;
}

/* ---- entry points ---------------------------------------------------------- */

/*
 * Why io_uring is not even tried: a seccomp filter (or no way to tell) may
 * kill the process on io_uring_setup. -EPERM then, else 0.
 */
static int uring_forbidden(int seccomp)
{
	if (seccomp == 0)
		return 0;
	if (seccomp > 0)
		ts_debug("prefetch: plain reads: a seccomp filter is on (Seccomp: %d) and might kill the "
			 "process on io_uring_setup", seccomp);
	else
		ts_debug("prefetch: plain reads: the seccomp state cannot be read (%s), and a filter "
			 "might kill the process on io_uring_setup", strerror(-seccomp));
	return -EPERM;
}

/*
 * seccomp: the calling thread's mode if already read (seccomp_mode()),
 * PF_SECCOMP_UNREAD to read it here. private_fds: this thread has a
 * descriptor table of its own.
 */
#define PF_SECCOMP_UNREAD INT32_MIN
static int run_impl(const char *const *roots, unsigned nroots, const struct ts_prefetch_opts *o,
		    _Atomic int *stop, struct ts_prefetch_stats *st, struct pf_live *live, int seccomp,
		    bool private_fds)
{
	uint64_t t0 = now_ns();
	struct pf_ctx *c;
	int ret;

	memset(st, 0, sizeof(*st));
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	if ((ret = resolve_opts(o, &c->depth, &c->buf)) ||
	    (ret = check_roots(roots, nroots))) {
		free(c);
		return ret;
	}
	c->budget = o && o->max_bytes ? o->max_bytes : UINT64_MAX;
	c->stop = stop;
	c->st = st;
	c->live = live;
	c->noatime = true;
	c->roots = roots;
	c->nroots = nroots;
	c->shared = !private_fds;
	c->fd_max = c->shared ? fd_ceiling() - 1 : INT32_MAX;

	struct pf_uring u;
	int ur = 1;
	if (!(o && o->force_plain)) {
		ur = uring_forbidden(seccomp == PF_SECCOMP_UNREAD ? seccomp_mode() : seccomp);
		if (ur == 0)
			ur = uring_init(&u, c);
	}
	if (ur == 0) {
		ret = run_uring(c, &u);
	} else {
		st->uring_err = ur < 0 ? ur : 0;
		ret = run_plain(c);
	}
	/* a stop that came after the last read changed nothing */
	if (ret == 0 && stopped(c) && (c->abandoned || !(c->walk_end || c->budget == 0)))
		ret = -ECANCELED;
	walk_fini(c);
	st->shared_fds = c->shared;
	free(c);
	st->usec = (now_ns() - t0) / 1000;
	return ret;
}

int ts_prefetch_run(const char *const *roots, unsigned nroots, const struct ts_prefetch_opts *o,
		    _Atomic int *stop, struct ts_prefetch_stats *st)
{
	int saved = errno;
	struct ts_prefetch_stats local;
	int ret = run_impl(roots, nroots, o, stop, st ? st : &local, NULL, PF_SECCOMP_UNREAD, false);
	errno = saved;
	return ret;
}

/* ---- background thread --------------------------------------------------- */

/*
 * The job outlives a stop() that gave up waiting: then the thread still
 * uses it and frees it on its way out. Two references, the thread's and
 * the starter's; whoever drops the last frees.
 */
enum { PF_FDTAB_UNKNOWN = 0, PF_FDTAB_PRIVATE, PF_FDTAB_SHARED };

struct ts_prefetch_job {
	_Atomic int stop;
	_Atomic uint32_t done;       /* futex word: the run has returned */
	_Atomic int32_t tid;
	_Atomic int refs;
	_Atomic int fdtab;           /* PF_FDTAB_*: whose table our descriptors are in */
	int ret;
	struct ts_prefetch_stats st; /* final, valid once done */
	struct pf_live live;
	struct ts_prefetch_opts opts;
	unsigned nroots;
	char **roots;                /* copies, in the same allocation */
};

static void job_put(struct ts_prefetch_job *j)
{
	if (atomic_fetch_sub_explicit(&j->refs, 1, memory_order_acq_rel) == 1)
		free(j);
}

/* Tests: runs where the thread exits, see prefetch.h. */
void (*ts_prefetch_exit_hook)(void);

/*
 * Leave the host's descriptor table for an empty one of our own. With
 * CLOSE_RANGE_UNSHARE and a range past the last descriptor, the kernel
 * copies only the numbers below `first` (none): we never hold even a
 * moment's reference to a host file (a pipe the host closes must see its
 * EOF), and the host's table is not touched. Older kernels refuse the
 * call (ENOSYS, EINVAL for the flag): we stay shared.
 */
static bool own_fd_table(void)
{
	return syscall(SYS_close_range, 0u, ~0u, CLOSE_RANGE_UNSHARE) == 0;
}

static void *job_main(void *arg)
{
	struct ts_prefetch_job *j = arg;
	struct ts_prefetch_stats st;

	atomic_store_explicit(&j->tid, (int32_t)syscall(SYS_gettid), memory_order_relaxed);
	/*
	 * Before any descriptor of ours exists. Under a seccomp filter,
	 * close_range may be what kills: shared then. Our log lines go out
	 * before the unshare (fd 2 is not ours after it).
	 */
	int seccomp = seccomp_mode();
	bool priv = seccomp == 0 && own_fd_table();
	/* release: ts_prefetch_shares_fds() may skip a stop on PRIVATE */
	atomic_store_explicit(&j->fdtab, priv ? PF_FDTAB_PRIVATE : PF_FDTAB_SHARED, memory_order_release);
	j->ret = run_impl((const char *const *)j->roots, j->nroots, &j->opts, &j->stop, &st, &j->live,
			  seccomp, priv);
	j->st = st;
	atomic_store_explicit(&j->done, 1, memory_order_release);
	ts_futex_wake_all(&j->done);
	job_put(j); /* j may be gone from here on */
	if (ts_prefetch_exit_hook)
		ts_prefetch_exit_hook();
	return NULL;
}

/*
 * The roots are copied: the caller's may change once we return (the shim
 * hands in its detected scope, rewritten as detection widens it, perhaps
 * while we copy). Each length is taken once and bounded, and every copy
 * ends in a NUL of ours: a root rewritten meanwhile is copied torn, never
 * past the room it was given.
 */
static struct ts_prefetch_job *job_new(const char *const *roots, unsigned nroots,
				       const struct ts_prefetch_opts *o)
{
	size_t *lens = calloc(nroots ? nroots : 1, sizeof(*lens));
	if (!lens)
		return NULL;
	size_t size = sizeof(struct ts_prefetch_job) + (size_t)nroots * sizeof(char *);
	for (unsigned i = 0; i < nroots; i++) {
		lens[i] = strnlen(roots[i], PF_ROOT_MAX - 1);
		size += lens[i] + 1;
	}
	struct ts_prefetch_job *j = calloc(1, size);
	if (!j) {
		free(lens);
		return NULL;
	}
	j->roots = (char **)(j + 1);
	char *s = (char *)(j->roots + nroots);
	for (unsigned i = 0; i < nroots; i++) {
		j->roots[i] = memcpy(s, roots[i], lens[i]);
		s[lens[i]] = '\0';
		s += lens[i] + 1;
	}
	free(lens);
	j->nroots = nroots;
	if (o)
		j->opts = *o;
	atomic_init(&j->refs, 2);
	return j;
}

int ts_prefetch_start(struct ts_prefetch *p, const char *const *roots, unsigned nroots,
		      const struct ts_prefetch_opts *o)
{
	int saved = errno, ret;
	unsigned depth;
	size_t buf;
	sigset_t all, old;

	if (p->started && p->owner_pid == (int32_t)getpid())
		return -EBUSY;
	if ((ret = resolve_opts(o, &depth, &buf)) || (ret = check_roots(roots, nroots)))
		return ret;
	struct ts_prefetch_job *j = job_new(roots, nroots, o);
	if (!j) {
		errno = saved;
		return -ENOMEM;
	}
	/* blocked before the thread exists, so no signal can land on it first */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	ret = -pthread_create(&p->thread, NULL, job_main, j);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (ret) {
		free(j);
		errno = saved;
		return ret;
	}
	pthread_setname_np(p->thread, "tsshim-prefetch");
	p->job = j;
	p->owner_pid = (int32_t)getpid();
	p->started = 1;
	errno = saved;
	return 0;
}

static void live_stats(struct ts_prefetch_job *j, struct ts_prefetch_stats *st)
{
	*st = (struct ts_prefetch_stats){
		.files = atomic_load_explicit(&j->live.files, memory_order_relaxed),
		.bytes = atomic_load_explicit(&j->live.bytes, memory_order_relaxed),
		.errors = atomic_load_explicit(&j->live.errors, memory_order_relaxed),
		.skipped = atomic_load_explicit(&j->live.skipped, memory_order_relaxed),
		.used_uring = atomic_load_explicit(&j->live.used_uring, memory_order_relaxed),
	};
}

/* A forked child holds a copy of the struct but no thread: forget it (the job's memory is a copy too, shared with the parent until written: leave it). */
static inline bool foreign(const struct ts_prefetch *p)
{
	return p->owner_pid != (int32_t)getpid();
}

int ts_prefetch_poll(struct ts_prefetch *p, struct ts_prefetch_stats *st)
{
	if (!p->started || foreign(p))
		return -ESRCH;
	struct ts_prefetch_job *j = p->job;
	if (atomic_load_explicit(&j->done, memory_order_acquire)) {
		if (st)
			*st = j->st;
		return 1;
	}
	if (st)
		live_stats(j, st);
	return 0;
}

int32_t ts_prefetch_tid(const struct ts_prefetch *p)
{
	if (!p->started || foreign(p))
		return 0;
	return atomic_load_explicit(&p->job->tid, memory_order_relaxed);
}

int ts_prefetch_shares_fds(const struct ts_prefetch *p)
{
	if (!p->started || foreign(p))
		return 0;
	struct ts_prefetch_job *j = p->job;
	/* acquire: pairs with job_main's store, made before its first open */
	if (atomic_load_explicit(&j->fdtab, memory_order_acquire) == PF_FDTAB_PRIVATE)
		return 0;
	/* a finished run holds nothing (it closed everything before done) */
	return !atomic_load_explicit(&j->done, memory_order_acquire);
}

/*
 * Join the thread if it ends by the deadline (CLOCK_MONOTONIC ns), else
 * detach it: it then ends on its own, touching nothing of ours (the job is
 * refcounted). tryjoin and short sleeps rather than pthread_timedjoin_np:
 * that one counts on CLOCK_REALTIME, which may jump.
 */
#define PF_JOIN_POLL_NS 1000000ull
static void join_until(pthread_t t, uint64_t deadline)
{
	for (;;) {
		int r = pthread_tryjoin_np(t, NULL);
		if (r != EBUSY) /* 0, or a thread we cannot join: nothing to wait for */
			return;
		uint64_t now = now_ns();
		if (now >= deadline)
			break;
		ts_sleep_ns(min_u64(PF_JOIN_POLL_NS, deadline - now));
	}
	pthread_detach(t);
}

int ts_prefetch_stop(struct ts_prefetch *p, struct ts_prefetch_stats *st)
{
	int saved = errno, ret;

	if (!p->started)
		return -ESRCH;
	if (foreign(p)) {
		*p = (struct ts_prefetch){ 0 };
		return -ESRCH;
	}
	struct ts_prefetch_job *j = p->job;
	atomic_store_explicit(&j->stop, 1, memory_order_relaxed);
	uint64_t deadline = now_ns() + TS_PREFETCH_STOP_MS * 1000000ull;
	for (;;) {
		if (atomic_load_explicit(&j->done, memory_order_acquire))
			break;
		uint64_t now = now_ns();
		if (now >= deadline)
			break;
		(void)ts_futex_wait(&j->done, 0, deadline - now);
	}
	if (atomic_load_explicit(&j->done, memory_order_acquire)) {
		if (st)
			*st = j->st;
		ret = j->ret;
		/*
		 * Past its last use of j but for job_put(), yet its exit may
		 * still take long: exit cancels the thread's io_uring requests
		 * and waits for them, forever on storage that stopped answering.
		 */
		join_until(p->thread, deadline);
	} else {
		pthread_detach(p->thread);
		if (st)
			live_stats(j, st);
		ret = -ETIMEDOUT;
	}
	job_put(j);
	*p = (struct ts_prefetch){ 0 };
	errno = saved;
	return ret;
}
