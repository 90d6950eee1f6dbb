/* SPDX-License-Identifier: MIT */
/*
 * Data feeds (see feed.h). Memory ordering rides on the ring: a producer
 * writes a slot file only between ts_ring_begin() and ts_ring_publish()
 * (release), a reader reads it only between ts_ring_peek() (acquire) and a
 * successful ts_ring_advance(). The ledger is a seqlock on its epoch word.
 */
#include "feed.h"

#include <dirent.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hash.h"
#include "log.h"
#include "prim.h"

#define FEED_MAGIC    0x31304445454653ULL /* "SFEED01" */
#define LEDGER_MAGIC  0x3130524744454cULL /* "LEDGR01" */
#define FEED_VERSION  3u /* 3: the ledger's made word (a build without it misreads a lone producer's stream) */
#define PAGE          4096ull
#define NO_EPOCH      UINT64_MAX

struct ts_feed_hdr {
	uint64_t magic;
	uint32_t version;
	uint32_t hdr_size;       /* first data byte; page multiple */
	uint64_t seq;            /* ring seq these bytes belong to */
	uint64_t stream_epoch;
	uint64_t nsamples;
	uint64_t schema_hash;
	uint32_t npos;
	uint32_t schema_len;
	uint64_t index_off;      /* nsamples int64 dataset indices */
	uint64_t holders;        /* atomic: bit i set while member i has views into this file */
	uint64_t off[TS_MAX_POSITIONS];
	uint64_t len[TS_MAX_POSITIONS];
	char schema[TS_FEED_SCHEMA_MAX];
};

#define HDR_SIZE ((sizeof(struct ts_feed_hdr) + PAGE - 1) / PAGE * PAGE)

struct ts_feed_ledger {
	uint64_t magic;
	uint32_t version;
	uint32_t pad;
	uint64_t nbits;
	_Atomic uint64_t epoch;  /* stream epoch of the bits; NO_EPOCH while rewritten */
	_Atomic uint64_t made;   /* LEDGER_MADE, LEDGER_ENDED: of this epoch, by ts_feed_made */
	uint64_t pad2[3];
	_Atomic uint64_t bits[];
};

/*
 * A producer alone in its feed publishes nothing; it notes each batch in the
 * ledger only (ts_feed_made). LEDGER_MADE: a batch of the ledger's epoch is
 * not in the ring (a joiner finds the epoch's start gone and notes what the
 * ledger holds as lost); LEDGER_ENDED: the epoch's last batch was noted (the
 * next batch published starts an epoch, whole).
 */
#define LEDGER_MADE   1ull
#define LEDGER_ENDED  2ull

static inline uint64_t page_up(uint64_t v)
{
	return (v + PAGE - 1) / PAGE * PAGE;
}

static void map_drop(struct ts_feed_map *m)
{
	if (m->base)
		munmap(m->base, m->size);
	if (m->base && m->fd >= 0)
		close(m->fd);
	memset(m, 0, sizeof(*m));
	m->fd = -1;
}

static int feed_path(char *buf, size_t n, const struct ts_feed *f, const char *kind)
{
	int len = snprintf(buf, n, "%s/" TS_FEED_PREFIX "%u.%s.%llx.%s", ts_shm_dir(), (unsigned)getuid(),
			   f->s.name, (unsigned long long)f->incarnation, kind);
	return len < 0 || (size_t)len >= n ? -ENAMETOOLONG : 0;
}

static int slot_path(char *buf, size_t n, const struct ts_feed *f, uint32_t writer, uint32_t epoch, uint32_t slot,
		     uint32_t gen)
{
	char kind[64];
	snprintf(kind, sizeof(kind), "w%u.e%u.s%u.g%u", writer, epoch, slot, gen);
	return feed_path(buf, n, f, kind);
}

/* The ring meta tag of a slot file: whose epoch, which generation. */
static inline uint64_t make_tag(uint32_t epoch, uint32_t gen)
{
	return (uint64_t)epoch | (uint64_t)gen << 32;
}

/* Reserve the blocks now: a full /dev/shm is an error here, not a SIGBUS later. */
static int grow(int fd, uint64_t size)
{
	int ret = ts_prim_reserve(fd, 0, size);
	if (ret == -EOPNOTSUPP || ret == -EINVAL)
		ret = ftruncate(fd, (off_t)size) ? ts_neg_errno() : 0;
	return ret;
}

/* ---- the ledger ------------------------------------------------------------ */

static uint64_t ledger_bytes(uint64_t nbits)
{
	return page_up(sizeof(struct ts_feed_ledger) + (nbits + 63) / 64 * 8);
}

static int ledger_check(const struct ts_feed_ledger *l, size_t size, uint64_t nbits)
{
	if (size < sizeof(*l) || l->magic != LEDGER_MAGIC || l->version != FEED_VERSION || l->nbits != nbits ||
	    size < ledger_bytes(nbits))
		return -EPROTO;
	return 0;
}

static int ledger_map(struct ts_feed *f, int fd)
{
	struct stat sb;
	if (fstat(fd, &sb))
		return -errno;
	int ret = ts_shm_file_ours(&sb);
	if (ret)
		return ret;
	if ((uint64_t)sb.st_size < ledger_bytes(f->nindex))
		return -EPROTO;
	void *m = mmap(NULL, (size_t)sb.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (m == MAP_FAILED)
		return -errno;
	if ((ret = ledger_check(m, (size_t)sb.st_size, f->nindex))) {
		munmap(m, (size_t)sb.st_size);
		return ret;
	}
	f->ledger = m;
	f->ledger_size = (size_t)sb.st_size;
	return 0;
}

/* Created under a temporary name and linked into place, so nobody maps a half-made one. */
static int ledger_open(struct ts_feed *f)
{
	char path[TS_PATH_MAX], tmp[TS_PATH_MAX + 48];
	int ret = feed_path(path, sizeof(path), f, "ledger");
	if (ret)
		return ret;
	for (int tries = 0; tries < 4; tries++) {
		int fd = open(path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
		if (fd >= 0) {
			ret = ledger_map(f, fd);
			close(fd);
			if (ret == -EACCES || ret == -EINVAL)
				snprintf(f->s.why, sizeof(f->s.why), "%s refused: not a 0600 file owned by uid %u", path,
					 (unsigned)getuid());
			else if (ret)
				snprintf(f->s.why, sizeof(f->s.why), "%s refused: not a valid ledger", path);
			return ret;
		}
		ret = -errno;
		if (ret != -ENOENT) {
			if (ret == -EACCES) /* another user's, or not rw for us */
				snprintf(f->s.why, sizeof(f->s.why), "%s refused: not a 0600 file owned by uid %u", path,
					 (unsigned)getuid());
			else
				snprintf(f->s.why, sizeof(f->s.why), "%s refused: %s", path,
					 ret == -ELOOP ? "a symbolic link" : strerror(-ret));
			return ret;
		}
		if ((fd = ts_shm_create_tmp(path, tmp, sizeof(tmp))) < 0)
			return fd;
		uint64_t size = ledger_bytes(f->nindex);
		ret = grow(fd, size);
		struct ts_feed_ledger *l = ret ? MAP_FAILED :
			mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		if (l != MAP_FAILED) {
			l->magic = LEDGER_MAGIC;
			l->version = FEED_VERSION;
			l->nbits = f->nindex;
			atomic_store(&l->epoch, NO_EPOCH);
			munmap(l, size);
			ret = link(tmp, path) && errno != EEXIST ? -errno : 0;
		} else if (!ret) {
			ret = -errno;
		}
		unlink(tmp);
		close(fd);
		if (ret)
			return ret;
	}
	return -EAGAIN;
}

/*
 * The ledger, made to hold stream epoch `epoch`: 0, or -1 when it holds a
 * later one (a producer stopped between its publish and its mark, that
 * wakes after its successor moved on, must not take the ledger back).
 * Stream epochs go up by one: a word far ahead is a peer's garbage, and
 * is reset like any other.
 */
#define LEDGER_AHEAD (1ull << 20)

static int ledger_at(struct ts_feed *f, uint64_t epoch)
{
	struct ts_feed_ledger *l = f->ledger;
	uint64_t e = atomic_load_explicit(&l->epoch, memory_order_relaxed);
	if (e == epoch)
		return 0;
	if (e != NO_EPOCH && e > epoch && e - epoch <= LEDGER_AHEAD)
		return -1;
	/* NO_EPOCH first: a reader that sees the new epoch sees cleared bits */
	atomic_store_explicit(&l->epoch, NO_EPOCH, memory_order_seq_cst);
	/* our nindex, not the file's nbits: checked equal at open, but a peer may rewrite it since */
	for (uint64_t i = 0; i < (f->nindex + 63) / 64; i++)
		atomic_store_explicit(&l->bits[i], 0, memory_order_relaxed);
	atomic_store_explicit(&l->made, 0, memory_order_relaxed);
	atomic_store_explicit(&l->epoch, epoch, memory_order_release);
	return 0;
}

/* Set (clear) the bits of b's indices. */
static void ledger_bits(struct ts_feed_ledger *l, const struct ts_feed *f, const struct ts_feed_batch *b, bool set)
{
	for (uint64_t i = 0; i < b->nsamples; i++) {
		uint64_t x = (uint64_t)b->index[i], bit = 1ull << (x % 64);
		if (x >= f->nindex)
			continue;
		if (set)
			atomic_fetch_or_explicit(&l->bits[x / 64], bit, memory_order_relaxed);
		else
			atomic_fetch_and_explicit(&l->bits[x / 64], ~bit, memory_order_relaxed);
	}
}

/* Producer, after publishing: mark the batch's indices in its stream epoch. */
static void ledger_mark(struct ts_feed *f, const struct ts_feed_batch *b)
{
	struct ts_feed_ledger *l = f->ledger;
	/* replaced since our publish: our successor took the batch from the ring (ts_feed_stream_state) */
	if (!l || !b->index || ts_session_role(&f->s) != TS_ROLE_PRODUCER || ledger_at(f, b->stream_epoch))
		return;
	ledger_bits(l, f, b, true);
}

/*
 * The ledger's epoch and made flags, read as one (0), or -EAGAIN while a
 * producer rewrites it. Readers that act on what a producer alone noted
 * (ts_feed_made) call it after a full fence (ledger_look). noinline, as
 * ledger_look.
 */
__attribute__((noinline)) static int ledger_state(const struct ts_feed *f, uint64_t *epoch, uint64_t *made)
{
	const struct ts_feed_ledger *l = f->ledger;
	if (!l)
		return -ENOENT;
	for (int tries = 0; tries < 8; tries++) {
		uint64_t e = atomic_load_explicit(&l->epoch, memory_order_acquire);
		*made = atomic_load_explicit(&l->made, memory_order_relaxed);
		atomic_thread_fence(memory_order_acquire);
		if (e != NO_EPOCH && atomic_load_explicit(&l->epoch, memory_order_relaxed) == e) {
			*epoch = e;
			return 0;
		}
	}
	return -EAGAIN;
}

/*
 * ledger_state after a full fence: the reader's half of the pairing with
 * ts_feed_made (see there). noinline: inlined, the fence trips GCC's -Wtsan
 * in the TSan build.
 */
__attribute__((noinline)) static int ledger_look(const struct ts_feed *f, uint64_t *epoch, uint64_t *made)
{
	atomic_thread_fence(memory_order_seq_cst);
	return ledger_state(f, epoch, made);
}

/*
 * Does the ledger speak for the stream? When a batch of its epoch e was
 * made without the ring and e is the ring's newest epoch re, or later.
 */
static inline bool ledger_leads(uint64_t e, uint64_t made, uint64_t re)
{
	return (made & LEDGER_MADE) && e >= re && e - re <= LEDGER_AHEAD;
}

/* ---- open, close, stale files --------------------------------------------- */

static void on_role(enum ts_role role, uint32_t epoch, void *arg)
{
	const struct ts_session *s = arg;
	ts_info("%s of feed '%s' (epoch %u)", role == TS_ROLE_PRODUCER ? "producer" : "consumer", s->name, epoch);
}

int ts_feed_open(struct ts_feed *f, const char *name, const struct ts_session_params *p, uint64_t nindex)
{
	memset(f, 0, sizeof(*f));
	for (unsigned i = 0; i < TS_MAX_DEPTH; i++)
		f->own[i].fd = f->peer[i].fd = -1;
	if (nindex == 0 || nindex > TS_FEED_MAX_INDEX)
		return -EINVAL;
	f->nindex = nindex;
	if (!(f->hdr_snap = malloc(sizeof(*f->hdr_snap))))
		return -ENOMEM;
	/*
	 * Two slots at least: a successor's fence claims the next slot while it
	 * still has to read the last batch published. With one, the claim took
	 * that batch's slot, stream_state failed with -ESTALE at every call, and
	 * the open claim held every consumer back.
	 */
	struct ts_session_params q = *p;
	if (q.depth < 2)
		q.depth = 2;
	int ret = ts_session_join(&f->s, name, &q);
	if (ret) {
		free(f->hdr_snap);
		f->hdr_snap = NULL;
		return ret;
	}
	f->incarnation = f->s.seg->st.created_unix_ns;
	ts_feed_clean_stale(name, 0);
	if ((ret = ledger_open(f)) == 0 &&
	    (ret = ts_heartbeat_start(&f->hb, &f->s, on_role, &f->s)) == 0) {
		f->hb_running = 1;
		return 0;
	}
	ts_feed_close(f);
	return ret;
}

static struct ts_feed_view *free_view(struct ts_feed *f);

void ts_feed_close(struct ts_feed *f)
{
	ts_feed_detach_views(f, NULL, NULL);
	if (f->hb_running)
		ts_heartbeat_stop(&f->hb);
	f->hb_running = 0;
	if (f->s.seg && f->attached)
		ts_ring_detach(f->s.seg, &f->r);
	f->attached = 0;
	if (f->s.seg && f->w.claimed)
		ts_ring_abort(f->s.seg, &f->w);
	for (unsigned i = 0; i < TS_MAX_DEPTH; i++) {
		map_drop(&f->own[i]);
		map_drop(&f->peer[i]);
	}
	if (f->ledger)
		munmap(f->ledger, f->ledger_size);
	f->ledger = NULL;
	free(f->hdr_snap);
	f->hdr_snap = NULL;
	char name[TS_NAME_MAX];
	snprintf(name, sizeof(name), "%s", f->s.name);
	ts_session_leave(&f->s);
	if (name[0])
		ts_feed_clean_stale(name, f->incarnation);
}

enum ts_role ts_feed_role(struct ts_feed *f)
{
	return ts_session_role(&f->s);
}

/*
 * Files of `session_name` whose incarnation is not the live segment's: left
 * by a session that ended (or crashed). Removing them is safe: nobody can
 * reach them through a segment any more.
 *
 * A segment whose members are all dead is not live either: it is removed
 * first (under its lock, as the last leaver would have). That is how a
 * feed ends whose last member was SIGKILLed after every other member had
 * left: the others left while it lived, and it could not leave.
 */
/* The incarnation of a valid segment at seg_path: 0; -ENOENT: none there; else unreadable. */
static int segment_incarnation(const char *seg_path, uint64_t *inc)
{
	char why[160];
	struct ts_view v;
	int ret = ts_view_open(&v, seg_path, why, sizeof(why));
	if (ret == 0) {
		if ((ret = ts_segment_validate(v.seg, v.map_size, getuid(), why, sizeof(why))) == 0)
			*inc = v.seg->st.created_unix_ns;
		ts_view_close(&v);
	} else if (access(seg_path, F_OK) != 0) {
		ret = -ENOENT;
	}
	return ret;
}

/* Past the decimal digits at s, or NULL when there are none. */
static const char *past_digits(const char *s)
{
	const char *p = s;
	while (*p >= '0' && *p <= '9')
		p++;
	return p > s ? p : NULL;
}

/* Past "<c1><digits>.<c2><digits>..." (tags "wesg": a slot file), or NULL. */
static const char *past_tagged(const char *k, const char *tags)
{
	for (size_t i = 0; k && tags[i]; i++) {
		if ((i && *k++ != '.') || *k++ != tags[i])
			return NULL;
		k = past_digits(k);
	}
	return k;
}

/*
 * What follows "<prefix><session>." in one of that session's own file names:
 * "<incarnation>.<kind>", kind ledger, gpu or a slot file, perhaps with the
 * suffix of a temporary. Session names hold dots: the files of session
 * "sweep.2" start like those of "sweep", and taking "2" for an incarnation
 * removed a live session's ledger.
 */
static int feed_file_of(const char *rest, unsigned long long *inc)
{
	char *end;
	if (!isxdigit((unsigned char)rest[0]))
		return 0;
	*inc = strtoull(rest, &end, 16);
	if (*end != '.')
		return 0;
	const char *kind = end + 1;
	if (!strncmp(kind, "ledger", 6))
		kind += 6;
	else if (!strncmp(kind, "gpu", 3))
		kind += 3;
	else if (!(kind = past_tagged(kind, "wesg")))
		return 0;
	if (*kind == '\0')
		return 1;
	if (strncmp(kind, ".tmp", 4) != 0) /* else ts_shm_create_tmp's ".tmpPID.N" */
		return 0;
	kind = past_digits(kind + 4);
	kind = kind && *kind == '.' ? past_digits(kind + 1) : NULL;
	return kind && *kind == '\0';
}

int ts_feed_clean_stale(const char *session_name, uint64_t ended)
{
	char seg_path[TS_PATH_MAX], prefix[TS_PATH_MAX], path[TS_PATH_MAX * 2];
	uint64_t live = 0, ended2 = 0;
	/*
	 * A joiner may create the session anew while we look (the segment we
	 * read was gone, or was removed just above): its files are named by an
	 * incarnation it stamped a moment before linking its segment, after our
	 * start or within a second before it. Those are never ours to remove: a
	 * file that young goes only when its incarnation is known to have ended
	 * (`ended`, or the segment removed below), else at the next sweep.
	 */
	uint64_t young = ts_prim_realtime_ns() - 1000000000ull, seen = 0;
	if (ts_segment_path(seg_path, sizeof(seg_path), getuid(), session_name))
		return -EINVAL;
	/* A segment whose members are all dead: its incarnation ends here, young or not. */
	int got = segment_incarnation(seg_path, &seen);
	if (ts_session_remove_if_stale(seg_path) == 1 && got == 0)
		ended2 = seen;
	if ((got = segment_incarnation(seg_path, &live)) != 0 && got != -ENOENT)
		return 0; /* there but unreadable: do not guess */
	int plen = snprintf(prefix, sizeof(prefix), TS_FEED_PREFIX "%u.%s.", (unsigned)getuid(), session_name);
	unsigned long long inc;
	DIR *d = opendir(ts_shm_dir());
	if (!d)
		return -errno;
	int removed = 0;
	struct dirent *e;
	while ((e = readdir(d)) != NULL) {
		if (strncmp(e->d_name, prefix, (size_t)plen) != 0 || !feed_file_of(e->d_name + plen, &inc) ||
		    (live && inc == live) || (inc >= young && inc != ended && inc != ended2))
			continue;
		snprintf(path, sizeof(path), "%s/%s", ts_shm_dir(), e->d_name);
		removed += unlink(path) == 0;
	}
	closedir(d);
	return removed;
}

/* Files of other producers (or of our own earlier epochs) in this incarnation. */
static void remove_old_writers(struct ts_feed *f)
{
	char prefix[TS_PATH_MAX], mine[64], path[TS_PATH_MAX * 2];
	int plen = snprintf(prefix, sizeof(prefix), TS_FEED_PREFIX "%u.%s.%llx.w", (unsigned)getuid(), f->s.name,
			    (unsigned long long)f->incarnation);
	int mlen = snprintf(mine, sizeof(mine), "%u.e%u.", (unsigned)f->w.self, f->w.epoch);
	DIR *d = opendir(ts_shm_dir());
	if (!d)
		return;
	struct dirent *e;
	while ((e = readdir(d)) != NULL) {
		if (strncmp(e->d_name, prefix, (size_t)plen) != 0 || strncmp(e->d_name + plen, mine, (size_t)mlen) == 0)
			continue;
		snprintf(path, sizeof(path), "%s/%s", ts_shm_dir(), e->d_name);
		unlink(path);
	}
	closedir(d);
}

/* ---- producer ------------------------------------------------------------- */

static int writer_ready(struct ts_feed *f)
{
	uint64_t pw = atomic_load(&f->s.seg->producer);
	if (ts_producer_index(pw) != f->s.self)
		return -EPERM;
	if (pw == f->w_word)
		return 0;
	int ret = ts_ring_writer_init(f->s.seg, f->s.self, &f->w);
	if (ret)
		return ret;
	for (unsigned i = 0; i < TS_MAX_DEPTH; i++)
		map_drop(&f->own[i]); /* named after the old epoch */
	f->w_word = pw;
	f->published = 0;
	return 0;
}

/*
 * Does a live member hold views into this file? Read after our claim of the
 * slot: a consumer sets its bit before it advances past the slot (seq_cst
 * both sides, against an eviction racing the advance), so every hold that
 * matters is visible here. Bits of members that are gone do not count.
 */
static int held_by_live(const struct ts_feed *f, const struct ts_feed_hdr *h)
{
	uint64_t bits = __atomic_load_n(&h->holders, __ATOMIC_SEQ_CST), now = ts_now_ns();
	for (unsigned i = 0; bits && i < TS_MAX_MEMBERS; i++, bits >>= 1) {
		if ((bits & 1) && ts_member_alive(ts_member_health(f->s.seg, i, now)))
			return 1;
	}
	return 0;
}

/*
 * A feed's batch files keep to a quarter of /dev/shm (ts_shm_within_quarter).
 * Our slot files, with `slot` at `size` bytes: within it, or -ENOSPC (said
 * once), which turns sharing off for the loader as a full /dev/shm does.
 */
static int within_shm_share(const struct ts_feed *f, unsigned slot, uint64_t size)
{
	uint64_t total = size;
	for (unsigned i = 0; i < TS_MAX_DEPTH; i++)
		if (i != slot && f->own[i].base)
			total += f->own[i].size;
	if (ts_shm_within_quarter(total))
		return 0;
	static _Atomic int warned;
	if (!atomic_exchange(&warned, 1))
		ts_warn("feed %s: %llu MiB of batches would be more than a quarter of %s (the job's DataLoader "
			"workers need it too)", f->s.name, (unsigned long long)(total >> 20), ts_shm_dir());
	return -ENOSPC;
}

/* Our file for slot `slot`, at least `need` bytes, mapped read-write. */
static int own_file(struct ts_feed *f, unsigned slot, uint64_t need)
{
	struct ts_feed_map *m = &f->own[slot];
	char path[TS_PATH_MAX];
	int ret;
	if (m->base && held_by_live(f, m->base)) {
		/* A consumer still uses these bytes: leave them to it (unlinked, they
		 * live as long as its mapping) and write a fresh file. */
		if (slot_path(path, sizeof(path), f, m->writer, m->epoch, slot, m->gen) == 0)
			unlink(path);
		map_drop(m);
		f->gen[slot]++;
	}
	if (m->base && m->size >= need)
		return 0;
	if (!m->base) {
		if ((ret = slot_path(path, sizeof(path), f, (uint32_t)f->w.self, f->w.epoch, slot, f->gen[slot])))
			return ret;
		/* A file of ours from before (same epoch, same slot) is ours to reuse. */
		int fd = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
		struct stat sb;
		if (fd < 0)
			return -errno;
		/* one name only: a peer that hard-linked another object of ours
		 * (a session segment, the cache) here must not get our batches
		 * written into it */
		if (fstat(fd, &sb) || (ret = ts_shm_file_ours(&sb)) != 0 || sb.st_nlink != 1) {
			ret = ret ? ret : sb.st_nlink != 1 ? -EMLINK : -errno;
			close(fd);
			return ret;
		}
		m->fd = fd;
		m->size = (size_t)sb.st_size;
		m->writer = (uint32_t)f->w.self;
		m->epoch = f->w.epoch;
		m->gen = f->gen[slot];
	} else {
		munmap(m->base, m->size);
		m->base = NULL;
	}
	uint64_t size = m->size;
	if (size < need) {
		size = page_up(need + need / 4); /* room for a somewhat bigger batch */
		if ((ret = within_shm_share(f, slot, size)) || (ret = grow(m->fd, size))) {
			close(m->fd);
			memset(m, 0, sizeof(*m));
			m->fd = -1;
			return ret;
		}
	}
	void *base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, m->fd, 0);
	if (base == MAP_FAILED) {
		ret = -errno;
		close(m->fd);
		memset(m, 0, sizeof(*m));
		m->fd = -1;
		return ret;
	}
	m->base = base;
	m->size = size;
	return 0;
}

/* Our claim on the next slot: kept from a fence (stream_state) or made now. */
static int claim(struct ts_feed *f, uint64_t timeout_ns)
{
	struct ts_batch_meta *meta;
	int ret = writer_ready(f);
	if (ret) {
		if (f->w.claimed && f->w_word == 0)
			ts_ring_abort(f->s.seg, &f->w);
		return ret;
	}
	if (f->w.claimed)
		return 0;
	/*
	 * Our own place is behind the head: what another producer published
	 * while we were away (stopped, or reading slower) is ours to read
	 * first. Published now, our batch would land after those, and the
	 * caller, which reads past its own batch, would take theirs for it.
	 */
	if (f->attached && f->r.seq < atomic_load_explicit(&f->s.seg->ring.pub_seq, memory_order_acquire))
		return -EDEADLK;
	ret = ts_ring_begin(f->s.seg, &f->w, timeout_ns, &meta);
	if (ret == -EPERM)
		f->w_word = 0;
	return ret;
}

static int batch_valid(const struct ts_feed *f, const struct ts_feed_batch *b, uint64_t *need)
{
	if (b->npos < 1 || b->npos > TS_MAX_POSITIONS || b->nsamples == 0 || b->nsamples > TS_FEED_MAX_SAMPLES ||
	    b->schema_len > TS_FEED_SCHEMA_MAX || (b->flags & ~TS_BATCH_END_OF_EPOCH))
		return -EINVAL;
	uint64_t total = HDR_SIZE + page_up(b->nsamples * sizeof(int64_t));
	for (uint32_t p = 0; p < b->npos; p++) {
		if (b->len[p] == 0 || b->len[p] % b->nsamples || b->len[p] >= (1ull << 44))
			return -EINVAL;
		total += page_up(b->len[p]);
	}
	for (uint64_t i = 0; b->index && i < b->nsamples; i++)
		if (b->index[i] < 0 || (uint64_t)b->index[i] >= f->nindex)
			return -EINVAL;
	*need = total;
	return 0;
}

static void fill_slot(struct ts_feed_hdr *h, const struct ts_feed_batch *b, uint64_t seq)
{
	char *base = (char *)h;
	h->magic = FEED_MAGIC;
	h->version = FEED_VERSION;
	h->hdr_size = (uint32_t)HDR_SIZE;
	h->seq = seq;
	h->stream_epoch = b->stream_epoch;
	h->nsamples = b->nsamples;
	h->schema_hash = ts_hash64(b->schema, b->schema_len, 0) | 1; /* 0 means "any" */
	h->npos = b->npos;
	h->schema_len = b->schema_len;
	memcpy(h->schema, b->schema, b->schema_len);
	/* offsets from our own values, never read back: consumers map this file read-write */
	h->index_off = HDR_SIZE;
	__atomic_store_n(&h->holders, 0, __ATOMIC_RELAXED); /* only gone members' bits were left */
	if (b->index)
		memcpy(base + HDR_SIZE, b->index, b->nsamples * sizeof(int64_t));
	else
		memset(base + HDR_SIZE, 0xff, b->nsamples * sizeof(int64_t));
	uint64_t off = HDR_SIZE + page_up(b->nsamples * sizeof(int64_t));
	for (uint32_t p = 0; p < TS_MAX_POSITIONS; p++) {
		h->off[p] = p < b->npos ? off : 0;
		h->len[p] = p < b->npos ? b->len[p] : 0;
		if (p < b->npos) {
			memcpy(base + off, b->src[p], b->len[p]);
			off += page_up(b->len[p]);
		}
	}
}

int ts_feed_publish(struct ts_feed *f, const struct ts_feed_batch *b, uint64_t timeout_ns)
{
	struct ts_batch_meta *meta;
	uint64_t need;
	int ret;

	if ((ret = batch_valid(f, b, &need)) || (ret = claim(f, timeout_ns)))
		return ret;
	meta = &f->s.seg->ring.meta[f->w.self][f->w.slot];
	if ((ret = own_file(f, f->w.slot, need))) {
		ts_ring_abort(f->s.seg, &f->w);
		return ret;
	}
	fill_slot(f->own[f->w.slot].base, b, f->w.seq);
	meta->npos = b->npos;
	meta->flags = b->flags;
	meta->nsamples = b->nsamples;
	meta->tag = make_tag(f->w.epoch, f->own[f->w.slot].gen);
	memcpy(meta->len, b->len, b->npos * sizeof(*b->len));
	if ((ret = ts_ring_publish(f->s.seg, &f->w))) {
		f->w_word = 0;
		return ret == -EINVAL ? -EINVAL : -EPERM;
	}
	ledger_mark(f, b);
	struct ts_counters *c = &f->s.seg->counters;
	atomic_fetch_add_explicit(&c->samples_produced, b->nsamples, memory_order_relaxed);
	atomic_fetch_add_explicit(&c->produce_cpu_ns, b->cpu_ns, memory_order_relaxed);
	/* After a full turn of the ring no slot names an older producer's file. */
	if (++f->published == ts_ring_depth(f->s.seg))
		remove_old_writers(f);
	return 0;
}

/*
 * Anyone else in the feed? Asked at every batch while the stream is shared:
 * free member slots are told without a look at /proc, and a live member seen
 * within the last OTHERS_SEEN_NS is taken as still there (a killed one costs
 * at most that many publishes more).
 */
#define OTHERS_SEEN_NS (100ull * 1000000)

static bool others_here(struct ts_feed *f)
{
	const struct ts_segment *seg = f->s.seg;
	unsigned i;
	for (i = 0; i < TS_MAX_MEMBERS; i++)
		if ((int)i != f->s.self && atomic_load_explicit(&seg->members[i].pid, memory_order_acquire))
			break;
	if (i == TS_MAX_MEMBERS)
		return false;
	uint64_t now = ts_now_ns();
	if (f->others_seen_ns && now - f->others_seen_ns < OTHERS_SEEN_NS)
		return true;
	if (!ts_session_others(&f->s))
		return false; /* only dead members' slots, not reaped yet */
	f->others_seen_ns = now;
	return true;
}

/*
 * Between a lone producer's note and its second look at the members: the
 * unit tests define their own, which brings a joiner in at that moment
 * (test_feed); nothing here.
 */
__attribute__((weak, noinline)) void ts_feed_noted(struct ts_feed *f)
{
	(void)f;
}

int ts_feed_made(struct ts_feed *f, const struct ts_feed_batch *b)
{
	struct ts_feed_ledger *l = f->ledger;
	if (!b->index || b->nsamples == 0 || b->nsamples > TS_FEED_MAX_SAMPLES || (b->flags & ~TS_BATCH_END_OF_EPOCH))
		return -EINVAL;
	if (ts_session_role(&f->s) != TS_ROLE_PRODUCER)
		return -EPERM;
	if (!l || others_here(f))
		return 0;
	for (uint64_t i = 0; i < b->nsamples; i++)
		if (b->index[i] < 0 || (uint64_t)b->index[i] >= f->nindex)
			return -EINVAL;
	if (ledger_at(f, b->stream_epoch))
		return 0;
	ledger_bits(l, f, b, true);
	atomic_fetch_or_explicit(&l->made, LEDGER_MADE | (b->flags & TS_BATCH_END_OF_EPOCH ? LEDGER_ENDED : 0),
				 memory_order_relaxed);
	/*
	 * A joiner becomes a member, then looks at the ledger (epoch_start,
	 * count_stream); we note the batch, then look at the members. A full
	 * fence in each between the two, so one of us sees the other: when we
	 * see nobody, the joiner sees this batch noted and makes it itself (it
	 * notes it lost).
	 */
	atomic_thread_fence(memory_order_seq_cst);
	ts_feed_noted(f);
	if (!others_here(f))
		return 1;
	/*
	 * We see it: it may have looked before our note, so the batch is
	 * published as well (2), and it reads it; one that noted it lost counts
	 * it read, not lost. Out of the ledger again at once: should we be
	 * replaced before that publish (stopped there for a takeover's
	 * timeout), our successor counts it among the rest of the epoch and
	 * makes it. Kept in until the publish failed, it was counted as made,
	 * and nobody made it: a batch short in every reader's epoch.
	 */
	ledger_bits(l, f, b, false);
	return 2;
}

int ts_feed_evict_laggards(struct ts_feed *f)
{
	if (writer_ready(f))
		return -EPERM;
	return ts_ring_evict_laggards(f->s.seg, &f->w);
}

int ts_feed_evict_away(struct ts_feed *f, uint64_t min_ns)
{
	if (writer_ready(f))
		return -EPERM;
	return ts_ring_evict_away(f->s.seg, &f->w, min_ns);
}

void ts_feed_set_away(struct ts_feed *f, int away)
{
	if (f->s.self < 0 || f->s.self >= (int)TS_MAX_MEMBERS)
		return;
	struct ts_member *mb = &f->s.seg->members[f->s.self];
	uint64_t now = ts_now_ns();
	atomic_store_explicit(&mb->away_ns, away ? (now ? now : 1) : 0, memory_order_release);
}

/* ---- reading slot files ---------------------------------------------------- */

/* The header's fields lie within a file of `size` bytes (no arithmetic that can wrap). */
static int hdr_fits(const struct ts_feed_hdr *h, uint64_t size)
{
	if (h->index_off > size || h->nsamples * sizeof(int64_t) > size - h->index_off)
		return 0;
	for (uint32_t p = 0; p < h->npos; p++)
		if (h->off[p] > size || h->len[p] > size - h->off[p])
			return 0;
	return 1;
}

/*
 * The mapped file of (writer, tag's epoch and generation, slot), validated
 * for ring seq `seq`. *out is a private snapshot of its header's fixed part,
 * taken once and validated (a writer cannot change what we checked after we
 * checked it); *base the shared mapping, for the data at the snapshot's
 * offsets. Mapped read-write only for the holders word: we never write its
 * data. A map we drop for another file drops its holds too: that file was
 * replaced (or is an old producer's), nobody writes it again.
 */
static int peer_file(struct ts_feed *f, uint32_t writer, uint64_t tag, uint32_t slot, uint64_t seq,
		     const struct ts_feed_hdr **out, const char **base_out)
{
	struct ts_feed_map *m = &f->peer[slot];
	uint32_t epoch = (uint32_t)tag, gen = (uint32_t)(tag >> 32);
	char path[TS_PATH_MAX];
	uint32_t holds = 0;
	int ret;
	if (slot >= TS_MAX_DEPTH)
		return -EBADMSG;
	if (m->base && (m->writer != writer || m->epoch != epoch || m->gen != gen))
		map_drop(m);
	for (int pass = 0; pass < 2; pass++) {
		if (!m->base) {
			if ((ret = slot_path(path, sizeof(path), f, writer, epoch, slot, gen)))
				return ret;
			int fd = open(path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
			if (fd < 0)
				return errno == ENOENT ? -ESTALE : ts_neg_errno();
			struct stat sb;
			if (fstat(fd, &sb) || ts_shm_file_ours(&sb) != 0 || (uint64_t)sb.st_size < HDR_SIZE) {
				close(fd);
				return -EBADMSG;
			}
			void *base = mmap(NULL, (size_t)sb.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
			if (base == MAP_FAILED) {
				ret = ts_neg_errno();
				close(fd);
				return ret;
			}
			*m = (struct ts_feed_map){ .base = base, .size = (size_t)sb.st_size, .fd = fd, .writer = writer,
						   .epoch = epoch, .gen = gen, .ino = (uint64_t)sb.st_ino, .holds = holds };
		}
		struct ts_feed_hdr *h = f->hdr_snap;
		memcpy(h, m->base, offsetof(struct ts_feed_hdr, schema)); /* not the 8 KiB schema: per read */
		if (h->magic != FEED_MAGIC || h->version != FEED_VERSION || h->hdr_size != HDR_SIZE ||
		    h->seq != seq || h->npos < 1 || h->npos > TS_MAX_POSITIONS || h->schema_len > TS_FEED_SCHEMA_MAX ||
		    h->nsamples == 0 || h->nsamples > TS_FEED_MAX_SAMPLES || h->index_off < HDR_SIZE ||
		    h->index_off % sizeof(int64_t))
			return -EBADMSG;
		if (hdr_fits(h, m->size)) {
			*out = h;
			*base_out = m->base;
			return 0;
		}
		holds = m->holds; /* the producer grew the file since we mapped it: same file, same holds */
		map_drop(m);
	}
	return -EBADMSG;
}

/* Header fields must agree with the ring's meta row for that seq. */
static int hdr_matches(const struct ts_feed_hdr *h, const struct ts_batch_meta *m)
{
	if (h->npos != m->npos || h->nsamples != m->nsamples)
		return -EBADMSG;
	for (uint32_t p = 0; p < m->npos; p++)
		if (h->len[p] != m->len[p] || h->off[p] < h->index_off)
			return -EBADMSG;
	return 0;
}

/* The dataset index of sample j of a validated slot (a peer's word: checked), or -1. */
static int64_t slot_index(const struct ts_feed *f, const struct ts_feed_hdr *h, const char *base, uint64_t j)
{
	const int64_t *idx = (const int64_t *)(base + h->index_off); /* 8-aligned, bounded by hdr_fits */
	if (j >= h->nsamples)
		return -1;
	int64_t x = __atomic_load_n(&idx[j], __ATOMIC_RELAXED);
	return x >= 0 && (uint64_t)x < f->nindex ? x : -1;
}

/* ---- stream state (a successor's view) --------------------------------- */

/* The stream epoch of the ring's last batch (seq pub - 1), and whether it ended it. */
static int ring_last(struct ts_feed *f, uint64_t pub, uint64_t *epoch, int *ended)
{
	struct ts_batch_meta m;
	const struct ts_feed_hdr *h;
	const char *base;
	unsigned writer;
	uint32_t d = ts_ring_depth(f->s.seg);
	int ret;

	if (!d)
		return -EBADMSG;
	if ((ret = ts_ring_slot_meta(f->s.seg, pub - 1, &m, &writer)) ||
	    (ret = peer_file(f, writer, m.tag, (uint32_t)((pub - 1) % d), pub - 1, &h, &base)) ||
	    (ret = hdr_matches(h, &m)))
		return ret;
	*epoch = h->stream_epoch;
	*ended = !!(m.flags & TS_BATCH_END_OF_EPOCH);
	return 0;
}

/* noinline: inlined, its acquire fence trips GCC's -Wtsan in the TSan build */
__attribute__((noinline)) static int count_stream(struct ts_feed *f, uint64_t *epoch, int *ended, int64_t *rest,
						  int count, uint64_t *nrest, uint64_t *npublished, int fence,
						  uint64_t timeout_ns);

/* A fence this call claimed is given up when the count fails: left open, it
 * held every consumer back while each later call failed the same way. */
static int stream_state(struct ts_feed *f, uint64_t *epoch, int *ended, int64_t *rest, int count, uint64_t *nrest,
			uint64_t *npublished, int fence, uint64_t timeout_ns)
{
	int claimed_before = f->w.claimed;
	int ret = count_stream(f, epoch, ended, rest, count, nrest, npublished, fence, timeout_ns);
	if (ret && !claimed_before && f->w.claimed)
		ts_ring_abort(f->s.seg, &f->w);
	return ret;
}

int ts_feed_stream_state(struct ts_feed *f, uint64_t *epoch, int *ended, int64_t *rest, uint64_t *nrest,
			 uint64_t *npublished, uint64_t timeout_ns)
{
	return stream_state(f, epoch, ended, rest, rest != NULL, nrest, npublished, 1, timeout_ns);
}

int ts_feed_stream_count(struct ts_feed *f, uint64_t *epoch, int *ended, uint64_t *nrest, uint64_t *npublished,
			 uint64_t timeout_ns)
{
	return stream_state(f, epoch, ended, NULL, 1, nrest, npublished, 1, timeout_ns);
}

int ts_feed_stream_seen(struct ts_feed *f, uint64_t *epoch, int *ended, int64_t *rest, uint64_t *nrest,
			uint64_t *npublished)
{
	return stream_state(f, epoch, ended, rest, 1, nrest, npublished, 0, 0);
}

/*
 * count: fill *nrest and *npublished (and rest, when given) for an unfinished
 * epoch. fence: a producer claims the next slot first and writes what it
 * counted back into the ledger (it is about to make the rest).
 */
static int count_stream(struct ts_feed *f, uint64_t *epoch, int *ended, int64_t *rest, int count, uint64_t *nrest,
			uint64_t *npublished, int fence, uint64_t timeout_ns)
{
	struct ts_segment *seg = f->s.seg;
	struct ts_batch_meta m;
	const struct ts_feed_hdr *h;
	const char *base;
	unsigned writer;
	uint64_t pub = atomic_load_explicit(&seg->ring.pub_seq, memory_order_acquire);
	uint32_t d;
	int ret;

	*epoch = 0;
	*ended = 1;
	*nrest = *npublished = 0;
	bool producing = fence && ts_session_role(&f->s) == TS_ROLE_PRODUCER;
	if (producing) {
		/*
		 * Fence: claim the next slot first. A predecessor that was replaced
		 * half-way through a publish can then no longer add a batch behind
		 * our back (its claim is ours now), so what we count below is all
		 * there is. The claim is kept for our first publish.
		 */
		if ((ret = claim(f, timeout_ns)))
			return ret;
		pub = atomic_load_explicit(&seg->ring.pub_seq, memory_order_acquire);
	}
	if (pub && (ret = ring_last(f, pub, epoch, ended)))
		return ret;
	/* the batches a producer alone noted and never published (ts_feed_made) */
	bool ring = pub > 0;
	uint64_t le, made;
	if (ledger_look(f, &le, &made) == 0 && (made & LEDGER_MADE) && (!ring || ledger_leads(le, made, *epoch))) {
		if (!ring || le > *epoch) {
			*epoch = le;
			*ended = 0;
			ring = false; /* none of that epoch there */
		}
		*ended = *ended || (made & LEDGER_ENDED);
	} else if (!ring) {
		return 0;
	}
	if (*ended || !count)
		return 0;
	if (!(d = ts_ring_depth(seg))) /* read once, after the wait: divides and bounds the loop below */
		return -EBADMSG;

	uint64_t words = (f->nindex + 63) / 64;
	uint64_t *bits = calloc(words, sizeof(*bits));
	if (!bits)
		return -ENOMEM;
	struct ts_feed_ledger *l = f->ledger;
	for (int tries = 0; tries < 8; tries++) {
		uint64_t e = atomic_load_explicit(&l->epoch, memory_order_acquire);
		if (e != *epoch)
			break;
		for (uint64_t i = 0; i < words; i++)
			bits[i] = atomic_load_explicit(&l->bits[i], memory_order_relaxed);
		atomic_thread_fence(memory_order_acquire);
		if (atomic_load_explicit(&l->epoch, memory_order_relaxed) == e)
			break;
		memset(bits, 0, words * sizeof(*bits));
	}
	/* The ledger lags the ring by at most a batch: add what the ring still holds. */
	for (uint64_t s = pub > d ? pub - d : 0; ring && s < pub; s++) {
		if (ts_ring_slot_meta(seg, s, &m, &writer) ||
		    peer_file(f, writer, m.tag, (uint32_t)(s % d), s, &h, &base) || hdr_matches(h, &m) ||
		    h->stream_epoch != *epoch)
			continue;
		for (uint64_t i = 0; i < h->nsamples; i++) {
			int64_t x = slot_index(f, h, base, i);
			if (x >= 0)
				bits[x / 64] |= 1ull << (x % 64);
		}
	}
	/*
	 * A producer writes what the ring told it back into the ledger: a
	 * predecessor killed between its publish and its mark left a batch
	 * only the ring knows of, and the ring forgets it once we publish a
	 * full turn; a successor of ours would then make that batch again.
	 */
	if (producing && !ledger_at(f, *epoch))
		for (uint64_t i = 0; i < words; i++)
			atomic_fetch_or_explicit(&l->bits[i], bits[i], memory_order_relaxed);
	uint64_t n = 0;
	for (uint64_t i = 0; i < f->nindex; i++) {
		if (bits[i / 64] >> (i % 64) & 1)
			++*npublished;
		else if (rest)
			rest[n++] = (int64_t)i;
		else
			n++;
	}
	*nrest = n;
	free(bits);
	return 0;
}

/* ---- consumer -------------------------------------------------------------- */

/*
 * Where the newest stream epoch starts, if that is still in the ring: the
 * seq after the end-of-epoch batch before it (0 when there is none). The
 * newest epoch is the one of the last published batch, ended or not: a job
 * that starts iterating just after an epoch ended reads that epoch at once
 * rather than wait for the next. UINT64_MAX when its start was overwritten.
 */
static uint64_t epoch_start(struct ts_feed *f)
{
	struct ts_segment *seg = f->s.seg;
	uint64_t pub = atomic_load_explicit(&seg->ring.pub_seq, memory_order_acquire), s, le, made, re = 0;
	uint32_t d = ts_ring_depth(seg);
	struct ts_batch_meta m;
	unsigned writer;
	int rended;

	/*
	 * The newest epoch has batches a producer alone made and never
	 * published (ts_feed_made; the fence pairs with its): its start is not
	 * in the ring, or, when its last batch was made, the next starts at the
	 * head.
	 */
	if (ledger_look(f, &le, &made) == 0 && (made & LEDGER_MADE) &&
	    (pub == 0 || ring_last(f, pub, &re, &rended) || ledger_leads(le, made, re)))
		return made & LEDGER_ENDED ? pub : UINT64_MAX;
	if (pub == 0)
		return 0;
	/*
	 * Ended, and its start gone: the next one starts at the head. Asked
	 * first: a batch of the next epoch in flight reuses the oldest slot,
	 * whose meta row cannot be read meanwhile (seen as overwritten below).
	 */
	bool ended = ts_ring_slot_meta(seg, pub - 1, &m, &writer) == 0 && (m.flags & TS_BATCH_END_OF_EPOCH);
	for (s = pub - 1; s > 0 && pub - s < d; s--) {
		if (ts_ring_slot_meta(seg, s - 1, &m, &writer))
			return ended ? pub : UINT64_MAX; /* overwritten (or odd): not ours to read */
		if (m.flags & TS_BATCH_END_OF_EPOCH)
			return s;
	}
	if (s == 0)
		return 0;
	return ended ? pub : UINT64_MAX;
}

int ts_feed_attach(struct ts_feed *f, int at_epoch_start)
{
	if (f->attached)
		ts_ring_detach(f->s.seg, &f->r);
	f->attached = 0;
	f->schema_hash = 0;
	uint64_t start = at_epoch_start ? epoch_start(f) : UINT64_MAX;
	/*
	 * The head is the next seq to be published, not the next to be claimed:
	 * a batch in flight is the stream's next, and ours to read (a joiner
	 * notes what was published before its place as what it lacks).
	 */
	uint64_t from = start != UINT64_MAX ? start
					    : atomic_load_explicit(&f->s.seg->ring.pub_seq, memory_order_acquire);
	int ret = ts_ring_attach_at(f->s.seg, f->s.self, &f->r, from);
	f->attached = ret == 0;
	/* attach_at moves a `from` the ring no longer holds to the head */
	f->at_epoch_start = f->attached && start != UINT64_MAX && f->r.seq == start;
	f->read_any = 0;
	return ret;
}

int ts_feed_detach(struct ts_feed *f)
{
	if (!f->attached)
		return 0;
	f->attached = 0;
	return ts_ring_detach(f->s.seg, &f->r);
}

int ts_feed_at_head(struct ts_feed *f)
{
	if (!f->attached)
		return 0;
	for (unsigned p = 0; p < TS_MAX_POSITIONS; p++)
		if (f->r.off[p])
			return 0;
	return f->r.seq == atomic_load_explicit(&f->s.seg->ring.pub_seq, memory_order_acquire);
}

int ts_feed_holds_producer(struct ts_feed *f)
{
	uint32_t d;
	if (!f->attached)
		return 0;
	if (!(d = ts_ring_depth(f->s.seg)))
		return -EBADMSG;
	/*
	 * The producer raises claim_seq to n + 1 before it waits for seq n's
	 * slot, which last held n - d: we hold it while our place is below that
	 * (acquire: pairs with its seq_cst raise; a stale value only delays us).
	 */
	uint64_t claimed = atomic_load_explicit(&f->s.seg->ring.claim_seq, memory_order_acquire);
	return f->r.seq + d < claimed;
}

/* -ESTALE: evicted (or fallen a whole turn behind): detached, attach again. */
int ts_feed_next(struct ts_feed *f, uint64_t timeout_ns, struct ts_feed_info *out)
{
	struct ts_batch_meta m;
	const struct ts_feed_hdr *h;
	const char *base;
	unsigned writer;
	uint32_t d;
	int ret;

	if (!f->attached)
		return -ENOTCONN;
	if ((ret = ts_ring_wait_next(f->s.seg, &f->r, timeout_ns, &m, &writer)))
		goto out;
	if (!(d = ts_ring_depth(f->s.seg))) /* wait_next checked its own read of it: not this one */
		return -EBADMSG;
	if ((ret = peer_file(f, writer, m.tag, (uint32_t)(f->r.seq % d), f->r.seq, &h, &base)) ||
	    (ret = hdr_matches(h, &m)))
		goto out;
	out->npos = m.npos;
	out->nsamples = m.nsamples;
	out->stream_epoch = h->stream_epoch;
	out->schema_hash = h->schema_hash;
	out->schema_len = h->schema_len;
	memcpy(out->schema, base + offsetof(struct ts_feed_hdr, schema), h->schema_len); /* length checked */
	memset(out->sample_bytes, 0, sizeof(out->sample_bytes));
	for (uint32_t p = 0; p < m.npos; p++)
		out->sample_bytes[p] = m.len[p] / m.nsamples;
	out->next_index = slot_index(f, h, base, f->r.off[0] / out->sample_bytes[0]);
	f->schema_hash = h->schema_hash;
	/* acquire fence, then: the header was still that seq's while we read it */
	atomic_thread_fence(memory_order_acquire);
	ret = atomic_load_explicit(&f->s.seg->members[f->s.self].attach, memory_order_acquire) == f->r.attach ?
		0 : -ESTALE;
out:
	if (ret == -ESTALE)
		f->attached = 0;
	return ret;
}

/* Copy one peek's ranges out. */
/*
 * The slot file range k of a peek lies in, validated against the ring's
 * meta row (the range carries only a part of it), the schema we expect and
 * the bounds of every position's part.
 */
static int range_slot(struct ts_feed *f, const struct ts_read *rd, uint32_t k, const struct ts_feed_hdr **h,
		      const char **base)
{
	const struct ts_range *r0 = &rd->r[0][k];
	struct ts_batch_meta m;
	unsigned writer;
	int ret;
	if ((ret = ts_ring_slot_meta(f->s.seg, r0->seq, &m, &writer)))
		return ret == -EAGAIN ? -ESTALE : ret;
	/* npos too: hdr_matches() ties the header's npos to this row's, and only
	 * the header's positions were bounded against the file (hdr_fits) */
	if (writer != r0->writer || m.tag != r0->tag || m.npos != rd->npos)
		return -ESTALE;
	if ((ret = peer_file(f, r0->writer, r0->tag, r0->slot, r0->seq, h, base)) || (ret = hdr_matches(*h, &m)))
		return ret;
	if (f->schema_hash && (*h)->schema_hash != f->schema_hash)
		return -EPROTO;
	for (uint32_t p = 0; p < rd->npos; p++) {
		const struct ts_range *r = &rd->r[p][k];
		if (r->off > (*h)->len[p] || r->len > (*h)->len[p] - r->off)
			return -EBADMSG;
	}
	return 0;
}

/* The dataset indices of range r of position 0 (copied to dst[0] + at) into f->read_index. */
static void copy_index(struct ts_feed *f, const struct ts_feed_hdr *h, const char *base, const struct ts_range *r,
		       uint64_t at)
{
	uint64_t sb = h->len[0] / h->nsamples; /* both validated: the sample size, > 0 */
	uint64_t from = r->off / sb, n = r->len / sb, to = at / sb;
	for (uint64_t i = 0; i < n && from + i < h->nsamples && to + i < f->read_index_len; i++)
		f->read_index[to + i] = slot_index(f, h, base, from + i);
}

static int copy_ranges(struct ts_feed *f, const struct ts_read *rd, void *const *dst, const uint64_t *got,
		       uint64_t *last_epoch)
{
	uint64_t at[TS_MAX_POSITIONS];
	memcpy(at, got, rd->npos * sizeof(*at));
	for (uint32_t k = 0; k < rd->nranges; k++) {
		const struct ts_feed_hdr *h;
		const char *base;
		int ret = range_slot(f, rd, k, &h, &base);
		if (ret)
			return ret;
		*last_epoch = h->stream_epoch;
		if (f->read_index)
			copy_index(f, h, base, &rd->r[0][k], at[0]);
		for (uint32_t p = 0; p < rd->npos; p++) {
			const struct ts_range *r = &rd->r[p][k];
			if (dst && dst[p])
				memcpy((char *)dst[p] + at[p], base + h->off[p] + r->off, r->len);
			at[p] += r->len;
		}
	}
	return 0;
}

static void report_ranges(struct ts_feed *f, const struct ts_read *rd, const uint64_t *got)
{
	for (uint32_t p = 0; p < rd->npos; p++) {
		uint64_t at = got[p];
		for (uint32_t k = 0; k < rd->nranges; k++) {
			f->on_range(f->on_range_arg, p, &rd->r[p][k], at);
			at += rd->r[p][k].len;
		}
	}
}

int ts_feed_read(struct ts_feed *f, uint32_t npos, const uint64_t *want, void *const *dst, uint64_t *got,
		 int *eoe, uint64_t timeout_ns)
{
	uint64_t left[TS_MAX_POSITIONS];
	struct ts_read *rd;
	int ret = 0;

	*eoe = 0;
	if (!f->attached)
		return -ENOTCONN;
	if (npos < 1 || npos > TS_MAX_POSITIONS)
		return -EINVAL;
	(void)free_view(f); /* let go of the files of views released meanwhile */
	rd = malloc(sizeof(*rd)); /* ~30 KiB: not on a Python thread's stack */
	if (!rd)
		return -ENOMEM;
	uint64_t deadline = ts_now_ns() + timeout_ns;
	while (got[0] < want[0]) {
		uint64_t now = ts_now_ns();
		for (uint32_t p = 0; p < npos; p++)
			left[p] = want[p] - got[p];
		ret = ts_ring_peek(f->s.seg, &f->r, npos, left, rd, now < deadline ? deadline - now : 0);
		if (ret)
			break;
		uint64_t epoch = f->read_epoch;
		if ((ret = copy_ranges(f, rd, dst, got, &epoch)))
			break;
		/* only an advance that finds us still attached makes the copy valid */
		if ((ret = ts_ring_advance(f->s.seg, &f->r, rd, rd->got)))
			break;
		if (rd->nranges) {
			f->read_epoch = epoch;
			f->read_any = 1;
		}
		if (f->on_range)
			report_ranges(f, rd, got);
		for (uint32_t p = 0; p < npos; p++)
			got[p] += rd->got[p];
		if (rd->end_of_epoch) {
			*eoe = 1;
			break;
		}
	}
	free(rd);
	if (ret == -ESTALE)
		f->attached = 0;
	return ret;
}

/* ---- views: batches without a copy ------------------------------------------ */

static void unhold(struct ts_feed *f, uint32_t slot, uint64_t ino)
{
	struct ts_feed_map *m = &f->peer[slot];
	if (!m->base || m->ino != ino || m->holds == 0)
		return; /* that file was replaced since: nobody writes it again */
	if (--m->holds == 0)
		__atomic_fetch_and(&((struct ts_feed_hdr *)m->base)->holders, ~(1ull << f->s.self), __ATOMIC_SEQ_CST);
}

/* A view handed out and not released yet (the reading thread's view of it). */
static bool view_live(const struct ts_feed_view *v)
{
	return atomic_load_explicit(&v->id, memory_order_relaxed) &&
	       !atomic_load_explicit(&v->released, memory_order_acquire);
}

/*
 * Bytes of /dev/shm our live views keep, with one more of the file `ino`
 * (`size` bytes). A view maps its slot file privately: a file the producer
 * replaced while we held it is unlinked, and its pages stay as long as the
 * view does. A program that keeps its batches would otherwise fill /dev/shm,
 * and every job's DataLoader workers with it.
 */
static uint64_t viewed_bytes(const struct ts_feed *f, uint64_t ino, uint64_t size)
{
	uint64_t total = size;
	for (unsigned i = 0; i < TS_FEED_MAX_VIEWS; i++) {
		const struct ts_feed_view *v = &f->views[i];
		bool counted = !view_live(v) || v->ino == ino;
		for (unsigned j = 0; j < i && !counted; j++) /* each file once */
			counted = view_live(&f->views[j]) && f->views[j].ino == v->ino;
		if (!counted)
			total += v->size;
	}
	return total;
}

/* Reading thread: drop the holds of views released meanwhile; a free entry. */
static struct ts_feed_view *free_view(struct ts_feed *f)
{
	struct ts_feed_view *free = NULL;
	for (unsigned i = 0; i < TS_FEED_MAX_VIEWS; i++) {
		struct ts_feed_view *v = &f->views[i];
		if (atomic_load_explicit(&v->released, memory_order_acquire)) {
			unhold(f, v->slot, v->ino);
			atomic_store_explicit(&v->released, 0, memory_order_relaxed);
			atomic_store_explicit(&v->id, 0, memory_order_relaxed);
		}
		if (!free && !atomic_load_explicit(&v->id, memory_order_relaxed))
			free = v;
	}
	return free;
}

int ts_feed_read_view(struct ts_feed *f, uint32_t npos, const uint64_t *want, void **ptr, uint64_t *got, int *eoe,
		      uint64_t *id, uint64_t timeout_ns)
{
	static _Atomic uint64_t serial; /* ids unique in the process: a stale id never matches */
	const struct ts_feed_hdr *h;
	const char *shared;
	struct ts_feed_view *v;
	struct ts_read *rd;
	int ret;

	*eoe = 0;
	*id = 0;
	if (!f->attached)
		return -ENOTCONN;
	if (npos < 1 || npos > TS_MAX_POSITIONS)
		return -EINVAL;
	if (!(v = free_view(f)))
		return -EXDEV;
	if (!(rd = malloc(sizeof(*rd))))
		return -ENOMEM;
	if ((ret = ts_ring_peek(f->s.seg, &f->r, npos, want, rd, timeout_ns)))
		goto out;
	/* one slot, or the request is not a view (the epoch's end may cut it short) */
	if (rd->nranges != 1 || (rd->got[0] < want[0] && !rd->end_of_epoch)) {
		ret = -EXDEV;
		goto out;
	}
	if ((ret = range_slot(f, rd, 0, &h, &shared)))
		goto out;
	uint32_t slot = rd->r[0][0].slot;
	struct ts_feed_map *m = &f->peer[slot];
	/* the files our views keep stay within a quarter of /dev/shm: past it, the batch is copied */
	if (!ts_shm_within_quarter(viewed_bytes(f, m->ino, m->size))) {
		ret = -EXDEV;
		goto out;
	}
	/* Hold first (the producer reads it after its claim), then map, then advance. */
	__atomic_fetch_or(&((struct ts_feed_hdr *)(uintptr_t)shared)->holders, 1ull << f->s.self, __ATOMIC_SEQ_CST);
	m->holds++;
	void *base = mmap(NULL, m->size, PROT_READ | PROT_WRITE, MAP_PRIVATE, m->fd, 0);
	if (base == MAP_FAILED) {
		ret = ts_neg_errno();
		unhold(f, slot, m->ino);
		goto out;
	}
	if ((ret = ts_ring_advance(f->s.seg, &f->r, rd, rd->got))) {
		/* evicted: the producer may have written the file before it saw our hold */
		munmap(base, m->size);
		unhold(f, slot, m->ino);
		goto out;
	}
	for (uint32_t p = 0; p < npos; p++) {
		ptr[p] = (char *)base + h->off[p] + rd->r[p][0].off;
		got[p] = rd->got[p];
	}
	if (f->read_index) /* from our private mapping: the bytes the view holds */
		copy_index(f, h, base, &rd->r[0][0], 0);
	/* as ts_feed_read: an eviction is noted against the epoch we were reading */
	f->read_epoch = ((const struct ts_feed_hdr *)base)->stream_epoch;
	f->read_any = 1;
	if (f->on_range) {
		uint64_t at[TS_MAX_POSITIONS] = {0};
		report_ranges(f, rd, at);
	}
	*eoe = rd->end_of_epoch;
	v->base = base;
	v->size = m->size;
	v->slot = slot;
	v->ino = m->ino;
	*id = atomic_fetch_add(&serial, 1) + 1;
	atomic_store_explicit(&v->id, *id, memory_order_release); /* the fields first */
out:
	free(rd);
	if (ret == -ESTALE)
		f->attached = 0;
	return ret;
}

int ts_feed_view_range(const struct ts_feed *f, uint64_t id, void **base, size_t *size)
{
	for (unsigned i = 0; id && i < TS_FEED_MAX_VIEWS; i++) {
		const struct ts_feed_view *v = &f->views[i];
		if (atomic_load_explicit(&v->id, memory_order_acquire) != id ||
		    atomic_load_explicit(&v->released, memory_order_relaxed))
			continue;
		*base = v->base;
		*size = v->size;
		return 0;
	}
	return -ENOENT;
}

void ts_feed_release_view(struct ts_feed *f, uint64_t id)
{
	for (unsigned i = 0; id && i < TS_FEED_MAX_VIEWS; i++) {
		struct ts_feed_view *v = &f->views[i];
		if (atomic_load_explicit(&v->id, memory_order_acquire) != id ||
		    atomic_load_explicit(&v->released, memory_order_relaxed))
			continue;
		munmap(v->base, v->size);
		atomic_store_explicit(&v->released, 1, memory_order_release);
		return;
	}
}

/*
 * Closing with views out (the program still has the batches): once we
 * leave, the producer no longer honours our holds, so each view becomes
 * private anonymous memory at the same address, with the same bytes.
 */
void ts_feed_detach_views(struct ts_feed *f, void (*keep)(void *arg, uint64_t id, void *base, size_t size),
			  void *arg)
{
	for (unsigned i = 0; i < TS_FEED_MAX_VIEWS; i++) {
		struct ts_feed_view *v = &f->views[i];
		if (!view_live(v))
			continue;
		uint64_t id = atomic_load(&v->id);
		void *copy = mmap(NULL, v->size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (copy != MAP_FAILED) {
			memcpy(copy, v->base, v->size);
			if (mremap(copy, v->size, v->size, MREMAP_MAYMOVE | MREMAP_FIXED, v->base) == MAP_FAILED)
				munmap(copy, v->size); /* the file mapping stays: bytes may change, never vanish */
		}
		if (keep)
			keep(arg, id, v->base, v->size);
		atomic_store(&v->id, 0);
	}
}
