/* SPDX-License-Identifier: MIT */
/*
 * ts_config_parse: TSSHIM_* variables (PRODUCT.md section 2), read through a
 * fake getenv backed by a table. Every invalid value must yield -EINVAL and
 * one line naming the variable, showing (at most 64 characters of) the
 * value, saying what is expected and that the shim is off.
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "prim.h"

/* ---- fake environment --------------------------------------------------- */

struct env {
	const char *name;
	const char *value;
};

#define MAX_ENV 16
static struct env env_tab[MAX_ENV];
static size_t env_n;
/* Names the parser asked for, to check it reads only what it declares. */
static const char *asked[64];
static size_t nasked;

static const char *fake_get(const char *name)
{
	if (nasked < sizeof(asked) / sizeof(asked[0]))
		asked[nasked++] = name;
	for (size_t i = 0; i < env_n; i++)
		if (strcmp(env_tab[i].name, name) == 0)
			return env_tab[i].value;
	return NULL;
}

static void env_clear(void)
{
	env_n = 0;
	nasked = 0;
}

static void env_set(const char *name, const char *value)
{
	cr_assert(env_n < MAX_ENV, "test bug: fake environment full");
	env_tab[env_n].name = name;
	env_tab[env_n].value = value;
	env_n++;
}

static char errbuf[512];

/* Parse an environment holding only NAME=value. */
static int parse1(struct ts_config *c, const char *name, const char *value)
{
	env_clear();
	env_set(name, value);
	memset(errbuf, 0, sizeof(errbuf));
	memset(c, 0xab, sizeof(*c));
	return ts_config_parse(c, fake_get, errbuf, sizeof(errbuf));
}

/* A printable, shortened rendering of a value for assertion messages. */
static const char *shown_for_msg(const char *v)
{
	static char buf[4][80];
	static int k;
	char *b = buf[k++ & 3];
	size_t n = 0, len = strlen(v);
	for (size_t i = 0; v[i] && n < 40; i++) {
		unsigned char ch = (unsigned char)v[i];
		if (ch >= 0x20 && ch < 0x7f)
			b[n++] = (char)ch;
		else
			n += (size_t)snprintf(b + n, sizeof(buf[0]) - n, "\\x%02x", ch);
	}
	if (len > 40)
		n += (size_t)snprintf(b + n, sizeof(buf[0]) - n, "...(%zu chars)", len);
	b[n] = '\0';
	return b;
}

/* What the message must show for `v`: 64 characters at most, controls as '?'. */
static void expected_shown(const char *v, char *out, size_t outlen)
{
	size_t n = 0, len = strlen(v);
	for (size_t i = 0; i < len && i < 64 && n + 1 < outlen; i++) {
		unsigned char ch = (unsigned char)v[i];
		out[n++] = (ch >= 0x20 && ch < 0x7f) ? (char)ch : '?';
	}
	out[n] = '\0';
	if (len > 64)
		snprintf(out + n, outlen - n, "...");
}

/* NAME=value must be refused with a one-line message of the agreed form. */
static void expect_rejected(const char *name, const char *value)
{
	struct ts_config c;
	const char *sv = shown_for_msg(value);
	int rc = parse1(&c, name, value);
	cr_expect_eq(rc, -EINVAL, "%s='%s' should be rejected with -EINVAL, got %d", name, sv, rc);
	if (rc != -EINVAL)
		return;
	cr_expect(errbuf[0] != '\0', "%s='%s': empty error message", name, sv);
	int one_line = 1;
	for (const char *p = errbuf; *p; p++)
		if ((unsigned char)*p < 0x20 || *p == 0x7f)
			one_line = 0;
	cr_expect(one_line, "%s='%s': message must be one printable line: \"%s\"", name, sv,
		  shown_for_msg(errbuf));
	char prefix[64];
	snprintf(prefix, sizeof(prefix), "%s='", name);
	cr_expect(strncmp(errbuf, prefix, strlen(prefix)) == 0, "%s='%s': message must start with %s: \"%s\"", name,
		  sv, prefix, errbuf);
	cr_expect(strstr(errbuf, "is invalid: expected") != NULL,
		  "%s='%s': message must say 'is invalid: expected': \"%s\"", name, sv, errbuf);
	cr_expect(strstr(errbuf, "tsshim is off") != NULL, "%s='%s': message must say 'tsshim is off': \"%s\"", name,
		  sv, errbuf);
	/* The value as shown: between "NAME='" and "' is invalid". */
	const char *start = errbuf + strlen(prefix);
	const char *end = strstr(start, "' is invalid: expected");
	cr_expect(end != NULL, "%s='%s': value not quoted in \"%s\"", name, sv, errbuf);
	if (!end)
		return;
	char got[128], want[80];
	size_t glen = (size_t)(end - start) < sizeof(got) - 1 ? (size_t)(end - start) : sizeof(got) - 1;
	memcpy(got, start, glen);
	got[glen] = '\0';
	expected_shown(value, want, sizeof(want));
	cr_expect_str_eq(got, want, "%s='%s': value shown as '%s', expected '%s' (<= 64 chars, then '...')", name, sv,
			 got, want);
}

static char *repeat(char ch, size_t n)
{
	char *s = malloc(n + 1);
	cr_assert(s != NULL);
	memset(s, ch, n);
	s[n] = '\0';
	return s;
}

/* Values no variable accepts (TSSHIM_SESSION aside: see its own test). */
static const char *const garbage[] = {
	"",                        /* empty */
	"-1",                      /* negative */
	"abc",                     /* non-numeric */
	"+4",                      /* leading '+' */
	" 4",                      /* leading space */
	"4 ",                      /* trailing space */
	"0x10",                    /* hex */
	"99999999999999999999999", /* overflows 64 bits */
	"4\n",                     /* control characters */
	"\t4",
	"4\r",
	"\x1b[31m4",
	"4\x7f",
	NULL,
};

static void expect_garbage_rejected(const char *name)
{
	for (int i = 0; garbage[i]; i++)
		expect_rejected(name, garbage[i]);
	char *longv = repeat('4', 5000);
	expect_rejected(name, longv);
	free(longv);
	longv = repeat('x', 5000);
	expect_rejected(name, longv);
	free(longv);
}

/* ---- defaults ------------------------------------------------------------ */

Test(config, defaults_with_empty_environment)
{
	struct ts_config c;
	env_clear();
	memset(&c, 0xab, sizeof(c));
	int rc = ts_config_parse(&c, fake_get, errbuf, sizeof(errbuf));
	cr_assert_eq(rc, 0, "empty environment must parse, got %d (%s)", rc, errbuf);
	cr_expect_eq(c.mode, TS_MODE_AUTO, "default mode must be AUTO, got %d", c.mode);
	cr_expect_eq(c.depth, 4u, "default depth must be 4, got %u", c.depth);
	cr_expect_str_eq(c.session, "default", "default session must be 'default', got '%s'", c.session);
	cr_expect_eq(c.timeout_ms, 1000u, "default timeout must be 1000 ms, got %u", c.timeout_ms);
	cr_expect_eq(c.python, 1, "default python layer must be on, got %d", c.python);
	cr_expect_eq(c.prefetch, TS_PREFETCH_OFF, "default prefetch must be off, got %d", c.prefetch);
	cr_expect_eq(c.log, TS_LOG_WARN, "default log level must be warn, got %d", c.log);
	cr_expect_eq(c.ndata, 0u, "no TSSHIM_DATA: roots must be detected (ndata 0), got %u", c.ndata);
	uint64_t mb = ts_config_default_cache_mb();
	cr_expect_gt(mb, 0, "default cache budget must be > 0 MiB");
	cr_expect_leq(mb, 8192, "default cache budget must be at most 8 GiB, got %llu", (unsigned long long)mb);
	uint64_t shm = ts_shm_fs_bytes();
	if (shm >= 8u << 20)
		cr_expect_leq(mb, shm / 4 >> 20, "at most a quarter of /dev/shm (%llu MiB), got %llu",
			      (unsigned long long)(shm >> 20), (unsigned long long)mb);
	cr_expect_eq(c.cache_mb, mb, "default cache_mb must be ts_config_default_cache_mb() = %llu, got %llu",
		     (unsigned long long)mb, (unsigned long long)c.cache_mb);
}

Test(config, reads_exactly_the_declared_variables)
{
	struct ts_config c;
	env_clear();
	cr_assert_eq(ts_config_parse(&c, fake_get, errbuf, sizeof(errbuf)), 0);
	size_t nvars = 0;
	for (; ts_config_vars[nvars]; nvars++) {
		int seen = 0;
		for (size_t i = 0; i < nasked; i++)
			seen |= strcmp(asked[i], ts_config_vars[nvars]) == 0;
		cr_expect(seen, "%s is declared in ts_config_vars but was never read", ts_config_vars[nvars]);
	}
	cr_expect_eq(nvars, 9, "PRODUCT.md section 2 lists 9 variables, ts_config_vars has %zu", nvars);
	for (size_t i = 0; i < nasked; i++) {
		int declared = 0;
		for (size_t k = 0; ts_config_vars[k]; k++)
			declared |= strcmp(asked[i], ts_config_vars[k]) == 0;
		cr_expect(declared, "the parser read %s, which ts_config_vars does not declare", asked[i]);
	}
}

Test(config, all_variables_at_once)
{
	struct ts_config c;
	env_clear();
	env_set("TSSHIM_MODE", "exact");
	env_set("TSSHIM_DEPTH", "8");
	env_set("TSSHIM_DATA", "/data/imagenet/:/scratch");
	env_set("TSSHIM_SESSION", "sweep-3");
	env_set("TSSHIM_CACHE_MB", "2048");
	env_set("TSSHIM_TIMEOUT_MS", "250");
	env_set("TSSHIM_PYTHON", "0");
	env_set("TSSHIM_PREFETCH", "warm");
	env_set("TSSHIM_LOG", "debug");
	int rc = ts_config_parse(&c, fake_get, errbuf, sizeof(errbuf));
	cr_assert_eq(rc, 0, "valid environment refused: %s", errbuf);
	cr_expect_eq(c.mode, TS_MODE_EXACT);
	cr_expect_eq(c.depth, 8u);
	cr_expect_eq(c.ndata, 2u);
	if (c.ndata == 2) {
		cr_expect_str_eq(c.data[0], "/data/imagenet");
		cr_expect_str_eq(c.data[1], "/scratch");
	}
	cr_expect_str_eq(c.session, "sweep-3");
	cr_expect_eq(c.cache_mb, 2048u);
	cr_expect_eq(c.timeout_ms, 250u);
	cr_expect_eq(c.python, 0);
	cr_expect_eq(c.prefetch, TS_PREFETCH_WARM);
	cr_expect_eq(c.log, TS_LOG_DEBUG);
}

Test(config, one_variable_leaves_the_others_at_default)
{
	struct ts_config c;
	cr_assert_eq(parse1(&c, "TSSHIM_DEPTH", "16"), 0, "%s", errbuf);
	cr_expect_eq(c.depth, 16u);
	cr_expect_eq(c.mode, TS_MODE_AUTO);
	cr_expect_str_eq(c.session, "default");
	cr_expect_eq(c.timeout_ms, 1000u);
	cr_expect_eq(c.python, 1);
	cr_expect_eq(c.log, TS_LOG_WARN);
	cr_expect_eq(c.cache_mb, ts_config_default_cache_mb());
}

/* ---- valid values, per variable ----------------------------------------- */

Test(config, mode_valid_values)
{
	static const struct { const char *v; enum ts_mode m; } ok[] = {
		{ "socket", TS_MODE_SOCKET }, { "exact", TS_MODE_EXACT }, { "off", TS_MODE_OFF },
	};
	for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
		struct ts_config c;
		int rc = parse1(&c, "TSSHIM_MODE", ok[i].v);
		cr_expect_eq(rc, 0, "TSSHIM_MODE=%s refused: %s", ok[i].v, errbuf);
		cr_expect_eq(c.mode, ok[i].m, "TSSHIM_MODE=%s gave mode %d, expected %d", ok[i].v, c.mode, ok[i].m);
	}
	cr_expect_str_eq(ts_mode_name(TS_MODE_SOCKET), "socket");
	cr_expect_str_eq(ts_mode_name(TS_MODE_EXACT), "exact");
	cr_expect_str_eq(ts_mode_name(TS_MODE_OFF), "off");
	cr_expect_str_eq(ts_mode_name(TS_MODE_AUTO), "auto");
}

static void expect_uint(const char *name, const char *v, uint64_t want)
{
	struct ts_config c;
	int rc = parse1(&c, name, v);
	cr_expect_eq(rc, 0, "%s=%s refused: %s", name, v, errbuf);
	if (rc)
		return;
	uint64_t got = strcmp(name, "TSSHIM_DEPTH") == 0       ? c.depth
		       : strcmp(name, "TSSHIM_TIMEOUT_MS") == 0 ? c.timeout_ms
								: c.cache_mb;
	cr_expect_eq(got, want, "%s=%s parsed as %llu, expected %llu", name, v, (unsigned long long)got,
		     (unsigned long long)want);
}

Test(config, depth_valid_values)
{
	expect_uint("TSSHIM_DEPTH", "1", 1);
	expect_uint("TSSHIM_DEPTH", "4", 4);
	expect_uint("TSSHIM_DEPTH", "17", 17);
	expect_uint("TSSHIM_DEPTH", "64", 64);
}

Test(config, timeout_valid_values)
{
	expect_uint("TSSHIM_TIMEOUT_MS", "10", 10);
	expect_uint("TSSHIM_TIMEOUT_MS", "1000", 1000);
	expect_uint("TSSHIM_TIMEOUT_MS", "250", 250);
	expect_uint("TSSHIM_TIMEOUT_MS", "600000", 600000);
}

Test(config, cache_valid_values)
{
	expect_uint("TSSHIM_CACHE_MB", "0", 0); /* disables the cache */
	expect_uint("TSSHIM_CACHE_MB", "1", 1);
	expect_uint("TSSHIM_CACHE_MB", "4096", 4096);
	expect_uint("TSSHIM_CACHE_MB", "1048576", 1048576);
}

Test(config, python_valid_values)
{
	struct ts_config c;
	cr_expect_eq(parse1(&c, "TSSHIM_PYTHON", "0"), 0, "TSSHIM_PYTHON=0 refused: %s", errbuf);
	cr_expect_eq(c.python, 0, "TSSHIM_PYTHON=0 must turn the Python layer off");
	cr_expect_eq(parse1(&c, "TSSHIM_PYTHON", "1"), 0, "TSSHIM_PYTHON=1 refused: %s", errbuf);
	cr_expect_eq(c.python, 1, "TSSHIM_PYTHON=1 must turn the Python layer on");
}

Test(config, prefetch_valid_values)
{
	struct ts_config c;
	cr_expect_eq(parse1(&c, "TSSHIM_PREFETCH", "off"), 0, "TSSHIM_PREFETCH=off refused: %s", errbuf);
	cr_expect_eq(c.prefetch, TS_PREFETCH_OFF);
	cr_expect_eq(parse1(&c, "TSSHIM_PREFETCH", "warm"), 0, "TSSHIM_PREFETCH=warm refused: %s", errbuf);
	cr_expect_eq(c.prefetch, TS_PREFETCH_WARM);
}

Test(config, log_valid_values)
{
	static const struct { const char *v; enum ts_log_level l; } ok[] = {
		{ "error", TS_LOG_ERROR }, { "warn", TS_LOG_WARN }, { "info", TS_LOG_INFO }, { "debug", TS_LOG_DEBUG },
	};
	for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
		struct ts_config c;
		cr_expect_eq(parse1(&c, "TSSHIM_LOG", ok[i].v), 0, "TSSHIM_LOG=%s refused: %s", ok[i].v, errbuf);
		cr_expect_eq(c.log, ok[i].l, "TSSHIM_LOG=%s gave level %d, expected %d", ok[i].v, c.log, ok[i].l);
	}
}

Test(config, session_valid_values)
{
	static const char *const ok[] = { "exp-1.a_b", "a", "Z", "sweep_07", "x.y", "0x10", "12345", NULL };
	for (int i = 0; ok[i]; i++) {
		struct ts_config c;
		cr_expect_eq(parse1(&c, "TSSHIM_SESSION", ok[i]), 0, "TSSHIM_SESSION=%s refused: %s", ok[i], errbuf);
		cr_expect_str_eq(c.session, ok[i], "TSSHIM_SESSION=%s stored as '%s'", ok[i], c.session);
	}
	char *max = repeat('s', 63);
	struct ts_config c;
	cr_expect_eq(parse1(&c, "TSSHIM_SESSION", max), 0, "a 63-character session name must be accepted: %s", errbuf);
	cr_expect_str_eq(c.session, max, "63-character session name not stored whole");
	free(max);
}

/* ---- TSSHIM_DATA --------------------------------------------------------- */

static int data_in_buf(const struct ts_config *c, const char *p)
{
	return p >= c->data_buf && p < c->data_buf + sizeof(c->data_buf);
}

Test(config, data_two_roots_trailing_slash_stripped)
{
	struct ts_config c;
	int rc = parse1(&c, "TSSHIM_DATA", "/a:/b/");
	cr_assert_eq(rc, 0, "TSSHIM_DATA=/a:/b/ refused: %s", errbuf);
	cr_assert_eq(c.ndata, 2u, "TSSHIM_DATA=/a:/b/ must give 2 roots, got %u", c.ndata);
	cr_expect_str_eq(c.data[0], "/a", "first root");
	cr_expect_str_eq(c.data[1], "/b", "second root: trailing '/' must be stripped");
	cr_expect(data_in_buf(&c, c.data[0]) && data_in_buf(&c, c.data[1]),
		  "roots must point into the config's own buffer, not into the environment");
}

Test(config, data_root_slash_stays_slash)
{
	struct ts_config c;
	cr_assert_eq(parse1(&c, "TSSHIM_DATA", "/"), 0, "TSSHIM_DATA=/ refused: %s", errbuf);
	cr_assert_eq(c.ndata, 1u);
	cr_expect_str_eq(c.data[0], "/", "'/' must stay '/'");
	cr_assert_eq(parse1(&c, "TSSHIM_DATA", "///"), 0, "TSSHIM_DATA=/// refused: %s", errbuf);
	cr_assert_eq(c.ndata, 1u);
	cr_expect_str_eq(c.data[0], "/", "'///' must become '/'");
	cr_assert_eq(parse1(&c, "TSSHIM_DATA", "/data/set//"), 0, "%s", errbuf);
	cr_assert_eq(c.ndata, 1u);
	cr_expect_str_eq(c.data[0], "/data/set", "every trailing '/' must be stripped");
}

Test(config, data_sixteen_roots_ok_seventeen_refused)
{
	char v[256];
	size_t n = 0;
	for (int i = 0; i < 16; i++)
		n += (size_t)snprintf(v + n, sizeof(v) - n, "%s/r%d", i ? ":" : "", i);
	struct ts_config c;
	cr_assert_eq(parse1(&c, "TSSHIM_DATA", v), 0, "16 roots must be accepted: %s", errbuf);
	cr_assert_eq(c.ndata, 16u, "16 roots, got %u", c.ndata);
	cr_expect_str_eq(c.data[0], "/r0");
	cr_expect_str_eq(c.data[15], "/r15");
	snprintf(v + n, sizeof(v) - n, ":/r16");
	expect_rejected("TSSHIM_DATA", v);
}

Test(config, data_invalid_values)
{
	expect_rejected("TSSHIM_DATA", "a");        /* relative */
	expect_rejected("TSSHIM_DATA", "data/x");   /* relative */
	expect_rejected("TSSHIM_DATA", "/a::/b");   /* empty component */
	expect_rejected("TSSHIM_DATA", "/a:");      /* trailing ':' */
	expect_rejected("TSSHIM_DATA", ":/a");      /* leading ':' */
	expect_rejected("TSSHIM_DATA", ":");
	expect_rejected("TSSHIM_DATA", "/a:b");     /* second root relative */
	expect_rejected("TSSHIM_DATA", "~/data");   /* no shell expansion */
	expect_rejected("TSSHIM_DATA", "/data\n");  /* control characters in an absolute path */
	expect_rejected("TSSHIM_DATA", "/da\tta");
	expect_rejected("TSSHIM_DATA", "/a:/b\x1b");
	expect_garbage_rejected("TSSHIM_DATA");
}

Test(config, data_length_limit)
{
	/* 4095 bytes in all are accepted, 4096 are not. */
	char *v = repeat('d', 4095);
	v[0] = '/';
	struct ts_config c;
	cr_expect_eq(parse1(&c, "TSSHIM_DATA", v), 0, "a 4095-byte TSSHIM_DATA must be accepted: %s", errbuf);
	cr_expect_eq(c.ndata, 1u);
	free(v);
	v = repeat('d', 4096);
	v[0] = '/';
	expect_rejected("TSSHIM_DATA", v);
	free(v);
	v = repeat('d', 5000);
	v[0] = '/';
	expect_rejected("TSSHIM_DATA", v);
	free(v);
}

/* ---- invalid values, per variable --------------------------------------- */

Test(config, mode_invalid_values)
{
	expect_garbage_rejected("TSSHIM_MODE");
	expect_rejected("TSSHIM_MODE", "auto");
	expect_rejected("TSSHIM_MODE", "SOCKET");
	expect_rejected("TSSHIM_MODE", " socket");
	expect_rejected("TSSHIM_MODE", "socket ");
	expect_rejected("TSSHIM_MODE", "socket\n");
	expect_rejected("TSSHIM_MODE", "sock");
	expect_rejected("TSSHIM_MODE", "1");
}

Test(config, depth_invalid_values)
{
	expect_garbage_rejected("TSSHIM_DEPTH");
	expect_rejected("TSSHIM_DEPTH", "0");
	expect_rejected("TSSHIM_DEPTH", "65");
	expect_rejected("TSSHIM_DEPTH", "4294967297"); /* 2^32 + 1: no truncation to 1 */
	expect_rejected("TSSHIM_DEPTH", "18446744073709551616"); /* 2^64 */
	expect_rejected("TSSHIM_DEPTH", "18446744073709551620"); /* 2^64 + 4: must not wrap to 4 */
	expect_rejected("TSSHIM_DEPTH", "4.0");
	expect_rejected("TSSHIM_DEPTH", "4k");
}

Test(config, timeout_invalid_values)
{
	expect_garbage_rejected("TSSHIM_TIMEOUT_MS");
	expect_rejected("TSSHIM_TIMEOUT_MS", "0");
	expect_rejected("TSSHIM_TIMEOUT_MS", "9");
	expect_rejected("TSSHIM_TIMEOUT_MS", "600001");
	expect_rejected("TSSHIM_TIMEOUT_MS", "4294968296"); /* 2^32 + 1000 */
	expect_rejected("TSSHIM_TIMEOUT_MS", "18446744073709552616"); /* 2^64 + 1000: must not wrap */
	expect_rejected("TSSHIM_TIMEOUT_MS", "1000ms");
	expect_rejected("TSSHIM_TIMEOUT_MS", "1e3");
}

Test(config, cache_invalid_values)
{
	expect_garbage_rejected("TSSHIM_CACHE_MB");
	expect_rejected("TSSHIM_CACHE_MB", "1048577");
	expect_rejected("TSSHIM_CACHE_MB", "18446744073709551615"); /* UINT64_MAX */
	expect_rejected("TSSHIM_CACHE_MB", "18446744073709552128"); /* 2^64 + 512: must not wrap to 512 */
	expect_rejected("TSSHIM_CACHE_MB", "512M");
	expect_rejected("TSSHIM_CACHE_MB", "-0");
}

Test(config, python_invalid_values)
{
	expect_garbage_rejected("TSSHIM_PYTHON");
	expect_rejected("TSSHIM_PYTHON", "2");
	expect_rejected("TSSHIM_PYTHON", "true");
	expect_rejected("TSSHIM_PYTHON", "yes");
	expect_rejected("TSSHIM_PYTHON", "01");
	expect_rejected("TSSHIM_PYTHON", " 1");
	expect_rejected("TSSHIM_PYTHON", "1 ");
	expect_rejected("TSSHIM_PYTHON", "+1");
}

Test(config, prefetch_invalid_values)
{
	expect_garbage_rejected("TSSHIM_PREFETCH");
	expect_rejected("TSSHIM_PREFETCH", "on");
	expect_rejected("TSSHIM_PREFETCH", "WARM");
	expect_rejected("TSSHIM_PREFETCH", "warm ");
	expect_rejected("TSSHIM_PREFETCH", "1");
}

Test(config, log_invalid_values)
{
	expect_garbage_rejected("TSSHIM_LOG");
	expect_rejected("TSSHIM_LOG", "warning");
	expect_rejected("TSSHIM_LOG", "DEBUG");
	expect_rejected("TSSHIM_LOG", "3");
	expect_rejected("TSSHIM_LOG", "info\n");
}

Test(config, session_invalid_values)
{
	expect_rejected("TSSHIM_SESSION", "");
	expect_rejected("TSSHIM_SESSION", ".hidden");
	expect_rejected("TSSHIM_SESSION", ".");
	expect_rejected("TSSHIM_SESSION", "..");
	expect_rejected("TSSHIM_SESSION", "a/b");
	expect_rejected("TSSHIM_SESSION", "../x");
	expect_rejected("TSSHIM_SESSION", "a b");
	expect_rejected("TSSHIM_SESSION", " 4");
	expect_rejected("TSSHIM_SESSION", "4 ");
	expect_rejected("TSSHIM_SESSION", "+4");
	expect_rejected("TSSHIM_SESSION", "a:b");
	expect_rejected("TSSHIM_SESSION", "caf\xc3\xa9"); /* non-ASCII */
	expect_rejected("TSSHIM_SESSION", "4\n");
	expect_rejected("TSSHIM_SESSION", "\t4");
	expect_rejected("TSSHIM_SESSION", "a\x7f");
	expect_rejected("TSSHIM_SESSION", "\x1b[31m4");
	char *v = repeat('s', 64); /* max is 63 */
	expect_rejected("TSSHIM_SESSION", v);
	free(v);
	v = repeat('s', 5000);
	expect_rejected("TSSHIM_SESSION", v);
	free(v);
}

/* ---- the message itself -------------------------------------------------- */

Test(config, message_shows_64_chars_then_ellipsis)
{
	struct ts_config c;
	char *v = repeat('x', 5000);
	cr_assert_eq(parse1(&c, "TSSHIM_MODE", v), -EINVAL);
	char want[128];
	snprintf(want, sizeof(want), "TSSHIM_MODE='%.64s...' is invalid: expected ", v);
	cr_expect(strncmp(errbuf, want, strlen(want)) == 0, "message must show exactly 64 characters then '...': \"%s\"",
		  errbuf);
	cr_expect_lt(strlen(errbuf), 300, "message for a 5000-character value must stay short, got %zu chars",
		     strlen(errbuf));
	free(v);

	/* Exactly 64 characters: shown whole, no ellipsis. 65: ellipsis. */
	v = repeat('y', 64);
	cr_assert_eq(parse1(&c, "TSSHIM_LOG", v), -EINVAL);
	snprintf(want, sizeof(want), "TSSHIM_LOG='%s' is invalid", v);
	cr_expect(strncmp(errbuf, want, strlen(want)) == 0, "64-character value must be shown whole, no '...': \"%s\"",
		  errbuf);
	free(v);
	v = repeat('y', 65);
	cr_assert_eq(parse1(&c, "TSSHIM_LOG", v), -EINVAL);
	snprintf(want, sizeof(want), "TSSHIM_LOG='%.64s...' is invalid", v);
	cr_expect(strncmp(errbuf, want, strlen(want)) == 0, "65-character value must be cut at 64 plus '...': \"%s\"",
		  errbuf);
	free(v);
}

Test(config, message_makes_control_characters_visible)
{
	struct ts_config c;
	cr_assert_eq(parse1(&c, "TSSHIM_DEPTH", "4\n\x1b[2J"), -EINVAL);
	cr_expect(strncmp(errbuf, "TSSHIM_DEPTH='4??[2J' is invalid: expected ", 43) == 0,
		  "control characters must be shown as '?': \"%s\"", shown_for_msg(errbuf));
	cr_expect(strstr(errbuf, "from 1 to 64") != NULL, "depth message must give the range 1..64: \"%s\"", errbuf);
}

Test(config, message_says_what_is_expected)
{
	struct ts_config c;
	cr_assert_eq(parse1(&c, "TSSHIM_TIMEOUT_MS", "9"), -EINVAL);
	cr_expect(strstr(errbuf, "from 10 to 600000") != NULL, "timeout message must give 10..600000: \"%s\"", errbuf);
	cr_assert_eq(parse1(&c, "TSSHIM_CACHE_MB", "-1"), -EINVAL);
	cr_expect(strstr(errbuf, "from 0 to 1048576") != NULL, "cache message must give 0..1048576: \"%s\"", errbuf);
	cr_assert_eq(parse1(&c, "TSSHIM_MODE", "x"), -EINVAL);
	cr_expect(strstr(errbuf, "socket") && strstr(errbuf, "exact") && strstr(errbuf, "off"),
		  "mode message must list socket, exact, off: \"%s\"", errbuf);
	cr_assert_eq(parse1(&c, "TSSHIM_LOG", "x"), -EINVAL);
	cr_expect(strstr(errbuf, "error") && strstr(errbuf, "warn") && strstr(errbuf, "info") && strstr(errbuf, "debug"),
		  "log message must list the levels: \"%s\"", errbuf);
}

Test(config, small_error_buffer_is_not_overrun)
{
	struct ts_config c;
	char small[24];
	memset(small, 'Z', sizeof(small));
	env_clear();
	env_set("TSSHIM_DEPTH", "0");
	cr_assert_eq(ts_config_parse(&c, fake_get, small, 16), -EINVAL);
	cr_expect_eq(strlen(small), 15, "message must be cut to the buffer (15 chars + NUL), got %zu", strlen(small));
	cr_expect_eq(small[16], 'Z', "byte past errlen was written");
}

Test(config, first_invalid_variable_wins_and_log_is_checked_first)
{
	struct ts_config c;
	env_clear();
	env_set("TSSHIM_DEPTH", "0");
	env_set("TSSHIM_LOG", "loud");
	cr_assert_eq(ts_config_parse(&c, fake_get, errbuf, sizeof(errbuf)), -EINVAL);
	cr_expect(strncmp(errbuf, "TSSHIM_LOG=", 11) == 0, "TSSHIM_LOG is parsed first: \"%s\"", errbuf);
	cr_expect(strchr(errbuf, '\n') == NULL);
}
