/* A stand-in libjpeg, for the jpeg_libs scenario: the copy a plugin brings
 * along beside the program's own libjpeg.so.62. Built three times: under
 * libjpeg-turbo's version nodes (ts-jpegfake62.map: a reference to it binds
 * to the global libjpeg.so.62 first, as the linker matches versions, not
 * files), under a node the global one lacks (ts-jpegfake9.map: it binds
 * here), and without versions (the global one first). Its "decode" gives a
 * fixed 4x2 image of 0xf7 bytes and counts its calls, so that the caller can
 * tell which library ran. Calls between its exports would bind to the
 * shim's: each export calls only static helpers. */
#include <stdio.h>
#include <string.h>

#include <jpeglib.h>

#define FAKE_W 4
#define FAKE_H 2
#define FAKE_BYTE 0xf7
#define FAKE_READY 202 /* libjpeg's DSTATE_READY: a header was read */

#define API __attribute__((visibility("default")))

static int calls;

API int ts_jpegfake_calls(void);
int ts_jpegfake_calls(void)
{
	return calls;
}

static void fake_error_exit(j_common_ptr c)
{
	(void)c;
	fprintf(stderr, "ts-jpegfake: error_exit\n");
}

API struct jpeg_error_mgr *jpeg_std_error(struct jpeg_error_mgr *err)
{
	calls++;
	memset(err, 0, sizeof(*err));
	err->error_exit = fake_error_exit;
	return err;
}

API void jpeg_CreateDecompress(j_decompress_ptr c, int version, size_t structsize)
{
	(void)version;
	calls++;
	struct jpeg_error_mgr *err = c->err;
	memset(c, 0, structsize < sizeof(*c) ? structsize : sizeof(*c));
	c->err = err;
	c->global_state = 200; /* DSTATE_START */
}

static struct jpeg_source_mgr fake_src;

API void jpeg_mem_src(j_decompress_ptr c, const unsigned char *buf, unsigned long n)
{
	calls++;
	fake_src.next_input_byte = buf;
	fake_src.bytes_in_buffer = n;
	c->src = &fake_src;
}

API int jpeg_read_header(j_decompress_ptr c, boolean require_image)
{
	(void)require_image;
	calls++;
	c->image_width = FAKE_W;
	c->image_height = FAKE_H;
	c->num_components = 3;
	c->jpeg_color_space = JCS_YCbCr;
	c->out_color_space = JCS_RGB;
	c->global_state = FAKE_READY;
	return JPEG_HEADER_OK;
}

static void fake_dimensions(j_decompress_ptr c)
{
	c->output_width = FAKE_W;
	c->output_height = FAKE_H;
	c->out_color_components = c->output_components = 3;
}

API void jpeg_calc_output_dimensions(j_decompress_ptr c)
{
	calls++;
	fake_dimensions(c);
}

API boolean jpeg_start_decompress(j_decompress_ptr c)
{
	calls++;
	fake_dimensions(c);
	c->output_scanline = 0;
	c->global_state = 205; /* DSTATE_SCANNING */
	return TRUE;
}

API JDIMENSION jpeg_read_scanlines(j_decompress_ptr c, JSAMPARRAY rows, JDIMENSION max)
{
	calls++;
	JDIMENSION n = 0;
	for (; n < max && c->output_scanline < c->output_height; n++, c->output_scanline++)
		memset(rows[n], FAKE_BYTE, (size_t)c->output_width * 3);
	return n;
}

API JDIMENSION jpeg_skip_scanlines(j_decompress_ptr c, JDIMENSION num)
{
	calls++;
	JDIMENSION left = c->output_height - c->output_scanline, n = num < left ? num : left;
	c->output_scanline += n;
	return n;
}

API void jpeg_crop_scanline(j_decompress_ptr c, JDIMENSION *x, JDIMENSION *w)
{
	(void)c, (void)x, (void)w;
	calls++;
}

API boolean jpeg_has_multiple_scans(j_decompress_ptr c)
{
	(void)c;
	calls++;
	return FALSE;
}

API boolean jpeg_finish_decompress(j_decompress_ptr c)
{
	calls++;
	c->global_state = 200;
	return TRUE;
}

API void jpeg_abort_decompress(j_decompress_ptr c)
{
	calls++;
	c->global_state = 200;
}

API void jpeg_destroy_decompress(j_decompress_ptr c)
{
	calls++;
	c->global_state = 0;
}
