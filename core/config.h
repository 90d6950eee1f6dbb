/* SPDX-License-Identifier: MIT */
/*
 * Configuration from TSSHIM_* environment variables (PRODUCT.md section 2).
 * Parsing is strict: the first invalid value yields one message naming the
 * variable, the value and what is accepted, and the caller turns the shim
 * off for the process. Nothing here allocates.
 */
#ifndef TSSHIM_CORE_CONFIG_H
#define TSSHIM_CORE_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "layout.h"
#include "log.h"

#define TS_DATA_MAX_ROOTS 16
#define TS_DATA_BUF       4096
#define TS_DEPTH_DEFAULT  4u
#define TS_TIMEOUT_DEFAULT_MS 1000u
#define TS_CACHE_MAX_MB   (1u << 20) /* 1 TiB */

enum ts_mode { TS_MODE_AUTO = 0, TS_MODE_SOCKET, TS_MODE_EXACT, TS_MODE_OFF };
enum ts_prefetch_mode { TS_PREFETCH_OFF = 0, TS_PREFETCH_WARM };

struct ts_config {
	enum ts_mode mode;        /* AUTO: socket where it can apply, else exact */
	uint32_t depth;
	uint32_t ndata;           /* 0: detect from the first decoded files */
	const char *data[TS_DATA_MAX_ROOTS]; /* point into data_buf, no trailing '/' */
	char data_buf[TS_DATA_BUF];
	char session[TS_NAME_MAX];
	uint64_t cache_mb;
	uint32_t timeout_ms;
	int python;
	enum ts_prefetch_mode prefetch;
	enum ts_log_level log;
};

/* Looks a variable up; getenv in production, a table in tests. */
typedef const char *(*ts_getenv_fn)(const char *name);

/*
 * Fill *c from the environment. 0 on success; -EINVAL with `err` holding
 * the one line to print (without the "tsshim[pid]: " prefix).
 */
int ts_config_parse(struct ts_config *c, ts_getenv_fn get, char *err, size_t errlen);

/* Default decoded-cache budget: an eighth of RAM, at most 8 GiB and a quarter of /dev/shm. */
uint64_t ts_config_default_cache_mb(void);

const char *ts_mode_name(enum ts_mode m);

/* Every variable the shim reads, for typo warnings; NULL-terminated. */
extern const char *const ts_config_vars[];

#endif
