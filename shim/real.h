/* SPDX-License-Identifier: MIT */
/*
 * Resolving the real functions behind our hooks, once: when the shim is
 * loaded, and lazily for a call made before that.
 *
 * dlsym itself may be interposed (CUDA's cuGetProcAddress path needs it),
 * so the real dlsym comes from dlvsym, which nobody interposes.
 *
 * Wrapper pattern, one for every interposed call:
 *
 *     TS_REAL(ssize_t, read, (int, void *, size_t));
 *     ssize_t read(int fd, void *buf, size_t n)
 *     {
 *             if (!TS_RESOLVE(read)) { errno = ENOSYS; return -1; }
 *             if (!ts_hook_enter())
 *                     return real_read(fd, buf, n);
 *             ... ts_hook_leave(); ...
 *     }
 */
#ifndef TSSHIM_SHIM_REAL_H
#define TSSHIM_SHIM_REAL_H

#include <errno.h>
#include <stdatomic.h>
#include <stddef.h>

void *ts_real_dlsym(void *handle, const char *name);
/* The next definition of `name` after ours (RTLD_NEXT). */
void *ts_real_next(const char *name);
/* dlclose a handle the shim took with RTLD_NOLOAD: the real one, so that
 * the shim's own closes are not taken for the program's unloads. */
void ts_real_dlclose(void *handle);
/* The version definition `p` is exported under ("LIBJPEG_6.2"); NULL when
 * it has none, or it cannot be told. */
const char *ts_real_def_version(const void *p);
/*
 * What a reference to `name` binds to without the shim, from an object
 * whose own dependency tree defines it as `own` (NULL: none there), as the
 * linker binds it: the global scope's first definition of own's version,
 * else own; an unversioned own, or none, the global scope's first.
 */
void *ts_real_bind(const char *name, void *own);

/*
 * real_NAME_fn, the plain pointer type, for the cast below (a cast to the
 * _Atomic type is an error for clang), and real_NAME, resolved by a
 * constructor in every mode. A hook that resolved on first use would call
 * dlsym, which takes the dynamic linker's lock: in a vfork child (Python's
 * subprocess: dup2 and close through the PLT) that lock may be held by a
 * parent thread inside dlopen, and the child, with its parent, waits on it.
 */
#define TS_REAL(ret, name, params)                                                  \
	typedef ret(*real_##name##_fn) params; /* NOLINT(bugprone-macro-parentheses) */ \
	static real_##name##_fn _Atomic real_##name;                                \
	__attribute__((constructor)) static void ts_resolve_##name(void)            \
	{                                                                           \
		int saved_ = errno;                                                 \
		(void)TS_RESOLVE(name);                                             \
		errno = saved_;                                                     \
	}                                                                           \
	static real_##name##_fn _Atomic real_##name

/* Benign race: every thread resolves the same pointer; store is atomic. */
#define TS_RESOLVE(name)                                                          \
	(atomic_load_explicit(&real_##name, memory_order_relaxed)                 \
		 ? 1                                                              \
		 : (atomic_store_explicit(&real_##name, (real_##name##_fn)ts_real_next(#name), \
					  memory_order_relaxed),                  \
		    atomic_load_explicit(&real_##name, memory_order_relaxed) != NULL))

#endif
