/* SPDX-License-Identifier: MIT */
/*
 * ts-jpegedge: legal but unusual libjpeg call sequences that a decode cache
 * must not get wrong. Each prints "TAG WxH HASH warnings=N"; the scenario
 * compares every line with a run without the shim.
 *   plain A           decode A (fills the cache under the shim)
 *   abort-reuse A     start A, jpeg_abort, decode A with another DCT method
 *   abort-other A B   start A, jpeg_abort, decode B on the same object
 *   trunc A           decode the first 3/4 of A's bytes
 *   dither A          RGB565 output with and without dithering
 *   concat AB         a file holding two JPEGs one after the other: decode both
 */
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

/* Decode the image whose header was read; print it. */
static void finish_image(j_decompress_ptr c, const char *tag)
{
	jpeg_start_decompress(c);
	size_t row = (size_t)c->output_width * (size_t)c->output_components;
	unsigned char *img = calloc(row, c->output_height);
	while (c->output_scanline < c->output_height) {
		JSAMPROW r = img + row * c->output_scanline;
		if (jpeg_read_scanlines(c, &r, 1) != 1)
			break;
	}
	jpeg_finish_decompress(c);
	printf("%s %ux%u %016llx warnings=%ld\n", tag, c->output_width, c->output_height,
	       (unsigned long long)ts_hash64(img, row * c->output_height, 3), c->err->num_warnings);
	free(img);
}

static void header(j_decompress_ptr c, const unsigned char *buf, size_t len)
{
	jpeg_mem_src(c, buf, (unsigned long)len);
	jpeg_read_header(c, TRUE);
}

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: ts-jpegedge plain|abort-reuse|abort-other|trunc|dither|concat A [B]\n");
		return 2;
	}
	const char *mode = argv[1];
	size_t la, lb = 0;
	/* B is read only when it is used: what a thread read last is what the
	 * shim can prove a buffer to be. */
	unsigned char *a = slurp(argv[2], &la), *b = NULL;
	struct jpeg_decompress_struct c;
	struct err e;
	c.err = jpeg_std_error(&e.pub);
	e.pub.error_exit = on_error;
	e.pub.emit_message = count_warning;
	if (setjmp(e.jb)) {
		printf("%s error %d\n", mode, e.pub.msg_code);
		jpeg_destroy_decompress(&c);
		return 0;
	}
	jpeg_create_decompress(&c);
	if (!strcmp(mode, "plain")) {
		header(&c, a, la);
		finish_image(&c, "plain");
	} else if (!strcmp(mode, "abort-reuse") || (!strcmp(mode, "abort-other") && argc > 3)) {
		header(&c, a, la);
		jpeg_start_decompress(&c);
		jpeg_abort((j_common_ptr)&c); /* legal: back to the start state */
		if (argc > 3) {
			b = slurp(argv[3], &lb);
			header(&c, b, lb);
		} else {
			header(&c, a, la);
			c.dct_method = JDCT_IFAST;
		}
		finish_image(&c, mode);
	} else if (!strcmp(mode, "trunc")) {
		header(&c, a, la * 3 / 4);
		finish_image(&c, "trunc");
	} else if (!strcmp(mode, "dither")) {
		for (int d = 0; d < 2; d++) {
			header(&c, a, la);
			c.out_color_space = JCS_RGB565;
			c.dither_mode = d ? JDITHER_NONE : JDITHER_FS;
			finish_image(&c, d ? "dither-none" : "dither-fs");
		}
	} else if (!strcmp(mode, "concat")) {
		header(&c, a, la);
		finish_image(&c, "concat-1");
		jpeg_read_header(&c, TRUE);
		finish_image(&c, "concat-2");
	} else {
		fprintf(stderr, "ts-jpegedge: unknown mode %s\n", mode);
		return 2;
	}
	jpeg_destroy_decompress(&c);
	free(a);
	free(b);
	return 0;
}
