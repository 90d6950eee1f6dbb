/* SPDX-License-Identifier: MIT */
/* Dataset scope: path normalisation, membership, detection. */
#include <criterion/criterion.h>
#include <errno.h>
#include <string.h>

#include "scope.h"

static const char *norm(const char *cwd, const char *path)
{
	static char out[TS_SCOPE_PATH_MAX];
	int ret = ts_path_normalize(cwd, path, out, sizeof(out));
	return ret ? strerror(-ret) : out;
}

Test(scope, normalize)
{
	cr_assert_str_eq(norm(NULL, "/a/b/c.jpg"), "/a/b/c.jpg");
	cr_assert_str_eq(norm(NULL, "//a///b/./c/"), "/a/b/c");
	cr_assert_str_eq(norm(NULL, "/a/b/../c"), "/a/c");
	cr_assert_str_eq(norm(NULL, "/../../a"), "/a", "'..' never climbs above the root");
	cr_assert_str_eq(norm(NULL, "/"), "/");
	cr_assert_str_eq(norm("/home/u", "data/train/x.jpg"), "/home/u/data/train/x.jpg");
	cr_assert_str_eq(norm("/home/u/", "../v/./d"), "/home/v/d");
	cr_assert_str_eq(norm(NULL, "relative"), strerror(EINVAL), "relative without a cwd");
	char tiny[8];
	cr_assert_eq(ts_path_normalize(NULL, "/abcdefgh/ijk", tiny, sizeof(tiny)), -ENAMETOOLONG);
}

Test(scope, contains_respects_component_boundaries)
{
	struct ts_scope s;
	const char *roots[] = { "/data/train/", "/mnt//val" };
	cr_assert_eq(ts_scope_set(&s, roots, 2), 0);
	cr_assert_str_eq(s.root[0], "/data/train");
	cr_assert_str_eq(s.root[1], "/mnt/val");
	cr_assert(ts_scope_contains(&s, "/data/train/c1/0.jpg"));
	cr_assert(ts_scope_contains(&s, "/data/train"));
	cr_assert(ts_scope_contains(&s, "/mnt/val/x"));
	cr_assert_not(ts_scope_contains(&s, "/data/training/c1/0.jpg"), "a sibling with the same prefix");
	cr_assert_not(ts_scope_contains(&s, "/data"));
	cr_assert_not(ts_scope_contains(&s, "/etc/passwd"));
	const char *rel[] = { "data" };
	cr_assert_eq(ts_scope_set(&s, rel, 1), -EINVAL);
	const char *all[] = { "/" };
	cr_assert_eq(ts_scope_set(&s, all, 1), 0);
	cr_assert(ts_scope_contains(&s, "/anything/at/all"));
}

Test(scope, jpeg_names)
{
	cr_assert(ts_path_is_jpeg("/d/a.jpg"));
	cr_assert(ts_path_is_jpeg("/d/a.JPEG"));
	cr_assert(ts_path_is_jpeg("/d/a.b.Jpg"));
	cr_assert_not(ts_path_is_jpeg("/d/a.png"));
	cr_assert_not(ts_path_is_jpeg("/d.jpg/a"));
	cr_assert_not(ts_path_is_jpeg("/d/jpg"));
}

static const char *detect(const char *const *paths, int n, int *done)
{
	static struct ts_scope_detector d;
	memset(&d, 0, sizeof(d));
	*done = 0;
	for (int i = 0; i < n; i++)
		*done = ts_scope_detect_add(&d, paths[i]);
	return d.common;
}

Test(scope, detection_finds_deepest_common_directory)
{
	int done;
	const char *imagefolder[] = { "/r/train/c3/1.jpg", "/r/train/c1/7.jpg", "/r/train/c3/2.jpg",
				      "/r/train/c0/0.jpg", "/r/train/c2/5.jpg", "/r/train/c1/1.jpg",
				      "/r/train/c9/4.jpg", "/r/train/c4/4.jpg" };
	cr_assert_str_eq(detect(imagefolder, 8, &done), "/r/train");
	cr_assert_eq(done, 1, "eight files fix the scope");
	cr_assert_str_eq(detect(imagefolder, 1, &done), "/r/train/c3");
	cr_assert_eq(done, 0);
	const char *onedir[64];
	for (int i = 0; i < 64; i++)
		onedir[i] = "/r/val/x.jpg";
	cr_assert_str_eq(detect(onedir, 8, &done), "/r/val");
	cr_assert_eq(done, 0, "eight files of one directory may be one class of many");
	cr_assert_str_eq(detect(onedir, 64, &done), "/r/val");
	cr_assert_eq(done, 1, "sixty-four files of one directory: that directory is the scope");
	const char *similar[] = { "/r/train/c1/a.jpg", "/r/train/c10/b.jpg" };
	cr_assert_str_eq(detect(similar, 2, &done), "/r/train", "c1 is not a prefix directory of c10");
	const char *sib[] = { "/a/bc/x.jpg", "/a/b/y.jpg" };
	cr_assert_str_eq(detect(sib, 2, &done), "/a");
	const char *root[] = { "/x/1.jpg", "/y/2.jpg" };
	cr_assert_str_eq(detect(root, 2, &done), "/");
	const char *top[] = { "/1.jpg", "/2.jpg" };
	cr_assert_str_eq(detect(top, 2, &done), "/");
	/* two top-level trees: "/" is never announced, however many files come */
	const char *trees[64];
	for (int i = 0; i < 64; i++)
		trees[i] = i % 2 ? "/tmp/a/c1/x.jpg" : "/var/tmp/b/c2/y.jpg";
	cr_assert_str_eq(detect(trees, 64, &done), "/");
	cr_assert_eq(done, 0, "a scope of / is no dataset");
}
