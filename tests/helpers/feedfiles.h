/* SPDX-License-Identifier: MIT */
/* Unit suites: how many of a feed session's files are in the shm directory. */
#ifndef TSSHIM_TESTS_FEEDFILES_H
#define TSSHIM_TESTS_FEEDFILES_H

#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "feed.h"
#include "prim.h"

static inline int count_feed_files(const char *session)
{
	char prefix[128];
	int n = 0, plen = snprintf(prefix, sizeof(prefix), TS_FEED_PREFIX "%u.%s.", (unsigned)getuid(), session);
	DIR *d = opendir(ts_shm_dir());
	struct dirent *e;
	while (d && (e = readdir(d)) != NULL)
		n += strncmp(e->d_name, prefix, (size_t)plen) == 0;
	if (d)
		closedir(d);
	return n;
}

#endif
