/* SPDX-License-Identifier: MIT */
/*
 * ts_hash_bulk proves that a batch still holds the bytes it held when the
 * shim registered it for a GPU upload (shim/stream.c): any change of a byte,
 * anywhere, and any change of length must change it. ts_pages_unwritten
 * tells a written page of a private file mapping from the file's own.
 */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "hash.h"
#include "prim.h"

Test(hash, bulk_changes_with_any_byte_and_with_length)
{
	enum { N = 1031 }; /* lanes of 32 bytes and a tail */
	unsigned char a[N + 1], b[N + 1];
	for (int i = 0; i <= N; i++)
		a[i] = (unsigned char)(i * 131 + 7);
	memcpy(b, a, sizeof(a));
	uint64_t h = ts_hash_bulk(a, N);
	cr_assert_eq(ts_hash_bulk(b, N), h, "equal bytes, equal hash");
	for (int i = 0; i < N; i++) {
		b[i] ^= 1;
		cr_assert_neq(ts_hash_bulk(b, N), h, "one bit flipped at byte %d", i);
		b[i] ^= 1;
	}
	/* the same bytes at two lanes' places swapped */
	memcpy(b, a + 8, 8);
	memcpy(b + 8, a, 8);
	cr_assert_neq(ts_hash_bulk(b, N), h, "lanes swapped");
	memcpy(b, a, sizeof(a));
	b[N] = 0;
	a[N] = 0;
	cr_assert_neq(ts_hash_bulk(a, N + 1), h, "a byte more");
	for (size_t n = 0; n < 70; n++)
		cr_assert_neq(ts_hash_bulk(a, n), ts_hash_bulk(a, n + 1), "lengths %zu and %zu", n, n + 1);
}

Test(hash, pages_of_a_private_file_mapping_count_as_written_once_written)
{
	long page = sysconf(_SC_PAGESIZE);
	char path[] = "/tmp/tsshim-hash-test.XXXXXX";
	int fd = mkstemp(path);
	cr_assert_geq(fd, 0);
	unlink(path);
	cr_assert_eq(ftruncate(fd, 4 * page), 0);
	cr_assert_eq(pwrite(fd, "x", 1, 2 * page), 1);
	char *m = mmap(NULL, (size_t)(4 * page), PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
	cr_assert_neq(m, MAP_FAILED);
	cr_expect_eq(ts_pages_unwritten(m, (size_t)(4 * page)), 1, "not touched yet");
	cr_expect_eq(m[2 * page], 'x');
	cr_expect_eq(ts_pages_unwritten(m, (size_t)(4 * page)), 1, "read: the file's pages");
	m[page + 10] = 1; /* copy-on-write: page 1 is ours now */
	cr_expect_eq(ts_pages_unwritten(m + page + 10, 1), 0, "the written page");
	cr_expect_eq(ts_pages_unwritten(m, (size_t)(4 * page)), 0, "a range holding it");
	cr_expect_eq(ts_pages_unwritten(m + 2 * page, (size_t)(2 * page)), 1, "the pages after it");
	cr_expect_eq(ts_pages_unwritten(m, (size_t)page), 1, "the page before it");
	munmap(m, (size_t)(4 * page));
	close(fd);

	char *anon = mmap(NULL, (size_t)page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	cr_assert_neq(anon, MAP_FAILED);
	anon[0] = 1;
	cr_expect_eq(ts_pages_unwritten(anon, (size_t)page), 0, "anonymous memory is never a file's");
	munmap(anon, (size_t)page);
}

/* The reads of a file are hashed as they come: any cut into pieces gives ts_hash_bulk of the whole. */
Test(hash, a_stream_of_pieces_hashes_like_the_whole)
{
	enum { N = 4099 };
	static unsigned char a[N];
	uint64_t x = 88172645463325252ull;
	for (int i = 0; i < N; i++) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		a[i] = (unsigned char)x;
	}
	for (int round = 0; round < 2000; round++) {
		struct ts_hash_stream s;
		ts_hash_stream_init(&s);
		size_t at = 0, len = round < 200 ? (size_t)round : N - (size_t)(x % 64);
		while (at < len) {
			x ^= x << 13, x ^= x >> 7, x ^= x << 17;
			size_t piece = round % 3 == 0 ? 1 + x % 7 : round % 3 == 1 ? 1 + x % 100 : 1 + x % 3000;
			if (piece > len - at)
				piece = len - at;
			ts_hash_stream_add(&s, a + at, piece);
			at += piece;
		}
		cr_assert_eq(ts_hash_stream_value(&s), ts_hash_bulk(a, len), "round %d, %zu bytes", round, len);
	}
	struct ts_hash_stream s;
	ts_hash_stream_init(&s);
	ts_hash_stream_add(&s, a, 100);
	ts_hash_stream_add(&s, a + 101, 100);
	cr_assert_neq(ts_hash_stream_value(&s), ts_hash_bulk(a, 200), "a byte left out");
}
