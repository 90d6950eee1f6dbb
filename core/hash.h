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

#endif
