/* SPDX-License-Identifier: MIT */
#include "prim.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

uint64_t ts_prim_monotonic_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t ts_prim_realtime_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/*
 * /proc/PID/stat: "pid (comm) state ppid ... starttime(22nd field) ...".
 * comm may hold spaces and parentheses, so parse from the last ')'.
 * A zombie counts as gone: it will never beat again.
 */
static int parse_stat(const char *buf, uint64_t *start, uint32_t *ppid)
{
	const char *p = strrchr(buf, ')');
	if (!p || p[1] != ' ')
		return -EINVAL;
	p += 2;
	if (*p == 'Z' || *p == 'X')
		return -ESRCH;
	if (ppid) {
		unsigned long pp = strtoul(p + 2, NULL, 10);
		*ppid = (uint32_t)pp;
	}
	/* p now at field 3 (state); starttime is field 22: skip 19 fields */
	for (int field = 3; field < 22; field++) {
		p = strchr(p, ' ');
		if (!p)
			return -EINVAL;
		p++;
	}
	char *end;
	unsigned long long v = strtoull(p, &end, 10);
	if (end == p)
		return -EINVAL;
	*start = v;
	return 0;
}

int ts_prim_read_stat(uint32_t pid, uint64_t *start, uint32_t *ppid)
{
	int saved = errno, ret;
	char path[32], buf[1024];
	if (pid == 0 || pid > (uint32_t)0x3fffffff)
		return -EINVAL;
	snprintf(path, sizeof(path), "/proc/%u/stat", pid);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		ret = errno == ENOENT ? -ESRCH : -errno;
		errno = saved;
		return ret;
	}
	ssize_t n;
	do
		n = read(fd, buf, sizeof(buf) - 1);
	while (n < 0 && errno == EINTR);
	ret = n < 0 ? -errno : 0;
	close(fd);
	if (ret == 0) {
		buf[n] = '\0';
		ret = parse_stat(buf, start, ppid);
	}
	errno = saved;
	return ret;
}

int ts_prim_read_start_time(uint32_t pid, uint64_t *out)
{
	return ts_prim_read_stat(pid, out, NULL);
}

struct ts_prim_ops ts_prim = {
	.now_ns = ts_prim_monotonic_ns,
	.proc_start_time = ts_prim_read_start_time,
};

/*
 * Threads ask at once: the start time is stored before the pid that says
 * whose it is (release/acquire), so a reader that finds its pid there finds
 * its start time too. Racing writers store the same values.
 */
static _Atomic uint32_t self_pid;
static _Atomic uint64_t self_start;

int ts_self_ident(struct ts_ident *out)
{
	uint32_t pid = (uint32_t)getpid();
	if (atomic_load_explicit(&self_pid, memory_order_acquire) != pid) {
		uint64_t st;
		int ret = ts_prim.proc_start_time(pid, &st);
		if (ret)
			return ret;
		atomic_store_explicit(&self_start, st, memory_order_relaxed);
		atomic_store_explicit(&self_pid, pid, memory_order_release);
		*out = (struct ts_ident){ .pid = pid, .start_time = st };
		return 0;
	}
	*out = (struct ts_ident){ .pid = pid, .start_time = atomic_load_explicit(&self_start, memory_order_relaxed) };
	return 0;
}

enum ts_liveness ts_proc_liveness(uint32_t pid, uint64_t start_time)
{
	uint64_t st;
	if (pid == 0)
		return TS_PROC_DEAD;
	int r = ts_prim.proc_start_time(pid, &st);
	if (r != 0)
		return ts_proc_gone(r) ? TS_PROC_DEAD : TS_PROC_ALIVE;
	return st == start_time ? TS_PROC_ALIVE : TS_PROC_DEAD;
}

int ts_futex_wait(_Atomic uint32_t *word, uint32_t expected, uint64_t timeout_ns)
{
	int saved = errno;
	struct timespec ts = {
		.tv_sec = (time_t)(timeout_ns / 1000000000ull),
		.tv_nsec = (long)(timeout_ns % 1000000000ull),
	};
	/* Shared (not private) futex: waiters live in other processes. */
	long r = syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT, expected, &ts, NULL, 0);
	int ret = r == 0 ? 0 : -errno;
	errno = saved;
	return ret == -EWOULDBLOCK ? -EAGAIN : ret;
}

void ts_futex_wake_all(_Atomic uint32_t *word)
{
	int saved = errno;
	syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, INT32_MAX, NULL, NULL, 0);
	errno = saved;
}

void ts_sleep_ns(uint64_t ns)
{
	int saved = errno;
	struct timespec req = {
		.tv_sec = (time_t)(ns / 1000000000ull),
		.tv_nsec = (long)(ns % 1000000000ull),
	}, rem;
	while (nanosleep(&req, &rem) != 0 && errno == EINTR)
		req = rem;
	errno = saved;
}

int ts_shm_file_ours(const struct stat *sb)
{
	if (!S_ISREG(sb->st_mode))
		return -EINVAL;
	if (sb->st_uid != getuid() || (sb->st_mode & 07777) != 0600)
		return -EACCES;
	return 0;
}

int ts_prim_reserve(int fd, uint64_t off, uint64_t len)
{
	int r, tries = 0, saved = errno; /* glibc's emulation for file systems without fallocate writes */
	while ((r = posix_fallocate(fd, (off_t)off, (off_t)len)) == EINTR && ++tries < 8)
		;
	errno = saved;
	return -r;
}

int ts_shm_create_tmp(const char *path, char *tmp, size_t tmplen)
{
	static _Atomic unsigned serial;
	for (int tries = 0; tries < 16; tries++) {
		unsigned n = atomic_fetch_add_explicit(&serial, 1, memory_order_relaxed);
		if ((size_t)snprintf(tmp, tmplen, "%s.tmp%u.%u", path, (unsigned)getpid(), n) >= tmplen)
			return -ENAMETOOLONG;
		int fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
		if (fd >= 0 && fchmod(fd, 0600) != 0) { /* a umask may have taken bits: 0600 exactly, as checked */
			int e = errno;
			close(fd);
			unlink(tmp);
			return -e;
		}
		if (fd >= 0 || errno != EEXIST)
			return fd >= 0 ? fd : -errno;
	}
	return -EEXIST;
}

/* pagemap entry bits (Documentation/admin-guide/mm/pagemap.rst) */
#define PM_PRESENT    (1ull << 63)
#define PM_SWAPPED    (1ull << 62)
#define PM_FILE_SHARED (1ull << 61)

int ts_prim_read_own(void *dst, const void *src, size_t n)
{
	int saved = errno, ret = 0;
	struct iovec local = {dst, n}, remote = {(void *)(uintptr_t)src, n};
	ssize_t got = process_vm_readv(getpid(), &local, 1, &remote, 1, 0);
	if (got < 0)
		ret = ts_neg_errno();
	else if ((size_t)got != n)
		ret = -EFAULT; /* a partial read: the range ends in an unmapped page */
	errno = saved;
	return ret;
}

int ts_pages_unwritten(const void *addr, size_t len)
{
	int saved = errno, ret = 1;
	uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
	uintptr_t first = (uintptr_t)addr / page, last = ((uintptr_t)addr + (len ? len - 1 : 0)) / page;
	uint64_t e[512];
	int fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		ret = ts_neg_errno();
		errno = saved;
		return ret;
	}
	for (uintptr_t p = first; p <= last && ret == 1;) {
		size_t n = last - p + 1 < 512 ? last - p + 1 : 512;
		ssize_t got = pread(fd, e, n * sizeof(e[0]), (off_t)(p * sizeof(e[0])));
		if (got < 0 && errno == EINTR)
			continue;
		if (got <= 0 || got % (ssize_t)sizeof(e[0])) {
			ret = got < 0 ? ts_neg_errno() : -EIO;
			break;
		}
		for (size_t i = 0; i < (size_t)got / sizeof(e[0]); i++)
			/* present and anonymous: a copy made by a write; swapped: the same, paged out */
			if ((e[i] & PM_SWAPPED) || ((e[i] & PM_PRESENT) && !(e[i] & PM_FILE_SHARED)))
				ret = 0;
		p += (size_t)got / sizeof(e[0]);
	}
	close(fd);
	errno = saved;
	return ret;
}

uint64_t ts_shm_fs_bytes(void)
{
	struct statvfs v;
	int saved = errno;
	uint64_t n = statvfs(ts_shm_dir(), &v) == 0 ? (uint64_t)v.f_blocks * v.f_frsize : 0;
	errno = saved;
	return n;
}

const char *ts_shm_dir(void)
{
	return "/dev/shm";
}
