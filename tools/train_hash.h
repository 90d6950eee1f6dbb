/* SPDX-License-Identifier: MIT */
/*
 * Hashes and random numbers of tsshim-train, in a header so that a verifier
 * can compute exactly the same values.
 *
 * XXH64 (xxHash, 64-bit variant, as specified by the xxHash project), seed 0
 * unless said otherwise. One-shot: xxh64(data, len, seed). Streaming:
 * xxh64_init / xxh64_update / xxh64_digest give the same value as the
 * one-shot hash of the concatenation of everything passed to update.
 * Check values: xxh64("", 0) = ef46db3751d8e999,
 * xxh64("abc", 0) = 44bc2cf5ad770999.
 *
 * splitmix64 (Steele, Lea, Flood 2014; the generator in Vigna's xoshiro
 * reference code): state += 0x9e3779b97f4a7c15, then the mix64 finaliser
 * below on the new state. mix64 is a bijection on 64-bit values.
 *
 * Multi-byte values are hashed in little-endian order (the host's order:
 * only little-endian hosts are supported).
 */
#ifndef TSSHIM_TRAIN_HASH_H
#define TSSHIM_TRAIN_HASH_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "tsshim-train hashes assume a little-endian host"
#endif

#define XXH64_P1 0x9E3779B185EBCA87ULL
#define XXH64_P2 0xC2B2AE3D27D4EB4FULL
#define XXH64_P3 0x165667B19E3779F9ULL
#define XXH64_P4 0x85EBCA77C2B2AE63ULL
#define XXH64_P5 0x27D4EB2F165667C5ULL

static inline uint64_t xxh64_rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

static inline uint64_t xxh64_read64(const unsigned char *p)
{
	uint64_t v;
	memcpy(&v, p, sizeof v);
	return v;
}

static inline uint32_t xxh64_read32(const unsigned char *p)
{
	uint32_t v;
	memcpy(&v, p, sizeof v);
	return v;
}

static inline uint64_t xxh64_round(uint64_t acc, uint64_t in)
{
	acc += in * XXH64_P2;
	acc = xxh64_rotl(acc, 31);
	return acc * XXH64_P1;
}

static inline uint64_t xxh64_merge(uint64_t acc, uint64_t v)
{
	acc ^= xxh64_round(0, v);
	return acc * XXH64_P1 + XXH64_P4;
}

struct xxh64_state {
	uint64_t total;   /* bytes hashed so far */
	uint64_t seed;
	uint64_t v[4];    /* lane accumulators */
	unsigned char buf[32];
	unsigned buflen;  /* bytes waiting in buf, < 32 */
};

static inline void xxh64_init(struct xxh64_state *s, uint64_t seed)
{
	s->total = 0;
	s->seed = seed;
	s->v[0] = seed + XXH64_P1 + XXH64_P2;
	s->v[1] = seed + XXH64_P2;
	s->v[2] = seed;
	s->v[3] = seed - XXH64_P1;
	s->buflen = 0;
}

/* Consume whole 32-byte stripes; returns the bytes consumed. */
static inline size_t xxh64_stripes(uint64_t v[4], const unsigned char *p, size_t len)
{
	uint64_t v0 = v[0], v1 = v[1], v2 = v[2], v3 = v[3];
	size_t done = 0;
	for (; len - done >= 32; done += 32) {
		v0 = xxh64_round(v0, xxh64_read64(p + done));
		v1 = xxh64_round(v1, xxh64_read64(p + done + 8));
		v2 = xxh64_round(v2, xxh64_read64(p + done + 16));
		v3 = xxh64_round(v3, xxh64_read64(p + done + 24));
	}
	v[0] = v0, v[1] = v1, v[2] = v2, v[3] = v3;
	return done;
}

static inline void xxh64_update(struct xxh64_state *s, const void *data, size_t len)
{
	const unsigned char *p = data;
	s->total += len;
	if (s->buflen + len < 32) {
		if (len)
			memcpy(s->buf + s->buflen, p, len);
		s->buflen += (unsigned)len;
		return;
	}
	if (s->buflen) {
		size_t fill = 32 - s->buflen;
		memcpy(s->buf + s->buflen, p, fill);
		xxh64_stripes(s->v, s->buf, 32);
		p += fill;
		len -= fill;
		s->buflen = 0;
	}
	size_t done = xxh64_stripes(s->v, p, len);
	if (len > done)
		memcpy(s->buf, p + done, len - done);
	s->buflen = (unsigned)(len - done);
}

static inline uint64_t xxh64_digest(const struct xxh64_state *s)
{
	uint64_t h;
	if (s->total >= 32) {
		h = xxh64_rotl(s->v[0], 1) + xxh64_rotl(s->v[1], 7) + xxh64_rotl(s->v[2], 12) +
		    xxh64_rotl(s->v[3], 18);
		for (int i = 0; i < 4; i++)
			h = xxh64_merge(h, s->v[i]);
	} else {
		h = s->seed + XXH64_P5;
	}
	h += s->total;
	const unsigned char *p = s->buf;
	size_t n = s->buflen;
	for (; n >= 8; p += 8, n -= 8) {
		h ^= xxh64_round(0, xxh64_read64(p));
		h = xxh64_rotl(h, 27) * XXH64_P1 + XXH64_P4;
	}
	if (n >= 4) {
		h ^= (uint64_t)xxh64_read32(p) * XXH64_P1;
		h = xxh64_rotl(h, 23) * XXH64_P2 + XXH64_P3;
		p += 4;
		n -= 4;
	}
	for (; n > 0; p++, n--) {
		h ^= (uint64_t)*p * XXH64_P5;
		h = xxh64_rotl(h, 11) * XXH64_P1;
	}
	h ^= h >> 33;
	h *= XXH64_P2;
	h ^= h >> 29;
	h *= XXH64_P3;
	h ^= h >> 32;
	return h;
}

static inline uint64_t xxh64(const void *data, size_t len, uint64_t seed)
{
	struct xxh64_state s;
	xxh64_init(&s, seed);
	xxh64_update(&s, data, len);
	return xxh64_digest(&s);
}

/* ---- splitmix64 ---------------------------------------------------------- */

static inline uint64_t mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
	return z ^ (z >> 31);
}

static inline uint64_t splitmix64_next(uint64_t *state)
{
	*state += 0x9E3779B97F4A7C15ULL;
	return mix64(*state);
}

/* Uniform double in [0, 1): the top 53 bits of one draw. */
static inline double splitmix64_unit(uint64_t *state)
{
	return (double)(splitmix64_next(state) >> 11) * 0x1.0p-53;
}

/*
 * The sampler's permutation for one epoch: start from 0..n-1, state =
 * seed + epoch, then Fisher-Yates from the end: for i = n-1 down to 1,
 * j = splitmix64_next(&state) % (i + 1), swap a[i] and a[j].
 */
static inline void train_permutation(uint64_t *a, uint64_t n, uint64_t seed, uint64_t epoch)
{
	uint64_t state = seed + epoch;
	for (uint64_t i = 0; i < n; i++)
		a[i] = i;
	for (uint64_t i = n; i-- > 1;) {
		uint64_t j = splitmix64_next(&state) % (i + 1);
		uint64_t t = a[i];
		a[i] = a[j];
		a[j] = t;
	}
}

/*
 * The augmentation generator of one sample: a splitmix64 state of
 * mix64(mix64(mix64(seed) ^ epoch) ^ index). It depends on nothing else
 * (not on the worker, the batch or the timing).
 */
static inline uint64_t train_sample_rng(uint64_t seed, uint64_t epoch, uint64_t index)
{
	return mix64(mix64(mix64(seed) ^ epoch) ^ index);
}

#endif
