/* SPDX-License-Identifier: MIT */
/*
 * ts-gpurace: what a program may do with an upload once CUDA says it is done,
 * and what it may expect of errno across it, in a shared session.
 *   prod N      producer: N batches, each uploaded with synchronous cudaMemcpy
 *               (labels, then images), then the images changed in place on a
 *               non-blocking stream (legal: the copies have landed)
 *   cons N      consumer: the same N batches uploaded synchronously, read back
 *               and compared with its host bytes
 *   cpuprod N   producer that never uses CUDA (the consumer makes the ring)
 * A third argument "pt" makes each upload an async one on the per-thread
 * default stream (cudaMemcpyAsync_ptsz on stream 0, as a program built with
 * --default-stream per-thread does) followed by cudaStreamSynchronize(0);
 * the consumer then reads back on a non-blocking stream, which is ordered
 * after nothing but what that synchronize covered.
 * The consumer also copies each batch's images to pinned host memory with
 * cudaMemcpyAsync(cudaMemcpyDefault) and compares at once: a copy from host
 * to host is synchronous in CUDA, so it must never be served from the ring
 * (a device copy, still queued when the call returns; counted in host_bad).
 * Every mode checks that errno is the same after the uploads as before.
 * Prints "MODE done: batches=N served=S bad=B host_bad=H errno_changed=E";
 * exit 1 when B, H or E is not 0. Link with tsemu's (or CUDA's) libcudart.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define __CUDA_API_VERSION_INTERNAL 1 /* the _ptds/_ptsz prototypes beside the legacy ones */
#include <cuda_runtime_api.h>

#include "tsshim.h"

#define SAMPLES 16
#define SAMPLE_BYTES 65536
#define ERRNO_MARK 4242

static void fill(unsigned char *img, int64_t *lbl, int64_t *ids, int b, int nb)
{
	for (int i = 0; i < SAMPLES; i++) {
		memset(img + (size_t)i * SAMPLE_BYTES, (b * 7 + i) & 0xff, SAMPLE_BYTES);
		lbl[i] = b * 100 + i;
		ids[i] = (b * SAMPLES + i) % (SAMPLES * nb);
	}
}

/* Upload n bytes as the mode says: synchronous, or async on the per-thread
 * default stream and then synchronised. */
static cudaError_t upload(void *d, const void *h, size_t n, int pt)
{
	if (!pt)
		return cudaMemcpy(d, h, n, cudaMemcpyHostToDevice);
	cudaError_t e = cudaMemcpyAsync_ptsz(d, h, n, cudaMemcpyHostToDevice, 0);
	return e ? e : cudaStreamSynchronize_ptsz(0);
}

static cudaError_t read_back(void *h, const void *d, size_t n, int pt, cudaStream_t side)
{
	if (!pt)
		return cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost);
	cudaError_t e = cudaMemcpyAsync(h, d, n, cudaMemcpyDeviceToHost, side);
	return e ? e : cudaStreamSynchronize(side);
}

int main(int argc, char **argv)
{
	if ((argc != 3 && !(argc == 4 && !strcmp(argv[3], "pt"))) ||
	    (strcmp(argv[1], "prod") && strcmp(argv[1], "cons") && strcmp(argv[1], "cpuprod"))) {
		fprintf(stderr, "usage: ts-gpurace prod|cons|cpuprod NBATCH [pt]\n");
		return 2;
	}
	int pt = argc == 4;
	int nb = atoi(argv[2]), prod = strcmp(argv[1], "cons") != 0, gpu = strcmp(argv[1], "cpuprod") != 0;
	size_t bytes = (size_t)SAMPLES * SAMPLE_BYTES, lbytes = SAMPLES * sizeof(int64_t);
	unsigned char *img = NULL, *back = malloc(bytes), *hostcopy = NULL;
	int64_t *lbl = NULL, *lback = malloc(lbytes), ids[SAMPLES];
	void *d = NULL, *dl = NULL;
	cudaStream_t side = NULL;
	if (!gpu) {
		img = malloc(bytes);
		lbl = malloc(lbytes);
	} else if (cudaMallocHost((void **)&img, bytes) || cudaMallocHost((void **)&lbl, lbytes) ||
		   cudaMallocHost((void **)&hostcopy, bytes) || cudaMalloc(&d, bytes) || cudaMalloc(&dl, lbytes) ||
		   cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking)) {
		fprintf(stderr, "ts-gpurace: CUDA set-up failed\n");
		return 2;
	}
	if (!img || !lbl || !back || !lback)
		return 2;
	int bad = 0, host_bad = 0, served = 0, errno_changed = 0;
	for (int b = 0; b < nb; b++) {
		fill(img, lbl, ids, b, nb);
		void *data[2] = { img, lbl };
		size_t len[2] = { bytes, lbytes };
		unsigned flags = (b == 0 ? TSSHIM_BATCH_FIRST : 0) | (b + 1 == nb ? TSSHIM_BATCH_LAST : 0);
		int r = tsshim_batch ? tsshim_batch("train.gpurace", 2, data, len, SAMPLES, ids,
						    (uint64_t)SAMPLES * (uint64_t)nb, flags, NULL)
				     : 0;
		served += r == TSSHIM_BATCH_SERVED;
		if (gpu && !prod) { /* before the uploads: the batch's first copy is the one the shim would serve */
			memset(hostcopy, 0, bytes);
			if (cudaMemcpyAsync(hostcopy, img, bytes, cudaMemcpyDefault, side) ||
			    memcmp(hostcopy, img, bytes)) {
				host_bad++;
				fprintf(stderr, "batch %d: a host-to-host copy was not done when it returned\n", b);
			}
		}
		if (gpu) {
			errno = ERRNO_MARK;
			cudaError_t e2 = upload(dl, lbl, lbytes, pt);
			cudaError_t e1 = upload(d, img, bytes, pt);
			errno_changed += errno != ERRNO_MARK;
			if (e1 || e2) {
				fprintf(stderr, "ts-gpurace: upload failed (%d, %d)\n", e1, e2);
				return 3;
			}
			if (prod) { /* in-place preprocessing, after the uploads returned */
				cudaMemsetAsync(d, 0xee, bytes, side);
				cudaStreamSynchronize(side);
			} else if (read_back(back, d, bytes, pt, side) || read_back(lback, dl, lbytes, pt, side) ||
				   memcmp(back, img, bytes) ||
				   memcmp(lback, lbl, lbytes)) {
				bad++;
				fprintf(stderr, "batch %d (%s): device bytes differ from the host's\n", b,
					r == TSSHIM_BATCH_SERVED ? "served" : "own");
			}

		}
		usleep(20000);
	}
	printf("%s%s done: batches=%d served=%d bad=%d host_bad=%d errno_changed=%d\n", argv[1], pt ? " pt" : "", nb,
	       served, bad, host_bad, errno_changed);
	return bad || host_bad || errno_changed ? 1 : 0;
}
