/* SPDX-License-Identifier: MIT */
/*
 * shmlock (see shmlock.h).
 *
 * Memory ordering
 *
 *  - Taking the lock is a CAS of `owner` from 0 (or from a gone holder's
 *    word) with acquire; releasing it an exchange to 0 with release. The
 *    critical sections of successive holders are ordered by that pair.
 *
 *  - No lost wake: a waiter reads `wake`, then sets WAITERS in the holder's
 *    word by CAS, then sleeps on `wake` expecting what it read. The holder's
 *    release exchange either comes before that CAS (which then fails: the
 *    waiter looks again) or returns WAITERS, and the holder bumps `wake`
 *    after it: the sleep returns at once or is woken. The first read of
 *    `wake` is acquire and the bump release, so a waiter that read the bump
 *    also sees the word the release left.
 *
 *  - A waiter that slept takes the lock with WAITERS set, whether or not
 *    others still wait: a spurious wake at its unlock costs a syscall, a
 *    missed one a slice.
 *
 *  - Any word a peer may have written is only compared and CASed, and the
 *    ids in it only passed to tgkill and /proc: a bad one reads as gone.
 */
#include "shmlock.h"
#include "prim.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define SPINS    64             /* looks at a busy word before sleeping */
#define SLICE_NS 1000000ull     /* longest single sleep */

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield");
#endif
}

void ts_shm_lock_init(struct ts_shm_lock *l)
{
	memset(l, 0, sizeof(*l));
}

/*
 * Our owner word, kept per thread: asking the kernel for pid and tid at
 * every lock cost 115 ns of a 205 ns cache hit. A fork makes the child's
 * copy of the thread that forked stale: fork_gen, bumped in the child,
 * tells it (the handler is registered before any word is kept).
 */
static _Atomic uint32_t fork_gen = 1;
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;
static __thread uint64_t kept_word;
static __thread uint32_t kept_gen;

static void on_fork_child(void)
{
	atomic_fetch_add_explicit(&fork_gen, 1, memory_order_relaxed);
}

static void watch_forks(void)
{
	(void)pthread_atfork(NULL, NULL, on_fork_child);
}

static int my_word(uint64_t *out)
{
	uint32_t gen = atomic_load_explicit(&fork_gen, memory_order_relaxed);
	if (kept_word && kept_gen == gen) {
		*out = kept_word;
		return 0;
	}
	(void)pthread_once(&fork_once, watch_forks);
	gen = atomic_load_explicit(&fork_gen, memory_order_relaxed);
	struct ts_ident me;
	int ret = ts_self_ident(&me);
	if (ret)
		return ret;
	*out = ts_shm_lock_word(me.pid, (uint32_t)syscall(SYS_gettid), me.start_time);
	if (!*out)
		return -ERANGE;
	kept_word = *out;
	kept_gen = gen;
	return 0;
}

int ts_shm_lock_holder_gone(uint64_t w)
{
	uint32_t pid = ts_shm_lock_pid(w), tid = ts_shm_lock_tid(w);
	if (w == 0 || pid == 0 || tid == 0)
		return 1;
	int saved = errno;
	/* the thread: ESRCH (gone, or not of that process), EINVAL cannot be */
	long r = syscall(SYS_tgkill, (pid_t)pid, (pid_t)tid, 0);
	int thread_gone = r != 0 && (errno == ESRCH || errno == EINVAL);
	errno = saved;
	if (thread_gone)
		return 1;
	/* the process: a later one with the pid has another start time */
	uint64_t st;
	r = ts_prim.proc_start_time(pid, &st);
	if (r)
		return ts_proc_gone((int)r);
	return (st & TS_SHM_LOCK_START_MASK) != ts_shm_lock_start(w);
}

/* One try: 0 taken, 1 taken from a gone holder, -EBUSY; *seen: the word found. */
static int try_take(struct ts_shm_lock *l, uint64_t me, uint64_t *seen, int check)
{
	uint64_t w = atomic_load_explicit(&l->owner, memory_order_relaxed);
	if (w == 0) {
		if (atomic_compare_exchange_strong_explicit(&l->owner, &w, me, memory_order_acquire,
							    memory_order_relaxed))
			return 0;
	} else if (check && ts_shm_lock_holder_gone(w)) {
		/* from the word we judged, keeping its WAITERS: others may sleep */
		if (atomic_compare_exchange_strong_explicit(&l->owner, &w, me | (w & TS_SHM_LOCK_WAITERS),
							    memory_order_acquire, memory_order_relaxed))
			return TS_SHM_LOCK_REPAIR;
	}
	*seen = w;
	return -EBUSY;
}

int ts_shm_lock(struct ts_shm_lock *l, uint64_t timeout_ns)
{
	uint64_t me, w = 0;
	int ret;
	if ((ret = my_word(&me)))
		return ret;
	uint64_t zero = 0;
	if (atomic_compare_exchange_strong_explicit(&l->owner, &zero, me, memory_order_acquire, memory_order_relaxed))
		return 0;
	if ((zero & ~TS_SHM_LOCK_WAITERS) == me)
		return -EDEADLK;
	for (int i = 0; i < SPINS; i++) {
		cpu_relax();
		if ((ret = try_take(l, me, &w, 0)) >= 0)
			return ret;
	}
	uint64_t now = ts_now_ns(), deadline = timeout_ns > UINT64_MAX - now ? UINT64_MAX : now + timeout_ns;
	uint64_t next_check = now + TS_SHM_LOCK_CHECK_NS;
	uint64_t flag = 0; /* WAITERS once we slept */
	for (;;) {
		uint32_t ev = atomic_load_explicit(&l->wake, memory_order_acquire);
		int check = now >= next_check;
		if (check)
			next_check = now + TS_SHM_LOCK_CHECK_NS;
		if ((ret = try_take(l, me | flag, &w, check)) >= 0)
			break;
		if (now >= deadline) {
			ret = -ETIMEDOUT;
			break;
		}
		/* tell the holder to wake us; a failed CAS means the word moved: look again */
		if (w && !(w & TS_SHM_LOCK_WAITERS) &&
		    !atomic_compare_exchange_strong_explicit(&l->owner, &w, w | TS_SHM_LOCK_WAITERS,
							     memory_order_relaxed, memory_order_relaxed)) {
			now = ts_now_ns();
			continue;
		}
		uint64_t until = deadline < next_check ? deadline : next_check;
		(void)ts_futex_wait(&l->wake, ev, until > now ? (until - now < SLICE_NS ? until - now : SLICE_NS) : 1);
		flag = TS_SHM_LOCK_WAITERS;
		now = ts_now_ns();
	}
	return ret;
}

void ts_shm_unlock(struct ts_shm_lock *l)
{
	uint64_t w = atomic_exchange_explicit(&l->owner, 0, memory_order_release);
	if (w & TS_SHM_LOCK_WAITERS) {
		atomic_fetch_add_explicit(&l->wake, 1, memory_order_release);
		ts_futex_wake_all(&l->wake);
	}
}
