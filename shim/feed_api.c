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
#include <sys/mman.h>
#include <unistd.h>

#include "bitmap.h"
#include "cuda_hooks.h"
#include "feed.h"
#include "feed_api.h"
#include "gpu.h"
#include "shim.h"
#include "stream.h"

#define TS_EXPORT __attribute__((visibility("default")))
#define MAX_FEEDS 32

/*
 * The GPU side of a feed in a process that uses CUDA: the batches the layer
 * yields are registered as stream ranges (shim/stream.h), so that the
 * producer's uploads of them are kept in the feed's GPU ring and a
 * consumer's are served from it. Made by tsshim_feed_gpu(); used by the
 * thread that iterates the feed.
 */
struct feed_gpu {
	struct ts_gpu *gpu;
	struct ts_batch_ranges rg;   /* where the batch being read comes from */
};

_Atomic int ts_feed_active;
static pthread_mutex_t feeds_lock = PTHREAD_MUTEX_INITIALIZER;

/*
 * Views outlive their feed: a feed closed with views alive turns each into
 * private memory at the same address, and the program lets go of it later,
 * when its last tensor goes, from whatever thread drops it (a finalizer).
 * views_mu orders such a release against a close: close takes it before it
 * takes the feed out of feeds[] and hands the feed's live views to
 * `orphans` before it frees the feed; a release under it finds its view in
 * the feed, or here. Lock order: views_mu, then feeds_lock.
 */
#define MAX_ORPHANS 256
static struct orphan {
	uint64_t id; /* 0: free */
	void *base;
	size_t size;
} orphans[MAX_ORPHANS];
static pthread_mutex_t views_mu = PTHREAD_MUTEX_INITIALIZER;

static void orphan_keep(void *arg, uint64_t id, void *base, size_t size)
{
	(void)arg;
	for (unsigned i = 0; i < MAX_ORPHANS; i++)
		if (!orphans[i].id) {
			orphans[i] = (struct orphan){ id, base, size };
			return;
		}
	ts_debug("feed: more than %u views outlive their feeds: one stays mapped until exit", MAX_ORPHANS);
}

static int orphan_release(uint64_t id)
{
	for (unsigned i = 0; id && i < MAX_ORPHANS; i++)
		if (orphans[i].id == id) {
			munmap(orphans[i].base, orphans[i].size);
			orphans[i].id = 0;
			return 0;
		}
	return -EBADF;
}
static struct ts_feed *feeds[MAX_FEEDS];
static struct feed_gpu *feed_gpus[MAX_FEEDS];

/*
 * What a reader's epoch trained (the samples it read or published: a bitmap
 * over the dataset), and, once it lost its place in the stream (evicted in
 * mid-epoch), what the stream had published of that epoch by then. At the
 * epoch's end, what was published then and not read was lost: the layer
 * makes it privately (tsshim_feed_lost). Made by tsshim_feed_epoch_begin();
 * used by the thread that iterates the feed.
 */
struct feed_track {
	uint64_t *trained;
	uint64_t *published;         /* a loss noted: the stream's epoch as published then */
	uint64_t loss_epoch;
	uint64_t sample0;            /* bytes per sample of position 0 (tsshim_feed_next) */
	int64_t *ids;                /* read_index of the read under way */
	size_t ids_cap;
	uint64_t ids_n;              /* samples of the last read with their ids (tsshim_feed_read_ids) */
};
static struct feed_track *feed_tracks[MAX_FEEDS];

static void track_free(int h)
{
	struct feed_track *t = feed_tracks[h];
	feed_tracks[h] = NULL;
	if (!t)
		return;
	free(t->trained);
	free(t->published);
	free(t->ids);
	free(t);
}

/* Samples [from, to) of the read under way (their ids in t->ids) were trained. */
static void track_read(struct ts_feed *f, struct feed_track *t, uint64_t from, uint64_t to)
{
	for (uint64_t j = from; j < to && j < t->ids_cap; j++)
		if (t->ids[j] >= 0 && (uint64_t)t->ids[j] < f->nindex)
			ts_bit_set(t->trained, (uint64_t)t->ids[j]);
}

/*
 * Point f->read_index at room for want0 bytes of samples, of which the first
 * `from` came in earlier calls of the same read (their ids are kept: a read
 * may come in several calls); the track, or NULL (nothing noted).
 */
static struct feed_track *track_room(int h, struct ts_feed *f, uint64_t want0, uint64_t from)
{
	struct feed_track *t = feed_tracks[h];
	if (!t || !t->sample0)
		return NULL;
	size_t n = (size_t)(want0 / t->sample0) + 1;
	if (n > t->ids_cap) {
		int64_t *m = realloc(t->ids, n * sizeof(*m));
		if (!m)
			return NULL;
		for (size_t j = t->ids_cap; j < n; j++)
			m[j] = -1;
		t->ids = m;
		t->ids_cap = n;
	}
	t->ids_n = 0;
	for (size_t j = from; j < n; j++)
		t->ids[j] = -1;
	f->read_index = t->ids;
	f->read_index_len = n;
	return t;
}
/*
 * Every feed session this process has been in (under feeds_lock), swept once
 * more at exit: the PyTorch layer closes its feeds in an atexit handler, and
 * a member still there then may be SIGKILLed before this process is gone.
 * Nobody would remove its feed after that; the sweep at exit does. Exact
 * mode opens a feed per epoch: with the table full, the oldest is swept now
 * and forgotten, so the newest are always the ones swept at exit.
 */
static char been_in[MAX_FEEDS][TS_NAME_MAX];
static unsigned nbeen_in;

static void remember_feed(const char *name)
{
	for (unsigned i = 0; i < nbeen_in; i++)
		if (strcmp(been_in[i], name) == 0)
			return;
	if (nbeen_in == MAX_FEEDS) {
		if (ts_feed_clean_stale(been_in[0], 0) > 0)
			ts_info("feed '%s' removed: its last members died after we left it", been_in[0]);
		memmove(been_in[0], been_in[1], sizeof(been_in[0]) * (MAX_FEEDS - 1));
		nbeen_in--;
	}
	snprintf(been_in[nbeen_in++], TS_NAME_MAX, "%s", name);
}
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
	struct ts_feed *f = calloc(1, sizeof(*f)); /* zeroed: with every feed slot taken, f->s.why is read unopened */
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
			remember_feed(name);
			atomic_store(&ts_feed_active, 1);
		}
		break;
	}
	pthread_mutex_unlock(&feeds_lock);
	ts_in_hook = prev;
	if (ret < 0) {
		if (ret == -EMFILE && !f->s.why[0])
			snprintf(open_why, sizeof(open_why), "%d feeds open in this process already", MAX_FEEDS);
		else
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

/* Forget the feed's ranges, then its GPU side (exiting: no CUDA call). */
static void gpu_close(int h, struct ts_feed *f, int exiting)
{
	struct feed_gpu *fg = feed_gpus[h];
	if (!fg)
		return;
	feed_gpus[h] = NULL;
	ts_stream_drop(f);
	ts_gpu_free(fg->gpu, exiting);
	free(fg);
}

/*
 * A forked child (a DataLoader worker, a program's fork that exits through
 * Python's atexit) has no feed of its own: feed_of() finds none for it. The
 * lock is made afresh all the same: a parent thread may have held it across
 * the fork, inside tsshim_feed_open's wait for a session's lock.
 */
void ts_feed_api_atfork_child(void)
{
	pthread_mutex_init(&feeds_lock, NULL);
	pthread_mutex_init(&views_mu, NULL);
}

TS_EXPORT void tsshim_feed_close(int h)
{
	int saved = errno, prev = ts_in_hook;
	struct ts_feed *f = NULL;
	if (atomic_load(&ts_is_fork_child))
		return; /* nothing of ours to close; never wait on the parent's lock */
	pthread_mutex_lock(&views_mu);
	pthread_mutex_lock(&feeds_lock);
	if (feed_of(h)) {
		f = feeds[h];
		feeds[h] = NULL;
	}
	pthread_mutex_unlock(&feeds_lock);
	if (f) {
		ts_in_hook = 1;
		ts_feed_detach_views(f, orphan_keep, NULL);
		ts_in_hook = prev;
	}
	pthread_mutex_unlock(&views_mu);
	if (f) {
		ts_in_hook = 1;
		gpu_close(h, f, 0);
		track_free(h);
		ts_feed_close(f);
		ts_in_hook = prev;
		free(f);
	}
	errno = saved;
}

/*
 * At exit: leave every feed, so a producer hands over at once; then sweep
 * every feed we were in, closed long ago or just now: if its members are all
 * dead by now, it is removed with its files (ts_feed_clean_stale).
 */
void ts_feed_api_fini(void)
{
	int saved = errno;
	if (atomic_load(&ts_is_fork_child))
		return; /* a worker: its job leaves and sweeps, it never does */
	ts_in_hook = 1;
	pthread_mutex_lock(&views_mu); /* a release in another thread does not meet a freed feed */
	pthread_mutex_lock(&feeds_lock);
	for (int i = 0; i < MAX_FEEDS; i++) {
		struct ts_feed *f = feeds[i];
		if (!f || f->s.me.pid != (uint32_t)getpid())
			continue;
		feeds[i] = NULL;
		gpu_close(i, f, 1);
		track_free(i);
		ts_feed_close(f);
		free(f);
	}
	for (unsigned i = 0; i < nbeen_in; i++)
		if (ts_feed_clean_stale(been_in[i], 0) > 0)
			ts_info("feed '%s' removed at exit: its last members died after we left it", been_in[i]);
	nbeen_in = 0;
	pthread_mutex_unlock(&feeds_lock);
	pthread_mutex_unlock(&views_mu);
	errno = saved;
}

TS_EXPORT int tsshim_feed_role(int h)
{
	return FEED_CALL(h, f, (int)ts_feed_role(f));
}

TS_EXPORT int tsshim_feed_timeout_ms(int h)
{
	return FEED_CALL(h, f, (int)(f->s.timeout_ns / 1000000ull));
}

/* How long to wait on a consumer that does not read before evicting it (ts_stall_ns). */
TS_EXPORT int tsshim_feed_stall_ms(int h)
{
	return FEED_CALL(h, f, (int)(ts_stall_for(f->s.timeout_ns) / 1000000ull));
}

TS_EXPORT int tsshim_feed_take_idle(int h)
{
	return FEED_CALL(h, f, ts_session_take_idle(&f->s, f->s.timeout_ns));
}

TS_EXPORT int tsshim_feed_set_idle(int h, int idle)
{
	return FEED_CALL(h, f, (ts_session_set_idle(&f->s, idle), 0));
}

TS_EXPORT int tsshim_feed_idle_while_away(int h, int away)
{
	return FEED_CALL(h, f, ts_session_idle_while_away(&f->s, away));
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
	int ret = FEED_CALL(h, f, ts_feed_publish(f, &b, ms_ns(timeout_ms)));
	struct feed_track *t = ret == 0 && index && h >= 0 && h < MAX_FEEDS ? feed_tracks[h] : NULL;
	for (uint64_t i = 0; t && i < nsamples; i++)
		ts_bit_set(t->trained, (uint64_t)index[i]); /* in [0, nindex): ts_feed_publish checked */
	return ret;
}

/*
 * A producer's batch nth (from 0) of its stream epoch, noted and not
 * published while nobody else is in the feed (ts_feed_made: 1 noted,
 * nothing to publish; 0 or 2: publish it). The first ring depth of an
 * epoch's batches are published even so (0): a job started a moment after
 * this one (jobs launched together) then finds the epoch's start in the
 * ring and reads it whole, as it does when it comes first. A job alone
 * publishes that many an epoch and no more. A batch noted is this epoch's as
 * a published one is (trained).
 */
TS_EXPORT int tsshim_feed_made(int h, uint32_t flags, uint64_t nsamples, const int64_t *index, uint64_t stream_epoch,
			       uint64_t nth)
{
	struct ts_feed_batch b = {
		.flags = flags, .nsamples = nsamples, .index = index, .stream_epoch = stream_epoch,
	};
	if (!index)
		return -EINVAL;
	int ret = FEED_CALL(h, f, nth < ts_ring_depth(f->s.seg) ? 0 : ts_feed_made(f, &b));
	struct feed_track *t = ret == 1 && h >= 0 && h < MAX_FEEDS ? feed_tracks[h] : NULL;
	for (uint64_t i = 0; t && i < nsamples; i++)
		ts_bit_set(t->trained, (uint64_t)index[i]); /* in [0, nindex): ts_feed_made checked */
	return ret;
}

TS_EXPORT int tsshim_feed_evict_laggards(int h)
{
	return FEED_CALL(h, f, ts_feed_evict_laggards(f));
}

TS_EXPORT int tsshim_feed_evict_away(int h, uint32_t min_ms)
{
	return FEED_CALL(h, f, ts_feed_evict_away(f, ms_ns(min_ms)));
}

TS_EXPORT int tsshim_feed_set_away(int h, int away)
{
	return FEED_CALL(h, f, (ts_feed_set_away(f, away), 0));
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

/* ---- what an epoch trained, and what it lost ------------------------------------------------ */

static int epoch_begin(int h, struct ts_feed *f)
{
	struct feed_track *t = feed_tracks[h];
	size_t words = ts_bitmap_words(f->nindex);
	if (!t) {
		if (!(t = calloc(1, sizeof(*t))) || !(t->trained = calloc(words, sizeof(*t->trained)))) {
			free(t);
			return -ENOMEM;
		}
		feed_tracks[h] = t;
	}
	memset(t->trained, 0, words * sizeof(*t->trained));
	free(t->published);
	t->published = NULL;
	return 0;
}

/* The layer's epoch begins on this feed: nothing trained in it yet, nothing lost. */
TS_EXPORT int tsshim_feed_epoch_begin(int h)
{
	return FEED_CALL(h, f, epoch_begin(h, f));
}

/* Was anything of this epoch read or published yet? */
static int any_trained(const struct ts_feed *f, const struct feed_track *t)
{
	for (uint64_t i = 0; i < ts_bitmap_words(f->nindex); i++)
		if (t->trained[i])
			return 1;
	return 0;
}

/*
 * Just re-attached at the head after an eviction: note what the stream has
 * published of the epoch we were reading (ours: that of the last sample we
 * read, or the stream's current one when we read nothing of it yet).
 *  1: it is under way; what its ledger says published is noted. Samples of
 *     it behind our new place that we never read are lost; those ahead we
 *     read as usual.
 *  2: it is over (ended, or the stream is past it): all of it was
 *     published, and what is ahead of us is not ours. Every sample is noted
 *     as published: the layer, which knows the epoch's samples, ends the
 *     epoch here and makes those it lacks.
 *  0: nothing noted (we attached at its start); -errno.
 */
static int note_loss(int h, struct ts_feed *f)
{
	struct feed_track *t = feed_tracks[h];
	uint64_t epoch, nrest, npub, words = ts_bitmap_words(f->nindex);
	int ended, ret;
	if (!t)
		return -ENOENT;
	if (f->at_epoch_start && !any_trained(f, t))
		return 0; /* we begin at its start: nothing of it is behind us */
	int64_t *rest = malloc(f->nindex * sizeof(*rest));
	uint64_t *pub = calloc(words, sizeof(*pub));
	if (!rest || !pub) {
		free(rest);
		free(pub);
		return -ENOMEM;
	}
	/* as a reader sees it, also when we were elected producer meanwhile (the others left) */
	if ((ret = ts_feed_stream_seen(f, &epoch, &ended, rest, &nrest, &npub)) == 0) {
		uint64_t ours = any_trained(f, t) ? f->read_epoch : epoch;
		memset(pub, 0xff, words * sizeof(*pub));
		if (!ended && epoch == ours && nrest <= f->nindex) {
			for (uint64_t i = 0; i < nrest; i++)
				if (rest[i] >= 0 && (uint64_t)rest[i] < f->nindex)
					ts_bit_clear(pub, (uint64_t)rest[i]);
			ret = 1;
		} else if (epoch > ours || (ended && epoch == ours)) {
			ret = 2;
		}
		if (ret && t->published && t->loss_epoch == ours) /* evicted again: both losses count */
			for (uint64_t i = 0; i < words; i++)
				pub[i] |= t->published[i];
		if (ret) {
			free(t->published);
			t->published = pub;
			t->loss_epoch = ours;
			pub = NULL;
		}
	}
	free(rest);
	free(pub);
	return ret;
}

TS_EXPORT int tsshim_feed_note_loss(int h)
{
	return FEED_CALL(h, f, note_loss(h, f));
}

/*
 * At the end of an epoch that lost its place: the samples published when it
 * did and not trained since, ascending, into out (cap entries); *n their
 * count (0 when no loss was noted). The loss is forgotten.
 */
static int lost(int h, struct ts_feed *f, int64_t *out, uint64_t cap, uint64_t *n)
{
	struct feed_track *t = feed_tracks[h];
	*n = 0;
	if (!t || !t->published)
		return 0;
	for (uint64_t i = 0; i < f->nindex; i++)
		if (ts_bit_get(t->published, i) && !ts_bit_get(t->trained, i)) {
			if (*n < cap)
				out[*n] = (int64_t)i;
			++*n;
		}
	free(t->published);
	t->published = NULL;
	return *n > cap ? -ENOSPC : 0;
}

TS_EXPORT int tsshim_feed_lost(int h, int64_t *out, uint64_t cap, uint64_t *n)
{
	if (!out || !n)
		return -EINVAL;
	return FEED_CALL(h, f, lost(h, f, out, cap, n));
}

TS_EXPORT int tsshim_feed_detach(int h)
{
	return FEED_CALL(h, f, ts_feed_detach(f));
}

/* Other jobs in this feed, alive: 0 when this one is alone in it. */
TS_EXPORT int tsshim_feed_others(int h)
{
	return FEED_CALL(h, f, (int)ts_session_others(&f->s));
}

TS_EXPORT int tsshim_feed_at_head(int h)
{
	return FEED_CALL(h, f, ts_feed_at_head(f));
}

TS_EXPORT int tsshim_feed_holds_producer(int h)
{
	return FEED_CALL(h, f, ts_feed_holds_producer(f));
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
	if (h >= 0 && h < MAX_FEEDS && feed_tracks[h])
		feed_tracks[h]->sample0 = info.sample_bytes[0];
	memcpy(sample_bytes, info.sample_bytes, sizeof(info.sample_bytes));
	memcpy(schema, info.schema, info.schema_len);
	*schema_len = info.schema_len;
	return 0;
}

/*
 * Wait for the batch at our place, like tsshim_feed_next, and tell the
 * dataset index of the sample there (-1: not known), without reading it: a
 * reader that made samples privately reads past those the stream repeats.
 */
TS_EXPORT int tsshim_feed_next_index(int h, uint32_t timeout_ms, int64_t *index)
{
	static __thread struct ts_feed_info info;
	if (!index)
		return -EINVAL;
	int ret = FEED_CALL(h, f, ts_feed_next(f, ms_ns(timeout_ms), &info));
	if (ret == 0)
		*index = info.next_index;
	return ret;
}

/* In a process with a GPU side, note where the batch being read comes from. */
static void ranges_on(int h, struct ts_feed *f, int fresh_batch)
{
	struct feed_gpu *fg = feed_gpus[h];
	if (!fg)
		return;
	if (fresh_batch)
		ts_batch_ranges_reset(&fg->rg);
	f->on_range = ts_batch_ranges_on_range;
	f->on_range_arg = &fg->rg;
}

static int read_noted(int h, struct ts_feed *f, uint32_t npos, const uint64_t *want, void *const *dst,
		      uint64_t *got, int *eoe, uint64_t timeout_ns)
{
	int fresh = 1; /* nothing read into this batch yet (a read may come in several calls) */
	for (uint32_t p = 0; p < npos && p < TS_MAX_POSITIONS; p++)
		fresh &= got[p] == 0;
	ranges_on(h, f, fresh);
	struct feed_track *t = feed_tracks[h];
	uint64_t from = t && t->sample0 ? got[0] / t->sample0 : 0;
	t = track_room(h, f, want[0], fresh ? 0 : from);
	int ret = ts_feed_read(f, npos, want, dst, got, eoe, timeout_ns);
	f->on_range = NULL;
	f->read_index = NULL;
	f->read_index_len = 0;
	if (t) {
		track_read(f, t, from, got[0] / t->sample0);
		t->ids_n = got[0] / t->sample0;
	}
	return ret;
}

static int read_view_noted(int h, struct ts_feed *f, uint32_t npos, const uint64_t *want, void **ptr, uint64_t *got,
			   int *eoe, uint64_t *id, uint64_t timeout_ns)
{
	ranges_on(h, f, 1);
	struct feed_track *t = track_room(h, f, want[0], 0);
	int ret = ts_feed_read_view(f, npos, want, ptr, got, eoe, id, timeout_ns);
	f->on_range = NULL;
	f->read_index = NULL;
	f->read_index_len = 0;
	if (t && ret == 0) {
		track_read(f, t, 0, got[0] / t->sample0);
		t->ids_n = got[0] / t->sample0;
	}
	return ret;
}

TS_EXPORT int tsshim_feed_read(int h, uint32_t npos, const uint64_t *want, void *const *dst, uint64_t *got, int *eoe,
			       uint32_t timeout_ms)
{
	if (!want || !got || !eoe)
		return -EINVAL;
	return FEED_CALL(h, f, read_noted(h, f, npos, want, dst, got, eoe, ms_ns(timeout_ms)));
}

TS_EXPORT int tsshim_feed_read_view(int h, uint32_t npos, const uint64_t *want, void **ptr, uint64_t *got, int *eoe,
				    uint64_t *id, uint32_t timeout_ms)
{
	if (!want || !ptr || !got || !eoe || !id)
		return -EINVAL;
	return FEED_CALL(h, f, read_view_noted(h, f, npos, want, ptr, got, eoe, id, ms_ns(timeout_ms)));
}

/*
 * The dataset index of each sample the last read (all its calls) or view
 * brought to position 0, -1 where the producer gave none: the first cap of
 * them into out, their count in *n. The layer gathers by them (a sample the
 * epoch lacks, from the stream's next epoch). -ENOENT: no epoch begun, or
 * no read since tsshim_feed_next told the sample size.
 */
static int read_ids(int h, int64_t *out, uint64_t cap, uint64_t *n)
{
	const struct feed_track *t = feed_tracks[h];
	*n = 0;
	if (!t || !t->sample0 || !t->ids)
		return -ENOENT;
	*n = t->ids_n < t->ids_cap ? t->ids_n : t->ids_cap;
	memcpy(out, t->ids, (size_t)(*n < cap ? *n : cap) * sizeof(*out));
	return *n > cap ? -ENOSPC : 0;
}

TS_EXPORT int tsshim_feed_read_ids(int h, int64_t *out, uint64_t cap, uint64_t *n)
{
	if (!out || !n)
		return -EINVAL;
	return FEED_CALL(h, f, ((void)f, read_ids(h, out, cap, n)));
}

TS_EXPORT int tsshim_feed_release_view(int h, uint64_t id)
{
	int saved = errno, prev = ts_in_hook, ret = 0;
	void *base;
	size_t size;
	ts_in_hook = 1;
	pthread_mutex_lock(&views_mu); /* the feed is not freed under us (see orphans) */
	pthread_mutex_lock(&feeds_lock);
	struct ts_feed *f = feed_of(h);
	pthread_mutex_unlock(&feeds_lock);
	if (f && ts_feed_view_range(f, id, &base, &size) == 0) {
		/* ranges in the view's mapping go before the mapping does (its addresses may be reused) */
		if (atomic_load_explicit(&ts_stream_nspans, memory_order_relaxed))
			ts_stream_drop_within(base, size);
		ts_feed_release_view(f, id);
	} else if (!atomic_load(&ts_is_fork_child)) {
		ret = orphan_release(id); /* its feed was closed since */
	}
	pthread_mutex_unlock(&views_mu);
	ts_in_hook = prev;
	errno = saved;
	return ret;
}

/* ---- the GPU side ------------------------------------------------------------------------ */

static int gpu_open(int h, struct ts_feed *f)
{
	struct tsshim_cuda_stats cs = {0};
	if (feed_gpus[h])
		return 1;
	/*
	 * A job that trains on the GPU has uploaded its model by now; one that
	 * only asked whether CUDA is there (which loads the driver) has not,
	 * and pays nothing for batches it never uploads.
	 */
	if (!ts_gpu_driver_ready() || tsshim_cuda_stats(&cs, sizeof(cs)) || !cs.h2d_copies)
		return 0;
	struct feed_gpu *fg = calloc(1, sizeof(*fg));
	if (!fg || !(fg->gpu = ts_gpu_new(f))) {
		free(fg);
		return -ENOMEM;
	}
	feed_gpus[h] = fg;
	return 1;
}

/*
 * 1 when the batches of this feed can be served on the GPU here: the process
 * has loaded the CUDA driver and copied something to a device (a CPU-only
 * job never pays for what follows); 0 when not (yet: asking again later is
 * cheap).
 */
TS_EXPORT int tsshim_feed_gpu(int h)
{
	return FEED_CALL(h, f, gpu_open(h, f));
}

static int args_ok(uint32_t npos, void *const *ptr, const uint64_t *len)
{
	if (!ptr || !len || npos < 1 || npos > TS_MAX_POSITIONS)
		return 0;
	for (uint32_t p = 0; p < npos; p++)
		if (!ptr[p] || !len[p])
			return 0;
	return 1;
}

static int keep_published(int h, struct ts_feed *f, uint32_t npos, void *const *ptr, const uint64_t *len)
{
	if (!feed_gpus[h])
		return -ENODEV;
	/* w.seq is the batch last published, unless a claim is open (a fence) */
	if (ts_feed_role(f) != TS_ROLE_PRODUCER || !f->published || f->w.claimed)
		return -EPERM;
	/* Alone in the feed: nobody to serve, so no ring buffer, no device memory
	 * and no copy into it (a job alone held depth x batch of its device until
	 * it exited, and its own cudaMalloc could fail where it did not without us) */
	if (ts_session_others(&f->s) == 0)
		return 0;
	/* the program may change its batch before uploading it: the upload proves it did not */
	ts_stream_add_published(f, feed_gpus[h]->gpu, f->w.seq, npos, ptr, len, TS_CHECK_HASH);
	ts_gpu_keep_announce(feed_gpus[h]->gpu, f->w.seq, npos, len);
	return 0;
}

/*
 * A successor reads back the batches it makes, like any consumer (the Python
 * layer's successor): a read that is exactly the batch it published last,
 * each position whole, is that batch as published. Its upload then fills
 * the GPU ring as a producer's does; nobody else would, and the other
 * consumers' uploads of the rest of the epoch would all go from the host.
 */
static int read_is_own_batch(struct ts_feed *f, const struct ts_batch_ranges *rg, uint32_t npos, const uint64_t *len)
{
	/* w.seq is the batch last published, unless a claim is open (a fence) */
	if (ts_feed_role(f) != TS_ROLE_PRODUCER || !f->published || f->w.claimed || rg->overflow)
		return 0;
	for (uint32_t p = 0; p < npos; p++) {
		const struct ts_gpu_piece *q = &rg->r[p][0];
		if (rg->n[p] != 1 || q->seq != f->w.seq || q->writer != f->s.self || q->off || q->at ||
		    q->len != len[p] || q->slot_len != len[p])
			return 0;
	}
	return 1;
}

static int keep_read(int h, struct ts_feed *f, uint32_t npos, void *const *ptr, const uint64_t *len, int view)
{
	if (!feed_gpus[h])
		return -ENODEV;
	if (read_is_own_batch(f, &feed_gpus[h]->rg, npos, len) && ts_session_others(&f->s)) {
		ts_stream_add_published(f, feed_gpus[h]->gpu, f->w.seq, npos, ptr, len,
					view ? TS_CHECK_UNWRITTEN : TS_CHECK_HASH);
		ts_gpu_keep_announce(feed_gpus[h]->gpu, f->w.seq, npos, len);
		return 0;
	}
	/* a view is a private mapping of the slot file: its pages tell whether it was written */
	ts_stream_add_read(f, feed_gpus[h]->gpu, npos, ptr, len, &feed_gpus[h]->rg,
			   view ? TS_CHECK_UNWRITTEN : TS_CHECK_HASH);
	return 0;
}

/*
 * Producer: the batch just published is yielded from ptr[p] (len[p] bytes,
 * as published). Consumer: the batch just read (by tsshim_feed_read, or by
 * tsshim_feed_read_view when view) is yielded from ptr[p], len[p] bytes.
 * Either way its upload is kept in, or served from, the GPU ring if its
 * bytes are still the stream's when it is uploaded. -ENODEV: no GPU side
 * (tsshim_feed_gpu).
 */
TS_EXPORT int tsshim_feed_gpu_published(int h, uint32_t npos, void *const *ptr, const uint64_t *len)
{
	if (!args_ok(npos, ptr, len))
		return -EINVAL;
	return FEED_CALL(h, f, keep_published(h, f, npos, ptr, len));
}

TS_EXPORT int tsshim_feed_gpu_read(int h, uint32_t npos, void *const *ptr, const uint64_t *len, int view)
{
	if (!args_ok(npos, ptr, len))
		return -EINVAL;
	return FEED_CALL(h, f, keep_read(h, f, npos, ptr, len, view));
}

TS_EXPORT int tsshim_feed_served(int h, uint64_t batches, uint64_t samples)
{
	return FEED_CALL(h, f, (atomic_fetch_add(&f->s.seg->counters.batches_shared, batches),
				atomic_fetch_add(&f->s.seg->counters.samples_served, samples), 0));
}
