/* SPDX-License-Identifier: MIT */
/*
 * A fast 64-bit hash for proving that two byte ranges are equal (decode
 * provenance, cache keys). Not cryptographic: it guards against accidents,
 * not adversaries (an adversary with write access to the dataset can change
 * what every job trains on anyway). Eight bytes per multiply.
 */
#ifndef TSSHIM_CORE_HASH_H
#define TSSHIM_CORE_HASH_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

static inline uint64_t ts_mix64(uint64_t x)
{
	x ^= x >> 32;
	x *= 0xd6e8feb86659fd93ull;
	x ^= x >> 32;
	x *= 0xd6e8feb86659fd93ull;
	x ^= x >> 32;
	return x;
}

/* FNV-1a, 32 bits: checksums of small static headers. */
static inline uint32_t ts_fnv1a32(const void *data, size_t len)
{
	const unsigned char *p = data;
	uint32_t h = 2166136261u;
	for (size_t i = 0; i < len; i++)
		h = (h ^ p[i]) * 16777619u;
	return h;
}

static inline uint64_t ts_hash64(const void *data, size_t len, uint64_t seed)
{
	const unsigned char *p = data;
	uint64_t h = seed ^ (0x9e3779b97f4a7c15ull * (len + 1));
	size_t i = 0;
	for (; i + 8 <= len; i += 8) {
		uint64_t w;
		memcpy(&w, p + i, 8);
		h = (h ^ ts_mix64(w + i)) * 0x9fb21c651e98df25ull;
		h ^= h >> 29;
	}
	uint64_t tail = 0;
	memcpy(&tail, p + i, len - i);
	return ts_mix64(h ^ ts_mix64(tail ^ len));
}

/*
 * A hash of large buffers (a batch of images, tens of MB) for proving that
 * a buffer still holds the bytes it held when the shim filled it: four
 * independent lanes of 8 bytes each per step, so the multiplies overlap
 * (several GB/s, where ts_hash64's single chain is bound by its latency).
 */
#define TS_HASH_BULK_M1 0x9e3779b185ebca87ull
#define TS_HASH_BULK_M2 0xc2b2ae3d27d4eb4full

static inline void ts_hash_bulk_seed(uint64_t a[4])
{
	a[0] = TS_HASH_BULK_M1 + TS_HASH_BULK_M2;
	a[1] = TS_HASH_BULK_M2;
	a[2] = 0;
	a[3] = 0 - TS_HASH_BULK_M1;
}

static inline void ts_hash_bulk_block(uint64_t a[4], const unsigned char *p)
{
	for (int k = 0; k < 4; k++) {
		uint64_t w;
		memcpy(&w, p + 8 * k, 8);
		a[k] += w * TS_HASH_BULK_M2;
		a[k] = ((a[k] << 31) | (a[k] >> 33)) * TS_HASH_BULK_M1;
	}
}

static inline uint64_t ts_hash_bulk_end(const uint64_t a[4], const unsigned char *tail, size_t ntail, uint64_t len)
{
	uint64_t h = ts_mix64(a[0]) ^ ts_mix64(a[1] + 1) ^ ts_mix64(a[2] + 2) ^ ts_mix64(a[3] + 3);
	return ts_hash64(tail, ntail, h ^ len);
}

static inline uint64_t ts_hash_bulk(const void *data, size_t len)
{
	const unsigned char *p = data;
	uint64_t a[4];
	ts_hash_bulk_seed(a);
	size_t i = 0;
	for (; i + 32 <= len; i += 32)
		ts_hash_bulk_block(a, p + i);
	return ts_hash_bulk_end(a, p + i, len - i, len);
}

/*
 * ts_hash_bulk of bytes that arrive in pieces (a file read in chunks): the
 * same value whatever the pieces, so the reads of a file can be hashed as
 * they happen and compared with one hash of the buffer later decoded.
 */
struct ts_hash_stream {
	uint64_t a[4];
	uint64_t len;
	unsigned char tail[32];
};

static inline void ts_hash_stream_init(struct ts_hash_stream *s)
{
	ts_hash_bulk_seed(s->a);
	s->len = 0;
}

static inline void ts_hash_stream_add(struct ts_hash_stream *s, const void *data, size_t n)
{
	const unsigned char *p = data;
	size_t have = (size_t)(s->len % 32);
	s->len += n;
	if (have) {
		size_t take = 32 - have < n ? 32 - have : n;
		memcpy(s->tail + have, p, take);
		p += take;
		n -= take;
		if (have + take < 32)
			return;
		ts_hash_bulk_block(s->a, s->tail);
	}
	for (; n >= 32; p += 32, n -= 32)
		ts_hash_bulk_block(s->a, p);
	memcpy(s->tail, p, n);
}

/* The hash of everything added so far (the stream can go on). */
static inline uint64_t ts_hash_stream_value(const struct ts_hash_stream *s)
{
	return ts_hash_bulk_end(s->a, s->tail, (size_t)(s->len % 32), s->len);
}

#endif
