/* SPDX-License-Identifier: MIT */
/*
 * Batch objects known by their heads (core/objseen.h): an upload that
 * starts with a received object's first bytes is found, once; anything
 * else is not, and the watch gives up in time.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "objseen.h"

static unsigned char *batch(unsigned seed, size_t len)
{
	unsigned char *b = malloc(len);
	cr_assert_not_null(b);
	uint32_t x = seed * 2654435761u + 1;
	for (size_t i = 0; i < len; i++) {
		x = x * 1103515245u + 12345u;
		b[i] = (unsigned char)(x >> 16);
	}
	return b;
}

static uint64_t head_of(const void *p, size_t len)
{
	uint64_t h = 0;
	cr_assert_eq(ts_objseen_head_of(p, len, &h), 0);
	return h;
}

Test(objseen, a_head_is_the_first_bytes_however_they_come)
{
	unsigned char *a = batch(1, 3 * TS_OBJSEEN_HEAD);
	uint64_t whole = head_of(a, 3 * TS_OBJSEEN_HEAD);
	cr_expect_eq(head_of(a, TS_OBJSEEN_HEAD), whole, "only the first TS_OBJSEEN_HEAD bytes count");
	struct ts_objseen_hasher h;
	ts_objseen_head_begin(&h);
	for (size_t at = 0; at < 2 * TS_OBJSEEN_HEAD; at += 500) /* pieces past the head are ignored */
		ts_objseen_head_add(&h, a + at, 500);
	uint64_t pieces = 0;
	cr_assert_eq(ts_objseen_head_end(&h, &pieces), 0);
	cr_expect_eq(pieces, whole, "read in pieces");
	a[TS_OBJSEEN_HEAD - 1] ^= 1;
	cr_expect_neq(head_of(a, TS_OBJSEEN_HEAD), whole, "the head's last byte changed");
	a[TS_OBJSEEN_HEAD - 1] ^= 1;
	a[TS_OBJSEEN_HEAD] ^= 1;
	cr_expect_eq(head_of(a, TS_OBJSEEN_HEAD + 1), whole, "a byte past the head changed");
	free(a);
}

Test(objseen, a_short_or_uniform_start_identifies_nothing)
{
	uint64_t h = 0;
	unsigned char *a = batch(2, TS_OBJSEEN_HEAD);
	cr_expect_eq(ts_objseen_head_of(a, TS_OBJSEEN_HEAD - 1, &h), -EINVAL, "one byte short");
	cr_expect_eq(ts_objseen_head_of(a, 0, &h), -EINVAL, "empty");
	memset(a, 0, TS_OBJSEEN_HEAD);
	cr_expect_eq(ts_objseen_head_of(a, TS_OBJSEEN_HEAD, &h), -EINVAL, "zeroed");
	memset(a, 0x7f, TS_OBJSEEN_HEAD);
	cr_expect_eq(ts_objseen_head_of(a, TS_OBJSEEN_HEAD, &h), -EINVAL, "one byte repeated");
	a[TS_OBJSEEN_HEAD - 1] = 0;
	cr_expect_eq(ts_objseen_head_of(a, TS_OBJSEEN_HEAD, &h), 0, "one byte differs: it identifies");
	free(a);
}

Test(objseen, an_upload_of_a_received_object_is_found_once)
{
	struct ts_objseen t;
	ts_objseen_init(&t);
	unsigned char *obj = batch(3, 2 * TS_OBJSEEN_HEAD), *other = batch(4, TS_OBJSEEN_HEAD);
	int first = -1;
	cr_expect_eq(ts_objseen_watching(&t), 0, "nothing received: no look is worth its cost");
	cr_expect_eq(ts_objseen_upload(&t, head_of(obj, TS_OBJSEEN_HEAD), &first), TS_OBJSEEN_WATCH);
	cr_expect_eq(first, 0, "an upload before the object was received");
	ts_objseen_note(&t, head_of(obj, 2 * TS_OBJSEEN_HEAD));
	cr_expect_eq(ts_objseen_watching(&t), 1);
	cr_expect_eq(ts_objseen_upload(&t, head_of(other, TS_OBJSEEN_HEAD), &first), TS_OBJSEEN_WATCH);
	cr_expect_eq(first, 0, "another buffer");
	cr_expect_eq(ts_objseen_upload_unknown(&t), TS_OBJSEEN_WATCH);
	cr_expect_eq(ts_objseen_upload(&t, head_of(obj, TS_OBJSEEN_HEAD), &first), TS_OBJSEEN_FOUND);
	cr_expect_eq(first, 1, "the object's copy: found");
	cr_expect_eq(ts_objseen_watching(&t), 0, "the watch is over");
	cr_expect_eq(ts_objseen_upload(&t, head_of(obj, TS_OBJSEEN_HEAD), &first), TS_OBJSEEN_FOUND);
	cr_expect_eq(first, 0, "told once");
	ts_objseen_init(&t);
	cr_expect_eq(ts_objseen_watching(&t), 0, "a fresh record watches nothing");
	cr_expect_eq(ts_objseen_upload(&t, head_of(obj, TS_OBJSEEN_HEAD), &first), TS_OBJSEEN_WATCH);
	cr_expect_eq(first, 0);
	free(obj);
	free(other);
}

Test(objseen, only_the_newest_heads_are_remembered)
{
	struct ts_objseen t;
	ts_objseen_init(&t);
	uint64_t heads[TS_OBJSEEN_RECENT + 1];
	for (unsigned i = 0; i <= TS_OBJSEEN_RECENT; i++) {
		unsigned char *b = batch(100 + i, TS_OBJSEEN_HEAD);
		heads[i] = head_of(b, TS_OBJSEEN_HEAD);
		free(b);
		ts_objseen_note(&t, heads[i]);
	}
	int first = 0;
	cr_expect_eq(ts_objseen_upload(&t, heads[0], &first), TS_OBJSEEN_WATCH, "the oldest was forgotten");
	cr_expect_eq(ts_objseen_upload(&t, heads[1], &first), TS_OBJSEEN_FOUND, "the next one is remembered");
	cr_expect_eq(first, 1);
}

Test(objseen, the_watch_gives_up_after_its_tries)
{
	struct ts_objseen t;
	ts_objseen_init(&t);
	unsigned char *obj = batch(5, TS_OBJSEEN_HEAD);
	uint64_t h = head_of(obj, TS_OBJSEEN_HEAD);
	int first = 0;
	for (unsigned i = 0; i < 2 * TS_OBJSEEN_TRIES; i++) /* before any object: free */
		cr_assert_eq(ts_objseen_upload_unknown(&t), TS_OBJSEEN_WATCH);
	ts_objseen_note(&t, h);
	for (unsigned i = 0; i + 1 < TS_OBJSEEN_TRIES; i++)
		cr_assert_eq(ts_objseen_upload(&t, h ^ (i + 1), &first), TS_OBJSEEN_WATCH, "try %u", i);
	cr_expect_eq(ts_objseen_upload_unknown(&t), TS_OBJSEEN_GAVE_UP, "the last try");
	cr_expect_eq(ts_objseen_watching(&t), 0);
	cr_expect_eq(ts_objseen_upload(&t, h, &first), TS_OBJSEEN_GAVE_UP, "no look any more");
	cr_expect_eq(first, 0);
	free(obj);
}

/* Threads noting and uploading at once (a pinning thread, the training loop): told exactly once
 * (each looks in vain 20 times first: 80 in all, under TS_OBJSEEN_TRIES). */
struct racer {
	struct ts_objseen *t;
	uint64_t head;
	int told;
};

static void *note_then_upload(void *arg)
{
	struct racer *r = arg;
	for (int i = 0; i < 40; i++) {
		int first = 0;
		if (i % 2 == 0)
			ts_objseen_note(r->t, r->head ^ (uint64_t)(i + 1));
		if (ts_objseen_watching(r->t) || i == 39)
			ts_objseen_upload(r->t, i == 20 ? r->head : r->head ^ 0xfff0000ull, &first);
		r->told += first;
	}
	return NULL;
}

Test(objseen, threads_racing_are_told_once)
{
	struct ts_objseen t;
	ts_objseen_init(&t);
	unsigned char *obj = batch(6, TS_OBJSEEN_HEAD);
	uint64_t h = head_of(obj, TS_OBJSEEN_HEAD);
	ts_objseen_note(&t, h);
	struct racer r[4];
	pthread_t th[4];
	for (int i = 0; i < 4; i++) {
		r[i] = (struct racer){&t, h, 0};
		cr_assert_eq(pthread_create(&th[i], NULL, note_then_upload, &r[i]), 0);
	}
	int told = 0;
	for (int i = 0; i < 4; i++) {
		pthread_join(th[i], NULL);
		told += r[i].told;
	}
	cr_expect_eq(told, 1, "four threads uploaded the object's head: told %d times", told);
	cr_expect_eq(atomic_load(&t.state), TS_OBJSEEN_FOUND);
	free(obj);
}
