/* SPDX-License-Identifier: MIT */
/*
 * Stream ranges: host ranges the shim can prove hold a shared loader's
 * batch, registered by tsshim_batch() (include/tsshim.h), and what the CUDA
 * copy hooks do with an upload of one.
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

/* Is [src, src + n) inside a registered range? Fills *hit. */
enum ts_hit_kind ts_stream_find(const void *src, size_t n, struct ts_stream_hit *hit);

/* Leave every loader's feed (at exit). */
void ts_stream_fini(void);

#endif
