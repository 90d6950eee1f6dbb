/* SPDX-License-Identifier: MIT */
#include "log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int ts_log_threshold = TS_LOG_WARN;
int ts_log_fd = 2;

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
	for (size_t off = 0; off < len;) {
		ssize_t w = write(ts_log_fd, buf + off, len - off);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			break;
		off += (size_t)w;
	}
	errno = saved;
}
