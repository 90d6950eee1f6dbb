/* SPDX-License-Identifier: MIT */
/*
 * File-read tracking: which descriptors hold dataset files, and a proof of
 * what their first bytes were, so a JPEG decode can be tied to the file it
 * decodes (decode provenance) by content rather than by guesswork.
 */
#ifndef TSSHIM_SHIM_IO_H
#define TSSHIM_SHIM_IO_H

#include <stddef.h>
#include <stdint.h>

/* The identity of a file as the cache keys it: ctime too, which no one can
 * put back after a rewrite (cp -p and rsync -t put back the mtime). */
struct ts_file_id {
	uint64_t dev, ino, size, mtime_ns, ctime_ns;
};

/*
 * Provenance of a compressed buffer about to be decoded on this thread:
 * if buf holds exactly the bytes the thread's most recent dataset reads
 * read from the start of a file, in order (the whole file, or, when the
 * decoder's source can ask for more, what has been read of it while it is
 * still being read), fill *id (and the file's path, when known) and return
 * 1; else 0. Never blocks, never allocates.
 */
int ts_io_provenance(const void *buf, size_t len, int source_grows, struct ts_file_id *id, char *path,
		     size_t pathlen);

/* A decode of `path` was proven: feeds scope detection. */
void ts_io_decoded(const char *path);

/* The scope as "root[:root...]" for display; "" while undetected. */
const char *ts_io_scope_string(void);

/* The scope's roots (pointers stay valid); 0 while undetected. */
unsigned ts_io_scope_roots(const char **roots, unsigned max);

/* Set up from the configuration (constructor). */
void ts_io_init(void);
/* In a forked child (fork handler): the table now follows this process. */
void ts_io_fork_child(void);

#endif
