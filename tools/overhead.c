/* SPDX-License-Identifier: MIT */
/*
 * tsshim-overhead: the per-call cost of the calls the shim sees but does not
 * handle, for scripts/bench.sh to run with and without LD_PRELOAD.
 *
 *   pread        4 KiB pread of a file outside any dataset (page cache)
 *   open_close   open + 4 KiB read + close of such a file (not a JPEG)
 *   memcpy_async 64-byte cudaMemcpyAsync from pinned memory to the device on
 *                a stream (not a batch), when a CUDA runtime can be loaded
 *                (the test device: LD_LIBRARY_PATH=build/emu)
 *
 * Prints one line: "pread_ns=X open_close_ns=Y memcpy_async_ns=Z" (Z is
 * "nan" without CUDA); each is the best of --rounds rounds of --calls calls
 * (best: the least disturbed by other processes).
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void usage(FILE *f)
{
	fprintf(f, "usage: tsshim-overhead [--calls N] [--rounds N] [--cudart LIB]\n"
		   "Per-call cost of pass-through calls (run it with and without LD_PRELOAD=libtsshim.so):\n"
		   "4 KiB pread, open+read+close of a non-dataset file, and a 64-byte non-batch\n"
		   "cudaMemcpyAsync when a CUDA runtime loads (default libcudart.so.13).\n"
		   "  --calls N    calls per round (default 200000)\n"
		   "  --rounds N   rounds; the best is reported (default 5)\n"
		   "  --cudart LIB the CUDA runtime to dlopen\n");
}

typedef int (*malloc_host_fn)(void **, size_t);
typedef int (*malloc_fn)(void **, size_t);
typedef int (*stream_create_fn)(void **);
typedef int (*memcpy_async_fn)(void *, const void *, size_t, int, void *);
typedef int (*stream_sync_fn)(void *);

/* ns per cudaMemcpyAsync, or -1 when no CUDA runtime is usable. */
static double memcpy_async_ns(const char *lib, long calls, int rounds)
{
	void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
	if (!h)
		return -1;
	malloc_host_fn malloc_host = (malloc_host_fn)dlsym(h, "cudaMallocHost");
	malloc_fn dmalloc = (malloc_fn)dlsym(h, "cudaMalloc");
	stream_create_fn stream_create = (stream_create_fn)dlsym(h, "cudaStreamCreate");
	memcpy_async_fn copy = (memcpy_async_fn)dlsym(h, "cudaMemcpyAsync");
	stream_sync_fn sync = (stream_sync_fn)dlsym(h, "cudaStreamSynchronize");
	void *host, *dev, *stream;
	if (!malloc_host || !dmalloc || !stream_create || !copy || !sync || malloc_host(&host, 64) ||
	    dmalloc(&dev, 64) || stream_create(&stream))
		return -1;
	memset(host, 7, 64);
	double best = -1;
	for (int r = 0; r < rounds; r++) {
		uint64_t t0 = now_ns();
		for (long i = 0; i < calls; i++)
			if (copy(dev, host, 64, 1 /* cudaMemcpyHostToDevice */, stream))
				return -1;
		sync(stream);
		double ns = (double)(now_ns() - t0) / (double)calls;
		if (best < 0 || ns < best)
			best = ns;
	}
	return best;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = { { "calls", required_argument, NULL, 'c' },
					       { "rounds", required_argument, NULL, 'r' },
					       { "cudart", required_argument, NULL, 'l' },
					       { "help", no_argument, NULL, 'h' },
					       { 0, 0, 0, 0 } };
	long calls = 200000;
	int rounds = 5, o;
	const char *cudart = "libcudart.so.13";
	while ((o = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (o) {
		case 'c': calls = strtol(optarg, NULL, 10); break;
		case 'r': rounds = atoi(optarg); break; /* NOLINT(cert-err34-c): not a number gives 0, refused below */
		case 'l': cudart = optarg; break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (calls < 1 || rounds < 1 || optind != argc) {
		usage(stderr);
		return 2;
	}

	char path[] = "/tmp/tsshim-overhead.XXXXXX";
	int fd = mkstemp(path);
	char buf[4096] = { 1 };
	if (fd < 0 || write(fd, buf, sizeof(buf)) != (ssize_t)sizeof(buf)) {
		perror("tsshim-overhead: temporary file");
		return 1;
	}
	double pread_best = -1, oc_best = -1;
	for (int r = 0; r < rounds; r++) {
		uint64_t t0 = now_ns();
		for (long i = 0; i < calls; i++)
			if (pread(fd, buf, sizeof(buf), 0) != (ssize_t)sizeof(buf))
				return 1;
		double ns = (double)(now_ns() - t0) / (double)calls;
		if (pread_best < 0 || ns < pread_best)
			pread_best = ns;
		long n = calls / 10 ? calls / 10 : 1;
		t0 = now_ns();
		for (long i = 0; i < n; i++) {
			int f = open(path, O_RDONLY | O_CLOEXEC);
			if (f < 0 || read(f, buf, sizeof(buf)) != (ssize_t)sizeof(buf))
				return 1;
			close(f);
		}
		ns = (double)(now_ns() - t0) / (double)n;
		if (oc_best < 0 || ns < oc_best)
			oc_best = ns;
	}
	close(fd);
	unlink(path);
	double cu = memcpy_async_ns(cudart, calls, rounds);
	printf("pread_ns=%.1f open_close_ns=%.1f ", pread_best, oc_best);
	if (cu < 0)
		printf("memcpy_async_ns=nan\n");
	else
		printf("memcpy_async_ns=%.1f\n", cu);
	return 0;
}
