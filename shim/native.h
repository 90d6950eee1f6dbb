/* SPDX-License-Identifier: MIT */
/* A native program's loader followed to its uploads, to tell the user (native.c). */
#ifndef TSSHIM_SHIM_NATIVE_H
#define TSSHIM_SHIM_NATIVE_H

#include <stddef.h>

#include "objseen.h"

extern struct ts_objseen ts_native_seen;

/* A host-to-device upload of n bytes from src that is no stream range: look at it while the watch lasts. */
void ts_native_upload(const void *src, size_t n);

/* For the copy hooks: two loads unless a worker's object was received and the watch is on. */
static inline void ts_native_upload_maybe(const void *src, size_t n)
{
	if (n >= TS_OBJSEEN_HEAD && ts_objseen_watching(&ts_native_seen))
		ts_native_upload(src, n);
}

/* tsshim_batch() was called: the program tells the shim itself, no watch needed. */
void ts_native_batch_api_used(void);

#endif
