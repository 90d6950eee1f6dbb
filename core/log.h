/* SPDX-License-Identifier: MIT */
/*
 * Logging to stderr, each line "tsshim[pid]: ...". Formats into a stack
 * buffer and issues one write(2): no allocation, no stdio lock, errno kept,
 * so it is safe in hooks and (for constant messages) after fork.
 */
#ifndef TSSHIM_CORE_LOG_H
#define TSSHIM_CORE_LOG_H

enum ts_log_level { TS_LOG_ERROR = 0, TS_LOG_WARN = 1, TS_LOG_INFO = 2, TS_LOG_DEBUG = 3 };

extern int ts_log_threshold; /* messages above this level are dropped */

__attribute__((format(printf, 2, 3))) void ts_log(enum ts_log_level level, const char *fmt, ...);

#define ts_error(...) ts_log(TS_LOG_ERROR, __VA_ARGS__)
#define ts_warn(...)  ts_log(TS_LOG_WARN, __VA_ARGS__)
#define ts_info(...)  ts_log(TS_LOG_INFO, __VA_ARGS__)
#define ts_debug(...) ts_log(TS_LOG_DEBUG, __VA_ARGS__)

/* Where lines go (tests point it at a pipe); default 2. */
extern int ts_log_fd;

/*
 * Remember which file ts_log_fd is now (the shim, as it starts): lines are
 * written only while it is still that file.
 */
void ts_log_bind(void);

#endif
