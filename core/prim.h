/* SPDX-License-Identifier: MIT */
/*
 * prim: the few OS services the core needs, behind one small layer so tests
 * can fake time and process liveness. Every function returns 0 or -errno
 * and leaves errno as it found it.
 */
#ifndef TSSHIM_CORE_PRIM_H
#define TSSHIM_CORE_PRIM_H

#include <errno.h>
#include <stdint.h>
#include <sys/types.h>

/* Process identity as the kernel sees it: pid plus start time (ticks since boot). */
struct ts_ident {
	uint32_t pid;
	uint64_t start_time;
};

enum ts_liveness { TS_PROC_DEAD = 0, TS_PROC_ALIVE = 1 };

/* Overridable by tests; production code calls through these. */
struct ts_prim_ops {
	uint64_t (*now_ns)(void);                           /* CLOCK_MONOTONIC */
	int (*proc_start_time)(uint32_t pid, uint64_t *out); /* -ESRCH if gone */
};
extern struct ts_prim_ops ts_prim;

static inline uint64_t ts_now_ns(void) { return ts_prim.now_ns(); }

/* -errno after a failed call: never 0, visibly so for the static analyser. */
static inline int ts_neg_errno(void)
{
	int r = -errno;
	/* cppcheck-suppress knownConditionTrueFalse ; it is, but clang-analyzer cannot tell */
	return r ? r : -EIO;
}

uint64_t ts_prim_monotonic_ns(void);
uint64_t ts_prim_realtime_ns(void);
int ts_prim_read_start_time(uint32_t pid, uint64_t *out);
/* Start time and parent pid from /proc/PID/stat; -ESRCH for gone or zombie. */
int ts_prim_read_stat(uint32_t pid, uint64_t *start, uint32_t *ppid);

/* Our own identity, cached after the first call (re-read after fork). */
int ts_self_ident(struct ts_ident *out);

/*
 * Did proc_start_time say the process is gone? Only -ESRCH (no such pid, or
 * a zombie) and -EINVAL (a pid that cannot exist) do. Any other error
 * (EMFILE: the asking process is out of descriptors, ENOMEM, EIO) says
 * nothing about the other process: taken as gone, one job short of
 * descriptors evicted every live member of its session.
 */
static inline int ts_proc_gone(int start_time_ret)
{
	return start_time_ret == -ESRCH || start_time_ret == -EINVAL;
}

/* Alive: the pid exists, is not a zombie, and started when we recorded; or
 * it cannot be told (the heartbeat still tells a stuck member). */
enum ts_liveness ts_proc_liveness(uint32_t pid, uint64_t start_time);

/* futex on a 32-bit word in shared memory. wait: 0, -EAGAIN (value differed),
 * -ETIMEDOUT, -EINTR (caller loops). */
int ts_futex_wait(_Atomic uint32_t *word, uint32_t expected, uint64_t timeout_ns);
void ts_futex_wake_all(_Atomic uint32_t *word);

/* Sleep that survives EINTR. */
void ts_sleep_ns(uint64_t ns);

/*
 * Reserve the blocks of [off, off + len) of fd now, so that a full file
 * system is an error here and not a SIGBUS at the first write through a
 * mapping. tmpfs's fallocate stops with EINTR when a signal is pending (on
 * some kernels for any signal, a profiler's timer or a SIGCHLD): retried a
 * few times. 0 or -errno (posix_fallocate's result).
 */
int ts_prim_reserve(int fd, uint64_t off, uint64_t len);

struct stat;
/*
 * A shared-memory file we may use: a regular file owned by us with mode
 * exactly 0600, as we create them. -EINVAL (not a regular file), -EACCES.
 */
int ts_shm_file_ours(const struct stat *sb);

/*
 * Create a fresh temporary file beside `path` (0600, O_EXCL, O_NOFOLLOW), to
 * be filled and then linked into place; its name goes to tmp. Named by pid
 * and a per-process counter: two threads never pick the same name, and one
 * left by a dead process whose pid was reused is stepped over. fd or -errno.
 */
int ts_shm_create_tmp(const char *path, char *tmp, size_t tmplen);

/*
 * Has any page of [addr, addr + len) been written since it was mapped from
 * its file? For a private (copy-on-write) file mapping, a written page is an
 * anonymous copy, which /proc/self/pagemap tells apart from the file's own
 * page. 1: no page written (each is the file's, or not yet faulted in);
 * 0: one was (or is anonymous memory, or swapped out); -errno: pagemap
 * unreadable.
 */
int ts_pages_unwritten(const void *addr, size_t len);

/*
 * Copy n bytes of our own memory at src, which may not be mapped (a
 * pointer a program hands to a call that checks it itself): process_vm_readv
 * on ourselves, so a bad address is -EFAULT, never a fault. 0, or -errno
 * (-EPERM or -ENOSYS where a sandbox forbids the call).
 */
int ts_prim_read_own(void *dst, const void *src, size_t n);

/* Size of the file system that holds them (statvfs); 0 when unknown. */
uint64_t ts_shm_fs_bytes(void);
/*
 * Does `bytes` of ours fit in a quarter of the file system /dev/shm is (its
 * size unknown: yes)? The decoded-image cache and a feed's batch files each
 * keep to that: the job's own DataLoader workers pass every batch through
 * /dev/shm too, and a container's is often 64 MiB.
 */
static inline int ts_shm_within_quarter(uint64_t bytes)
{
	uint64_t fs = ts_shm_fs_bytes();
	return !fs || bytes <= fs / 4;
}

/* Directory that holds POSIX shared-memory objects ("/dev/shm"). */
const char *ts_shm_dir(void);

#endif
