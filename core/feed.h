/* SPDX-License-Identifier: MIT */
/*
 * Data feeds: a stream of host batches shared by the jobs that iterate the
 * same loader (the PyTorch layer's data plane on the CPU side).
 *
 * A feed is a session of its own (one per loader key) plus shared-memory
 * files next to it:
 *
 *   tsshim-feed.<uid>.<session>.<incarnation>.w<writer>.e<epoch>.s<slot>
 *       one per ring slot and producer: a header (the batch's seq, stream
 *       epoch, schema, sample indices, where each position lies) then the
 *       positions' bytes, page aligned. Grown, never shrunk.
 *   tsshim-feed.<uid>.<session>.<incarnation>.ledger
 *       a bitmap of the dataset indices published in the current stream
 *       epoch, so that a successor produces exactly the rest of an epoch.
 *
 * <incarnation> is the session segment's creation time: files of an older
 * segment of the same name are recognisably stale and removed at open.
 *
 * The ring (ring.h) orders everything: a slot file is written only while
 * its slot is claimed and read only while the reader holds it; every field
 * read from a file is validated against the ring's meta row first.
 *
 * All functions return 0 or -errno and never wait longer than asked.
 */
#ifndef TSSHIM_CORE_FEED_H
#define TSSHIM_CORE_FEED_H

#include <stddef.h>
#include <stdint.h>

#include "heartbeat.h"
#include "layout.h"
#include "ring.h"
#include "session.h"

#define TS_FEED_PREFIX      "tsshim-feed."
#define TS_FEED_SCHEMA_MAX  8192u
#define TS_FEED_MAX_SAMPLES (1u << 24)
#define TS_FEED_MAX_INDEX   (1ull << 34) /* dataset length the ledger covers */

struct ts_feed_map {
	void *base;
	size_t size;
	int fd;
	uint32_t writer, epoch, gen; /* whose file this is */
	uint64_t ino;
	uint32_t holds;         /* consumer: our views into this file */
};

/*
 * A consumer's batch handed out without a copy (ts_feed_read_view). Only
 * the reading thread takes and recycles entries; a release may come from
 * any thread (the program frees its tensors where it likes): it unmaps and
 * marks the entry, the reading thread drops the hold at its next call.
 */
struct ts_feed_view {
	_Atomic uint64_t id;    /* 0: free; published after the fields below */
	_Atomic int released;
	void *base;             /* our private mapping of the slot file */
	size_t size;
	uint32_t slot;
	uint64_t ino;
};

#define TS_FEED_MAX_VIEWS 64

struct ts_feed_ledger;
struct ts_feed_hdr;

struct ts_feed {
	struct ts_session s;
	struct ts_heartbeat hb;
	int hb_running;
	uint64_t incarnation;
	uint64_t nindex;
	struct ts_feed_ledger *ledger;
	size_t ledger_size;
	/* producer */
	struct ts_ring_writer w;
	uint32_t gen[TS_MAX_DEPTH];    /* generation of our file per slot (a held file is replaced) */
	uint64_t w_word;               /* producer word w was set up for; 0: none */
	uint64_t published;            /* since w_word */
	uint64_t others_seen_ns;       /* when ts_feed_made last found a live member (others_here) */
	struct ts_feed_map own[TS_MAX_DEPTH];
	/* consumer */
	struct ts_ring_reader r;
	int attached;
	int at_epoch_start;            /* the last attach was at a stream epoch's first batch */
	int read_any;                  /* a sample read since that attach */
	uint64_t read_epoch;           /* then: the stream epoch of the last sample read */
	uint64_t schema_hash;          /* what this reader expects; 0: learn from the next slot */
	struct ts_feed_map peer[TS_MAX_DEPTH];
	struct ts_feed_view views[TS_FEED_MAX_VIEWS];
	struct ts_feed_hdr *hdr_snap;  /* private copy of the slot header being read */
	/*
	 * Optional: told of every range ts_feed_read copied, or ts_feed_read_view
	 * handed out (after the advance that makes it valid): position p's bytes
	 * [r->off, r->off + r->len) of ring seq r->seq went to dst[p] + at (are
	 * at ptr[p] + at).
	 */
	void (*on_range)(void *arg, uint32_t p, const struct ts_range *r, uint64_t at);
	void *on_range_arg;
	/*
	 * Optional: ts_feed_read (ts_feed_read_view) stores the dataset index
	 * of each sample of position 0 it copies (hands out) at read_index[j],
	 * j its sample number in dst[0] (ptr[0]), for j < read_index_len (the
	 * room the caller gave it). -1 where the producer gave none or one
	 * outside [0, nindex). Valid where the bytes are (the same advance).
	 * Numbered by each slot's own sample size, which a peer chooses: a
	 * batch sized by one slot's may hold more samples in the next.
	 */
	int64_t *read_index;
	uint64_t read_index_len;
};

/* What the slot at a reader's position holds. */
struct ts_feed_info {
	uint32_t npos;
	uint32_t schema_len;
	uint64_t nsamples;
	uint64_t stream_epoch;
	uint64_t schema_hash;
	uint64_t sample_bytes[TS_MAX_POSITIONS];
	int64_t next_index;            /* the dataset index of the sample at our place; -1: not known */
	char schema[TS_FEED_SCHEMA_MAX];
};

/* One batch to publish. */
struct ts_feed_batch {
	uint32_t npos;
	uint32_t flags;                /* TS_BATCH_END_OF_EPOCH */
	uint64_t nsamples;
	const uint64_t *len;           /* bytes per position */
	const void *const *src;        /* bytes per position */
	const int64_t *index;          /* dataset index of each sample, in [0, nindex) */
	uint64_t stream_epoch;
	const char *schema;
	uint32_t schema_len;
	uint64_t cpu_ns;               /* what making the batch cost (counters) */
};

/* Join feed session `name` (created with p and label if new). nindex: dataset length. */
int ts_feed_open(struct ts_feed *f, const char *name, const struct ts_session_params *p, uint64_t nindex);
void ts_feed_close(struct ts_feed *f);
enum ts_role ts_feed_role(struct ts_feed *f);

/*
 * Producer. -EPERM: not the producer (any more); -ETIMEDOUT: consumers still
 * hold the slot (nothing was claimed); -EDEADLK: we are attached and behind
 * the head (a member elected producer with batches of its predecessor
 * unread: read them first);
 * -ENOSPC: shared memory is full.
 */
int ts_feed_publish(struct ts_feed *f, const struct ts_feed_batch *b, uint64_t timeout_ns);
/*
 * Producer, instead of a publish: note batch b (its index is required) in the
 * ledger as made, and publish nothing when nobody else is in the feed. 1:
 * noted, nobody here (nothing to publish); 0: someone is, nothing noted
 * (publish it); 2: someone came meanwhile (publish it; it was noted, and
 * taken out of the ledger again before the return). -EPERM: not the
 * producer; -EINVAL. The stream's state (ts_feed_stream_state) and a
 * joiner's place (ts_feed_attach) count such batches as published: a joiner
 * notes them lost and makes them itself, a successor makes the rest.
 */
int ts_feed_made(struct ts_feed *f, const struct ts_feed_batch *b);
/* Called by ts_feed_made between its note and its second look (a test seam: a weak no-op). */
void ts_feed_noted(struct ts_feed *f);
/* After a publish timed out for long enough: evict the consumers that stopped reading. */
int ts_feed_evict_laggards(struct ts_feed *f);
/* The same, for the consumers away from the feed and waiting in another for min_ns (ts_member.away_ns). */
int ts_feed_evict_away(struct ts_feed *f, uint64_t min_ns);
/* This process is away from the feed and waits in another (1), or not (0). */
void ts_feed_set_away(struct ts_feed *f, int away);

/*
 * Where the stream stands: the stream epoch of the last batch published and
 * whether it ended that epoch (nothing published yet: epoch 0, ended). For
 * an unfinished epoch, `rest` (nindex entries) receives the indices not
 * published in it yet, ascending, and *nrest their count; *npublished the
 * samples published in it. Called by the producer, it first claims the next
 * slot (waiting up to timeout_ns, errors as for publish), so that a replaced
 * predecessor cannot publish behind its back; the claim serves the next
 * publish.
 */
int ts_feed_stream_state(struct ts_feed *f, uint64_t *epoch, int *ended, int64_t *rest, uint64_t *nrest,
			 uint64_t *npublished, uint64_t timeout_ns);

/*
 * As ts_feed_stream_state, as a reader sees it whatever its role: a producer
 * claims no slot and writes nothing back (a member that lost its place notes
 * what was published meanwhile), and nothing waits.
 */
int ts_feed_stream_seen(struct ts_feed *f, uint64_t *epoch, int *ended, int64_t *rest, uint64_t *nrest,
			uint64_t *npublished);
/* As ts_feed_stream_state, counting what is not published without listing it. */
int ts_feed_stream_count(struct ts_feed *f, uint64_t *epoch, int *ended, uint64_t *nrest, uint64_t *npublished,
			 uint64_t timeout_ns);

/*
 * Consumer: (re-)attach at the head, or with at_epoch_start at the first
 * batch of the newest stream epoch (the one of the last published batch,
 * ended or not) while the ring still holds it, so that a job that starts
 * iterating reads that epoch whole; detach releases every slot held.
 */
int ts_feed_attach(struct ts_feed *f, int at_epoch_start);
int ts_feed_detach(struct ts_feed *f);
/* Is the reader at the head, between two batches? */
int ts_feed_at_head(struct ts_feed *f);
/*
 * Does the producer wait on us? 1 when it has claimed (or is waiting to
 * claim) the slot our place still holds: a reader that will not read for a
 * while (it makes part of its epoch privately) should detach instead of
 * holding the stream up. 0 otherwise or when detached; -EBADMSG.
 */
int ts_feed_holds_producer(struct ts_feed *f);
/* Wait for the slot the reader is in and describe it (and the sample at our place); sets the expected schema. */
int ts_feed_next(struct ts_feed *f, uint64_t timeout_ns, struct ts_feed_info *out);
/*
 * Copy the next want[p] - got[p] bytes of every position to dst[p] + got[p]
 * (dst NULL: skip them), raising got[]. Stops early at an epoch's end
 * (*eoe = 1). -ETIMEDOUT with got[] raised as far as data came; -ESTALE:
 * evicted (re-attach); -EPROTO: another schema or cut.
 */
int ts_feed_read(struct ts_feed *f, uint32_t npos, const uint64_t *want, void *const *dst, uint64_t *got,
		 int *eoe, uint64_t timeout_ns);

/*
 * ts_feed_read without the copy, when the next want[p] bytes of every
 * position lie in one slot (or end its epoch there): *ptr[p] point into a
 * private, copy-on-write mapping of the slot file (the program may write
 * into its batch; nobody else sees it), got[p] say how much, *id names the
 * view. The file is marked held, so the producer puts a fresh file in its
 * place rather than write into it: the bytes stay what they are until
 * ts_feed_release_view(id). -EXDEV: the request spans slots or too many
 * views are out (read it with ts_feed_read); other errors as ts_feed_read.
 * Nothing is consumed unless it returns 0.
 */
int ts_feed_read_view(struct ts_feed *f, uint32_t npos, const uint64_t *want, void **ptr, uint64_t *got, int *eoe,
		      uint64_t *id, uint64_t timeout_ns);
/* The mapping of a view not yet released (any thread): 0, or -ENOENT. */
int ts_feed_view_range(const struct ts_feed *f, uint64_t id, void **base, size_t *size);
/* Unmap a view and drop its hold (any thread); unknown ids (another feed's, released) are ignored. */
void ts_feed_release_view(struct ts_feed *f, uint64_t id);
/*
 * Turn every live view into private memory at the same address, so that it
 * outlives the feed (ts_feed_close does this first), and hand each to
 * keep(arg, id, base, size) if given: its unmap is the caller's from then on.
 */
void ts_feed_detach_views(struct ts_feed *f, void (*keep)(void *arg, uint64_t id, void *base, size_t size),
			  void *arg);

/*
 * Remove feed files of session incarnations that are gone, and first the
 * segment itself if every member is dead (a last member killed after the
 * others left); returns how many files were removed (the segment not
 * counted), or -errno. Files of an incarnation younger than a second are
 * removed only when it is `ended` (the caller's own, left) or the segment
 * removed here: a session made anew meanwhile keeps its files.
 */
int ts_feed_clean_stale(const char *session_name, uint64_t ended);

#endif
