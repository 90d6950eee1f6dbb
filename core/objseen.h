/* SPDX-License-Identifier: MIT */
/*
 * Batch objects a native loader's workers hand to their job, known by
 * their first bytes (issue 5, "which uploads are batches").
 *
 * A PyTorch-style loader's worker builds each batch tensor in a
 * shared-memory object (shm_open or memfd) and passes it to the main
 * process as a descriptor (SCM_RIGHTS); the main process uploads it, from
 * its mapping or from a pinned copy. The shim notes the head (the first
 * TS_OBJSEEN_HEAD bytes) of every such object it sees received, and looks
 * at the head of the job's large uploads: an upload that starts with an
 * object's head carries that worker's batch. What the shim does with that
 * is only tell (a native program's uploads are shared through
 * tsshim_batch(); see README, "The GPU data plane"): nothing here changes a
 * byte of the program's.
 *
 * A head identifies only when it has TS_OBJSEEN_HEAD bytes and they are
 * not one byte repeated (a zeroed buffer would match every zeroed object).
 * Equal heads are equal by a 64-bit hash (core/hash.h), which guards
 * against accidents, as everywhere in the shim.
 *
 * A watch ends, so that a program that receives such objects for other
 * reasons stops paying for the look: FOUND at the first upload of a noted
 * head, GAVE_UP after TS_OBJSEEN_TRIES uploads looked at in vain.
 * Thread-safe (a mutex: a note is one per batch, a look one per large
 * upload while the watch lasts).
 */
#ifndef TSSHIM_CORE_OBJSEEN_H
#define TSSHIM_CORE_OBJSEEN_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "hash.h"

#define TS_OBJSEEN_HEAD   4096u /* bytes of an object's start that identify it */
#define TS_OBJSEEN_RECENT 64u   /* heads remembered: the newest */
#define TS_OBJSEEN_TRIES  256u  /* uploads looked at before the watch gives up */

enum ts_objseen_state { TS_OBJSEEN_WATCH = 0, TS_OBJSEEN_FOUND, TS_OBJSEEN_GAVE_UP };

struct ts_objseen {
	pthread_mutex_t mu;
	_Atomic int state;  /* enum ts_objseen_state */
	_Atomic uint32_t n; /* heads remembered, <= TS_OBJSEEN_RECENT */
	uint32_t next;      /* where the next head goes */
	uint32_t tries;     /* uploads looked at in vain */
	uint64_t head[TS_OBJSEEN_RECENT];
};

void ts_objseen_init(struct ts_objseen *t);

/*
 * Hashing a head, in pieces (a descriptor read in chunks, or memory copied
 * out in chunks): feed exactly TS_OBJSEEN_HEAD bytes, then
 * ts_objseen_head_end gives the head, or -EINVAL when those bytes cannot
 * identify (fewer than TS_OBJSEEN_HEAD, one byte repeated).
 */
struct ts_objseen_hasher {
	struct ts_hash_stream hs;
	unsigned char first;
	int uniform;
};
void ts_objseen_head_begin(struct ts_objseen_hasher *h);
void ts_objseen_head_add(struct ts_objseen_hasher *h, const void *p, size_t n);
int ts_objseen_head_end(const struct ts_objseen_hasher *h, uint64_t *head);
/* The same, of one buffer of len bytes (only its first TS_OBJSEEN_HEAD count). */
int ts_objseen_head_of(const void *p, size_t len, uint64_t *head);

/* An object received: remember its head (the oldest is forgotten); not
 * when the record is busy this instant (safe in a signal handler). */
void ts_objseen_note(struct ts_objseen *t, uint64_t head);

/* Is a look worth its cost: a head noted, and the watch still on? Lock-free
 * hint, inline: the copy hooks ask it for every large upload. */
static inline int ts_objseen_watching(const struct ts_objseen *t)
{
	return atomic_load_explicit(&t->n, memory_order_relaxed) &&
	       atomic_load_explicit(&t->state, memory_order_relaxed) == TS_OBJSEEN_WATCH;
}

/*
 * An upload whose head is `head`: the state after it. FOUND exactly once,
 * at the first upload of a remembered head (*first set then: say so);
 * uploads before any note do not count against the watch.
 */
int ts_objseen_upload(struct ts_objseen *t, uint64_t head, int *first);
/* An upload whose head could not be had (too short, unreadable, uniform). */
int ts_objseen_upload_unknown(struct ts_objseen *t);

#endif
