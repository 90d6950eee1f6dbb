/* SPDX-License-Identifier: MIT */
/*
 * Stream ranges: host ranges the shim can prove hold a shared loader's
 * batch, registered by tsshim_batch() (include/tsshim.h) and by the PyTorch
 * layer (shim/feed_api.c), and what the CUDA copy hooks do with an upload
 * of one.
 *
 * A producer's range is its published batch: its upload is done for real
 * and then kept in the GPU ring. A consumer's range holds bytes it read
 * from the stream (the shim wrote them there): its upload is served from
 * the GPU ring, or done from the host when the ring cannot serve it, which
 * gives the same bytes either way.
 */
#ifndef TSSHIM_SHIM_STREAM_H
#define TSSHIM_SHIM_STREAM_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "gpu.h"
#include "layout.h"

/* How many ranges are registered now: 0 makes every lookup one load. */
extern _Atomic int ts_stream_nspans;

#define TS_HIT_PIECES 8

enum ts_hit_kind { TS_HIT_NONE = 0, TS_HIT_PRODUCER, TS_HIT_CONSUMER };

struct ts_stream_hit {
	enum ts_hit_kind kind;
	struct ts_gpu *gpu;
	/* producer */
	uint64_t seq;
	uint32_t npos, pos;
	uint64_t len[TS_MAX_POSITIONS];
	uint64_t off;
	size_t n;
	/* consumer */
	unsigned npieces;
	struct ts_gpu_piece piece[TS_HIT_PIECES];
};

/*
 * How an upload proves that a registered range still holds what it held
 * when it was registered (the program may change a batch in place before
 * uploading it: then the upload is not the stream's):
 *   NONE       the caller promised not to (tsshim_batch, include/tsshim.h);
 *   UNWRITTEN  no page of the uploaded part was written since it was mapped
 *              (a consumer's view, a private mapping of the slot file);
 *   HASH       the whole range hashes as it did (ts_hash_bulk); a part of
 *              the range is not proven and is an ordinary copy.
 */
enum ts_span_check { TS_CHECK_NONE = 0, TS_CHECK_UNWRITTEN, TS_CHECK_HASH };

/* Where each position of a consumer's batch came from (struct ts_feed's on_range). */
struct ts_batch_ranges {
	unsigned n[TS_MAX_POSITIONS];
	int overflow;                        /* a position came from too many pieces */
	struct ts_gpu_piece r[TS_MAX_POSITIONS][TS_HIT_PIECES];
};
struct ts_range;
void ts_batch_ranges_reset(struct ts_batch_ranges *rg);
void ts_batch_ranges_on_range(void *arg, uint32_t p, const struct ts_range *r, uint64_t at);

/*
 * Register the host ranges a batch is uploaded from. Producer: data[p]
 * holds position p of ring seq `seq` as published (bytes[p] each); its
 * upload is kept in g's ring. Consumer: data[p] holds bytes the ranges rg
 * say where they came from; its upload is served from g's ring. A new range
 * replaces any it overlaps. `owner` names them for ts_stream_drop.
 */
void ts_stream_add_published(const void *owner, struct ts_gpu *g, uint64_t seq, unsigned npos, void *const *data,
			     const uint64_t *bytes, enum ts_span_check check);
void ts_stream_add_read(const void *owner, struct ts_gpu *g, unsigned npos, void *const *data, const uint64_t *bytes,
			const struct ts_batch_ranges *rg, enum ts_span_check check);
/* Forget an owner's ranges; or every range that overlaps [base, base + size) (memory going away). */
void ts_stream_drop(const void *owner);
void ts_stream_drop_within(const void *base, size_t size);

/* Is [src, src + n) inside a registered range that still holds its bytes? Fills *hit. */
enum ts_hit_kind ts_stream_find(const void *src, size_t n, struct ts_stream_hit *hit);

/* Leave every loader's feed (at exit). */
void ts_stream_fini(void);

#endif
