/* SPDX-License-Identifier: MIT */
/*
 * ts-jpegedge: legal but unusual libjpeg call sequences that a decode cache
 * must not get wrong. Each prints "TAG WxH HASH warnings=N"; the scenario
 * compares every line with a run without the shim.
 *   plain A           decode A (fills the cache under the shim)
 *   abort-reuse A     start A, jpeg_abort, decode A with another DCT method
 *   abort-other A B   start A, jpeg_abort, decode B on the same object
 *   trunc A           decode the first 3/4 of A's bytes
 *   prefix A          read only the first 3/4 of A (one capped read), close, decode that
 *   freopen A B       fopen A, freopen B on that stream and decode what it reads,
 *                     then decode A read afresh
 *   freopen-read A B  fopen A, read its start, freopen B on that stream, read
 *                     B whole and decode it
 *   vfork A           open A; a vfork child calls close_range(3, ~0) and
 *                     exits; read A whole and decode it
 *   dither A          RGB565 output with and without dithering
 *   concat AB         a file holding two JPEGs one after the other: decode both
 *   fork X Y...       X half-decoded when the program forks, the child destroys
 *                     its copy; the Ys decoded, X finished, the Ys decoded again
 *   suspend A         Pillow's way: read the file in 4 KiB chunks as libjpeg asks
 *                     for more, which suspends every call (read_header,
 *                     start_decompress of a progressive image, read_scanlines,
 *                     finish) until enough has arrived
 *   suspend-crop A    the same, cropped to the middle half of the columns
 *                     after start_decompress
 *   early A           read half the rows, then jpeg_finish_decompress (libjpeg:
 *                     error JERR_TOO_LITTLE_DATA)
 *   fdsrc F N         F read by a source manager of the program's own, 4 KiB a
 *                     read() as libjpeg asks (never suspending), N images
 *                     decoded one after the other; then how many bytes it fed
 *                     and where the file stands
 *   counts A V        A decoded three times with the output parameters V
 *                     (plain, nofancy, half, 3/8, gray), asking 64 rows a
 *                     call, 3, then 1, 2, 5, 8 in turn: how many rows each
 *                     call gave, run-length coded, and the pixels
 *   consume A         jpeg_input_complete after start; every row; then
 *                     jpeg_consume_input until libjpeg says EOI (at most 50
 *                     calls): the answers, and jpeg_input_complete again
 *   generic-destroy A N  N times: a decompressor at an address of its own, A decoded
 *                     to its last row, then the generic jpeg_destroy,
 *                     as a program that never finishes may; prints the last
 *                     decode, and on stderr how much the resident set grew
 *   generic-abort A   A at scale 1/2: half its rows, the generic jpeg_abort,
 *                     then A at scale 1/2 again, whole, on another object
 *   rewrite-mtime F   F decoded (its bytes A, mtime put to a fixed time), then
 *                     rewritten in place with B (A with one quantisation
 *                     table entry changed: the same size, another image) and
 *                     its mtime put back, as cp -p and rsync -t do; F
 *                     decoded again. F holds A again at the end
 *   rewrite-open F    F decoded, then opened and its first 16 bytes read;
 *                     rewritten in place with B by another descriptor, the
 *                     rest read, closed, and what was read decoded (B's
 *                     bytes). F holds A again at the end
 *
 * Built a second time as ts-jpegedge-dlcrop (TS_CROP_BY_DLSYM): the crop is
 * looked up with dlsym when it is needed, after start_decompress, so that
 * the program does not link jpeg_crop_scanline and still crops, as a plugin
 * host may.
 */
#include <fcntl.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jpeglib.h>

#include "hash.h"
#include "jpegtest.h"

#ifdef TS_CROP_BY_DLSYM
#include <dlfcn.h>

typedef void (*crop_fn)(j_decompress_ptr, JDIMENSION *, JDIMENSION *);

static void crop_by_dlsym(j_decompress_ptr c, JDIMENSION *x, JDIMENSION *w)
{
	crop_fn crop = (crop_fn)dlsym(RTLD_DEFAULT, "jpeg_crop_scanline");
	if (!crop) {
		fprintf(stderr, "ts-jpegedge: no jpeg_crop_scanline: %s\n", dlerror());
		exit(2);
	}
	crop(c, x, w);
}
#define jpeg_crop_scanline crop_by_dlsym
#endif

/*
 * Decode the image whose header was read; print it. Rows are exactly as long
 * as libjpeg writes them (RGB565: 2 bytes a pixel for 3 components), and a
 * guard follows the last one: a decoder that writes more overwrites it.
 */
#define GUARD 64

static void finish_image(j_decompress_ptr c, const char *tag)
{
	jpeg_start_decompress(c);
	size_t px = c->out_color_space == JCS_RGB565 ? 2 : (size_t)c->output_components;
	size_t row = (size_t)c->output_width * px, len = row * c->output_height;
	unsigned char *img = calloc(1, len + GUARD);
	memset(img + len, 0xa5, GUARD);
	while (c->output_scanline < c->output_height) {
		JSAMPROW r = img + row * c->output_scanline;
		if (jpeg_read_scanlines(c, &r, 1) != 1)
			break;
	}
	jpeg_finish_decompress(c);
	int guard_ok = 1;
	for (size_t i = 0; i < GUARD; i++)
		guard_ok &= img[len + i] == 0xa5;
	printf("%s %ux%u %016llx warnings=%ld%s\n", tag, c->output_width, c->output_height,
	       (unsigned long long)ts_hash64(img, len, 3), c->err->num_warnings, guard_ok ? "" : " PAST-THE-ROWS");
	free(img);
}

static void header(j_decompress_ptr c, const unsigned char *buf, size_t len)
{
	jpeg_mem_src(c, buf, (unsigned long)len);
	jpeg_read_header(c, TRUE);
}

/* ---- suspend: a source that runs dry every 4 KiB, fed by read() ---------- */

#define CHUNK 4096

struct chunked {
	struct jpeg_source_mgr pub;
	int fd;
	unsigned char *buf; /* the whole file's size: next_input_byte never moves */
	size_t have, size, skip;
};

static void src_noop(j_decompress_ptr c) { (void)c; }
static boolean src_dry(j_decompress_ptr c) { (void)c; return FALSE; } /* suspend */

static void src_skip(j_decompress_ptr c, long n)
{
	struct chunked *s = (struct chunked *)c->src;
	if (n <= 0)
		return;
	if ((size_t)n <= s->pub.bytes_in_buffer) {
		s->pub.next_input_byte += n;
		s->pub.bytes_in_buffer -= (size_t)n;
	} else {
		s->skip += (size_t)n - s->pub.bytes_in_buffer;
		s->pub.next_input_byte += s->pub.bytes_in_buffer;
		s->pub.bytes_in_buffer = 0;
	}
}

/* Read the next chunk and hand libjpeg everything it has not consumed. 0 at EOF. */
static int more(struct chunked *s)
{
	size_t want = s->size - s->have < CHUNK ? s->size - s->have : CHUNK;
	ssize_t n = want ? read(s->fd, s->buf + s->have, want) : 0;
	if (n <= 0)
		return 0;
	s->have += (size_t)n;
	size_t used = (size_t)(s->pub.next_input_byte - s->buf) + s->skip;
	if (used > s->have)
		used = s->have;
	s->skip -= used - (size_t)(s->pub.next_input_byte - s->buf);
	s->pub.next_input_byte = s->buf + used;
	s->pub.bytes_in_buffer = s->have - used;
	return 1;
}

static int decode_suspending(j_decompress_ptr c, const char *path, int crop)
{
	static struct chunked s; /* static: survives the caller's setjmp */
	struct stat sb;
	s = (struct chunked){ .fd = open(path, O_RDONLY | O_CLOEXEC) };
	if (s.fd < 0 || fstat(s.fd, &sb) != 0 || !(s.buf = malloc((size_t)sb.st_size + 1)))
		return -1;
	s.size = (size_t)sb.st_size;
	s.pub = (struct jpeg_source_mgr){ .next_input_byte = s.buf, .init_source = src_noop,
					  .fill_input_buffer = src_dry, .skip_input_data = src_skip,
					  .resync_to_restart = jpeg_resync_to_restart, .term_source = src_noop };
	c->src = &s.pub;
	int ok = more(&s), calls = 0;
	while (ok && jpeg_read_header(c, TRUE) == JPEG_SUSPENDED && (ok = more(&s)))
		calls++;
	while (ok && !jpeg_start_decompress(c) && (ok = more(&s)))
		calls++;
	JDIMENSION x = c->output_width / 4, w = c->output_width / 2;
	if (ok && crop)
		jpeg_crop_scanline(c, &x, &w);
	size_t row = (size_t)c->output_width * (size_t)c->output_components;
	unsigned char *img = ok ? calloc(row, c->output_height) : NULL;
	while (img && c->output_scanline < c->output_height) {
		JSAMPROW r = img + row * c->output_scanline;
		if (jpeg_read_scanlines(c, &r, 1) == 0 && !more(&s))
			break;
	}
	while (img && !jpeg_finish_decompress(c) && more(&s))
		calls++;
	if (img)
		printf("%s %ux%u %016llx warnings=%ld\n", crop ? "suspend-crop" : "suspend", c->output_width, c->output_height,
		       (unsigned long long)ts_hash64(img, row * c->output_height, 3), c->err->num_warnings);
	else
		printf("suspend: ran out of data\n");
	fprintf(stderr, "suspend: %d suspended calls before the scanlines\n", calls);
	free(img);
	free(s.buf);
	close(s.fd);
	return 0;
}

/* ---- counts: rows a jpeg_read_scanlines call gives ------------------------- */

static void counts_params(j_decompress_ptr c, const char *v)
{
	if (!strcmp(v, "nofancy")) {
		c->do_fancy_upsampling = FALSE;
	} else if (!strcmp(v, "half")) {
		c->scale_denom = 2;
	} else if (!strcmp(v, "3/8")) {
		c->scale_num = 3;
		c->scale_denom = 8;
	} else if (!strcmp(v, "gray")) {
		c->out_color_space = JCS_GRAYSCALE;
	}
}

static void decode_counts(j_decompress_ptr c, const unsigned char *a, size_t la, const char *v)
{
	static const unsigned patterns[3][4] = { { 64 }, { 3 }, { 1, 2, 5, 8 } };
	uint64_t h = 0;
	printf("counts-%s", v);
	for (int p = 0; p < 3; p++) {
		header(c, a, la);
		counts_params(c, v);
		jpeg_start_decompress(c);
		size_t row = (size_t)c->output_width * (size_t)c->output_components;
		unsigned char *img = calloc(c->output_height + 64u, row);
		JSAMPROW rows[64];
		unsigned last = 0, run = 0, k = 0;
		printf(" ");
		while (img && c->output_scanline < c->output_height) {
			unsigned want = patterns[p][k++ % 4] ? patterns[p][(k - 1) % 4] : patterns[p][0];
			for (unsigned i = 0; i < want; i++)
				rows[i] = img + row * (c->output_scanline + i);
			unsigned got = jpeg_read_scanlines(c, rows, want);
			if (got != last && run) {
				printf("%ux%u,", last, run);
				run = 0;
			}
			last = got;
			run++;
			if (!got)
				break;
		}
		printf("%ux%u", last, run);
		if (img)
			h = ts_hash64(img, row * c->output_height, h);
		free(img);
		jpeg_finish_decompress(c);
	}
	printf(" %016llx warnings=%ld\n", (unsigned long long)h, c->err->num_warnings);
}

/* ---- fdsrc: a source of the program's own that reads on by itself ----------- */

struct fdsrc {
	struct jpeg_source_mgr pub;
	int fd;
	long fed;
	unsigned char buf[CHUNK];
};

static boolean fd_fill(j_decompress_ptr c)
{
	static const JOCTET eoi[2] = { 0xFF, JPEG_EOI };
	struct fdsrc *s = (struct fdsrc *)c->src;
	ssize_t r = read(s->fd, s->buf, sizeof(s->buf));
	if (r <= 0) { /* as libjpeg's own: a fake EOI at the end */
		s->pub.next_input_byte = eoi;
		s->pub.bytes_in_buffer = 2;
		return TRUE;
	}
	s->pub.next_input_byte = s->buf;
	s->pub.bytes_in_buffer = (size_t)r;
	s->fed += r;
	return TRUE;
}

static void fd_skip(j_decompress_ptr c, long n)
{
	while (n > (long)c->src->bytes_in_buffer) {
		n -= (long)c->src->bytes_in_buffer;
		fd_fill(c);
	}
	c->src->next_input_byte += n;
	c->src->bytes_in_buffer -= (size_t)n;
}

static int decode_fdsrc(j_decompress_ptr c, const char *path, int images)
{
	static struct fdsrc s; /* static: survives the caller's setjmp */
	s = (struct fdsrc){ .fd = open(path, O_RDONLY | O_CLOEXEC) };
	if (s.fd < 0)
		return -1;
	s.pub = (struct jpeg_source_mgr){ .init_source = src_noop, .fill_input_buffer = fd_fill,
					  .skip_input_data = fd_skip, .resync_to_restart = jpeg_resync_to_restart,
					  .term_source = src_noop };
	c->src = &s.pub;
	fd_fill(c); /* the first chunk is in the buffer at read_header, as Pillow hands it */
	for (int i = 0; i < images; i++) {
		char tag[32];
		snprintf(tag, sizeof(tag), "fdsrc-%d", i + 1);
		jpeg_read_header(c, TRUE);
		finish_image(c, tag);
	}
	printf("fdsrc fed=%ld at=%ld\n", s.fed, (long)lseek(s.fd, 0, SEEK_CUR));
	close(s.fd);
	return 0;
}

/* ---- fork: a child that destroys its copy of a decode in progress ------------- */

struct dec {
	struct jpeg_decompress_struct c;
	struct jpeg_error_mgr e;
	unsigned char *buf, *img;
	size_t row;
};

static void dec_begin(struct dec *d, const char *path)
{
	size_t n;
	d->buf = slurp(path, &n);
	d->c.err = jpeg_std_error(&d->e);
	jpeg_create_decompress(&d->c);
	jpeg_mem_src(&d->c, d->buf, (unsigned long)n);
	jpeg_read_header(&d->c, TRUE);
	jpeg_start_decompress(&d->c);
	d->row = (size_t)d->c.output_width * (size_t)d->c.output_components;
	d->img = malloc(d->row * d->c.output_height);
}

static void dec_rows(struct dec *d, unsigned upto)
{
	while (d->c.output_scanline < upto) {
		JSAMPROW r = d->img + d->row * d->c.output_scanline;
		if (jpeg_read_scanlines(&d->c, &r, 1) != 1)
			break;
	}
}

static uint64_t dec_end(struct dec *d)
{
	dec_rows(d, d->c.output_height);
	jpeg_finish_decompress(&d->c);
	uint64_t x = ts_hash64(d->img, d->row * d->c.output_height, 3);
	jpeg_destroy_decompress(&d->c);
	free(d->img);
	free(d->buf);
	return x;
}

static uint64_t dec_whole(const char *path)
{
	struct dec d;
	dec_begin(&d, path);
	return dec_end(&d);
}

/*
 * X is being decoded (a fill, under the shim) when the program forks; the
 * child destroys its copy of the object and exits. The parent decodes the
 * Ys (in a small cache they take X's range once it is free), finishes X,
 * then decodes every Y again: each must come out as the first time.
 */
static int decode_fork(int argc, char **argv)
{
	struct dec x;
	dec_begin(&x, argv[2]);
	dec_rows(&x, 10);
	pid_t p = fork();
	if (p == 0) {
		jpeg_destroy_decompress(&x.c);
		_exit(0);
	}
	waitpid(p, NULL, 0);
	uint64_t first[16];
	int n = argc - 3 < 16 ? argc - 3 : 16, wrong = 0;
	for (int i = 0; i < n; i++)
		first[i] = dec_whole(argv[3 + i]);
	dec_end(&x);
	for (int i = 0; i < n; i++)
		wrong += dec_whole(argv[3 + i]) != first[i];
	printf("fork: %d of %d decodes differ the second time\n", wrong, n);
	return 0;
}

/* ---- generic-destroy: the generic jpeg_destroy after the last row --------------- */

static long rss_kib(void)
{
	long pages = 0, rss = 0;
	FILE *f = fopen("/proc/self/statm", "r");
	if (f && fscanf(f, "%ld %ld", &pages, &rss) != 2)
		rss = 0;
	if (f)
		fclose(f);
	return rss * (sysconf(_SC_PAGESIZE) / 1024);
}

static int decode_generic_destroy(const char *path, int n)
{
	size_t len;
	unsigned char *buf = slurp(path, &len);
	uint64_t h = 0;
	JDIMENSION w = 0, ht = 0;
	long before = 0;
	struct dec **all = calloc((size_t)n, sizeof(*all)); /* freed at the end: each object at an address of its own */
	for (int i = 0; i < n && all; i++) {
		if (i == 1)
			before = rss_kib(); /* after the first: the allocator's and the shim's own start-up */
		struct dec *d = calloc(1, sizeof(*d)); /* a new address each time, as a heap object's */
		d->c.err = jpeg_std_error(&d->e);
		jpeg_create_decompress(&d->c);
		jpeg_mem_src(&d->c, buf, (unsigned long)len);
		jpeg_read_header(&d->c, TRUE);
		jpeg_start_decompress(&d->c);
		d->row = (size_t)d->c.output_width * (size_t)d->c.output_components;
		d->img = malloc(d->row * d->c.output_height);
		dec_rows(d, d->c.output_height);
		h = ts_hash64(d->img, d->row * d->c.output_height, 3);
		w = d->c.output_width;
		ht = d->c.output_height;
		jpeg_destroy((j_common_ptr)&d->c); /* no finish: legal, frees everything libjpeg holds */
		free(d->img);
		all[i] = d;
	}
	long grew = rss_kib() - before;
	for (int i = 0; i < n && all; i++)
		free(all[i]);
	free(all);
	printf("generic-destroy %ux%u %016llx\n", w, ht, (unsigned long long)h);
	fprintf(stderr, "generic-destroy: %d decodes, resident set grew %ld KiB\n", n, grew);
	free(buf);
	return 0;
}

/* Write buf over path's bytes in place; with t, put its mtime to t after. */
static void put_bytes(const char *path, const unsigned char *buf, size_t len, const struct timespec *t)
{
	int fd = open(path, O_WRONLY | O_CLOEXEC);
	struct timespec ts[2] = {{0, UTIME_OMIT}, {0, 0}};
	if (t)
		ts[1] = *t;
	if (fd < 0 || pwrite(fd, buf, len, 0) != (ssize_t)len || (t && futimens(fd, ts) != 0)) {
		perror(path);
		exit(2);
	}
	close(fd);
}

static void decode_buf(const unsigned char *buf, size_t len, const char *tag)
{
	struct jpeg_decompress_struct c;
	struct jpeg_error_mgr e;
	c.err = jpeg_std_error(&e);
	e.emit_message = count_warning;
	jpeg_create_decompress(&c);
	header(&c, buf, len);
	finish_image(&c, tag);
	jpeg_destroy_decompress(&c);
}

/* rewrite-mtime and rewrite-open (above). */
static int decode_rewrite(const char *path, int open_while)
{
	size_t la, lb = 0;
	unsigned char *a = slurp(path, &la), *b = malloc(la + 1);
	if (!b)
		return 2;
	memcpy(b, a, la);
	/* B: the first 8-bit quantisation table's 11th entry one step up (never 0) */
	size_t q = 0;
	for (size_t i = 2; i + 69 < la && !q; i++)
		if (a[i] == 0xFF && a[i + 1] == 0xDB && (a[i + 4] >> 4) == 0)
			q = i + 5 + 10;
	if (!q || q < 16) {
		fprintf(stderr, "ts-jpegedge: %s has no 8-bit quantisation table past its first 16 bytes\n", path);
		return 2;
	}
	b[q] = b[q] == 255 ? 254 : (unsigned char)(b[q] + 1);
	const struct timespec then = {1600000000, 0};
	put_bytes(path, a, la, &then);
	size_t n;
	unsigned char *first = slurp(path, &n);
	decode_buf(first, n, "before");
	free(first);
	usleep(20000); /* past the file system's clock tick: the rewrite's ctime differs */
	unsigned char *got = malloc(la + 1);
	if (!got)
		return 2;
	if (open_while) {
		int fd = open(path, O_RDONLY | O_CLOEXEC);
		ssize_t r = fd >= 0 ? read(fd, got, 16) : -1;
		if (r != 16)
			return 2;
		lb = 16;
		usleep(20000);
		put_bytes(path, b, la, NULL);
		while (lb < la && (r = read(fd, got + lb, la - lb)) > 0)
			lb += (size_t)r;
		close(fd);
	} else {
		put_bytes(path, b, la, &then);
		free(got);
		got = slurp(path, &lb);
	}
	decode_buf(got, lb, open_while ? "rewrite-open" : "rewrite-mtime");
	put_bytes(path, a, la, &then);
	free(got);
	free(a);
	free(b);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 3 && !strncmp(argv[1], "rewrite-", 8))
		return decode_rewrite(argv[2], !strcmp(argv[1], "rewrite-open"));
	if (argc > 3 && !strcmp(argv[1], "fork"))
		return decode_fork(argc, argv);
	if (argc > 3 && !strcmp(argv[1], "generic-destroy"))
		return decode_generic_destroy(argv[2], atoi(argv[3]));
	if (argc < 3) {
		fprintf(stderr, "usage: ts-jpegedge plain|abort-reuse|abort-other|trunc|prefix|prefix-open|chunked|chunk-mod|nofancy|skip|crop-late|overread|early|dither|concat|suspend|suspend-crop|vfork|generic-abort A, rewrite-mtime|rewrite-open F, freopen|freopen-read A B, fork X Y..., generic-destroy A N\n");
		return 2;
	}
	const char *mode = argv[1];
	size_t la = 0, lb = 0;
	/* B is read only when it is used: what a thread read last is what the
	 * shim can prove a buffer to be. suspend reads A itself, chunk by chunk. */
	int reads_a = !strncmp(mode, "suspend", 7) || !strcmp(mode, "vfork") || !strcmp(mode, "fdsrc");
	unsigned char *a = reads_a ? NULL : slurp(argv[2], &la), *b = NULL;
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
	if (!strcmp(mode, "suspend") || !strcmp(mode, "suspend-crop")) {
		if (decode_suspending(&c, argv[2], !strcmp(mode, "suspend-crop"))) {
			perror(argv[2]);
			return 1;
		}
	} else if (!strcmp(mode, "fdsrc") && argc > 3) {
		if (decode_fdsrc(&c, argv[2], atoi(argv[3]))) {
			perror(argv[2]);
			return 1;
		}
	} else if (!strcmp(mode, "counts") && argc > 3) {
		decode_counts(&c, a, la, argv[3]);
	} else if (!strcmp(mode, "plain")) {
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
	} else if ((!strcmp(mode, "freopen") || !strcmp(mode, "freopen-read")) && argc > 3) {
		/* fopen(A), nothing read (freopen-read: its start read); freopen(B)
		 * on the stream: glibc closes A and opens B under the same number,
		 * with no open or close of ours */
		int read_first = !strcmp(mode, "freopen-read");
		FILE *f = fopen(argv[2], "rb");
		unsigned char head[100];
		struct stat sb;
		if (!f || (read_first && fread(head, 1, sizeof(head), f) != sizeof(head)) ||
		    !(f = freopen(argv[3], "rb", f)) || fstat(fileno(f), &sb))
			return 1;
		b = malloc((size_t)sb.st_size);
		lb = fread(b, 1, (size_t)sb.st_size, f);
		fclose(f);
		header(&c, b, lb);
		finish_image(&c, read_first ? "freopen-read-B" : "freopen-B");
		if (!read_first) {
			free(a); /* A again, read afresh: what a thread read last is what is proven */
			a = slurp(argv[2], &la);
			header(&c, a, la);
			finish_image(&c, "then-A");
		}
	} else if (!strcmp(mode, "vfork")) {
		/* what posix_spawn and Python's subprocess do: the child, sharing our
		 * memory, closes every descriptor but stdio before its exec */
		int fd = open(argv[2], O_RDONLY | O_CLOEXEC), st = 0;
		pid_t pid = fd >= 0 ? vfork() : -1;
		if (pid == 0) {
			close_range(3, ~0u, 0);
			_exit(0);
		}
		if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st))
			return 1;
		struct stat sb;
		if (fstat(fd, &sb) || !(a = malloc((size_t)sb.st_size)))
			return 1;
		la = (size_t)read(fd, a, (size_t)sb.st_size);
		close(fd);
		header(&c, a, la);
		finish_image(&c, "vfork");
	} else if (!strcmp(mode, "prefix")) {
		/* a loader that reads only the first 3/4 of the file (a capped read), closes it, decodes that */
		int fd = open(argv[2], O_RDONLY | O_CLOEXEC);
		size_t want = la * 3 / 4, got = 0;
		b = malloc(want);
		while (fd >= 0 && b && got < want) {
			ssize_t n = read(fd, b + got, want - got);
			if (n <= 0)
				break;
			got += (size_t)n;
		}
		if (fd >= 0)
			close(fd);
		header(&c, b, got);
		finish_image(&c, "prefix");
	} else if (!strcmp(mode, "prefix-open")) {
		/* the same prefix decoded from memory while the file is still open where the read ended */
		int fd = open(argv[2], O_RDONLY | O_CLOEXEC);
		size_t want = la * 3 / 4;
		b = malloc(want);
		ssize_t n = fd >= 0 && b ? read(fd, b, want) : -1;
		header(&c, b, n > 0 ? (size_t)n : 0);
		finish_image(&c, "prefix-open");
		if (fd >= 0)
			close(fd);
	} else if (!strcmp(mode, "chunked") || !strcmp(mode, "chunk-mod")) {
		/* read in 4 KiB chunks, closed, decoded from memory; chunk-mod first changes
		 * 2000 bytes past the first chunk (the program's own edit of the stream) */
		int fd = open(argv[2], O_RDONLY | O_CLOEXEC);
		size_t got = 0;
		b = malloc(la);
		while (fd >= 0 && b && got < la) {
			ssize_t n = read(fd, b + got, la - got < 4096 ? la - got : 4096);
			if (n <= 0)
				break;
			got += (size_t)n;
		}
		if (fd >= 0)
			close(fd);
		if (!strcmp(mode, "chunk-mod"))
			for (size_t i = got / 2; i < got / 2 + 2000 && i < got; i++)
				b[i] ^= 0x55;
		header(&c, b, got);
		finish_image(&c, mode);
	} else if (!strcmp(mode, "generic-abort")) {
		header(&c, a, la);
		c.scale_num = 1;
		c.scale_denom = 2;
		jpeg_start_decompress(&c);
		size_t row = (size_t)c.output_width * (size_t)c.output_components;
		unsigned char *img = malloc(row);
		while (c.output_scanline < c.output_height / 2) {
			JSAMPROW r = img;
			if (jpeg_read_scanlines(&c, &r, 1) != 1)
				break;
		}
		free(img);
		jpeg_abort((j_common_ptr)&c); /* the image given up half-way; the object kept */
		struct jpeg_decompress_struct c2; /* the same image decoded by another object meanwhile */
		struct jpeg_error_mgr e2;
		c2.err = jpeg_std_error(&e2);
		jpeg_create_decompress(&c2);
		header(&c2, a, la);
		c2.scale_num = 1;
		c2.scale_denom = 2;
		finish_image(&c2, "generic-abort");
		jpeg_destroy_decompress(&c2);
	} else if (!strcmp(mode, "nofancy")) {
		header(&c, a, la);
		c.do_fancy_upsampling = FALSE;
		finish_image(&c, "nofancy");
	} else if (!strcmp(mode, "skip") || !strcmp(mode, "crop-late") || !strcmp(mode, "overread")) {
		/* skip: rows 0-2, skip 17, the rest; crop-late: a crop after row 0 (libjpeg
		 * refuses: JERR_BAD_STATE); overread: read until libjpeg returns 0 (a warning) */
		header(&c, a, la);
		c.do_fancy_upsampling = FALSE; /* the merged upsampler: skipped rows are its own */
		jpeg_start_decompress(&c);
		size_t row = (size_t)c.output_width * (size_t)c.output_components;
		unsigned char *img = calloc(c.output_height + 1u, row);
		uint64_t h = 0;
		unsigned rows = 0;
		for (;;) {
			if (!strcmp(mode, "skip") && c.output_scanline == 3)
				jpeg_skip_scanlines(&c, 17);
			if (!strcmp(mode, "crop-late") && c.output_scanline == 1) {
				JDIMENSION x = 0, w = 16;
				jpeg_crop_scanline(&c, &x, &w);
				printf("crop-late accepted\n");
			}
			if (!strcmp(mode, "overread") ? 0 : c.output_scanline >= c.output_height)
				break;
			JSAMPROW r = img + row * rows;
			if (jpeg_read_scanlines(&c, &r, 1) != 1)
				break;
			h = ts_hash64(r, row, h);
			rows++;
		}
		printf("%s rows=%u %016llx warnings=%ld\n", mode, rows, (unsigned long long)h, c.err->num_warnings);
		free(img);
		jpeg_abort_decompress(&c);
	} else if (!strcmp(mode, "early")) {
		/* the program stops half-way and finishes: libjpeg refuses */
		header(&c, a, la);
		jpeg_start_decompress(&c);
		size_t row = (size_t)c.output_width * (size_t)c.output_components;
		unsigned char *img = malloc(row);
		while (img && c.output_scanline < c.output_height / 2)
			jpeg_read_scanlines(&c, &img, 1);
		free(img);
		printf("early finish=%d at row %u of %u\n", jpeg_finish_decompress(&c), c.output_scanline,
		       c.output_height);
	} else if (!strcmp(mode, "consume")) {
		header(&c, a, la);
		jpeg_start_decompress(&c);
		int complete = jpeg_input_complete(&c);
		size_t row = (size_t)c.output_width * (size_t)c.output_components;
		unsigned char *img = malloc(row);
		uint64_t h = 0;
		while (img && c.output_scanline < c.output_height && jpeg_read_scanlines(&c, &img, 1) == 1)
			h = ts_hash64(img, row, h);
		free(img);
		int r = JPEG_SUSPENDED, calls = 0;
		while (calls < 50 && (r = jpeg_consume_input(&c)) != JPEG_REACHED_EOI && r != JPEG_SUSPENDED)
			calls++;
		printf("consume %016llx complete=%d then=%d consume=%d after %d more\n", (unsigned long long)h, complete,
		       jpeg_input_complete(&c), r, calls);
		jpeg_finish_decompress(&c);
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
