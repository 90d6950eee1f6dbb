/* SPDX-License-Identifier: MIT */
/*
 * ts-member: a minimal program that becomes a session member through the
 * shim's C API (weak symbols: without the shim it says so and exits 3).
 * Scenario tests start several of these under LD_PRELOAD and watch the
 * role changes they print:
 *
 *   join=0 role=producer pid=123
 *   role=consumer t_ms=4711
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tsshim.h"

static volatile sig_atomic_t stop;

static void on_term(int sig)
{
	(void)sig;
	stop = 1;
}

static const char *role_name(int r)
{
	switch (r) {
	case TSSHIM_ROLE_PRODUCER: return "producer";
	case TSSHIM_ROLE_CONSUMER: return "consumer";
	case TSSHIM_ROLE_WORKER: return "worker";
	default: return "none";
	}
}

static long now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000L + ts.tv_nsec / 1000000L;
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: ts-member [--hold-ms N] [--poll-ms N] [--fork-child] [--exec-child] [--child]\n"
		"Joins the tsshim session (TSSHIM_SESSION) through tsshim_join() and prints its role,\n"
		"then every role change, until --hold-ms passes (default: forever) or SIGTERM/SIGINT.\n"
		"  --fork-child  after joining, fork a child that calls tsshim_join() and exit()s\n"
		"  --exec-child  after joining, fork and exec ts-member --child\n"
		"  --child       join, print 'child join=RC role=ROLE', exit\n"
		"Exit: 0 normally, 3 when the shim is not loaded, 2 on bad usage.\n");
}

static void report_child(const char *tag)
{
	int rc = tsshim_join();
	printf("%s join=%d role=%s pid=%d\n", tag, rc, role_name(tsshim_role()), (int)getpid());
	fflush(stdout);
}

static void spawn_children(int fork_child, int exec_child, const char *self)
{
	if (fork_child) {
		pid_t pid = fork();
		if (pid == 0) {
			report_child("fork-child");
			exit(0); /* runs destructors: must not end the parent's membership */
		}
		waitpid(pid, NULL, 0);
	}
	if (exec_child) {
		pid_t pid = fork();
		if (pid == 0) {
			execl(self, self, "--child", (char *)NULL);
			_exit(127);
		}
		waitpid(pid, NULL, 0);
	}
}

int main(int argc, char **argv)
{
	long hold_ms = -1, poll_ms = 5;
	int fork_child = 0, exec_child = 0;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--hold-ms") && i + 1 < argc)
			hold_ms = atol(argv[++i]);
		else if (!strcmp(argv[i], "--poll-ms") && i + 1 < argc)
			poll_ms = atol(argv[++i]);
		else if (!strcmp(argv[i], "--fork-child"))
			fork_child = 1;
		else if (!strcmp(argv[i], "--exec-child"))
			exec_child = 1;
		else if (!strcmp(argv[i], "--child")) {
			if (!tsshim_join)
				return 3;
			report_child("exec-child");
			return 0;
		} else if (!strcmp(argv[i], "--help")) {
			usage(stdout);
			return 0;
		} else {
			usage(stderr);
			return 2;
		}
	}
	if (!tsshim_join) {
		fprintf(stderr, "ts-member: libtsshim.so is not loaded\n");
		return 3;
	}
	struct sigaction sa = { .sa_handler = on_term };
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);

	int rc = tsshim_join();
	int role = tsshim_role();
	printf("join=%d role=%s pid=%d\n", rc, role_name(role), (int)getpid());
	fflush(stdout);
	spawn_children(fork_child, exec_child, argv[0]);

	long end = hold_ms < 0 ? -1 : now_ms() + hold_ms;
	while (!stop && (end < 0 || now_ms() < end)) {
		int r = tsshim_role();
		if (r != role) {
			role = r;
			printf("role=%s t_ms=%ld\n", role_name(r), now_ms());
			fflush(stdout);
		}
		struct timespec ts = { .tv_sec = poll_ms / 1000, .tv_nsec = poll_ms % 1000 * 1000000L };
		nanosleep(&ts, NULL);
	}
	printf("exit role=%s\n", role_name(tsshim_role()));
	return 0;
}
