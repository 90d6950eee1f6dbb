/* SPDX-License-Identifier: MIT */
/* Batch objects received from a loader's workers, by their heads (objseen.h). */
#include "objseen.h"

#include <errno.h>
#include <string.h>

void ts_objseen_init(struct ts_objseen *t)
{
	memset(t, 0, sizeof(*t));
	pthread_mutex_init(&t->mu, NULL);
}

void ts_objseen_head_begin(struct ts_objseen_hasher *h)
{
	ts_hash_stream_init(&h->hs);
	h->first = 0;
	h->uniform = 1;
}

void ts_objseen_head_add(struct ts_objseen_hasher *h, const void *p, size_t n)
{
	if (h->hs.len >= TS_OBJSEEN_HEAD)
		return;
	if (n > TS_OBJSEEN_HEAD - h->hs.len)
		n = (size_t)(TS_OBJSEEN_HEAD - h->hs.len);
	const unsigned char *b = p;
	if (n && !h->hs.len)
		h->first = b[0];
	for (size_t i = 0; i < n && h->uniform; i++)
		h->uniform = b[i] == h->first;
	ts_hash_stream_add(&h->hs, b, n);
}

int ts_objseen_head_end(const struct ts_objseen_hasher *h, uint64_t *head)
{
	if (h->hs.len < TS_OBJSEEN_HEAD || h->uniform)
		return -EINVAL;
	*head = ts_hash_stream_value(&h->hs);
	return 0;
}

int ts_objseen_head_of(const void *p, size_t len, uint64_t *head)
{
	struct ts_objseen_hasher h;
	ts_objseen_head_begin(&h);
	ts_objseen_head_add(&h, p, len);
	return ts_objseen_head_end(&h, head);
}

void ts_objseen_note(struct ts_objseen *t, uint64_t head)
{
	/* recvmsg is async-signal-safe: a handler that receives descriptors
	 * while its thread looks at an upload must not wait on itself. A head
	 * not noted costs a later match, never a wrong one. */
	if (pthread_mutex_trylock(&t->mu) != 0)
		return;
	t->head[t->next] = head;
	t->next = (t->next + 1) % TS_OBJSEEN_RECENT;
	if (atomic_load_explicit(&t->n, memory_order_relaxed) < TS_OBJSEEN_RECENT)
		atomic_fetch_add_explicit(&t->n, 1, memory_order_relaxed);
	pthread_mutex_unlock(&t->mu);
}

/* mu held: one more look in vain */
static int in_vain(struct ts_objseen *t)
{
	if (atomic_load_explicit(&t->n, memory_order_relaxed) && ++t->tries >= TS_OBJSEEN_TRIES)
		atomic_store_explicit(&t->state, TS_OBJSEEN_GAVE_UP, memory_order_relaxed);
	return atomic_load_explicit(&t->state, memory_order_relaxed);
}

int ts_objseen_upload(struct ts_objseen *t, uint64_t head, int *first)
{
	*first = 0;
	pthread_mutex_lock(&t->mu);
	int st = atomic_load_explicit(&t->state, memory_order_relaxed);
	if (st == TS_OBJSEEN_WATCH) {
		uint32_t n = atomic_load_explicit(&t->n, memory_order_relaxed);
		uint32_t i = 0;
		while (i < n && t->head[i] != head)
			i++;
		if (i < n) {
			atomic_store_explicit(&t->state, st = TS_OBJSEEN_FOUND, memory_order_relaxed);
			*first = 1;
		} else {
			st = in_vain(t);
		}
	}
	pthread_mutex_unlock(&t->mu);
	return st;
}

int ts_objseen_upload_unknown(struct ts_objseen *t)
{
	pthread_mutex_lock(&t->mu);
	int st = atomic_load_explicit(&t->state, memory_order_relaxed);
	if (st == TS_OBJSEEN_WATCH)
		st = in_vain(t);
	pthread_mutex_unlock(&t->mu);
	return st;
}
