/* SPDX-License-Identifier: MIT */
#include "real.h"

#include <dlfcn.h>
#include <errno.h>

typedef void *(*dlsym_fn)(void *, const char *);
static dlsym_fn _Atomic real_dlsym_ptr;

void *ts_real_dlsym(void *handle, const char *name)
{
	dlsym_fn fn = atomic_load_explicit(&real_dlsym_ptr, memory_order_relaxed);
	if (!fn) {
		/* glibc >= 2.34 versions dlsym in libc; older ones in libdl. */
		fn = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
		if (!fn)
			fn = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
		if (!fn)
			return NULL;
		atomic_store_explicit(&real_dlsym_ptr, fn, memory_order_relaxed);
	}
	return fn(handle, name);
}

void *ts_real_next(const char *name)
{
	int saved = errno;
	void *p = ts_real_dlsym(RTLD_NEXT, name);
	errno = saved;
	return p;
}
