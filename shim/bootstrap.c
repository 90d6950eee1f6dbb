/* SPDX-License-Identifier: MIT */
/*
 * Python bootstrap, C half (issue 4, PRODUCT.md section 4): when the shim is
 * loaded into a Python interpreter, make Python load our sitecustomize.py at
 * start-up, the way auto-instrumentation tools do, by putting its directory
 * first on PYTHONPATH. Runs once, from the constructor, before main: the
 * process is still single-threaded, so setenv is safe.
 *
 * PYTHONPATH contract (the Python half, shim/python/sitecustomize.py, undoes
 * what is done here, so the program and its children see the user's value):
 *
 *   - PYTHONPATH becomes "<dir>:<original>" ("<dir>" when it was unset or
 *     empty); <dir> is absolute and canonical (realpath), so it survives a
 *     chdir and compares equal across an exec chain.
 *   - _TSSHIM_ORIG_PYTHONPATH holds the original value when there was one
 *     (even empty) and is removed when there was none. The leading '_' keeps
 *     it out of the TSSHIM_* names the shim checks for typos.
 *   - Nothing happens when <dir> is already the first entry: an exec'd Python
 *     whose parent was started with -S or -E (so never restored the variable)
 *     inherits a consistent pair and must not get the prefix twice.
 *
 * Python started with -E or -I ignores PYTHONPATH, and with -S never imports
 * sitecustomize (so never restores the variable): no bootstrap there, and
 * the environment its children inherit stays the user's.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sys/syscall.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "real.h"
#include "shim.h"

#define TS_ORIG_VAR "_TSSHIM_ORIG_PYTHONPATH"

extern char *program_invocation_short_name;

/*
 * python, python3, python3.11, python3.11d, python3.13t, python3-dbg ...:
 * "python", then digits and dots, then at most a short ABI suffix.
 */
static int python_name(const char *base)
{
	if (strncmp(base, "python", 6) != 0)
		return 0;
	const char *p = base + 6;
	if (*p == '2')
		return 0; /* Python 2: the layer is Python 3's, and its sitecustomize would shadow the user's */
	p += strspn(p, "0123456789.");
	return *p == '\0' || strcmp(p, "d") == 0 || strcmp(p, "t") == 0 || strcmp(p, "m") == 0 ||
	       strcmp(p, "-dbg") == 0;
}

/*
 * The binary actually running, not argv[0] (which can be anything): a
 * pyenv shim is a bash script, so bash is running and we do nothing; the
 * real python it execs loads the shim again and gets here.
 */
static int is_python_process(void)
{
	char exe[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	if (n > 0) {
		exe[n] = '\0';
		const char *slash = strrchr(exe, '/');
		return python_name(slash ? slash + 1 : exe);
	}
	return python_name(program_invocation_short_name); /* no /proc */
}

/*
 * Did the interpreter's command line give -E, -I or -S (alone or among
 * other flags, "-IEs")? Options end at the script, "-", "--", or the
 * argument of -c or -m; -W and -X take one (attached or the next word).
 */
static int python_skips_site_or_env(void)
{
	char buf[4096];
	int fd = (int)syscall(SYS_openat, AT_FDCWD, "/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	ssize_t n = syscall(SYS_read, fd, buf, sizeof(buf) - 1);
	syscall(SYS_close, fd);
	if (n <= 0)
		return 0;
	buf[n] = '\0';
	const char *end = buf + n, *a = buf + strlen(buf) + 1; /* past argv[0] */
	int skip_next = 0;
	for (; a < end; a += strlen(a) + 1) {
		if (skip_next) {
			skip_next = 0;
			continue;
		}
		if (a[0] != '-' || !strcmp(a, "-") || !strcmp(a, "--"))
			return 0;
		if (a[1] == '-') { /* a long option; only this one takes an argument */
			skip_next = !strcmp(a, "--check-hash-based-pycs");
			continue;
		}
		for (const char *c = a + 1; *c; c++) {
			if (strchr("EIS", *c))
				return 1;
			if (*c == 'c' || *c == 'm')
				return 0;
			if (*c == 'W' || *c == 'X') {
				skip_next = c[1] == '\0';
				break;
			}
		}
	}
	return 0;
}

/* Python already running (the shim dlopen'ed late): PYTHONPATH was read. */
static int python_already_initialized(void)
{
	int (*initialized)(void) = (int (*)(void))ts_real_dlsym(RTLD_DEFAULT, "Py_IsInitialized");
	return initialized && initialized();
}

/* <libdir>/python or <libdir>/tsshim/python, where sitecustomize.py is. */
static int find_python_dir(char *out, size_t outlen)
{
	static const char *const subdirs[] = { "python", "tsshim/python" };
	Dl_info info;
	if (!dladdr((void *)find_python_dir, &info) || !info.dli_fname)
		return -ENOENT;
	char lib[PATH_MAX];
	if (!realpath(info.dli_fname, lib)) /* LD_PRELOAD may be relative */
		return -errno;
	char *slash = strrchr(lib, '/');
	if (!slash)
		return -ENOENT;
	*slash = '\0';
	for (size_t i = 0; i < sizeof(subdirs) / sizeof(subdirs[0]); i++) {
		char file[PATH_MAX];
		if (snprintf(file, sizeof(file), "%s/%s/sitecustomize.py", lib, subdirs[i]) >= (int)sizeof(file))
			continue;
		if (access(file, R_OK) != 0)
			continue;
		*strrchr(file, '/') = '\0';
		if (strlen(file) >= outlen)
			return -ENAMETOOLONG;
		memcpy(out, file, strlen(file) + 1);
		return 0;
	}
	return -ENOENT;
}

int ts_is_python;

void ts_bootstrap_python(void)
{
	ts_is_python = is_python_process();
	if (!ts_cfg.python || !ts_shim_ready() || !ts_is_python || python_already_initialized())
		return;
	if (python_skips_site_or_env()) {
		ts_debug("python: started with -E, -I or -S: no bootstrap (PYTHONPATH left as it is)");
		return;
	}
	char dir[PATH_MAX];
	int ret = find_python_dir(dir, sizeof(dir));
	if (ret) {
		ts_debug("python: no bootstrap directory next to the library (%s)", strerror(-ret));
		return;
	}
	if (strchr(dir, ':')) {
		ts_debug("python: bootstrap directory %s contains ':', cannot go on PYTHONPATH", dir);
		return;
	}
	const char *orig = getenv("PYTHONPATH");
	size_t dl = strlen(dir);
	if (orig && strncmp(orig, dir, dl) == 0 && (orig[dl] == ':' || orig[dl] == '\0')) {
		ts_debug("python: %s already first on PYTHONPATH", dir);
		return;
	}
	size_t ol = orig ? strlen(orig) : 0;
	char *value = malloc(dl + 1 + ol + 1);
	if (!value)
		return;
	memcpy(value, dir, dl + 1);
	if (ol) {
		value[dl] = ':';
		memcpy(value + dl + 1, orig, ol + 1);
	}
	/* The original first: once PYTHONPATH is set, orig may be freed. */
	if ((orig ? setenv(TS_ORIG_VAR, orig, 1) : unsetenv(TS_ORIG_VAR)) != 0 ||
	    setenv("PYTHONPATH", value, 1) != 0)
		ts_debug("python: cannot set PYTHONPATH: %s", strerror(errno));
	else
		ts_debug("python: bootstrap from %s", dir);
	free(value);
}
