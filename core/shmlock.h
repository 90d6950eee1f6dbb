/* SPDX-License-Identifier: MIT */
/*
 * shmlock: a lock in memory that same-user peers map read-write.
 *
 * Why not a robust process-shared pthread mutex: its bytes hold the links of
 * the owner's robust list, which glibc follows on unlock and the kernel at
 * thread exit. A peer that writes them (a bug, a stray write, a different
 * tsshim build) gets its writes done in our address space. Here the lock is
 * one 64-bit word that says who holds it, and nothing read from it is ever
 * followed: any value is either a live holder or one we take over.
 *
 * The word: pid (22 bits) | tid (22 bits) | low 19 bits of the process's
 * start time | WAITERS. pid_max is at most 2^22 on Linux, so ids fit; the
 * start time tells a holder from a later process that got its pid (wrong
 * only if pid and start time's low bits, 87 minutes at 100 Hz, both match).
 *
 * A waiter sleeps on `wake` (a futex counter an unlock bumps when it finds
 * WAITERS set) in slices, and looks at the holder every TS_SHM_LOCK_CHECK_NS
 * of waiting: a holder whose thread or process is gone is replaced by CAS
 * from the word it saw, and the new holder is told to repair what the lock
 * protects (TS_SHM_LOCK_REPAIR), as EOWNERDEAD does.
 *
 * Functions return 0 or -errno and leave errno as they found it.
 */
#ifndef TSSHIM_CORE_SHMLOCK_H
#define TSSHIM_CORE_SHMLOCK_H

#include <stdatomic.h>
#include <stdint.h>

#define TS_SHM_LOCK_CHECK_NS 2000000ull /* waiting this long: is the holder alive? */
#define TS_SHM_LOCK_REPAIR   1          /* acquired from a holder that is gone */

struct ts_shm_lock {
	_Atomic uint64_t owner; /* 0: free; else ts_shm_lock_word() of the holder */
	_Atomic uint32_t wake;  /* futex: bumped by an unlock that saw WAITERS */
	uint32_t reserved;
	uint64_t pad[6];        /* one cache line */
};

#define TS_SHM_LOCK_WAITERS   1ull
#define TS_SHM_LOCK_ID_BITS   22
#define TS_SHM_LOCK_ID_MASK   ((1ull << TS_SHM_LOCK_ID_BITS) - 1)
#define TS_SHM_LOCK_START_BITS 19
#define TS_SHM_LOCK_START_MASK ((1ull << TS_SHM_LOCK_START_BITS) - 1)

/* The owner word of thread tid of process pid started at start_time; 0: ids out of range. */
static inline uint64_t ts_shm_lock_word(uint32_t pid, uint32_t tid, uint64_t start_time)
{
	if (pid == 0 || tid == 0 || pid > TS_SHM_LOCK_ID_MASK || tid > TS_SHM_LOCK_ID_MASK)
		return 0;
	return (uint64_t)pid << (64 - TS_SHM_LOCK_ID_BITS) | (uint64_t)tid << (TS_SHM_LOCK_START_BITS + 1) |
	       (start_time & TS_SHM_LOCK_START_MASK) << 1;
}

static inline uint32_t ts_shm_lock_pid(uint64_t w) { return (uint32_t)(w >> (64 - TS_SHM_LOCK_ID_BITS)); }
static inline uint32_t ts_shm_lock_tid(uint64_t w)
{
	return (uint32_t)(w >> (TS_SHM_LOCK_START_BITS + 1) & TS_SHM_LOCK_ID_MASK);
}
static inline uint64_t ts_shm_lock_start(uint64_t w) { return w >> 1 & TS_SHM_LOCK_START_MASK; }

/* A free lock (the segment's creator, before anyone else can map it). */
void ts_shm_lock_init(struct ts_shm_lock *l);

/*
 * Take the lock within timeout_ns: 0, TS_SHM_LOCK_REPAIR (taken over from a
 * holder that is gone: repair, then unlock as usual), -ETIMEDOUT, -EDEADLK
 * (this thread holds it), or the error of telling who we are.
 */
int ts_shm_lock(struct ts_shm_lock *l, uint64_t timeout_ns);

/* Release it: the caller holds it. */
void ts_shm_unlock(struct ts_shm_lock *l);

/* Is the holder named by w gone? Invalid words are. */
int ts_shm_lock_holder_gone(uint64_t w);

#endif
