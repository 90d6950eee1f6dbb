/* SPDX-License-Identifier: MIT */
/*
 * libFuzzer target: a feed consumer reading a slot file whose header a peer
 * corrupted. peer_file()/hdr_matches() in core/feed.c are static, so this
 * goes through the public API, in one process: a producer feed and a
 * consumer feed join one session, the producer publishes one batch, the
 * input patches the slot file's header, then the consumer describes the
 * slot (ts_feed_next), reads it by copy (ts_feed_read) or without a copy
 * (ts_feed_read_view), and asks for the stream state (the successor's
 * path, which reads the sample indices).
 *
 * Input: one flags byte (bit 0: read_view instead of read; bit 1: also
 * stream_state; bits 2-7: consumer batch in samples - 1), then patches of
 * the header: a 16-bit offset (taken modulo the header's fixed part plus
 * the index), a length byte (at most 32), the bytes. No patch: the
 * published header, which must read back exactly.
 *
 * Invariants (abort = finding): no out-of-bounds access (ASan: the copy's
 * destination is exactly want[] bytes); bytes that are read back are the
 * published ones unless the patch touched the header; a view lies in its
 * mapping's bytes.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "feed.h"
#include "fuzz_common.h"
#include "log.h"

#define NSAMPLES 4
#define NINDEX   64
#define PATCH_SPAN 512 /* the header's fixed fields (304 bytes) and then some */

static char name[TS_NAME_MAX];
static const uint64_t unit[2] = { 12, 4 };
static uint8_t src0[NSAMPLES * 12], src1[NSAMPLES * 4];

/* The last iteration's slot files and ledger (a crash leaves them: ts_feed_clean_stale(NAME) removes them). */
static void cleanup(void)
{
	ts_feed_clean_stale(name, 0);
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	atexit(cleanup);
	snprintf(name, sizeof(name), "fuzzfeed-%u", (unsigned)getpid());
	ts_log_fd = open("/dev/null", O_WRONLY | O_CLOEXEC);
	for (unsigned i = 0; i < sizeof(src0); i++)
		src0[i] = (uint8_t)(i * 7 + 1);
	for (unsigned i = 0; i < sizeof(src1); i++)
		src1[i] = (uint8_t)(i * 13 + 5);
	return 0;
}

static void consume(struct ts_feed *c, uint8_t flags, int patched)
{
	struct ts_feed_info *info = malloc(sizeof(*info));
	if (!info)
		abort();
	int ret = ts_feed_next(c, 0, info);
	FUZZ_TRACE("next: %d\n", ret);
	if (!patched)
		FUZZ_CHECK(ret == 0, "next of the published batch: %d", ret);
	if (ret == 0) {
		FUZZ_CHECK(info->npos >= 1 && info->npos <= TS_MAX_POSITIONS && info->schema_len <= TS_FEED_SCHEMA_MAX,
			   "info npos %u schema_len %u", info->npos, info->schema_len);
		uint64_t samples = 1 + (flags >> 2) % NSAMPLES;
		uint64_t want[2] = { samples * unit[0], samples * unit[1] }, got[2] = { 0, 0 };
		int eoe = 0;
		if (flags & 1) {
			void *ptr[2] = { NULL, NULL };
			uint64_t id = 0;
			ret = ts_feed_read_view(c, 2, want, ptr, got, &eoe, &id, 0);
			FUZZ_TRACE("read_view: %d got %llu\n", ret, (unsigned long long)got[0]);
			if (ret == 0) {
				/* touch every byte handed out: ASan/SEGV if a view is not backed */
				volatile uint8_t sum = 0;
				for (int p = 0; p < 2; p++)
					for (uint64_t i = 0; i < got[p]; i++)
						sum += ((const uint8_t *)ptr[p])[i];
				(void)sum;
				if (!patched)
					FUZZ_CHECK(memcmp(ptr[0], src0, got[0]) == 0 && memcmp(ptr[1], src1, got[1]) == 0,
						   "view differs from the published bytes");
				ts_feed_release_view(c, id);
			}
		} else {
			uint8_t *d0 = malloc(want[0]), *d1 = malloc(want[1]);
			void *const dst[2] = { d0, d1 };
			if (!d0 || !d1)
				abort();
			ret = ts_feed_read(c, 2, want, dst, got, &eoe, 0);
			FUZZ_TRACE("read: %d got %llu\n", ret, (unsigned long long)got[0]);
			FUZZ_CHECK(got[0] <= want[0] && got[1] <= want[1], "read past want");
			if (ret == 0 && !patched)
				FUZZ_CHECK(got[0] == want[0] && memcmp(d0, src0, got[0]) == 0 && memcmp(d1, src1, got[1]) == 0,
					   "read differs from the published bytes");
			free(d0);
			free(d1);
		}
	}
	if (flags & 2) {
		static int64_t rest[NINDEX];
		uint64_t epoch, nrest, npub;
		int ended;
		ret = ts_feed_stream_state(c, &epoch, &ended, rest, &nrest, &npub, 0);
		FUZZ_TRACE("stream_state: %d epoch %llu ended %d nrest %llu\n", ret, (unsigned long long)epoch, ended,
			   (unsigned long long)nrest);
		if (ret == 0 && !ended) {
			FUZZ_CHECK(nrest <= NINDEX, "nrest %llu", (unsigned long long)nrest);
			for (uint64_t i = 0; i < nrest; i++)
				FUZZ_CHECK(rest[i] >= 0 && rest[i] < NINDEX && (i == 0 || rest[i] > rest[i - 1]),
					   "rest[%llu] = %lld", (unsigned long long)i, (long long)rest[i]);
			if (!patched)
				FUZZ_CHECK(nrest == NINDEX - NSAMPLES && npub == NSAMPLES, "nrest %llu npub %llu",
					   (unsigned long long)nrest, (unsigned long long)npub);
		}
	}
	free(info);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct ts_feed p, c; /* big: not on the stack */
	struct fz f = { data, size };
	struct ts_session_params sp = { .depth = 2, .timeout_ms = 1000, .label = "fuzz" };
	uint8_t flags = fz_u8(&f);

	if (ts_feed_open(&p, name, &sp, NINDEX) != 0)
		abort();
	if (ts_feed_open(&c, name, &sp, NINDEX) != 0)
		abort();
	FUZZ_CHECK(ts_feed_role(&p) == TS_ROLE_PRODUCER && ts_feed_role(&c) == TS_ROLE_CONSUMER, "roles");
	FUZZ_CHECK(ts_feed_attach(&c, 0) == 0, "attach");
	static const int64_t index[NSAMPLES] = { 0, 1, 2, 3 };
	const uint64_t len[2] = { sizeof(src0), sizeof(src1) };
	const void *const src[2] = { src0, src1 };
	struct ts_feed_batch b = { .npos = 2, .nsamples = NSAMPLES, .len = len, .src = src, .index = index,
				   .stream_epoch = 1, .schema = "fuzz-schema", .schema_len = 11 };
	FUZZ_CHECK(ts_feed_publish(&p, &b, 1000000000ull) == 0, "publish");
	/* the producer's own mapping of the slot file it just wrote */
	uint8_t *base = NULL;
	size_t map_size = 0;
	for (unsigned i = 0; i < TS_MAX_DEPTH && !base; i++)
		if (p.own[i].base) {
			base = p.own[i].base;
			map_size = p.own[i].size;
		}
	FUZZ_CHECK(base && map_size > PATCH_SPAN, "no slot file");
	int patched = 0;
	while (f.n) {
		size_t off = fz_u16(&f) % PATCH_SPAN, n = fz_u8(&f) % 33;
		for (size_t i = 0; i < n && off + i < PATCH_SPAN; i++)
			base[off + i] = fz_u8(&f);
		patched = 1;
	}
	consume(&c, flags, patched);
	ts_feed_close(&c);
	ts_feed_close(&p);
	return 0;
}
