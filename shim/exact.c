/* SPDX-License-Identifier: MIT */
#include "exact.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "io.h"
#include "log.h"
#include "shim.h"

enum { CACHE_UNTRIED = 0, CACHE_OPEN = 1, CACHE_FAILED = 2 };

static struct ts_cache cache;
static _Atomic int cache_state;
static pthread_mutex_t open_lock = PTHREAD_MUTEX_INITIALIZER;
/* The configuration allows the cache: every mode but off shares decodes. */
static int cache_configured(void)
{
	return ts_cfg.mode != TS_MODE_OFF && ts_cfg.cache_mb > 0;
}

/*
 * The job a forked child belongs to: the nearest ancestor that is not itself
 * a fork child (DataLoader workers are forked per epoch by the job). A child
 * registers it in the cache, so the cache outlives one generation of workers
 * and the next epoch's hit what the last one decoded; the job unregisters at
 * exit (exact_fini), and the last one out removes the cache.
 */
static struct ts_ident job;
/*
 * Whether the job said why the cache is unavailable: a word shared with the
 * workers it forks (made before its first fork), so a refused cache costs a
 * job one line, not one per worker and epoch. NULL: say it (no fork yet).
 */
static _Atomic int *told_unavailable;

/* Before fork, holding no lock (the first call reads /proc through our own
 * open hook): the child's job is this process unless it is a fork child. */
void ts_exact_fork_note_job(void)
{
	if (atomic_load(&ts_is_fork_child))
		return;
	if (ts_self_ident(&job) != 0)
		job.pid = 0;
	if (!told_unavailable && cache_configured()) {
		void *m = mmap(NULL, sizeof(*told_unavailable), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
		if (m != MAP_FAILED)
			told_unavailable = m;
	}
}

/* Fork handlers: a child must not inherit open_lock held by another thread. */
void ts_exact_fork_lock(void) { pthread_mutex_lock(&open_lock); }
void ts_exact_fork_unlock(void) { pthread_mutex_unlock(&open_lock); }

int ts_exact_enabled(void)
{
	/*
	 * Also under a shared DataLoader (socket mode): its producer decodes
	 * each image once per epoch for the whole session, and with the cache
	 * once for the whole run, later epochs' workers hitting the first's.
	 */
	return ts_shim_ready() && cache_configured() &&
	       atomic_load_explicit(&cache_state, memory_order_acquire) != CACHE_FAILED;
}

/* Open once per process; a failure turns sharing off for this process only. */
static int cache_ready(void)
{
	int st = atomic_load_explicit(&cache_state, memory_order_acquire);
	if (st != CACHE_UNTRIED)
		return st == CACHE_OPEN;
	pthread_mutex_lock(&open_lock);
	if (atomic_load(&cache_state) == CACHE_UNTRIED) {
		char why[200] = "";
		int ret = ts_cache_open(&cache, ts_cfg.session, ts_cfg.cache_mb << 20, why, sizeof(why));
		if (ret) {
			/* Once per job; its other workers say it only at debug. */
			int told = told_unavailable && atomic_exchange(told_unavailable, 1);
			ts_log(told ? TS_LOG_DEBUG : TS_LOG_WARN,
			       "decoded-image cache of session '%s' unavailable: %s%s%s; decoding privately",
			       ts_cfg.session, strerror(-ret), why[0] ? ": " : "", why);
			atomic_store_explicit(&cache_state, CACHE_FAILED, memory_order_release);
		} else {
			ts_info("decoded-image cache of session '%s': %llu MiB", ts_cfg.session,
				(unsigned long long)(cache.arena_size >> 20));
			if (atomic_load(&ts_is_fork_child) && job.pid != 0 && (ret = ts_cache_adopt(&cache, &job)) != 0)
				ts_debug("cache of session '%s' not kept for job %u: %s", ts_cfg.session, job.pid,
					 strerror(-ret));
			atomic_store_explicit(&cache_state, CACHE_OPEN, memory_order_release);
			if (ts_io_scope_string()[0])
				ts_cache_set_scope(&cache, ts_io_scope_string());
		}
	}
	pthread_mutex_unlock(&open_lock);
	return atomic_load(&cache_state) == CACHE_OPEN;
}

enum ts_exact_result ts_exact_get(const struct ts_cache_key *k, uint64_t len, void *dst,
				  struct ts_cache_fill *fill)
{
	if (!cache_ready())
		return TS_EXACT_BYPASS;
	/* Wait for another job's decode of the same image at most as long as
	 * we tolerate a silent producer: lockstep jobs then decode it once. */
	uint64_t wait_ns = (uint64_t)ts_cfg.timeout_ms * 1000000ull;
	int r = ts_cache_get(&cache, k, len, dst, wait_ns, fill);
	if (r == TS_CACHE_HIT)
		return TS_EXACT_HIT;
	if (r == TS_CACHE_FILL)
		return TS_EXACT_FILL;
	if (r < 0)
		ts_debug("cache lookup failed: %s", strerror(-r));
	return TS_EXACT_BYPASS;
}

void ts_exact_commit(struct ts_cache_fill *fill, uint64_t decode_ns)
{
	int r = ts_cache_commit(&cache, fill, decode_ns);
	if (r)
		ts_debug("cache fill not published: %s", strerror(-r));
}

void ts_exact_abort(struct ts_cache_fill *fill)
{
	ts_cache_abort(&cache, fill);
}

void ts_exact_note_scope(const char *scope)
{
	if (atomic_load_explicit(&cache_state, memory_order_acquire) == CACHE_OPEN)
		ts_cache_set_scope(&cache, scope);
}

/*
 * Leave the cache at exit (the last user out removes it). DataLoader
 * workers usually end with _exit() and never get here; their parent, the
 * job, does: it unregisters where they adopted it, and once every user is
 * gone it removes the segment.
 */
__attribute__((destructor)) static void exact_fini(void)
{
	int init = atomic_load(&ts_init_state); /* FINI: the shim's own destructor ran first */
	if ((init != TS_READY && init != TS_FINI) || !cache_configured())
		return;
	if (atomic_load(&cache_state) == CACHE_OPEN) {
		struct ts_cache_stats st;
		ts_cache_stats(&cache, &st);
		ts_info("decoded-image cache: %llu hits, %llu fills, %llu bypasses",
			(unsigned long long)st.hits, (unsigned long long)st.fills,
			(unsigned long long)st.bypasses);
		/* Unregister but keep the mapping: another thread may still be
		 * copying a hit or filling while the process exits. */
		ts_cache_leave(&cache);
	}
	if (!atomic_load(&ts_is_fork_child)) {
		/* Our workers registered us: unregister, and remove the cache if
		 * nobody else uses it (or what dead users left). */
		char path[TS_PATH_MAX];
		struct ts_cache_stats st;
		if (ts_cache_path(path, sizeof(path), getuid(), ts_cfg.session) == 0 &&
		    ts_cache_depart(path, &st) == 1 && st.fills > 0)
			ts_info("decoded-image cache of session '%s' removed, last out: %llu hits, %llu fills, %llu bypasses, %llu not admitted (all its users)",
				ts_cfg.session, (unsigned long long)st.hits, (unsigned long long)st.fills,
				(unsigned long long)st.bypasses, (unsigned long long)st.bypass_cold);
	}
}
