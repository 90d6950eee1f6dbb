/* SPDX-License-Identifier: MIT */
/*
 * tsshim-verify: checks the records that tsshim-train --tsshim wrote for the
 * jobs of one session. Every batch line carries, per sample, XXH64 of its
 * image bytes then its label bytes (sh=, and dsh= for the bytes read back
 * from the device). Published batches (share=pub) define the stream: stream
 * batch fseq -> its samples' hashes. A served batch (share=served) must be
 * the stream's samples from (fseq, fsamp) on, and no job may train on one
 * stream position, or one sample id in one epoch, twice. Every record is
 * read into memory once (a pipe can be read only once); two passes over
 * them: the stream first, then every line against it. --help documents the
 * checks.
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
#define NO_BOUND UINT64_MAX

enum { SHARE_NONE = -1, SHARE_OWN, SHARE_PUB, SHARE_SERVED };

static struct {
	int strict, quiet;
	unsigned long max_problems;
	const char **killed; /* --killed RECORD, in order */
	int nkilled;
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

/* Append v; -1 (nothing appended) when MAX_SAMPLES are there: bounds garbage. */
static int hvec_push(struct hvec *out, uint64_t v)
{
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
	out->v[out->n++] = v;
	return 0;
}

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
		if ((p[16] != ',' && p[16] != 0) || hvec_push(out, h) < 0)
			return -1;
		if (!p[16])
			return 0;
	}
}

/* ---- tables: stream batches and positions -------------------------------------------- */

struct slot {
	uint64_t k[3]; /* loader, stream batch, sample (0 for batches) */
	int used;
	int kind; /* ids: how it was trained (id_kind); stream: the publishing record */
	uint64_t epoch; /* stream: the publishing line's epoch */
	const char *file; /* where it was defined; NULL: just added */
	unsigned long line;
	uint64_t *h;   /* a stream batch's per-sample hashes */
	uint64_t *ids; /* and sample ids (NULL: the pub line had none) */
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
	for (size_t i = 0; i < t->cap; i++) {
		free(t->s[i].h);
		free(t->s[i].ids);
	}
	free(t->s);
	memset(t, 0, sizeof *t);
}

/* ---- state and reports ------------------------------------------------------------- */

static struct {
	struct table stream; /* (loader, fseq) -> published batch */
	struct table seen;   /* this file's (loader, fseq, sample) -> line */
	struct table ids;    /* this file's (epoch, sample id) -> line, kind */
	struct table unknown; /* this file's (epoch): served samples of unknown ids (n) */
	struct table unknown_passed; /* this file's (epoch, publishing record, its epoch): passes they explained (n) */
	char *loaders[MAX_LOADERS];
	int nloaders;
	/* per loader: stream batches from this one on may lack their pub line
	 * (a job named by --killed published them and died before recording) */
	uint64_t unrecorded_from[MAX_LOADERS + 1];
	uint64_t files, lines, pub, served, own, verified, unverifiable, problems, repeats_role, repeats_epoch, passed;
	int rec; /* the record being read: its index */
	struct hvec sh, dsh, id;
} V;

/* One record, read whole. */
struct rec {
	const char *name;
	char *text;
	size_t len;
	int killed; /* named by --killed: the job was killed on purpose */
	int any_pub;
	uint64_t last_pub, loader;
};

/* The current file and its loader (its "# tsshim_loader=" header; none: 0). */
static struct {
	const char *name;
	unsigned long line;
	uint64_t loader;
	int readback; /* the header says readback=1: every batch line has dsh= */
	uint64_t unshared, first_unshared;
	uint64_t batch_lines, next_seq, train_batches, train_samples;
	unsigned long end_line;
	const char *end; /* the '# end' line's text, NULL: none yet */
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
	const char *seq, *phase, *n, *share, *fseq, *fsamp, *sh, *dsh, *epoch, *ids; /* values, NULL: absent */
	int kind;                                                                     /* SHARE_* */
	uint64_t nsamples, fseq_v, fsamp_v, seq_v, epoch_v;
	int has_ids; /* V.id holds n sample ids */
};

/* Split buf at blanks (in place) and pick the fields. */
static void split_fields(char *buf, struct line *l)
{
	static const char *const keys[] = {"seq=", "phase=", "n=",  "share=", "fseq=",
					   "fsamp=", "sh=", "dsh=", "epoch=", "ids="};
	const char **vals[] = {&l->seq, &l->phase, &l->n, &l->share, &l->fseq,
			       &l->fsamp, &l->sh, &l->dsh, &l->epoch, &l->ids};
	memset(l, 0, sizeof *l);
	for (char *save = NULL, *t = strtok_r(buf, " \t\r\n", &save); t; t = strtok_r(NULL, " \t\r\n", &save))
		for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
			if (!strncmp(t, keys[i], strlen(keys[i]))) {
				*vals[i] = t + strlen(keys[i]);
				break;
			}
}

/* "A,B,..": decimal sample ids. Returns 0, or -1 on bad input. */
static int parse_ids(const char *s, struct hvec *out)
{
	char num[24];
	out->n = 0;
	for (const char *p = s;;) {
		size_t len = strcspn(p, ",");
		uint64_t v;
		if (len == 0 || len >= sizeof num)
			return -1;
		memcpy(num, p, len);
		num[len] = 0;
		if (parse_dec(num, &v) < 0 || hvec_push(out, v) < 0)
			return -1;
		if (!p[len])
			return 0;
		p += len + 1;
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
	if (parse_dec(l->seq, &l->seq_v) < 0) {
		if (report)
			problem("malformed batch line: bad seq=");
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
	else if (l->epoch && parse_dec(l->epoch, &l->epoch_v) < 0)
		why = "bad epoch=";
	else if (l->ids && (parse_ids(l->ids, &V.id) < 0 || V.id.n != l->nsamples))
		why = "ids= is not a list of n sample ids";
	l->has_ids = l->ids && !why;
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
	s->kind = V.rec;
	s->epoch = l->epoch_v;
	s->n = V.sh.n;
	s->h = xcalloc(s->n, sizeof *s->h);
	memcpy(s->h, V.sh.v, s->n * sizeof *s->h);
	if (l->has_ids) {
		s->ids = xcalloc(s->n, sizeof *s->ids);
		memcpy(s->ids, V.id.v, s->n * sizeof *s->ids);
	}
}

/* (a): the device got exactly the host bytes. */
static void check_device(const struct line *l)
{
	if (!l->dsh) {
		if (F.readback)
			problem("no dsh= in a record made with readback=1: what the device got is unchecked");
		return;
	}
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

/* (g): no sample id twice in one epoch of a job's training. */
struct id_repeats {
	size_t n, across, epoch; /* repeats: problems; across roles; across the stream's epoch mark */
	uint64_t id;
	unsigned long prev;
};

/* How a sample was trained: share=own or pub, or served from the stream
 * batch record r published (ID_SERVED + r). */
#define ID_SERVED 16

static void mark_id(uint64_t epoch, uint64_t id, int kind, struct id_repeats *r)
{
	struct slot *s = table_get(&V.ids, epoch, id, 0, 1);
	if (!s->file) {
		s->file = F.name;
		s->line = F.line;
		s->kind = kind;
		return;
	}
	if (s->kind != kind)
		r->across++;
	else if (kind >= ID_SERVED)
		r->epoch++;
	else if (!r->n++)
		r->id = id, r->prev = s->line;
}

/*
 * A repeat between lines of one share kind is a problem: a loader gave a
 * sample twice. Two kinds of repeat are counted instead (problems with
 * --strict), being known limits of native consumers (README, Limitations):
 *  - across roles (own or pub, and served; or served from batches of two
 *    producers): a job or a successor that took over mid-epoch, or a job
 *    that went on with its own loader; a native successor cannot be told
 *    which samples are left;
 *  - across the stream's epoch mark (served twice from one producer's
 *    batches, at distinct stream positions: that producer's own epoch holds
 *    each sample once, so the job's epoch spans two of the stream's): a
 *    consumer that attached in mid-epoch, or whose producer broke out of
 *    its epochs early.
 */
static void report_id_repeats(const struct line *l, const struct id_repeats *r)
{
	if (r->n)
		problem("sample id %" PRIu64 " trained twice in epoch %" PRIu64 " (first at line %lu; %zu of this "
			"line's samples repeat)", r->id, l->epoch_v, r->prev, r->n);
	V.repeats_role += r->across;
	V.repeats_epoch += r->epoch;
	if (r->across && opt.strict)
		problem("%zu samples of epoch %" PRIu64 " trained again after the job or its producer changed "
			"(share=%s)", r->across, l->epoch_v, l->share);
	if (r->epoch && opt.strict)
		problem("%zu samples of epoch %" PRIu64 " served again from the stream's next epoch: this epoch of "
			"the job spans the stream's epoch mark", r->epoch, l->epoch_v);
}

/* The line's own ids (pub, own) against the epoch's. */
static void check_own_ids(const struct line *l)
{
	struct id_repeats r = {0};
	if (!l->has_ids || strcmp(l->phase, "train"))
		return;
	for (size_t i = 0; i < V.id.n; i++)
		mark_id(l->epoch_v, V.id.v[i], l->kind, &r); /* SHARE_OWN or SHARE_PUB: below ID_SERVED */
	report_id_repeats(l, &r);
}

/*
 * Positions past the known stream: every one is still a position of this
 * job (repeats; an offset from batch seq's start names one position
 * whatever its size). Unrecorded pub lines can explain them only where a
 * job named by --killed may have published that batch and died before
 * recording it: from its last recorded pub on. Then they are counted (a
 * problem with --strict); otherwise nothing publishes them: a problem.
 */
static void unverifiable(const struct line *l, uint64_t seq, uint64_t k, size_t left)
{
	unsigned long prev = 0, rprev = 0;
	size_t rep = 0;
	uint64_t rk = 0;
	V.unverifiable += left;
	if (!strcmp(l->phase, "train"))
		table_get(&V.unknown, l->epoch_v, 0, 0, 1)->n += left;
	for (size_t i = 0; i < left; i++)
		if (mark_seen(seq, k + i, &prev) < 0 && !rep++)
			rk = k + i, rprev = prev;
	report_repeats(rep, seq, rk, rprev);
	if (seq < V.unrecorded_from[F.loader])
		problem("%zu served samples from stream batch %" PRIu64 " sample %" PRIu64 " on: no record publishes "
			"that stream batch (no job named by --killed can have published it unrecorded)", left, seq, k);
	else if (opt.strict)
		problem("unverifiable: %zu served samples from stream batch %" PRIu64 " sample %" PRIu64
			" on: no share=pub line records that stream batch", left, seq, k);
}

/*
 * May a served line pass over stream position k of s? Only a sample this
 * job already trained in the line's epoch (its id is known): a consumer
 * that lost its place in the stream gathers the samples its epoch lacks and
 * passes over the others. Any other gap is a sample lost: a mismatch.
 */
static int passed_over(const struct line *l, const struct slot *s, uint64_t k)
{
	if (strcmp(l->phase, "train"))
		return 0;
	if (!s->ids || !table_get(&V.ids, l->epoch_v, s->ids[k], 0, 0)) {
		/* it may be one of the epoch's unverifiable samples (a killed
		 * producer's unrecorded batch): each explains one pass in each
		 * epoch of a publishing job (which holds a sample once), and a
		 * job gathering what its epoch lacks may read two of them */
		struct slot *u = table_get(&V.unknown, l->epoch_v, 0, 0, 0);
		struct slot *p = table_get(&V.unknown_passed, l->epoch_v, (uint64_t)s->kind, s->epoch, 1);
		if (!u || p->n >= u->n)
			return 0;
		p->n++;
	}
	V.passed++;
	return 1;
}

/* (c): the served samples are the stream's from (fseq, fsamp) on, walking
 * into the next stream batches (passing over samples trained already in
 * the epoch); positions no pub line defines are unverifiable. */
static void check_served(const struct line *l)
{
	uint64_t seq = l->fseq_v, k = l->fsamp_v, rseq = 0, rk = 0, mseq = 0, mk = 0;
	size_t bad = 0, rep = 0, first = 0, i;
	unsigned long rprev = 0, prev;
	struct id_repeats ir = {0};
	V.served++;
	if (!F.loader) {
		problem("share=served in a record without a '# tsshim_loader=' header: the stream it read is unknown");
		return;
	}
	const struct slot *s = table_get(&V.stream, F.loader, seq, 0, 0), *ms = NULL;
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
		if (s->h[k] != V.sh.v[i] && passed_over(l, s, k)) {
			i--; /* the same served sample against the next position */
			continue;
		}
		if (s->h[k] == V.sh.v[i])
			V.verified++;
		else if (!bad++)
			first = i, mseq = seq, mk = k, ms = s;
		if (mark_seen(seq, k, &prev) < 0 && !rep++)
			rseq = seq, rk = k, rprev = prev;
		if (s->ids && !strcmp(l->phase, "train"))
			mark_id(l->epoch_v, s->ids[k], ID_SERVED + s->kind, &ir);
	}
	if (bad)
		problem("served sample %zu differs from the stream (image and label bytes): stream batch %" PRIu64
			" sample %" PRIu64 " is %016" PRIx64 " (published at %s:%lu), this job got %016" PRIx64
			" (%zu of %zu samples differ)", first, mseq, mk, ms->h[mk], ms->file, ms->line, V.sh.v[first],
			bad, V.sh.n);
	report_repeats(rep, rseq, rk, rprev);
	report_id_repeats(l, &ir);
	if (i < V.sh.n)
		unverifiable(l, seq, k, V.sh.n - i);
}

/* Pass 2: every check of one line. */
static void check_line(char *buf)
{
	struct line l;
	V.lines++;
	F.batch_lines++;
	if (F.end)
		problem("a batch line after the '# end' line (line %lu)", F.end_line);
	if (!parse_line(buf, &l, 1))
		return;
	if (l.seq_v != F.next_seq)
		problem("seq=%" PRIu64 " where %" PRIu64 " comes next: a batch line is missing or repeated", l.seq_v,
			F.next_seq);
	F.next_seq = l.seq_v + 1;
	if (!strcmp(l.phase, "train")) {
		F.train_batches++;
		F.train_samples += l.nsamples;
	}
	check_device(&l);
	if (!strcmp(l.phase, "val") && l.kind != SHARE_OWN) {
		problem("validation batch with share=%s: validation must stay the job's own (share=own)", l.share);
		return;
	}
	if (l.kind == SHARE_PUB) {
		check_pub(&l);
		check_own_ids(&l);
	} else if (l.kind == SHARE_SERVED) {
		check_served(&l);
	} else {
		V.own++;
		check_own_ids(&l);
	}
}

/* ---- files ------------------------------------------------------------------------------ */

static void header_line(const char *buf)
{
	static const char key[] = "# tsshim_loader=", rec[] = "# tsshim-train record ";
	if (!strncmp(buf, rec, sizeof rec - 1)) {
		const char *rb = strstr(buf, " readback=");
		F.readback = rb && rb[sizeof " readback=" - 1] == '1';
		return;
	}
	if (strncmp(buf, key, sizeof key - 1))
		return;
	char name[256];
	size_t n = strcspn(buf + sizeof key - 1, " \t\r\n");
	snprintf(name, sizeof name, "%.*s", (int)(n < sizeof name ? n : sizeof name - 1), buf + sizeof key - 1);
	F.loader = loader_id(name);
}

/* Read a record whole (a pipe or /dev/stdin too). 0, or -1 with a message. */
static int rec_load(struct rec *r)
{
	FILE *f = fopen(r->name, "re");
	if (!f) {
		fprintf(stderr, PROG ": %s: %s\n", r->name, strerror(errno));
		return -1;
	}
	size_t cap = 0, got;
	char chunk[65536];
	while ((got = fread(chunk, 1, sizeof chunk, f)) > 0) {
		if (r->len + got + 1 > cap) {
			size_t nc = cap ? cap : 1 << 16;
			while (nc < r->len + got + 1)
				nc *= 2;
			char *nt = realloc(r->text, nc);
			if (!nt)
				out_of_memory();
			r->text = nt;
			cap = nc;
		}
		memcpy(r->text + r->len, chunk, got);
		r->len += got;
		r->text[r->len] = 0;
	}
	int err = ferror(f) ? errno : 0;
	fclose(f);
	if (err) {
		fprintf(stderr, PROG ": %s: %s\n", r->name, strerror(err));
		return -1;
	}
	return 0;
}

/* The '# end batches=B samples=S ...' line against the training lines. */
static void check_end(void)
{
	uint64_t b, n;
	char bs[24] = "", ns[24] = "";
	if (sscanf(F.end, "# end batches=%23[0-9] samples=%23[0-9]", bs, ns) != 2 || parse_dec(bs, &b) < 0 ||
	    parse_dec(ns, &n) < 0) {
		F.line = F.end_line;
		problem("malformed '# end' line (no batches= and samples=)");
	} else if (b != F.train_batches || n != F.train_samples) {
		F.line = F.end_line;
		problem("'# end' says batches=%" PRIu64 " samples=%" PRIu64 ", the training lines hold %" PRIu64
			" batches of %" PRIu64 " samples", b, n, F.train_batches, F.train_samples);
	}
}

/* The record as a whole, after its lines (pass 2). */
static void check_record(const struct rec *r)
{
	if (F.unshared) {
		F.line = F.first_unshared;
		problem("record lacks share= fields: run tsshim-train with --tsshim (%" PRIu64 " batch lines)",
			F.unshared);
	}
	if (F.end) {
		check_end();
	} else if (!r->killed) {
		problem("incomplete record: no '# end' line (the job died, hung or was cut short; name a job "
			"killed on purpose with --killed)");
	}
	if (!F.batch_lines && !r->killed)
		problem("no batch lines");
}

/* One pass over one record; pass 1 builds the stream, pass 2 checks. */
static void rec_pass(struct rec *r, int pass, char **buf, size_t *cap)
{
	memset(&F, 0, sizeof F);
	F.name = r->name;
	for (size_t at = 0; r->text && at < r->len;) {
		const char *text = r->text + at, *nl = memchr(text, '\n', r->len - at);
		size_t len = nl ? (size_t)(nl - text) : r->len - at;
		if (!nl && r->killed)
			break; /* a line cut short by the kill */
		if (!*buf || len >= *cap) {
			free(*buf);
			*cap = len + 1;
			*buf = xcalloc(*cap, 1);
		}
		memcpy(*buf, text, len);
		(*buf)[len] = 0;
		at += len + 1;
		F.line++;
		if ((*buf)[0] == '#') {
			header_line(*buf);
			if (!strncmp(*buf, "# end", 5) && !F.end) {
				F.end = text;
				F.end_line = F.line;
			}
			continue;
		}
		if (strspn(*buf, " \t\r") == len)
			continue; /* blank */
		struct line l;
		if (pass == 2) {
			check_line(*buf);
		} else if (parse_line(*buf, &l, 0)) {
			stream_add(&l);
			if (l.kind == SHARE_PUB && (!r->any_pub || l.fseq_v > r->last_pub))
				r->last_pub = l.fseq_v, r->any_pub = 1;
		}
	}
	r->loader = F.loader;
	if (pass == 2)
		check_record(r);
}

/* ---- options and main ----------------------------------------------------------------- */

static void usage(FILE *f)
{
	fprintf(f,
"Usage: " PROG " [--strict] [--quiet] [--max-problems N] [--killed RECORD]... RECORD...\n"
"\n"
"Checks the records (tsshim-train --tsshim --record) of the jobs of one\n"
"session: that every job trained on exactly the bytes its loader or the\n"
"session's stream gave it. Per batch line it reads seq=, phase=, epoch=, n=,\n"
"ids=, share=, fseq=, fsamp=, sh= and dsh= (see tsshim-train --help); sh=\n"
"holds, per sample, XXH64 of its image bytes then its label bytes, so equal\n"
"hashes mean equal images with their own labels. Published batches define the\n"
"stream; the stream of each loader (the record's '# tsshim_loader=' header) is\n"
"separate. A RECORD may be a pipe: each is read once.\n"
"\n"
"Checks\n"
"  (a) dsh= equals sh= sample by sample: the device got the host bytes.\n"
"      Every line has dsh= when the first header line says readback=1\n"
"      (tsshim-train --readback); else it is checked where present.\n"
"  (b) share=pub lines define stream batch fseq (fsamp must be 0); two pub\n"
"      lines of the same fseq must hold the same samples.\n"
"  (c) a share=served line's n samples equal the stream's from (fseq, fsamp)\n"
"      on, walking into fseq+1, ... as needed; its record names its loader.\n"
"      The walk may pass over a position whose sample id the record trained\n"
"      already in that epoch (a consumer that lost its place in the stream\n"
"      serves only samples its epoch lacks), or else one per unverifiable\n"
"      sample the record trained before in that epoch (its id is unknown)\n"
"      in each epoch of a publishing record (which holds a sample once);\n"
"      no other gap.\n"
"      Positions of stream batches no pub line records are unverifiable. A\n"
"      job named by --killed may have published batches after its last\n"
"      recorded pub line and died before recording them: positions from\n"
"      there on are counted (a problem only with --strict); any other\n"
"      unverifiable position is a problem.\n"
"  (d) within one record, no stream position is trained twice (pub or\n"
"      served).\n"
"  (e) validation lines (phase=val) are share=own.\n"
"  (f) every batch line has share=: a record written without --tsshim fails.\n"
"  (g) within one record and epoch, no sample id is trained twice (served\n"
"      samples have the ids their pub line gives). Two kinds of repeat are\n"
"      known limits of native jobs, counted (problems only with --strict):\n"
"      repeats_role, between lines of different share= or served from two\n"
"      producers' batches (a takeover, or a job that went on with its own\n"
"      loader, in mid-epoch: a native successor cannot be told which samples\n"
"      are left); repeats_epoch, served twice from one producer's batches\n"
"      (the job's epoch spans the stream's epoch mark: it attached in\n"
"      mid-epoch, or its producer left its epochs early).\n"
"  (h) a record is whole: seq= counts up from 0 with no gap or repeat, the\n"
"      '# end batches=B samples=S' line tsshim-train writes on success is\n"
"      there, after every batch line, and matches its training lines, and\n"
"      there is at least one batch line. A record named by --killed may end\n"
"      early: no '# end' line, no batch line.\n"
"  Lines that cannot be parsed are problems too.\n"
"\n"
"Options\n"
"  --killed RECORD       a record of a job killed on purpose (repeatable)\n"
"  --strict              counted unverifiable positions and repeats are\n"
"                        problems\n"
"  --quiet               no summary line (problems are still listed)\n"
"  --max-problems N      list at most N problems (default 20; all are counted)\n"
"  --help                this text\n"
"\n"
"Output (stdout): one line per problem, FILE:LINE: what was expected and what\n"
"was found; then the summary:\n"
"  " PROG ": files=F lines=L pub=P served=S own=O samples_verified=V\n"
"  unverifiable=U repeats_role=R repeats_epoch=E passed=P problems=K: OK|FAILED\n"
"(one line). samples_verified: served samples equal to the stream's;\n"
"unverifiable: served samples of unknown stream batches; passed: stream\n"
"positions passed over (c).\n"
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
	enum { O_STRICT = 256, O_QUIET, O_MAX, O_HELP, O_KILLED };
	static const struct option lo[] = {
		{"killed", required_argument, 0, O_KILLED},
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
		case O_KILLED:
			opt.killed = realloc(opt.killed, (size_t)(opt.nkilled + 1) * sizeof *opt.killed);
			if (!opt.killed)
				out_of_memory();
			opt.killed[opt.nkilled++] = optarg;
			break;
		case ':': bad_usage("missing value for ", argv[optind - 1]);
		default: bad_usage("unknown option ", argv[optind - 1]);
		}
	}
	if (optind >= argc && !opt.nkilled)
		bad_usage("no RECORD given", "");
}

int main(int argc, char **argv)
{
	parse_args(argc, argv);
	int n = argc - optind + opt.nkilled;
	struct rec *recs = xcalloc((size_t)n, sizeof *recs);
	for (int i = 0; i < n; i++) {
		int k = i >= argc - optind;
		recs[i].name = k ? opt.killed[i - (argc - optind)] : argv[optind + i];
		recs[i].killed = k;
		if (rec_load(&recs[i]) < 0) {
			for (int j = 0; j <= i; j++)
				free(recs[j].text);
			free(recs);
			free(opt.killed);
			return 2;
		}
	}
	char *buf = NULL;
	size_t cap = 0;
	for (V.rec = 0; V.rec < n; V.rec++)
		rec_pass(&recs[V.rec], 1, &buf, &cap);
	for (int l = 0; l <= MAX_LOADERS; l++)
		V.unrecorded_from[l] = NO_BOUND;
	for (int i = 0; i < n; i++) {
		uint64_t from = recs[i].any_pub ? recs[i].last_pub + 1 : 0;
		if (recs[i].killed && from < V.unrecorded_from[recs[i].loader])
			V.unrecorded_from[recs[i].loader] = from;
	}
	for (int i = 0; i < n; i++) {
		table_free(&V.seen); /* (d) and (g) are per job */
		table_free(&V.ids);
		table_free(&V.unknown);
		table_free(&V.unknown_passed);
		V.rec = i;
		rec_pass(&recs[i], 2, &buf, &cap);
	}
	V.files = (uint64_t)n;
	if (V.problems > opt.max_problems)
		printf("... and %" PRIu64 " more problems\n", V.problems - opt.max_problems);
	if (!opt.quiet)
		printf(PROG ": files=%" PRIu64 " lines=%" PRIu64 " pub=%" PRIu64 " served=%" PRIu64 " own=%" PRIu64
		       " samples_verified=%" PRIu64 " unverifiable=%" PRIu64 " repeats_role=%" PRIu64
		       " repeats_epoch=%" PRIu64 " passed=%" PRIu64 " problems=%" PRIu64 ": %s\n",
		       V.files, V.lines, V.pub, V.served, V.own, V.verified, V.unverifiable, V.repeats_role,
		       V.repeats_epoch, V.passed, V.problems, V.problems ? "FAILED" : "OK");
	table_free(&V.stream);
	table_free(&V.seen);
	table_free(&V.ids);
	table_free(&V.unknown);
	table_free(&V.unknown_passed);
	free(V.sh.v);
	free(V.dsh.v);
	free(V.id.v);
	free(buf);
	for (int i = 0; i < n; i++)
		free(recs[i].text);
	free(recs);
	free(opt.killed);
	for (int i = 0; i < V.nloaders; i++)
		free(V.loaders[i]);
	if (fflush(stdout) != 0)
		return 2;
	return V.problems ? 1 : 0;
}
