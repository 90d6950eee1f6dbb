/* SPDX-License-Identifier: MIT */
/*
 * ts-closerange: a program that closes every descriptor above stderr
 * (close_range or closefrom, as daemons and sandboxes do before exec)
 * while the shim's prefetch thread reads the dataset, then reuses the
 * numbers for pipes of its own and checks that each pipe still carries
 * exactly its data. With --seccomp it first installs an allow-all seccomp
 * filter, under which the prefetch keeps its descriptors in this
 * process's table: the shim must stop it before the close, or the thread
 * reads the program's pipes through numbers it believes its own.
 *
 * Prints one line:
 *   prefetch_before=1 prefetch_after=0|1 pipes_ok=N/N
 * exit 0 when every pipe carried its data, 1 otherwise, 2 on bad usage or
 * a failed set-up, 3 without the shim (tsshim_join is weak), 77 when the
 * prefetch thread never appeared (the shim did not start one).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include "tsshim.h"

#define NPIPES    24
#define PIPE_DATA 4096

static void usage(FILE *f)
{
	fprintf(f, "usage: ts-closerange [--seccomp] close_range|closefrom\n"
		   "Join the session (TSSHIM_PREFETCH=warm starts the prefetch), wait for the prefetch\n"
		   "thread, close every descriptor above 2, then check pipes made in the freed numbers.\n");
}

/* Allow everything: only the filter's presence matters (the prefetch reads plainly, in our table). */
static int allow_all_filter(void)
{
	struct sock_filter allow = BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
	struct sock_fprog prog = {.len = 1, .filter = &allow};
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog))
		return -errno;
	return 0;
}

/* Is a thread named tsshim-prefetch running in this process? */
static int prefetch_running(void)
{
	DIR *d = opendir("/proc/self/task");
	struct dirent *e;
	int found = 0;
	if (!d)
		return 0;
	while (!found && (e = readdir(d)) != NULL) {
		char path[300], comm[32] = "";
		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/proc/self/task/%s/comm", e->d_name);
		FILE *f = fopen(path, "re");
		if (!f)
			continue;
		found = fgets(comm, sizeof(comm), f) && !strncmp(comm, "tsshim-prefetch", 15);
		fclose(f);
	}
	closedir(d);
	return found;
}

static void sleep_ms(long ms)
{
	struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
	while (nanosleep(&ts, &ts) && errno == EINTR)
		;
}

/* Fill each pipe, give a running prefetch time to misread, then drain and compare. */
static int pipes_carry_their_data(int fds[][2])
{
	static unsigned char out[PIPE_DATA], in[PIPE_DATA];
	int ok = 0;
	for (int i = 0; i < NPIPES; i++) {
		memset(out, 'a' + i % 26, sizeof(out));
		if (write(fds[i][1], out, sizeof(out)) != (ssize_t)sizeof(out))
			return -1;
	}
	sleep_ms(300);
	for (int i = 0; i < NPIPES; i++) {
		ssize_t got = 0, r;
		memset(out, 'a' + i % 26, sizeof(out));
		(void)fcntl(fds[i][0], F_SETFL, O_NONBLOCK); /* data taken from it must not hang us */
		while (got < PIPE_DATA && (r = read(fds[i][0], in + got, (size_t)(PIPE_DATA - got))) > 0)
			got += r;
		ok += got == PIPE_DATA && !memcmp(in, out, sizeof(in)) && fcntl(fds[i][1], F_GETFD) >= 0;
	}
	return ok;
}

int main(int argc, char **argv)
{
	int seccomp = 0, use_closefrom;
	int i = 1;
	if (i < argc && !strcmp(argv[i], "--help")) {
		usage(stdout);
		return 0;
	}
	if (i < argc && !strcmp(argv[i], "--seccomp"))
		seccomp = 1, i++;
	if (i + 1 != argc || (strcmp(argv[i], "close_range") && strcmp(argv[i], "closefrom"))) {
		usage(stderr);
		return 2;
	}
	use_closefrom = !strcmp(argv[i], "closefrom");
	if (!tsshim_join) {
		fprintf(stderr, "ts-closerange: the shim is not loaded\n");
		return 3;
	}
	if (seccomp && allow_all_filter()) {
		perror("ts-closerange: seccomp");
		return 2;
	}
	(void)tsshim_join();
	int before = 0;
	for (int t = 0; t < 500 && !(before = prefetch_running()); t++)
		sleep_ms(10);
	if (!before) {
		printf("prefetch_before=0\n");
		return 77;
	}
	sleep_ms(50); /* let it open and read a file or two */
	if (use_closefrom)
		closefrom(3);
	else if (close_range(3, ~0u, 0)) {
		perror("ts-closerange: close_range");
		return 2;
	}
	int fds[NPIPES][2];
	for (int k = 0; k < NPIPES; k++)
		if (pipe(fds[k])) {
			perror("ts-closerange: pipe");
			return 2;
		}
	int after = prefetch_running();
	int ok = pipes_carry_their_data(fds);
	printf("prefetch_before=%d prefetch_after=%d pipes_ok=%d/%d\n", before, after, ok, NPIPES);
	fflush(stdout);
	return ok == NPIPES ? 0 : 1;
}
