/* SPDX-License-Identifier: MIT */
/*
 * ts-ring-chaos: randomized fault injection for sessions and the ring.
 *
 * Each round spawns (posix_spawn) one producer and several consumers of
 * ts-ring with random batch sizes, then at random moments SIGKILLs the
 * producer, stops it for longer than the timeout (SIGSTOP/SIGCONT), kills a
 * consumer, or lets a late joiner in. Every consumer verifies its stream
 * itself (no gap, no repeat, positions paired, epochs respected) and exits
 * 1 on any violation. The round checks: no member hangs (each ends within a
 * bound), no consumer saw a wrong stream, and no segment is left behind.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "session.h"

#define MAX_PROCS 32
#define TIMEOUT_MS 200

extern char **environ;

struct proc {
	pid_t pid;
	int consumer_done; /* exited */
	int status;
	int killed;        /* we SIGKILLed it */
	char out[64];
};

struct round {
	char session[64];
	char ring_path[512];
	struct proc p[MAX_PROCS];
	int n;
	int faults;
};

static long now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000L + ts.tv_nsec / 1000000L;
}

static int spawn_member(struct round *r, const char *batch, const char *max_samples, const char *produce_us)
{
	if (r->n == MAX_PROCS)
		return -1;
	struct proc *p = &r->p[r->n];
	snprintf(p->out, sizeof(p->out), "/tmp/ts-chaos.%d.%d.out", (int)getpid(), r->n);
	char timeout[16];
	snprintf(timeout, sizeof(timeout), "%d", TIMEOUT_MS);
	char *argv[] = { r->ring_path, "--session", r->session, "--batch", (char *)batch, "--max-samples",
			 (char *)max_samples, "--produce-us", (char *)produce_us, "--timeout-ms", timeout,
			 "--consume-us", "50", NULL };
	posix_spawn_file_actions_t fa;
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_addopen(&fa, 1, p->out, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	int ret = posix_spawn(&p->pid, r->ring_path, &fa, NULL, argv, environ);
	posix_spawn_file_actions_destroy(&fa);
	if (ret) {
		fprintf(stderr, "posix_spawn %s: %s\n", r->ring_path, strerror(ret));
		return -1;
	}
	r->n++;
	return 0;
}

static pid_t current_producer(const struct round *r)
{
	char path[TS_PATH_MAX], why[160];
	struct ts_view v;
	if (ts_segment_path(path, sizeof(path), getuid(), r->session) || ts_view_open(&v, path, why, sizeof(why)))
		return 0;
	int idx = ts_producer_index(atomic_load(&v.seg->producer));
	pid_t pid = idx >= 0 && idx < (int)TS_MAX_MEMBERS ? (pid_t)atomic_load(&v.seg->members[idx].pid) : 0;
	ts_view_close(&v);
	return pid;
}

static struct proc *find(struct round *r, pid_t pid)
{
	for (int i = 0; i < r->n; i++)
		if (r->p[i].pid == pid)
			return &r->p[i];
	return NULL;
}

static void reap(struct round *r)
{
	int status;
	pid_t pid;
	while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
		struct proc *p = find(r, pid);
		if (p) {
			p->consumer_done = 1;
			p->status = status;
		}
	}
}

static int running(const struct round *r)
{
	int n = 0;
	for (int i = 0; i < r->n; i++)
		n += !r->p[i].consumer_done;
	return n;
}

static const char *pick(const char *const *v, int n) { return v[rand() % n]; }

static void inject_fault(struct round *r, const char *const *batches, int nb)
{
	pid_t prod = current_producer(r);
	int action = rand() % 4;
	if (action == 0 && prod) {
		printf("#   SIGKILL producer %d\n", (int)prod);
		kill(prod, SIGKILL);
		struct proc *p = find(r, prod);
		if (p)
			p->killed = 1;
	} else if (action == 1 && prod) {
		printf("#   SIGSTOP producer %d for %d ms\n", (int)prod, 2 * TIMEOUT_MS);
		kill(prod, SIGSTOP);
		usleep(2 * TIMEOUT_MS * 1000);
		kill(prod, SIGCONT);
	} else if (action == 2) {
		for (int i = 0; i < r->n; i++) {
			struct proc *p = &r->p[i];
			if (!p->consumer_done && p->pid != prod && !p->killed) {
				printf("#   SIGKILL consumer %d\n", (int)p->pid);
				kill(p->pid, SIGKILL);
				p->killed = 1;
				break;
			}
		}
	} else {
		printf("#   late joiner\n");
		spawn_member(r, pick(batches, nb), "30000", "1000");
	}
	fflush(stdout);
	r->faults++;
}

/* 0 pass, 1 fail. */
static int run_round(int round, const char *ring_path, int *faults)
{
	static const char *const batches[] = { "1", "7", "48", "64", "100", "300" };
	const int nb = (int)(sizeof(batches) / sizeof(*batches));
	struct round r = { 0 };
	snprintf(r.session, sizeof(r.session), "t-chaos-%d-%d", (int)getpid(), round);
	snprintf(r.ring_path, sizeof(r.ring_path), "%s", ring_path);
	int failed = 0;

	spawn_member(&r, "64", "60000", "1000");
	usleep(50000);
	for (int i = 0; i < 3; i++)
		spawn_member(&r, pick(batches, nb), "60000", "1000");

	/* Faults while consumers read; a round lasts until every consumer is done. */
	long deadline = now_ms() + 60000;
	long next_fault = now_ms() + 50 + rand() % 150;
	int budget = 3 + rand() % 3;
	for (;;) {
		reap(&r);
		pid_t prod = current_producer(&r);
		int consumers_left = 0;
		for (int i = 0; i < r.n; i++)
			consumers_left += !r.p[i].consumer_done && r.p[i].pid != prod;
		if (consumers_left == 0)
			break;
		if (now_ms() > deadline) {
			printf("not ok - round %d: members still running after 60 s (hang)\n", round);
			failed = 1;
			break;
		}
		if (budget > 0 && now_ms() >= next_fault) {
			inject_fault(&r, batches, nb);
			budget--;
			next_fault = now_ms() + 100 + rand() % 200;
		}
		usleep(10000);
	}
	/* Whoever produces now is told to stop; everyone must be gone within a bound. */
	for (int i = 0; i < r.n; i++)
		if (!r.p[i].consumer_done)
			kill(r.p[i].pid, SIGTERM);
	long stop_deadline = now_ms() + 5000;
	while (running(&r) && now_ms() < stop_deadline) {
		reap(&r);
		usleep(10000);
	}
	if (running(&r)) {
		printf("not ok - round %d: a member did not exit within 5 s of SIGTERM (hang)\n", round);
		for (int i = 0; i < r.n; i++)
			if (!r.p[i].consumer_done)
				kill(r.p[i].pid, SIGKILL);
		failed = 1;
		while (running(&r)) {
			reap(&r);
			usleep(10000);
		}
	}
	for (int i = 0; i < r.n; i++) {
		struct proc *p = &r.p[i];
		int clean = WIFEXITED(p->status) && WEXITSTATUS(p->status) == 0;
		if (!p->killed && !clean) {
			printf("not ok - round %d: member %d ended badly (status 0x%x); its output:\n", round,
			       (int)p->pid, p->status);
			char cmd[128];
			snprintf(cmd, sizeof(cmd), "tail -n 5 %s", p->out);
			fflush(stdout);
			if (system(cmd) != 0)
				printf("(no output)\n");
			failed = 1;
		}
		unlink(p->out);
	}
	/* Killed members leave their slots; the last one out (SIGTERMed) reaps them. */
	char path[TS_PATH_MAX];
	ts_segment_path(path, sizeof(path), getuid(), r.session);
	struct stat sb;
	if (stat(path, &sb) == 0) {
		int removed = ts_session_remove_if_stale(path);
		printf("not ok - round %d: segment left behind (stale removal: %d)\n", round, removed);
		failed = 1;
	}
	*faults += r.faults;
	printf("%s - round %d: %d members, %d faults\n", failed ? "not ok" : "ok", round, r.n, r.faults);
	fflush(stdout);
	return failed;
}

int main(int argc, char **argv)
{
	int rounds = 5;
	unsigned seed = (unsigned)time(NULL);
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--rounds") && i + 1 < argc)
			rounds = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--seed") && i + 1 < argc)
			seed = (unsigned)strtoul(argv[++i], NULL, 10);
		else {
			fprintf(stderr, "usage: ts-ring-chaos [--rounds N] [--seed S]\n"
					"Randomized SIGKILL/SIGSTOP/late-join faults against ts-ring members.\n");
			return strcmp(argv[i], "--help") ? 2 : 0;
		}
	}
	char self[512], ring_path[512];
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	if (n <= 0)
		return 2;
	self[n] = '\0';
	snprintf(ring_path, sizeof(ring_path), "%.*s/ts-ring", (int)(strrchr(self, '/') - self), self);
	srand(seed);
	printf("# seed %u (rerun with --seed %u)\n", seed, seed);
	int failed = 0, faults = 0;
	for (int i = 0; i < rounds; i++)
		failed += run_round(i, ring_path, &faults);
	printf("# runs %d, faults injected %d, survived %d, failures %d\n", rounds, faults, rounds - failed, failed);
	printf("ring-chaos: %d passed, %d failed\n", rounds - failed, failed);
	return failed ? 1 : 0;
}
