/* SPDX-License-Identifier: MIT */
/*
 * Writes the seed corpora of the fuzz targets (tests/fuzz/corpus/<target>/):
 * a real session segment and a real decoded-image cache made with the core
 * API, valid configurations, and ring scripts. `make fuzz-seeds` runs it;
 * the output is checked in. Inputs found by fuzzing that exposed a bug are
 * added to the corpus by hand, named regress-*.
 *
 *   mkseeds DIR      writes DIR/segment, DIR/config, DIR/ring, DIR/feed, DIR/gpuring
 */
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cache.h"
#include "config.h"
#include "gpuring.h"
#include "ring.h"
#include "session.h"

static const char *outdir;

static void put(const char *target, const char *name, const void *a, size_t an, const void *b, size_t bn)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/%s", outdir, target);
	mkdir(path, 0755);
	snprintf(path, sizeof(path), "%s/%s/%s", outdir, target, name);
	FILE *f = fopen(path, "wb");
	if (!f || fwrite(a, 1, an, f) != an || (bn && fwrite(b, 1, bn, f) != bn) || fclose(f) != 0) {
		perror(path);
		exit(1);
	}
}

/* The file's bytes without trailing zeros (the fuzzer zero-extends again). */
static unsigned char *slurp(const char *path, size_t *n)
{
	int fd = open(path, O_RDONLY);
	struct stat sb;
	if (fd < 0 || fstat(fd, &sb) != 0) {
		perror(path);
		exit(1);
	}
	unsigned char *buf = malloc((size_t)sb.st_size);
	if (!buf || pread(fd, buf, (size_t)sb.st_size, 0) != sb.st_size) {
		perror(path);
		exit(1);
	}
	close(fd);
	size_t len = (size_t)sb.st_size;
	while (len && !buf[len - 1])
		len--;
	*n = len;
	return buf;
}

/* ---- segment ------------------------------------------------------------- */

static void segment_seeds(void)
{
	struct ts_session s;
	char name[TS_NAME_MAX];
	snprintf(name, sizeof(name), "fuzzseed-%u", (unsigned)getpid());
	struct ts_session_params p = { .depth = 4, .timeout_ms = 1000, .label = "ImageFolder('/data/train') seed" };
	if (ts_session_join(&s, name, &p) != 0) {
		fprintf(stderr, "mkseeds: join: %s\n", s.why);
		exit(1);
	}
	struct ts_ring_writer w;
	struct ts_batch_meta *m;
	if (ts_ring_writer_init(s.seg, s.self, &w) != 0)
		exit(1);
	for (unsigned b = 0; b < 6; b++) {
		if (ts_ring_begin(s.seg, &w, 1000000000ull, &m) != 0)
			exit(1);
		m->npos = 2;
		m->nsamples = 8;
		m->len[0] = 8 * 3 * 32 * 32;
		m->len[1] = 8 * 8;
		m->tag = b * 8;
		m->flags = b == 3 ? TS_BATCH_END_OF_EPOCH : 0;
		if (ts_ring_publish(s.seg, &w) != 0)
			exit(1);
	}
	atomic_fetch_add(&s.seg->counters.batches_shared, 5);
	/* one open claim: a slot in WRITING state */
	if (ts_ring_begin(s.seg, &w, 1000000000ull, &m) != 0)
		exit(1);
	m->npos = 2;
	m->nsamples = 8;
	size_t n;
	unsigned char *img = slurp(s.path, &n);
	struct ts_segment *seg = (struct ts_segment *)img;
	/* members whose pids the fuzzer's fake liveness calls alive (FAKE_PID0 = 100) */
	seg->members[0].pid = 100;
	seg->members[0].start_time = 300;
	seg->members[1].pid = 101;
	seg->members[1].start_time = 303;
	seg->members[1].attach = 3;
	seg->members[1].read_seq = 4;
	seg->members[2].pid = 4242; /* dead */
	seg->members[2].start_time = 1;
	if (n < offsetof(struct ts_segment, members) + 3 * sizeof(struct ts_member))
		n = offsetof(struct ts_segment, members) + 3 * sizeof(struct ts_member);
	ts_session_leave(&s);
	unlink(s.path);

	static const struct { const char *name; unsigned char flags; } v[] = {
		{ "inspect-valid", 4 | 8 },
		{ "inspect-extra-page", 4 | 8 | 16 },
		{ "inspect-mode-0640", 4 | 8 | 32 },
		{ "inspect-no-fixup", 4 },
		{ "join-valid", 1 | 4 | 8 },
		{ "join-valid-want3", 1 | 4 | 8 | (2 << 6) },
		{ "validate-valid", 3 | 4 | 8 },
	};
	for (unsigned i = 0; i < sizeof(v) / sizeof(v[0]); i++)
		put("segment", v[i].name, &v[i].flags, 1, img, n);
	unsigned char raw = 0;
	put("segment", "raw-static-only", &raw, 1, img, sizeof(struct ts_static));
	put("segment", "raw-truncated-header", &raw, 1, img, 100);
	unsigned char fix = 8;
	put("segment", "raw-header-fixup", &fix, 1, img, sizeof(struct ts_static) + 64);
	free(img);
}

/* ---- decoded-image cache --------------------------------------------------- */

static void cache_seeds(void)
{
	struct ts_cache c;
	char name[TS_NAME_MAX], why[160];
	snprintf(name, sizeof(name), "fuzzseed-%u", (unsigned)getpid());
	memset(&c, 0, sizeof(c));
	if (ts_cache_open(&c, name, 1u << 20, why, sizeof(why)) != 0) {
		fprintf(stderr, "mkseeds: cache: %s\n", why);
		exit(1);
	}
	ts_cache_set_scope(&c, "/data/train");
	char path[TS_PATH_MAX];
	ts_cache_path(path, sizeof(path), getuid(), name);
	size_t n;
	unsigned char *img = slurp(path, &n);
	ts_cache_close(&c);
	unlink(path);
	unsigned char flags = 2 | 4 | 8;
	put("segment", "cache-valid", &flags, 1, img, n);
	flags = 2 | 4;
	put("segment", "cache-no-fixup", &flags, 1, img, n);
	flags = 2 | 8;
	put("segment", "cache-truncated", &flags, 1, img, n);
	free(img);
}

/* ---- config ------------------------------------------------------------------ */

static void config_seed(const char *name, const char *const *kv, size_t nkv)
{
	unsigned char buf[4096];
	size_t n = 0;
	buf[n++] = 0xff; /* a 256-byte message buffer */
	for (size_t i = 0; i < nkv; i += 2) {
		unsigned sel = 9; /* an unknown name */
		for (unsigned k = 0; ts_config_vars[k]; k++)
			if (strcmp(kv[i], ts_config_vars[k]) == 0)
				sel = k;
		buf[n++] = (unsigned char)sel;
		size_t l = strlen(kv[i + 1]);
		memcpy(buf + n, kv[i + 1], l + 1);
		n += l + 1;
	}
	put("config", name, buf, n, NULL, 0);
}

#define SEED(name, ...)                                                            \
	do {                                                                       \
		static const char *const kv[] = { __VA_ARGS__ };                   \
		config_seed(name, kv, sizeof(kv) / sizeof(kv[0]));                \
	} while (0)

static void config_seeds(void)
{
	SEED("empty", "TSSHIM_NONE", "x");
	SEED("all-valid", "TSSHIM_MODE", "socket", "TSSHIM_DEPTH", "4", "TSSHIM_DATA", "/data/train:/data/val/",
	     "TSSHIM_SESSION", "sweep-1.a_b", "TSSHIM_CACHE_MB", "8192", "TSSHIM_TIMEOUT_MS", "1000",
	     "TSSHIM_PYTHON", "0", "TSSHIM_PREFETCH", "warm", "TSSHIM_LOG", "debug");
	SEED("exact-bounds", "TSSHIM_MODE", "exact", "TSSHIM_DEPTH", "64", "TSSHIM_CACHE_MB", "1048576",
	     "TSSHIM_TIMEOUT_MS", "600000", "TSSHIM_LOG", "error");
	SEED("off-min", "TSSHIM_MODE", "off", "TSSHIM_DEPTH", "1", "TSSHIM_CACHE_MB", "0", "TSSHIM_TIMEOUT_MS", "10",
	     "TSSHIM_PREFETCH", "off", "TSSHIM_PYTHON", "1", "TSSHIM_LOG", "info");
	SEED("data-16-roots", "TSSHIM_DATA", "/a:/b:/c:/d:/e:/f:/g:/h:/i:/j:/k:/l:/m:/n:/o:/");
	SEED("bad-depth", "TSSHIM_DEPTH", "65");
	SEED("bad-overflow", "TSSHIM_CACHE_MB", "99999999999999999999999");
	SEED("bad-session", "TSSHIM_SESSION", "-x\ty");
	SEED("bad-data", "TSSHIM_DATA", "/ok::relative");
	SEED("bad-mode-long", "TSSHIM_MODE",
	     "sockets-sockets-sockets-sockets-sockets-sockets-sockets-sockets-sockets-sockets");
}

/* ---- ring ----------------------------------------------------------------------- */

/*
 * Ring scripts (fuzz_ring.c): depth-1, members-2, npos-1, unit bytes, then
 * ops: low nibble the operation, high nibble the member.
 */
#define OP(op, who) (unsigned char)((op) | (who) << 4)
enum { BEGIN = 0, COMMIT = 1, PRODUCE = 2, ATTACH = 3, PEEK = 4, ADVANCE = 5, READ = 6, DETACH = 7, KILL = 8,
       BEAT = 9, CLOCK = 10, TAKEOVER = 11, EVICT = 12, SLOTMETA = 13, WAITNEXT = 14 };

static void ring_seeds(void)
{
	/* depth 4, 3 members, 2 positions (12 and 4 bytes a sample) */
	static const unsigned char basic[] = {
		3, 1, 1, 11, 3,
		OP(ATTACH, 1), 0, OP(ATTACH, 2), 0,
		OP(PRODUCE, 0), 7, OP(PRODUCE, 0), 7, OP(PRODUCE, 0), 7,
		OP(READ, 1), 4, 1,          /* 5 samples, advance all */
		OP(READ, 2), 9, 0, 3, 0,    /* 10 samples, advance 3 */
		OP(PRODUCE, 0), 0x40 | 3,   /* end of epoch */
		OP(READ, 1), 127, 1, OP(READ, 2), 127, 1,
		OP(PRODUCE, 0), 7, OP(PRODUCE, 0), 7,
		OP(SLOTMETA, 0), 0, OP(WAITNEXT, 1),
		OP(READ, 1), 0x80, 0x10, 0x00, 1,   /* 17 samples via a 16-bit count */
	};
	put("ring", "basic", basic, sizeof(basic), NULL, 0);
	/* depth 1, 2 members, 1 position: every batch waits for the consumer */
	static const unsigned char depth1[] = {
		0, 0, 0, 0,
		OP(ATTACH, 1), 0,
		OP(PRODUCE, 0), 2, OP(PRODUCE, 0), 2,
		OP(READ, 1), 1, 1, OP(PRODUCE, 0), 2, OP(READ, 1), 0, 0, 1, 0, OP(READ, 1), 3, 1,
		OP(PRODUCE, 0), 2,
	};
	put("ring", "depth1", depth1, sizeof(depth1), NULL, 0);
	/* takeover mid-claim, a dead laggard, the clock, late attach behind the head */
	static const unsigned char takeover[] = {
		7, 2, 2, 5, 1, 2,
		OP(ATTACH, 1), 0, OP(ATTACH, 2), 0,
		OP(PRODUCE, 0), 3, OP(PRODUCE, 0), 3,
		OP(BEGIN, 0), 3, OP(TAKEOVER, 0), 3, OP(PRODUCE, 0), 3,
		OP(15, 0) /* abort */, OP(KILL, 2), OP(CLOCK, 0), 0, 0x40,
		OP(PRODUCE, 0), 3, OP(READ, 1), 2, 1, OP(ATTACH, 2), 3, OP(READ, 2), 5, 1,
		OP(EVICT, 0), OP(PRODUCE, 0), 3, OP(DETACH, 1), OP(PRODUCE, 0), 3,
	};
	put("ring", "takeover", takeover, sizeof(takeover), NULL, 0);
	/* an arbitrary meta row and arbitrary want[] */
	static const unsigned char raw[] = {
		3, 1, 1, 3, 1,
		OP(ATTACH, 1), 0, OP(PRODUCE, 0), 0xc0, 2, 1, 1, 8, 1, 24, 1, 16, 0, 0,
		OP(READ, 1), 0xe0, 1, 24, 1, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0xc0, 1, 24, 1, 8,
	};
	put("ring", "raw-rows", raw, sizeof(raw), NULL, 0);
	/* huge samples near the 2^48 length limit */
	static const unsigned char huge[] = {
		15, 1, 1, 0x8f, 15, 0x81, 10,
		OP(ATTACH, 1), 0, OP(PRODUCE, 0), 63, OP(PRODUCE, 0), 63, OP(READ, 1), 0x80, 0xff, 0xff, 1,
	};
	put("ring", "huge-samples", huge, sizeof(huge), NULL, 0);
}

/* ---- feed ------------------------------------------------------------------------ */

/* fuzz_feed.c: a flags byte and no patch (the published header), one per way of reading. */
static void feed_seeds(void)
{
	static const struct { const char *name; unsigned char flags; } v[] = {
		{ "read-1", 0 }, { "view-1", 1 }, { "read-1-state", 2 }, { "read-4", 3 << 2 }, { "view-2-state", 1 | 2 | 1 << 2 },
	};
	for (unsigned i = 0; i < sizeof(v) / sizeof(v[0]); i++)
		put("feed", v[i].name, &v[i].flags, 1, NULL, 0);
	/* and one patch that keeps the header as it is: npos 2 at offset 48 */
	static const unsigned char same[] = { 0, 48, 0, 4, 2, 0, 0, 0 };
	put("feed", "patch-npos-same", same, sizeof(same), NULL, 0);
}

/* ---- GPU ring ------------------------------------------------------------------- */

/*
 * GPU ring scripts (fuzz_gpuring.c): depth-1, members-2, then ops: low
 * nibble the operation, high nibble the member (8..15 with CLOCK moves the
 * clock; 15 with CLAIM scribbles).
 */
enum { G_ADD = 0, G_REMOVE = 1, G_RECLAIM = 2, G_BEGIN = 3, G_READY = 4, G_DROP = 5, G_HOLD = 6, G_HOLDAGAIN = 7,
       G_UNHOLD = 8, G_UNHOLDALL = 9, G_KILL = 10, G_CLOCK = 11, G_HELD = 12, G_PENDING = 13, G_PRODUCE = 14,
       G_CLAIM = 15 };

static void gpuring_seeds(void)
{
	/* depth 4, 3 members: publish, hold, a neighbour seq, begin and ready by hand, drop */
	static const unsigned char basic[] = {
		3, 1,
		OP(G_PRODUCE, 0), 5, 0,
		OP(G_HOLD, 1), 1, 1, OP(G_HELD, 2), 0, 1, 0, OP(G_HOLDAGAIN, 1), 1, 1,
		OP(G_HOLD, 2), 0x41, 1, OP(G_UNHOLD, 1), 0, 1, OP(G_PENDING, 0), 5,
		OP(G_ADD, 0), 0, 0x10, 0, OP(G_BEGIN, 0), 6, 0, 1, OP(G_PENDING, 0), 6,
		OP(G_READY, 0), 2, 0, 1, 0, 0, OP(G_HOLD, 1), 2, 1,
		OP(G_UNHOLDALL, 1), OP(G_DROP, 0), 2, OP(G_HOLD, 2), 2, 1,
	};
	put("gpuring", "basic", basic, sizeof(basic), NULL, 0);
	/* depth 2: the producer dies; its unheld record is reclaimed, the held one only once let go */
	static const unsigned char reclaim[] = {
		1, 1,
		OP(G_PRODUCE, 0), 0, 4, OP(G_PRODUCE, 0), 1, 4, OP(G_HOLD, 1), 0, 1,
		OP(G_KILL, 0), OP(G_RECLAIM, 0), OP(G_ADD, 2), 0, 1, 0,
		OP(G_UNHOLD, 1), 0, 0, OP(G_RECLAIM, 0), OP(G_KILL, 0), OP(G_CLOCK, 8), 0xff, 0xff,
		OP(G_HELD, 1), 0, 0, 1, OP(G_REMOVE, 2), 1, 0, OP(G_REMOVE, 2), 1, 1,
	};
	put("gpuring", "reclaim", reclaim, sizeof(reclaim), NULL, 0);
	/* another process claims records and dies half-way; a live one's claim stays */
	static const unsigned char claims[] = {
		3, 2,
		OP(G_CLAIM, 1), 0, OP(G_CLAIM, 2), 1, OP(G_ADD, 0), 0, 1, 0, OP(G_KILL, 1),
		OP(G_RECLAIM, 0), OP(G_ADD, 3), 0, 2, 0, OP(G_REMOVE, 0), 1, 0,
	};
	put("gpuring", "claims", claims, sizeof(claims), NULL, 0);
	/* layouts that do not fit, npos out of range, a wrong identity, a slot past the depth */
	static const unsigned char layouts[] = {
		7, 0,
		OP(G_ADD, 0), 0, 1, 0, OP(G_BEGIN, 0), 3, 0, 1,
		OP(G_READY, 0), 3, 0, 0x80, 0,
		OP(G_READY, 0), 3, 0, 0, 0xf0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
		OP(G_READY, 0), 3, 1, 1, 2, 3, 4, 5, 6, 7, 8, 0, 0,
		OP(G_READY, 0), 8, 0, 0, 0, OP(G_BEGIN, 0), 3, 0x90, 1, OP(G_READY, 0), 3, 0, 0, 0,
		OP(G_BEGIN, 0), 3, 0, 1, OP(G_READY, 0), 3, 0, 3, 1, 2, 3, 4, OP(G_HOLD, 1), 3, 1,
		OP(G_READY, 0), 3, 0, 0x80, 17, /* npos 17: reads 16 positions' bytes, past the end */
	};
	put("gpuring", "layouts", layouts, sizeof(layouts), NULL, 0);
	/* a consumer maps what it holds and lets go: in use until it unmaps; retired, then removed and reused */
	static const unsigned char mapped[] = {
		3, 1,
		OP(G_PRODUCE, 0), 5, 0, OP(G_HOLD, 1), 1, 3, OP(G_UNHOLD, 1), 0, 1,
		OP(G_HELD, 2), 0, 1, 2, OP(G_HELD, 0), 0, 1, 3, OP(G_REMOVE, 0), 0, 2,
		OP(G_HOLD, 2), 1, 1, OP(G_UNHOLD, 1), 0x40, 1, OP(G_HELD, 0), 0, 1, 2,
		OP(G_HOLD, 1), 1, 3, OP(G_KILL, 1), OP(G_HELD, 0), 0, 1, 2, OP(G_KILL, 1),
		OP(G_UNHOLD, 1), 0x60, 0, OP(G_UNHOLD, 1), 0, 1, OP(G_REMOVE, 0), 0, 0, OP(G_ADD, 0), 0, 1, 0,
	};
	put("gpuring", "mapped", mapped, sizeof(mapped), NULL, 0);
	/* a peer scribbles over a published slot's layout; holds must stay inside the buffer */
	unsigned char scribble[] = {
		3, 1,
		OP(G_PRODUCE, 0), 1, 0, OP(G_HOLD, 1), 1, 1,
		OP(G_CLAIM, 15), 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0, /* slot 1's len[0] */
		OP(G_HOLD, 1), 1, 1, OP(G_HOLD, 2), 1, 1, OP(G_RECLAIM, 0), OP(G_ADD, 0), 0, 1, 0,
	};
	scribble[9] = (unsigned char)(offsetof(struct ts_gpu_table, slots[1].len[0]) / 8);
	scribble[10] = (unsigned char)(offsetof(struct ts_gpu_table, slots[1].len[0]) / 8 >> 8);
	put("gpuring", "scribble", scribble, sizeof(scribble), NULL, 0);
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: mkseeds DIR\n");
		return 2;
	}
	outdir = argv[1];
	mkdir(outdir, 0755);
	segment_seeds();
	cache_seeds();
	config_seeds();
	ring_seeds();
	feed_seeds();
	gpuring_seeds();
	return 0;
}
