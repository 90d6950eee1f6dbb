/* SPDX-License-Identifier: MIT */
/*
 * Dataset scope: the directories whose files are shared work. Either given
 * (TSSHIM_DATA) or detected: the deepest directory common to the first
 * files a process decodes (ROOT/train for an ImageFolder over
 * ROOT/train/<class>/<n>.jpg). Paths are compared after lexical
 * normalisation ("//", "/./", "/../"); symbolic links are not resolved.
 */
#ifndef TSSHIM_CORE_SCOPE_H
#define TSSHIM_CORE_SCOPE_H

#include <stddef.h>
#include <stdint.h>

#include "config.h"

#define TS_SCOPE_PATH_MAX 1024
#define TS_SCOPE_DETECT_FILES 8     /* decoded files before a scope is announced... */
#define TS_SCOPE_DETECT_ONE_DIR 64  /* ...if they span directories; else this many */

struct ts_scope {
	uint32_t n;
	uint32_t len[TS_DATA_MAX_ROOTS];
	char root[TS_DATA_MAX_ROOTS][TS_SCOPE_PATH_MAX];
};

/* Lexically normalise `path` (absolute, or relative to `cwd`) into out. */
int ts_path_normalize(const char *cwd, const char *path, char *out, size_t outlen);

/* Roots must be absolute; they are normalised. -EINVAL, -ENAMETOOLONG. */
int ts_scope_set(struct ts_scope *s, const char *const *roots, uint32_t n);
/* Is the normalised absolute path inside one of the roots? */
int ts_scope_contains(const struct ts_scope *s, const char *abs_path);

/* ".jpg"/".jpeg" in any case: the files a detection looks at. */
int ts_path_is_jpeg(const char *path);

struct ts_scope_detector {
	uint32_t files;
	int spans_dirs;                 /* files came from more than one directory */
	char common[TS_SCOPE_PATH_MAX]; /* common directory so far */
};

/*
 * Feed the path of a decoded file; common[] only ever widens. Returns 1
 * once the scope is worth announcing: TS_SCOPE_DETECT_FILES files from
 * more than one directory (an ImageFolder's classes), or
 * TS_SCOPE_DETECT_ONE_DIR files from one; 0 before, and never while all
 * they have in common is "/"; -errno for a path that cannot take part
 * (relative, too long).
 */
int ts_scope_detect_add(struct ts_scope_detector *d, const char *abs_path);

#endif
