/* SPDX-License-Identifier: MIT */
/*
 * ts-jpegcheck: decode every JPEG under the given paths with every output
 * variant Pillow and torchvision use (scale 1/1..1/8; RGB, RGBX, gray,
 * YCbCr; DCT methods; fancy upsampling on and off) and print one line per
 * decode: "FILE VARIANT PASS WxHxC HASH" (or "error N" where libjpeg
 * refuses the conversion). Run once without the shim for the reference and
 * once under it in exact mode with --passes 2 (a fill, then a hit): every
 * line must match the reference. Reads each file with open/read, as
 * loaders do, so the shim can prove what is decoded.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jpeglib.h>

#include "hash.h"
#include "jpegtest.h"

struct variant {
	const char *name;
	J_COLOR_SPACE out;
	unsigned denom;
	J_DCT_METHOD dct;
	boolean fancy;
};

static const struct variant variants[] = {
	{ "rgb-1", JCS_RGB, 1, JDCT_ISLOW, TRUE },       { "rgb-2", JCS_RGB, 2, JDCT_ISLOW, TRUE },
	{ "rgb-4", JCS_RGB, 4, JDCT_ISLOW, TRUE },       { "rgb-8", JCS_RGB, 8, JDCT_ISLOW, TRUE },
	{ "rgbx-1", JCS_EXT_RGBX, 1, JDCT_ISLOW, TRUE }, { "rgbx-4", JCS_EXT_RGBX, 4, JDCT_ISLOW, TRUE },
	{ "gray-1", JCS_GRAYSCALE, 1, JDCT_ISLOW, TRUE }, { "gray-2", JCS_GRAYSCALE, 2, JDCT_ISLOW, TRUE },
	{ "ycc-1", JCS_YCbCr, 1, JDCT_ISLOW, TRUE },     { "ycc-8", JCS_YCbCr, 8, JDCT_ISLOW, TRUE },
	{ "rgb-1-ifast", JCS_RGB, 1, JDCT_IFAST, TRUE }, { "rgb-1-float", JCS_RGB, 1, JDCT_FLOAT, TRUE },
	{ "rgb-1-nofancy", JCS_RGB, 1, JDCT_ISLOW, FALSE }, { "rgb-2-nofancy", JCS_RGB, 2, JDCT_ISLOW, FALSE },
};

static void decode(const char *path, const struct variant *v, int pass)
{
	size_t len;
	unsigned char *const buf = slurp(path, &len);
	unsigned char *volatile img = NULL; /* set after setjmp, freed after longjmp */
	struct jpeg_decompress_struct c;
	struct err e;
	c.err = jpeg_std_error(&e.pub);
	e.pub.error_exit = on_error;
	e.pub.emit_message = count_warning;
	if (setjmp(e.jb)) {
		printf("%s %s %d error %d\n", path, v->name, pass, e.pub.msg_code);
		jpeg_destroy_decompress(&c);
		free((void *)img);
		free(buf);
		return;
	}
	jpeg_create_decompress(&c);
	jpeg_mem_src(&c, buf, (unsigned long)len);
	jpeg_read_header(&c, TRUE);
	c.out_color_space = v->out;
	c.scale_num = 1;
	c.scale_denom = v->denom;
	c.dct_method = v->dct;
	c.do_fancy_upsampling = v->fancy;
	jpeg_start_decompress(&c);
	size_t row = (size_t)c.output_width * (size_t)c.output_components;
	img = malloc(row * c.output_height);
	while (c.output_scanline < c.output_height) {
		JSAMPROW r = (JSAMPROW)img + row * c.output_scanline;
		jpeg_read_scanlines(&c, &r, 1);
	}
	jpeg_finish_decompress(&c);
	printf("%s %s %d %ux%ux%d %016llx warnings=%ld\n", path, v->name, pass, c.output_width, c.output_height,
	       c.output_components, (unsigned long long)ts_hash64((const void *)img, row * c.output_height, 7),
	       e.pub.num_warnings);
	jpeg_destroy_decompress(&c);
	free((void *)img);
	free(buf);
}

static int by_name(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static void walk(const char *path, int passes)
{
	struct stat sb;
	if (stat(path, &sb) != 0)
		return;
	if (S_ISREG(sb.st_mode)) {
		size_t l = strlen(path);
		if (l > 4 && strcmp(path + l - 4, ".jpg") == 0)
			for (int p = 0; p < passes; p++)
				for (size_t i = 0; i < sizeof(variants) / sizeof(*variants); i++)
					decode(path, &variants[i], p);
		return;
	}
	DIR *d = opendir(path);
	if (!d)
		return;
	char **names = NULL;
	size_t n = 0;
	struct dirent *de;
	while ((de = readdir(d)) != NULL) {
		if (de->d_name[0] == '.')
			continue;
		names = realloc(names, (n + 1) * sizeof(*names));
		names[n] = malloc(strlen(path) + strlen(de->d_name) + 2);
		sprintf(names[n++], "%s/%s", path, de->d_name);
	}
	closedir(d);
	qsort(names, n, sizeof(*names), by_name);
	for (size_t i = 0; i < n; i++) {
		walk(names[i], passes);
		free(names[i]);
	}
	free(names);
}

int main(int argc, char **argv)
{
	int passes = 1, i = 1;
	if (argc > 2 && strcmp(argv[1], "--passes") == 0) {
		passes = atoi(argv[2]);
		i = 3;
	}
	if (i >= argc || passes < 1) {
		fprintf(stderr, "usage: ts-jpegcheck [--passes N] PATH...\n"
				"Decode every .jpg under PATH in %zu output variants; one line per decode.\n",
			sizeof(variants) / sizeof(*variants));
		return 2;
	}
	for (; i < argc; i++)
		walk(argv[i], passes);
	return 0;
}
