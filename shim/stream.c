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

#include "bitmap.h"
#include "feed.h"
#include "hash.h"
#include "log.h"
#include "native.h"
#include "prim.h"
#include "shim.h"
#include "stream.h"
#include "tsshim.h"

#define TS_EXPORT __attribute__((visibility("default")))
#define MAX_LOADERS 8
#define MAX_SPANS   192          /* host ranges registered at once, all loaders and feeds */
#define SLICE_NS    100000000ull /* one wait: 100 ms */
#define TERM_OURS   UINT64_MAX

struct loader {
	char key[TS_NAME_MAX];       /* what the program called it (hashed when long) */
	struct ts_feed *f;
	struct ts_gpu *gpu;
	int off;                     /* sharing given up here (one notice given) */
	/* producer */
	int have_epoch, idle, last_was_end, published_any;
	uint64_t epoch;
	/* consumer */
	int own_epoch;               /* joined in mid-epoch: this epoch of the job is its own */
	int had_own_epoch;           /* once only: after it, the job waits for the next epoch */
	void *stage[TS_MAX_POSITIONS];
	size_t stage_cap[TS_MAX_POSITIONS];
	int64_t *ids;                /* the dataset index of each sample in the stage */
	size_t ids_cap;
	/*
	 * The job's epoch (from its TSSHIM_BATCH_FIRST call): the samples it
	 * was served (a bitmap over the dataset), and whether it passes over
	 * samples it was served (`gather`: it lost its place in the stream, or
	 * another producer took over, in mid-epoch; `passed`: how many).
	 */
	int epoch_known;
	int gather;
	uint64_t *served;
	uint64_t nserved, passed;
	/* the producer term (writer and election epoch, +1) of the last range read, or
	 * TERM_OURS after we published; whether it changed */
	uint64_t term;
	int term_changed;
	/*
	 * Epochs longer than the stream's. `sep`: the stream epoch this epoch
	 * of the job reads; `took_over`: another producer's batches came in
	 * it. Begun at a stream epoch's start, undisturbed (no eviction, no
	 * takeover), it read on past that epoch's end (`crossed`): its
	 * producer leaves its epochs early, or drops their last batch. The
	 * job's epochs are then its own (`own_epochs`) while that producer
	 * (`short_producer`, the session's producer word) produces.
	 */
	int sep_valid, took_over, crossed, last_crossed, own_epochs;
	uint64_t sep, short_producer;
	struct ts_batch_ranges rg;
	struct ts_feed_info info;
};

struct span {
	uintptr_t lo, hi;
	uint64_t left;                       /* bytes not uploaded yet: at 0 the range is forgotten */
	uint64_t serial;                     /* registration order: the oldest goes when full */
	const void *owner;                   /* a loader, or a feed of the Python layer */
	struct ts_gpu *gpu;
	enum ts_hit_kind kind;
	enum ts_span_check check;
	uint64_t hash;                       /* TS_CHECK_HASH: of the bytes when registered */
	uint32_t pos, npos;
	uint64_t seq;                        /* producer */
	uint64_t len[TS_MAX_POSITIONS];      /* producer: the batch's bytes per position */
	unsigned npieces;                    /* consumer: where its bytes came from */
	struct ts_gpu_piece pieces[TS_HIT_PIECES];
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
static uint64_t span_serial;

/* ---- where a consumer batch came from ------------------------------------------------ */

void ts_batch_ranges_reset(struct ts_batch_ranges *rg)
{
	memset(rg->n, 0, sizeof(rg->n));
	rg->overflow = 0;
}

/* feed->on_range: one more range of position p went to offset `at` of the batch. */
void ts_batch_ranges_on_range(void *arg, uint32_t p, const struct ts_range *r, uint64_t at)
{
	struct ts_batch_ranges *rg = arg;
	if (p >= TS_MAX_POSITIONS)
		return;
	if (rg->n[p] == TS_HIT_PIECES) {
		rg->overflow = 1;
		return;
	}
	struct ts_gpu_piece *q = &rg->r[p][rg->n[p]++];
	q->seq = r->seq;
	q->writer = (int)r->writer;
	q->pos = p;
	q->off = r->off;
	q->len = r->len;
	q->at = at;
	q->slot_len = r->slot_len;
}

/* ---- the registry ------------------------------------------------------------------------ */

static void span_remove(int i)
{
	spans[i] = spans[--nspans];
}

static void spans_published(void)
{
	atomic_store_explicit(&ts_stream_nspans, nspans, memory_order_release);
}

void ts_stream_drop(const void *owner)
{
	pthread_mutex_lock(&spans_mu);
	for (int i = nspans - 1; i >= 0; i--)
		if (spans[i].owner == owner)
			span_remove(i);
	spans_published();
	pthread_mutex_unlock(&spans_mu);
}

void ts_stream_drop_within(const void *base, size_t size)
{
	uintptr_t lo = (uintptr_t)base, hi = lo + size;
	pthread_mutex_lock(&spans_mu);
	for (int i = nspans - 1; i >= 0; i--)
		if (spans[i].lo < hi && spans[i].hi > lo)
			span_remove(i);
	spans_published();
	pthread_mutex_unlock(&spans_mu);
}

/*
 * A new range replaces any it overlaps (memory freed and reused for a later
 * batch); when the registry is full, the oldest range is forgotten (its
 * upload is then simply done from the host).
 */
static void span_add(struct span *s)
{
	if (s->hi <= s->lo)
		return;
	s->left = s->hi - s->lo;
	pthread_mutex_lock(&spans_mu);
	s->serial = ++span_serial;
	for (int i = nspans - 1; i >= 0; i--)
		if (spans[i].lo < s->hi && spans[i].hi > s->lo)
			span_remove(i);
	if (nspans == MAX_SPANS) {
		int old = 0;
		for (int i = 1; i < nspans; i++)
			if (spans[i].serial < spans[old].serial)
				old = i;
		span_remove(old);
	}
	spans[nspans++] = *s;
	spans_published();
	pthread_mutex_unlock(&spans_mu);
}

static void span_fill(struct span *s, const void *owner, struct ts_gpu *g, enum ts_hit_kind kind,
		      enum ts_span_check check, uint32_t p, uint32_t npos, const void *data, uint64_t bytes)
{
	memset(s, 0, sizeof(*s));
	s->lo = (uintptr_t)data;
	s->hi = (uintptr_t)data + bytes;
	s->owner = owner;
	s->gpu = g;
	s->kind = kind;
	s->check = check;
	s->pos = p;
	s->npos = npos;
	if (check == TS_CHECK_HASH)
		s->hash = ts_hash_bulk(data, bytes);
}

void ts_stream_add_published(const void *owner, struct ts_gpu *g, uint64_t seq, unsigned npos, void *const *data,
			     const uint64_t *bytes, enum ts_span_check check)
{
	struct span s;
	for (unsigned p = 0; g && p < npos && p < TS_MAX_POSITIONS; p++) {
		span_fill(&s, owner, g, TS_HIT_PRODUCER, check, p, npos, data[p], bytes[p]);
		s.seq = seq;
		memcpy(s.len, bytes, npos * sizeof(*bytes));
		span_add(&s);
	}
}

void ts_stream_add_read(const void *owner, struct ts_gpu *g, unsigned npos, void *const *data, const uint64_t *bytes,
			const struct ts_batch_ranges *rg, enum ts_span_check check)
{
	struct span s;
	for (unsigned p = 0; g && p < npos && p < TS_MAX_POSITIONS; p++) {
		span_fill(&s, owner, g, TS_HIT_CONSUMER, check, p, npos, data[p], bytes[p]);
		/* too many pieces: registered all the same, so it counts as used, but never served */
		s.npieces = rg->overflow ? 0 : rg->n[p];
		memcpy(s.pieces, rg->r[p], s.npieces * sizeof(s.pieces[0]));
		span_add(&s);
	}
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

/* Do the bytes at [src, src + n) still hold what the range was registered with? */
static int span_intact(const struct span *s, const void *src, size_t n)
{
	static _Atomic int told;
	int ok;
	switch (s->check) {
	case TS_CHECK_UNWRITTEN:
		ok = ts_pages_unwritten(src, n) == 1;
		break;
	case TS_CHECK_HASH:
		ok = ts_hash_bulk(src, n) == s->hash;
		break;
	default:
		return 1;
	}
	if (!ok && !atomic_exchange(&told, 1))
		ts_info("gpu: a batch was changed between the loader and its upload: such uploads go from the host");
	return ok;
}

enum ts_hit_kind ts_stream_find(const void *src, size_t n, struct ts_stream_hit *hit)
{
	uintptr_t a = (uintptr_t)src;
	struct span s;
	int found = 0;
	hit->kind = TS_HIT_NONE;
	if (!atomic_load_explicit(&ts_stream_nspans, memory_order_acquire) || n == 0 || a + n < a)
		return TS_HIT_NONE;
	pthread_mutex_lock(&spans_mu);
	for (int i = 0; i < nspans; i++) {
		struct span *r = &spans[i];
		if (a < r->lo || a + n > r->hi || !r->gpu)
			continue;
		/* a hash proves a whole range: a part of one is an ordinary copy */
		if (r->check == TS_CHECK_HASH && (a != r->lo || a + n != r->hi))
			break;
		s = *r;
		found = 1;
		/*
		 * A range is uploaded once: the same addresses uploaded again
		 * (a validation batch in a reused buffer, say) are not the
		 * stream's any more, whatever the program does before the
		 * loader's next batch. A checked range is looked at once.
		 */
		if (n >= r->left || r->check != TS_CHECK_NONE)
			span_remove(i);
		else
			r->left -= n;
		spans_published();
		break;
	}
	pthread_mutex_unlock(&spans_mu);
	/* checked outside the lock: hashing a batch takes milliseconds */
	if (!found || !span_intact(&s, src, n))
		return TS_HIT_NONE;
	hit->gpu = s.gpu;
	if (s.kind == TS_HIT_PRODUCER) {
		hit->seq = s.seq;
		hit->npos = s.npos;
		hit->pos = s.pos;
		memcpy(hit->len, s.len, sizeof(hit->len));
		hit->off = a - s.lo;
		hit->n = n;
		hit->kind = TS_HIT_PRODUCER;
	} else if (cut_pieces(&s, a - s.lo, n, hit) == 0) {
		hit->kind = TS_HIT_CONSUMER;
	}
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

/* ---- producer ------------------------------------------------------------------------------ */

/*
 * A claim timed out on a slot a consumer holds: once the stall time has
 * passed, evict those that stopped reading; give up at twice it. 1: try
 * again. The wait counts across the fence and the publish of one batch: a
 * successor's fence met the same laggard, and before it never evicted.
 */
static int laggards_waited(struct ts_feed *f, uint64_t *waited)
{
	uint64_t stall = ts_stall_for(f->s.timeout_ns);
	if ((*waited += SLICE_NS) >= stall && ts_feed_evict_laggards(f) < 0)
		return 0;
	return *waited < 2 * stall;
}

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
	uint64_t waited = 0;
	int ret;
	if (!L->have_epoch) {
		uint64_t e, nrest, npub;
		int ended;
		/* its fence claims a slot, which a consumer may hold, as for a publish */
		while ((ret = ts_feed_stream_state(f, &e, &ended, NULL, &nrest, &npub, SLICE_NS)) == -ETIMEDOUT &&
		       laggards_waited(f, &waited))
			;
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
	while ((ret = ts_feed_publish(f, &b, SLICE_NS)) == -ETIMEDOUT && laggards_waited(f, &waited))
		;
	if (ret == -EPERM)
		return -EAGAIN; /* replaced as producer meanwhile: consume instead */
	if (ret) {
		ts_info("loader '%s': publishing a batch failed (%s): this one is not shared", L->key, strerror(-ret));
		return TSSHIM_BATCH_OWN;
	}
	L->published_any = 1;
	L->last_was_end = (flags & TSSHIM_BATCH_LAST) != 0;
	L->term = TERM_OURS; /* what we read next is another producer's */
	/* the caller promises not to change the batch before its upload (tsshim.h) */
	ts_stream_add_published(L, L->gpu, f->w.seq, npos, data, len, TS_CHECK_NONE);
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
	uint64_t timeout = f->s.timeout_ns;
	if (*waited >= timeout && ts_session_take_idle(&f->s, timeout) == 1)
		return WAIT_PRODUCE;
	if (*waited >= 2 * ts_stall_for(timeout)) {
		loader_off(L, "the producer publishes nothing");
		return WAIT_GIVE_UP;
	}
	return WAIT_ON;
}

static int stage_for(struct loader *L, unsigned npos, const size_t *bytes, size_t nsamples)
{
	if (L->ids_cap < nsamples) {
		int64_t *m = realloc(L->ids, nsamples * sizeof(*m));
		if (!m)
			return -ENOMEM;
		L->ids = m;
		L->ids_cap = nsamples;
	}
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

/* ---- what the job's epoch was served ------------------------------------------------------- */

/* A sample index the bitmap covers (a call may name a longer dataset than the feed's). */
static int known_id(const struct loader *L, int64_t id)
{
	return id >= 0 && (uint64_t)id < L->f->nindex;
}

static int was_served(const struct loader *L, int64_t id)
{
	return known_id(L, id) && ts_bit_get(L->served, (uint64_t)id);
}

/* Mark (set) or unmark samples ids[0, n) as trained in this epoch of the job. */
static void mark_served(struct loader *L, const int64_t *ids, int set, uint64_t n)
{
	if (!L->epoch_known)
		return;
	for (uint64_t j = 0; j < n; j++) {
		int64_t id = ids[j];
		if (!known_id(L, id) || was_served(L, id) == set)
			continue; /* unknown (the producer gave none): never passed over */
		if (set)
			ts_bit_set(L->served, (uint64_t)id);
		else
			ts_bit_clear(L->served, (uint64_t)id);
		L->nserved += set ? 1 : (uint64_t)-1;
	}
}

/* A new epoch of the job, whatever its role: nothing trained in it yet. */
static void forget_served(struct loader *L)
{
	size_t words = ts_bitmap_words(L->f->nindex);
	L->epoch_known = 0; /* no memory for the bitmap: nothing is tracked, a consumer reads on */
	if (!L->served && !(L->served = calloc(words, sizeof(*L->served))))
		return;
	memset(L->served, 0, words * sizeof(*L->served));
	L->nserved = L->passed = 0;
	L->gather = 0;
	L->last_crossed = L->crossed;
	L->crossed = L->sep_valid = L->took_over = 0;
	L->epoch_known = 1;
}

/*
 * Stop gathering when nothing is left to gather: all of the dataset served,
 * or two datasets' worth passed over. A stream of permutations holds what
 * is lacking before that: the rest of the epoch read in (passing at most a
 * dataset's worth) and the next whole epoch (less than another).
 */
static void gather_check(struct loader *L)
{
	if (!L->gather || (L->passed <= 2 * L->f->nindex && L->nserved < L->f->nindex))
		return;
	L->gather = 0;
	ts_info("loader '%s': the stream holds no sample this epoch of the job still lacks; reading on "
		"(samples may repeat in this epoch)", L->key);
}

/*
 * Gathering: of the samples the last read added to the stage, [from, got),
 * those the job's epoch was already served are compacted away (got[]
 * lowered), the others marked served as they are kept. Once nothing is left
 * to gather, the rest is kept as read (and marked).
 */
static void keep_unserved(struct loader *L, unsigned npos, const size_t *bytes, size_t nsamples, uint64_t from,
			  uint64_t *got)
{
	uint64_t n = got[0] / L->info.sample_bytes[0], kept = from;
	for (uint64_t j = from; j < n; j++) {
		gather_check(L);
		int64_t id = L->ids[j];
		if (L->gather && was_served(L, id)) {
			L->passed++;
			continue;
		}
		if (kept != j)
			for (unsigned p = 0; p < npos; p++) {
				size_t sb = bytes[p] / nsamples;
				memcpy((char *)L->stage[p] + kept * sb, (char *)L->stage[p] + j * sb, sb);
			}
		L->ids[kept++] = id;
		if (known_id(L, id) && !was_served(L, id)) {
			ts_bit_set(L->served, (uint64_t)id);
			L->nserved++;
		}
	}
	if (kept == n)
		return;
	L->rg.overflow = 1; /* its ranges no longer say where the stage's bytes came from: upload from the host */
	for (unsigned p = 0; p < npos; p++)
		got[p] = kept * (bytes[p] / nsamples);
}

/* feed->on_range of a loader: notes whose batches it reads (a takeover changes that). */
static void loader_on_range(void *arg, uint32_t p, const struct ts_range *r, uint64_t at)
{
	struct loader *L = arg;
	uint64_t term = ((uint64_t)(uint32_t)r->tag << 8 | r->writer) + 1;
	if (p == 0 && term != L->term) {
		L->term_changed |= L->term != 0;
		L->term = term;
	}
	ts_batch_ranges_on_range(&L->rg, p, r, at);
}

/*
 * Another producer's batches in mid-epoch (the one we read finished or
 * died, and a successor publishes its own): they may hold samples this
 * epoch was served. Gather from here on, passing over those.
 */
static void gather_on_takeover(struct loader *L)
{
	int changed = L->term_changed;
	L->term_changed = 0;
	L->took_over |= changed;
	if (!changed || L->gather || !L->epoch_known || !L->nserved)
		return;
	L->gather = 1;
	ts_info("loader '%s': another producer's batches in mid-epoch; passing over samples this epoch was served",
		L->key);
}

/*
 * The stream epoch of what we read. This epoch of the job began at a stream
 * epoch's start (align_epoch); reading past that epoch's end, it gathers
 * from there (the next stream epoch, a fresh draw, holds samples it was
 * served). Undisturbed until then, the stream's epochs are shorter than the
 * job's: noted (`crossed`) for its next epoch (epochs_own).
 */
static void note_stream_epoch(struct loader *L)
{
	struct ts_feed *f = L->f;
	if (!f->read_any || !L->epoch_known)
		return;
	if (!L->sep_valid) {
		L->sep = f->read_epoch;
		L->sep_valid = 1;
		return;
	}
	if (f->read_epoch == L->sep)
		return;
	L->sep = f->read_epoch;
	if (L->gather)
		return; /* evicted, or another producer's batches: gathering already */
	L->gather = 1;
	L->crossed = !L->took_over;
	ts_info("loader '%s': the stream's epoch ended before this epoch of the job (%llu samples served); "
		"passing over samples it was served", L->key, (unsigned long long)L->nserved);
}

/* Read the next nsamples of the stream into the stage. -EAGAIN: we are producer now. */
static int read_batch(struct loader *L, unsigned npos, const size_t *bytes, size_t nsamples,
		      struct tsshim_where *where)
{
	struct ts_feed *f = L->f;
	uint64_t want[TS_MAX_POSITIONS], got[TS_MAX_POSITIONS] = {0}, waited = 0;
	int ret = next_slot(L, npos, bytes, nsamples, &waited), eoe;
	uint64_t sb0 = L->info.sample_bytes[0]; /* next_slot: nsamples of it are bytes[0], not 0 */
	if (ret || !sb0)
		return ret ? ret : -EPROTO;
	where->seq = f->r.seq;
	where->sample = f->r.off[0] / sb0;
	for (unsigned p = 0; p < npos; p++)
		want[p] = bytes[p];
	ts_batch_ranges_reset(&L->rg);
	for (size_t j = 0; j < L->ids_cap; j++)
		L->ids[j] = -1; /* a sample the read numbers no index for is nobody's, not the last read's */
	f->read_index = L->ids;
	f->read_index_len = L->ids_cap;
	uint64_t marked = 0; /* the stage's samples [0, marked) were marked served by keep_unserved */
	while (got[0] < want[0]) {
		uint64_t from = got[0] / sb0;
		ret = ts_feed_read(f, npos, want, L->stage, got, &eoe, SLICE_NS);
		int was = L->gather;
		gather_on_takeover(L);
		note_stream_epoch(L);
		if (L->gather) {
			/* from the batch's start when it begins now: what we read of it before counts too */
			keep_unserved(L, npos, bytes, nsamples, was ? from : 0, got);
			marked = got[0] / sb0;
		}
		if (ret == 0)
			continue; /* complete, or an epoch mark: read on into the next epoch */
		if (ret != -ETIMEDOUT)
			break;
		int w = waited_one(L, &waited);
		if (w) {
			ret = w == WAIT_PRODUCE ? -EAGAIN : -ETIMEDOUT;
			break;
		}
	}
	f->read_index = NULL;
	f->read_index_len = 0;
	if (got[0] < want[0])
		mark_served(L, L->ids, 0, marked); /* dropped with the batch: not served after all */
	return got[0] < want[0] ? ret : 0;
}

/* ---- epochs: the job's epoch is the stream's -------------------------------------------------- */

enum { ALIGN_OWN = 1 };

/*
 * Attached at the head in mid-epoch: the samples of the stream's epoch
 * still to come (*left) and that epoch (*epoch). 0, or -errno.
 */
static int samples_to_come(struct loader *L, uint64_t *epoch, uint64_t *left)
{
	uint64_t npub = 0;
	int ended = 0;
	int ret = ts_feed_stream_count(L->f, epoch, &ended, left, &npub, 0);
	if (ret == 0 && ended)
		*left = 0; /* it ended meanwhile: the next slot starts the next one */
	return ret;
}

/*
 * Read nothing more of the stream's epoch we are in: skip to the first
 * sample of the next one (waiting for the producer to publish the rest).
 * 0 there; -EAGAIN: we are producer now; -ETIMEDOUT: sharing given up.
 */
static int skip_to_next_epoch(struct loader *L, uint64_t *skipped)
{
	struct ts_feed *f = L->f;
	uint64_t waited = 0;
	for (;;) {
		int ret = ts_feed_next(f, SLICE_NS, &L->info), eoe, mid = 0;
		if (ret == -ETIMEDOUT) {
			int w = waited_one(L, &waited);
			if (w)
				return w == WAIT_PRODUCE ? -EAGAIN : -ETIMEDOUT;
			continue;
		}
		if (ret)
			return ret;
		for (unsigned p = 0; p < L->info.npos; p++)
			mid |= f->r.off[p] != 0;
		if (!mid && (!f->read_any || L->info.stream_epoch != f->read_epoch))
			return 0;
		/* the rest of this slot, copied nowhere */
		uint64_t want[TS_MAX_POSITIONS] = {0}, got[TS_MAX_POSITIONS] = {0};
		for (unsigned p = 0; p < L->info.npos; p++)
			want[p] = L->info.sample_bytes[p] * L->info.nsamples - f->r.off[p];
		if ((ret = ts_feed_read(f, L->info.npos, want, NULL, got, &eoe, SLICE_NS)) && ret != -ETIMEDOUT)
			return ret;
		*skipped += L->info.sample_bytes[0] ? got[0] / L->info.sample_bytes[0] : 0;
		waited = 0;
	}
}

/*
 * The job begins an epoch: make it begin where a stream epoch does, so
 * that it is served that epoch's samples, each once. Already there (we
 * attached at an epoch's start, or read the last one to its end): read on.
 * Further in (the job left its last epoch early, or its producer did):
 * skip to the next epoch. Attaching where the ring no longer holds the
 * epoch's start: wait for the next one when at most half is still to come;
 * else the job trains this epoch on its own batches (ALIGN_OWN), once: at
 * its next epoch it waits, however much is to come (a job that makes its
 * own epochs faster than the producer would else never meet a start).
 */
static int align_epoch(struct loader *L)
{
	struct ts_feed *f = L->f;
	uint64_t skipped = 0, left = 0;
	int ret = 0;
	for (int attempt = 0; attempt < 3; attempt++) {
		if (!f->attached) {
			if ((ret = ts_feed_attach(f, 1)))
				return ret == -EPERM ? -EAGAIN : ret;
			if (!f->at_epoch_start) {
				uint64_t epoch;
				if ((ret = samples_to_come(L, &epoch, &left))) {
					ts_feed_detach(f);
					return ret;
				}
				if (left * 2 > f->nindex && !L->had_own_epoch) {
					ts_feed_detach(f);
					ts_info("loader '%s': joined the stream in mid-epoch (%llu of %llu samples to come): "
						"this epoch of the job is its own, sharing from the next",
						L->key, (unsigned long long)left, (unsigned long long)f->nindex);
					L->had_own_epoch = 1;
					return ALIGN_OWN;
				}
				f->read_epoch = epoch; /* as if we had read it so far */
				f->read_any = 1;
			}
		}
		ret = skip_to_next_epoch(L, &skipped);
		if (ret != -ESTALE && ret != -ENOTCONN)
			break;
	}
	if (skipped)
		ts_info("loader '%s': skipped %llu samples to the start of the stream's next epoch", L->key,
			(unsigned long long)skipped);
	return ret;
}

/* What consume() returns when nothing was served: -EAGAIN (we are producer
 * now), else TSSHIM_BATCH_OWN, sharing given up on an error but a timeout. */
static int not_served(struct loader *L, int ret)
{
	if (ret == -EAGAIN) {
		ts_feed_detach(L->f);
		return -EAGAIN;
	}
	if (ret != -ETIMEDOUT)
		loader_off(L, ret == -EPROTO ? "the stream's samples differ from this job's" : strerror(-ret));
	return TSSHIM_BATCH_OWN;
}

/*
 * A consumer's new epoch: did the last one outlast the stream's epoch it
 * began at? Then the stream cannot give the job's epochs every sample once
 * (gathering it from later epochs, each a fresh draw, takes several and may
 * still miss some; a native program cannot be told which samples to make):
 * the job trains its own batches while that producer produces. Another
 * producer: shared again. 1: this epoch is the job's own.
 */
static int epochs_own(struct loader *L)
{
	uint64_t w = atomic_load_explicit(&L->f->s.seg->producer, memory_order_relaxed);
	if (L->last_crossed && !L->own_epochs) {
		L->own_epochs = 1;
		L->short_producer = w;
		ts_warn("loader '%s': the stream's epochs hold fewer samples than this job's (its producer leaves "
			"them early, or drops their last batch): the job trains its own batches while that producer "
			"produces", L->key);
	} else if (L->own_epochs && w != L->short_producer) {
		L->own_epochs = 0;
		ts_info("loader '%s': another producer; its epochs are shared again", L->key);
	}
	L->last_crossed = 0;
	return L->own_epochs;
}

/* A job's epoch begins: aligned (0, attached), its own (0, own_epoch set), or an error. */
static int begin_epoch(struct loader *L)
{
	L->sep_valid = 0; /* begun again after an eviction in its first batch: at another stream epoch */
	if (epochs_own(L)) {
		if (L->f->attached)
			ts_feed_detach(L->f); /* nobody waits on a reader that reads nothing */
		L->own_epoch = 1;
		return 0;
	}
	int ret = align_epoch(L);
	L->own_epoch = ret == ALIGN_OWN;
	return ret == ALIGN_OWN ? 0 : ret;
}

static int consume(struct loader *L, unsigned npos, void *const *data, const size_t *bytes, size_t nsamples,
		   unsigned flags, struct tsshim_where *where)
{
	struct ts_feed *f = L->f;
	struct tsshim_where at;
	int first = (flags & TSSHIM_BATCH_FIRST) != 0, ret = 0;
	if (stage_for(L, npos, bytes, nsamples))
		return TSSHIM_BATCH_OWN;
	if (first && (ret = begin_epoch(L)))
		return not_served(L, ret);
	for (int attempt = 0; attempt < 3 && !L->own_epoch; attempt++) {
		/*
		 * Attached by begin_epoch(), or evicted (we were too slow). An
		 * epoch's first batch begins the epoch again as at its start
		 * (nothing of it was served yet, so it repeats nothing); a
		 * later one reads on from the head, gathering the samples its
		 * epoch lacks: the rest of the stream's epoch, then, from the
		 * next, those it missed while away (passing over the others).
		 */
		if (!f->attached) {
			if (first && (ret = begin_epoch(L)))
				return not_served(L, ret);
			if (!first && (ret = ts_feed_attach(f, 0)))
				return ret == -EPERM ? -EAGAIN : TSSHIM_BATCH_OWN;
			if (L->own_epoch)
				break;
		}
		f->on_range = loader_on_range;
		f->on_range_arg = L;
		ret = read_batch(L, npos, bytes, nsamples, &at);
		f->on_range = NULL;
		if (ret != -ESTALE && ret != -ENOTCONN)
			break;
		L->gather = !first && L->epoch_known;
		ts_info("loader '%s': evicted from the stream; %s", L->key,
			first ? "beginning this epoch again, as at its start"
			: L->gather ? "reading on from its head, passing over samples this epoch was served"
				    : "reading on from its head");
	}
	if (L->own_epoch)
		return TSSHIM_BATCH_OWN;
	if (ret)
		return not_served(L, ret);
	mark_served(L, L->ids, 1, nsamples);
	uint64_t len[TS_MAX_POSITIONS];
	for (unsigned p = 0; p < npos; p++) {
		memcpy(data[p], L->stage[p], bytes[p]);
		len[p] = bytes[p];
	}
	ts_stream_add_read(L, L->gpu, npos, data, len, &L->rg, TS_CHECK_NONE);
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
	ts_native_batch_api_used();
	if (ts_cfg.mode != TS_MODE_SOCKET && ts_cfg.mode != TS_MODE_AUTO)
		return TSSHIM_BATCH_OWN;
	if (!args_valid(loader, npos, data, bytes, nsamples, ids, nindex))
		return -EINVAL;
	int saved = errno, prev = ts_in_hook, ret = TSSHIM_BATCH_OWN;
	ts_in_hook = 1;
	pthread_mutex_lock(&mu);
	struct loader *L = loader_get(loader, nindex);
	if (L && !L->off && L->f) {
		ts_stream_drop(L);
		ts_gpu_keep_end(L->gpu);
		if (flags & TSSHIM_BATCH_FIRST)
			forget_served(L);
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
		if (ret != TSSHIM_BATCH_SERVED) /* the job trains its own batch (published or not) */
			mark_served(L, ids, 1, nsamples);
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
	for (int i = 0; i < MAX_LOADERS; i++) {
		struct loader *L = loaders[i];
		if (!L || !L->f || L->f->s.me.pid != (uint32_t)getpid())
			continue;
		char name[TS_NAME_MAX];
		snprintf(name, sizeof(name), "%s", L->f->s.name);
		ts_stream_drop(L);
		ts_gpu_free(L->gpu, 1);
		L->gpu = NULL;
		ts_feed_close(L->f);
		free(L->f);
		L->f = NULL;
		/* a member that died (a killed producer) keeps its slot: if only
		 * such are left, nobody else will remove the feed */
		ts_feed_clean_stale(name, 0);
	}
	pthread_mutex_unlock(&mu);
	errno = saved;
}
