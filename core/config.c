/* SPDX-License-Identifier: MIT */
#include "config.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "prim.h"
#include "session.h"

const char *const ts_config_vars[] = {
	"TSSHIM_MODE",     "TSSHIM_DEPTH",      "TSSHIM_DATA",   "TSSHIM_SESSION",
	"TSSHIM_CACHE_MB", "TSSHIM_TIMEOUT_MS", "TSSHIM_PYTHON", "TSSHIM_PREFETCH",
	"TSSHIM_LOG",      NULL,
};

const char *ts_mode_name(enum ts_mode m)
{
	switch (m) {
	case TS_MODE_SOCKET: return "socket";
	case TS_MODE_EXACT: return "exact";
	case TS_MODE_OFF: return "off";
	default: return "auto";
	}
}

uint64_t ts_config_default_cache_mb(void)
{
	long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
	uint64_t mb = pages <= 0 || page <= 0 ? 512 : (uint64_t)pages / 8 * (uint64_t)page >> 20;
	/*
	 * The cache lives in /dev/shm, beside the shared memory the job itself
	 * needs (a DataLoader's workers hand their batches over there, and a
	 * container's /dev/shm is often 64 MiB): it takes at most a quarter.
	 */
	uint64_t shm = ts_shm_fs_bytes(); /* 0: unknown */
	if (shm && shm / 4 >> 20 < mb)
		mb = shm / 4 >> 20;
	return mb > 8192 ? 8192 : mb ? mb : 1;
}

/* One line: NAME='value' is invalid: expected ...; tsshim is off ... */
__attribute__((format(printf, 5, 6)))
static int reject(char *err, size_t errlen, const char *name, const char *value, const char *fmt, ...)
{
	char expected[200];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(expected, sizeof(expected), fmt, ap);
	va_end(ap);
	/* Show at most 64 characters, with control characters made visible. */
	char shown[72];
	size_t n = 0;
	for (const char *p = value; *p && n < 64; p++)
		shown[n++] = (*p >= 0x20 && *p < 0x7f) ? *p : '?';
	shown[n] = '\0';
	snprintf(err, errlen, "%s='%s%s' is invalid: expected %s; tsshim is off for this process", name, shown,
		 strlen(value) > 64 ? "..." : "", expected);
	return -EINVAL;
}

/* Plain decimal digits only: no sign, no spaces, no hex, no overflow. */
static int parse_uint(const char *s, uint64_t min, uint64_t max, uint64_t *out)
{
	uint64_t v = 0;
	if (!*s)
		return -EINVAL;
	for (; *s; s++) {
		if (*s < '0' || *s > '9')
			return -EINVAL;
		if (v > (UINT64_MAX - 9) / 10)
			return -ERANGE;
		v = v * 10 + (uint64_t)(*s - '0');
	}
	if (v < min || v > max)
		return -ERANGE;
	*out = v;
	return 0;
}

/* Index of s in words[], or -1. */
static int pick(const char *s, const char *const *words)
{
	for (int i = 0; words[i]; i++)
		if (strcmp(s, words[i]) == 0)
			return i;
	return -1;
}

static int parse_data(struct ts_config *c, const char *v, char *err, size_t errlen)
{
	static const char what[] = "absolute directories separated by ':' (at most 16, 4095 bytes in all)";
	size_t len = strlen(v);
	if (len == 0 || len >= sizeof(c->data_buf))
		return reject(err, errlen, "TSSHIM_DATA", v, "%s", what);
	for (size_t k = 0; k < len; k++) /* control characters: a mangled value, never a real root */
		if ((unsigned char)v[k] < 0x20 || v[k] == 0x7f)
			return reject(err, errlen, "TSSHIM_DATA", v, "%s", what);
	memcpy(c->data_buf, v, len + 1);
	c->ndata = 0;
	for (char *root = c->data_buf; root;) {
		char *next = strchr(root, ':');
		if (next)
			*next++ = '\0';
		size_t rl = strlen(root);
		if (root[0] != '/' || c->ndata == TS_DATA_MAX_ROOTS)
			return reject(err, errlen, "TSSHIM_DATA", v, "%s", what);
		while (rl > 1 && root[rl - 1] == '/')
			root[--rl] = '\0';
		c->data[c->ndata++] = root;
		root = next;
	}
	return 0;
}

static void set_defaults(struct ts_config *c)
{
	memset(c, 0, sizeof(*c));
	c->mode = TS_MODE_AUTO;
	c->depth = TS_DEPTH_DEFAULT;
	snprintf(c->session, sizeof(c->session), "default");
	c->cache_mb = ts_config_default_cache_mb();
	c->timeout_ms = TS_TIMEOUT_DEFAULT_MS;
	c->python = 1;
	c->prefetch = TS_PREFETCH_OFF;
	c->log = TS_LOG_WARN;
}

int ts_config_parse(struct ts_config *c, ts_getenv_fn get, char *err, size_t errlen)
{
	static const char *const modes[] = { "socket", "exact", "off", NULL };
	static const char *const levels[] = { "error", "warn", "info", "debug", NULL };
	static const char *const prefetch[] = { "off", "warm", NULL };
	static const char *const bools[] = { "0", "1", NULL };
	const char *v;
	uint64_t n;
	int i;

	set_defaults(c);
	/* LOG first, so that later messages already honour it. */
	if ((v = get("TSSHIM_LOG"))) {
		if ((i = pick(v, levels)) < 0)
			return reject(err, errlen, "TSSHIM_LOG", v, "one of error, warn, info, debug");
		c->log = (enum ts_log_level)i;
	}
	if ((v = get("TSSHIM_MODE"))) {
		if ((i = pick(v, modes)) < 0)
			return reject(err, errlen, "TSSHIM_MODE", v, "one of socket, exact, off");
		c->mode = (enum ts_mode)(TS_MODE_SOCKET + i);
	}
	if ((v = get("TSSHIM_DEPTH"))) {
		if (parse_uint(v, 1, TS_MAX_DEPTH, &n))
			return reject(err, errlen, "TSSHIM_DEPTH", v, "an integer from 1 to %u (batches)", TS_MAX_DEPTH);
		c->depth = (uint32_t)n;
	}
	if ((v = get("TSSHIM_DATA")) && parse_data(c, v, err, errlen))
		return -EINVAL;
	if ((v = get("TSSHIM_SESSION"))) {
		if (!ts_session_name_valid(v))
			return reject(err, errlen, "TSSHIM_SESSION", v,
				      "1 to %u characters from A-Z a-z 0-9 . _ - (not starting with '.' or '-')",
				      TS_NAME_MAX - 1);
		snprintf(c->session, sizeof(c->session), "%s", v);
	}
	if ((v = get("TSSHIM_CACHE_MB"))) {
		if (parse_uint(v, 0, TS_CACHE_MAX_MB, &n))
			return reject(err, errlen, "TSSHIM_CACHE_MB", v, "an integer from 0 to %u (MiB; 0 disables the cache)",
				      TS_CACHE_MAX_MB);
		c->cache_mb = n;
	}
	if ((v = get("TSSHIM_TIMEOUT_MS"))) {
		if (parse_uint(v, TS_TIMEOUT_MIN_MS, TS_TIMEOUT_MAX_MS, &n))
			return reject(err, errlen, "TSSHIM_TIMEOUT_MS", v, "an integer from %u to %u (milliseconds)",
				      TS_TIMEOUT_MIN_MS, TS_TIMEOUT_MAX_MS);
		c->timeout_ms = (uint32_t)n;
	}
	if ((v = get("TSSHIM_PYTHON"))) {
		if ((i = pick(v, bools)) < 0)
			return reject(err, errlen, "TSSHIM_PYTHON", v, "1 or 0");
		c->python = i;
	}
	if ((v = get("TSSHIM_PREFETCH"))) {
		if ((i = pick(v, prefetch)) < 0)
			return reject(err, errlen, "TSSHIM_PREFETCH", v, "off or warm");
		c->prefetch = (enum ts_prefetch_mode)i;
	}
	return 0;
}
