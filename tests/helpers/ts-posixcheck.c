/* SPDX-License-Identifier: MIT */
/*
 * ts-posixcheck DIR: runs a fixed script of libc file operations on
 * fixtures it creates under DIR and prints one line per operation: the
 * return value, the errno name when it failed, a hash of the bytes read.
 * The output must be byte-identical with and without the shim preloaded
 * (tests/scenarios/posix.sh compares them): every hook of shim/io.c has to
 * keep POSIX semantics (offsets, short reads, EOF, errors and errno,
 * O_CLOEXEC, dup sharing) for tracked and pass-through files alike.
 *
 * Layout: DIR/main/ for the script run alone, DIR/t0..t3/ for four threads
 * that then run it concurrently (each on its own files, ITERATIONS times,
 * to stress the shim's per-descriptor table). The process works in DIR,
 * so "relative" paths are "main/data.jpg", "t2/data.jpg", ...
 *
 * Nothing printed varies between runs: descriptor numbers appear only
 * relative to the first one the lone run opens (threads print "ok"), and
 * operations that would race with other threads over descriptor numbers
 * (reading or closing a closed descriptor) run on a private high
 * descriptor, or only in the lone run.
 *
 * Exit: 0 when the script ran (whatever its results), 2 on usage or when
 * the fixtures cannot be created.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

/* glibc's fortified entry points have no public prototypes. */
int __open_2(const char *path, int flags);
int __open64_2(const char *path, int flags);
int __openat_2(int dirfd, const char *path, int flags);
ssize_t __read_chk(int fd, void *buf, size_t count, size_t buflen);
ssize_t __pread64_chk(int fd, void *buf, size_t count, off_t off, size_t buflen);

#define NTHREADS 4
#define ITERATIONS 3
#define SZ_DATA 100003L /* odd: reads of round sizes end short */
#define SZ_PLAIN 5000L
#define SZ_NEW 3000L
#define BUFSZ (256 * 1024)
#define ERRNO_SENTINEL 12345

struct ctx {
	int solo;            /* the lone run: may print relative fds, may race-free reuse numbers */
	char sub[8];         /* "main", "t0", ... */
	char dir[PATH_MAX];  /* absolute DIR/sub */
	int base;            /* first descriptor opened by the lone run */
	int hi;              /* a private descriptor number nobody else uses */
	unsigned char *buf;
	char *out;
	size_t len, cap;
	int iterations_same; /* threads: every iteration printed the same */
};

static char topdir[PATH_MAX];

/* ---- output ----------------------------------------------------------------- */

static void emit(struct ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void emit(struct ctx *c, const char *fmt, ...)
{
	for (;;) {
		va_list ap;
		va_start(ap, fmt);
		int n = vsnprintf(c->out + c->len, c->cap - c->len, fmt, ap);
		va_end(ap);
		if (n < 0)
			abort();
		if ((size_t)n + 2 <= c->cap - c->len) {
			c->len += (size_t)n;
			c->out[c->len++] = '\n';
			c->out[c->len] = '\0';
			return;
		}
		c->cap = c->cap * 2 + (size_t)n + 2;
		c->out = realloc(c->out, c->cap);
		if (!c->out)
			abort();
	}
}

static uint64_t fnv(const void *p, size_t n)
{
	const unsigned char *b = p;
	uint64_t h = 0xcbf29ce484222325ull;
	for (size_t i = 0; i < n; i++)
		h = (h ^ b[i]) * 0x100000001b3ull;
	return h;
}

static const char *ename(int e)
{
	static const struct {
		int e;
		const char *n;
	} t[] = {
		{ EBADF, "EBADF" },     { EISDIR, "EISDIR" },   { ENOENT, "ENOENT" }, { EINVAL, "EINVAL" },
		{ EEXIST, "EEXIST" },   { ENOTDIR, "ENOTDIR" }, { EFAULT, "EFAULT" }, { ESPIPE, "ESPIPE" },
		{ EACCES, "EACCES" },   { ELOOP, "ELOOP" },     { ENOSYS, "ENOSYS" }, { EOVERFLOW, "EOVERFLOW" },
		{ EMFILE, "EMFILE" },   { ENXIO, "ENXIO" },     { EPERM, "EPERM" },   { EAGAIN, "EAGAIN" },
		{ 0, "0" },             { ERRNO_SENTINEL, "SENTINEL" },
	};
	static __thread char other[24];
	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++)
		if (t[i].e == e)
			return t[i].n;
	snprintf(other, sizeof(other), "errno%d", e);
	return other;
}

/* A result: "op: ret=R [errno=E] [hash=H]"; hash of `hashlen` bytes when ret > 0. */
static void res(struct ctx *c, const char *op, long ret, int err, const void *buf, long hashlen)
{
	char h[40] = "", e[40] = "";
	if (ret < 0)
		snprintf(e, sizeof(e), " errno=%s", ename(err));
	if (ret > 0 && buf && hashlen > 0)
		snprintf(h, sizeof(h), " hash=%016llx", (unsigned long long)fnv(buf, (size_t)hashlen));
	emit(c, "%s: ret=%ld%s%s", op, ret, e, h);
}

static void rd(struct ctx *c, const char *op, long ret, int err, const void *buf)
{
	res(c, op, ret, err, buf, ret);
}

static int cloexec(int fd)
{
	int f = fcntl(fd, F_GETFD);
	return f < 0 ? -1 : !!(f & FD_CLOEXEC);
}

/* A descriptor: relative to the first in the lone run, "ok" in threads. */
static void fdres(struct ctx *c, const char *op, int fd, int err)
{
	if (fd < 0) {
		emit(c, "%s: fd=-1 errno=%s", op, ename(err));
		return;
	}
	if (c->base < 0 && c->solo)
		c->base = fd;
	if (c->solo)
		emit(c, "%s: fd=base%+d cloexec=%d", op, fd - c->base, cloexec(fd));
	else
		emit(c, "%s: fd=ok cloexec=%d", op, cloexec(fd));
}

/* Call first, then read errno: argument evaluation order is unspecified. */
#define RD(op, call, buf)                              \
	do {                                           \
		long r_ = (long)(call);                \
		int e_ = errno;                        \
		rd(c, (op), r_, e_, (buf));            \
	} while (0)
#define RES(op, call)                                  \
	do {                                           \
		long r_ = (long)(call);                \
		int e_ = errno;                        \
		res(c, (op), r_, e_, NULL, 0);         \
	} while (0)
#define FDRES(op, call)                                \
	do {                                           \
		int r_ = (call);                       \
		int e_ = errno;                        \
		fdres(c, (op), r_, e_);                \
	} while (0)

/* An operation's name; errno as it was. */
static const char *opname(char *op, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static const char *opname(char *op, size_t len, const char *fmt, ...)
{
	int saved = errno;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(op, len, fmt, ap);
	va_end(ap);
	errno = saved;
	return op;
}

/* ---- fixtures ---------------------------------------------------------------- */

static void fill(unsigned char *b, long n, uint32_t seed)
{
	uint32_t x = seed;
	for (long i = 0; i < n; i++) {
		x ^= x << 13;
		x ^= x >> 17;
		x ^= x << 5;
		b[i] = (unsigned char)(x >> 11);
	}
}

static void die(const char *what, const char *path)
{
	fprintf(stderr, "ts-posixcheck: %s %s: %s\n", what, path, strerror(errno));
	exit(2);
}

static void write_file(const char *path, long n, uint32_t seed)
{
	unsigned char *b = malloc((size_t)n + 1);
	if (!b)
		die("malloc for", path);
	fill(b, n, seed);
	if (n >= 3) { /* looks like a JPEG start; nothing here decodes it */
		b[0] = 0xff;
		b[1] = 0xd8;
		b[2] = 0xff;
	}
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	if (fd < 0)
		die("cannot create", path);
	for (long off = 0; off < n;) {
		ssize_t w = write(fd, b + off, (size_t)(n - off));
		if (w <= 0)
			die("cannot write", path);
		off += w;
	}
	if (close(fd) != 0)
		die("cannot close", path);
	free(b);
}

static void make_fixtures(const char *dir)
{
	char p[PATH_MAX + 32];
	if (mkdir(dir, 0755) != 0 && errno != EEXIST)
		die("cannot create", dir);
	snprintf(p, sizeof(p), "%s/data.jpg", dir);
	write_file(p, SZ_DATA, 0x12345678u);
	snprintf(p, sizeof(p), "%s/plain.bin", dir);
	write_file(p, SZ_PLAIN, 0x9abcdef1u);
	snprintf(p, sizeof(p), "%s/empty.jpg", dir);
	write_file(p, 0, 1);
	snprintf(p, sizeof(p), "%s/x.jpg", dir);
	if (mkdir(p, 0755) != 0 && errno != EEXIST)
		die("cannot create", p);
	snprintf(p, sizeof(p), "%s/link.jpg", dir);
	unlink(p);
	if (symlink("data.jpg", p) != 0)
		die("cannot create", p);
}

/* ---- the script ---------------------------------------------------------------- */

/* Path helpers: relative to the working directory (DIR) or absolute. */
#define REL(name) (snprintf(rel, sizeof(rel), "%s/%s", c->sub, (name)), rel)
#define ABS(name) (snprintf(abs, sizeof(abs), "%s/%s", c->dir, (name)), abs)

/* Reads, seeks and positional reads of one file of `size` bytes. */
static void read_suite(struct ctx *c, const char *tag, const char *path, long size)
{
	unsigned char *b = c->buf;
	char op[96];
	long r;
	int e;
#define OP(fmt, ...) opname(op, sizeof(op), "%s " fmt, tag, ##__VA_ARGS__)

	int fd = open(path, O_RDONLY);
	fdres(c, OP("open"), fd, errno);

	r = read(fd, b, 0);
	rd(c, OP("read 0"), r, errno, b);
	for (int i = 0; i < 5; i++) { /* a 1-byte buffer, byte by byte */
		unsigned char one = 0xee;
		r = read(fd, &one, 1);
		e = errno;
		if (r < 0)
			rd(c, OP("read 1-byte #%d", i), r, e, NULL);
		else
			emit(c, "%s: ret=%ld byte=%u", OP("read 1-byte #%d", i), r, r == 1 ? one : 0u);
	}
	static const long sizes[] = { 7, 4096, 65537, BUFSZ, 4096, 1 };
	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		r = read(fd, b, (size_t)sizes[i]);
		rd(c, OP("read %ld", sizes[i]), r, errno, b);
	}
	r = read(fd, b, 0);
	rd(c, OP("read 0 at EOF"), r, errno, b);

	RES(OP("lseek64 SET 0"), (long)lseek64(fd, 0, SEEK_SET));
	RD(OP("read 100"), read(fd, b, 100), b);
	RES(OP("lseek64 CUR +50"), (long)lseek64(fd, 50, SEEK_CUR));
	RD(OP("read 100"), read(fd, b, 100), b);
	RES(OP("lseek64 CUR -100000"), (long)lseek64(fd, -100000, SEEK_CUR));
	RES(OP("lseek64 CUR 0"), (long)lseek64(fd, 0, SEEK_CUR));
	RES(OP("lseek64 END -10"), (long)lseek64(fd, -10, SEEK_END));
	RD(OP("read 4096 short"), read(fd, b, 4096), b);
	RD(OP("read 4096 at EOF"), read(fd, b, 4096), b);
	RES(OP("lseek64 END 0"), (long)lseek64(fd, 0, SEEK_END));
	RD(OP("read at END"), read(fd, b, 10), b);
	RES(OP("lseek64 END +1000"), (long)lseek64(fd, 1000, SEEK_END));
	RD(OP("read past END"), read(fd, b, 10), b);
	RES(OP("lseek64 SET size-1"), (long)lseek64(fd, size - 1, SEEK_SET));
	RD(OP("read 1 last"), read(fd, b, 1), b);
	RD(OP("read 1 after"), read(fd, b, 1), b);

	/* pread64 never moves the offset. */
	RES(OP("lseek64 SET 77"), (long)lseek64(fd, 77, SEEK_SET));
	static const long poffs[] = { 0, 1000, SZ_DATA - 5, SZ_PLAIN - 5, SZ_DATA, SZ_DATA + 1000, -1 };
	for (size_t i = 0; i < sizeof(poffs) / sizeof(poffs[0]); i++) {
		r = pread64(fd, b, 4096, poffs[i]);
		rd(c, OP("pread64 4096 at %ld", poffs[i]), r, errno, b);
	}
	RD(OP("pread 33 at 7"), pread(fd, b, 33, 7), b);
	RD(OP("pread 10 at size"), pread(fd, b, 10, size), b);
	RD(OP("pread 10 at -5"), pread(fd, b, 10, -5), b);
	RD(OP("__pread64_chk 200 at 3"), __pread64_chk(fd, b, 200, 3, BUFSZ), b);
	RD(OP("__pread64_chk 200 at size-7"), __pread64_chk(fd, b, 200, size - 7, BUFSZ), b);
	RES(OP("offset after preads"), (long)lseek64(fd, 0, SEEK_CUR));
	RD(OP("read 20 after preads"), read(fd, b, 20), b);

	/* readv/preadv across three buffers, one of them empty. */
	unsigned char *v0 = b, *v1 = b + 1000, *v2 = b + 2000;
	volatile int minus_one = -1; /* hidden from the compiler's access checks */
	struct iovec iov[3];
#define IOV(a, b_, c_)                                                   \
	(iov[0] = (struct iovec){ v0, (a) }, iov[1] = (struct iovec){ v1, (b_) }, \
	 iov[2] = (struct iovec){ v2, (c_) }, iov)
#define VRES(name, call)                                                                      \
	do {                                                                                  \
		memset(b, 0, 3000);                                                           \
		long n_ = (long)(call);                                                       \
		int e_ = errno;                                                               \
		uint64_t h_ = fnv(v0, iov[0].iov_len) ^ fnv(v1, iov[1].iov_len) * 3 ^ fnv(v2, iov[2].iov_len) * 7; \
		if (n_ < 0)                                                                   \
			emit(c, "%s: ret=%ld errno=%s", name, n_, ename(e_));                 \
		else                                                                          \
			emit(c, "%s: ret=%ld hash=%016llx", name, n_, (unsigned long long)h_); \
	} while (0)
	RES(OP("lseek64 SET 0"), (long)lseek64(fd, 0, SEEK_SET));
	VRES(OP("readv 10,0,100"), readv(fd, IOV(10, 0, 100), 3));
	VRES(OP("readv 0,50,50"), readv(fd, IOV(0, 50, 50), 3));
	RES(OP("offset after readv"), (long)lseek64(fd, 0, SEEK_CUR));
	RES(OP("lseek64 END -30"), (long)lseek64(fd, -30, SEEK_END));
	VRES(OP("readv 10,0,100 short"), readv(fd, IOV(10, 0, 100), 3));
	VRES(OP("readv at EOF"), readv(fd, IOV(10, 0, 100), 3));
	VRES(OP("readv cnt 0"), readv(fd, IOV(10, 0, 100), 0));
	VRES(OP("readv cnt -1"), readv(fd, IOV(10, 0, 100), minus_one));
	RES(OP("lseek64 SET 5"), (long)lseek64(fd, 5, SEEK_SET));
	VRES(OP("preadv 10,0,100 at 0"), preadv(fd, IOV(10, 0, 100), 3, 0));
	VRES(OP("preadv 0,10,10 at 4990"), preadv(fd, IOV(0, 10, 10), 3, 4990));
	VRES(OP("preadv 10,0,100 at size-30"), preadv(fd, IOV(10, 0, 100), 3, size - 30));
	VRES(OP("preadv at size"), preadv(fd, IOV(10, 0, 100), 3, size));
	VRES(OP("preadv at -1"), preadv(fd, IOV(10, 0, 100), 3, -1));
	RES(OP("offset after preadv"), (long)lseek64(fd, 0, SEEK_CUR));

	/* The fortified read. */
	RES(OP("lseek64 SET 0"), (long)lseek64(fd, 0, SEEK_SET));
	RD(OP("__read_chk 300"), __read_chk(fd, b, 300, BUFSZ), b);
	RD(OP("__read_chk rest"), __read_chk(fd, b, BUFSZ, BUFSZ), b);
	RD(OP("__read_chk at EOF"), __read_chk(fd, b, 300, BUFSZ), b);

	/* A bad buffer: EFAULT (0 at EOF of an empty file). */
	RES(OP("lseek64 SET 0"), (long)lseek64(fd, 0, SEEK_SET));
	void *volatile bad = NULL;
	RD(OP("read into NULL"), read(fd, bad, 16), NULL);

	/* errno stays what it was across successful calls. */
	errno = ERRNO_SENTINEL;
	r = read(fd, b, 10);
	e = errno;
	emit(c, "%s: ret=%ld errno after=%s", OP("errno: read"), r, ename(e));
	errno = ERRNO_SENTINEL;
	r = read(fd, b, BUFSZ);
	r += read(fd, b, BUFSZ); /* the second one at EOF */
	e = errno;
	emit(c, "%s: ret=%ld errno after=%s", OP("errno: read to EOF"), r, ename(e));
	errno = ERRNO_SENTINEL;
	r = pread64(fd, b, 10, 0);
	e = errno;
	emit(c, "%s: ret=%ld errno after=%s", OP("errno: pread64"), r, ename(e));
	errno = ERRNO_SENTINEL;
	r = readv(fd, IOV(10, 0, 10), 3);
	e = errno;
	emit(c, "%s: ret=%ld errno after=%s", OP("errno: readv"), r, ename(e));
	errno = ERRNO_SENTINEL;
	r = preadv(fd, IOV(10, 0, 10), 3, 0);
	e = errno;
	emit(c, "%s: ret=%ld errno after=%s", OP("errno: preadv"), r, ename(e));
	errno = ERRNO_SENTINEL;
	r = __read_chk(fd, b, 10, BUFSZ);
	e = errno;
	emit(c, "%s: ret=%ld errno after=%s", OP("errno: __read_chk"), r, ename(e));
	errno = ERRNO_SENTINEL;
	r = close(fd);
	e = errno;
	emit(c, "%s: ret=%ld errno after=%s", OP("errno: close"), r, ename(e));
#undef OP
}

/* A new file in the scope: created write-only, written, read back. */
static void new_file(struct ctx *c, int dfd)
{
	char rel[PATH_MAX + 32];
	unsigned char *b = c->buf;
	unsigned char w[SZ_NEW + 100];
	fill(w, (long)sizeof(w), 0x55aa55aau);
	int fd = open(REL("new.jpg"), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0640);
	fdres(c, "new: open WRONLY|CREAT|EXCL|CLOEXEC", fd, errno);
	RES("new: write", (long)write(fd, w, SZ_NEW));
	RD("new: read on write-only", read(fd, b, 10), b);
	RD("new: pread64 on write-only", pread64(fd, b, 10, 0), b);
	RES("new: close", close(fd));
	fd = open(REL("new.jpg"), O_WRONLY | O_CREAT | O_EXCL, 0640);
	fdres(c, "new: open CREAT|EXCL again", fd, errno);
	struct stat sb;
	int sr = stat(REL("new.jpg"), &sb);
	emit(c, "new: stat ret=%d mode=%o size=%ld", sr, sr ? 0 : (unsigned)(sb.st_mode & 07777),
	     sr ? -1L : (long)sb.st_size);

	fd = open(REL("new.jpg"), O_RDONLY);
	fdres(c, "new: open RDONLY", fd, errno);
	RD("new: read all", read(fd, b, BUFSZ), b);
	RD("new: read at EOF", read(fd, b, BUFSZ), b);
	RES("new: close", close(fd));

	fd = open(REL("new.jpg"), O_RDWR);
	fdres(c, "new: open RDWR", fd, errno);
	RES("new: lseek64 END", (long)lseek64(fd, 0, SEEK_END));
	RES("new: append 100", (long)write(fd, w + SZ_NEW, 100));
	RES("new: lseek64 SET 2990", (long)lseek64(fd, 2990, SEEK_SET));
	RD("new: read 200", read(fd, b, 200), b);
	RES("new: close", close(fd));

	fd = openat(dfd, "new.jpg", O_RDONLY | O_CLOEXEC);
	fdres(c, "new: openat RDONLY|CLOEXEC", fd, errno);
	RD("new: read all", read(fd, b, BUFSZ), b);
	RES("new: close", close(fd));

	/* Truncated under a reader that had tracked it: the reader sees EOF. */
	int reader = open(REL("new.jpg"), O_RDONLY);
	fdres(c, "new: open reader", reader, errno);
	RD("new: reader reads 64", read(reader, b, 64), b);
	fd = open(REL("new.jpg"), O_WRONLY | O_TRUNC);
	fdres(c, "new: open WRONLY|TRUNC", fd, errno);
	RES("new: close", close(fd));
	RD("new: reader after truncate", read(reader, b, 64), b);
	RD("new: reader pread64 at 0", pread64(reader, b, 64, 0), b);
	RES("new: close reader", close(reader));

	fd = open(REL("new.jpg"), O_RDONLY | O_CREAT, 0600); /* exists: mode ignored */
	fdres(c, "new: open RDONLY|CREAT existing", fd, errno);
	RD("new: read empty", read(fd, b, 10), b);
	RES("new: close", close(fd));
}

/* dup, dup2, dup3: shared offsets, FD_CLOEXEC, replacing a tracked descriptor. */
static void dups(struct ctx *c)
{
	char rel[PATH_MAX + 32];
	unsigned char *b = c->buf;
	int e;
	int fd = open(REL("data.jpg"), O_RDONLY);
	fdres(c, "dup: open data", fd, errno);
	RD("dup: read 100 from fd", read(fd, b, 100), b);
	int d = dup(fd);
	fdres(c, "dup: dup(fd)", d, errno);
	RES("dup: offset of dup", (long)lseek64(d, 0, SEEK_CUR));
	RD("dup: read 50 from dup", read(d, b, 50), b);
	RES("dup: offset of fd", (long)lseek64(fd, 0, SEEK_CUR));
	RES("dup: lseek64 dup SET 5000", (long)lseek64(d, 5000, SEEK_SET));
	RD("dup: read 64 from fd", read(fd, b, 64), b);
	RES("dup: offset of dup", (long)lseek64(d, 0, SEEK_CUR));
	RES("dup: close fd", close(fd));
	RD("dup: dup still reads", read(d, b, 10), b);

	/* dup2 onto the private number, then close it twice. */
	int h = dup2(d, c->hi);
	e = errno;
	emit(c, "dup: dup2(dup, hi): %s cloexec=%d", h == c->hi ? "hi" : ename(e), cloexec(c->hi));
	RD("dup: read 10 from hi", read(c->hi, b, 10), b);
	RES("dup: offset of dup", (long)lseek64(d, 0, SEEK_CUR));
	RD("dup: pread64 hi 16 at 0", pread64(c->hi, b, 16, 0), b);
	RES("dup: close hi", close(c->hi));
	RD("dup: read closed hi", read(c->hi, b, 10), b);
	RD("dup: pread64 closed hi", pread64(c->hi, b, 10, 0), b);
	struct iovec one = { b, 10 };
	RD("dup: readv closed hi", readv(c->hi, &one, 1), b);
	RD("dup: __read_chk closed hi", __read_chk(c->hi, b, 10, BUFSZ), b);
	RES("dup: close hi again", close(c->hi));
	RES("dup: lseek64 closed hi", (long)lseek64(c->hi, 0, SEEK_CUR));
	FDRES("dup: dup(closed hi)", dup(c->hi));
	FDRES("dup: dup(-1)", dup(-1));

	/* close_range on the private number only (other threads own the rest). */
	h = dup2(d, c->hi);
	RD("close_range: read 10 from hi", read(c->hi, b, 10), b);
	RES("close_range: CLOEXEC only", close_range((unsigned)c->hi, (unsigned)c->hi, CLOSE_RANGE_CLOEXEC));
	emit(c, "close_range: cloexec=%d", cloexec(c->hi));
	RD("close_range: still reads", read(c->hi, b, 10), b);
	RES("close_range: hi..hi", close_range((unsigned)c->hi, (unsigned)c->hi, 0));
	RD("close_range: read closed hi", read(c->hi, b, 10), b);
	RES("close_range: first > last", close_range((unsigned)c->hi, (unsigned)c->hi - 1, 0));

	/* dup3 with O_CLOEXEC onto a descriptor of another (tracked) file. */
	int t = open(REL("empty.jpg"), O_RDONLY);
	fdres(c, "dup: open empty (target)", t, errno);
	int r3 = dup3(d, t, O_CLOEXEC);
	e = errno;
	emit(c, "dup: dup3(dup, target, CLOEXEC): %s cloexec=%d dup cloexec=%d", r3 == t ? "target" : ename(e),
	     cloexec(t), cloexec(d));
	RD("dup: read 10 from dup3 target", read(t, b, 10), b);
	RES("dup: offset of dup", (long)lseek64(d, 0, SEEK_CUR));
	RES("dup: dup3(dup, dup, CLOEXEC)", dup3(d, d, O_CLOEXEC));
	RES("dup: dup3 bad flags", dup3(d, t, 0x40000000));
	RD("dup: target still reads", read(t, b, 10), b);
	RES("dup: dup2(dup, dup) is dup", dup2(d, d) == d);
	RES("dup: dup2(closed hi, target)", dup2(c->hi, t));
	RD("dup: target still reads", read(t, b, 10), b);
	RES("dup: dup3(closed hi, target, 0)", dup3(c->hi, t, 0));
	RD("dup: target still reads", read(t, b, 10), b);
	emit(c, "dup: target cloexec=%d", cloexec(t));
	RES("dup: close target", close(t));

	int x = open(REL("data.jpg"), O_RDONLY | O_CLOEXEC);
	fdres(c, "dup: open CLOEXEC", x, errno);
	int xd = dup(x);
	fdres(c, "dup: dup of CLOEXEC fd", xd, errno);
	int xt = open(REL("plain.bin"), O_RDONLY);
	int x2 = dup2(x, xt);
	e = errno;
	emit(c, "dup: dup2 of CLOEXEC fd: %s cloexec=%d", x2 == xt ? "target" : ename(e), cloexec(xt));
	RES("dup: close", close(xt));
	RES("dup: close", close(xd));
	RES("dup: close", close(x));
	RES("dup: close dup", close(d));

	/* dup2 onto a tracked descriptor that had read its file's start. */
	int a = open(REL("data.jpg"), O_RDONLY);
	fdres(c, "dup2: open data (tracked)", a, errno);
	RD("dup2: read 32 from data", read(a, b, 32), b);
	int p = open(REL("plain.bin"), O_RDONLY);
	fdres(c, "dup2: open plain", p, errno);
	RD("dup2: read 16 from plain", read(p, b, 16), b);
	errno = ERRNO_SENTINEL;
	int r2 = dup2(p, a);
	int e2 = errno;
	emit(c, "dup2: dup2(plain, data): %s errno after=%s", r2 == a ? "data" : "other", ename(e2));
	RD("dup2: read 64 via old data fd", read(a, b, 64), b);
	RES("dup2: offset of plain", (long)lseek64(p, 0, SEEK_CUR));
	RD("dup2: pread64 32 at 0 via old data fd", pread64(a, b, 32, 0), b);
	RES("dup2: lseek64 END via old data fd", (long)lseek64(a, 0, SEEK_END));
	RES("dup2: close plain", close(p));
	RES("dup2: lseek64 SET 100", (long)lseek64(a, 100, SEEK_SET));
	RD("dup2: still reads plain", read(a, b, 10), b);
	RES("dup2: close", close(a));

	/* And a tracked file onto an untracked descriptor. */
	int u = open(REL("plain.bin"), O_RDONLY);
	int s = open(REL("data.jpg"), O_RDONLY);
	RD("dup2: read 8 from plain", read(u, b, 8), b);
	errno = ERRNO_SENTINEL;
	r2 = dup3(s, u, 0);
	e2 = errno;
	emit(c, "dup2: dup3(data, plain, 0): %s errno after=%s", r2 == u ? "plain" : "other", ename(e2));
	RD("dup2: read 100 via old plain fd", read(u, b, 100), b);
	RD("dup2: read 100 via data fd", read(s, b, 100), b);
	RES("dup2: close", close(s));
	RES("dup2: close", close(u));
}

/* stdio streams. */
static void stdio_suite(struct ctx *c)
{
	char rel[PATH_MAX + 32];
	unsigned char *b = c->buf;
	size_t n;
	long r;
	int e;

	errno = ERRNO_SENTINEL;
	FILE *f = fopen(REL("data.jpg"), "r");
	e = errno;
	emit(c, "fopen data r: %s errno after=%s cloexec=%d", f ? "ok" : "NULL", ename(e), f ? cloexec(fileno(f)) : -1);
	if (!f)
		return;
	errno = ERRNO_SENTINEL;
	n = fread(b, 1, 1000, f);
	e = errno;
	emit(c, "fread 1x1000: %zu errno after=%s hash=%016llx", n, ename(e), (unsigned long long)fnv(b, n));
	n = fread(b, 7, 100, f);
	emit(c, "fread 7x100: %zu hash=%016llx", n, (unsigned long long)fnv(b, n * 7));
	emit(c, "ftell: %ld", ftell(f));
	emit(c, "fgetc: %d", fgetc(f));
	emit(c, "fseek END -10: %d", fseek(f, -10, SEEK_END));
	emit(c, "ftell: %ld", ftell(f));
	n = fread(b, 4, 10, f);
	emit(c, "fread 4x10 at END-10: %zu hash=%016llx feof=%d ferror=%d", n, (unsigned long long)fnv(b, n * 4),
	     feof(f) != 0, ferror(f) != 0);
	errno = ERRNO_SENTINEL;
	n = fread(b, 1, 10, f);
	e = errno;
	emit(c, "fread after EOF: %zu feof=%d ferror=%d errno after=%s", n, feof(f) != 0, ferror(f) != 0, ename(e));
	clearerr(f);
	emit(c, "fseek SET 0: %d", fseek(f, 0, SEEK_SET));
	n = fread(b, 1, BUFSZ, f);
	emit(c, "fread all: %zu hash=%016llx feof=%d", n, (unsigned long long)fnv(b, n), feof(f) != 0);
	rewind(f);
	n = fread(b, 65536, 2, f);
	emit(c, "fread 65536x2: %zu hash=%016llx feof=%d ftell=%ld", n, (unsigned long long)fnv(b, n * 65536),
	     feof(f) != 0, ftell(f));
	rewind(f);
	emit(c, "fread 0x10: %zu", fread(b, 0, 10, f));
	n = fread(b, 10, 0, f);
	emit(c, "fread 10x0: %zu feof=%d ftell=%ld", n, feof(f) != 0, ftell(f));
	emit(c, "fseek SET 99999: %d", fseek(f, 99999, SEEK_SET));
	n = fread(b, 1, 3, f);
	emit(c, "fread 3 at 99999: %zu hash=%016llx", n, (unsigned long long)fnv(b, n));
	n = fread(b, 1, 3, f);
	emit(c, "fread 3 more: %zu hash=%016llx feof=%d", n, (unsigned long long)fnv(b, n), feof(f) != 0);
	r = fseek(f, 200000, SEEK_SET);
	emit(c, "fseek SET 200000: %ld ftell=%ld", r, ftell(f));
	n = fread(b, 1, 10, f);
	emit(c, "fread past END: %zu feof=%d", n, feof(f) != 0);
	r = fseek(f, -1, SEEK_SET);
	e = errno;
	emit(c, "fseek SET -1: %ld errno=%s ftell=%ld", r, ename(e), ftell(f));
	errno = ERRNO_SENTINEL;
	r = fclose(f);
	e = errno;
	emit(c, "fclose: %ld errno after=%s", r, ename(e));

	f = fopen(REL("data.jpg"), "re");
	emit(c, "fopen data re: %s cloexec=%d", f ? "ok" : "NULL", f ? cloexec(fileno(f)) : -1);
	if (f) {
		n = fread(b, 1, 10, f);
		emit(c, "fread 10: %zu hash=%016llx", n, (unsigned long long)fnv(b, n));
		emit(c, "fclose: %d", fclose(f));
	}
	f = fopen64(REL("data.jpg"), "rb");
	emit(c, "fopen64 data rb: %s", f ? "ok" : "NULL");
	if (f) {
		for (int i = 0; i < 3; i++) {
			n = fread(b, 1, 50000, f);
			emit(c, "fread 50000 #%d: %zu hash=%016llx feof=%d", i, n, (unsigned long long)fnv(b, n),
			     feof(f) != 0);
		}
		emit(c, "fclose: %d", fclose(f));
	}
	f = fopen(REL("link.jpg"), "r");
	emit(c, "fopen link r: %s", f ? "ok" : "NULL");
	if (f) {
		n = fread(b, 1, 64, f);
		emit(c, "fread 64: %zu hash=%016llx", n, (unsigned long long)fnv(b, n));
		emit(c, "fclose: %d", fclose(f));
	}
	f = fopen(REL("plain.bin"), "r");
	emit(c, "fopen plain r: %s", f ? "ok" : "NULL");
	if (f) {
		n = fread(b, 3, 2000, f);
		emit(c, "fread 3x2000: %zu hash=%016llx feof=%d", n, (unsigned long long)fnv(b, n * 3), feof(f) != 0);
		emit(c, "fclose: %d", fclose(f));
	}

	errno = 0;
	f = fopen(REL("missing.jpg"), "r");
	e = errno;
	emit(c, "fopen missing: %s errno=%s", f ? "ok" : "NULL", ename(e));
	if (f)
		fclose(f);
	errno = 0;
	f = fopen64(REL("missing.jpg"), "rb");
	e = errno;
	emit(c, "fopen64 missing: %s errno=%s", f ? "ok" : "NULL", ename(e));
	if (f)
		fclose(f);

	f = fopen(REL("x.jpg"), "r"); /* a directory: opens, reads fail */
	emit(c, "fopen dir r: %s", f ? "ok" : "NULL");
	if (f) {
		errno = 0;
		n = fread(b, 1, 10, f);
		e = errno;
		emit(c, "fread dir: %zu feof=%d ferror=%d errno=%s", n, feof(f) != 0, ferror(f) != 0, ename(e));
		emit(c, "fclose: %d", fclose(f));
	}
	errno = 0;
	f = fopen(REL("x.jpg"), "w");
	e = errno;
	emit(c, "fopen dir w: %s errno=%s", f ? "ok" : "NULL", ename(e));
	if (f)
		fclose(f);

	f = fopen(REL("empty.jpg"), "r");
	emit(c, "fopen empty r: %s", f ? "ok" : "NULL");
	if (f) {
		errno = ERRNO_SENTINEL;
		n = fread(b, 1, 10, f);
		e = errno;
		emit(c, "fread empty: %zu feof=%d ferror=%d errno after=%s", n, feof(f) != 0, ferror(f) != 0, ename(e));
		emit(c, "fclose: %d", fclose(f));
	}

	f = fopen(REL("newf.jpg"), "w");
	emit(c, "fopen newf w: %s", f ? "ok" : "NULL");
	if (f) {
		fill(b, 5000, 0x31415926u);
		emit(c, "fwrite 5000: %zu", fwrite(b, 1, 5000, f));
		emit(c, "fclose: %d", fclose(f));
	}
	f = fopen(REL("newf.jpg"), "r");
	emit(c, "fopen newf r: %s", f ? "ok" : "NULL");
	if (f) {
		n = fread(b, 1, BUFSZ, f);
		emit(c, "fread all: %zu hash=%016llx feof=%d", n, (unsigned long long)fnv(b, n), feof(f) != 0);
		emit(c, "fclose: %d", fclose(f));
	}
	f = fopen(REL("newf.jpg"), "r+");
	emit(c, "fopen newf r+: %s", f ? "ok" : "NULL");
	if (f) {
		n = fread(b, 1, 100, f);
		emit(c, "fread 100: %zu hash=%016llx", n, (unsigned long long)fnv(b, n));
		emit(c, "fclose: %d", fclose(f));
	}

	/* A stream over a descriptor the shim tracks (fdopen), then freopen. */
	int fd = open(REL("data.jpg"), O_RDONLY);
	f = fd >= 0 ? fdopen(fd, "r") : NULL;
	emit(c, "fdopen data: %s", f ? "ok" : "NULL");
	if (f) {
		n = fread(b, 1, 200, f);
		emit(c, "fread 200: %zu hash=%016llx", n, (unsigned long long)fnv(b, n));
		f = freopen(REL("plain.bin"), "r", f);
		emit(c, "freopen plain: %s", f ? "ok" : "NULL");
	}
	if (f) {
		n = fread(b, 1, 200, f);
		emit(c, "fread 200: %zu hash=%016llx", n, (unsigned long long)fnv(b, n));
		emit(c, "fclose: %d", fclose(f));
	}

	/* Streams without a descriptor: nothing of the shim may show. */
	static char mem[100];
	memset(mem, 'm', sizeof(mem));
	errno = ERRNO_SENTINEL;
	f = fmemopen(mem, sizeof(mem), "r");
	e = errno;
	emit(c, "fmemopen: %s errno after=%s", f ? "ok" : "NULL", ename(e));
	if (f) {
		errno = ERRNO_SENTINEL;
		n = fread(b, 1, 60, f);
		e = errno;
		emit(c, "fread mem 60: %zu errno after=%s hash=%016llx", n, ename(e), (unsigned long long)fnv(b, n));
		n = fread(b, 1, 60, f);
		emit(c, "fread mem 60: %zu feof=%d hash=%016llx", n, feof(f) != 0, (unsigned long long)fnv(b, n));
		errno = ERRNO_SENTINEL;
		r = fclose(f);
		e = errno;
		emit(c, "fclose mem: %ld errno after=%s", r, ename(e));
	}
}

static void script(struct ctx *c)
{
	char rel[PATH_MAX + 32], abs[PATH_MAX + 32];
	unsigned char *b = c->buf;
	long r;
	int fd, e;

	/* Leftovers of an earlier run (printed nowhere: the first run differs). */
	unlink(REL("new.jpg"));
	unlink(REL("newf.jpg"));
	c->base = -1;

	/* ---- opens ---- */
	fd = open(REL("data.jpg"), O_RDONLY);
	fdres(c, "open rel RDONLY", fd, errno);
	RES("close", close(fd));
	fd = open(ABS("data.jpg"), O_RDONLY | O_CLOEXEC);
	fdres(c, "open abs RDONLY|CLOEXEC", fd, errno);
	RES("close", close(fd));
	fd = open64(REL("data.jpg"), O_RDONLY);
	fdres(c, "open64 rel RDONLY", fd, errno);
	RES("close", close(fd));
	fd = open64(ABS("data.jpg"), O_RDONLY | O_CLOEXEC);
	fdres(c, "open64 abs RDONLY|CLOEXEC", fd, errno);
	RES("close", close(fd));

	int dfd = open(c->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	fdres(c, "open dir O_DIRECTORY|CLOEXEC", dfd, errno);
	fd = openat(dfd, "data.jpg", O_RDONLY);
	fdres(c, "openat dirfd rel", fd, errno);
	RD("read 16", read(fd, b, 16), b);
	RES("close", close(fd));
	fd = openat(dfd, "data.jpg", O_RDONLY | O_CLOEXEC);
	fdres(c, "openat dirfd rel CLOEXEC", fd, errno);
	RES("close", close(fd));
	fd = openat(AT_FDCWD, REL("data.jpg"), O_RDONLY);
	fdres(c, "openat AT_FDCWD rel", fd, errno);
	RES("close", close(fd));
	fd = openat(AT_FDCWD, ABS("data.jpg"), O_RDONLY | O_CLOEXEC);
	fdres(c, "openat AT_FDCWD abs CLOEXEC", fd, errno);
	RES("close", close(fd));
	fd = openat(dfd, ABS("plain.bin"), O_RDONLY);
	fdres(c, "openat dirfd abs (dirfd ignored)", fd, errno);
	RD("read 16", read(fd, b, 16), b);
	RES("close", close(fd));
	snprintf(rel, sizeof(rel), "../%s/./x.jpg/../data.jpg", c->sub);
	fd = openat(dfd, rel, O_RDONLY);
	fdres(c, "openat dirfd ../sub/./x.jpg/../data.jpg", fd, errno);
	RD("read 16", read(fd, b, 16), b);
	RES("close", close(fd));
	fd = openat(-1, "data.jpg", O_RDONLY);
	fdres(c, "openat -1 rel", fd, errno);
	fd = openat(-1, ABS("data.jpg"), O_RDONLY);
	fdres(c, "openat -1 abs", fd, errno);
	RES("close", close(fd));
	int ffd = open(REL("data.jpg"), O_RDONLY);
	fd = openat(ffd, "data.jpg", O_RDONLY);
	fdres(c, "openat file-fd rel", fd, errno);
	RES("close", close(ffd));
	fd = openat64(dfd, "data.jpg", O_RDONLY | O_CLOEXEC);
	fdres(c, "openat64 dirfd rel CLOEXEC", fd, errno);
	RES("close", close(fd));
	fd = openat(dfd, "missing.jpg", O_RDONLY);
	fdres(c, "openat missing", fd, errno);

	fd = __open_2(REL("data.jpg"), O_RDONLY);
	fdres(c, "__open_2 rel", fd, errno);
	RD("read 16", read(fd, b, 16), b);
	RES("close", close(fd));
	fd = __open_2(ABS("data.jpg"), O_RDONLY | O_CLOEXEC);
	fdres(c, "__open_2 abs CLOEXEC", fd, errno);
	RES("close", close(fd));
	fd = __open64_2(REL("data.jpg"), O_RDONLY);
	fdres(c, "__open64_2 rel", fd, errno);
	RES("close", close(fd));
	fd = __openat_2(dfd, "data.jpg", O_RDONLY | O_CLOEXEC);
	fdres(c, "__openat_2 dirfd CLOEXEC", fd, errno);
	RES("close", close(fd));
	fd = __open_2(REL("missing.jpg"), O_RDONLY);
	fdres(c, "__open_2 missing", fd, errno);
	fd = __openat_2(dfd, "missing.jpg", O_RDONLY);
	fdres(c, "__openat_2 missing", fd, errno);

	fd = open(REL("missing.jpg"), O_RDONLY);
	fdres(c, "open missing", fd, errno);
	fd = open64(ABS("missing.jpg"), O_RDONLY);
	fdres(c, "open64 missing", fd, errno);
	fd = open(REL("data.jpg/"), O_RDONLY);
	fdres(c, "open data.jpg/", fd, errno);
	fd = open(REL("data.jpg"), O_RDONLY | O_DIRECTORY);
	fdres(c, "open data O_DIRECTORY", fd, errno);
	fd = open(REL("x.jpg"), O_WRONLY);
	fdres(c, "open dir WRONLY", fd, errno);
	fd = open(REL("link.jpg"), O_RDONLY);
	fdres(c, "open symlink", fd, errno);
	RD("read 64", read(fd, b, 64), b);
	RES("close", close(fd));
	fd = open(REL("link.jpg"), O_RDONLY | O_NOFOLLOW);
	fdres(c, "open symlink NOFOLLOW", fd, errno);
	fd = open(REL("data.jpg"), O_RDONLY | O_PATH);
	fdres(c, "open O_PATH", fd, errno);
	RD("read O_PATH", read(fd, b, 10), b);
	RES("close", close(fd));
	errno = ERRNO_SENTINEL;
	fd = open(REL("data.jpg"), O_RDONLY);
	e = errno;
	emit(c, "errno: open ok: errno after=%s", ename(e));
	errno = ERRNO_SENTINEL;
	int fd2 = openat(dfd, "plain.bin", O_RDONLY);
	e = errno;
	emit(c, "errno: openat ok: errno after=%s", ename(e));
	errno = ERRNO_SENTINEL;
	r = close(fd2);
	e = errno;
	emit(c, "errno: close ok: %ld errno after=%s", r, ename(e));
	errno = ERRNO_SENTINEL;
	r = lseek64(fd, 10, SEEK_SET);
	e = errno;
	emit(c, "errno: lseek64 ok: %ld errno after=%s", r, ename(e));
	errno = ERRNO_SENTINEL;
	int fd3 = dup(fd);
	e = errno;
	emit(c, "errno: dup ok: errno after=%s", ename(e));
	errno = ERRNO_SENTINEL;
	r = dup2(fd, fd3) == fd3;
	e = errno;
	emit(c, "errno: dup2 ok: %ld errno after=%s", r, ename(e));
	errno = ERRNO_SENTINEL;
	r = dup3(fd, fd3, O_CLOEXEC) == fd3;
	e = errno;
	emit(c, "errno: dup3 ok: %ld errno after=%s", r, ename(e));
	close(fd3);
	close(fd);

	/* ---- a directory ---- */
	fd = open(REL("x.jpg"), O_RDONLY);
	fdres(c, "open dir x.jpg", fd, errno);
	RD("read dir", read(fd, b, 10), b);
	RD("pread64 dir", pread64(fd, b, 10, 0), b);
	struct iovec iov = { b, 10 };
	RD("readv dir", readv(fd, &iov, 1), b);
	RD("preadv dir", preadv(fd, &iov, 1, 0), b);
	RD("__read_chk dir", __read_chk(fd, b, 10, BUFSZ), b);
	RES("close", close(fd));

	/* ---- reads ---- */
	read_suite(c, "data", REL("data.jpg"), SZ_DATA);
	read_suite(c, "plain", REL("plain.bin"), SZ_PLAIN);
	read_suite(c, "empty", REL("empty.jpg"), 0);
	read_suite(c, "link", ABS("link.jpg"), SZ_DATA);

	new_file(c, dfd);
	dups(c);
	stdio_suite(c);

	/* ---- the lone run only: descriptor numbers are reused at once ---- */
	if (c->solo) {
		fd = open(REL("data.jpg"), O_RDONLY);
		fdres(c, "solo: open data", fd, errno);
		RD("solo: read 100", read(fd, b, 100), b);
		RES("solo: close", close(fd));
		RD("solo: read closed", read(fd, b, 100), b);
		RD("solo: pread64 closed", pread64(fd, b, 100, 0), b);
		RES("solo: close again", close(fd));
		int again = open(REL("plain.bin"), O_RDONLY);
		fdres(c, "solo: open plain takes the same number", again, errno);
		emit(c, "solo: same number: %d", again == fd);
		RD("solo: read 100 (plain)", read(again, b, 100), b);
		RES("solo: close", close(again));
		FILE *f = fopen(REL("data.jpg"), "r");
		if (f) {
			int n = fileno(f);
			emit(c, "solo: fopen fd=base%+d", n - c->base);
			emit(c, "solo: fread 10: %zu", fread(b, 1, 10, f));
			emit(c, "solo: fclose: %d", fclose(f));
			RD("solo: read fclosed fd", read(n, b, 10), b);
			RES("solo: close fclosed fd", close(n));
		}
		fd = open(REL("empty.jpg"), O_RDONLY);
		fdres(c, "solo: open empty (lowest free)", fd, errno);
		RES("solo: close", close(fd));
	}
	RES("close dirfd", close(dfd));
}

/* ---- main ------------------------------------------------------------------------ */

static int count_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	if (!d)
		return -1;
	int n = 0;
	struct dirent *de;
	while ((de = readdir(d)))
		if (de->d_name[0] != '.')
			n++;
	closedir(d);
	return n - 1; /* the directory's own descriptor */
}

static pthread_barrier_t start_line;

static void ctx_init(struct ctx *c, const char *sub, int solo, int hi)
{
	memset(c, 0, sizeof(*c));
	c->solo = solo;
	snprintf(c->sub, sizeof(c->sub), "%s", sub);
	snprintf(c->dir, sizeof(c->dir), "%s/%s", topdir, sub);
	c->hi = hi;
	c->base = -1;
	c->buf = malloc(BUFSZ);
	c->cap = 1 << 16;
	c->out = malloc(c->cap);
	if (!c->buf || !c->out)
		abort();
	c->out[0] = '\0';
	make_fixtures(c->dir);
}

static void *thread_main(void *arg)
{
	struct ctx *c = arg;
	char *first = NULL;
	c->iterations_same = 1;
	pthread_barrier_wait(&start_line);
	for (int i = 0; i < ITERATIONS; i++) {
		c->len = 0;
		c->out[0] = '\0';
		script(c);
		if (!first)
			first = strdup(c->out);
		else if (strcmp(first, c->out) != 0)
			c->iterations_same = 0;
	}
	free(first);
	return NULL;
}

int main(int argc, char **argv)
{
	if (argc != 2 || argv[1][0] == '-') {
		fprintf(stderr,
			"usage: ts-posixcheck DIR\n"
			"Creates fixtures under DIR (main/, t0/..t%d/), runs a fixed script of file\n"
			"operations alone and then from %d threads at once, and prints one line per\n"
			"operation (return value, errno name, hash of the bytes read). The output\n"
			"must not change when libtsshim.so is preloaded.\n",
			NTHREADS - 1, NTHREADS);
		return 2;
	}
	umask(022);
	if (mkdir(argv[1], 0755) != 0 && errno != EEXIST)
		die("cannot create", argv[1]);
	if (!realpath(argv[1], topdir))
		die("cannot resolve", argv[1]);
	if (chdir(topdir) != 0)
		die("cannot enter", topdir);

	int fds_start = count_fds();

	/* Private descriptor numbers for the close-twice checks: high, below the limit. */
	struct rlimit rl;
	long top = 1024;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && (long)rl.rlim_cur < 4096)
		top = (long)rl.rlim_cur;
	else
		top = 4096;

	static struct ctx solo, threads[NTHREADS];
	ctx_init(&solo, "main", 1, (int)top - 1);
	for (int i = 0; i < NTHREADS; i++) {
		char sub[8];
		snprintf(sub, sizeof(sub), "t%d", i);
		ctx_init(&threads[i], sub, 0, (int)top - 2 - i);
	}

	script(&solo);
	fputs(solo.out, stdout);
	printf("fds after lone run: %+d\n", count_fds() - fds_start);

	pthread_barrier_init(&start_line, NULL, NTHREADS);
	pthread_t tid[NTHREADS];
	for (int i = 0; i < NTHREADS; i++)
		if (pthread_create(&tid[i], NULL, thread_main, &threads[i]) != 0) {
			fprintf(stderr, "ts-posixcheck: pthread_create failed\n");
			return 2;
		}
	for (int i = 0; i < NTHREADS; i++)
		pthread_join(tid[i], NULL);
	for (int i = 0; i < NTHREADS; i++) {
		printf("== thread %d (%d iterations, all identical: %s)\n", i, ITERATIONS,
		       threads[i].iterations_same ? "yes" : "no");
		fputs(threads[i].out, stdout);
	}
	printf("fds open at start: %d\n", fds_start);
	printf("fds open at end: %d\n", count_fds());
	for (int i = 0; i < NTHREADS; i++) {
		free(threads[i].buf);
		free(threads[i].out);
	}
	free(solo.buf);
	free(solo.out);
	return 0;
}
