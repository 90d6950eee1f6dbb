/* SPDX-License-Identifier: MIT */
/*
 * tsshim-verify: checks the records that tsshim-train --tsshim wrote for the
 * jobs of one session. Every batch line carries, per sample, XXH64 of its
 * image bytes then its label bytes (sh=, and dsh= for the bytes read back
 * from the device). Published batches (share=pub) define the stream: stream
 * batch fseq -> its samples' hashes. A served batch (share=served) must be
 * the stream's samples from (fseq, fsamp) on, and no job may train on one
 * stream position twice. Two passes over the files: the stream first, then
 * every line against it. --help documents the checks.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train_hash.h"

#define PROG "tsshim-verify"
#define MAX_SAMPLES (1u << 24) /* per line: far above any batch, bounds garbage */
#define MAX_LOADERS 1024

enum { SHARE_NONE = -1, SHARE_OWN, SHARE_PUB, SHARE_SERVED };

static struct {
	int strict, quiet;
	unsigned long max_problems;
} opt = {.max_problems = 20};

/* ---- small helpers -------------------------------------------------------------- */

__attribute__((noreturn)) static void out_of_memory(void)
{
	fprintf(stderr, PROG ": out of memory\n");
	exit(2);
}

static void *xcalloc(size_t n, size_t size)
{
	void *p = calloc(n ? n : 1, size);
	if (!p)
		out_of_memory();
	return p;
}

/* Strict decimal, at most 19 digits. */
static int parse_dec(const char *s, uint64_t *v)
{
	if (!s || !*s || strspn(s, "0123456789") != strlen(s) || strlen(s) > 19)
		return -1;
	*v = strtoull(s, NULL, 10);
	return 0;
}

static int hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

struct hvec {
	uint64_t *v;
	size_t n, cap;
};

/* "H1,H2,..": each exactly 16 hex digits. Returns 0, or -1 on bad input. */
static int parse_hashes(const char *s, struct hvec *out)
{
	out->n = 0;
	for (const char *p = s;; p += 17) {
		uint64_t h = 0;
		for (int i = 0; i < 16; i++) {
			int d = hexval(p[i]);
			if (d < 0)
				return -1;
			h = h << 4 | (uint64_t)d;
		}
		if (p[16] != ',' && p[16] != 0)
			return -1;
		if (out->n == MAX_SAMPLES)
			return -1;
		if (out->n == out->cap) {
			size_t nc = out->cap ? 2 * out->cap : 256;
			uint64_t *nv = realloc(out->v, nc * sizeof *nv);
			if (!nv)
				out_of_memory();
			out->v = nv;
			out->cap = nc;
		}
		out->v[out->n++] = h;
		if (!p[16])
			return 0;
	}
}

/* ---- tables: stream batches and positions -------------------------------------------- */

struct slot {
	uint64_t k[3]; /* loader, stream batch, sample (0 for batches) */
	int used;
	const char *file; /* where it was defined; NULL: just added */
	unsigned long line;
	uint64_t *h; /* a stream batch's per-sample hashes */
	size_t n;
};

struct table {
	struct slot *s;
	size_t cap, len;
};

static size_t key_hash(const uint64_t k[3])
{
	return (size_t)mix64(mix64(mix64(k[0]) ^ k[1]) ^ k[2]);
}

static struct slot *table_probe(struct slot *s, size_t cap, const uint64_t k[3])
{
	for (size_t i = key_hash(k) & (cap - 1);; i = (i + 1) & (cap - 1))
		if (!s[i].used || !memcmp(s[i].k, k, sizeof s[i].k))
			return &s[i];
}

static void table_grow(struct table *t)
{
	size_t nc = t->cap ? 2 * t->cap : 1024;
	struct slot *ns = xcalloc(nc, sizeof *ns);
	for (size_t i = 0; i < t->cap; i++)
		if (t->s[i].used)
			*table_probe(ns, nc, t->s[i].k) = t->s[i];
	free(t->s);
	t->s = ns;
	t->cap = nc;
}

/* The slot of k; with add, a new one (file NULL) when absent, else NULL. */
static struct slot *table_get(struct table *t, uint64_t a, uint64_t b, uint64_t c, int add)
{
	const uint64_t k[3] = {a, b, c};
	if (add && 2 * (t->len + 1) > t->cap)
		table_grow(t);
	if (!t->cap)
		return NULL;
	struct slot *s = table_probe(t->s, t->cap, k);
	if (s->used)
		return s;
	if (!add)
		return NULL;
	s->used = 1;
	memcpy(s->k, k, sizeof s->k);
	t->len++;
	return s;
}

static void table_free(struct table *t)
{
	for (size_t i = 0; i < t->cap; i++)
		free(t->s[i].h);
	free(t->s);
	memset(t, 0, sizeof *t);
}

/* ---- state and reports ------------------------------------------------------------- */

static struct {
	struct table stream; /* (loader, fseq) -> published batch */
	struct table seen;   /* this file's (loader, fseq, sample) -> line */
	char *loaders[MAX_LOADERS];
	int nloaders;
	uint64_t files, lines, pub, served, own, verified, unverifiable, problems;
	struct hvec sh, dsh;
} V;

/* The current file and its loader (its "# tsshim_loader=" header; none: 0). */
static struct {
	const char *name;
	unsigned long line;
	uint64_t loader;
	uint64_t unshared, first_unshared;
} F;

__attribute__((format(printf, 1, 2))) static void problem(const char *fmt, ...)
{
	if (++V.problems > opt.max_problems)
		return;
	va_list ap;
	va_start(ap, fmt);
	printf("%s:%lu: ", F.name, F.line);
	vprintf(fmt, ap);
	putchar('\n');
	va_end(ap);
}

static uint64_t loader_id(const char *name)
{
	for (int i = 0; i < V.nloaders; i++)
		if (!strcmp(V.loaders[i], name))
			return (uint64_t)i + 1;
	if (V.nloaders == MAX_LOADERS)
		return 0;
	if (!(V.loaders[V.nloaders] = strdup(name)))
		out_of_memory();
	return (uint64_t)++V.nloaders;
}

/* ---- lines ---------------------------------------------------------------------------- */

struct line {
	const char *seq, *phase, *n, *share, *fseq, *fsamp, *sh, *dsh; /* values, NULL: absent */
	int kind;                                                       /* SHARE_* */
	uint64_t nsamples, fseq_v, fsamp_v;
};

/* Split buf at blanks (in place) and pick the fields. */
static void split_fields(char *buf, struct line *l)
{
	static const char *const keys[] = {"seq=", "phase=", "n=", "share=", "fseq=", "fsamp=", "sh=", "dsh="};
	const char **vals[] = {&l->seq, &l->phase, &l->n, &l->share, &l->fseq, &l->fsamp, &l->sh, &l->dsh};
	memset(l, 0, sizeof *l);
	for (char *save = NULL, *t = strtok_r(buf, " \t\r\n", &save); t; t = strtok_r(NULL, " \t\r\n", &save))
		for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
			if (!strncmp(t, keys[i], strlen(keys[i]))) {
				*vals[i] = t + strlen(keys[i]);
				break;
			}
}

/* Parse a batch line into l and V.sh/V.dsh. Returns 1 when it can be
 * checked, 0 when not (after a problem report when report is set). */
static int parse_line(char *buf, struct line *l, int report)
{
	split_fields(buf, l);
	if (!l->seq || !l->phase || !l->n) {
		if (report)
			problem("not a batch line (no seq=, phase= or n=)");
		return 0;
	}
	if (!l->share) {
		if (report && !F.unshared++)
			F.first_unshared = F.line;
		return 0;
	}
	const char *why = NULL;
	l->kind = !strcmp(l->share, "own") ? SHARE_OWN : !strcmp(l->share, "pub") ? SHARE_PUB
		  : !strcmp(l->share, "served") ? SHARE_SERVED : SHARE_NONE;
	if (l->kind == SHARE_NONE)
		why = "share= is not own, pub or served";
	else if (strcmp(l->phase, "train") && strcmp(l->phase, "val"))
		why = "phase= is not train or val";
	else if (parse_dec(l->n, &l->nsamples) < 0 || l->nsamples < 1 || l->nsamples > MAX_SAMPLES)
		why = "bad n=";
	else if (l->kind != SHARE_OWN && (parse_dec(l->fseq, &l->fseq_v) < 0 || parse_dec(l->fsamp, &l->fsamp_v) < 0))
		why = "share=pub or served without a valid fseq= and fsamp=";
	else if (!l->sh || parse_hashes(l->sh, &V.sh) < 0)
		why = "no sh= or one that is not a list of 16-hex-digit hashes";
	else if (V.sh.n != l->nsamples)
		why = "sh= does not hold n hashes";
	else if (l->dsh && (parse_hashes(l->dsh, &V.dsh) < 0 || V.dsh.n != l->nsamples))
		why = "dsh= is not a list of n 16-hex-digit hashes";
	if (why && report)
		problem("malformed batch line: %s", why);
	return !why;
}

/* Pass 1: a published batch joins the stream; the same fseq twice must agree. */
static void stream_add(const struct line *l)
{
	if (l->kind != SHARE_PUB || l->fsamp_v != 0)
		return;
	struct slot *s = table_get(&V.stream, F.loader, l->fseq_v, 0, 1);
	if (s->file) {
		if (s->n != V.sh.n || memcmp(s->h, V.sh.v, s->n * sizeof *s->h))
			problem("stream batch %" PRIu64 " published again with other samples (first at %s:%lu: "
				"%zu samples, here %zu)", l->fseq_v, s->file, s->line, s->n, V.sh.n);
		return;
	}
	s->file = F.name;
	s->line = F.line;
	s->n = V.sh.n;
	s->h = xcalloc(s->n, sizeof *s->h);
	memcpy(s->h, V.sh.v, s->n * sizeof *s->h);
}

/* (a): the device got exactly the host bytes. */
static void check_device(const struct line *l)
{
	if (!l->dsh)
		return;
	size_t bad = 0, first = 0;
	for (size_t i = 0; i < V.sh.n; i++)
		if (V.sh.v[i] != V.dsh.v[i] && !bad++)
			first = i;
	if (bad)
		problem("device bytes differ from the host bytes (dsh= vs sh=): sample %zu: sh %016" PRIx64
			" dsh %016" PRIx64 " (%zu of %zu samples differ)", first, V.sh.v[first], V.dsh.v[first], bad,
			V.sh.n);
}

/* (d): one stream position, once per job. Returns 0, or -1 when repeated. */
static int mark_seen(uint64_t fseq, uint64_t k, unsigned long *prev)
{
	struct slot *s = table_get(&V.seen, F.loader, fseq, k, 1);
	if (s->file) {
		*prev = s->line;
		return -1;
	}
	s->file = F.name;
	s->line = F.line;
	return 0;
}

static void report_repeats(size_t rep, uint64_t fseq, uint64_t k, unsigned long prev)
{
	if (rep)
		problem("repeated sample: stream batch %" PRIu64 " sample %" PRIu64 " already trained on at line %lu "
			"(%zu of this line's samples repeat)", fseq, k, prev, rep);
}

static void check_pub(const struct line *l)
{
	size_t rep = 0;
	uint64_t rk = 0;
	unsigned long rprev = 0, prev;
	V.pub++;
	if (l->fsamp_v != 0) {
		problem("share=pub with fsamp=%" PRIu64 ": a published batch starts its stream batch (fsamp=0)",
			l->fsamp_v);
		return;
	}
	for (uint64_t k = 0; k < V.sh.n; k++)
		if (mark_seen(l->fseq_v, k, &prev) < 0 && !rep++)
			rk = k, rprev = prev;
	report_repeats(rep, l->fseq_v, rk, rprev);
}

/* Positions past the known stream: counted; the first one is still a real
 * position of this job (repeats). A problem with --strict only. */
static void unverifiable(uint64_t seq, uint64_t k, size_t left)
{
	unsigned long prev;
	V.unverifiable += left;
	if (mark_seen(seq, k, &prev) < 0)
		report_repeats(1, seq, k, prev);
	if (opt.strict)
		problem("unverifiable: %zu served samples from stream batch %" PRIu64 " sample %" PRIu64
			" on: no share=pub line records that stream batch", left, seq, k);
}

/* (c): the served samples are the stream's from (fseq, fsamp) on, walking
 * into the next stream batches; positions no pub line defines are
 * unverifiable (a problem only with --strict). */
static void check_served(const struct line *l)
{
	uint64_t seq = l->fseq_v, k = l->fsamp_v, rseq = 0, rk = 0, mseq = 0, mk = 0;
	size_t bad = 0, rep = 0, first = 0, i;
	unsigned long rprev = 0, prev;
	const struct slot *s = table_get(&V.stream, F.loader, seq, 0, 0), *ms = NULL;
	V.served++;
	if (s && k >= s->n) {
		problem("share=served with fsamp=%" PRIu64 " beyond stream batch %" PRIu64 " (%zu samples, published "
			"at %s:%lu)", k, seq, s->n, s->file, s->line);
		return;
	}
	for (i = 0; i < V.sh.n; i++, k++) {
		if (s && k == s->n) {
			s = table_get(&V.stream, F.loader, ++seq, 0, 0);
			k = 0;
		}
		if (!s)
			break;
		if (s->h[k] == V.sh.v[i])
			V.verified++;
		else if (!bad++)
			first = i, mseq = seq, mk = k, ms = s;
		if (mark_seen(seq, k, &prev) < 0 && !rep++)
			rseq = seq, rk = k, rprev = prev;
	}
	if (bad)
		problem("served sample %zu differs from the stream (image and label bytes): stream batch %" PRIu64
			" sample %" PRIu64 " is %016" PRIx64 " (published at %s:%lu), this job got %016" PRIx64
			" (%zu of %zu samples differ)", first, mseq, mk, ms->h[mk], ms->file, ms->line, V.sh.v[first],
			bad, V.sh.n);
	report_repeats(rep, rseq, rk, rprev);
	if (i < V.sh.n)
		unverifiable(seq, k, V.sh.n - i);
}

/* Pass 2: every check of one line. */
static void check_line(char *buf)
{
	struct line l;
	V.lines++;
	if (!parse_line(buf, &l, 1))
		return;
	check_device(&l);
	if (!strcmp(l.phase, "val") && l.kind != SHARE_OWN) {
		problem("validation batch with share=%s: validation must stay the job's own (share=own)", l.share);
		return;
	}
	if (l.kind == SHARE_PUB)
		check_pub(&l);
	else if (l.kind == SHARE_SERVED)
		check_served(&l);
	else
		V.own++;
}

/* ---- files ------------------------------------------------------------------------------ */

static void header_line(const char *buf)
{
	static const char key[] = "# tsshim_loader=";
	if (strncmp(buf, key, sizeof key - 1))
		return;
	char name[256];
	size_t n = strcspn(buf + sizeof key - 1, " \t\r\n");
	snprintf(name, sizeof name, "%.*s", (int)(n < sizeof name ? n : sizeof name - 1), buf + sizeof key - 1);
	F.loader = loader_id(name);
}

/* One pass over one file; pass 1 builds the stream, pass 2 checks. Returns
 * -1 when it cannot be read. */
static int run_file(const char *name, int pass)
{
	FILE *f = fopen(name, "re");
	if (!f) {
		fprintf(stderr, PROG ": %s: %s\n", name, strerror(errno));
		return -1;
	}
	char *buf = NULL;
	size_t cap = 0;
	ssize_t len;
	memset(&F, 0, sizeof F);
	F.name = name;
	while ((len = getline(&buf, &cap, f)) >= 0) {
		F.line++;
		if (buf[0] == '#') {
			header_line(buf);
			continue;
		}
		if (strspn(buf, " \t\r\n") == (size_t)len)
			continue; /* blank */
		struct line l;
		if (pass == 2)
			check_line(buf);
		else if (parse_line(buf, &l, 0))
			stream_add(&l);
	}
	int err = ferror(f);
	free(buf);
	fclose(f);
	if (err) {
		fprintf(stderr, PROG ": %s: read error\n", name);
		return -1;
	}
	if (pass == 2 && F.unshared) {
		F.line = F.first_unshared;
		problem("record lacks share= fields: run tsshim-train with --tsshim (%" PRIu64 " batch lines)",
			F.unshared);
	}
	return 0;
}

/* ---- options and main ----------------------------------------------------------------- */

static void usage(FILE *f)
{
	fprintf(f,
"Usage: " PROG " [--strict] [--quiet] [--max-problems N] RECORD...\n"
"\n"
"Checks the records (tsshim-train --tsshim --record) of the jobs of one\n"
"session: that every job trained on exactly the bytes its loader or the\n"
"session's stream gave it. Per batch line it reads share=, fseq=, fsamp=, sh=\n"
"and dsh= (see tsshim-train --help); sh= holds, per sample, XXH64 of its image\n"
"bytes then its label bytes, so equal hashes mean equal images with their own\n"
"labels. Published batches define the stream; the stream of each loader (the\n"
"record's '# tsshim_loader=' header) is separate.\n"
"\n"
"Checks\n"
"  (a) dsh= (when present) equals sh= sample by sample: the device got the\n"
"      host bytes.\n"
"  (b) share=pub lines define stream batch fseq (fsamp must be 0); two pub\n"
"      lines of the same fseq must hold the same samples.\n"
"  (c) a share=served line's n samples equal the stream's from (fseq, fsamp)\n"
"      on, walking into fseq+1, ... as needed. Positions of stream batches no\n"
"      pub line records (a producer killed before it wrote its line) are\n"
"      unverifiable: counted, a problem only with --strict.\n"
"  (d) within one record, no stream position is trained twice (pub or\n"
"      served).\n"
"  (e) validation lines (phase=val) are share=own.\n"
"  (f) every batch line has share=: a record written without --tsshim fails.\n"
"  Lines that cannot be parsed are problems too.\n"
"\n"
"Options\n"
"  --strict              unverifiable positions are problems\n"
"  --quiet               no summary line (problems are still listed)\n"
"  --max-problems N      list at most N problems (default 20; all are counted)\n"
"  --help                this text\n"
"\n"
"Output (stdout): one line per problem, FILE:LINE: what was expected and what\n"
"was found; then the summary:\n"
"  " PROG ": files=F lines=L pub=P served=S own=O samples_verified=V\n"
"  unverifiable=U problems=K: OK|FAILED\n"
"(one line). samples_verified: served samples equal to the stream's;\n"
"unverifiable: served samples of unknown stream batches.\n"
"\n"
"Exit status: 0 every check holds, 1 problems, 2 bad usage or a record that\n"
"cannot be read.\n");
}

__attribute__((noreturn)) static void bad_usage(const char *msg, const char *arg)
{
	fprintf(stderr, PROG ": %s%s\nTry '" PROG " --help'.\n", msg, arg);
	exit(2);
}

static void parse_args(int argc, char **argv)
{
	enum { O_STRICT = 256, O_QUIET, O_MAX, O_HELP };
	static const struct option lo[] = {
		{"strict", no_argument, 0, O_STRICT},
		{"quiet", no_argument, 0, O_QUIET},
		{"max-problems", required_argument, 0, O_MAX},
		{"help", no_argument, 0, O_HELP},
		{0, 0, 0, 0},
	};
	int c;
	uint64_t v;
	opterr = 0;
	while ((c = getopt_long(argc, argv, ":", lo, NULL)) != -1) {
		switch (c) {
		case O_STRICT: opt.strict = 1; break;
		case O_QUIET: opt.quiet = 1; break;
		case O_MAX:
			if (parse_dec(optarg, &v) < 0 || v > 1000000000)
				bad_usage("--max-problems: expected an integer from 0 to 1000000000, got ", optarg);
			opt.max_problems = (unsigned long)v;
			break;
		case O_HELP: usage(stdout); exit(0);
		case ':': bad_usage("missing value for ", argv[optind - 1]);
		default: bad_usage("unknown option ", argv[optind - 1]);
		}
	}
	if (optind >= argc)
		bad_usage("no RECORD given", "");
}

int main(int argc, char **argv)
{
	parse_args(argc, argv);
	for (int pass = 1; pass <= 2; pass++)
		for (int i = optind; i < argc; i++) {
			table_free(&V.seen); /* (d) is per job */
			if (run_file(argv[i], pass) < 0)
				return 2;
		}
	V.files = (uint64_t)(argc - optind);
	if (V.problems > opt.max_problems)
		printf("... and %" PRIu64 " more problems\n", V.problems - opt.max_problems);
	if (!opt.quiet)
		printf(PROG ": files=%" PRIu64 " lines=%" PRIu64 " pub=%" PRIu64 " served=%" PRIu64 " own=%" PRIu64
		       " samples_verified=%" PRIu64 " unverifiable=%" PRIu64 " problems=%" PRIu64 ": %s\n",
		       V.files, V.lines, V.pub, V.served, V.own, V.verified, V.unverifiable, V.problems,
		       V.problems ? "FAILED" : "OK");
	table_free(&V.stream);
	table_free(&V.seen);
	free(V.sh.v);
	free(V.dsh.v);
	for (int i = 0; i < V.nloaders; i++)
		free(V.loaders[i]);
	if (fflush(stdout) != 0)
		return 2;
	return V.problems ? 1 : 0;
}
