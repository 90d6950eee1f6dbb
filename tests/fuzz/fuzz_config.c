/* SPDX-License-Identifier: MIT */
/*
 * libFuzzer target: the TSSHIM_* configuration parser (ts_config_parse),
 * through its getter, as the shim calls it with getenv.
 *
 * Input: one byte for the error buffer's size (1..256), then records of
 * one selector byte and a NUL-terminated value (the last may run to the
 * end). The selector picks the variable (ts_config_vars[], or a name the
 * parser must ignore); a later record for the same variable replaces the
 * earlier one, like setenv.
 *
 * Invariants (abort = finding): on success every field is within what the
 * README promises; on failure the message is one NUL-terminated printable
 * line that names a TSSHIM_ variable and fits the buffer.
 */
#include <errno.h>
#include <string.h>

#include "config.h"
#include "fuzz_common.h"
#include "layout.h"
#include "session.h"

#define NVARS 9 /* ts_config_vars[] without its NULL */
static const char *values[NVARS + 1];
static char storage[NVARS + 1][8192];

static const char *get(const char *name)
{
	for (int i = 0; i < NVARS; i++)
		if (strcmp(name, ts_config_vars[i]) == 0)
			return values[i];
	return NULL;
}

static void check_ok(const struct ts_config *c)
{
	FUZZ_CHECK(c->mode >= TS_MODE_AUTO && c->mode <= TS_MODE_OFF, "mode %d", (int)c->mode);
	FUZZ_CHECK(c->depth >= 1 && c->depth <= TS_MAX_DEPTH, "depth %u", c->depth);
	FUZZ_CHECK(c->timeout_ms >= TS_TIMEOUT_MIN_MS && c->timeout_ms <= TS_TIMEOUT_MAX_MS, "timeout %u", c->timeout_ms);
	FUZZ_CHECK(c->cache_mb <= TS_CACHE_MAX_MB, "cache_mb %llu", (unsigned long long)c->cache_mb);
	FUZZ_CHECK(c->python == 0 || c->python == 1, "python %d", c->python);
	FUZZ_CHECK(c->prefetch == TS_PREFETCH_OFF || c->prefetch == TS_PREFETCH_WARM, "prefetch");
	FUZZ_CHECK(c->log >= TS_LOG_ERROR && c->log <= TS_LOG_DEBUG, "log %d", (int)c->log);
	FUZZ_CHECK(ts_session_name_valid(c->session), "session '%s'", c->session);
	FUZZ_CHECK(c->ndata <= TS_DATA_MAX_ROOTS, "ndata %u", c->ndata);
	FUZZ_CHECK(c->ndata == 0 || values[2] != NULL, "roots without TSSHIM_DATA");
	for (uint32_t i = 0; i < c->ndata; i++) {
		const char *r = c->data[i];
		FUZZ_CHECK(r >= c->data_buf && r < c->data_buf + sizeof(c->data_buf), "root %u outside data_buf", i);
		size_t n = strnlen(r, (size_t)(c->data_buf + sizeof(c->data_buf) - r));
		FUZZ_CHECK(r + n < c->data_buf + sizeof(c->data_buf), "root %u unterminated", i);
		FUZZ_CHECK(r[0] == '/', "root %u '%s' not absolute", i, r);
		FUZZ_CHECK(n == 1 || r[n - 1] != '/', "root %u '%s' keeps a trailing '/'", i, r);
		FUZZ_CHECK(strchr(r, ':') == NULL, "root %u '%s' holds ':'", i, r);
		for (size_t k = 0; k < n; k++)
			FUZZ_CHECK((unsigned char)r[k] >= 0x20 && r[k] != 0x7f, "root %u has a control character", i);
	}
}

static void check_err(const char *err, size_t errlen)
{
	size_t n = strnlen(err, errlen);
	FUZZ_CHECK(n < errlen, "message unterminated");
	for (size_t k = 0; k < n; k++)
		FUZZ_CHECK((unsigned char)err[k] >= 0x20 && (unsigned char)err[k] < 0x7f,
			   "message byte %zu is 0x%02x", k, (unsigned char)err[k]);
	if (errlen > 8)
		FUZZ_CHECK(strncmp(err, "TSSHIM_", errlen - 1 < 7 ? errlen - 1 : 7) == 0, "message '%s'", err);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct ts_config c;
	struct fz f = { data, size };
	size_t errlen = 1 + fz_u8(&f);
	char *err = malloc(errlen); /* exactly errlen: ASan catches a write past it */
	if (!err)
		abort();
	memset(values, 0, sizeof(values));
	while (f.n) {
		unsigned sel = fz_u8(&f) % (NVARS + 1);
		const uint8_t *nul = memchr(f.p, '\0', f.n);
		size_t n = nul ? (size_t)(nul - f.p) : f.n;
		if (n >= sizeof(storage[sel]))
			n = sizeof(storage[sel]) - 1;
		memcpy(storage[sel], f.p, n);
		storage[sel][n] = '\0';
		values[sel] = storage[sel];
		f.p += nul ? (size_t)(nul - f.p) + 1 : f.n;
		f.n = (size_t)(data + size - f.p);
	}
	memset(err, 0xa5, errlen);
	int r = ts_config_parse(&c, get, err, errlen);
	FUZZ_CHECK(r == 0 || r == -EINVAL, "returned %d", r);
	if (r == 0)
		check_ok(&c);
	else
		check_err(err, errlen);
	free(err);
	return 0;
}
