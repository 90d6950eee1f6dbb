/* SPDX-License-Identifier: MIT */
/*
 * Shared by the JPEG test programs: read a file the way loaders do (open,
 * fstat, read loop, so the shim can follow it), and a libjpeg error manager
 * that longjmps instead of exiting and counts warnings silently.
 */
#ifndef TSSHIM_TESTS_JPEGTEST_H
#define TSSHIM_TESTS_JPEGTEST_H

#include <fcntl.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jpeglib.h>

struct err {
	struct jpeg_error_mgr pub;
	jmp_buf jb;
};

static inline void on_error(j_common_ptr c)
{
	longjmp(((struct err *)c->err)->jb, 1);
}

/* Silent, but counts warnings as libjpeg's own emit_message does. */
static inline void count_warning(j_common_ptr c, int level)
{
	if (level < 0)
		c->err->num_warnings++;
}

/* noinline: callers use setjmp, and nothing here may be clobbered by it. */
__attribute__((noinline)) static unsigned char *slurp(const char *path, size_t *len)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	struct stat sb;
	if (fd < 0 || fstat(fd, &sb) != 0) {
		perror(path);
		exit(1);
	}
	unsigned char *buf = malloc((size_t)sb.st_size + 1);
	size_t got = 0;
	while (buf && got < (size_t)sb.st_size) {
		ssize_t n = read(fd, buf + got, (size_t)sb.st_size - got);
		if (n <= 0)
			break;
		got += (size_t)n;
	}
	close(fd);
	*len = got;
	return buf;
}

#endif
