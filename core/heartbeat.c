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

int ts_heartbeat_start(struct ts_heartbeat *hb, struct ts_session *s, ts_role_fn on_role, void *arg)
{
	memset(hb, 0, sizeof(*hb));
	hb->session = s;
	hb->on_role = on_role;
	hb->arg = arg;
	hb->interval_ns = (uint64_t)s->seg->st.timeout_ms * 1000000ull / 4;
	hb->role = ts_session_role(s);
	if (hb->on_role)
		hb->on_role(hb->role, ts_producer_epoch(atomic_load(&s->seg->producer)), arg);

	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	int ret = -pthread_create(&hb->thread, NULL, heartbeat_main, hb);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	hb->running = ret == 0;
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
