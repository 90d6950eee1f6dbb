/* SPDX-License-Identifier: MIT */
/*
 * libFuzzer target: session segments (and decoded-cache segments) as read
 * from /dev/shm by tsshim-inspect and by a joining member.
 *
 * The input is one flags byte and the bytes of a segment file:
 *
 *   flags & 3   what reads the file:
 *                 0, 3  the validator on a buffer of exactly the file's size
 *                       (ASan sees any over-read), then tsshim-inspect's own
 *                       read path (tools/inspect.c is compiled in: load_session,
 *                       text and JSON output of a session and of a list row),
 *                       then ts_session_remove_if_stale (inspect --clean)
 *                 1     a member: ts_session_join on the file placed under a
 *                       session's name, then the ring as consumer (slot_meta,
 *                       attach_at, peek, advance) and as producer (begin,
 *                       publish) with zero timeouts, then leave
 *                 2     the decoded-image cache: ts_cache_validate on a buffer,
 *                       ts_cache_view (inspect's cache counters) on the file
 *   flags & 4   zero-extend the file to the full segment size (seeds are real
 *               segments with their trailing zeros cut off)
 *   flags & 8   fix up: set the owner uid to ours and recompute the header
 *               checksum, so mutations get past both
 *   flags & 16  one more page beyond the full size
 *   flags & 32  mode 0640 instead of 0600: must be refused
 *   flags >> 6  consumer batch size multiplier - 1 (join mode)
 *
 * Invariants (abort = finding): the file reader agrees with the buffer
 * validator; a valid segment's header fields are in range; the inspect
 * snapshot never indexes past its arrays; an invalid segment is never
 * removed; ring ranges stay inside the slot lengths they report.
 */
#define main tsshim_inspect_main
int tsshim_inspect_main(int argc, char **argv);
#include "../../tools/inspect.c"
#undef main

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "fuzz_common.h"
#include "log.h"

enum {
	F_TARGET = 3,
	F_SPARSE = 4,
	F_FIXUP = 8,
	F_EXTRA = 16,
	F_BADPERM = 32,
};

#define FAKE_PID0 100u /* pids FAKE_PID0..FAKE_PID0+63 are alive, start time pid * 3 */
#define CACHE_FILE_MAX (64ull << 20)

static char dir[64], seg_file[128], join_name[TS_NAME_MAX], join_path[TS_PATH_MAX];
static struct ts_ident me;
static struct snap *snapshot_buf;

static int fake_start(uint32_t pid, uint64_t *out)
{
	if (pid == me.pid) {
		*out = me.start_time;
		return 0;
	}
	if (pid >= FAKE_PID0 && pid < FAKE_PID0 + TS_MAX_MEMBERS) {
		*out = (uint64_t)pid * 3;
		return 0;
	}
	return -ESRCH;
}

static void cleanup(void)
{
	unlink(seg_file);
	unlink(join_path);
	rmdir(dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	if (!freopen("/dev/null", "w", stdout))
		abort();
	ts_log_fd = open("/dev/null", O_WRONLY | O_CLOEXEC);
	snprintf(dir, sizeof(dir), "%s/tsshim-fuzz.XXXXXX", ts_shm_dir());
	if (!mkdtemp(dir) || ts_self_ident(&me) != 0)
		abort();
	snprintf(seg_file, sizeof(seg_file), "%s/segment", dir);
	snprintf(join_name, sizeof(join_name), "fuzz-%u", (unsigned)getpid());
	if (ts_segment_path(join_path, sizeof(join_path), getuid(), join_name) != 0)
		abort();
	ts_prim.proc_start_time = fake_start;
	snapshot_buf = calloc(1, sizeof(*snapshot_buf));
	if (!snapshot_buf)
		abort();
	atexit(cleanup);
	return 0;
}

static size_t full_segment_bytes(void)
{
	size_t p = (size_t)sysconf(_SC_PAGESIZE);
	return (sizeof(struct ts_segment) + p - 1) / p * p;
}

/* The file: `size` bytes, the first `n` from img. */
static void write_file(const char *path, const void *img, size_t n, size_t size, mode_t mode)
{
	unlink(path);
	int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0 || fchmod(fd, mode) != 0 || ftruncate(fd, (off_t)size) != 0 ||
	    (n && pwrite(fd, img, n, 0) != (ssize_t)n)) {
		perror("fuzz_segment: writing the segment file");
		abort();
	}
	close(fd);
}

/* ---- tsshim-inspect's read path ------------------------------------------ */

static void check_snapshot(const struct snap *s)
{
	FUZZ_CHECK(s->depth >= 1 && s->depth <= TS_MAX_DEPTH, "depth %u", s->depth);
	FUZZ_CHECK(s->nmembers <= TS_MAX_MEMBERS, "nmembers %u", s->nmembers);
	FUZZ_CHECK(s->producer < (int)TS_MAX_MEMBERS, "producer %d", s->producer);
	FUZZ_CHECK(memchr(s->label, '\0', sizeof(s->label)) != NULL, "label unterminated");
	for (unsigned i = 0; i < s->depth; i++) {
		const struct slot_snap *ss = &s->slots[i];
		FUZZ_CHECK(!ss->has_meta || ss->npos <= TS_MAX_POSITIONS, "slot %u npos %u", i, ss->npos);
		FUZZ_CHECK(ss->writer < (int)TS_MAX_MEMBERS, "slot %u writer %d", i, ss->writer);
	}
}

static void inspect_case(const uint8_t *img, size_t n, size_t size, mode_t mode, int expect)
{
	struct snap *s = snapshot_buf;
	char why[160] = "";
	write_file(seg_file, img, n, size, mode);
	int r = load_session(seg_file, s, why, sizeof(why));
	FUZZ_TRACE("inspect: %d %s\n", r, why);
	FUZZ_CHECK(r == expect, "file reader says %d (%s), buffer validator %d", r, why, expect);
	if (r == 0) {
		s->has_session = 1;
		check_snapshot(s);
		text_session(s);
		json_session(s);
		struct entry e = {0};
		snprintf(e.path, sizeof(e.path), "%s", seg_file);
		snprintf(e.name, sizeof(e.name), "%s", s->name);
		text_list_row(8, &e, s, NULL);
		struct jw j;
		j_begin(&j);
		j_open(&j, "sessions", '[');
		json_list_item(&j, &e, s, NULL);
		j_close(&j, ']');
		j_end(&j);
	} else {
		FUZZ_CHECK(why[0] != '\0', "refused (%d) without a reason", r);
	}
	/* inspect --clean: never removes what it cannot validate */
	int rm = ts_session_remove_if_stale(seg_file);
	FUZZ_CHECK(!(rm == 1 && expect != 0), "removed an invalid segment (%d)", expect);
	unlink(seg_file);
}

/* ---- a member's path: join, then the ring --------------------------------- */

static void check_read(const struct ts_read *rd, uint32_t npos, const uint64_t *want)
{
	FUZZ_CHECK(rd->nranges <= TS_READ_MAX_RANGES, "nranges %u", rd->nranges);
	for (uint32_t p = 0; p < npos; p++) {
		uint64_t sum = 0;
		for (uint32_t k = 0; k < rd->nranges; k++) {
			const struct ts_range *r = &rd->r[p][k];
			FUZZ_CHECK(r->len <= r->slot_len && r->off <= r->slot_len - r->len,
				   "range %u/%u: off %llu len %llu slot_len %llu", p, k, (unsigned long long)r->off,
				   (unsigned long long)r->len, (unsigned long long)r->slot_len);
			FUZZ_CHECK(r->writer < TS_MAX_MEMBERS, "writer %u", r->writer);
			sum += r->len;
		}
		FUZZ_CHECK(sum == rd->got[p] && rd->got[p] <= want[p], "position %u: got %llu, ranges %llu, want %llu", p,
			   (unsigned long long)rd->got[p], (unsigned long long)sum, (unsigned long long)want[p]);
	}
}

static void ring_ops(struct ts_session *s, unsigned mult)
{
	struct ts_segment *seg = s->seg;
	struct ts_batch_meta m;
	unsigned writer;
	uint64_t pub = atomic_load(&seg->ring.pub_seq);
	struct ts_ring_reader r;
	if (pub && ts_ring_slot_meta(seg, pub - 1, &m, &writer) == 0) {
		FUZZ_CHECK(ts_batch_meta_valid(&m) == 0 && writer < TS_MAX_MEMBERS, "slot_meta returned a bad row");
		uint64_t want[TS_MAX_POSITIONS];
		for (uint32_t p = 0; p < m.npos; p++)
			want[p] = m.len[p] / m.nsamples * mult;
		if (ts_ring_attach_at(seg, s->self, &r, pub - 1) == 0) {
			static struct ts_read rd;
			int pr = ts_ring_peek(seg, &r, m.npos, want, &rd, 0);
			FUZZ_TRACE("join: peek %d nranges %u got %llu\n", pr, rd.nranges, (unsigned long long)rd.got[0]);
			if (pr == 0) {
				check_read(&rd, m.npos, want);
				(void)ts_ring_advance(seg, &r, &rd, rd.got);
			}
			ts_ring_detach(seg, &r);
		}
	}
	if (ts_session_tick(s) == TS_ROLE_PRODUCER) {
		struct ts_ring_writer w;
		struct ts_batch_meta *row;
		if (ts_ring_writer_init(seg, s->self, &w) == 0 && ts_ring_begin(seg, &w, 0, &row) == 0) {
			row->npos = 2;
			row->nsamples = 4;
			row->len[0] = 4 * 12;
			row->len[1] = 4 * 8;
			FUZZ_CHECK(ts_ring_publish(seg, &w) != -EINVAL, "publish refused a valid row");
		}
	}
}

static void join_case(const uint8_t *img, size_t n, size_t size, unsigned mult)
{
	struct ts_session s;
	write_file(join_path, img, n, size, 0600);
	int r = ts_session_join(&s, join_name, &(struct ts_session_params){ .depth = 4, .timeout_ms = 1000 });
	FUZZ_TRACE("join: %d %s\n", r, s.why);
	if (r == 0) {
		FUZZ_CHECK(s.self >= 0 && s.self < (int)TS_MAX_MEMBERS, "self %d", s.self);
		ring_ops(&s, mult);
		ts_session_leave(&s);
	}
	unlink(join_path);
}

/* ---- the decoded-image cache ---------------------------------------------- */

static void cache_case(uint8_t flags, const uint8_t *body, size_t blen)
{
	uint8_t *img = malloc(blen ? blen : 1);
	char why[160] = "";
	if (!img)
		abort();
	memcpy(img, body, blen);
	struct ts_cache_static *st = (struct ts_cache_static *)img;
	size_t size = blen;
	if (blen >= sizeof(*st)) {
		if (flags & F_FIXUP) {
			st->uid = (uint32_t)getuid();
			st->checksum = ts_cache_static_checksum(st);
		}
		if ((flags & F_SPARSE) && st->segment_size > blen && st->segment_size <= CACHE_FILE_MAX)
			size = (size_t)st->segment_size;
	}
	int v = ts_cache_validate((const struct ts_cache_header *)img, blen, getuid(), why, sizeof(why));
	FUZZ_CHECK(v != 0 || blen >= sizeof(struct ts_cache_header), "valid at %zu bytes", blen);
	write_file(seg_file, img, blen, size, flags & F_BADPERM ? 0640 : 0600);
	struct ts_cache_stats cs;
	int r = ts_cache_view(seg_file, &cs, why, sizeof(why));
	FUZZ_TRACE("cache: validate %d, view %d %s\n", v, r, why);
	if (flags & F_BADPERM)
		FUZZ_CHECK(r != 0, "mode 0640 accepted");
	if (r == 0) {
		FUZZ_CHECK(cs.capacity >= TS_CACHE_MIN_ENTRIES && cs.capacity <= TS_CACHE_MAX_ENTRIES,
			   "capacity %llu", (unsigned long long)cs.capacity);
		FUZZ_CHECK(cs.entries + cs.filling <= cs.capacity, "entries");
		FUZZ_CHECK(memchr(cs.scope, '\0', sizeof(cs.scope)) != NULL, "scope unterminated");
	}
	unlink(seg_file);
	free(img);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	uint8_t flags = data[0];
	const uint8_t *body = data + 1;
	size_t blen = size - 1, full = full_segment_bytes();
	unsigned target = flags & F_TARGET;

	if (target == 2) {
		cache_case(flags, body, blen);
		return 0;
	}
	size_t len = blen;
	if ((flags & F_SPARSE) && len < full)
		len = full;
	if (flags & F_EXTRA)
		len += 4096;
	/* exactly len bytes: ASan flags any read past what the file holds */
	uint8_t *img = calloc(1, len ? len : 1);
	if (!img)
		abort();
	memcpy(img, body, blen);
	struct ts_static *st = (struct ts_static *)img;
	size_t n = blen;
	if ((flags & F_FIXUP) && len >= sizeof(*st)) {
		st->uid = (uint32_t)getuid();
		st->checksum = ts_static_checksum(st);
		if (n < sizeof(*st))
			n = sizeof(*st);
	}
	char why[160] = "";
	int v = ts_segment_validate((const struct ts_segment *)img, len, getuid(), why, sizeof(why));
	if (v == 0) {
		FUZZ_CHECK(len >= sizeof(struct ts_segment) && st->segment_size <= len, "valid at %zu bytes", len);
		FUZZ_CHECK(st->depth >= 1 && st->depth <= TS_MAX_DEPTH, "depth %u", st->depth);
		FUZZ_CHECK(ts_session_name_valid(st->name), "name");
	} else {
		FUZZ_CHECK(why[0] != '\0', "refused (%d) without a reason", v);
	}
	if (target == 1) {
		join_case(img, n, len, 1u + (flags >> 6));
	} else {
		int expect = v;
		if (flags & F_BADPERM)
			expect = -EACCES;
		else if (len < sizeof(struct ts_static))
			expect = -EBADMSG;
		inspect_case(img, n, len, flags & F_BADPERM ? 0640 : 0600, expect);
	}
	free(img);
	return 0;
}
