/* SPDX-License-Identifier: MIT */
/*
 * ts-tworuntimes PLUGIN12 PLUGINNOV: two CUDA runtimes in one process, as a
 * job has whose extension was built for another CUDA than the one it runs.
 * This program links libcudart.so.13 (tsemu's: the global scope's) and
 * loads plugins RTLD_LOCAL, as Python loads extension modules, each linked
 * against its own runtime, a stand-in that counts its copies and answers
 * 1212 with errno ERANGE (tests/helpers/lib/ts-cudart12.c):
 *   PLUGIN12   libts-cudaplugin12.so, whose libcudart.so.12 exports under
 *              the version node libcudart.so.12, as the real one does: the
 *              global 13 does not match its references, its copies run in 12
 *   PLUGINNOV  libts-cudapluginnov.so, whose runtime has no versions: its
 *              references match the global 13 first, its copies run there
 * One at a time, each unloaded (dlclose) before the next is loaded:
 * PLUGIN12, PLUGINNOV (which glibc maps where PLUGIN12 was, under the same
 * link_map, unless ASan's malloc is in), PLUGIN12 again. Each copy must run
 * where it runs without the shim, with that runtime's return code and errno.
 *
 * One line per copy, the same with and without the shim:
 *   "WHO CALL: rt13=N rt12=M rc=R errno=E"
 * (rt13: copies tsemu ran, rt12: copies the loaded plugin's stand-in ran;
 * errno after the copy: for the program's own "kept" when it is the value
 * set before, then the data is read back), a line "note ..." saying whether
 * PLUGINNOV took PLUGIN12's place, then "shim runtime=N h2d=M" (the shim's
 * counts over the whole run) or "shim none". Exit 0 when every copy ran
 * where it belongs, 1 when one did not, 2 on a set-up error.
 */
#include <cuda_runtime_api.h>

#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "../../tools/cudaemu/tsemu.h"
#include "cuda_hooks.h" /* struct tsshim_cuda_stats only: found with dlsym */

#define ERRNO_MARK 4242
#define N 4096

static int fails;

/* The plugin loaded now, if any. */
static struct plugin {
	void *h;
	int (*copy)(int async, void *dev, int *err);
	int (*calls)(void);
} plugin;

static uint64_t rt13_copies(void)
{
	struct tsemu_stats s = {0};
	return tsemu_stats(&s) == 0 ? s.h2d_calls : 0;
}

/* Copies the loaded plugin's stand-in ran (none runs without one). */
static int rt12_copies(void)
{
	return plugin.calls ? plugin.calls() : 0;
}

static const char *errno_name(int err)
{
	return err == ERRNO_MARK ? "kept" : err == ERANGE ? "ERANGE" : err == 0 ? "0" : strerror(err);
}

/* A copy by this program: through libcudart.so.13 to the device and back. */
static void main_copy(const char *what, int async)
{
	static unsigned char host[N], back[N];
	void *d = NULL;
	cudaStream_t s = NULL;
	for (int i = 0; i < N; i++)
		host[i] = (unsigned char)(i * 13 + 1);
	if (cudaMalloc(&d, N) != cudaSuccess || cudaStreamCreate(&s) != cudaSuccess) {
		fprintf(stderr, "ts-tworuntimes: cudaMalloc or cudaStreamCreate failed\n");
		fails++;
		return;
	}
	uint64_t r13 = rt13_copies();
	int r12 = rt12_copies();
	errno = ERRNO_MARK;
	cudaError_t rc = async ? cudaMemcpyAsync(d, host, N, cudaMemcpyHostToDevice, s)
			       : cudaMemcpy(d, host, N, cudaMemcpyHostToDevice);
	int err = errno;
	if (async)
		(void)cudaStreamSynchronize(s);
	int same = cudaMemcpy(back, d, N, cudaMemcpyDeviceToHost) == cudaSuccess && !memcmp(host, back, N);
	uint64_t ran13 = rt13_copies() - r13;
	int ran12 = rt12_copies() - r12;
	printf("%s: rt13=%llu rt12=%d rc=%d errno=%s data=%s\n", what, (unsigned long long)ran13, ran12, (int)rc,
	       errno_name(err), same ? "ok" : "wrong");
	if (ran13 != 1 || ran12 != 0 || rc != cudaSuccess || err != ERRNO_MARK || !same)
		fails++;
	cudaStreamDestroy(s);
	cudaFree(d);
}

/* A copy by the loaded plugin, to device memory; ran in 12 (1) or in 13 (0). */
static void plugin_copy(const char *who, const char *call, int async, int in12)
{
	void *d = NULL;
	if (cudaMalloc(&d, N) != cudaSuccess) {
		fprintf(stderr, "ts-tworuntimes: cudaMalloc failed\n");
		fails++;
		return;
	}
	uint64_t r13 = rt13_copies();
	int r12 = rt12_copies(), err = 0;
	int rc = plugin.copy(async, d, &err);
	(void)cudaDeviceSynchronize(); /* tsemu counts a copy once its worker ran it */
	uint64_t ran13 = rt13_copies() - r13;
	int ran12 = rt12_copies() - r12;
	printf("%s %s: rt13=%llu rt12=%d rc=%d errno=%s\n", who, call, (unsigned long long)ran13, ran12, rc,
	       errno_name(err));
	if (in12 ? ran13 != 0 || ran12 != 1 || rc != 1212 || err != ERANGE
		 : ran13 != 1 || ran12 != 0 || rc != cudaSuccess)
		fails++;
	cudaFree(d);
}

/* Load plugin `path`: its copies, one of the program's beside it, unload.
 * *where: its link_map and mapping start, to tell where it was loaded. */
static int plugin_round(const char *who, const char *path, int in12, void *where[2])
{
	char what[64];
	plugin.h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!plugin.h) {
		fprintf(stderr, "ts-tworuntimes: %s\n", dlerror());
		return -1;
	}
	plugin.copy = (int (*)(int, void *, int *))dlsym(plugin.h, "ts_plugin12_copy");
	plugin.calls = (int (*)(void))dlsym(plugin.h, "ts_plugin12_calls");
	struct link_map *m = NULL;
	Dl_info info;
	if (!plugin.copy || !plugin.calls || dlinfo(plugin.h, RTLD_DI_LINKMAP, &m) != 0 ||
	    !dladdr((void *)plugin.copy, &info)) {
		fprintf(stderr, "ts-tworuntimes: %s: not the plugin\n", path);
		return -1;
	}
	where[0] = m;
	where[1] = info.dli_fbase;
	plugin_copy(who, "cudaMemcpy", 0, in12);
	plugin_copy(who, "cudaMemcpyAsync", 1, in12);
	snprintf(what, sizeof what, "main beside %s cudaMemcpy", who);
	main_copy(what, 0);
	int r = dlclose(plugin.h);
	plugin = (struct plugin){0};
	return r;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc != 3) {
		fprintf(stderr, "usage: ts-tworuntimes PLUGIN12 PLUGINNOV\n");
		return 2;
	}
	void *at12[2], *atnov[2], *again[2];
	main_copy("main cudaMemcpy", 0);
	main_copy("main cudaMemcpyAsync", 1);
	if (plugin_round("plugin12", argv[1], 1, at12) || plugin_round("pluginnov", argv[2], 0, atnov) ||
	    plugin_round("plugin12 again", argv[1], 1, again))
		return 2;
	main_copy("main again cudaMemcpy", 0);
	main_copy("main again cudaMemcpyAsync", 1);
	printf("note pluginnov %s\n", atnov[0] == at12[0] && atnov[1] == at12[1]
					      ? "took plugin12's link_map and address"
					      : "was loaded elsewhere");

	int (*stats)(struct tsshim_cuda_stats *, size_t) =
		(int (*)(struct tsshim_cuda_stats *, size_t))dlsym(RTLD_DEFAULT, "tsshim_cuda_stats");
	struct tsshim_cuda_stats st = {0};
	if (stats && stats(&st, sizeof st) == 0)
		printf("shim runtime=%llu h2d=%llu\n", (unsigned long long)st.runtime_copies,
		       (unsigned long long)st.h2d_copies);
	else
		printf("shim none\n");
	return fails ? 1 : 0;
}
