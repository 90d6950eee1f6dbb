/* SPDX-License-Identifier: MIT */
/*
 * The part of Criterion's API the unit suites use, for the ThreadSanitizer
 * build only (make tsan). Criterion itself cannot start under TSan: its
 * BoxFort arena maps shared memory at random fixed addresses, which fall in
 * the ranges TSan reserves ("Could not initialize inheritable arena",
 * Snaipe/Criterion#274). The suites compile unchanged against this header
 * (found first through -isystem tests/tsan, so, like Criterion's, its macro
 * expansions are a system header's) and link tests/tsan/harness.c, which runs
 * every test in a forked child as Criterion does: suite .init, test .init,
 * the test, test .fini, suite .fini; .timeout or --timeout bounds it.
 *
 * cr_assert* ends the test at the first failure, cr_expect* records it and
 * goes on; an optional printf-style message follows the operands.
 */
#ifndef TSSHIM_TSAN_CRITERION_H
#define TSSHIM_TSAN_CRITERION_H

#include <stddef.h>
#include <string.h>

struct tsh_config {
	void (*init)(void);
	void (*fini)(void);
	double timeout; /* seconds; 0: the suite's, else --timeout */
};

struct tsh_test {
	const char *suite, *name;
	void (*fn)(void);
	struct tsh_config cfg;
	struct tsh_test *next;
};

struct tsh_suite {
	const char *name;
	struct tsh_config cfg;
	struct tsh_suite *next;
};

void tsh_register_test(struct tsh_test *t);
void tsh_register_suite(struct tsh_suite *s);
void tsh_fail(const char *file, int line, const char *what, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
void tsh_abort(const char *file, int line, const char *what, const char *fmt, ...)
	__attribute__((format(printf, 4, 5), noreturn));
void tsh_skip(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
void tsh_log(const char *level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define Test(suite, name, ...)                                                                      \
	static void tsh_fn_##suite##_##name(void);                                                  \
	static struct tsh_test tsh_test_##suite##_##name = { #suite, #name, tsh_fn_##suite##_##name, \
							     { __VA_ARGS__ }, NULL };               \
	__attribute__((constructor)) static void tsh_reg_##suite##_##name(void)                     \
	{                                                                                           \
		tsh_register_test(&tsh_test_##suite##_##name);                                      \
	}                                                                                           \
	static void tsh_fn_##suite##_##name(void)

#define TestSuite(suite, ...)                                                                   \
	static struct tsh_suite tsh_suite_##suite = { #suite, { __VA_ARGS__ }, NULL };          \
	__attribute__((constructor)) static void tsh_regsuite_##suite(void)                     \
	{                                                                                       \
		tsh_register_suite(&tsh_suite_##suite);                                         \
	}                                                                                       \
	struct tsh_suite_##suite##_unused

/* The message is optional: " " starts the format whether or not one follows. */
#define TSH_CHECK(fatal, cond, what, ...)                                                  \
	do {                                                                               \
		if (!(cond)) {                                                             \
			if (fatal)                                                         \
				tsh_abort(__FILE__, __LINE__, what, " " __VA_ARGS__);       \
			tsh_fail(__FILE__, __LINE__, what, " " __VA_ARGS__);               \
		}                                                                          \
	} while (0)

#define cr_assert(c, ...)          TSH_CHECK(1, (c), #c, __VA_ARGS__)
#define cr_expect(c, ...)          TSH_CHECK(0, (c), #c, __VA_ARGS__)
#define cr_assert_not(c, ...)      TSH_CHECK(1, !(c), "!(" #c ")", __VA_ARGS__)
#define cr_expect_not(c, ...)      TSH_CHECK(0, !(c), "!(" #c ")", __VA_ARGS__)
#define cr_assert_null(p, ...)     TSH_CHECK(1, (p) == NULL, #p " == NULL", __VA_ARGS__)
#define cr_expect_null(p, ...)     TSH_CHECK(0, (p) == NULL, #p " == NULL", __VA_ARGS__)
#define cr_assert_not_null(p, ...) TSH_CHECK(1, (p) != NULL, #p " != NULL", __VA_ARGS__)
#define cr_expect_not_null(p, ...) TSH_CHECK(0, (p) != NULL, #p " != NULL", __VA_ARGS__)
#define TSH_OP(fatal, op, a, b, ...) TSH_CHECK(fatal, (a) op (b), #a " " #op " " #b, __VA_ARGS__)
#define cr_assert_eq(a, b, ...)    TSH_OP(1, ==, a, b, __VA_ARGS__)
#define cr_expect_eq(a, b, ...)    TSH_OP(0, ==, a, b, __VA_ARGS__)
#define cr_assert_neq(a, b, ...)   TSH_OP(1, !=, a, b, __VA_ARGS__)
#define cr_expect_neq(a, b, ...)   TSH_OP(0, !=, a, b, __VA_ARGS__)
#define cr_assert_lt(a, b, ...)    TSH_OP(1, <, a, b, __VA_ARGS__)
#define cr_expect_lt(a, b, ...)    TSH_OP(0, <, a, b, __VA_ARGS__)
#define cr_assert_leq(a, b, ...)   TSH_OP(1, <=, a, b, __VA_ARGS__)
#define cr_expect_leq(a, b, ...)   TSH_OP(0, <=, a, b, __VA_ARGS__)
#define cr_assert_gt(a, b, ...)    TSH_OP(1, >, a, b, __VA_ARGS__)
#define cr_expect_gt(a, b, ...)    TSH_OP(0, >, a, b, __VA_ARGS__)
#define cr_assert_geq(a, b, ...)   TSH_OP(1, >=, a, b, __VA_ARGS__)
#define cr_expect_geq(a, b, ...)   TSH_OP(0, >=, a, b, __VA_ARGS__)
#define cr_assert_str_eq(a, b, ...) TSH_CHECK(1, strcmp((a), (b)) == 0, #a " equals " #b, __VA_ARGS__)
#define cr_expect_str_eq(a, b, ...) TSH_CHECK(0, strcmp((a), (b)) == 0, #a " equals " #b, __VA_ARGS__)

#define cr_skip_test(...) tsh_skip(" " __VA_ARGS__)
#define cr_log_info(...)  tsh_log("info", __VA_ARGS__)
#define cr_log_warn(...)  tsh_log("warn", __VA_ARGS__)

#endif
