/* SPDX-License-Identifier: MIT */
/*
 * ts-viewkeep BATCHES: a producer and a consumer of one feed, in this
 * process; the consumer keeps every batch it reads (a program that appends
 * its batches to a list). Batches are 512 KiB, the ring 4 deep. Reads are
 * views while the files our views keep fit in a quarter of /dev/shm, copies
 * after; a view of a file the producer replaced keeps that file's pages.
 * tests/scenarios/shmfull.sh runs it in a small /dev/shm. Prints
 *
 *   published P views V copies C max_used_kib K error E
 *
 * (E: "none", or the call and errno that stopped it). Exit 0 when it ran,
 * 1 when the feed could not be opened, 2 on bad usage.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "feed.h"

#define SAMPLES 16
#define SAMPLE_BYTES 32768u

static unsigned long used_kib(void)
{
	struct statvfs v;
	if (statvfs("/dev/shm", &v))
		return 0;
	return (unsigned long)((v.f_blocks - v.f_bfree) * v.f_frsize / 1024);
}

int main(int argc, char **argv)
{
	int n = argc == 2 ? atoi(argv[1]) : 0;
	if (n < 1) {
		fprintf(stderr, "usage: ts-viewkeep BATCHES\n");
		return 2;
	}
	struct ts_session_params p = { .depth = 4, .timeout_ms = 1000, .label = "viewkeep" };
	struct ts_feed prod, cons;
	char name[64];
	snprintf(name, sizeof(name), "viewkeep-%d", (int)getpid());
	if (ts_feed_open(&prod, name, &p, 100000) || ts_feed_open(&cons, name, &p, 100000) ||
	    ts_feed_attach(&cons, 0)) {
		fprintf(stderr, "ts-viewkeep: cannot open the feed\n");
		return 1;
	}
	uint64_t len = SAMPLES * SAMPLE_BYTES;
	char *buf = malloc(len);
	if (!buf)
		return 1;
	int views = 0, copies = 0, published = 0;
	unsigned long max_used = used_kib();
	char error[64] = "none";
	for (int i = 0; i < n; i++) {
		int64_t idx[SAMPLES];
		for (int k = 0; k < SAMPLES; k++)
			idx[k] = (int64_t)i * SAMPLES + k;
		memset(buf, i, len);
		const void *src[1] = { buf };
		struct ts_feed_batch b = { .npos = 1, .nsamples = SAMPLES, .len = &len, .src = src, .index = idx,
					   .stream_epoch = 1, .schema = "x", .schema_len = 1 };
		int ret = ts_feed_publish(&prod, &b, 1000000000ull);
		if (ret) {
			snprintf(error, sizeof(error), "publish %d: %s", i, strerror(-ret));
			break;
		}
		published++;
		uint64_t got = 0;
		int eoe;
		ts_feed_read(&prod, 1, &len, NULL, &got, &eoe, 0); /* the producer skips its own batch */
		uint64_t want = len, id;
		void *ptr;
		ret = ts_feed_read_view(&cons, 1, &want, &ptr, &got, &eoe, &id, 1000000000ull);
		if (ret == -EXDEV) { /* copied: kept in the program's own memory */
			char *copy = malloc(len);
			void *dst[1] = { copy };
			ret = copy ? ts_feed_read(&cons, 1, &want, dst, &got, &eoe, 1000000000ull) : -ENOMEM;
			copies += !ret;
		} else {
			views += !ret; /* kept: never released */
		}
		if (ret) {
			snprintf(error, sizeof(error), "read %d: %s", i, strerror(-ret));
			break;
		}
		unsigned long u = used_kib();
		if (u > max_used)
			max_used = u;
	}
	printf("published %d views %d copies %d max_used_kib %lu error %s\n", published, views, copies, max_used,
	       error);
	ts_feed_close(&cons);
	ts_feed_close(&prod);
	return 0;
}
