/* SPDX-License-Identifier: MIT */
/*
 * The runner behind tests/tsan/criterion/criterion.h (make tsan only; see
 * there why). Each test runs in a forked child of this single-threaded
 * runner: exit 0 pass, 77 skipped, anything else (a failed check, a TSan
 * report: exit 66, a signal, the timeout's SIGALRM) fails. Options: those of
 * tests/run.sh (--jobs N is accepted and ignored, --timeout S is the default
 * bound) and --filter SUITE/NAME (fnmatch pattern). TSH_SKIP_FILE names a
 * file of "SUITE/NAME-pattern reason" lines (# comments) to skip, with the
 * reason printed. Prints skips, failures and a Criterion-like synthesis;
 * exits 1 when anything failed.
 */
#include "criterion/criterion.h"

#include <errno.h>
#include <fnmatch.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#define EXIT_SKIP 77

static struct tsh_test *tests, **tests_tail = &tests;
static struct tsh_suite *suites;
static int failed_checks;

void tsh_register_test(struct tsh_test *t)
{
	*tests_tail = t; /* in the order of the source */
	tests_tail = &t->next;
}

void tsh_register_suite(struct tsh_suite *s)
{
	s->next = suites;
	suites = s;
}

static void report(const char *file, int line, const char *what, const char *fmt, va_list ap)
{
	fprintf(stderr, "%s:%d: failed: %s:", file, line, what);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
}

void tsh_fail(const char *file, int line, const char *what, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	report(file, line, what, fmt, ap);
	va_end(ap);
	failed_checks++;
}

void tsh_abort(const char *file, int line, const char *what, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	report(file, line, what, fmt, ap);
	va_end(ap);
	exit(1); /* exit, not _exit: TSan's end-of-process checks still run */
}

void tsh_skip(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "skipped:");
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
	exit(EXIT_SKIP);
}

void tsh_log(const char *level, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "[%s] ", level);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
}

/* The reason id is skipped for, from TSH_SKIP_FILE, or NULL. */
static const char *skip_reason(const char *id)
{
	static char line[512];
	const char *path = getenv("TSH_SKIP_FILE");
	FILE *f = path && *path ? fopen(path, "r") : NULL;
	const char *why = NULL;
	while (f && !why && fgets(line, sizeof(line), f)) {
		line[strcspn(line, "\n")] = 0;
		char *pat = line + strspn(line, " \t");
		if (*pat == '#' || *pat == 0)
			continue;
		char *rest = pat + strcspn(pat, " \t");
		if (*rest)
			*rest++ = 0;
		if (fnmatch(pat, id, 0) == 0)
			why = rest + strspn(rest, " \t");
	}
	if (f)
		fclose(f);
	return why;
}

static const struct tsh_suite *suite_of(const struct tsh_test *t)
{
	for (const struct tsh_suite *s = suites; s; s = s->next)
		if (strcmp(s->name, t->suite) == 0)
			return s;
	return NULL;
}

static void run_child(const struct tsh_test *t, const struct tsh_suite *s, double timeout)
{
	alarm((unsigned)ceil(timeout));
	if (s && s->cfg.init)
		s->cfg.init();
	if (t->cfg.init)
		t->cfg.init();
	t->fn();
	if (t->cfg.fini)
		t->cfg.fini();
	if (s && s->cfg.fini)
		s->cfg.fini();
	exit(failed_checks ? 1 : 0);
}

int main(int argc, char **argv)
{
	double default_timeout = 120;
	const char *filter = NULL;
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--timeout") == 0 && i + 1 < argc)
			default_timeout = atof(argv[++i]);
		else if (strcmp(argv[i], "--jobs") == 0 && i + 1 < argc)
			i++;
		else if (strcmp(argv[i], "--filter") == 0 && i + 1 < argc)
			filter = argv[++i];
		else {
			fprintf(stderr, "usage: %s [--timeout S] [--jobs N] [--filter SUITE/NAME]\n", argv[0]);
			return 2;
		}
	}
	int tested = 0, passed = 0, failed = 0, skipped = 0;
	for (const struct tsh_test *t = tests; t; t = t->next) {
		char id[256];
		snprintf(id, sizeof(id), "%s/%s", t->suite, t->name);
		if (filter && fnmatch(filter, id, 0) != 0)
			continue;
		const char *why = skip_reason(id);
		if (why) {
			tested++;
			skipped++;
			fprintf(stderr, "[SKIP] %s: %s\n", id, why);
			continue;
		}
		const struct tsh_suite *s = suite_of(t);
		double timeout = t->cfg.timeout > 0 ? t->cfg.timeout
				 : s && s->cfg.timeout > 0 ? s->cfg.timeout : default_timeout;
		fflush(NULL);
		pid_t pid = fork();
		if (pid < 0) {
			perror("fork");
			return 1;
		}
		if (pid == 0)
			run_child(t, s, timeout);
		int st;
		while (waitpid(pid, &st, 0) < 0) {
			if (errno != EINTR) {
				perror("waitpid");
				return 1;
			}
		}
		tested++;
		if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
			passed++;
		} else if (WIFEXITED(st) && WEXITSTATUS(st) == EXIT_SKIP) {
			skipped++;
			fprintf(stderr, "[SKIP] %s\n", id);
		} else {
			failed++;
			if (WIFSIGNALED(st))
				fprintf(stderr, "[FAIL] %s: %s%s\n", id, strsignal(WTERMSIG(st)),
					WTERMSIG(st) == SIGALRM ? " (timed out)" : "");
			else
				fprintf(stderr, "[FAIL] %s: exit %d%s\n", id, WEXITSTATUS(st),
					WEXITSTATUS(st) == 66 ? " (ThreadSanitizer report)" : "");
		}
	}
	fprintf(stderr, "[====] Synthesis: Tested: %d | Passing: %d | Failing: %d | Skipped: %d\n", tested,
		passed, failed, skipped);
	return failed ? 1 : 0;
}
