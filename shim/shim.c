/* SPDX-License-Identifier: MIT */
/*
 * Life cycle of the shim inside a host process: configuration at load,
 * membership on demand, fork handlers, and leaving at exit.
 *
 * A process becomes a member only when it does shared work (today: when it
 * calls tsshim_join(), as the PyTorch layer and the C API do). Loading the
 * shim alone creates nothing, starts no thread and touches no file.
 */
#include "shim.h"
#include "stream.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "heartbeat.h"
#include "io.h"
#include "prefetch.h"
#include "session.h"
#define TSSHIM_WEAK /* the definitions are strong */
#include "tsshim.h"

#define TS_EXPORT __attribute__((visibility("default")))
#define TS_ANCESTOR_DEPTH 8

_Atomic int ts_init_state;
struct ts_config ts_cfg;
__thread int ts_in_hook;
_Atomic int ts_is_fork_child;

extern char **environ;

/* Membership: written under join_lock, read by the API. */
static pthread_mutex_t join_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
	int tried;             /* join attempted (its result below) */
	int result;            /* 0 or -errno */
	int worker_of;         /* pid of the member we work for (exec'd child), else 0 */
	struct ts_session session;
	struct ts_heartbeat heartbeat;
} member;

/*
 * TSSHIM_PREFETCH=warm: the producer reads the scope ahead, once per process.
 * prefetch_lock serialises start and stop of `prefetch` (the heartbeat
 * thread starts it, exit and tsshim_leave stop it, and so may any thread
 * that calls close_range); it is held no longer than a stop takes
 * (TS_PREFETCH_STOP_MS) and never in a forked or vfork child.
 */
static struct ts_prefetch prefetch;
static _Atomic int prefetch_started;
static pthread_mutex_t prefetch_lock = PTHREAD_MUTEX_INITIALIZER;

/* Bounded: the shim never blocks without a timeout. 0 when taken. */
static int prefetch_lock_take(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	ts.tv_sec += (TS_PREFETCH_STOP_MS + 1000) / 1000 + 1;
	return pthread_mutex_clocklock(&prefetch_lock, CLOCK_MONOTONIC, &ts);
}

static void maybe_start_prefetch(void)
{
	const char *roots[TS_DATA_MAX_ROOTS];
	if (ts_cfg.prefetch != TS_PREFETCH_WARM || atomic_load(&ts_is_fork_child) || !member.session.seg ||
	    ts_session_role(&member.session) != TS_ROLE_PRODUCER)
		return;
	unsigned n = ts_io_scope_roots(roots, TS_DATA_MAX_ROOTS);
	int expected = 0;
	if (n == 0 || !atomic_compare_exchange_strong(&prefetch_started, &expected, 1))
		return;
	if (prefetch_lock_take() != 0)
		return;
	int ret = ts_prefetch_start(&prefetch, roots, n, NULL);
	pthread_mutex_unlock(&prefetch_lock);
	if (ret)
		ts_warn("prefetch not started: %s", strerror(-ret));
	else
		ts_info("prefetch: reading %s ahead", ts_io_scope_string());
}

static void stop_prefetch(void)
{
	struct ts_prefetch_stats st;
	/* a forked child has no prefetch thread, and may have inherited the lock held */
	if (atomic_load(&ts_is_fork_child) || !atomic_load(&prefetch_started) || prefetch_lock_take() != 0)
		return;
	int ret = ts_prefetch_stop(&prefetch, &st);
	pthread_mutex_unlock(&prefetch_lock);
	if (ret == -ESRCH)
		return;
	ts_info("prefetch: %llu files, %llu bytes, %llu errors in %.2f s (%s)", (unsigned long long)st.files,
		(unsigned long long)st.bytes, (unsigned long long)st.errors, (double)st.usec / 1e6,
		st.used_uring ? "io_uring" : "plain reads");
}

/*
 * The host is about to close descriptors it does not know (close_range,
 * closefrom): a prefetch whose descriptors live in its table is stopped
 * first, else it would go on to read and close numbers the host reuses.
 * It is only a warm-up: stopping it changes nothing the host sees. The
 * caller has made sure this is not a vfork child; a forked child has no
 * prefetch thread.
 */
void ts_shim_fds_closing(void)
{
	struct ts_prefetch_stats st;
	if (atomic_load(&ts_is_fork_child) || !atomic_load(&prefetch_started) || prefetch_lock_take() != 0)
		return;
	int ret = -ESRCH;
	if (ts_prefetch_shares_fds(&prefetch))
		ret = ts_prefetch_stop(&prefetch, &st);
	pthread_mutex_unlock(&prefetch_lock);
	if (ret != -ESRCH)
		ts_info("prefetch stopped: the program closes its descriptors (%llu files, %llu bytes read)",
			(unsigned long long)st.files, (unsigned long long)st.bytes);
}

void ts_shim_scope_known(void)
{
	maybe_start_prefetch();
}

void ts_shim_dataset_work(void)
{
	/* Cheap after the first call; forked workers work for their parent. */
	if (!member.tried && !atomic_load(&ts_is_fork_child))
		tsshim_join();
}

static const char *env_get(const char *name)
{
	return getenv(name);
}

/* A typo in a variable name is worth one warning, not turning the shim off. */
static void warn_unknown_vars(void)
{
	for (char **e = environ; e && *e; e++) {
		if (strncmp(*e, "TSSHIM_", 7) != 0)
			continue;
		size_t n = strcspn(*e, "=");
		int known = 0;
		for (const char *const *v = ts_config_vars; *v && !known; v++)
			known = strlen(*v) == n && strncmp(*v, *e, n) == 0;
		if (!known)
			ts_warn("unknown variable %.*s ignored", (int)(n > 64 ? 64 : n), *e);
	}
}

static void on_role(enum ts_role role, uint32_t epoch, void *arg)
{
	const struct ts_session *s = arg;
	ts_info("%s of session '%s' (epoch %u)", role == TS_ROLE_PRODUCER ? "producer" : "consumer", s->name, epoch);
	if (role == TS_ROLE_PRODUCER)
		maybe_start_prefetch();
}

/*
 * No fork in the middle of a libjpeg lookup or a cache open: a forked
 * worker decodes and uses the cache, so its copies must be consistent and
 * its locks free. Always this order.
 *
 * A join is not waited for: it may wait up to TSSHIM_TIMEOUT_MS on the
 * session's lock, and the host's fork() would wait with it. A child never
 * joins or leaves (member is only read there behind pid checks, and a
 * half-written member fails them), so it only needs join_lock usable:
 * made afresh, whichever parent thread held it.
 */
static void atfork_prepare(void)
{
	ts_exact_fork_note_job();
	ts_jpeg_fork_lock();
	ts_exact_fork_lock();
}

static void atfork_parent(void)
{
	ts_exact_fork_unlock();
	ts_jpeg_fork_unlock();
}

static void atfork_child(void)
{
	ts_exact_fork_unlock();
	ts_io_fork_child();
	ts_jpeg_fork_child();
	pthread_mutex_init(&join_lock, NULL);
	ts_session_atfork_child();
	ts_feed_api_atfork_child();
	atomic_store(&ts_is_fork_child, 1);
	/* The heartbeat thread stayed in the parent; the child never beats. */
	ts_heartbeat_forget(&member.heartbeat);
}

__attribute__((constructor)) static void ts_shim_init(void)
{
	int expected = TS_UNINIT;
	if (!atomic_compare_exchange_strong(&ts_init_state, &expected, TS_INITIALIZING))
		return;
	ts_log_bind();
	char err[512];
	if (ts_config_parse(&ts_cfg, env_get, err, sizeof(err)) != 0) {
		ts_log_threshold = TS_LOG_ERROR;
		ts_error("%s", err);
		atomic_store(&ts_init_state, TS_DISABLED);
		return;
	}
	ts_log_threshold = (int)ts_cfg.log;
	warn_unknown_vars();
	if (ts_cfg.mode == TS_MODE_OFF) {
		ts_debug("TSSHIM_MODE=off: passing everything through");
		atomic_store(&ts_init_state, TS_DISABLED);
		return;
	}
	if (pthread_atfork(atfork_prepare, atfork_parent, atfork_child) != 0) {
		ts_warn("cannot install fork handlers; tsshim is off for this process");
		atomic_store(&ts_init_state, TS_DISABLED);
		return;
	}
	atomic_store_explicit(&ts_init_state, TS_READY, memory_order_release);
	ts_io_init();
	ts_bootstrap_python();
}

static int owns_membership(void)
{
	return member.session.seg && member.session.me.pid == (uint32_t)getpid();
}

__attribute__((destructor)) static void ts_shim_fini(void)
{
	int expected = TS_READY;
	if (!atomic_compare_exchange_strong(&ts_init_state, &expected, TS_FINI))
		return;
	ts_feed_api_fini();
	ts_stream_fini();
	if (owns_membership()) {
		ts_heartbeat_stop(&member.heartbeat);
		stop_prefetch();
		ts_session_leave(&member.session);
	}
	/*
	 * Members that die (SIGKILL, a DataLoader worker's _exit) cannot remove
	 * the session. A job that shared a DataLoader is often not a member of
	 * its session itself (its workers are): if every member is gone now, it
	 * removes the session on its way out. Other processes (every program a
	 * job starts) pay nothing here.
	 */
	char path[TS_PATH_MAX];
	if (atomic_load(&ts_feed_active) && !atomic_load(&ts_is_fork_child) &&
	    ts_segment_path(path, sizeof(path), getuid(), ts_cfg.session) == 0)
		ts_session_remove_if_stale(path);
}

/*
 * A program exec'd by a member (or by its workers) with the shim preloaded
 * works for that member: find the closest ancestor that is a live member.
 */
static int find_member_ancestor(void)
{
	char path[TS_PATH_MAX], why[160];
	struct ts_view v;
	if (ts_segment_path(path, sizeof(path), getuid(), ts_cfg.session) || ts_view_open(&v, path, why, sizeof(why)))
		return 0;
	int found = 0;
	uint32_t pid = (uint32_t)getppid();
	for (int depth = 0; depth < TS_ANCESTOR_DEPTH && pid > 1 && !found; depth++) {
		uint64_t start;
		uint32_t ppid;
		if (ts_prim_read_stat(pid, &start, &ppid) != 0)
			break;
		for (unsigned i = 0; i < TS_MAX_MEMBERS && !found; i++) {
			const struct ts_member *m = &v.seg->members[i];
			if (atomic_load(&m->pid) == pid && atomic_load(&m->start_time) == start)
				found = (int)pid;
		}
		pid = ppid;
	}
	ts_view_close(&v);
	return found;
}

static int join_locked(void)
{
	if (atomic_load(&ts_is_fork_child))
		return -ECHILD; /* a forked child of a non-member never joins */
	member.worker_of = find_member_ancestor();
	if (member.worker_of) {
		ts_info("working for member %d of session '%s'", member.worker_of, ts_cfg.session);
		return 0;
	}
	struct ts_session_params p = { .depth = ts_cfg.depth, .timeout_ms = ts_cfg.timeout_ms };
	int ret = ts_session_join(&member.session, ts_cfg.session, &p);
	if (ret) {
		ts_warn("cannot join session '%s': %s%s%s; sharing is off for this process", ts_cfg.session,
			strerror(-ret), member.session.why[0] ? ": " : "", member.session.why);
		return ret;
	}
	if (member.session.seg->st.depth != ts_cfg.depth)
		ts_info("session '%s' runs with depth %u (set by its creator), not %u", ts_cfg.session,
			member.session.seg->st.depth, ts_cfg.depth);
	ret = ts_heartbeat_start(&member.heartbeat, &member.session, on_role, &member.session);
	if (ret) {
		ts_warn("cannot start heartbeat thread: %s; sharing is off for this process", strerror(-ret));
		ts_session_leave(&member.session);
	}
	return ret;
}

TS_EXPORT int tsshim_join(void)
{
	if (!ts_shim_ready())
		return -ENOTSUP;
	int saved = errno;
	pthread_mutex_lock(&join_lock);
	if (!member.tried) {
		member.result = join_locked();
		member.tried = 1;
	}
	int ret = member.result;
	pthread_mutex_unlock(&join_lock);
	errno = saved;
	return ret;
}

TS_EXPORT int tsshim_role(void)
{
	if (!ts_shim_ready() || !member.tried || member.result)
		return TSSHIM_ROLE_NONE;
	if (member.worker_of || !owns_membership())
		return TSSHIM_ROLE_WORKER;
	return ts_session_role(&member.session) == TS_ROLE_PRODUCER ? TSSHIM_ROLE_PRODUCER : TSSHIM_ROLE_CONSUMER;
}

TS_EXPORT void tsshim_leave(void)
{
	int saved = errno;
	pthread_mutex_lock(&join_lock);
	if (owns_membership()) {
		ts_heartbeat_stop(&member.heartbeat);
		stop_prefetch();
		ts_session_leave(&member.session);
		member.result = -ENOENT; /* left: a later join does not come back */
	}
	pthread_mutex_unlock(&join_lock);
	errno = saved;
}

TS_EXPORT const char *tsshim_version(void)
{
	return "tsshim 0.1.0";
}
