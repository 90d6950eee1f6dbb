/* SPDX-License-Identifier: MIT */
/*
 * tsshim's optional C API. A program needs none of it: under
 * LD_PRELOAD=libtsshim.so the shim works on an unmodified program. A C/C++
 * trainer may include this header to say explicitly that it takes part in
 * a session; the declarations are weak, so the same binary runs without
 * the shim (the functions are then NULL):
 *
 *     if (tsshim_join)
 *             tsshim_join();
 */
#ifndef TSSHIM_H
#define TSSHIM_H

#ifdef __cplusplus
extern "C" {
#endif

#include <stddef.h>
#include <stdint.h>

#ifndef TSSHIM_WEAK
#define TSSHIM_WEAK __attribute__((weak))
#endif

enum {
	TSSHIM_ROLE_NONE = 0,     /* not a member (shim off, or join failed) */
	TSSHIM_ROLE_PRODUCER = 1, /* runs the pipeline and publishes batches */
	TSSHIM_ROLE_CONSUMER = 2, /* reads the producer's batches */
	TSSHIM_ROLE_WORKER = 3,   /* a child process of a member: works for it */
};

/*
 * Make the calling process a member of its session (TSSHIM_SESSION).
 * Idempotent. Returns 0 when the process is a member (itself, or as a child
 * of one), a negative errno otherwise: -ENOTSUP when the shim is off,
 * -ECHILD for a forked child of a non-member.
 */
TSSHIM_WEAK int tsshim_join(void);
/* One of TSSHIM_ROLE_*. */
TSSHIM_WEAK int tsshim_role(void);
/* Leave the session now (also done at exit). */
TSSHIM_WEAK void tsshim_leave(void);
/* "tsshim X.Y.Z" */
TSSHIM_WEAK const char *tsshim_version(void);

/*
 * Loader batches (socket mode). A trainer that builds its own batches hands
 * each one to the shim right before uploading it:
 *
 *     void *data[2] = {images, labels};
 *     size_t bytes[2] = {n * image_bytes, n * sizeof(int64_t)};
 *     struct tsshim_where at;
 *     int r = tsshim_batch ? tsshim_batch("train.<dataset+transform id>", 2, data, bytes, n,
 *                                         ids, dataset_len, first ? TSSHIM_BATCH_FIRST : 0, &at) : 0;
 *
 * Jobs of one session that name the same loader share one stream of
 * batches (the loader string must identify the dataset and the transforms:
 * loaders that differ must never share a name). The first job to hand one
 * over is the producer: its batch goes into the stream as it is
 * (TSSHIM_BATCH_PUBLISHED). In every other job the shim *replaces the
 * contents* of data[p] with the next n samples of the stream (same byte
 * counts; any n, samples stay paired across positions) and returns
 * TSSHIM_BATCH_SERVED. Either way, a host-to-device copy of exactly such a
 * range that follows is a known stream range: the producer's upload is also
 * kept in a GPU ring, and a consumer's upload is served from that ring
 * (device to device, or peer) instead of crossing PCIe. The host bytes are
 * the stream's bytes in any case, so an upload the ring cannot serve is
 * simply done as usual.
 *
 * Each range counts for one upload (its bytes uploaded once, in one copy
 * or several): the same addresses uploaded again later, or after the next
 * call for the loader, are ordinary copies. Do not change the buffers
 * between this call and their upload. TSSHIM_BATCH_OWN
 * (0) or a negative errno: nothing was shared, the buffers are untouched,
 * train on your own batch. `ids` are the samples' dataset indices in
 * [0, nindex); `where`, when not NULL, receives the stream position of the
 * batch's first sample (for records and checks).
 *
 * Pass TSSHIM_BATCH_FIRST with the first batch of each epoch: a consumer's
 * epoch then begins where one of the stream's does (it may wait for the
 * producer to finish the epoch in progress, or, joining early in one, get
 * TSSHIM_BATCH_OWN for that whole epoch), so no sample is served twice in it.
 */
enum {
	TSSHIM_BATCH_OWN = 0,
	TSSHIM_BATCH_PUBLISHED = 1,
	TSSHIM_BATCH_SERVED = 2,
};
#define TSSHIM_BATCH_FIRST 1u /* the loader's first batch of an epoch (or pass) */
#define TSSHIM_BATCH_LAST  2u /* its last batch of the epoch */

struct tsshim_where {
	uint64_t seq;    /* stream batch the first sample came from (published: this batch) */
	uint64_t sample; /* its index within that batch */
};

TSSHIM_WEAK int tsshim_batch(const char *loader, unsigned npos, void *const *data, const size_t *bytes,
			     size_t nsamples, const int64_t *ids, uint64_t nindex, unsigned flags,
			     struct tsshim_where *where);

#ifdef __cplusplus
}
#endif
#endif
