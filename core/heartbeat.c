/* SPDX-License-Identifier: MIT */
#include "heartbeat.h"

#include <errno.h>
#include <signal.h>
#include <string.h>

static void beat(struct ts_heartbeat *hb)
{
	enum ts_role role = ts_session_tick(hb->session);
	if (role != hb->role) {
		hb->role = role;
		uint64_t w = atomic_load(&hb->session->seg->producer);
		if (hb->on_role)
			hb->on_role(role, ts_producer_epoch(w), hb->arg);
	}
}

static void *heartbeat_main(void *arg)
{
	struct ts_heartbeat *hb = arg;
	struct ts_segment *seg = hb->session->seg;
	while (!atomic_load(&hb->stop)) {
		uint32_t ev = atomic_load(&seg->election_ev);
		beat(hb);
		if (!atomic_load_explicit(&hb->started, memory_order_relaxed)) {
			/* up and beating: ts_heartbeat_start may return */
			atomic_store_explicit(&hb->started, 1, memory_order_release);
			ts_futex_wake_all(&hb->started);
		}
		/*
		 * Sleep until the next beat, or until the producer changes (a leaving
		 * producer bumps election_ev, so its successor starts at once).
		 * The stop word is checked between slices of at most one interval.
		 */
		int r = ts_futex_wait(&seg->election_ev, ev, hb->interval_ns);
		(void)r;
	}
	return NULL;
}

/*
 * Until the thread has beaten once, 1 s at most. A thread that is still
 * starting may hold a lock of the allocator (its thread cache, TLS); a fork()
 * right after the start copies that lock held into a child where nobody
 * releases it. A DataLoader forks its workers right after the layer opens an
 * epoch's feed (exact mode opens one per epoch): in the first ASan run of
 * scenario exact_batches a worker hung for good in malloc, on ASan's
 * allocator lock.
 */
static void wait_started(struct ts_heartbeat *hb)
{
	uint64_t end = ts_now_ns() + 1000000000ull;
	while (!atomic_load_explicit(&hb->started, memory_order_acquire)) {
		uint64_t now = ts_now_ns();
		if (now >= end)
			return; /* a slow start is not an error: the thread beats when it runs */
		(void)ts_futex_wait(&hb->started, 0, end - now); /* EINTR, spurious: look again */
	}
}

int ts_heartbeat_start(struct ts_heartbeat *hb, struct ts_session *s, ts_role_fn on_role, void *arg)
{
	memset(hb, 0, sizeof(*hb));
	hb->session = s;
	hb->on_role = on_role;
	hb->arg = arg;
	hb->interval_ns = s->timeout_ns / 4;
	hb->role = ts_session_role(s);
	if (hb->on_role)
		hb->on_role(hb->role, ts_producer_epoch(atomic_load(&s->seg->producer)), arg);

	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	int ret = -pthread_create(&hb->thread, NULL, heartbeat_main, hb);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	hb->running = ret == 0;
	if (ret == 0)
		wait_started(hb);
	return ret;
}

void ts_heartbeat_stop(struct ts_heartbeat *hb)
{
	if (!hb->running)
		return;
	atomic_store(&hb->stop, 1);
	/* Wake it from its futex sleep; it rechecks stop within one interval anyway. */
	atomic_fetch_add(&hb->session->seg->election_ev, 1);
	ts_futex_wake_all(&hb->session->seg->election_ev);
	pthread_join(hb->thread, NULL);
	hb->running = 0;
}

void ts_heartbeat_forget(struct ts_heartbeat *hb)
{
	hb->running = 0;
}
