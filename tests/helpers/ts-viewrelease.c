/* SPDX-License-Identifier: MIT */
/*
 * ts-viewrelease ROUNDS: views released after, or while, their feed closes,
 * through the shim's feed API (run with the shim preloaded, TSSHIM_SESSION
 * set). One process is both the producer (handle p) and a consumer (a
 * handle of its own per round) of one feed. Each round the consumer takes
 * 4 views; a second thread releases them while the main thread closes the
 * consumer's handle, as a tensor's finalizer may run in any thread. Then
 * every view's memory must be gone from /proc/self/maps, and the process
 * alive. Prints
 *
 *   rounds R views V left-mapped L bad-release B
 *
 * (L: views still mapped once released; B: releases that returned an
 * error). Exit 0 when it ran, 2 otherwise.
 */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define VIEWS 4
#define SAMPLES 4
#define SAMPLE_BYTES 8192u

static int (*f_open)(const char *, const char *, uint64_t);
static void (*f_close)(int);
static int (*f_attach)(int, int);
static int (*f_publish)(int, uint32_t, uint32_t, uint64_t, const uint64_t *, const void *const *, const int64_t *,
			uint64_t, const char *, uint32_t, uint64_t, uint32_t);
static int (*f_read)(int, uint32_t, const uint64_t *, void *const *, uint64_t *, int *, uint32_t);
static int (*f_read_view)(int, uint32_t, const uint64_t *, void **, uint64_t *, int *, uint64_t *, uint32_t);
static int (*f_release)(int, uint64_t);

struct job {
	int h;
	uint64_t id[VIEWS];
	_Atomic int go;
	int bad;
};

static void *releaser(void *arg)
{
	struct job *j = arg;
	while (!atomic_load(&j->go))
		;
	for (int i = 0; i < VIEWS; i++) {
		if (f_release(j->h, j->id[i]))
			j->bad++;
		usleep(50);
	}
	return NULL;
}

/* Is address p inside a mapping of this process? */
static int mapped(const void *p)
{
	FILE *m = fopen("/proc/self/maps", "r");
	char line[512];
	int in = 0;
	uintptr_t a = (uintptr_t)p, lo, hi;
	while (m && !in && fgets(line, sizeof(line), m))
		if (sscanf(line, "%lx-%lx", &lo, &hi) == 2 && a >= lo && a < hi)
			in = 1;
	if (m)
		fclose(m);
	return in;
}

#define SYM(v, name) (*(void **)&(v) = dlsym(RTLD_DEFAULT, name))

int main(int argc, char **argv)
{
	int rounds = argc == 2 ? atoi(argv[1]) : 0;
	if (rounds < 1 || !SYM(f_open, "tsshim_feed_open") || !SYM(f_close, "tsshim_feed_close") ||
	    !SYM(f_attach, "tsshim_feed_attach") || !SYM(f_publish, "tsshim_feed_publish") ||
	    !SYM(f_read, "tsshim_feed_read") || !SYM(f_read_view, "tsshim_feed_read_view") ||
	    !SYM(f_release, "tsshim_feed_release_view")) {
		fprintf(stderr, "usage: ts-viewrelease ROUNDS (with the shim preloaded)\n");
		return 2;
	}
	int p = f_open("vr", "viewrelease", 1u << 20);
	if (p < 0) {
		fprintf(stderr, "ts-viewrelease: tsshim_feed_open: %d\n", p);
		return 2;
	}
	static char buf[SAMPLES * SAMPLE_BYTES];
	uint64_t len = sizeof(buf), seq = 0;
	int views = 0, bad = 0, left = 0;
	void *bases[VIEWS];
	for (int r = 0; r < rounds; r++) {
		struct job j = { .h = f_open("vr", "viewrelease", 1u << 20) };
		if (j.h < 0 || f_attach(j.h, 0)) {
			fprintf(stderr, "ts-viewrelease: consumer handle: %d\n", j.h);
			return 2;
		}
		int n = 0;
		for (int v = 0; v < VIEWS; v++) {
			int64_t idx[SAMPLES];
			for (int k = 0; k < SAMPLES; k++)
				idx[k] = (int64_t)(seq * SAMPLES + (uint64_t)k) % (1 << 20);
			seq++;
			memset(buf, v, sizeof(buf));
			const void *src[1] = { buf };
			uint64_t got = 0;
			int eoe;
			if (f_publish(p, 1, 0, SAMPLES, &len, src, idx, 1, "x", 1, 0, 1000))
				break;
			f_read(p, 1, &len, NULL, &got, &eoe, 0); /* the producer skips its own batch */
			void *ptr;
			if (f_read_view(j.h, 1, &len, &ptr, &got, &eoe, &j.id[n], 1000) == 0)
				bases[n++] = ptr;
		}
		views += n;
		for (int v = n; v < VIEWS; v++)
			j.id[v] = 0;
		pthread_t t;
		pthread_create(&t, NULL, releaser, &j);
		atomic_store(&j.go, 1);
		f_close(j.h); /* while the other thread releases */
		pthread_join(t, NULL);
		bad += j.bad - (VIEWS - n); /* unused ids fail by design */
		for (int v = 0; v < n; v++)
			left += mapped(bases[v]);
	}
	printf("rounds %d views %d left-mapped %d bad-release %d\n", rounds, views, left, bad);
	f_close(p);
	return 0;
}
