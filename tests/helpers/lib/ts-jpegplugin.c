/* libts-jpegplugin{62,9,nov}.so: an extension module that decodes with its
 * own copy of libjpeg (a ts-jpegfake build, found through its run path),
 * which ts-jpegplugins, a program linked against libjpeg.so.62, loads
 * RTLD_LOCAL as Python loads extension modules. Which copy decodes depends
 * on the copy's symbol versions (ts-jpegfake.c); with the shim its calls
 * bind to the shim's exports, which must pass them on to that same copy. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#include <jpeglib.h>

int ts_jpegfake_calls(void);
int ts_jplugin_decode(const unsigned char *jpg, unsigned long n, unsigned *w, unsigned *h, unsigned long *sum);
int ts_jplugin_fake_calls(void);
int ts_jplugin_probe(void);

/* Decode jpg to RGB: its size, and the sum of its bytes; 0, or -1. */
__attribute__((visibility("default"))) int ts_jplugin_decode(const unsigned char *jpg, unsigned long n,
							     unsigned *w, unsigned *h, unsigned long *sum)
{
	struct jpeg_decompress_struct c;
	struct jpeg_error_mgr err;
	c.err = jpeg_std_error(&err);
	jpeg_create_decompress(&c);
	jpeg_mem_src(&c, jpg, n);
	if (jpeg_read_header(&c, TRUE) != JPEG_HEADER_OK) {
		jpeg_destroy_decompress(&c);
		return -1;
	}
	c.out_color_space = JCS_RGB;
	jpeg_start_decompress(&c);
	size_t row = (size_t)c.output_width * (size_t)c.output_components;
	unsigned char *buf = malloc(row ? row : 1);
	*sum = 0;
	while (buf && c.output_scanline < c.output_height) {
		JSAMPROW r = buf;
		if (jpeg_read_scanlines(&c, &r, 1) != 1)
			break;
		for (size_t i = 0; i < row; i++)
			*sum += buf[i];
	}
	*w = c.output_width;
	*h = c.output_height;
	int done = buf && c.output_scanline == c.output_height;
	free(buf);
	if (done)
		jpeg_finish_decompress(&c);
	jpeg_destroy_decompress(&c);
	return done ? 0 : -1;
}

/* Calls its own copy of libjpeg took. */
__attribute__((visibility("default"))) int ts_jplugin_fake_calls(void)
{
	return ts_jpegfake_calls();
}

/* dlsym(RTLD_DEFAULT) of jpeg_read_header from here, as the man page says
 * to check it: 1 found and dlerror() clear, 0 not found with an error, -1
 * found with an error pending or not found without one. */
__attribute__((visibility("default"))) int ts_jplugin_probe(void)
{
	(void)dlerror();
	void *p = dlsym(RTLD_DEFAULT, "jpeg_read_header");
	const char *err = dlerror();
	return p && !err ? 1 : !p && err ? 0 : -1;
}
