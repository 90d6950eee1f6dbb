/* SPDX-License-Identifier: MIT */
/*
 * The lock in peer-writable shared memory (core/shmlock.h): exclusion under
 * contention, timeouts, wake-ups, holders that die (a thread, a process,
 * a zombie), a live holder in another process never taken over, and any
 * bytes a peer may leave in it: never a fault, never a hang, taken over.
 * The lock lives in a MAP_SHARED mapping, as in a segment.
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "prim.h"
#include "shmlock.h"

#define MS 1000000ull
#define LONG_NS (10000 * MS) /* "forever" for a test, still bounded */

static struct ts_shm_lock *lk;

static void setup(void)
{
	lk = mmap(NULL, sizeof(*lk), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	cr_assert_neq(lk, MAP_FAILED);
	ts_shm_lock_init(lk);
}

static void teardown(void)
{
	munmap(lk, sizeof(*lk));
}

TestSuite(shmlock, .init = setup, .fini = teardown, .timeout = 60);

static uint64_t now_ms(void)
{
	return ts_prim_monotonic_ns() / MS;
}

static uint64_t my_word(void)
{
	struct ts_ident me;
	cr_assert_eq(ts_self_ident(&me), 0);
	return ts_shm_lock_word(me.pid, (uint32_t)syscall(SYS_gettid), me.start_time);
}

Test(shmlock, word_names_pid_tid_and_start)
{
	uint64_t w = ts_shm_lock_word(4194303, 17, 0xabcdef123ull);
	cr_assert_eq(ts_shm_lock_pid(w), 4194303u);
	cr_assert_eq(ts_shm_lock_tid(w), 17u);
	cr_assert_eq(ts_shm_lock_start(w), 0xabcdef123ull & TS_SHM_LOCK_START_MASK);
	cr_assert_eq(w & TS_SHM_LOCK_WAITERS, 0u);
	cr_assert_eq(ts_shm_lock_word(0, 17, 1), 0u, "pid 0 names nobody");
	cr_assert_eq(ts_shm_lock_word(5, 0, 1), 0u, "tid 0 names nobody");
	cr_assert_eq(ts_shm_lock_word(1u << 22, 5, 1), 0u, "a pid above pid_max's limit");
}

Test(shmlock, uncontended_lock_names_its_holder)
{
	int saved = errno = 4242;
	cr_assert_eq(ts_shm_lock(lk, 0), 0);
	cr_assert_eq(atomic_load(&lk->owner), my_word());
	cr_assert_eq(ts_shm_lock(lk, 50 * MS), -EDEADLK, "the holder taking it again must not wait");
	ts_shm_unlock(lk);
	cr_assert_eq(atomic_load(&lk->owner), 0u);
	cr_assert_eq(atomic_load(&lk->wake), 0u, "nobody waited: no wake");
	cr_assert_eq(errno, saved);
}

/* ---- contention ------------------------------------------------------------------ */

#define NTHREADS 4
#define ROUNDS   20000

static uint64_t counter;        /* plain: the lock is all that protects it */
static _Atomic int inside;      /* threads inside at once: must stay 1 */
static _Atomic int overlap;

static void *hammer(void *arg)
{
	(void)arg;
	for (int i = 0; i < ROUNDS; i++) {
		cr_assert_eq(ts_shm_lock(lk, LONG_NS), 0);
		if (atomic_fetch_add(&inside, 1) != 0)
			atomic_store(&overlap, 1);
		counter++;
		atomic_fetch_sub(&inside, 1);
		ts_shm_unlock(lk);
	}
	return NULL;
}

Test(shmlock, excludes_under_contention)
{
	pthread_t t[NTHREADS];
	counter = 0;
	for (int i = 0; i < NTHREADS; i++)
		cr_assert_eq(pthread_create(&t[i], NULL, hammer, NULL), 0);
	for (int i = 0; i < NTHREADS; i++)
		pthread_join(t[i], NULL);
	cr_assert_eq(atomic_load(&overlap), 0, "two holders at once");
	cr_assert_eq(counter, (uint64_t)NTHREADS * ROUNDS);
	cr_assert_eq(atomic_load(&lk->owner), 0u);
}

struct holder {
	pthread_barrier_t locked, release;
	uint64_t hold_ms;
};

static void *hold_then_release(void *arg)
{
	struct holder *h = arg;
	cr_assert_eq(ts_shm_lock(lk, 0), 0);
	pthread_barrier_wait(&h->locked);
	if (h->hold_ms)
		ts_sleep_ns(h->hold_ms * MS);
	else
		pthread_barrier_wait(&h->release);
	ts_shm_unlock(lk);
	return NULL;
}

Test(shmlock, a_busy_lock_costs_the_timeout_not_more)
{
	struct holder h = { .hold_ms = 0 };
	pthread_barrier_init(&h.locked, NULL, 2);
	pthread_barrier_init(&h.release, NULL, 2);
	pthread_t t;
	cr_assert_eq(pthread_create(&t, NULL, hold_then_release, &h), 0);
	pthread_barrier_wait(&h.locked);
	uint64_t t0 = now_ms();
	cr_assert_eq(ts_shm_lock(lk, 50 * MS), -ETIMEDOUT, "a live holder is never taken over");
	uint64_t took = now_ms() - t0;
	cr_expect_geq(took, 49u);
	cr_expect_lt(took, 1000u, "waited %llu ms for a 50 ms timeout", (unsigned long long)took);
	pthread_barrier_wait(&h.release);
	pthread_join(t, NULL);
	cr_assert_eq(ts_shm_lock(lk, 0), 0, "free again once released");
	ts_shm_unlock(lk);
	pthread_barrier_destroy(&h.locked);
	pthread_barrier_destroy(&h.release);
}

Test(shmlock, a_waiter_gets_the_lock_at_its_release)
{
	struct holder h = { .hold_ms = 100 };
	pthread_barrier_init(&h.locked, NULL, 2);
	pthread_t t;
	cr_assert_eq(pthread_create(&t, NULL, hold_then_release, &h), 0);
	pthread_barrier_wait(&h.locked);
	uint64_t t0 = now_ms();
	cr_assert_eq(ts_shm_lock(lk, LONG_NS), 0);
	uint64_t took = now_ms() - t0;
	/* it slept (the holder kept it 100 ms) and said so: its unlock wakes */
	cr_assert_eq(atomic_load(&lk->owner) & ~TS_SHM_LOCK_WAITERS, my_word());
	cr_assert_eq(atomic_load(&lk->owner) & TS_SHM_LOCK_WAITERS, TS_SHM_LOCK_WAITERS);
	cr_assert_geq(atomic_load(&lk->wake), 1u, "the holder's unlock bumped the wake counter");
	cr_expect_lt(took, 5000u, "woken at the release, not at the timeout (%llu ms)", (unsigned long long)took);
	ts_shm_unlock(lk);
	pthread_join(t, NULL);
	pthread_barrier_destroy(&h.locked);
}

/* ---- holders that are gone -------------------------------------------------------- */

static void *lock_and_exit(void *arg)
{
	(void)arg;
	cr_assert_eq(ts_shm_lock(lk, 0), 0);
	return NULL; /* exits holding it */
}

Test(shmlock, a_thread_that_exits_holding_it_is_taken_over)
{
	pthread_t t;
	cr_assert_eq(pthread_create(&t, NULL, lock_and_exit, NULL), 0);
	pthread_join(t, NULL);
	uint64_t was = atomic_load(&lk->owner);
	cr_assert_neq(was, 0u);
	/*
	 * pthread_join returns once the kernel has cleared the thread's tid
	 * word, which it does before the thread leaves its group: tgkill may
	 * find it for a moment more (CI once; 17 of 1500 runs beside two busy loops). The lock's
	 * waiters look again every 2 ms; here, a second at most.
	 */
	uint64_t t_gone = now_ms();
	while (!ts_shm_lock_holder_gone(was) && now_ms() - t_gone < 1000)
		usleep(1000);
	cr_assert(ts_shm_lock_holder_gone(was), "the thread still there %llu ms after its join",
		  (unsigned long long)(now_ms() - t_gone));
	uint64_t t0 = now_ms();
	cr_assert_eq(ts_shm_lock(lk, LONG_NS), TS_SHM_LOCK_REPAIR);
	cr_expect_lt(now_ms() - t0, 1000u);
	cr_assert_eq(atomic_load(&lk->owner) & ~TS_SHM_LOCK_WAITERS, my_word());
	ts_shm_unlock(lk);
	cr_assert_eq(ts_shm_lock(lk, 0), 0, "an ordinary lock after the repair");
	ts_shm_unlock(lk);
}

/* A child that takes the lock and tells us on the pipe; then it does what `end` says. */
enum child_end { EXIT_HOLDING, WAIT_FOR_KILL };

static pid_t child_holding(enum child_end end)
{
	int p[2];
	cr_assert_eq(pipe(p), 0);
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		close(p[0]);
		int ok = ts_shm_lock(lk, 0) == 0;
		(void)!write(p[1], &ok, sizeof(ok));
		if (end == EXIT_HOLDING)
			_exit(0);
		for (;;)
			pause();
	}
	close(p[1]);
	int ok = 0;
	cr_assert_eq(read(p[0], &ok, sizeof(ok)), (ssize_t)sizeof(ok));
	close(p[0]);
	cr_assert(ok, "the child could not take the lock");
	return pid;
}

Test(shmlock, a_process_that_exits_holding_it_is_taken_over)
{
	pid_t pid = child_holding(EXIT_HOLDING);
	int st;
	cr_assert_eq(waitpid(pid, &st, 0), pid);
	cr_assert_eq(ts_shm_lock_pid(atomic_load(&lk->owner)), (uint32_t)pid);
	cr_assert_eq(ts_shm_lock(lk, LONG_NS), TS_SHM_LOCK_REPAIR);
	ts_shm_unlock(lk);
}

Test(shmlock, a_killed_holder_not_yet_reaped_is_taken_over)
{
	pid_t pid = child_holding(WAIT_FOR_KILL);
	/* alive: waited for, never taken over */
	cr_assert_eq(ts_shm_lock(lk, 30 * MS), -ETIMEDOUT);
	kill(pid, SIGKILL);
	/* a zombie until we reap it: its thread still answers tgkill, its /proc stat says Z */
	siginfo_t si;
	cr_assert_eq(waitid(P_PID, (id_t)pid, &si, WEXITED | WNOWAIT), 0);
	cr_assert_eq(ts_shm_lock(lk, LONG_NS), TS_SHM_LOCK_REPAIR);
	ts_shm_unlock(lk);
	int st;
	cr_assert_eq(waitpid(pid, &st, 0), pid);
}

Test(shmlock, a_holder_in_another_process_is_waited_for)
{
	cr_assert_eq(ts_shm_lock(lk, 0), 0);
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		/* 100 ms: fifty looks at the holder, all of them alive */
		int r = ts_shm_lock(lk, 100 * MS);
		_exit(r == -ETIMEDOUT ? 0 : 1);
	}
	int st;
	cr_assert_eq(waitpid(pid, &st, 0), pid);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the child took a lock its live holder held");
	cr_assert_eq(atomic_load(&lk->owner) & ~TS_SHM_LOCK_WAITERS, my_word());
	ts_shm_unlock(lk);
}

Test(shmlock, a_forked_child_holds_it_under_its_own_name)
{
	/* the parent's thread keeps its word; the child's copy of that thread must not use it */
	cr_assert_eq(ts_shm_lock(lk, 0), 0);
	ts_shm_unlock(lk);
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		int r = ts_shm_lock(lk, 0);
		_exit(r == 0 && ts_shm_lock_pid(atomic_load(&lk->owner)) == (uint32_t)getpid() ? 0 : 1);
	}
	int st;
	cr_assert_eq(waitpid(pid, &st, 0), pid);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the child took the lock under another name");
	/* it exited holding it: ours to take over (under the parent's name it would be EDEADLK) */
	cr_assert_eq(ts_shm_lock(lk, LONG_NS), TS_SHM_LOCK_REPAIR);
	ts_shm_unlock(lk);
}

/* ---- what a peer may write ------------------------------------------------------------ */

Test(shmlock, any_word_a_peer_leaves_is_taken_over)
{
	struct ts_ident me;
	cr_assert_eq(ts_self_ident(&me), 0);
	uint32_t tid = (uint32_t)syscall(SYS_gettid);
	uint64_t init_start;
	cr_assert_eq(ts_prim_read_start_time(1, &init_start), 0);
	const uint64_t words[] = {
		~0ull,                                        /* pid 4194303, every bit */
		TS_SHM_LOCK_WAITERS,                          /* pid 0 */
		0x5a5a5a5a5a5a5a5aull,
		ts_shm_lock_word(me.pid, TS_SHM_LOCK_ID_MASK, me.start_time), /* our pid, no such thread */
		ts_shm_lock_word(me.pid, tid, me.start_time + 1), /* a later process with our pid */
		ts_shm_lock_word(1, 1, init_start + 1),       /* init's pid, a start time that is not its */
	};
	for (size_t i = 0; i < sizeof(words) / sizeof(words[0]); i++) {
		atomic_store(&lk->owner, words[i]);
		uint64_t t0 = now_ms();
		int r = ts_shm_lock(lk, LONG_NS);
		cr_assert_eq(r, TS_SHM_LOCK_REPAIR, "word %#llx: %d", (unsigned long long)words[i], r);
		cr_expect_lt(now_ms() - t0, 1000u);
		cr_assert_eq(atomic_load(&lk->owner) & ~TS_SHM_LOCK_WAITERS, my_word());
		ts_shm_unlock(lk);
	}
}

Test(shmlock, any_bytes_a_peer_leaves_never_fault)
{
	/* with a robust pthread mutex, bytes like these are list links its unlock writes through */
	srand(7);
	for (int round = 0; round < 200; round++) {
		unsigned char *b = (unsigned char *)lk;
		for (size_t i = 0; i < sizeof(*lk); i++)
			b[i] = (unsigned char)rand();
		int r = ts_shm_lock(lk, LONG_NS);
		cr_assert(r == 0 || r == TS_SHM_LOCK_REPAIR, "round %d: %d", round, r);
		ts_shm_unlock(lk);
		cr_assert_eq(atomic_load(&lk->owner), 0u);
	}
}
