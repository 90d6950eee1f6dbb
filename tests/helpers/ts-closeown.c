/* SPDX-License-Identifier: MIT */
/*
 * ts-closeown: a program that closes descriptors it never opened, as a
 * daemon does (every number from 3 up), after the shim joined its session,
 * then uses the freed numbers for files of its own: a log written through
 * stdio and never closed (exit flushes it), and a forked child that writes
 * to it too.
 *   ts-closeown close|close_range|closefrom LOG
 * Before closing, it opens three files of its own (above the shim's
 * descriptors) and says how many are still open after ("own open=K": 0);
 * close_range mode first asks with flags close_range refuses ("bad flags
 * r=R errno=E": -1, EINVAL, nothing closed) and closes up to ~0u, as
 * closefrom does.
 * Prints "closed=K" (close mode: how many of the numbers 3..63 close()
 * closed) and "child write=N errno=E"; exits 0, 2 on bad usage or a failed
 * set-up. The scenario compares it, and LOG, with a run without the shim.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tsshim.h"

int main(int argc, char **argv)
{
	if (argc != 3 || (strcmp(argv[1], "close") && strcmp(argv[1], "close_range") && strcmp(argv[1], "closefrom"))) {
		fprintf(stderr, "usage: ts-closeown close|close_range|closefrom LOG\n");
		return 2;
	}
	if (tsshim_join)
		tsshim_join(); /* the session's descriptor is open from here on */
	int own[3];
	for (int i = 0; i < 3; i++)
		if ((own[i] = open("/dev/null", O_RDONLY)) < 0)
			return 2;
	int closed = 0;
	if (!strcmp(argv[1], "close")) {
		for (int fd = 3; fd < 64; fd++)
			closed += close(fd) == 0;
		printf("closed=%d\n", closed);
	} else if (!strcmp(argv[1], "close_range")) {
		errno = 0;
		int r = close_range(3, ~0u, 0x80); /* no such flag */
		printf("bad flags r=%d errno=%d own open=%d\n", r, errno, fcntl(own[2], F_GETFD) != -1);
		if (close_range(3, ~0u, 0) != 0) {
			perror("close_range");
			return 2;
		}
	} else {
		closefrom(3);
	}
	int open_after = 0;
	for (int i = 0; i < 3; i++)
		open_after += fcntl(own[i], F_GETFD) != -1;
	printf("own open=%d\n", open_after);
	FILE *log = fopen(argv[2], "w");
	if (!log)
		return 2;
	fprintf(log, "parent line\n"); /* buffered until exit */
	fflush(stdout);
	pid_t pid = fork();
	if (pid == 0) {
		errno = 0;
		ssize_t w = write(fileno(log), "child line\n", 11);
		printf("child write=%zd errno=%d\n", w, errno);
		fflush(stdout);
		_exit(0);
	}
	int st;
	if (pid < 0 || waitpid(pid, &st, 0) != pid)
		return 2;
	return 0; /* no fclose: exit flushes the log */
}
