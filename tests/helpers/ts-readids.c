/* SPDX-License-Identifier: MIT */
/*
 * ts-readids: tsshim_feed_read_ids through the shim's feed API (run with the
 * shim preloaded, TSSHIM_SESSION set). The PyTorch layer picks the samples
 * its epoch lacks out of the stream by these ids, so each must be the
 * dataset index of the sample at that place in what the read brought.
 * One process is the producer (handle p) and a consumer (handle c):
 *
 *   1. batch A (ids 10..13) is published; c asks for 8 samples with no
 *      wait and gets A's 4 (-ETIMEDOUT); batch B (ids 20..23) is
 *      published and the same read, called again, completes;
 *   2. batch C (ids 30..33) is published and read as a view.
 *
 * Prints "copy 10 11 12 13 20 21 22 23 view 30 31 32 33" (the ids each read
 * got) and exits 0, or says what failed and exits 1 (2: not runnable).
 */
#include <dlfcn.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SAMPLES 4
#define SAMPLE_BYTES 64u

static int (*f_open)(const char *, const char *, uint64_t);
static void (*f_close)(int);
static int (*f_attach)(int, int);
static int (*f_epoch_begin)(int);
static int (*f_publish)(int, uint32_t, uint32_t, uint64_t, const uint64_t *, const void *const *, const int64_t *,
			uint64_t, const char *, uint32_t, uint64_t, uint32_t);
static int (*f_next)(int, uint32_t, uint32_t *, uint64_t *, uint64_t *, uint64_t *, char *, uint32_t *);
static int (*f_read)(int, uint32_t, const uint64_t *, void *const *, uint64_t *, int *, uint32_t);
static int (*f_read_view)(int, uint32_t, const uint64_t *, void **, uint64_t *, int *, uint64_t *, uint32_t);
static int (*f_release)(int, uint64_t);
static int (*f_read_ids)(int, int64_t *, uint64_t, uint64_t *);

#define SYM(v, name) (*(void **)&(v) = dlsym(RTLD_DEFAULT, name))

/* Publish SAMPLES samples with ids first.., and move p's own reader past them. */
static int publish(int p, int64_t first)
{
	static char buf[SAMPLES * SAMPLE_BYTES];
	uint64_t len = sizeof(buf), got = 0;
	int64_t idx[SAMPLES];
	int eoe;
	for (int k = 0; k < SAMPLES; k++)
		idx[k] = first + k;
	memset(buf, (int)first, sizeof(buf));
	const void *src[1] = { buf };
	int ret = f_publish(p, 1, 0, SAMPLES, &len, src, idx, 1, "x", 1, 0, 1000);
	if (ret == 0)
		f_read(p, 1, &len, NULL, &got, &eoe, 0);
	return ret;
}

/* Append the ids of c's last read to out; how many it had. */
static uint64_t ids_of(int c, char *out, size_t cap)
{
	int64_t ids[3 * SAMPLES];
	uint64_t n = 0;
	int ret = f_read_ids(c, ids, 3 * SAMPLES, &n);
	if (ret) {
		snprintf(out + strlen(out), cap - strlen(out), " error%d", ret);
		return 0;
	}
	for (uint64_t j = 0; j < n; j++)
		snprintf(out + strlen(out), cap - strlen(out), " %lld", (long long)ids[j]);
	return n;
}

int main(void)
{
	if (!SYM(f_open, "tsshim_feed_open") || !SYM(f_close, "tsshim_feed_close") ||
	    !SYM(f_attach, "tsshim_feed_attach") || !SYM(f_epoch_begin, "tsshim_feed_epoch_begin") ||
	    !SYM(f_publish, "tsshim_feed_publish") || !SYM(f_next, "tsshim_feed_next") ||
	    !SYM(f_read, "tsshim_feed_read") || !SYM(f_read_view, "tsshim_feed_read_view") ||
	    !SYM(f_release, "tsshim_feed_release_view") || !SYM(f_read_ids, "tsshim_feed_read_ids")) {
		fprintf(stderr, "usage: ts-readids (with the shim preloaded)\n");
		return 2;
	}
	int p = f_open("ri", "readids", 100), c = f_open("ri", "readids", 100);
	if (p < 0 || c < 0 || f_attach(c, 0) || f_epoch_begin(c) || publish(p, 10)) {
		fprintf(stderr, "ts-readids: set-up failed (handles %d %d)\n", p, c);
		return 2;
	}
	/* the sample size, as the layer learns it before it reads */
	uint32_t npos, slen;
	uint64_t ns, se, sb[16];
	char schema[8192];
	if (f_next(c, 1000, &npos, &ns, &se, sb, schema, &slen)) {
		fprintf(stderr, "ts-readids: tsshim_feed_next failed\n");
		return 2;
	}
	static char dst[2 * SAMPLES * SAMPLE_BYTES];
	void *dsts[1] = { dst };
	uint64_t want = sizeof(dst), got = 0;
	int eoe = 0, bad = 0;
	int first = f_read(c, 1, &want, dsts, &got, &eoe, 0);
	if (first != -ETIMEDOUT || got != SAMPLES * SAMPLE_BYTES) {
		fprintf(stderr, "ts-readids: the first call got %llu bytes (%d), not batch A alone\n",
			(unsigned long long)got, first);
		bad = 1;
	}
	if (publish(p, 20) || f_read(c, 1, &want, dsts, &got, &eoe, 1000) || got != want) {
		fprintf(stderr, "ts-readids: the read did not complete with batch B\n");
		return 2;
	}
	char out[512] = "copy";
	ids_of(c, out, sizeof(out));
	void *ptr;
	uint64_t id, vwant = SAMPLES * SAMPLE_BYTES, vgot = 0;
	if (publish(p, 30) || f_read_view(c, 1, &vwant, &ptr, &vgot, &eoe, &id, 1000)) {
		fprintf(stderr, "ts-readids: the view of batch C failed\n");
		return 2;
	}
	strcat(out, " view");
	ids_of(c, out, sizeof(out));
	f_release(c, id);
	printf("%s\n", out);
	f_close(c);
	f_close(p);
	return bad || strcmp(out, "copy 10 11 12 13 20 21 22 23 view 30 31 32 33") != 0;
}
