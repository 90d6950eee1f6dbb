/* SPDX-License-Identifier: MIT */
/*
 * The heartbeat thread of a member: beats every interval, notices a missing
 * or silent producer and takes over (ts_session_tick), and reports role
 * changes. It blocks every signal, so the host's signal handling is unchanged.
 */
#ifndef TSSHIM_CORE_HEARTBEAT_H
#define TSSHIM_CORE_HEARTBEAT_H

#include <pthread.h>
#include <stdatomic.h>

#include "session.h"

typedef void (*ts_role_fn)(enum ts_role role, uint32_t epoch, void *arg);

struct ts_heartbeat {
	struct ts_session *session;
	uint64_t interval_ns;
	ts_role_fn on_role;
	void *arg;
	_Atomic uint32_t stop;   /* futex word: set to 1 to stop */
	_Atomic uint32_t started; /* futex word: 1 once the thread has beaten (start waits for it) */
	enum ts_role role;
	pthread_t thread;
	int running;
};

/* interval: a quarter of the session timeout, so takeover happens within
 * timeout + one beat. on_role reports the initial role on the caller's
 * thread, then every change on the heartbeat thread. Returns once the thread
 * has beaten once (1 s at most), so that a fork() right after it never
 * copies a lock the starting thread holds. */
int ts_heartbeat_start(struct ts_heartbeat *hb, struct ts_session *s, ts_role_fn on_role, void *arg);
void ts_heartbeat_stop(struct ts_heartbeat *hb);
/* In a forked child the thread does not exist: forget it without joining. */
void ts_heartbeat_forget(struct ts_heartbeat *hb);

#endif
