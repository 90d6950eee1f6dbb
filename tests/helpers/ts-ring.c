/* SPDX-License-Identifier: MIT */
/*
 * ts-ring: a session member that exercises the ring across processes.
 * Linked with the core directly (no shim), one process per member.
 *
 * The producer publishes a virtual sample stream: sample g of the stream
 * occupies S0 bytes of position 0 and S1 bytes of position 1; a batch's
 * tag is the index of its first sample; an epoch is E samples, its last
 * batch is short and marked. A producer that takes over continues after
 * the last published batch, so the stream has no gap and no repeat.
 *
 * A consumer reads at its own batch size and checks every range: samples
 * contiguous, positions paired, no batch across an epoch boundary, batches
 * full except at an epoch's end. Any violation prints "ERROR ..." and exits 1.
 * Eviction (it was stopped for longer than the timeout) is reported and
 * reading resumes at the head.
 */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "heartbeat.h"
#include "ring.h"
#include "session.h"

struct opts {
	const char *session;
	uint64_t batch, producer_batch, epoch, s0, s1, max_samples;
	uint32_t depth, timeout_ms;
	long produce_us, consume_us;
};

static volatile sig_atomic_t stop;
static void on_term(int sig) { (void)sig; stop = 1; }

static void usage(FILE *f)
{
	fprintf(f, "usage: ts-ring --session NAME [--batch B] [--producer-batch PB] [--epoch E]\n"
		   "               [--s0 BYTES] [--s1 BYTES] [--max-samples N] [--depth D] [--timeout-ms T]\n"
		   "               [--produce-us US] [--consume-us US]\n"
		   "Joins NAME; as producer publishes a virtual sample stream, as consumer reads it at\n"
		   "batch size B and verifies it. Consumers exit 0 after N samples (default: run until\n"
		   "SIGTERM); producers run until SIGTERM. ERROR lines and exit 1 on any violation.\n");
}

static int parse(int argc, char **argv, struct opts *o)
{
	static const struct option lo[] = {
		{ "session", 1, 0, 'S' },     { "batch", 1, 0, 'b' },      { "producer-batch", 1, 0, 'p' },
		{ "epoch", 1, 0, 'e' },       { "s0", 1, 0, '0' },         { "s1", 1, 0, '1' },
		{ "max-samples", 1, 0, 'm' }, { "depth", 1, 0, 'd' },      { "timeout-ms", 1, 0, 't' },
		{ "produce-us", 1, 0, 'P' },  { "consume-us", 1, 0, 'C' }, { "help", 0, 0, 'h' },
		{ 0, 0, 0, 0 },
	};
	*o = (struct opts){ .batch = 48, .producer_batch = 64, .epoch = 1000, .s0 = 588, .s1 = 8,
			    .depth = 4, .timeout_ms = 300 };
	int c;
	while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		unsigned long long v = optarg ? strtoull(optarg, NULL, 10) : 0;
		switch (c) {
		case 'S': o->session = optarg; break;
		case 'b': o->batch = v; break;
		case 'p': o->producer_batch = v; break;
		case 'e': o->epoch = v; break;
		case '0': o->s0 = v; break;
		case '1': o->s1 = v; break;
		case 'm': o->max_samples = v; break;
		case 'd': o->depth = (uint32_t)v; break;
		case 't': o->timeout_ms = (uint32_t)v; break;
		case 'P': o->produce_us = (long)v; break;
		case 'C': o->consume_us = (long)v; break;
		case 'h': usage(stdout); exit(0);
		default: usage(stderr); return -1;
		}
	}
	if (!o->session || !o->batch || !o->producer_batch || !o->epoch || !o->s0 || !o->s1) {
		usage(stderr);
		return -1;
	}
	return 0;
}

/* ---- producer -------------------------------------------------------------- */

/* First sample after the last published batch: where a new producer goes on. */
static uint64_t stream_resume_point(struct ts_segment *seg, const struct opts *o)
{
	uint64_t pub = atomic_load(&seg->ring.pub_seq);
	if (pub == 0)
		return 0;
	uint64_t seq = pub - 1;
	unsigned slot = (unsigned)(seq % seg->st.depth);
	uint64_t w = atomic_load(&seg->ring.slots[slot].word);
	unsigned writer1 = ts_slot_writer1(w);
	if (ts_slot_state(w) != TS_SLOT_PUBLISHED || ts_slot_seq(w) != seq || writer1 == 0 || writer1 > TS_MAX_MEMBERS)
		return 0;
	const struct ts_batch_meta *m = &seg->ring.meta[writer1 - 1][slot];
	return m->tag + m->len[0] / o->s0;
}

struct producer {
	struct ts_ring_writer w;
	int ready;
	uint64_t next_sample;
};

static int produce_one(struct ts_session *s, struct producer *p, const struct opts *o)
{
	if (!p->ready) {
		if (ts_ring_writer_init(s->seg, s->self, &p->w))
			return -EPERM;
		p->next_sample = stream_resume_point(s->seg, o);
		p->ready = 1;
		printf("producer epoch=%u resumes at sample %llu seq %llu\n", p->w.epoch,
		       (unsigned long long)p->next_sample, (unsigned long long)p->w.next_seq);
		fflush(stdout);
	}
	struct ts_batch_meta *m;
	int ret = ts_ring_begin(s->seg, &p->w, 50000000ull, &m);
	if (ret)
		return ret;
	uint64_t g = p->next_sample, left = o->epoch - g % o->epoch;
	uint64_t n = left < o->producer_batch ? left : o->producer_batch;
	m->npos = 2;
	m->nsamples = n;
	m->len[0] = n * o->s0;
	m->len[1] = n * o->s1;
	m->tag = g;
	m->flags = n == left ? TS_BATCH_END_OF_EPOCH : 0;
	ret = ts_ring_publish(s->seg, &p->w);
	if (ret) {
		ts_ring_abort(s->seg, &p->w);
		return ret;
	}
	p->next_sample = g + n;
	return 0;
}

/* ---- consumer -------------------------------------------------------------- */

struct consumer {
	struct ts_ring_reader r;
	int attached;
	int have_expect;
	uint64_t expect;   /* next sample index we must see */
	uint64_t in_batch; /* samples gathered for the current consumer batch */
	uint64_t samples, batches, evictions;
	struct ts_read rd;
};

#define FAIL(...) do { printf("ERROR " __VA_ARGS__); printf("\n"); fflush(stdout); exit(1); } while (0)

static void check_ranges(struct consumer *c, const struct opts *o)
{
	const struct ts_read *rd = &c->rd;
	for (uint32_t k = 0; k < rd->nranges; k++) {
		const struct ts_range *a = &rd->r[0][k], *b = &rd->r[1][k];
		if (a->off % o->s0 || a->len % o->s0 || b->off % o->s1 || b->len % o->s1)
			FAIL("range cuts a sample: pos0 off %llu len %llu", (unsigned long long)a->off,
			     (unsigned long long)a->len);
		uint64_t first = a->tag + a->off / o->s0, count = a->len / o->s0;
		if (b->tag != a->tag || b->off / o->s1 != a->off / o->s0 || b->len / o->s1 != count)
			FAIL("positions unpaired at sample %llu", (unsigned long long)first);
		if (!c->have_expect) {
			c->expect = first;
			c->have_expect = 1;
		}
		if (first != c->expect)
			FAIL("stream gap or repeat: expected sample %llu, got %llu", (unsigned long long)c->expect,
			     (unsigned long long)first);
		if (first / o->epoch != (first + count - 1) / o->epoch)
			FAIL("range crosses an epoch boundary at sample %llu", (unsigned long long)first);
		c->expect += count;
	}
}

static void count_batch(struct consumer *c, const struct opts *o, uint64_t got, int end_of_epoch)
{
	c->in_batch += got;
	c->samples += got;
	if (c->in_batch > o->batch)
		FAIL("batch overfilled: %llu > %llu", (unsigned long long)c->in_batch, (unsigned long long)o->batch);
	if (end_of_epoch && c->expect % o->epoch != 0)
		FAIL("end of epoch flagged at sample %llu", (unsigned long long)c->expect);
	if (c->in_batch == o->batch || end_of_epoch) {
		c->batches++;
		c->in_batch = 0;
	}
}

static int consume_some(struct ts_session *s, struct consumer *c, const struct opts *o)
{
	if (!c->attached) {
		int ret = ts_ring_attach(s->seg, s->self, &c->r);
		if (ret)
			return ret;
		c->attached = 1;
		c->have_expect = 0;
		c->in_batch = 0;
	}
	uint64_t need = o->batch - c->in_batch;
	uint64_t want[2] = { need * o->s0, need * o->s1 };
	int ret = ts_ring_peek(s->seg, &c->r, 2, want, &c->rd, 50000000ull);
	if (ret == 0) {
		if (o->consume_us)
			usleep((useconds_t)o->consume_us);
		ret = ts_ring_advance(s->seg, &c->r, &c->rd, c->rd.got);
		if (ret == 0) {
			check_ranges(c, o);
			count_batch(c, o, c->rd.got[0] / o->s0, (int)c->rd.end_of_epoch);
		}
	}
	if (ret == -ESTALE) {
		c->evictions++;
		c->attached = 0;
		printf("evicted; re-attaching at the head\n");
		fflush(stdout);
		return 0;
	}
	if (ret == -EPROTO || ret == -EBADMSG)
		FAIL("peek/advance: %s", strerror(-ret));
	return ret;
}

int main(int argc, char **argv)
{
	struct opts o;
	if (parse(argc, argv, &o))
		return 2;
	struct sigaction sa = { .sa_handler = on_term };
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	struct ts_session s;
	struct ts_session_params sp = { .depth = o.depth, .timeout_ms = o.timeout_ms };
	int ret = ts_session_join(&s, o.session, &sp);
	if (ret) {
		printf("ERROR join: %s: %s\n", strerror(-ret), s.why);
		return 1;
	}
	struct ts_heartbeat hb;
	if ((ret = ts_heartbeat_start(&hb, &s, NULL, NULL)) != 0) {
		printf("ERROR heartbeat: %s\n", strerror(-ret));
		return 1;
	}
	printf("joined slot=%d role=%s\n", s.self, ts_session_role(&s) == TS_ROLE_PRODUCER ? "producer" : "consumer");
	fflush(stdout);

	struct producer prod = { 0 };
	static struct consumer cons;
	while (!stop && !(o.max_samples && cons.samples >= o.max_samples)) {
		if (ts_session_role(&s) == TS_ROLE_PRODUCER) {
			if (cons.attached) {
				ts_ring_detach(s.seg, &cons.r);
				cons.attached = 0;
			}
			ret = produce_one(&s, &prod, &o);
			if (ret == -EPERM)
				prod.ready = 0;
			if (o.produce_us)
				usleep((useconds_t)o.produce_us);
		} else {
			prod.ready = 0;
			consume_some(&s, &cons, &o);
		}
	}
	printf("done samples=%llu batches=%llu evictions=%llu\n", (unsigned long long)cons.samples,
	       (unsigned long long)cons.batches, (unsigned long long)cons.evictions);
	fflush(stdout);
	ts_heartbeat_stop(&hb);
	ts_session_leave(&s);
	return 0;
}
