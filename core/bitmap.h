/* SPDX-License-Identifier: MIT */
/*
 * Bitmaps over a dataset's sample indices: what an epoch of a job trained
 * (shim/stream.c, shim/feed_api.c). The caller bounds i.
 */
#ifndef TSSHIM_CORE_BITMAP_H
#define TSSHIM_CORE_BITMAP_H

#include <stdint.h>

static inline uint64_t ts_bitmap_words(uint64_t nbits)
{
	return (nbits + 63) / 64;
}

static inline int ts_bit_get(const uint64_t *b, uint64_t i)
{
	return (int)(b[i / 64] >> (i % 64) & 1);
}

static inline void ts_bit_set(uint64_t *b, uint64_t i)
{
	b[i / 64] |= 1ull << (i % 64);
}

static inline void ts_bit_clear(uint64_t *b, uint64_t i)
{
	b[i / 64] &= ~(1ull << (i % 64));
}

#endif
