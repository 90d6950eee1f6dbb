/* SPDX-License-Identifier: MIT */
/*
 * Process-wide state of the shim and the rules every hook follows.
 *
 * Init state machine (jemalloc-style, explicit):
 *
 *   UNINIT --constructor--> INITIALIZING --config ok--> READY --exit--> FINI
 *                                     \--invalid/off--> DISABLED
 *
 * Only READY does anything; every other state passes calls through.
 *
 * Hook rules: keep errno; never block without a timeout; never allocate or
 * take a lock on a path a vfork child can reach (the child shares our memory
 * and a lock held by another thread of the parent is never released there);
 * anything not understood passes through untouched. A thread-local guard
 * keeps the shim from handling its own calls.
 */
#ifndef TSSHIM_SHIM_SHIM_H
#define TSSHIM_SHIM_SHIM_H

#include <stdatomic.h>

#include "config.h"

enum ts_init_state { TS_UNINIT = 0, TS_INITIALIZING, TS_READY, TS_DISABLED, TS_FINI };

extern _Atomic int ts_init_state;
extern struct ts_config ts_cfg;

static inline int ts_shim_ready(void)
{
	return atomic_load_explicit(&ts_init_state, memory_order_acquire) == TS_READY;
}

/* Reentrancy guard: initial-exec TLS, so touching it never allocates. */
extern __thread int ts_in_hook;

/* 1: handle this call (guard taken; pair with ts_hook_leave). 0: pass through. */
static inline int ts_hook_enter(void)
{
	if (ts_in_hook || !ts_shim_ready())
		return 0;
	ts_in_hook = 1;
	return 1;
}

static inline void ts_hook_leave(void)
{
	ts_in_hook = 0;
}

/* A dataset decode was proven: the process takes part in its session. */
void ts_shim_dataset_work(void);
/* The dataset scope became known (given or detected). */
void ts_shim_scope_known(void);
/* The program is about to close descriptors wholesale (close_range,
 * closefrom): stop what keeps descriptors of ours in its table. Not from a
 * vfork child. Bounded by TS_PREFETCH_STOP_MS. */
void ts_shim_fds_closing(void);
/* In a Python process, put our sitecustomize first on PYTHONPATH (bootstrap.c). */
void ts_bootstrap_python(void);
/* The running binary is a Python interpreter (set by ts_bootstrap_python, in the constructor). */
extern int ts_is_python;
/* Set once this process shares a DataLoader through a feed (inherited by forked workers). */
extern _Atomic int ts_feed_active;
/* Leave every data feed of this process (at exit). */
void ts_feed_api_fini(void);
/* In a forked child: the feed table's lock made afresh. */
void ts_feed_api_atfork_child(void);

/* Locks of the other modules, taken around fork (see shim.c's handlers). */
void ts_jpeg_fork_lock(void);
void ts_jpeg_fork_unlock(void);
void ts_jpeg_fork_child(void); /* the unlock, and inherited fills left to the parent */
/* After a dlclose: libjpeg choices made for what it unloaded are dropped. */
void ts_jpeg_unloaded(void);
/* What dlsym hands out for a "jpeg_" name that the real dlsym found as
 * `found`, looked up from `caller`: ours only where a libjpeg stands behind. */
void *ts_jpeg_dlsym(const char *name, const void *caller, void *found);
void ts_exact_fork_note_job(void);
void ts_exact_fork_lock(void);
void ts_exact_fork_unlock(void);

/* Set in a forked child: it belongs to its parent's member and never uses CUDA. */
extern _Atomic int ts_is_fork_child;

#endif
