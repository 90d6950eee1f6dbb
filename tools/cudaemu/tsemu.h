/* tsemu: the tsshim test device, a CPU emulation of the CUDA 13 runtime and
 * driver subset that tsshim uses (build/emu/libcudart.so.13 and
 * build/emu/libcuda.so.1; run a program with LD_LIBRARY_PATH=build/emu).
 *
 * This header is the emulator's own extra interface: copy counters. Both
 * libraries export tsemu_stats(); with TSEMU_STATS=FILE set, the driver also
 * appends them to FILE as one JSON line when the process exits (a process
 * that initialised the driver itself; never a forked child).
 *
 * Counts are of copies *executed* (by a stream worker), in bytes and calls:
 * h2d host to device, d2h device to host, d2d within one device, peer
 * between two devices (cuMemcpyPeer*, or a unified copy whose ends lie on
 * different devices), h2h host to host through a CUDA copy call. */
#ifndef TSEMU_H
#define TSEMU_H

#include <stdint.h>

#define TSEMU_STATS_VERSION 3

struct tsemu_stats {
	uint32_t version; /* TSEMU_STATS_VERSION */
	uint32_t devices; /* emulated devices (TSEMU_DEVICES) */
	uint64_t h2d_bytes, d2h_bytes, d2d_bytes, peer_bytes, h2h_bytes;
	uint64_t h2d_calls, d2h_calls, d2d_calls, peer_calls, h2h_calls;
	uint64_t memset_bytes, memset_calls;
	uint64_t allocs, frees;          /* cuMemAlloc / cuMemFree that succeeded */
	uint64_t alloc_bytes, peak_alloc_bytes; /* device memory in use now / at most */
	uint64_t ipc_mem_exports, ipc_mem_opens, ipc_mem_closes;
	uint64_t ipc_event_exports, ipc_event_opens;
	uint64_t event_records, stream_waits; /* cuEventRecord, cuStreamWaitEvent */
	uint64_t getproc_lookups;        /* cuGetProcAddress calls */
	uint64_t api_calls;              /* driver API calls (all entry points) */
	uint64_t ipc_freed_while_open;   /* cuMemFree of memory a live process had open through IPC (v2) */
	uint64_t ipc_lost_at_exit;       /* allocations a live process had open through IPC when we exited, or
					  * when their context was reset or released for the last time (v3) */
	uint64_t ipc_read_lost;          /* copies out of an IPC mapping whose exporter had freed it or exited (v3) */
};

#ifdef __cplusplus
extern "C" {
#endif
/* Fill *out with this process's counters. Returns 0, or -1 when out is NULL
 * (or, from libcudart, when the driver cannot be loaded). */
int tsemu_stats(struct tsemu_stats *out);
#ifdef __cplusplus
}
#endif

#endif
