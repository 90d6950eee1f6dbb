/* SPDX-License-Identifier: MIT */
/*
 * ts-servedge: uploads a consumer's ring would serve, made where CUDA
 * answers something other than success, so that a scenario can compare the
 * answers with and without the shim (tests/scenarios/serve_edge.sh).
 *   prod N              producer: N batches of 4 samples, each uploaded with
 *                       cudaMemcpy (TS_DEVICE=d: on device d)
 *   cons N CASE[,CASE]  consumer: batches of TS_SAMPLES samples (default 4);
 *                       each case is run on the next batch the shim says it
 *                       serves (TSSHIM_BATCH_SERVED), or, without the shim,
 *                       on the next batch
 * Cases (each prints its CUDA answers, then "served=0|1"):
 *   normal          a synchronous upload; the device holds the host's bytes
 *   capture-other   a synchronous upload while another thread captures a
 *                   non-blocking stream in global mode (a barred call in
 *                   CUDA: cudaErrorStreamCaptureUnsupported, and the
 *                   capture invalidated)
 *   capture-own     the same while this thread captures a non-blocking
 *                   stream in thread-local mode
 *   overflow        an upload that runs one sample past the end of its
 *                   allocation: it fails, and nothing of it is written
 *   peer            cudaDeviceEnablePeerAccess(1) after an upload, in a
 *                   consumer that enabled it, then reset its device, before
 *                   its first batch (TS_PEER_RESET=1)
 * Link with tsemu's (or CUDA's) libcudart.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "tsshim.h"

#define SAMPLE_BYTES 65536
#define MAX_SAMPLES 16
#define DATASET 24 /* samples in an epoch: a whole number of batches of 4, 6 or 8 */

static int samples = 4;

static void fill(unsigned char *img, int64_t *lbl, int64_t *ids, int b)
{
	for (int i = 0; i < samples; i++) {
		memset(img + (size_t)i * SAMPLE_BYTES, ((b * 7 + i) & 0x7f) | 1, SAMPLE_BYTES); /* never zero */
		lbl[i] = b * 100 + i;
		ids[i] = (b * samples + i) % DATASET;
	}
}

/* The runtime's answer and its error state after it. */
static void say(const char *what, cudaError_t r)
{
	cudaError_t last = cudaGetLastError();
	printf("  %s: %d (last error %d)\n", what, (int)r, (int)last);
}

/* ---- a capture begun in another thread, open while this one uploads ---- */

struct capture {
	cudaStream_t s;
	pthread_barrier_t begun, done;
};

static void *capture_thread(void *arg)
{
	struct capture *c = arg;
	cudaError_t r = cudaStreamBeginCapture(c->s, cudaStreamCaptureModeGlobal);
	pthread_barrier_wait(&c->begun);
	pthread_barrier_wait(&c->done);
	cudaGraph_t g = NULL;
	cudaError_t e = cudaStreamEndCapture(c->s, &g);
	printf("  capture begun: %d, ended: %d, graph %s\n", (int)r, (int)e, g ? "made" : "none");
	if (g)
		cudaGraphDestroy(g);
	return NULL;
}

static void device_equals(void *d, const unsigned char *img, size_t n)
{
	unsigned char *b = malloc(n);
	if (!b || cudaMemcpy(b, d, n, cudaMemcpyDeviceToHost) != cudaSuccess) {
		printf("  device: not read\n");
	} else {
		printf("  device: %s\n", memcmp(b, img, n) ? "differs from the host" : "the host's bytes");
	}
	free(b);
	(void)cudaGetLastError();
}

static int run_case(const char *c, void *d, const unsigned char *img, size_t n)
{
	printf("case %s\n", c);
	if (!strcmp(c, "normal")) {
		say("upload", cudaMemcpy(d, img, n, cudaMemcpyHostToDevice));
		device_equals(d, img, n);
	} else if (!strcmp(c, "capture-other")) {
		struct capture cap;
		pthread_t t;
		if (cudaStreamCreateWithFlags(&cap.s, cudaStreamNonBlocking) != cudaSuccess)
			return -1;
		pthread_barrier_init(&cap.begun, NULL, 2);
		pthread_barrier_init(&cap.done, NULL, 2);
		pthread_create(&t, NULL, capture_thread, &cap);
		pthread_barrier_wait(&cap.begun);
		say("upload", cudaMemcpy(d, img, n, cudaMemcpyHostToDevice));
		pthread_barrier_wait(&cap.done);
		pthread_join(t, NULL);
		cudaStreamDestroy(cap.s);
		device_equals(d, img, n);
	} else if (!strcmp(c, "capture-own")) {
		cudaStream_t s;
		cudaGraph_t g = NULL;
		if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess)
			return -1;
		say("capture begun", cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
		say("upload", cudaMemcpy(d, img, n, cudaMemcpyHostToDevice));
		say("capture ended", cudaStreamEndCapture(s, &g));
		printf("  graph %s\n", g ? "made" : "none");
		if (g)
			cudaGraphDestroy(g);
		cudaStreamDestroy(s);
		device_equals(d, img, n);
	} else if (!strcmp(c, "overflow")) {
		say("upload past the end", cudaMemcpy((char *)d + SAMPLE_BYTES, img, n, cudaMemcpyHostToDevice));
		unsigned char *b = malloc(n);
		size_t written = 0;
		if (b && cudaMemcpy(b, d, n, cudaMemcpyDeviceToHost) == cudaSuccess)
			for (size_t i = 0; i < n; i++)
				written += b[i] != 0;
		free(b);
		printf("  bytes written: %zu\n", written);
	} else if (!strcmp(c, "peer")) {
		say("upload", cudaMemcpy(d, img, n, cudaMemcpyHostToDevice));
		say("enable peer access to device 1", cudaDeviceEnablePeerAccess(1, 0));
		say("disable it", cudaDeviceDisablePeerAccess(1));
	} else {
		fprintf(stderr, "ts-servedge: no case '%s'\n", c);
		return -1;
	}
	return 0;
}

int main(int argc, char **argv)
{
	if (argc < 3 || (strcmp(argv[1], "prod") && strcmp(argv[1], "cons")) || (!strcmp(argv[1], "cons") && argc < 4)) {
		fprintf(stderr, "usage: ts-servedge prod N | cons N CASE[,CASE...]\n");
		return 2;
	}
	int prod = !strcmp(argv[1], "prod"), nb = atoi(argv[2]);
	if (!prod && getenv("TS_SAMPLES"))
		samples = atoi(getenv("TS_SAMPLES"));
	if (samples < 1 || samples > MAX_SAMPLES || DATASET % samples || nb < 1)
		return 2;
	char *cases = prod ? NULL : strdup(argv[3]), *next = cases, *save = NULL;
	const char *c = cases ? strtok_r(next, ",", &save) : NULL;
	if (prod && getenv("TS_DEVICE") && cudaSetDevice(atoi(getenv("TS_DEVICE"))) != cudaSuccess)
		return 2;
	if (!prod && getenv("TS_PEER_RESET")) {
		say("enable peer access to device 1", cudaDeviceEnablePeerAccess(1, 0));
		say("device reset", cudaDeviceReset());
	}
	size_t n = (size_t)samples * SAMPLE_BYTES, ln = (size_t)samples * sizeof(int64_t);
	unsigned char *img = malloc(n);
	int64_t lbl[MAX_SAMPLES], ids[MAX_SAMPLES];
	void *d = NULL, *dl = NULL;
	if (!img || cudaMalloc(&d, n) != cudaSuccess || cudaMalloc(&dl, ln) != cudaSuccess)
		return 2;
	int served = 0, ran = 0;
	for (int b = 0; b < nb && (prod || c); b++) {
		fill(img, lbl, ids, b);
		void *data[2] = {img, lbl};
		size_t len[2] = {n, ln};
		unsigned flags = ((b * samples) % DATASET == 0 ? TSSHIM_BATCH_FIRST : 0) |
				 ((b + 1) * samples % DATASET == 0 ? TSSHIM_BATCH_LAST : 0);
		int r = tsshim_batch ? tsshim_batch("train.servedge", 2, data, len, (uint64_t)samples, ids, DATASET,
						    flags, NULL)
				     : 0;
		if (cudaMemcpy(dl, lbl, ln, cudaMemcpyHostToDevice) != cudaSuccess)
			return 3;
		if (prod || (tsshim_batch && r != TSSHIM_BATCH_SERVED)) {
			if (cudaMemcpy(d, img, n, cudaMemcpyHostToDevice) != cudaSuccess)
				return 3;
			usleep(prod ? 20000 : 1000);
			continue;
		}
		if (cudaMemset(d, 0, n) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess)
			return 3;
		if (run_case(c, d, img, n))
			return 2;
		served += r == TSSHIM_BATCH_SERVED;
		ran++;
		c = strtok_r(NULL, ",", &save);
		fflush(stdout);
	}
	fprintf(stderr, "ts-servedge %s: cases=%d served=%d\n", argv[1], ran, served);
	free(cases);
	free(img);
	return c ? 4 : 0; /* 4: batches ran out before the cases */
}
