/* SPDX-License-Identifier: MIT */
/*
 * Prefetch (TSSHIM_PREFETCH=warm): read the dataset scope's files ahead so
 * that a cold first epoch on slow storage is not latency-bound. The bytes
 * are thrown away; what stays is the kernel page cache, where every job's
 * later reads find them.
 *
 * Reads go through io_uring, queue_depth of them in flight over a fixed
 * pool of queue_depth * buf_size bytes (big files in several chunks,
 * completions in any order). Where io_uring is refused (old kernels), or
 * the thread runs under any seccomp filter (one may kill the process on
 * io_uring_setup, so it is never tried there), the same walk runs with
 * plain pread.
 *
 * The background thread keeps its descriptors in a table of its own where
 * the kernel allows (5.9+, no seccomp filter): the host's table, its
 * RLIMIT_NOFILE headroom and its forked children never see them. Else
 * (and for ts_prefetch_run() on the caller's thread) they share the host's
 * table: then they stay clear of the top max(64, limit / 4) numbers below
 * RLIMIT_NOFILE, and a host about to close descriptors it does not know
 * (close_range, closefrom) must stop the run first: see
 * ts_prefetch_shares_fds().
 *
 * The walk: every root (a directory or a regular file), recursively,
 * regular files only, entries sorted by name within a directory. Symbolic
 * links are never followed below a root (so nothing outside the tree is
 * read and loops cannot happen), FIFOs, sockets and devices are never
 * opened; both are counted as skipped. Entries that cannot be opened or
 * read are counted as errors and the walk goes on.
 *
 * All functions return 0 or -errno and leave errno as they found it.
 */
#ifndef TSSHIM_CORE_PREFETCH_H
#define TSSHIM_CORE_PREFETCH_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define TS_PREFETCH_DEPTH_DEFAULT 64u
#define TS_PREFETCH_DEPTH_MAX     4096u
#define TS_PREFETCH_BUF_DEFAULT   (256u << 10)
#define TS_PREFETCH_BUF_MIN       512u
#define TS_PREFETCH_BUF_MAX       (64u << 20)
#define TS_PREFETCH_POOL_MAX      (1ull << 30) /* queue_depth * buf_size */

struct ts_prefetch_opts {
	unsigned queue_depth; /* reads in flight; 0: default 64 */
	size_t buf_size;      /* bytes per read; 0: default 256 KiB */
	int force_plain;      /* skip io_uring (tests, or a caller that knows better) */
	uint64_t max_bytes;   /* stop after reading this many bytes; 0: no limit */
};

struct ts_prefetch_stats {
	uint64_t files;   /* regular files read to their end */
	uint64_t bytes;   /* bytes read */
	uint64_t errors;  /* entries that could not be opened, listed or read */
	uint64_t skipped; /* symlinks, FIFOs, sockets, devices: never opened */
	uint64_t usec;    /* wall time of the run */
	int used_uring;   /* 1: reads went through io_uring */
	int uring_err;    /* why not: -errno from ring setup, -EPERM under a seccomp
			   * filter (not tried); 0 when used or forced plain */
	int shared_fds;   /* 1: the run's descriptors were in the caller's table (final stats) */
};

/*
 * Walk the roots and read every file to its end (its size when opened: a
 * file that shrinks ends early, growth after the open is not chased).
 * `stop` may be NULL; when it becomes nonzero the run ends within a few ms
 * (plus the reads already in the kernel). Per-file failures are counted,
 * not returned.
 *   0           everything was walked, or max_bytes was reached (a stop
 *               raised after the last read changes nothing)
 *   -ECANCELED  *stop ended the run before that
 *   -EINVAL     bad options or roots
 *   -ENOMEM     no buffer pool
 *   -EBADF      our descriptors were closed and their numbers reused under
 *               us (a table shared with a host that closed them): the run
 *               ended early, closing none of them
 *   -EIO        io_uring stopped taking requests
 * st is filled in every case (zeroes on -EINVAL).
 */
int ts_prefetch_run(const char *const *roots, unsigned nroots, const struct ts_prefetch_opts *o,
		    _Atomic int *stop, struct ts_prefetch_stats *st);

/* A run on a background thread. Zero-initialise before the first start. */
struct ts_prefetch_job; /* the thread's state, private to prefetch.c */
struct ts_prefetch {
	pthread_t thread;
	int started;                 /* a thread was created and not yet stopped */
	int32_t owner_pid;           /* process that created it: a forked child never joins */
	struct ts_prefetch_job *job;
};

/*
 * Start the run on a thread named "tsshim-prefetch" with every signal
 * blocked (the host's handlers must never run on it). -EBUSY if already
 * started, -EINVAL for bad options (checked before the thread exists).
 */
int ts_prefetch_start(struct ts_prefetch *p, const char *const *roots, unsigned nroots,
		      const struct ts_prefetch_opts *o);

/*
 * Progress so far (final figures once done). Returns 1 when the run has
 * finished, 0 while it runs, -ESRCH if never started.
 */
int ts_prefetch_poll(struct ts_prefetch *p, struct ts_prefetch_stats *st);

/* The thread's kernel tid once it runs (for inspect and tests), else 0. */
int32_t ts_prefetch_tid(const struct ts_prefetch *p);

/*
 * Ask the thread to stop and join it; st (may be NULL) gets the final
 * stats. Returns the run's result (0, -ECANCELED, ...), -ESRCH if nothing
 * was started. Waits at most TS_PREFETCH_STOP_MS: a thread stuck in the
 * kernel (a dead network mount) is then left to finish on its own, st gets
 * its progress so far and the result is -ETIMEDOUT. Safe to call twice. In
 * a forked child the thread does not exist: the struct is only reset.
 */
#define TS_PREFETCH_STOP_MS 2000u
int ts_prefetch_stop(struct ts_prefetch *p, struct ts_prefetch_stats *st);

/*
 * 1 while the thread has (or may yet get) descriptors in the calling
 * process's table: a host about to close descriptors wholesale
 * (close_range, closefrom) must ts_prefetch_stop() first, or the thread
 * would go on to use and close numbers the host has reused. 0 once the
 * thread runs in a table of its own, after it finished, when nothing was
 * started, and in a forked child. Cheap; the caller serialises it with
 * start and stop like any use of p.
 */
int ts_prefetch_shares_fds(const struct ts_prefetch *p);

/* Tests only: called by the thread as its last act (after its last use of
 * the job), to stand for an exit the kernel holds up. NULL in production. */
extern void (*ts_prefetch_exit_hook)(void);

#endif
