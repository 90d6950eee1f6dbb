/* SPDX-License-Identifier: MIT */
/*
 * tsshim's optional C API. A program needs none of it: under
 * LD_PRELOAD=libtsshim.so the shim works on an unmodified program. A C/C++
 * trainer may include this header to say explicitly that it takes part in
 * a session; the declarations are weak, so the same binary runs without
 * the shim (the functions are then NULL):
 *
 *     if (tsshim_join)
 *             tsshim_join();
 */
#ifndef TSSHIM_H
#define TSSHIM_H

#ifdef __cplusplus
extern "C" {
#endif

#ifndef TSSHIM_WEAK
#define TSSHIM_WEAK __attribute__((weak))
#endif

enum {
	TSSHIM_ROLE_NONE = 0,     /* not a member (shim off, or join failed) */
	TSSHIM_ROLE_PRODUCER = 1, /* runs the pipeline and publishes batches */
	TSSHIM_ROLE_CONSUMER = 2, /* reads the producer's batches */
	TSSHIM_ROLE_WORKER = 3,   /* a child process of a member: works for it */
};

/*
 * Make the calling process a member of its session (TSSHIM_SESSION).
 * Idempotent. Returns 0 when the process is a member (itself, or as a child
 * of one), a negative errno otherwise: -ENOTSUP when the shim is off,
 * -ECHILD for a forked child of a non-member.
 */
TSSHIM_WEAK int tsshim_join(void);
/* One of TSSHIM_ROLE_*. */
TSSHIM_WEAK int tsshim_role(void);
/* Leave the session now (also done at exit). */
TSSHIM_WEAK void tsshim_leave(void);
/* "tsshim X.Y.Z" */
TSSHIM_WEAK const char *tsshim_version(void);

#ifdef __cplusplus
}
#endif
#endif
