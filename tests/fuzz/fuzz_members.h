/* SPDX-License-Identifier: MIT */
/*
 * Fake member processes for the fuzz targets over a session segment
 * (fuzz_ring.c, fuzz_gpuring.c): member k is pid FZ_PID0 + k, started at
 * FZ_START(k), alive unless fz_dead[k]; time is fz_clock_ns; this process
 * is alive too when fz_self_start is set (code that names itself through
 * ts_self_ident). ts_prim is pointed at them by fz_members_init().
 */
#ifndef TSSHIM_FUZZ_MEMBERS_H
#define TSSHIM_FUZZ_MEMBERS_H

#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "prim.h"
#include "session.h"

#define FZ_PID0     4000u
#define FZ_MAXMEM   6
#define FZ_START(k) (1000u + (uint64_t)(k))

static uint64_t fz_clock_ns;
static bool fz_dead[FZ_MAXMEM];
static uint64_t fz_self_start;

static uint64_t fz_now(void)
{
	return fz_clock_ns;
}

static int fz_start_time(uint32_t pid, uint64_t *out)
{
	if (fz_self_start && pid == (uint32_t)getpid()) {
		*out = fz_self_start;
		return 0;
	}
	if (pid < FZ_PID0 || pid >= FZ_PID0 + FZ_MAXMEM || fz_dead[pid - FZ_PID0])
		return -ESRCH;
	*out = FZ_START(pid - FZ_PID0);
	return 0;
}

/* Once: fake time and liveness, and a segment image to run on. */
static struct ts_segment *fz_members_init(void)
{
	struct ts_segment *seg = aligned_alloc(64, (sizeof(*seg) + 63) / 64 * 64);
	if (!seg)
		abort();
	ts_prim.now_ns = fz_now;
	ts_prim.proc_start_time = fz_start_time;
	return seg;
}

/* Per input: a fresh segment of `depth` whose members 0..nmem-1 are alive and beat now. */
static void fz_members_reset(struct ts_segment *seg, uint32_t depth, uint32_t nmem)
{
	memset(fz_dead, 0, sizeof(fz_dead));
	fz_clock_ns = 1000000000000ull;
	ts_segment_init(seg, sizeof(*seg), "fuzz", getuid(),
			&(struct ts_session_params){ .depth = depth, .timeout_ms = 1000 });
	for (uint32_t k = 0; k < nmem; k++) {
		atomic_store(&seg->members[k].pid, FZ_PID0 + k);
		atomic_store(&seg->members[k].start_time, FZ_START(k));
		atomic_store(&seg->members[k].heartbeat_ns, fz_clock_ns);
	}
}

#endif
