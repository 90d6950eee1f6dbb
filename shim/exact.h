/* SPDX-License-Identifier: MIT */
/*
 * Exact mode: identical decodes are done once per session and served to
 * every other decode of the same file with the same parameters from the
 * shared decoded cache (core/cache.c). This is the shim-side glue: the
 * cache is opened lazily on the first proven dataset decode of a process
 * (forked DataLoader workers share their parent's mapping, or open it
 * themselves; the cache needs no session membership).
 */
#ifndef TSSHIM_SHIM_EXACT_H
#define TSSHIM_SHIM_EXACT_H

#include <stddef.h>
#include <stdint.h>

#include "cache.h"

enum ts_exact_result { TS_EXACT_BYPASS = 0, TS_EXACT_HIT = 1, TS_EXACT_FILL = 2 };

/* Is exact-mode decode sharing on for this process? */
int ts_exact_enabled(void);

/*
 * Look the decode up. HIT: dst holds len bytes, exactly what the real
 * decode would produce. FILL: decode for real into fill->ptr, then commit
 * (or abort on failure). BYPASS: decode privately.
 */
enum ts_exact_result ts_exact_get(const struct ts_cache_key *k, uint64_t len, void *dst,
				  struct ts_cache_fill *fill);
void ts_exact_commit(struct ts_cache_fill *fill, uint64_t decode_ns);
void ts_exact_abort(struct ts_cache_fill *fill);
/* The dataset scope became known or widened: note it in the cache. */
void ts_exact_note_scope(const char *scope);

#endif
