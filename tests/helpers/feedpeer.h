/* SPDX-License-Identifier: MIT */
/*
 * What tests/unit/test_feed.c (the producer) and tests/helpers/ts-feedpeer.c
 * (its consumers, started with posix_spawn) agree on: the session
 * parameters, the dataset size, the schema and the permutation published.
 */
#ifndef TS_FEEDPEER_H
#define TS_FEEDPEER_H

#include <stdint.h>

#include "feed.h"

#define NINDEX 50
#define SEC    1000000000ull

static const struct ts_session_params params = { .depth = 4, .timeout_ms = 1000, .label = "unit" };
static const char schema[] = "{\"tuple\":[{\"t\":0},{\"t\":1}]}";

/* The permutation every test publishes: i -> (7i + 3) mod 50. Sample i:
 * position 0 holds 3 uint32 (i, 2i, 3i), position 1 one uint64 (i * 1000). */
static inline int64_t perm(uint64_t k)
{
	return (int64_t)((7 * k + 3) % NINDEX);
}

#endif
