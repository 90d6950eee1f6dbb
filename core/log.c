/* SPDX-License-Identifier: MIT */
#include "log.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int ts_log_threshold = TS_LOG_WARN;
int ts_log_fd = 2;

/* The file ts_log_fd was when the shim started (ts_log_bind), if it was bound. */
static struct {
	int bound, open;
	dev_t dev;
	ino_t ino;
} target;

void ts_log_bind(void)
{
	struct stat sb;
	int saved = errno;
	target.open = fstat(ts_log_fd, &sb) == 0;
	target.dev = target.open ? sb.st_dev : 0;
	target.ino = target.open ? sb.st_ino : 0;
	target.bound = 1;
	errno = saved;
}

/*
 * Still the stderr the program started with? A program that closed it and
 * opened a file of its own, which got the number, must not find our lines
 * in its file.
 */
static int target_unchanged(void)
{
	struct stat sb;
	if (!target.bound)
		return 1;
	return target.open && fstat(ts_log_fd, &sb) == 0 && sb.st_dev == target.dev && sb.st_ino == target.ino;
}

/*
 * One write of the line, SIGPIPE blocked in this thread meanwhile: a stderr
 * whose reader is gone (a job piped into head) gets EPIPE and the line is
 * lost, where the signal would have killed the job. The SIGPIPE our write
 * raised is taken back unless one was pending already.
 */
static void write_line(const char *buf, size_t len)
{
	sigset_t pipe_set, old, pending;
	sigemptyset(&pipe_set);
	sigaddset(&pipe_set, SIGPIPE);
	int masked = pthread_sigmask(SIG_BLOCK, &pipe_set, &old) == 0;
	int was_pending = masked && sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE);
	int broken = 0;
	for (size_t off = 0; off < len;) {
		ssize_t w = write(ts_log_fd, buf + off, len - off);
		if (w < 0 && errno == EINTR)
			continue;
		broken = w < 0 && errno == EPIPE;
		if (w <= 0)
			break;
		off += (size_t)w;
	}
	if (broken && masked && !was_pending) {
		struct timespec zero = { 0, 0 };
		while (sigtimedwait(&pipe_set, NULL, &zero) < 0 && errno == EINTR)
			;
	}
	if (masked)
		pthread_sigmask(SIG_SETMASK, &old, NULL);
}

void ts_log(enum ts_log_level level, const char *fmt, ...)
{
	if ((int)level > ts_log_threshold)
		return;
	int saved = errno;
	char buf[1024];
	int n = snprintf(buf, sizeof(buf), "tsshim[%d]: ", (int)getpid());
	va_list ap;
	va_start(ap, fmt);
	int m = vsnprintf(buf + n, sizeof(buf) - (size_t)n - 1, fmt, ap);
	va_end(ap);
	size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
	if (len > sizeof(buf) - 2)
		len = sizeof(buf) - 2; /* truncated: keep it one line */
	buf[len++] = '\n';
	if (target_unchanged())
		write_line(buf, len);
	errno = saved;
}
