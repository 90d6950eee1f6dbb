/* SPDX-License-Identifier: MIT */
/*
 * Shared bits of the libFuzzer targets (tests/fuzz/fuzz_*.c): a private
 * directory under /dev/shm for the files a target writes, fake process
 * liveness, and the invariant check that aborts (a finding).
 */
#ifndef TSSHIM_FUZZ_COMMON_H
#define TSSHIM_FUZZ_COMMON_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* An invariant of the code under test failed: report and abort (libFuzzer saves the input). */
#define FUZZ_CHECK(cond, ...)                                                              \
	do {                                                                               \
		if (!(cond)) {                                                             \
			fprintf(stderr, "invariant failed at %s:%d: %s: ", __FILE__, __LINE__, #cond); \
			fprintf(stderr, __VA_ARGS__);                                      \
			fputc('\n', stderr);                                               \
			abort();                                                           \
		}                                                                          \
	} while (0)

/* TSSHIM_FUZZ_TRACE=1: say what each input did (on stderr), to check seeds. */
static int fuzz_trace = -1;
#define FUZZ_TRACE(...)                                                                    \
	do {                                                                               \
		if (fuzz_trace < 0)                                                        \
			fuzz_trace = getenv("TSSHIM_FUZZ_TRACE") != NULL;                  \
		if (fuzz_trace)                                                            \
			fprintf(stderr, __VA_ARGS__);                                      \
	} while (0)

/* A little-endian cursor over the fuzzer's bytes; reads past the end give 0. */
struct fz {
	const uint8_t *p;
	size_t n;
};

static inline uint8_t fz_u8(struct fz *f)
{
	if (!f->n)
		return 0;
	f->n--;
	return *f->p++;
}

static inline uint64_t fz_bytes(struct fz *f, unsigned k)
{
	uint64_t v = 0;
	for (unsigned i = 0; i < k; i++)
		v |= (uint64_t)fz_u8(f) << (8 * i);
	return v;
}

#define fz_u16(f) ((uint16_t)fz_bytes((f), 2))
#define fz_u32(f) ((uint32_t)fz_bytes((f), 4))
#define fz_u64(f) fz_bytes((f), 8)

#endif
