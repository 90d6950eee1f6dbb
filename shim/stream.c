/* SPDX-License-Identifier: MIT */
/*
 * tsshim_batch(): a native trainer's loader batches shared through a feed
 * (core/feed.h), and the registry of stream ranges the CUDA hooks consult.
 *
 * Per loader and process: one feed (its own session "<session>.<loader>").
 * The producer publishes each batch as it is; a consumer reads the next
 * `nsamples` samples of the stream, whatever batch they were published in
 * and across the stream's epoch marks (it is a reader of the stream: its
 * own epochs line up with the stream's when it starts at an epoch start and
 * its dataset has the same length, as jobs sharing a loader do), and copies
 * them into the caller's buffers. Around the producer:
 *  - it finished or died: the session elects a consumer, which publishes
 *    its own batches from then on (what it had half read is dropped);
 *  - it stopped publishing for TSSHIM_TIMEOUT_MS after an epoch's last
 *    batch (a validation pass, say): a waiting consumer takes over;
 *  - it is alive but publishes nothing for twice the stall time: the
 *    consumer gives up, with one notice, and trains on its own batches.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "feed.h"
#include "hash.h"
#include "log.h"
#include "shim.h"
#include "stream.h"
#include "tsshim.h"

#define TS_EXPORT __attribute__((visibility("default")))
#define MAX_LOADERS 8
#define MAX_SPANS   (MAX_LOADERS * (int)TS_MAX_POSITIONS)
#define MAX_RANGES  64           /* ranges one consumer batch may come from, per position */
#define SLICE_NS    100000000ull /* one wait: 100 ms */

struct loader {
	char key[TS_NAME_MAX];       /* what the program called it (hashed when long) */
	struct ts_feed *f;
	struct ts_gpu *gpu;
	int off;                     /* sharing given up here (one notice given) */
	/* producer */
	int have_epoch, idle, last_was_end, published_any;
	uint64_t epoch;
	/* consumer */
	void *stage[TS_MAX_POSITIONS];
	size_t stage_cap[TS_MAX_POSITIONS];
	unsigned nranges[TS_MAX_POSITIONS];
	int ranges_overflow;
	struct ts_gpu_piece ranges[TS_MAX_POSITIONS][MAX_RANGES];
	struct ts_feed_info info;
};

struct span {
	uintptr_t lo, hi;
	uint64_t left;                       /* bytes not uploaded yet: at 0 the range is forgotten */
	struct loader *L;
	enum ts_hit_kind kind;
	uint32_t pos, npos;
	uint64_t seq;                        /* producer */
	uint64_t len[TS_MAX_POSITIONS];      /* producer: the batch's bytes per position */
	unsigned npieces;                    /* consumer: where its bytes came from */
	const struct ts_gpu_piece *pieces;   /* (the loader's ranges of this position) */
};

_Atomic int ts_stream_nspans;
/* mu: loaders, held across a whole tsshim_batch (which may wait for data);
 * spans_mu: the registry, held for a lookup's few instructions, so that
 * copies on other threads never wait for a batch. */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t spans_mu = PTHREAD_MUTEX_INITIALIZER;
static struct loader *loaders[MAX_LOADERS];
static struct span spans[MAX_SPANS];
static int nspans;

/* ---- the registry ------------------------------------------------------------------------ */

static void spans_drop(const struct loader *L)
{
	pthread_mutex_lock(&spans_mu);
	int k = 0;
	for (int i = 0; i < nspans; i++)
		if (spans[i].L != L)
			spans[k++] = spans[i];
	nspans = k;
	atomic_store_explicit(&ts_stream_nspans, nspans, memory_order_release);
	pthread_mutex_unlock(&spans_mu);
}

static void span_add(const struct span *s)
{
	pthread_mutex_lock(&spans_mu);
	if (nspans < MAX_SPANS && s->hi > s->lo) {
		spans[nspans] = *s;
		spans[nspans++].left = s->hi - s->lo;
	}
	atomic_store_explicit(&ts_stream_nspans, nspans, memory_order_release);
	pthread_mutex_unlock(&spans_mu);
}

/* The pieces of a consumer span that make up its bytes [off, off + n), relative to off. */
static int cut_pieces(const struct span *s, uint64_t off, uint64_t n, struct ts_stream_hit *hit)
{
	uint64_t covered = 0;
	hit->npieces = 0;
	for (unsigned i = 0; i < s->npieces && n; i++) {
		const struct ts_gpu_piece *p = &s->pieces[i];
		if (p->at + p->len <= off || p->at >= off + n)
			continue;
		uint64_t from = off > p->at ? off - p->at : 0;
		uint64_t to = off + n < p->at + p->len ? off + n - p->at : p->len;
		if (hit->npieces == TS_HIT_PIECES)
			return -1;
		struct ts_gpu_piece *q = &hit->piece[hit->npieces++];
		*q = *p;
		q->off = p->off + from;
		q->len = to - from;
		q->at = p->at + from - off;
		covered += q->len;
	}
	return covered == n ? 0 : -1;
}

enum ts_hit_kind ts_stream_find(const void *src, size_t n, struct ts_stream_hit *hit)
{
	uintptr_t a = (uintptr_t)src;
	hit->kind = TS_HIT_NONE;
	if (!atomic_load_explicit(&ts_stream_nspans, memory_order_acquire) || n == 0 || a + n < a)
		return TS_HIT_NONE;
	pthread_mutex_lock(&spans_mu);
	for (int i = 0; i < nspans; i++) {
		const struct span *s = &spans[i];
		if (a < s->lo || a + n > s->hi || !s->L->gpu)
			continue;
		hit->gpu = s->L->gpu;
		if (s->kind == TS_HIT_PRODUCER) {
			hit->seq = s->seq;
			hit->npos = s->npos;
			hit->pos = s->pos;
			memcpy(hit->len, s->len, sizeof(hit->len));
			hit->off = a - s->lo;
			hit->n = n;
			hit->kind = TS_HIT_PRODUCER;
		} else if (cut_pieces(s, a - s->lo, n, hit) == 0) {
			hit->kind = TS_HIT_CONSUMER;
		}
		/*
		 * A range is uploaded once: the same addresses uploaded again
		 * (a validation batch in a reused buffer, say) are not the
		 * stream's any more, whatever the program does before the
		 * loader's next batch.
		 */
		if (n >= spans[i].left) {
			spans[i] = spans[--nspans];
			atomic_store_explicit(&ts_stream_nspans, nspans, memory_order_release);
		} else {
			spans[i].left -= n;
		}
		break;
	}
	pthread_mutex_unlock(&spans_mu);
	return hit->kind;
}

/* ---- loaders ------------------------------------------------------------------------------- */

static void loader_off(struct loader *L, const char *why)
{
	if (!L->off)
		ts_warn("loader '%s': batches are not shared in this job any more: %s", L->key, why);
	L->off = 1;
	if (L->f && L->f->attached)
		ts_feed_detach(L->f);
}

static struct loader *loader_get(const char *key, uint64_t nindex)
{
	char k[TS_NAME_MAX], name[TS_NAME_MAX];
	size_t room = TS_NAME_MAX - 2 - strlen(ts_cfg.session);
	if (strlen(key) <= 40 && strlen(key) < room)
		snprintf(k, sizeof(k), "%s", key);
	else
		snprintf(k, sizeof(k), "h%016llx", (unsigned long long)ts_hash64(key, strlen(key), 0));
	int i;
	for (i = 0; i < MAX_LOADERS && loaders[i]; i++)
		if (!strcmp(loaders[i]->key, k))
			return loaders[i];
	if (i == MAX_LOADERS)
		return NULL;
	struct loader *L = calloc(1, sizeof(*L));
	if (!L)
		return NULL;
	snprintf(L->key, sizeof(L->key), "%s", k);
	loaders[i] = L;
	snprintf(name, sizeof(name), "%s.%s", ts_cfg.session, k);
	struct ts_session_params p = {.depth = ts_cfg.depth, .timeout_ms = ts_cfg.timeout_ms, .label = key};
	if (!ts_session_name_valid(name)) {
		loader_off(L, "its name does not make a session name");
		return L;
	}
	int ret = (L->f = malloc(sizeof(*L->f))) ? ts_feed_open(L->f, name, &p, nindex) : -ENOMEM;
	if (ret) {
		free(L->f);
		L->f = NULL;
		loader_off(L, strerror(-ret));
		return L;
	}
	L->gpu = ts_gpu_new(L->f);
	ts_info("loader '%s': shared through feed '%s'", key, name);
	return L;
}

/* Called by ts_feed_read for every range it copied into the stage. */
static void on_range(void *arg, uint32_t p, const struct ts_range *r, uint64_t at)
{
	struct loader *L = arg;
	if (p >= TS_MAX_POSITIONS)
		return;
	if (L->nranges[p] == MAX_RANGES) {
		L->ranges_overflow = 1;
		return;
	}
	struct ts_gpu_piece *q = &L->ranges[p][L->nranges[p]++];
	q->seq = r->seq;
	q->writer = (int)r->writer;
	q->pos = p;
	q->off = r->off;
	q->len = r->len;
	q->at = at;
}

/* ---- producer ------------------------------------------------------------------------------ */

static int produce(struct loader *L, unsigned npos, void *const *data, const size_t *bytes, size_t nsamples,
		   const int64_t *ids, unsigned flags, struct tsshim_where *where)
{
	struct ts_feed *f = L->f;
	uint64_t len[TS_MAX_POSITIONS];
	char schema[64 + 24 * TS_MAX_POSITIONS];
	int slen = snprintf(schema, sizeof(schema), "tsshim_batch/1 npos=%u sample_bytes=", npos);

	if (f->attached)
		ts_feed_detach(f);
	if (L->idle) {
		ts_session_set_idle(&f->s, 0);
		L->idle = 0;
	}
	if (!L->have_epoch) {
		uint64_t e, nrest, npub;
		int ended;
		int ret = ts_feed_stream_state(f, &e, &ended, NULL, &nrest, &npub, SLICE_NS);
		if (ret)
			return ret == -EPERM ? -EAGAIN : TSSHIM_BATCH_OWN;
		L->epoch = ended ? e + 1 : e;
		L->have_epoch = 1;
	} else if ((flags & TSSHIM_BATCH_FIRST) && L->published_any && !L->last_was_end) {
		L->epoch++; /* the job left its last epoch early: a new one starts */
	}
	for (unsigned p = 0; p < npos; p++) {
		len[p] = bytes[p];
		slen += snprintf(schema + slen, sizeof(schema) - (size_t)slen, p ? ",%llu" : "%llu",
				 (unsigned long long)(bytes[p] / nsamples));
	}
	struct ts_feed_batch b = {
		.npos = npos, .flags = (flags & TSSHIM_BATCH_LAST) ? TS_BATCH_END_OF_EPOCH : 0, .nsamples = nsamples,
		.len = len, .src = (const void *const *)data, .index = ids, .stream_epoch = L->epoch,
		.schema = schema, .schema_len = (uint32_t)slen,
	};
	uint64_t stall = ts_stall_ns(f->s.seg), waited = 0;
	int ret;
	while ((ret = ts_feed_publish(f, &b, SLICE_NS)) == -ETIMEDOUT) {
		/* a consumer holds the slot: evict those that stopped reading */
		if ((waited += SLICE_NS) >= stall && ts_feed_evict_laggards(f) < 0)
			break;
		if (waited >= 2 * stall)
			break;
	}
	if (ret == -EPERM)
		return -EAGAIN; /* replaced as producer meanwhile: consume instead */
	if (ret) {
		ts_info("loader '%s': publishing a batch failed (%s): this one is not shared", L->key, strerror(-ret));
		return TSSHIM_BATCH_OWN;
	}
	L->published_any = 1;
	L->last_was_end = (flags & TSSHIM_BATCH_LAST) != 0;
	for (unsigned p = 0; p < npos; p++) {
		struct span s = {.lo = (uintptr_t)data[p], .hi = (uintptr_t)data[p] + bytes[p], .L = L,
				 .kind = TS_HIT_PRODUCER, .pos = p, .npos = npos, .seq = f->w.seq};
		memcpy(s.len, len, npos * sizeof(*len));
		span_add(&s);
	}
	if (where)
		*where = (struct tsshim_where){.seq = f->w.seq, .sample = 0};
	if (flags & TSSHIM_BATCH_LAST) {
		L->epoch++;
		ts_session_set_idle(&f->s, 1); /* until the next epoch: a waiting consumer may take over */
		L->idle = 1;
	}
	return TSSHIM_BATCH_PUBLISHED;
}

/* ---- consumer ------------------------------------------------------------------------------ */

enum { WAIT_ON = 0, WAIT_PRODUCE = 1, WAIT_GIVE_UP = -1 };

/* One more slice waited for data: go on, become producer, or give up. */
static int waited_one(struct loader *L, uint64_t *waited)
{
	struct ts_feed *f = L->f;
	*waited += SLICE_NS;
	if (ts_feed_role(f) == TS_ROLE_PRODUCER)
		return WAIT_PRODUCE;
	uint64_t timeout = (uint64_t)f->s.seg->st.timeout_ms * 1000000ull;
	if (*waited >= timeout && ts_session_take_idle(&f->s, timeout) == 1)
		return WAIT_PRODUCE;
	if (*waited >= 2 * ts_stall_ns(f->s.seg)) {
		loader_off(L, "the producer publishes nothing");
		return WAIT_GIVE_UP;
	}
	return WAIT_ON;
}

static int stage_for(struct loader *L, unsigned npos, const size_t *bytes)
{
	for (unsigned p = 0; p < npos; p++) {
		if (L->stage_cap[p] >= bytes[p])
			continue;
		void *m = realloc(L->stage[p], bytes[p]);
		if (!m)
			return -ENOMEM;
		L->stage[p] = m;
		L->stage_cap[p] = bytes[p];
	}
	return 0;
}

/* Wait for the next slot and check that its samples have our sizes. */
static int next_slot(struct loader *L, unsigned npos, const size_t *bytes, size_t nsamples, uint64_t *waited)
{
	for (;;) {
		int ret = ts_feed_next(L->f, SLICE_NS, &L->info);
		if (ret == -ETIMEDOUT) {
			int w = waited_one(L, waited);
			if (w)
				return w == WAIT_PRODUCE ? -EAGAIN : -ETIMEDOUT;
			continue;
		}
		if (ret)
			return ret;
		if (L->info.npos != npos)
			return -EPROTO;
		for (unsigned p = 0; p < npos; p++)
			if (L->info.sample_bytes[p] * nsamples != bytes[p])
				return -EPROTO;
		return 0;
	}
}

/* Read the next nsamples of the stream into the stage. -EAGAIN: we are producer now. */
static int read_batch(struct loader *L, unsigned npos, const size_t *bytes, size_t nsamples,
		      struct tsshim_where *where)
{
	struct ts_feed *f = L->f;
	uint64_t want[TS_MAX_POSITIONS], got[TS_MAX_POSITIONS] = {0}, waited = 0;
	int ret = next_slot(L, npos, bytes, nsamples, &waited), eoe;
	if (ret)
		return ret;
	where->seq = f->r.seq;
	where->sample = L->info.sample_bytes[0] ? f->r.off[0] / L->info.sample_bytes[0] : 0;
	for (unsigned p = 0; p < npos; p++)
		want[p] = bytes[p];
	memset(L->nranges, 0, sizeof(L->nranges));
	L->ranges_overflow = 0;
	while (got[0] < want[0]) {
		ret = ts_feed_read(f, npos, want, L->stage, got, &eoe, SLICE_NS);
		if (ret == 0)
			continue; /* complete, or an epoch mark: read on into the next epoch */
		if (ret != -ETIMEDOUT)
			return ret;
		int w = waited_one(L, &waited);
		if (w)
			return w == WAIT_PRODUCE ? -EAGAIN : -ETIMEDOUT;
	}
	return 0;
}

static int consume(struct loader *L, unsigned npos, void *const *data, const size_t *bytes, size_t nsamples,
		   unsigned flags, struct tsshim_where *where)
{
	struct ts_feed *f = L->f;
	struct tsshim_where at;
	int ret;
	if (stage_for(L, npos, bytes))
		return TSSHIM_BATCH_OWN;
	for (int attempt = 0; attempt < 3; attempt++) {
		if (!f->attached && (ret = ts_feed_attach(f, (flags & TSSHIM_BATCH_FIRST) != 0)))
			return ret == -EPERM ? -EAGAIN : TSSHIM_BATCH_OWN;
		f->on_range = on_range;
		f->on_range_arg = L;
		ret = read_batch(L, npos, bytes, nsamples, &at);
		f->on_range = NULL;
		if (ret != -ESTALE && ret != -ENOTCONN)
			break;
		/* evicted (we were too slow): on from the head */
		ts_info("loader '%s': evicted from the stream; reading on from its head", L->key);
	}
	if (ret == -EAGAIN) {
		ts_feed_detach(f);
		return -EAGAIN; /* producer now */
	}
	if (ret) {
		if (ret != -ETIMEDOUT)
			loader_off(L, ret == -EPROTO ? "the stream's samples differ from this job's"
						   : strerror(-ret));
		return TSSHIM_BATCH_OWN;
	}
	for (unsigned p = 0; p < npos; p++) {
		memcpy(data[p], L->stage[p], bytes[p]);
		struct span s = {.lo = (uintptr_t)data[p], .hi = (uintptr_t)data[p] + bytes[p], .L = L,
				 .kind = TS_HIT_CONSUMER, .pos = p, .npos = npos,
				 .npieces = L->ranges_overflow ? 0 : L->nranges[p], .pieces = L->ranges[p]};
		span_add(&s);
	}
	atomic_fetch_add_explicit(&f->s.seg->counters.batches_shared, 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&f->s.seg->counters.samples_served, nsamples, memory_order_relaxed);
	if (where)
		*where = at;
	return TSSHIM_BATCH_SERVED;
}

/* ---- the API --------------------------------------------------------------------------------- */

static int args_valid(const char *loader, unsigned npos, void *const *data, const size_t *bytes, size_t nsamples,
		      const int64_t *ids, uint64_t nindex)
{
	if (!loader || !*loader || npos < 1 || npos > TS_MAX_POSITIONS || !data || !bytes || nsamples == 0 ||
	    nsamples > TS_FEED_MAX_SAMPLES || !ids || nindex == 0 || nindex > TS_FEED_MAX_INDEX)
		return 0;
	for (unsigned p = 0; p < npos; p++)
		if (!data[p] || bytes[p] == 0 || bytes[p] % nsamples)
			return 0;
	for (size_t i = 0; i < nsamples; i++)
		if (ids[i] < 0 || (uint64_t)ids[i] >= nindex)
			return 0;
	return 1;
}

TS_EXPORT int tsshim_batch(const char *loader, unsigned npos, void *const *data, const size_t *bytes,
			   size_t nsamples, const int64_t *ids, uint64_t nindex, unsigned flags,
			   struct tsshim_where *where)
{
	if (!ts_shim_ready() || atomic_load(&ts_is_fork_child))
		return TSSHIM_BATCH_OWN;
	if (ts_cfg.mode != TS_MODE_SOCKET && ts_cfg.mode != TS_MODE_AUTO)
		return TSSHIM_BATCH_OWN;
	if (!args_valid(loader, npos, data, bytes, nsamples, ids, nindex))
		return -EINVAL;
	int saved = errno, prev = ts_in_hook, ret = TSSHIM_BATCH_OWN;
	ts_in_hook = 1;
	pthread_mutex_lock(&mu);
	struct loader *L = loader_get(loader, nindex);
	if (L && !L->off && L->f) {
		spans_drop(L);
		ts_gpu_keep_end(L->gpu);
		/* a role may change once: a consumer that becomes producer publishes its own batch */
		for (int turn = 0; turn < 2; turn++) {
			if (ts_feed_role(L->f) == TS_ROLE_PRODUCER)
				ret = produce(L, npos, data, bytes, nsamples, ids, flags, where);
			else
				ret = consume(L, npos, data, bytes, nsamples, flags, where);
			if (ret != -EAGAIN)
				break;
			ret = TSSHIM_BATCH_OWN;
		}
	}
	pthread_mutex_unlock(&mu);
	ts_in_hook = prev;
	errno = saved;
	return ret;
}

void ts_stream_fini(void)
{
	int saved = errno;
	if (atomic_load(&ts_is_fork_child))
		return;
	ts_in_hook = 1;
	pthread_mutex_lock(&mu);
	pthread_mutex_lock(&spans_mu);
	nspans = 0;
	atomic_store(&ts_stream_nspans, 0);
	pthread_mutex_unlock(&spans_mu);
	for (int i = 0; i < MAX_LOADERS; i++) {
		struct loader *L = loaders[i];
		if (!L || !L->f || L->f->s.me.pid != (uint32_t)getpid())
			continue;
		char name[TS_NAME_MAX];
		snprintf(name, sizeof(name), "%s", L->f->s.name);
		ts_gpu_free(L->gpu, 1);
		L->gpu = NULL;
		ts_feed_close(L->f);
		free(L->f);
		L->f = NULL;
		/* a member that died (a killed producer) keeps its slot: if only
		 * such are left, nobody else will remove the feed */
		ts_feed_clean_stale(name);
	}
	pthread_mutex_unlock(&mu);
	errno = saved;
}
