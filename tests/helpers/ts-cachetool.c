/* SPDX-License-Identifier: MIT */
/*
 * ts-cachetool: drive the shared decoded-image cache from real processes
 * (links the core, not the shim). See usage() for the commands.
 *
 * Every key K has one payload, derived from K alone, so any process can
 * check any hit byte for byte.
 */
#include "cache.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define PROG "ts-cachetool"

static void usage(FILE *f)
{
	fprintf(f,
		"usage: " PROG " work SESSION [--budget-mb N] [--keys N] [--ops N] [--seed N]\n"
		"                   [--order-seed N] [--wait-ms N] [--fill-us N] [--stall-at N]\n"
		"       " PROG " probe SESSION --key K [--budget-mb N] [--wait-ms N]\n"
		"       " PROG " hold SESSION [--budget-mb N]\n"
		"       " PROG " lie SESSION [--budget-mb N]\n"
		"       " PROG " lock SESSION [--budget-mb N]\n"
		"       " PROG " scribble SESSION [--ops N] [--seed N] [--budget-mb N]\n"
		"       " PROG " stats SESSION\n"
		"\n"
		"  work   open the cache of SESSION (default budget 8 MiB), print \"ready\",\n"
		"         then --ops gets (default 3000) over keys 0..--keys-1 (default 200):\n"
		"         even ops follow a sequence shared by every worker with the same\n"
		"         --order-seed (so workers ask for the same key at the same time),\n"
		"         odd ops pick a key at random (--seed). FILL: write the key's\n"
		"         payload, taking --fill-us (default 300) like a decode, and commit.\n"
		"         HIT: compare with the payload. --wait-ms (default 200) is how long\n"
		"         a get waits for another filler. --stall-at N: at the N-th fill,\n"
		"         write half the payload, print \"stalled key=K\" and wait to be\n"
		"         killed. Ends with \"done ops=.. hits=.. fills=.. bypasses=.. bad=..\n"
		"         max_get_ms=..\"; exit 0 only if no hit had wrong bytes.\n"
		"  probe  one get of key K: print \"probe key=K result=HIT|FILL|BYPASS ms=T\"\n"
		"         (a FILL is written and committed, a HIT verified), then the stats.\n"
		"  hold   stay a user of the cache until stdin reaches EOF or SIGTERM;\n"
		"         prints \"holding\", and the stats before closing.\n"
		"  lie    as a buggy or hostile peer: rewrite the shared header's mark of\n"
		"         how far the arena is reserved (falloc_hwm) to the whole arena,\n"
		"         print \"lied hwm=N\", and leave.\n"
		"  lock   take the cache's lock, print \"locked\" and wait to be killed\n"
		"         (a job that dies inside a critical section).\n"
		"  scribble  as a buggy or hostile peer: --ops times (default 3000, one\n"
		"         every 2 ms), write random bytes (--seed) over the whole lock,\n"
		"         print \"scribbled n=N\", and leave.\n"
		"  stats  read-only view of the cache: one line of counters.\n"
		"\n"
		"Every command gives up after 120 s (SIGALRM). Exit status: 0 done,\n"
		"1 failed (wrong bytes, cache refused), 2 usage error, 3 no cache (stats).\n");
}

static int usage_error(const char *msg, const char *arg)
{
	fprintf(stderr, PROG ": %s%s\n", msg, arg ? arg : "");
	usage(stderr);
	return 2;
}

static uint64_t mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

static uint64_t payload_len(uint64_t k)
{
	return 4096 + mix(k) % (124 * 1024);
}

static struct ts_cache_key key_of(uint64_t k)
{
	struct ts_cache_key key;
	memset(&key, 0, sizeof(key));
	key.dev = 0x7473;
	key.ino = k;
	key.size = payload_len(k);
	key.mtime_ns = 1;
	memcpy(key.params, "ts-cachetool", 12);
	return key;
}

static void payload(uint64_t k, unsigned char *p, uint64_t from, uint64_t to)
{
	for (uint64_t o = from & ~7ull; o < to; o += 8) {
		uint64_t v = mix(k * 0x100000001b3ull + o);
		for (unsigned b = 0; b < 8 && o + b < to; b++)
			if (o + b >= from)
				p[o + b] = (unsigned char)(v >> (8 * b));
	}
}

static int payload_ok(uint64_t k, const unsigned char *p, uint64_t len)
{
	for (uint64_t o = 0; o < len; o += 8) {
		uint64_t v = mix(k * 0x100000001b3ull + o);
		for (unsigned b = 0; b < 8 && o + b < len; b++)
			if (p[o + b] != (unsigned char)(v >> (8 * b)))
				return 0;
	}
	return 1;
}

static uint64_t now_us(void)
{
	return ts_prim_monotonic_ns() / 1000u;
}

static void spin_us(uint64_t us)
{
	uint64_t end = now_us() + us;
	while (now_us() < end)
		;
}

struct opts {
	uint64_t budget_mb, keys, ops, seed, order_seed, wait_ms, fill_us, stall_at, key;
	int have_key;
};

static int parse_opts(int argc, char **argv, struct opts *o)
{
	for (int i = 0; i < argc; i++) {
		char *end;
		if (i + 1 >= argc)
			return usage_error("missing value for ", argv[i]);
		errno = 0;
		unsigned long long v = strtoull(argv[i + 1], &end, 10);
		if (errno || end == argv[i + 1] || *end || argv[i + 1][0] == '-')
			return usage_error("bad value for ", argv[i]);
		const char *n = argv[i++];
		if (!strcmp(n, "--budget-mb"))
			o->budget_mb = v;
		else if (!strcmp(n, "--keys") && v > 0)
			o->keys = v;
		else if (!strcmp(n, "--ops"))
			o->ops = v;
		else if (!strcmp(n, "--seed"))
			o->seed = v;
		else if (!strcmp(n, "--order-seed"))
			o->order_seed = v;
		else if (!strcmp(n, "--wait-ms"))
			o->wait_ms = v;
		else if (!strcmp(n, "--fill-us"))
			o->fill_us = v;
		else if (!strcmp(n, "--stall-at"))
			o->stall_at = v;
		else if (!strcmp(n, "--key"))
			o->key = v, o->have_key = 1;
		else
			return usage_error("unknown or invalid option ", n);
	}
	return 0;
}

static void print_stats(const struct ts_cache_stats *s)
{
	printf("stats hits=%llu misses=%llu fills=%llu commits=%llu aborts=%llu bypasses=%llu waits=%llu "
	       "evictions=%llu reclaims=%llu orphans=%llu torn=%llu repairs=%llu bypass_wait=%llu "
	       "bypass_lock=%llu bypass_nospace=%llu bypass_shm=%llu bypass_cold=%llu entries=%llu filling=%llu users=%llu "
	       "bytes=%llu reserved=%llu budget=%llu saved_ms=%llu\n",
	       (unsigned long long)s->hits, (unsigned long long)s->misses, (unsigned long long)s->fills,
	       (unsigned long long)s->commits, (unsigned long long)s->aborts, (unsigned long long)s->bypasses,
	       (unsigned long long)s->waits, (unsigned long long)s->evictions, (unsigned long long)s->reclaims,
	       (unsigned long long)s->orphans, (unsigned long long)s->torn, (unsigned long long)s->repairs,
	       (unsigned long long)s->bypass_wait, (unsigned long long)s->bypass_lock,
	       (unsigned long long)s->bypass_nospace, (unsigned long long)s->bypass_shm,
	       (unsigned long long)s->bypass_cold, (unsigned long long)s->entries, (unsigned long long)s->filling, (unsigned long long)s->users,
	       (unsigned long long)s->bytes_in_use, (unsigned long long)s->reserved_bytes,
	       (unsigned long long)s->budget, (unsigned long long)(s->saved_decode_ns / 1000000u));
	fflush(stdout);
}

static int open_cache(struct ts_cache *c, const char *session, uint64_t budget_mb)
{
	char why[256] = "";
	int r = ts_cache_open(c, session, budget_mb << 20, why, sizeof(why));
	if (r) {
		fprintf(stderr, PROG ": cannot open the cache of %s: %s (%s)\n", session, strerror(-r), why);
		return 1;
	}
	return 0;
}

/* One get of key k: 'H', 'F' (filled), 'B', or 'X' (wrong bytes / error). */
static int one_get(struct ts_cache *c, uint64_t k, const struct opts *o, unsigned char *buf, uint64_t *fills,
		   uint64_t *get_us)
{
	struct ts_cache_key key = key_of(k);
	uint64_t len = payload_len(k);
	struct ts_cache_fill f;
	uint64_t t0 = now_us();
	int r = ts_cache_get(c, &key, len, buf, o->wait_ms * 1000000ull, &f);
	*get_us = now_us() - t0;
	if (r == TS_CACHE_HIT)
		return payload_ok(k, buf, len) ? 'H' : 'X';
	if (r == TS_CACHE_BYPASS)
		return 'B';
	if (r != TS_CACHE_FILL)
		return 'X';
	++*fills;
	uint64_t t1 = now_us();
	payload(k, f.ptr, 0, len / 2);
	if (o->stall_at && *fills == o->stall_at) {
		printf("stalled key=%llu\n", (unsigned long long)k);
		fflush(stdout);
		for (;;)
			pause(); /* until SIGKILL (or the alarm) */
	}
	payload(k, f.ptr, len / 2, len);
	uint64_t spent = now_us() - t1;
	if (spent < o->fill_us)
		spin_us(o->fill_us - spent);
	return ts_cache_commit(c, &f, (now_us() - t1) * 1000u) == 0 ? 'F' : 'X';
}

static int cmd_work(const char *session, struct opts *o)
{
	struct ts_cache c;
	if (open_cache(&c, session, o->budget_mb))
		return 1;
	printf("ready pid=%d\n", (int)getpid());
	fflush(stdout);
	unsigned char *buf = malloc(128 * 1024);
	uint64_t *order = malloc(o->keys * sizeof(*order));
	if (!buf || !order)
		return 1;
	for (uint64_t i = 0; i < o->keys; i++)
		order[i] = i;
	for (uint64_t i = o->keys - 1; i > 0; i--) { /* shared shuffle */
		uint64_t j = mix(o->order_seed * 1315423911u + i) % (i + 1), t = order[i];
		order[i] = order[j];
		order[j] = t;
	}
	uint64_t hits = 0, fills = 0, bypasses = 0, bad = 0, max_us = 0, x = mix(o->seed + 99);
	for (uint64_t op = 0; op < o->ops; op++) {
		uint64_t k;
		if (op % 2 == 0) {
			k = order[(op / 2) % o->keys];
		} else {
			x = mix(x);
			k = x % o->keys;
		}
		uint64_t us;
		switch (one_get(&c, k, o, buf, &fills, &us)) {
		case 'H': hits++; break;
		case 'B': bypasses++; break;
		case 'F': break;
		default:
			bad++;
			fprintf(stderr, PROG "[%d]: key %llu: wrong bytes or failed commit\n", (int)getpid(),
				(unsigned long long)k);
		}
		if (us > max_us)
			max_us = us;
	}
	struct ts_cache_stats s;
	ts_cache_stats(&c, &s);
	print_stats(&s);
	printf("done ops=%llu hits=%llu fills=%llu bypasses=%llu bad=%llu max_get_ms=%llu\n",
	       (unsigned long long)o->ops, (unsigned long long)hits, (unsigned long long)fills,
	       (unsigned long long)bypasses, (unsigned long long)bad, (unsigned long long)(max_us / 1000u));
	fflush(stdout);
	ts_cache_close(&c);
	free(buf);
	free(order);
	return bad ? 1 : 0;
}

static int cmd_probe(const char *session, struct opts *o)
{
	if (!o->have_key)
		return usage_error("probe: --key is required", NULL);
	struct ts_cache c;
	if (open_cache(&c, session, o->budget_mb))
		return 1;
	unsigned char *buf = malloc(128 * 1024);
	uint64_t fills = 0, us;
	int r = one_get(&c, o->key, o, buf, &fills, &us);
	const char *name = r == 'H' ? "HIT" : r == 'F' ? "FILL" : r == 'B' ? "BYPASS" : "WRONG";
	printf("probe key=%llu result=%s ms=%llu\n", (unsigned long long)o->key, name,
	       (unsigned long long)(us / 1000u));
	struct ts_cache_stats s;
	ts_cache_stats(&c, &s);
	print_stats(&s);
	ts_cache_close(&c);
	free(buf);
	return r == 'X' ? 1 : 0;
}

static volatile sig_atomic_t stop;

static void on_stop(int sig)
{
	(void)sig;
	stop = 1;
}

static int cmd_hold(const char *session, struct opts *o)
{
	struct ts_cache c;
	if (open_cache(&c, session, o->budget_mb))
		return 1;
	struct sigaction sa = { .sa_handler = on_stop };
	sigemptyset(&sa.sa_mask);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	printf("holding pid=%d\n", (int)getpid());
	fflush(stdout);
	struct pollfd pfd = { .fd = STDIN_FILENO, .events = POLLIN };
	while (!stop) {
		int n = poll(&pfd, 1, 100);
		if (n > 0) {
			char b[256];
			ssize_t r = read(STDIN_FILENO, b, sizeof(b));
			if (r <= 0 && !(r < 0 && errno == EINTR))
				break;
		}
	}
	struct ts_cache_stats s;
	ts_cache_stats(&c, &s);
	print_stats(&s);
	ts_cache_close(&c);
	return 0;
}

static int cmd_lie(const char *session, struct opts *o)
{
	struct ts_cache c;
	if (open_cache(&c, session, o->budget_mb))
		return 1;
	atomic_store(&c.hdr->falloc_hwm, c.arena_size);
	printf("lied hwm=%llu\n", (unsigned long long)c.arena_size);
	ts_cache_close(&c);
	return 0;
}

static int cmd_lock(const char *session, struct opts *o)
{
	struct ts_cache c;
	if (open_cache(&c, session, o->budget_mb))
		return 1;
	int r = ts_shm_lock(&c.hdr->lock, 10000000000ull);
	if (r < 0) {
		fprintf(stderr, PROG ": cannot take the lock: %s\n", strerror(-r));
		return 1;
	}
	printf("locked pid=%d\n", (int)getpid());
	fflush(stdout);
	for (;;)
		pause();
}

static int cmd_scribble(const char *session, struct opts *o)
{
	struct ts_cache c;
	if (open_cache(&c, session, o->budget_mb))
		return 1;
	unsigned char *lock = (unsigned char *)&c.hdr->lock;
	for (uint64_t i = 0; i < o->ops; i++) {
		for (size_t b = 0; b < sizeof(c.hdr->lock); b += 8) {
			uint64_t v = mix(o->seed * 1000003u + i * 64 + b);
			memcpy(lock + b, &v, 8);
		}
		ts_sleep_ns(2000000);
	}
	printf("scribbled n=%llu\n", (unsigned long long)o->ops);
	ts_cache_close(&c);
	return 0;
}

static int cmd_stats(const char *session)
{
	char path[TS_PATH_MAX], why[256] = "";
	if (ts_cache_path(path, sizeof(path), getuid(), session) != 0)
		return usage_error("invalid session name ", session);
	struct ts_cache_stats s;
	int r = ts_cache_view(path, &s, why, sizeof(why));
	if (r == -ENOENT) {
		printf("none\n");
		return 3;
	}
	if (r) {
		fprintf(stderr, PROG ": %s\n", why);
		return 1;
	}
	print_stats(&s);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc >= 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
		usage(stdout);
		return 0;
	}
	if (argc < 3)
		return usage_error("missing command or session", NULL);
	alarm(120); /* never hang a test run */
	struct opts o = { .budget_mb = 8, .keys = 200, .ops = 3000, .seed = 1, .order_seed = 1, .wait_ms = 200,
			  .fill_us = 300 };
	const char *cmd = argv[1], *session = argv[2];
	int r = parse_opts(argc - 3, argv + 3, &o);
	if (r)
		return r;
	if (!strcmp(cmd, "work"))
		return cmd_work(session, &o);
	if (!strcmp(cmd, "probe"))
		return cmd_probe(session, &o);
	if (!strcmp(cmd, "hold"))
		return cmd_hold(session, &o);
	if (!strcmp(cmd, "lie"))
		return cmd_lie(session, &o);
	if (!strcmp(cmd, "lock"))
		return cmd_lock(session, &o);
	if (!strcmp(cmd, "scribble"))
		return cmd_scribble(session, &o);
	if (!strcmp(cmd, "stats"))
		return cmd_stats(session);
	return usage_error("unknown command ", cmd);
}
