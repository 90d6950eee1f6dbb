/* SPDX-License-Identifier: MIT */
#include "scope.h"

#include <errno.h>
#include <string.h>
#include <strings.h>

/* Append one component to out (len *n), handling "." and "..". */
static int push_component(char *out, size_t outlen, size_t *n, const char *c, size_t clen)
{
	if (clen == 0 || (clen == 1 && c[0] == '.'))
		return 0;
	if (clen == 2 && c[0] == '.' && c[1] == '.') {
		while (*n > 1 && out[*n - 1] != '/')
			(*n)--;
		if (*n > 1)
			(*n)--; /* drop the separator, but never the root */
		out[*n] = '\0';
		return 0;
	}
	size_t need = *n + (*n > 1 ? 1 : 0) + clen + 1;
	if (need > outlen)
		return -ENAMETOOLONG;
	if (*n > 1)
		out[(*n)++] = '/';
	memcpy(out + *n, c, clen);
	*n += clen;
	out[*n] = '\0';
	return 0;
}

static int push_path(char *out, size_t outlen, size_t *n, const char *p)
{
	while (*p) {
		const char *slash = strchr(p, '/');
		size_t clen = slash ? (size_t)(slash - p) : strlen(p);
		int ret = push_component(out, outlen, n, p, clen);
		if (ret)
			return ret;
		p += clen + (slash ? 1 : 0);
	}
	return 0;
}

int ts_path_normalize(const char *cwd, const char *path, char *out, size_t outlen)
{
	size_t n = 1;
	if (outlen < 2 || !path)
		return -EINVAL;
	out[0] = '/';
	out[1] = '\0';
	if (path[0] != '/') {
		if (!cwd || cwd[0] != '/')
			return -EINVAL;
		int ret = push_path(out, outlen, &n, cwd);
		if (ret)
			return ret;
	}
	return push_path(out, outlen, &n, path);
}

int ts_scope_set(struct ts_scope *s, const char *const *roots, uint32_t n)
{
	memset(s, 0, sizeof(*s));
	if (n > TS_DATA_MAX_ROOTS)
		return -EINVAL;
	for (uint32_t i = 0; i < n; i++) {
		if (!roots[i] || roots[i][0] != '/')
			return -EINVAL;
		int ret = ts_path_normalize(NULL, roots[i], s->root[i], sizeof(s->root[i]));
		if (ret)
			return ret;
		s->len[i] = (uint32_t)strlen(s->root[i]);
	}
	s->n = n;
	return 0;
}

int ts_scope_contains(const struct ts_scope *s, const char *abs_path)
{
	for (uint32_t i = 0; i < s->n; i++) {
		uint32_t l = s->len[i];
		if (l == 1) /* "/" holds everything */
			return 1;
		if (strncmp(abs_path, s->root[i], l) == 0 && (abs_path[l] == '/' || abs_path[l] == '\0'))
			return 1;
	}
	return 0;
}

int ts_path_is_jpeg(const char *path)
{
	const char *dot = strrchr(path, '.');
	if (!dot || strchr(dot, '/'))
		return 0;
	return strcasecmp(dot, ".jpg") == 0 || strcasecmp(dot, ".jpeg") == 0;
}

int ts_scope_detect_add(struct ts_scope_detector *d, const char *abs_path)
{
	if (abs_path[0] != '/')
		return -EINVAL;
	const char *slash = strrchr(abs_path, '/');
	size_t dlen = slash == abs_path ? 1 : (size_t)(slash - abs_path);
	if (dlen >= sizeof(d->common))
		return -ENAMETOOLONG;
	if (d->files == 0) {
		memcpy(d->common, abs_path, dlen);
		d->common[dlen] = '\0';
	} else {
		/* Shorten common[] to the longest prefix that ends at a component. */
		size_t i = 0, last = 1;
		while (i < dlen && d->common[i] && d->common[i] == abs_path[i]) {
			i++;
			if (d->common[i] == '/' || d->common[i] == '\0')
				last = (abs_path[i] == '/' || i == dlen) ? i : last;
		}
		if (d->common[last] != '\0' || last != dlen)
			d->spans_dirs = 1;
		d->common[last] = '\0';
	}
	d->files++;
	/*
	 * Files from two top-level trees have "/" in common: that is no dataset,
	 * and a scope of it would track every file the process reads and, with
	 * prefetch, read the whole machine (/proc and other users' files too).
	 */
	if (!strcmp(d->common, "/"))
		return 0;
	return d->files >= (d->spans_dirs ? TS_SCOPE_DETECT_FILES : TS_SCOPE_DETECT_ONE_DIR);
}
