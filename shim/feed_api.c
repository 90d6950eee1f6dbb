/* SPDX-License-Identifier: MIT */
/*
 * The data-feed API for the PyTorch layer (shim/python/tsshim_feed.py reaches
 * it through ctypes on the already loaded library). A thin, checked layer
 * over core/feed.c: handles instead of pointers, milliseconds instead of
 * nanoseconds, the session name and parameters from TSSHIM_*. Every call
 * returns 0 (or a value) or -errno; none raises a signal or blocks longer
 * than asked, and errno is left as it was.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "feed.h"
#include "feed_api.h"
#include "shim.h"

#define TS_EXPORT __attribute__((visibility("default")))
#define MAX_FEEDS 32

_Atomic int ts_feed_active;
static pthread_mutex_t feeds_lock = PTHREAD_MUTEX_INITIALIZER;
static struct ts_feed *feeds[MAX_FEEDS];
static __thread char open_why[sizeof(((struct ts_session *)0)->why)];

/* Run a core call with the file hooks passing straight through, errno kept. */
#define FEED_CALL(h, f, expr)                                           \
	({                                                              \
		int saved_errno_ = errno, prev_ = ts_in_hook, ret_;     \
		struct ts_feed *f = feed_of(h); /* NOLINT(bugprone-macro-parentheses): a declarator */ \
		ts_in_hook = 1;                                         \
		ret_ = f ? (expr) : -EBADF; /* NOLINT(bugprone-macro-parentheses) */ \
		ts_in_hook = prev_;                                     \
		errno = saved_errno_;                                   \
		ret_;                                                   \
	})

static struct ts_feed *feed_of(int h)
{
	if (!ts_shim_ready() || atomic_load(&ts_is_fork_child) || h < 0 || h >= MAX_FEEDS)
		return NULL;
	struct ts_feed *f = feeds[h];
	return f && f->s.me.pid == (uint32_t)getpid() ? f : NULL;
}

static inline uint64_t ms_ns(uint32_t ms)
{
	return (uint64_t)ms * 1000000ull;
}

TS_EXPORT int tsshim_feed_open(const char *key, const char *label, uint64_t nindex)
{
	char name[TS_NAME_MAX];
	int saved = errno, prev = ts_in_hook, ret = -EMFILE;
	if (!ts_shim_ready())
		return -ENOTSUP;
	if (atomic_load(&ts_is_fork_child))
		return -ECHILD;
	if (!key || snprintf(name, sizeof(name), "%s.%s", ts_cfg.session, key) >= (int)sizeof(name))
		return -ENAMETOOLONG;
	if (!ts_session_name_valid(name))
		return -EINVAL;
	open_why[0] = '\0';
	struct ts_feed *f = malloc(sizeof(*f));
	if (!f)
		return -ENOMEM;
	struct ts_session_params p = { .depth = ts_cfg.depth, .timeout_ms = ts_cfg.timeout_ms, .label = label };
	ts_in_hook = 1;
	pthread_mutex_lock(&feeds_lock);
	for (int i = 0; i < MAX_FEEDS; i++) {
		if (feeds[i])
			continue;
		ret = ts_feed_open(f, name, &p, nindex);
		if (ret == 0) {
			feeds[i] = f;
			ret = i;
			atomic_store(&ts_feed_active, 1);
		}
		break;
	}
	pthread_mutex_unlock(&feeds_lock);
	ts_in_hook = prev;
	if (ret < 0) {
		snprintf(open_why, sizeof(open_why), "%s", f->s.why);
		free(f);
	}
	errno = saved;
	return ret;
}

/* Why this thread's last tsshim_feed_open() failed, if the core said ("" otherwise). */
TS_EXPORT const char *tsshim_feed_open_why(void)
{
	return open_why;
}

TS_EXPORT void tsshim_feed_close(int h)
{
	int saved = errno, prev = ts_in_hook;
	struct ts_feed *f = NULL;
	pthread_mutex_lock(&feeds_lock);
	if (feed_of(h)) {
		f = feeds[h];
		feeds[h] = NULL;
	}
	pthread_mutex_unlock(&feeds_lock);
	if (f) {
		ts_in_hook = 1;
		ts_feed_close(f);
		ts_in_hook = prev;
		free(f);
	}
	errno = saved;
}

/* At exit: leave every feed, so a producer hands over at once. */
void ts_feed_api_fini(void)
{
	int saved = errno;
	ts_in_hook = 1;
	pthread_mutex_lock(&feeds_lock);
	for (int i = 0; i < MAX_FEEDS; i++) {
		struct ts_feed *f = feeds[i];
		if (!f || atomic_load(&ts_is_fork_child) || f->s.me.pid != (uint32_t)getpid())
			continue;
		feeds[i] = NULL;
		ts_feed_close(f);
		free(f);
	}
	pthread_mutex_unlock(&feeds_lock);
	errno = saved;
}

TS_EXPORT int tsshim_feed_role(int h)
{
	return FEED_CALL(h, f, (int)ts_feed_role(f));
}

TS_EXPORT int tsshim_feed_timeout_ms(int h)
{
	return FEED_CALL(h, f, (int)f->s.seg->st.timeout_ms);
}

/* How long to wait on a consumer that does not read before evicting it (ts_stall_ns). */
TS_EXPORT int tsshim_feed_stall_ms(int h)
{
	return FEED_CALL(h, f, (int)(ts_stall_ns(f->s.seg) / 1000000ull));
}

TS_EXPORT int tsshim_feed_take_idle(int h)
{
	return FEED_CALL(h, f, ts_session_take_idle(&f->s, ms_ns(f->s.seg->st.timeout_ms)));
}

TS_EXPORT int tsshim_feed_set_idle(int h, int idle)
{
	return FEED_CALL(h, f, (ts_session_set_idle(&f->s, idle), 0));
}

TS_EXPORT int tsshim_feed_flags(int h)
{
	return FEED_CALL(h, f, (int)atomic_load(&f->s.seg->feed_flags));
}

TS_EXPORT int tsshim_feed_set_unshareable(int h)
{
	return FEED_CALL(h, f, (int)atomic_fetch_or(&f->s.seg->feed_flags, TS_FEED_UNSHAREABLE));
}

TS_EXPORT int tsshim_feed_publish(int h, uint32_t npos, uint32_t flags, uint64_t nsamples, const uint64_t *len,
				  const void *const *src, const int64_t *index, uint64_t stream_epoch,
				  const char *schema, uint32_t schema_len, uint64_t cpu_ns, uint32_t timeout_ms)
{
	struct ts_feed_batch b = {
		.npos = npos, .flags = flags, .nsamples = nsamples, .len = len, .src = src, .index = index,
		.stream_epoch = stream_epoch, .schema = schema, .schema_len = schema_len, .cpu_ns = cpu_ns,
	};
	if (!len || !src || (!schema && schema_len))
		return -EINVAL;
	return FEED_CALL(h, f, ts_feed_publish(f, &b, ms_ns(timeout_ms)));
}

TS_EXPORT int tsshim_feed_evict_laggards(int h)
{
	return FEED_CALL(h, f, ts_feed_evict_laggards(f));
}

TS_EXPORT int tsshim_feed_stream_state(int h, uint64_t *epoch, int *ended, int64_t *rest, uint64_t *nrest,
				       uint64_t *npublished, uint32_t timeout_ms)
{
	if (!epoch || !ended || !nrest || !npublished)
		return -EINVAL;
	return FEED_CALL(h, f, ts_feed_stream_state(f, epoch, ended, rest, nrest, npublished, ms_ns(timeout_ms)));
}

TS_EXPORT int tsshim_feed_attach(int h, int at_epoch_start)
{
	return FEED_CALL(h, f, ts_feed_attach(f, at_epoch_start));
}

TS_EXPORT int tsshim_feed_detach(int h)
{
	return FEED_CALL(h, f, ts_feed_detach(f));
}

TS_EXPORT int tsshim_feed_at_head(int h)
{
	return FEED_CALL(h, f, ts_feed_at_head(f));
}

TS_EXPORT int tsshim_feed_next(int h, uint32_t timeout_ms, uint32_t *npos, uint64_t *nsamples, uint64_t *stream_epoch,
			       uint64_t *sample_bytes, char *schema, uint32_t *schema_len)
{
	static __thread struct ts_feed_info info;
	if (!npos || !nsamples || !stream_epoch || !sample_bytes || !schema || !schema_len)
		return -EINVAL;
	int ret = FEED_CALL(h, f, ts_feed_next(f, ms_ns(timeout_ms), &info));
	if (ret)
		return ret;
	*npos = info.npos;
	*nsamples = info.nsamples;
	*stream_epoch = info.stream_epoch;
	memcpy(sample_bytes, info.sample_bytes, sizeof(info.sample_bytes));
	memcpy(schema, info.schema, info.schema_len);
	*schema_len = info.schema_len;
	return 0;
}

TS_EXPORT int tsshim_feed_read(int h, uint32_t npos, const uint64_t *want, void *const *dst, uint64_t *got, int *eoe,
			       uint32_t timeout_ms)
{
	if (!want || !got || !eoe)
		return -EINVAL;
	return FEED_CALL(h, f, ts_feed_read(f, npos, want, dst, got, eoe, ms_ns(timeout_ms)));
}

TS_EXPORT int tsshim_feed_read_view(int h, uint32_t npos, const uint64_t *want, void **ptr, uint64_t *got, int *eoe,
				    uint64_t *id, uint32_t timeout_ms)
{
	if (!want || !ptr || !got || !eoe || !id)
		return -EINVAL;
	return FEED_CALL(h, f, ts_feed_read_view(f, npos, want, ptr, got, eoe, id, ms_ns(timeout_ms)));
}

TS_EXPORT int tsshim_feed_release_view(int h, uint64_t id)
{
	return FEED_CALL(h, f, (ts_feed_release_view(f, id), 0));
}

TS_EXPORT int tsshim_feed_served(int h, uint64_t batches, uint64_t samples)
{
	return FEED_CALL(h, f, (atomic_fetch_add(&f->s.seg->counters.batches_shared, batches),
				atomic_fetch_add(&f->s.seg->counters.samples_served, samples), 0));
}
