/* SPDX-License-Identifier: MIT */
/*
 * tsshim-inspect: show the caller's tsshim sessions without changing them.
 *
 *   tsshim-inspect                  one line per live session
 *   tsshim-inspect NAME             one session in detail
 *   --json                          machine-readable output (schema below)
 *   --watch [--interval SEC] [--count N]   refresh like top
 *   --clean [NAME]                  remove sessions whose members are all dead
 *
 * Segments are mapped read-only and every value read from them is
 * validated before use: a member may be buggy, dead half-way through a
 * write, or hostile. Only --clean removes anything, and only through
 * ts_session_remove_if_stale(), which never touches a live session (then,
 * for a removed session, the files of a DataLoader feed of that name).
 *
 * JSON schema 1
 * -------------
 * Every document is one line of JSON (with --watch, one document per
 * refresh: JSON Lines). Strings are ASCII: other bytes appear as \u00XX.
 * Integers are exact unsigned 64-bit values. Fields may be added within
 * schema 1; removing or changing one bumps "schema".
 *
 * List (no NAME):
 *   {"schema": 1, "sessions": [SUMMARY, ...]}          sorted by name
 *   SUMMARY of a readable session:
 *     {"name": str, "path": str, "state": "open"|"closed",
 *      "members": int, "live": int, "stale": int, "dead": int,
 *      "producer_pid": int|null, "depth": int, "claim_seq": int, "pub_seq": int,
 *      "loader": str|null}                 a shared DataLoader's feed: what it loads
 *   SUMMARY of a segment that fails validation (corrupt, truncated,
 *   another build's layout, foreign-owned or not mode 0600):
 *     {"name": str, "path": str, "state": "corrupt", "error": str}
 *
 * One session (NAME):
 *   {"schema": 1, "session": {
 *     "name": str, "path": str,
 *     "created_unix_ms": int, "creator_pid": int,
 *     "depth": int,                      ring depth in batches
 *     "timeout_ms": int,                 producer silence tolerated
 *     "state": "open"|"closed",
 *     "producer": {"slot": int, "pid": int, "epoch": int} | null,
 *                                        pid 0: its slot was freed, a takeover is due
 *     "members": [{
 *       "slot": int, "pid": int, "start_time": int (clock ticks since boot),
 *       "role": "producer"|"consumer",
 *       "state": "live"|"stale"|"dead",  stale: alive but silent past timeout_ms
 *       "attached": bool,                consumer attached to the ring
 *       "lag": int|null,                 batches behind pub_seq (attached consumers only)
 *       "read_seq": int, "batches_read": int, "heartbeat_age_ms": int}],
 *     "ring": {"claim_seq": int, "pub_seq": int, "slots": [{
 *       "index": int, "state": "free"|"writing"|"published"|"invalid",
 *       "seq": int, "epoch": int (low 9 bits),
 *       "writer": int|null,              member slot that filled it
 *       "positions": [int, ...]|null,    bytes per tensor position (null when free)
 *       "samples": int|null,             samples in the batch (null when free)
 *       "end_of_epoch": bool,
 *       "error": str}]},                 only when the slot fails validation
 *     "counters": {"batches_shared": int, "decodes_skipped": int,
 *       "decodes_shared": int, "bytes_not_copied": int,
 *       "cpu_ns_saved": int, "takeovers": int, "evictions": int},
 *     "feed": {                          a shared DataLoader's session, else null
 *       "key": str,                      the loader's sharing key (16 hex digits)
 *       "label": str,                    what it loads, as its creator described it
 *       "samples_produced": int, "samples_served": int,  served: to consumers
 *       "produce_cpu_ns": int,           CPU the producers spent on their batches
 *       "cpu_ns_saved": int,             samples_served x produce_cpu_ns / samples_produced
 *       "shareable": bool},              false: the producer met batches it cannot carry
 *     "gpu": {                           the feed's GPU ring (socket mode), else null
 *       "batches_kept": int, "bytes_kept": int,        producer uploads placed in it
 *       "uploads_served": int, "bytes_served": int,    consumer uploads served from it
 *       "buffers": int, "buffer_bytes": int,           device buffers it names now
 *       "replaced": int},                slots given a fresh buffer (theirs was being read)
 *     "cache": {                         the session's decoded-image cache, else null
 *       "path": str, "scope": str,       its file; the dataset directory its users decode from
 *       "hits": int, "misses": int, "fills": int,  fills: real decodes kept for others
 *       "bypasses": int,                 decodes not shared (busy lock, no room, not admitted, ...)
 *       "bypass_cold": int,              of which not admitted: the cache evicts and is rarely hit
 *       "bypass_lock": int,              of which the lock stayed busy past the wait allowed
 *       "repairs": int,                  index repairs: a lock whose holder was gone (a job
 *                                        died in it, or a peer wrote over it) taken over,
 *                                        or links found broken
 *       "evictions": int, "entries": int, "bytes_in_use": int, "budget": int,
 *       "reserved_bytes": int, "users": int, "saved_decode_ns": int}}}
 *   A session with only a cache: {"name", "path": null, "state": "cache-only", "cache"}.
 *
 * Clean (--clean):
 *   {"schema": 1, "clean": {"removed": [str, ...],
 *     "left": [{"name": str, "reason": str}, ...], "temp_files_removed": int}}
 *
 * On failure (exit 1 or 2) nothing is written to stdout; the reason is one
 * line on stderr.
 */
#include "cache.h"
#include "feed.h"
#include "gpuring.h"
#include "ring.h"
#include "session.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <getopt.h>
#include <inttypes.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define PROG "tsshim-inspect"

enum { EXIT_OK = 0, EXIT_FAIL = 1, EXIT_USAGE = 2 };

struct opts {
	int json, watch, clean;
	double interval; /* seconds between refreshes */
	long count;      /* refreshes, 0: until SIGINT/SIGTERM */
	const char *name;
};

/* ---- a copy of one segment, taken once per refresh --------------------- */

struct member_snap {
	unsigned slot;
	uint32_t pid;
	uint64_t start_time;
	enum ts_member_health health;
	int producer;
	int attached;
	uint64_t read_seq, batches_read, hb_age_ms;
};

struct slot_snap {
	unsigned index, state;
	uint64_t seq;
	uint32_t epoch;
	int writer;      /* member index, -1: none or invalid */
	int has_meta;    /* npos and len[] are valid */
	uint32_t npos;
	uint64_t len[TS_MAX_POSITIONS];
	uint64_t nsamples;
	int end_of_epoch;
	char error[48];  /* non-empty: the slot failed validation */
};

struct snap {
	char name[TS_NAME_MAX];
	char path[TS_PATH_MAX];
	uint64_t created_unix_ns;
	uint32_t creator_pid, depth, timeout_ms, state;
	int producer;            /* member index, -1: none or out of range */
	int64_t producer_raw;    /* as stored: tells "none" from "out of range" */
	uint32_t producer_epoch, producer_pid;
	unsigned nmembers, live, stale, dead;
	struct member_snap m[TS_MAX_MEMBERS];
	uint64_t claim_seq, pub_seq;
	struct slot_snap slots[TS_MAX_DEPTH];
	uint64_t batches_shared, decodes_skipped, decodes_shared, bytes_not_copied,
		cpu_ns_saved, takeovers, evictions;
	char label[TS_LABEL_MAX];       /* non-empty: a data feed (one DataLoader key) */
	uint64_t samples_served, samples_produced, produce_cpu_ns, feed_cpu_ns_saved;
	uint32_t feed_flags;
	int has_session;                /* the session segment exists and is valid */
	int has_cache;                  /* the session's decoded-image cache (exact mode) */
	char cache_path[TS_PATH_MAX];
	struct ts_cache_stats cache;
	int has_gpu;                    /* the feed's GPU ring */
	uint64_t gpu_kept, gpu_kept_bytes, gpu_served, gpu_served_bytes, gpu_bufs, gpu_buf_bytes, gpu_replaced;
};

#define LOAD(p) atomic_load_explicit((p), memory_order_relaxed)

static void snap_members(const struct ts_segment *seg, struct snap *s, uint64_t now)
{
	for (unsigned i = 0; i < TS_MAX_MEMBERS; i++) {
		enum ts_member_health h = ts_member_health(seg, i, now);
		if (h == TS_MEMBER_FREE)
			continue;
		const struct ts_member *m = &seg->members[i];
		struct member_snap *ms = &s->m[s->nmembers++];
		uint64_t hb = LOAD(&m->heartbeat_ns);
		ms->slot = i;
		ms->pid = LOAD(&m->pid);
		ms->start_time = LOAD(&m->start_time);
		ms->health = h;
		ms->producer = (int)i == s->producer;
		ms->attached = (int)(LOAD(&m->attach) & 1);
		ms->read_seq = LOAD(&m->read_seq);
		ms->batches_read = LOAD(&m->batches_read);
		ms->hb_age_ms = now > hb ? (now - hb) / 1000000u : 0;
		s->live += h == TS_MEMBER_LIVE;
		s->stale += h == TS_MEMBER_STALE;
		s->dead += h == TS_MEMBER_DEAD;
		if (ms->producer)
			s->producer_pid = ms->pid;
	}
}

static void snap_slot(const struct ts_ring *ring, unsigned i, struct slot_snap *ss)
{
	uint64_t w = LOAD(&ring->slots[i].word);
	unsigned writer1 = ts_slot_writer1(w);
	ss->index = i;
	ss->state = ts_slot_state(w);
	ss->seq = ts_slot_seq(w);
	ss->epoch = ts_slot_epoch(w);
	ss->writer = -1;
	if (ss->state > TS_SLOT_PUBLISHED) {
		snprintf(ss->error, sizeof(ss->error), "invalid slot state %u", ss->state);
		return;
	}
	if (writer1 > TS_MAX_MEMBERS) {
		snprintf(ss->error, sizeof(ss->error), "writer %u out of range", writer1 - 1);
		return;
	}
	ss->writer = (int)writer1 - 1;
	if (ss->writer < 0 || ss->state == TS_SLOT_FREE)
		return;
	/* Copy first, then validate the copy: the writer may change it meanwhile. */
	struct ts_batch_meta meta;
	memcpy(&meta, &ring->meta[ss->writer][i], sizeof(meta));
	if (meta.npos > TS_MAX_POSITIONS) {
		snprintf(ss->error, sizeof(ss->error), "npos %u > %u", meta.npos, TS_MAX_POSITIONS);
		return;
	}
	ss->has_meta = 1;
	ss->npos = meta.npos;
	memcpy(ss->len, meta.len, sizeof(ss->len));
	ss->nsamples = meta.nsamples;
	ss->end_of_epoch = !!(meta.flags & TS_BATCH_END_OF_EPOCH);
	/* A slot being written may be half-filled; a published one must be whole. */
	if (ss->state == TS_SLOT_PUBLISHED && ts_batch_meta_valid(&meta) != 0)
		snprintf(ss->error, sizeof(ss->error), "invalid batch metadata");
}

static void snapshot(const struct ts_view *v, struct snap *s)
{
	const struct ts_segment *seg = v->seg;
	const struct ts_counters *c = &seg->counters;
	memset(s, 0, sizeof(*s));
	snprintf(s->name, sizeof(s->name), "%s", v->name);
	snprintf(s->path, sizeof(s->path), "%s", v->path);
	s->created_unix_ns = seg->st.created_unix_ns;
	s->creator_pid = seg->st.creator_pid;
	s->timeout_ms = seg->st.timeout_ms;
	/* Validated at open, but the owner can still scribble: clamp what we index with. */
	s->depth = seg->st.depth;
	if (s->depth > TS_MAX_DEPTH)
		s->depth = TS_MAX_DEPTH;
	s->state = LOAD(&seg->state);
	uint64_t pw = LOAD(&seg->producer);
	/* Not ts_producer_index(): its int arithmetic overflows on hostile words. */
	s->producer_raw = (int64_t)(uint32_t)pw - 1;
	s->producer = s->producer_raw < TS_MAX_MEMBERS ? (int)s->producer_raw : -1;
	s->producer_epoch = ts_producer_epoch(pw);
	s->claim_seq = LOAD(&seg->ring.claim_seq);
	s->pub_seq = LOAD(&seg->ring.pub_seq);
	snap_members(seg, s, ts_now_ns());
	for (unsigned i = 0; i < s->depth; i++)
		snap_slot(&seg->ring, i, &s->slots[i]);
	s->batches_shared = LOAD(&c->batches_shared);
	s->decodes_skipped = LOAD(&c->decodes_skipped);
	s->decodes_shared = LOAD(&c->decodes_shared);
	s->bytes_not_copied = LOAD(&c->bytes_not_copied);
	s->cpu_ns_saved = LOAD(&c->cpu_ns_saved);
	s->takeovers = LOAD(&c->takeovers);
	s->evictions = LOAD(&c->evictions);
	memcpy(s->label, seg->st.label, sizeof(s->label));
	s->label[sizeof(s->label) - 1] = '\0'; /* validated at open; the owner may still scribble */
	s->samples_served = LOAD(&c->samples_served);
	s->samples_produced = LOAD(&c->samples_produced);
	s->produce_cpu_ns = LOAD(&c->produce_cpu_ns);
	s->feed_flags = LOAD(&seg->feed_flags);
	if (s->samples_produced) {
		/* counters a peer scribbled over may not fit: converting such a double is undefined */
		double saved = (double)s->samples_served * (double)s->produce_cpu_ns / (double)s->samples_produced;
		s->feed_cpu_ns_saved = saved < 18446744073709551616.0 ? (uint64_t)saved : UINT64_MAX;
	}
	s->cpu_ns_saved += s->feed_cpu_ns_saved;
}

/* A feed's key: what its session name adds after the last dot. */
static const char *feed_key(const struct snap *s)
{
	const char *dot = strrchr(s->name, '.');
	return dot ? dot + 1 : s->name;
}

/*
 * The owner may shrink a file while we read its mapping, which raises
 * SIGBUS. Every read of a mapping (a session, its cache, its GPU ring)
 * runs under bus_guarded(), where that becomes an ordinary -EBADMSG
 * ("truncated while being read") instead of a crash. A mapping made inside
 * fn is left behind then (inspect is short-lived).
 */
static sigjmp_buf *volatile bus_jump;

static void on_sigbus(int sig)
{
	if (bus_jump)
		siglongjmp(*bus_jump, 1);
	signal(SIGBUS, SIG_DFL);
	raise(SIGBUS);
}

static int bus_guarded(int (*fn)(void *), void *arg)
{
	sigjmp_buf jb;
	if (sigsetjmp(jb, 1)) {
		bus_jump = NULL;
		return -EBADMSG;
	}
	bus_jump = &jb;
	int ret = fn(arg);
	bus_jump = NULL;
	return ret;
}

struct load_args {
	struct ts_view *v;
	const char *path;
	struct snap *s;
	char *why;
	size_t whylen;
};

static int load_fn(void *arg)
{
	struct load_args *a = arg;
	int ret = ts_view_open(a->v, a->path, a->why, a->whylen);
	if (ret == 0)
		snapshot(a->v, a->s);
	return ret;
}

static int load(struct ts_view *v, const char *path, struct snap *s, char *why, size_t whylen)
{
	struct load_args a = {.v = v, .path = path, .s = s, .why = why, .whylen = whylen};
	int ret = bus_guarded(load_fn, &a);
	if (ret == -EBADMSG && !why[0])
		snprintf(why, whylen, "truncated while being read");
	return ret;
}

/* 0 or -errno with a one-line reason in why. */
static int load_session(const char *path, struct snap *s, char *why, size_t whylen)
{
	struct ts_view v = {0};
	int ret = load(&v, path, s, why, whylen);
	ts_view_close(&v);
	return ret;
}

/* ---- the caller's segments, sorted by name ------------------------------ */

struct entry {
	char path[TS_PATH_MAX];
	char name[TS_NAME_MAX];
	char left[176]; /* --clean: why it was left in place, "" if not */
	int removed;    /* --clean: removed */
};

struct entries {
	struct entry *v;
	size_t n, cap;
	int oom;
};

static void collect(const char *path, const char *name, void *arg)
{
	struct entries *l = arg;
	if (l->n == l->cap) {
		size_t cap = l->cap ? 2 * l->cap : 16;
		struct entry *v = realloc(l->v, cap * sizeof(*v));
		if (!v) {
			l->oom = 1;
			return;
		}
		l->v = v;
		l->cap = cap;
	}
	snprintf(l->v[l->n].path, sizeof(l->v[l->n].path), "%s", path);
	snprintf(l->v[l->n].name, sizeof(l->v[l->n].name), "%s", name);
	l->v[l->n].left[0] = '\0';
	l->v[l->n].removed = 0;
	l->n++;
}

static int by_name(const void *a, const void *b)
{
	return strcmp(((const struct entry *)a)->name, ((const struct entry *)b)->name);
}

static int list_entries(struct entries *l)
{
	memset(l, 0, sizeof(*l));
	int ret = ts_session_list(collect, l);
	if (ret == 0 && l->oom)
		ret = -ENOMEM;
	if (ret) {
		fprintf(stderr, PROG ": cannot list %s: %s\n", ts_shm_dir(), strerror(-ret));
		free(l->v);
		return ret;
	}
	if (l->n)
		qsort(l->v, l->n, sizeof(*l->v), by_name);
	return 0;
}

/* ---- labels and formatting ---------------------------------------------- */

static const char *health_label(enum ts_member_health h)
{
	switch (h) {
	case TS_MEMBER_LIVE: return "live";
	case TS_MEMBER_STALE: return "stale";
	case TS_MEMBER_DEAD: return "dead";
	default: return "free";
	}
}

static const char *slot_label(unsigned state)
{
	switch (state) {
	case TS_SLOT_FREE: return "free";
	case TS_SLOT_WRITING: return "writing";
	case TS_SLOT_PUBLISHED: return "published";
	default: return "invalid";
	}
}

static const char *seg_state_label(uint32_t state)
{
	return state == TS_SEG_OPEN ? "open" : state == TS_SEG_CLOSED ? "closed" : "invalid";
}

/* Batches an attached consumer is behind the head; -1: not applicable. */
static int64_t member_lag(const struct snap *s, const struct member_snap *m)
{
	if (!m->attached || m->producer)
		return -1;
	return s->pub_seq > m->read_seq ? (int64_t)(s->pub_seq - m->read_seq) : 0;
}

static const char *fmt_bytes(char *buf, size_t n, uint64_t v)
{
	static const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
	double x = (double)v;
	unsigned u = 0;
	while (x >= 1024 && u + 1 < sizeof(unit) / sizeof(unit[0])) {
		x /= 1024;
		u++;
	}
	if (u == 0)
		snprintf(buf, n, "%" PRIu64 " B", v);
	else
		snprintf(buf, n, "%.1f %s (%" PRIu64 " bytes)", x, unit[u], v);
	return buf;
}

static const char *fmt_age(char *buf, size_t n, uint64_t sec)
{
	if (sec < 60)
		snprintf(buf, n, "%" PRIu64 "s", sec);
	else if (sec < 3600)
		snprintf(buf, n, "%" PRIu64 "m%02" PRIu64 "s", sec / 60, sec % 60);
	else if (sec < 86400)
		snprintf(buf, n, "%" PRIu64 "h%02" PRIu64 "m", sec / 3600, sec / 60 % 60);
	else
		snprintf(buf, n, "%" PRIu64 "d%02" PRIu64 "h", sec / 86400, sec / 3600 % 24);
	return buf;
}

/* ---- text output -------------------------------------------------------- */

static void text_header(const struct snap *s)
{
	char when[32] = "?", age[32] = "?";
	time_t t = (time_t)(s->created_unix_ns / 1000000000u);
	struct tm tm;
	if (localtime_r(&t, &tm))
		strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", &tm);
	uint64_t now = ts_prim_realtime_ns();
	if (now >= s->created_unix_ns)
		fmt_age(age, sizeof(age), (now - s->created_unix_ns) / 1000000000u);
	printf("session   %s (%s)\n", s->name, seg_state_label(s->state));
	if (s->label[0])
		printf("loader    %s (key %s)%s\n", s->label, feed_key(s),
		       s->feed_flags & TS_FEED_UNSHAREABLE ? ", batches not shareable" : "");
	printf("path      %s\n", s->path);
	printf("created   %s, %s ago, by pid %u\n", when, age, s->creator_pid);
	printf("depth     %u batches\n", s->depth);
	printf("timeout   %u ms\n", s->timeout_ms);
	if (s->producer_raw >= TS_MAX_MEMBERS)
		printf("producer  invalid (slot %" PRId64 " out of range), epoch %u\n", s->producer_raw,
		       s->producer_epoch);
	else if (s->producer < 0)
		printf("producer  none, epoch %u\n", s->producer_epoch);
	else
		printf("producer  slot %d, pid %u, epoch %u\n", s->producer, s->producer_pid,
		       s->producer_epoch);
}

static void text_members(const struct snap *s)
{
	printf("\nmembers (%u: %u live, %u stale, %u dead)\n", s->nmembers, s->live, s->stale,
	       s->dead);
	if (!s->nmembers)
		return;
	printf("  %4s %10s  %-8s  %-5s  %-8s  %6s  %12s  %12s\n", "SLOT", "PID", "ROLE", "STATE",
	       "ATTACHED", "LAG", "BATCHES READ", "HEARTBEAT");
	for (unsigned i = 0; i < s->nmembers; i++) {
		const struct member_snap *m = &s->m[i];
		char lag[24] = "-", hb[32];
		int64_t l = member_lag(s, m);
		if (l >= 0)
			snprintf(lag, sizeof(lag), "%" PRId64, l);
		snprintf(hb, sizeof(hb), "%" PRIu64 " ms ago", m->hb_age_ms);
		printf("  %4u %10u  %-8s  %-5s  %-8s  %6s  %12" PRIu64 "  %12s\n", m->slot, m->pid,
		       m->producer ? "producer" : "consumer", health_label(m->health),
		       m->attached ? "yes" : "no", lag, m->batches_read, hb);
	}
}

static void text_ring(const struct snap *s)
{
	printf("\nring      claim_seq %" PRIu64 ", pub_seq %" PRIu64 "\n", s->claim_seq, s->pub_seq);
	printf("  %4s  %-9s  %10s  %5s  %6s  %8s  %s\n", "SLOT", "STATE", "SEQ", "EPOCH", "WRITER",
	       "SAMPLES", "POSITIONS (bytes)");
	for (unsigned i = 0; i < s->depth; i++) {
		const struct slot_snap *ss = &s->slots[i];
		char writer[16] = "-", samples[24] = "-";
		if (ss->writer >= 0)
			snprintf(writer, sizeof(writer), "%d", ss->writer);
		if (ss->has_meta)
			snprintf(samples, sizeof(samples), "%" PRIu64, ss->nsamples);
		printf("  %4u  %-9s  %10" PRIu64 "  %5u  %6s  %8s ", ss->index, slot_label(ss->state),
		       ss->seq, ss->epoch, writer, samples);
		if (ss->error[0])
			printf(" (%s)", ss->error);
		for (unsigned p = 0; ss->has_meta && p < ss->npos; p++)
			printf(" %" PRIu64, ss->len[p]);
		if (ss->end_of_epoch)
			printf("  [end of epoch]");
		putchar('\n');
	}
}

static void text_counters(const struct snap *s)
{
	char b[64];
	printf("\ncounters\n");
	printf("  batches shared    %" PRIu64 "\n", s->batches_shared);
	printf("  decodes skipped   %" PRIu64 "\n", s->decodes_skipped);
	printf("  decodes shared    %" PRIu64 "\n", s->decodes_shared);
	printf("  bytes not copied  %s\n", fmt_bytes(b, sizeof(b), s->bytes_not_copied));
	printf("  cpu time saved    %.3f s\n", (double)s->cpu_ns_saved / 1e9);
	printf("  takeovers         %" PRIu64 "\n", s->takeovers);
	printf("  evictions         %" PRIu64 "\n", s->evictions);
	if (s->label[0]) {
		printf("  samples produced  %" PRIu64 " (%.3f s of CPU)\n", s->samples_produced,
		       (double)s->produce_cpu_ns / 1e9);
		printf("  samples served    %" PRIu64 " (%.3f s of CPU not spent)\n", s->samples_served,
		       (double)s->feed_cpu_ns_saved / 1e9);
	}
}

static void text_gpu(const struct snap *s)
{
	char a[64], b[64];
	if (!s->has_gpu)
		return;
	printf("\ngpu ring\n");
	printf("  batches kept      %" PRIu64 ", %s\n", s->gpu_kept, fmt_bytes(a, sizeof(a), s->gpu_kept_bytes));
	printf("  uploads served    %" PRIu64 ", %s not copied host-to-device\n", s->gpu_served,
	       fmt_bytes(b, sizeof(b), s->gpu_served_bytes));
	printf("  device buffers    %" PRIu64 ", %s; %" PRIu64 " replaced while being read\n", s->gpu_bufs,
	       fmt_bytes(a, sizeof(a), s->gpu_buf_bytes), s->gpu_replaced);
}

static void text_cache(const struct snap *s)
{
	char b1[64], b2[64];
	const struct ts_cache_stats *c = &s->cache;
	if (!s->has_cache)
		return;
	printf("\ndecoded-image cache  %s\n", s->cache_path);
	printf("  dataset scope     %s\n", c->scope[0] ? c->scope : "(not detected yet)");
	printf("  entries           %" PRIu64 " (%s of %s budget)\n", c->entries,
	       fmt_bytes(b1, sizeof(b1), c->bytes_in_use), fmt_bytes(b2, sizeof(b2), c->budget));
	printf("  decodes shared    %" PRIu64 " hits, %" PRIu64 " real decodes, %" PRIu64 " private", c->hits,
	       c->fills, c->bypasses);
	if (c->bypass_cold)
		printf(" (%" PRIu64 " not cached: the cache evicts and is rarely hit)", c->bypass_cold);
	printf("\n");
	printf("  decode time saved %.3f s\n", (double)c->saved_decode_ns / 1e9);
	printf("  evictions         %" PRIu64 "\n", c->evictions);
	if (c->repairs || c->bypass_lock)
		printf("  lock              %" PRIu64 " repairs (a holder gone, or a peer wrote over it), "
		       "%" PRIu64 " decodes private while it was busy\n", c->repairs, c->bypass_lock);
	printf("  users             %" PRIu64 "\n", c->users);
}

static void text_session(const struct snap *s)
{
	if (s->has_session) {
		text_header(s);
		text_members(s);
		text_ring(s);
		text_counters(s);
		text_gpu(s);
	} else {
		printf("session   %s (no members: only its decoded-image cache exists)\n", s->name);
	}
	text_cache(s);
}

static int name_width(const struct entries *l)
{
	size_t w = 4;
	for (size_t i = 0; i < l->n; i++)
		if (strlen(l->v[i].name) > w)
			w = strlen(l->v[i].name);
	return (int)w;
}

static void text_list_row(int w, const struct entry *e, const struct snap *s, const char *why)
{
	if (why) {
		printf("%-*s  corrupt: %s\n", w, e->name, why);
		return;
	}
	char members[32], producer[16] = "-";
	snprintf(members, sizeof(members), "%u (%u live)", s->nmembers, s->live);
	if (s->producer >= 0)
		snprintf(producer, sizeof(producer), "%u", s->producer_pid);
	const char *state = seg_state_label(s->state);
	if (s->state == TS_SEG_OPEN && s->live + s->stale == 0)
		state = "open, no live member (--clean removes it)";
	printf("%-*s  %-12s  %8s  %10" PRIu64 "  %s%s%s\n", w, e->name, members, producer, s->pub_seq,
	       state, s->label[0] ? "; loader: " : "", s->label);
}

/* ---- JSON output -------------------------------------------------------- */

struct jw {
	FILE *f;
	unsigned depth;
	uint64_t started; /* bit d: depth d already holds a value (next one needs a comma) */
};

static void j_quoted(FILE *f, const char *s)
{
	fputc('"', f);
	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		if (*p == '"' || *p == '\\')
			fprintf(f, "\\%c", *p);
		else if (*p < 0x20 || *p >= 0x7f)
			fprintf(f, "\\u%04x", *p);
		else
			fputc(*p, f);
	}
	fputc('"', f);
}

/* Separator and key of the next value; key is NULL inside arrays. */
static void j_key(struct jw *j, const char *key)
{
	uint64_t bit = 1ull << j->depth;
	if (j->started & bit)
		fputc(',', j->f);
	j->started |= bit;
	if (key) {
		j_quoted(j->f, key);
		fputc(':', j->f);
	}
}

static void j_open(struct jw *j, const char *key, char bracket)
{
	j_key(j, key);
	fputc(bracket, j->f);
	j->depth++;
	j->started &= ~(1ull << j->depth);
}

static void j_close(struct jw *j, char bracket)
{
	j->depth--;
	fputc(bracket, j->f);
}

static void j_str(struct jw *j, const char *key, const char *v)
{
	j_key(j, key);
	j_quoted(j->f, v);
}

static void j_u64(struct jw *j, const char *key, uint64_t v)
{
	j_key(j, key);
	fprintf(j->f, "%" PRIu64, v);
}

static void j_bool(struct jw *j, const char *key, int v)
{
	j_key(j, key);
	fputs(v ? "true" : "false", j->f);
}

static void j_null(struct jw *j, const char *key)
{
	j_key(j, key);
	fputs("null", j->f);
}

static void j_begin(struct jw *j)
{
	*j = (struct jw){.f = stdout};
	j_open(j, NULL, '{');
	j_u64(j, "schema", 1);
}

static void j_end(struct jw *j)
{
	j_close(j, '}');
	fputc('\n', j->f);
}

static void json_members(struct jw *j, const struct snap *s)
{
	j_open(j, "members", '[');
	for (unsigned i = 0; i < s->nmembers; i++) {
		const struct member_snap *m = &s->m[i];
		int64_t lag = member_lag(s, m);
		j_open(j, NULL, '{');
		j_u64(j, "slot", m->slot);
		j_u64(j, "pid", m->pid);
		j_u64(j, "start_time", m->start_time);
		j_str(j, "role", m->producer ? "producer" : "consumer");
		j_str(j, "state", health_label(m->health));
		j_bool(j, "attached", m->attached);
		if (lag >= 0)
			j_u64(j, "lag", (uint64_t)lag);
		else
			j_null(j, "lag");
		j_u64(j, "read_seq", m->read_seq);
		j_u64(j, "batches_read", m->batches_read);
		j_u64(j, "heartbeat_age_ms", m->hb_age_ms);
		j_close(j, '}');
	}
	j_close(j, ']');
}

static void json_slot(struct jw *j, const struct slot_snap *ss)
{
	j_open(j, NULL, '{');
	j_u64(j, "index", ss->index);
	j_str(j, "state", slot_label(ss->state));
	j_u64(j, "seq", ss->seq);
	j_u64(j, "epoch", ss->epoch);
	if (ss->writer >= 0)
		j_u64(j, "writer", (uint64_t)ss->writer);
	else
		j_null(j, "writer");
	if (ss->has_meta) {
		j_open(j, "positions", '[');
		for (unsigned p = 0; p < ss->npos; p++)
			j_u64(j, NULL, ss->len[p]);
		j_close(j, ']');
		j_u64(j, "samples", ss->nsamples);
	} else {
		j_null(j, "positions");
		j_null(j, "samples");
	}
	j_bool(j, "end_of_epoch", ss->end_of_epoch);
	if (ss->error[0])
		j_str(j, "error", ss->error);
	j_close(j, '}');
}

static void json_ring(struct jw *j, const struct snap *s)
{
	j_open(j, "ring", '{');
	j_u64(j, "claim_seq", s->claim_seq);
	j_u64(j, "pub_seq", s->pub_seq);
	j_open(j, "slots", '[');
	for (unsigned i = 0; i < s->depth; i++)
		json_slot(j, &s->slots[i]);
	j_close(j, ']');
	j_close(j, '}');
}

static void json_counters(struct jw *j, const struct snap *s)
{
	j_open(j, "counters", '{');
	j_u64(j, "batches_shared", s->batches_shared);
	j_u64(j, "decodes_skipped", s->decodes_skipped);
	j_u64(j, "decodes_shared", s->decodes_shared);
	j_u64(j, "bytes_not_copied", s->bytes_not_copied);
	j_u64(j, "cpu_ns_saved", s->cpu_ns_saved);
	j_u64(j, "takeovers", s->takeovers);
	j_u64(j, "evictions", s->evictions);
	j_close(j, '}');
}

static void json_feed(struct jw *j, const struct snap *s)
{
	if (!s->label[0]) {
		j_null(j, "feed");
		return;
	}
	j_open(j, "feed", '{');
	j_str(j, "key", feed_key(s));
	j_str(j, "label", s->label);
	j_u64(j, "samples_produced", s->samples_produced);
	j_u64(j, "samples_served", s->samples_served);
	j_u64(j, "produce_cpu_ns", s->produce_cpu_ns);
	j_u64(j, "cpu_ns_saved", s->feed_cpu_ns_saved);
	j_bool(j, "shareable", !(s->feed_flags & TS_FEED_UNSHAREABLE));
	j_close(j, '}');
}

static void json_gpu(struct jw *j, const struct snap *s)
{
	if (!s->has_gpu) {
		j_null(j, "gpu");
		return;
	}
	j_open(j, "gpu", '{');
	j_u64(j, "batches_kept", s->gpu_kept);
	j_u64(j, "bytes_kept", s->gpu_kept_bytes);
	j_u64(j, "uploads_served", s->gpu_served);
	j_u64(j, "bytes_served", s->gpu_served_bytes);
	j_u64(j, "buffers", s->gpu_bufs);
	j_u64(j, "buffer_bytes", s->gpu_buf_bytes);
	j_u64(j, "replaced", s->gpu_replaced);
	j_close(j, '}');
}

static void json_cache(struct jw *j, const struct snap *s)
{
	const struct ts_cache_stats *c = &s->cache;
	if (!s->has_cache) {
		j_null(j, "cache");
		return;
	}
	j_open(j, "cache", '{');
	j_str(j, "path", s->cache_path);
	j_str(j, "scope", c->scope);
	j_u64(j, "hits", c->hits);
	j_u64(j, "misses", c->misses);
	j_u64(j, "fills", c->fills);
	j_u64(j, "bypasses", c->bypasses);
	j_u64(j, "bypass_cold", c->bypass_cold);
	j_u64(j, "bypass_lock", c->bypass_lock);
	j_u64(j, "repairs", c->repairs);
	j_u64(j, "evictions", c->evictions);
	j_u64(j, "entries", c->entries);
	j_u64(j, "bytes_in_use", c->bytes_in_use);
	j_u64(j, "budget", c->budget);
	j_u64(j, "reserved_bytes", c->reserved_bytes);
	j_u64(j, "users", c->users);
	j_u64(j, "saved_decode_ns", c->saved_decode_ns);
	j_close(j, '}');
}

static void json_session(const struct snap *s)
{
	struct jw j;
	j_begin(&j);
	j_open(&j, "session", '{');
	j_str(&j, "name", s->name);
	if (!s->has_session) {
		j_null(&j, "path");
		j_str(&j, "state", "cache-only");
		json_cache(&j, s);
		j_close(&j, '}');
		j_end(&j);
		return;
	}
	j_str(&j, "path", s->path);
	j_u64(&j, "created_unix_ms", s->created_unix_ns / 1000000u);
	j_u64(&j, "creator_pid", s->creator_pid);
	j_u64(&j, "depth", s->depth);
	j_u64(&j, "timeout_ms", s->timeout_ms);
	j_str(&j, "state", seg_state_label(s->state));
	if (s->producer >= 0) {
		j_open(&j, "producer", '{');
		j_u64(&j, "slot", (uint64_t)s->producer);
		j_u64(&j, "pid", s->producer_pid);
		j_u64(&j, "epoch", s->producer_epoch);
		j_close(&j, '}');
	} else {
		j_null(&j, "producer");
	}
	json_members(&j, s);
	json_ring(&j, s);
	json_counters(&j, s);
	json_feed(&j, s);
	json_gpu(&j, s);
	json_cache(&j, s);
	j_close(&j, '}');
	j_end(&j);
}

static void json_list_item(struct jw *j, const struct entry *e, const struct snap *s, const char *why)
{
	j_open(j, NULL, '{');
	j_str(j, "name", e->name);
	j_str(j, "path", e->path);
	if (why) {
		j_str(j, "state", "corrupt");
		j_str(j, "error", why);
	} else {
		j_str(j, "state", seg_state_label(s->state));
		j_u64(j, "members", s->nmembers);
		j_u64(j, "live", s->live);
		j_u64(j, "stale", s->stale);
		j_u64(j, "dead", s->dead);
		if (s->producer >= 0)
			j_u64(j, "producer_pid", s->producer_pid);
		else
			j_null(j, "producer_pid");
		j_u64(j, "depth", s->depth);
		j_u64(j, "claim_seq", s->claim_seq);
		j_u64(j, "pub_seq", s->pub_seq);
		if (s->label[0])
			j_str(j, "loader", s->label);
		else
			j_null(j, "loader");
	}
	j_close(j, '}');
}

/* ---- commands ------------------------------------------------------------ */

static int show_list(const struct opts *o)
{
	struct entries l;
	if (list_entries(&l))
		return EXIT_FAIL;
	struct snap *s = calloc(1, sizeof(*s));
	if (!s) {
		free(l.v);
		fprintf(stderr, PROG ": out of memory\n");
		return EXIT_FAIL;
	}
	struct jw j;
	int w = name_width(&l);
	if (o->json) {
		j_begin(&j);
		j_open(&j, "sessions", '[');
	} else if (l.n == 0) {
		printf("no tsshim sessions for uid %u\n", (unsigned)getuid());
	} else {
		printf("%-*s  %-12s  %8s  %10s  %s\n", w, "NAME", "MEMBERS", "PRODUCER", "HEAD",
		       "STATE");
	}
	for (size_t i = 0; i < l.n; i++) {
		char why[160] = "";
		int r = load_session(l.v[i].path, s, why, sizeof(why));
		int bad = r != 0;
		if (bad && !why[0])
			snprintf(why, sizeof(why), "%s", strerror(-r));
		if (o->json)
			json_list_item(&j, &l.v[i], s, bad ? why : NULL);
		else
			text_list_row(w, &l.v[i], s, bad ? why : NULL);
	}
	if (o->json) {
		j_close(&j, ']');
		j_end(&j);
	}
	free(s);
	free(l.v);
	return EXIT_OK;
}

/* The user's NAME, safe to echo on one line. */
static const char *printable(char *buf, size_t n, const char *s)
{
	size_t i = 0;
	for (; s[i] && i + 1 < n; i++)
		buf[i] = s[i] >= 0x20 && s[i] < 0x7f ? s[i] : '?';
	buf[i] = '\0';
	return buf;
}

static int cache_view_fn(void *arg)
{
	struct snap *s = arg;
	char why[160];
	return ts_cache_view(s->cache_path, &s->cache, why, sizeof(why));
}

/* The session's decoded-image cache, if any: its counters join the session's. */
static void load_cache(const char *name, struct snap *s)
{
	s->has_cache = ts_cache_path(s->cache_path, sizeof(s->cache_path), getuid(), name) == 0 &&
		       bus_guarded(cache_view_fn, s) == 0;
	if (s->has_cache) {
		s->decodes_shared += s->cache.hits;
		s->cpu_ns_saved += s->cache.saved_decode_ns;
	}
}

struct gpu_args {
	const struct ts_gpu_table *t;
	size_t size;
	struct snap *s;
};

static int gpu_read_fn(void *arg)
{
	struct gpu_args *a = arg;
	struct snap *s = a->s;
	int ret = ts_gpuring_valid(a->t, a->size, (uint32_t)getuid());
	if (ret)
		return ret;
	const struct ts_gpu_counters *c = &a->t->counters;
	s->gpu_kept = LOAD(&c->batches_kept);
	s->gpu_kept_bytes = LOAD(&c->bytes_kept);
	s->gpu_served = LOAD(&c->uploads_served);
	s->gpu_served_bytes = LOAD(&c->bytes_served);
	s->gpu_bufs = LOAD(&c->buffers_live);
	s->gpu_buf_bytes = LOAD(&c->buffer_bytes);
	s->gpu_replaced = LOAD(&c->replaced);
	return 0;
}

/* The feed's GPU ring, read-only: mapped, validated, its counters copied. */
static void load_gpu(const char *name, struct snap *s)
{
	char path[TS_PATH_MAX];
	struct stat sb;
	if (!s->has_session || ts_gpuring_path(path, sizeof(path), name, s->created_unix_ns))
		return;
	int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return;
	if (fstat(fd, &sb) || ts_shm_file_ours(&sb) || (size_t)sb.st_size < sizeof(struct ts_gpu_table)) {
		close(fd);
		return;
	}
	const struct ts_gpu_table *t = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_SHARED, fd, 0);
	close(fd);
	if (t == MAP_FAILED)
		return;
	struct gpu_args a = {.t = t, .size = (size_t)sb.st_size, .s = s};
	s->has_gpu = bus_guarded(gpu_read_fn, &a) == 0;
	munmap((void *)t, (size_t)sb.st_size);
}

static int show_one(const struct opts *o)
{
	char path[TS_PATH_MAX], why[160] = "", shown[80];
	if (!ts_session_name_valid(o->name)) {
		fprintf(stderr, PROG ": invalid session name '%s' (1..%u characters of "
			"[A-Za-z0-9._-], not starting with '.')\n",
			printable(shown, sizeof(shown), o->name), TS_NAME_MAX - 1);
		return EXIT_FAIL;
	}
	if (ts_segment_path(path, sizeof(path), getuid(), o->name) != 0) {
		fprintf(stderr, PROG ": session name '%s' too long\n", o->name);
		return EXIT_FAIL;
	}
	struct snap *s = calloc(1, sizeof(*s));
	if (!s) {
		fprintf(stderr, PROG ": out of memory\n");
		return EXIT_FAIL;
	}
	int ret = load_session(path, s, why, sizeof(why));
	s->has_session = ret == 0;
	load_cache(o->name, s);
	load_gpu(o->name, s);
	if (ret == -ENOENT && s->has_cache) {
		snprintf(s->name, sizeof(s->name), "%s", o->name);
		ret = 0; /* exact mode with no member: the cache alone is the session */
	}
	if (ret == -ENOENT)
		fprintf(stderr, PROG ": no session '%s' (%s does not exist)\n", o->name, path);
	else if (ret)
		fprintf(stderr, PROG ": session '%s': %s\n", o->name, why[0] ? why : strerror(-ret));
	else if (o->json)
		json_session(s);
	else
		text_session(s);
	free(s);
	return ret ? EXIT_FAIL : EXIT_OK;
}

static int show(const struct opts *o)
{
	return o->name ? show_one(o) : show_list(o);
}

/* Wait `sec` seconds; 1 if SIGINT/SIGTERM (blocked by the caller) arrived. */
static int stop_requested(const sigset_t *stop, double sec)
{
	uint64_t deadline = ts_prim_monotonic_ns() + (uint64_t)(sec * 1e9);
	for (;;) {
		uint64_t now = ts_prim_monotonic_ns();
		if (now >= deadline)
			return 0;
		uint64_t left = deadline - now;
		struct timespec ts = {.tv_sec = (time_t)(left / 1000000000u),
				      .tv_nsec = (long)(left % 1000000000u)};
		if (sigtimedwait(stop, NULL, &ts) > 0)
			return 1;
		if (errno != EINTR && errno != EAGAIN)
			return 1;
	}
}

/*
 * Signals are blocked and taken with sigtimedwait(), so a Ctrl-C ends the
 * loop between two refreshes, never in the middle of one.
 */
static int watch(const struct opts *o)
{
	sigset_t stop, old;
	sigemptyset(&stop);
	sigaddset(&stop, SIGINT);
	sigaddset(&stop, SIGTERM);
	sigprocmask(SIG_BLOCK, &stop, &old);
	int ret = EXIT_OK;
	for (long n = 0; o->count == 0 || n < o->count; n++) {
		if (n > 0 && stop_requested(&stop, o->interval))
			break;
		if (!o->json) {
			char clock[16] = "";
			time_t t = time(NULL);
			struct tm tm;
			if (localtime_r(&t, &tm))
				strftime(clock, sizeof(clock), "%H:%M:%S", &tm);
			printf("\033[H\033[2J" PROG ": every %gs, %s (Ctrl-C quits)\n\n", o->interval,
			       clock);
		}
		fflush(stdout);
		ret = show(o);
		fflush(stdout);
	}
	sigprocmask(SIG_SETMASK, &old, NULL);
	return ret;
}

/*
 * 1 removed, 0 left alone (reason in e->left: live, or unreadable and so
 * not ours to judge), -1 an error while removing a readable segment.
 */
struct clean_args {
	struct ts_view *v;
	const char *path;
	char *why;
	size_t whylen;
	uint64_t *inc;
};

static int clean_look_fn(void *arg)
{
	struct clean_args *a = arg;
	int r = ts_view_open(a->v, a->path, a->why, a->whylen);
	if (r == 0) {
		char ignored[160];
		/* the incarnation whose feed files go with it, should it be removed */
		if (ts_segment_validate(a->v->seg, a->v->map_size, getuid(), ignored, sizeof(ignored)) == 0)
			*a->inc = a->v->seg->st.created_unix_ns;
		ts_view_close(a->v);
	}
	return r;
}

static int clean_one(struct entry *e)
{
	char why[160] = "";
	struct ts_view v;
	uint64_t inc = 0;
	/* Open it first for a readable reason: remove_if_stale only says -errno. */
	struct clean_args a = {.v = &v, .path = e->path, .why = why, .whylen = sizeof(why), .inc = &inc};
	int r = bus_guarded(clean_look_fn, &a);
	if (r == -EBADMSG && !why[0])
		snprintf(why, sizeof(why), "truncated while being read");
	if (r == -ENOENT)
		return 0; /* gone meanwhile */
	if (r == 0)
		r = ts_session_remove_if_stale(e->path);
	if (r == 1) {
		/* A feed's ledger and batch files live beside its segment; gone
		 * with it, nothing can reach them any more. */
		ts_feed_clean_stale(e->name, inc);
		return 1;
	}
	if (r == 0)
		snprintf(e->left, sizeof(e->left), "has live members");
	else if (why[0])
		snprintf(e->left, sizeof(e->left), "corrupt: %s", why);
	else if (r == -ETIMEDOUT)
		snprintf(e->left, sizeof(e->left), "locked by a member; try again");
	else {
		snprintf(e->left, sizeof(e->left), "%s", strerror(-r));
		return -1;
	}
	return 0;
}

/*
 * Decoded-image caches whose users are all dead (every job of an exact-mode
 * session killed): no session segment names them, so the sweep above never
 * saw them, and up to 8 GiB of /dev/shm stayed. Only NAME's if given.
 * Their session names, for the report, in `removed` (count returned).
 */
#define MAX_CACHES_REPORTED 64
static int clean_caches(const char *only, char removed[][TS_NAME_MAX])
{
	char prefix[64], path[TS_PATH_MAX];
	int plen = snprintf(prefix, sizeof(prefix), TS_CACHE_PREFIX "%u.", (unsigned)getuid()), n = 0;
	DIR *d = opendir(ts_shm_dir());
	if (!d)
		return 0;
	struct dirent *e;
	while ((e = readdir(d)) != NULL) {
		const char *name = e->d_name + plen;
		if (strncmp(e->d_name, prefix, (size_t)plen) != 0 || !ts_session_name_valid(name) ||
		    (only && strcmp(only, name) != 0) ||
		    ts_cache_path(path, sizeof(path), getuid(), name) != 0)
			continue;
		if (ts_cache_remove_if_stale(path) == 1 && n < MAX_CACHES_REPORTED)
			snprintf(removed[n++], TS_NAME_MAX, "%s", name);
	}
	closedir(d);
	return n;
}

static void clean_json(const struct entries *l, int tmp, char caches[][TS_NAME_MAX], int ncaches)
{
	struct jw j;
	j_begin(&j);
	j_open(&j, "clean", '{');
	j_open(&j, "removed", '[');
	for (size_t i = 0; i < l->n; i++)
		if (l->v[i].removed)
			j_str(&j, NULL, l->v[i].name);
	j_close(&j, ']');
	j_open(&j, "left", '[');
	for (size_t i = 0; i < l->n; i++) {
		if (!l->v[i].left[0])
			continue;
		j_open(&j, NULL, '{');
		j_str(&j, "name", l->v[i].name);
		j_str(&j, "reason", l->v[i].left);
		j_close(&j, '}');
	}
	j_close(&j, ']');
	j_u64(&j, "temp_files_removed", tmp > 0 ? (uint64_t)tmp : 0);
	j_open(&j, "caches_removed", '[');
	for (int i = 0; i < ncaches; i++)
		j_str(&j, NULL, caches[i]);
	j_close(&j, ']');
	j_close(&j, '}');
	j_end(&j);
}

static void clean_text(const struct entries *l, int tmp, char caches[][TS_NAME_MAX], int ncaches)
{
	int any = tmp > 0;
	for (size_t i = 0; i < l->n; i++) {
		if (l->v[i].removed)
			printf("removed  %s (every member dead)\n", l->v[i].name);
		any |= l->v[i].removed;
	}
	for (size_t i = 0; i < l->n; i++) {
		if (l->v[i].left[0])
			printf("left     %s (%s)\n", l->v[i].name, l->v[i].left);
		any |= l->v[i].left[0] != '\0';
	}
	if (tmp > 0)
		printf("removed  %d temporary file(s) of creators that died\n", tmp);
	for (int i = 0; i < ncaches; i++)
		printf("removed  %s: decoded-image cache, its users all dead\n", caches[i]);
	any |= ncaches > 0;
	if (!any)
		printf("nothing to clean\n");
}

static int clean(const struct opts *o)
{
	struct entries l;
	if (list_entries(&l))
		return EXIT_FAIL;
	int ret = EXIT_OK;
	for (size_t i = 0; i < l.n; i++) {
		if (o->name && strcmp(o->name, l.v[i].name) != 0)
			continue;
		int r = clean_one(&l.v[i]);
		l.v[i].removed = r == 1;
		if (r < 0)
			ret = EXIT_FAIL;
	}
	int tmp = ts_clean_temp_files();
	static char caches[MAX_CACHES_REPORTED][TS_NAME_MAX];
	int ncaches = clean_caches(o->name, caches);
	if (o->json)
		clean_json(&l, tmp, caches, ncaches);
	else
		clean_text(&l, tmp, caches, ncaches);
	free(l.v);
	return ret;
}

/* ---- command line -------------------------------------------------------- */

static void usage(FILE *f)
{
	fprintf(f,
		"usage: " PROG " [--json] [--watch [--interval SEC] [--count N]] [NAME]\n"
		"       " PROG " --clean [--json] [NAME]\n"
		"\n"
		"Show the tsshim sessions of the calling user (%s/" TS_SEG_PREFIX "<uid>.<name>)\n"
		"without changing them.\n"
		"\n"
		"  (no NAME)        one line per session: name, members, producer pid,\n"
		"                   ring head (pub_seq), state; a segment that fails\n"
		"                   validation is listed as \"corrupt: <reason>\"\n"
		"  NAME             one session: header, members (pid, role, state, ring\n"
		"                   attachment, lag in batches, batches read, heartbeat\n"
		"                   age), ring slots, counters\n"
		"  --json           the same data as one line of JSON (schema 1, see the\n"
		"                   comment at the top of tools/inspect.c)\n"
		"  --watch          refresh like top until Ctrl-C/SIGTERM (with --json:\n"
		"                   one JSON document per line per refresh)\n"
		"  --interval SEC   seconds between refreshes (default 1, 0.01..86400)\n"
		"  --count N        stop after N refreshes\n"
		"  --clean          remove sessions (only NAME if given) whose members\n"
		"                   are all dead (a DataLoader feed's files with them),\n"
		"                   decoded-image caches whose users are all dead, and\n"
		"                   temporary files of creators that died; never\n"
		"                   touches a live or unreadable session\n"
		"  -h, --help       this text\n"
		"\n"
		"Member states: live; stale (alive but silent for longer than the\n"
		"session timeout); dead (the process is gone).\n"
		"\n"
		"Exit status:\n"
		"  0  success (a list that shows corrupt segments is still a success;\n"
		"     --clean that leaves live or corrupt segments alone, with the\n"
		"     reason printed, is a success)\n"
		"  1  NAME does not exist, is invalid, corrupt, foreign-owned or from\n"
		"     another tsshim build; the session directory cannot be read;\n"
		"     --clean failed to remove a dead session\n"
		"  2  usage error\n",
		ts_shm_dir());
}

static int usage_error(const char *fmt, const char *arg)
{
	fprintf(stderr, PROG ": ");
	fprintf(stderr, fmt, arg);
	fputc('\n', stderr);
	usage(stderr);
	return -1;
}

/* 0: run, 1: --help done, -1: usage error (already reported). */
static int parse_args(int argc, char **argv, struct opts *o)
{
	enum { O_JSON = 256, O_WATCH, O_INTERVAL, O_COUNT, O_CLEAN };
	static const struct option longopts[] = {
		{"json", no_argument, NULL, O_JSON},
		{"watch", no_argument, NULL, O_WATCH},
		{"interval", required_argument, NULL, O_INTERVAL},
		{"count", required_argument, NULL, O_COUNT},
		{"clean", no_argument, NULL, O_CLEAN},
		{"help", no_argument, NULL, 'h'},
		{0},
	};
	int c, interval_set = 0, count_set = 0;
	char *end;
	*o = (struct opts){.interval = 1.0};
	opterr = 0;
	while ((c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
		switch (c) {
		case O_JSON: o->json = 1; break;
		case O_WATCH: o->watch = 1; break;
		case O_CLEAN: o->clean = 1; break;
		case 'h': usage(stdout); return 1;
		case O_INTERVAL:
			o->interval = strtod(optarg, &end);
			if (end == optarg || *end || !(o->interval >= 0.01 && o->interval <= 86400))
				return usage_error("invalid --interval '%s' (seconds, 0.01..86400)", optarg);
			interval_set = 1;
			break;
		case O_COUNT:
			errno = 0;
			o->count = strtol(optarg, &end, 10);
			if (errno || end == optarg || *end || o->count < 1)
				return usage_error("invalid --count '%s' (a positive integer)", optarg);
			count_set = 1;
			break;
		case ':':
			return usage_error("option '%s' needs a value", argv[optind - 1]);
		default: /* a short one inside a cluster (-xh) is not argv[optind - 1] itself */
			if (optopt && optopt != '?') {
				char opt[3] = { '-', (char)optopt, '\0' };
				return usage_error("unknown option '%s'", opt);
			}
			return usage_error("unknown option '%s'", argv[optind - 1]);
		}
	}
	if (optind < argc)
		o->name = argv[optind++];
	if (optind < argc)
		return usage_error("unexpected argument '%s' (one NAME at most)", argv[optind]);
	if ((interval_set || count_set) && !o->watch)
		return usage_error("%s needs --watch", interval_set ? "--interval" : "--count");
	if (o->clean && o->watch)
		return usage_error("%s", "--clean and --watch do not mix");
	return 0;
}

int main(int argc, char **argv)
{
	struct opts o;
	int r = parse_args(argc, argv, &o);
	if (r)
		return r > 0 ? EXIT_OK : EXIT_USAGE;
	struct sigaction sa = {.sa_handler = on_sigbus};
	sigemptyset(&sa.sa_mask);
	sigaction(SIGBUS, &sa, NULL);
	int ret = o.clean ? clean(&o) : o.watch ? watch(&o) : show(&o);
	if (fflush(stdout) != 0 || ferror(stdout)) {
		fprintf(stderr, PROG ": cannot write output: %s\n", strerror(errno));
		return EXIT_FAIL;
	}
	return ret;
}
