/* SPDX-License-Identifier: MIT */
/*
 * ts-jpegplugins FILE.jpg PLUGIN...: two copies of libjpeg in one process,
 * as a job has whose extension module brings its own. This program links
 * libjpeg.so.62 (the global scope's) and loads each PLUGIN RTLD_LOCAL, as
 * Python loads extension modules, one at a time, each unloaded (dlclose)
 * before the next; each decodes FILE through the copy it is linked against
 * (tests/helpers/lib/ts-jpegplugin.c), a stand-in that counts its calls and
 * decodes every image to 4x2 bytes of 0xf7 (ts-jpegfake.c). Which copy
 * decodes is the linker's choice, by symbol version; the shim's exports,
 * which the plugin's calls reach first, must make the same one.
 *
 * Output, the same with and without the shim:
 *   "main: WxH sum=S"                  the program's own decode
 *   "NAME: WxH sum=S lib=LIB at=WHERE"  a plugin's: LIB "own" when its
 *                                      stand-in took calls, else "global";
 *                                      WHERE "last" when it is mapped where
 *                                      the plugin before it was, else "new"
 * Exit 0, 1 when a decode failed, 2 on a set-up error.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h> /* after stdio.h: it uses FILE */

typedef int (*decode_fn)(const unsigned char *, unsigned long, unsigned *, unsigned *, unsigned long *);

static unsigned char *slurp(const char *path, unsigned long *n)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	unsigned char *buf = NULL;
	if (fseek(f, 0, SEEK_END) == 0 && (*n = (unsigned long)ftell(f)) > 0 && fseek(f, 0, SEEK_SET) == 0 &&
	    (buf = malloc(*n)) && fread(buf, 1, *n, f) != *n) {
		free(buf);
		buf = NULL;
	}
	fclose(f);
	return buf;
}

/* The program's own decode, through the global libjpeg. */
static int decode_main(const unsigned char *jpg, unsigned long n)
{
	struct jpeg_decompress_struct c;
	struct jpeg_error_mgr err;
	c.err = jpeg_std_error(&err);
	jpeg_create_decompress(&c);
	jpeg_mem_src(&c, jpg, n);
	jpeg_read_header(&c, TRUE);
	c.out_color_space = JCS_RGB;
	jpeg_start_decompress(&c);
	size_t row = (size_t)c.output_width * (size_t)c.output_components;
	unsigned char *buf = malloc(row);
	unsigned long sum = 0;
	while (buf && c.output_scanline < c.output_height) {
		JSAMPROW r = buf;
		jpeg_read_scanlines(&c, &r, 1);
		for (size_t i = 0; i < row; i++)
			sum += buf[i];
	}
	printf("main: %ux%u sum=%lu\n", c.output_width, c.output_height, sum);
	fflush(stdout);
	jpeg_finish_decompress(&c);
	jpeg_destroy_decompress(&c);
	free(buf);
	return buf ? 0 : 1;
}

/* Load `path`, decode through it, unload; *where: its mapping. */
static int plugin_round(const char *path, const unsigned char *jpg, unsigned long n, void **where)
{
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	decode_fn decode = h ? (decode_fn)dlsym(h, "ts_jplugin_decode") : NULL;
	int (*fake_calls)(void) = h ? (int (*)(void))dlsym(h, "ts_jplugin_fake_calls") : NULL;
	Dl_info info;
	if (!decode || !fake_calls || !dladdr((void *)decode, &info)) {
		fprintf(stderr, "ts-jpegplugins: %s: %s\n", path, h ? "not the plugin" : dlerror());
		exit(2);
	}
	const char *name = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
	unsigned w = 0, ht = 0;
	unsigned long sum = 0;
	int r = decode(jpg, n, &w, &ht, &sum);
	printf("%s: %ux%u sum=%lu lib=%s at=%s\n", name, w, ht, sum, fake_calls() ? "own" : "global",
	       *where == info.dli_fbase ? "last" : "new");
	fflush(stdout); /* what ran so far, should the next one crash */
	*where = info.dli_fbase;
	if (dlclose(h) != 0) {
		fprintf(stderr, "ts-jpegplugins: dlclose %s: %s\n", path, dlerror());
		exit(2);
	}
	return r != 0;
}

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: ts-jpegplugins FILE.jpg PLUGIN...\n");
		return 2;
	}
	unsigned long n = 0;
	unsigned char *jpg = slurp(argv[1], &n);
	if (!jpg) {
		fprintf(stderr, "ts-jpegplugins: cannot read %s\n", argv[1]);
		return 2;
	}
	int fails = decode_main(jpg, n);
	void *where = NULL;
	for (int i = 2; i < argc; i++)
		fails += plugin_round(argv[i], jpg, n, &where);
	free(jpg);
	return fails ? 1 : 0;
}
