/* SPDX-License-Identifier: MIT */
/*
 * The per-sample pipeline of tsshim-train: read the file, decode it with
 * libjpeg, crop and resize, flip, normalise. Included by tools/train.c only.
 *
 * Semantics follow torchvision over Pillow:
 *
 * train: RandomResizedCrop(size, scale=(0.08, 1), ratio=(3/4, 4/3)),
 *        RandomHorizontalFlip(0.5), ToTensor, Normalize(ImageNet).
 *        Up to 10 attempts: area = W*H*U(0.08, 1), aspect = exp(U(log 3/4,
 *        log 4/3)), w = round(sqrt(area*aspect)), h = round(sqrt(area/aspect))
 *        (round half to even, like Python); accepted when 0 < w <= W and
 *        0 < h <= H, then top = randint(0, H-h), left = randint(0, W-w).
 *        Otherwise the centre crop of the whole image clamped to the ratio
 *        range. Then flip when U(0, 1) < 0.5. Draws, in this order, from the
 *        sample's splitmix64 generator (train_hash.h): U(a, b) =
 *        a + (b-a)*unit(), randint(lo, hi) = lo + next() % (hi-lo+1).
 * val:   Resize(size*256/224) (shorter side; longer = int(short*long/short0)),
 *        CenterCrop(size) (offsets round((d-size)/2)), ToTensor, Normalize.
 *
 * Resizing is Pillow's BILINEAR resampling (a triangle filter whose support
 * grows with the reduction factor, i.e. antialiased), separable: a
 * horizontal pass then a vertical pass, each rounded to 8 bits, with
 * Pillow's fixed-point coefficients and arithmetic (same output bytes). The crop is taken first, so the filter clamps at the crop's edges
 * (torchvision crops, then resizes). ToTensor + Normalize:
 * out = (v/255 - mean[c]) / std[c] in float32, CHW order.
 *
 * Given the same crop parameters and flip, the output is bit-identical to
 * torchvision 0.14 over Pillow 9.4 with the same libjpeg (F.resized_crop,
 * F.hflip, F.to_tensor, Normalize; Resize + CenterCrop for val): checked on
 * every image kind tsshim-mkdata writes, and by tests/scenarios/train.sh,
 * which recomputes whole runs with torchvision where it is installed.
 *
 * Every libjpeg warning (corrupt or truncated data) is an error: the
 * reference program never trains on a silently repaired image.
 */
#ifndef TSSHIM_TRAIN_IMAGE_H
#define TSSHIM_TRAIN_IMAGE_H

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jpeglib.h>

#include "train_hash.h"

#define TI_MAX_PIXELS (1u << 28) /* per decoded image: 256 Mpixel */

/* Reusable buffers of one loading process. */
struct ti_ctx {
	int size;           /* output side */
	int train;          /* 1: RandomResizedCrop + flip; 0: resize + center crop */
	uint64_t seed;
	unsigned char *file; /* file bytes */
	size_t file_cap;
	unsigned char *rgb;  /* decoded image, RGB */
	size_t rgb_cap;
	int w, h;
	unsigned char *tmp;  /* horizontal pass */
	size_t tmp_cap;
	unsigned char *out8; /* size*size*3 */
	int *bounds;         /* coefficients: 2 per output (first input, count) */
	int32_t *kk;         /* weights, fixed point */
	double *pre;         /* one output's weights before rounding */
	int32_t *acc;        /* one row of vertical sums */
	size_t bounds_cap, kk_cap, pre_cap, acc_cap;
	float lut[3][256];   /* (v/255 - mean)/std */
};

static const float ti_mean[3] = {0.485f, 0.456f, 0.406f};
static const float ti_std[3] = {0.229f, 0.224f, 0.225f};

static inline int ti_init(struct ti_ctx *c, int size, int train, uint64_t seed)
{
	memset(c, 0, sizeof *c);
	c->size = size;
	c->train = train;
	c->seed = seed;
	for (int ch = 0; ch < 3; ch++)
		for (int v = 0; v < 256; v++)
			c->lut[ch][v] = ((float)v / 255.0f - ti_mean[ch]) / ti_std[ch];
	c->out8 = malloc((size_t)size * size * 3);
	return c->out8 ? 0 : -1;
}

static inline void ti_free(struct ti_ctx *c)
{
	free(c->file);
	free(c->rgb);
	free(c->tmp);
	free(c->out8);
	free(c->bounds);
	free(c->kk);
	free(c->pre);
	free(c->acc);
	memset(c, 0, sizeof *c);
}

static inline int ti_reserve(void **p, size_t *cap, size_t need)
{
	if (*cap >= need)
		return 0;
	size_t n = *cap ? *cap : 4096;
	while (n < need)
		n *= 2;
	void *q = realloc(*p, n);
	if (!q)
		return -1;
	*p = q;
	*cap = n;
	return 0;
}

/* Whole file into c->file, the way Python's f.read() does: fstat for a size
 * hint, then read(2) until it returns 0. */
static inline int ti_read_file(struct ti_ctx *c, const char *path, size_t *len, char *err, size_t errlen)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
		return -1;
	}
	struct stat st;
	if (fstat(fd, &st) < 0) {
		snprintf(err, errlen, "%s: fstat: %s", path, strerror(errno));
		close(fd);
		return -1;
	}
	size_t hint = st.st_size > 0 ? (size_t)st.st_size + 1 : 4096;
	if (ti_reserve((void **)&c->file, &c->file_cap, hint) < 0) {
		snprintf(err, errlen, "%s: out of memory for %zu bytes", path, hint);
		close(fd);
		return -1;
	}
	size_t n = 0;
	for (;;) {
		if (n == c->file_cap && ti_reserve((void **)&c->file, &c->file_cap, n + 1) < 0) {
			snprintf(err, errlen, "%s: out of memory", path);
			close(fd);
			return -1;
		}
		ssize_t r = read(fd, c->file + n, c->file_cap - n);
		if (r < 0) {
			if (errno == EINTR)
				continue;
			snprintf(err, errlen, "%s: read: %s", path, strerror(errno));
			close(fd);
			return -1;
		}
		if (r == 0)
			break;
		n += (size_t)r;
	}
	close(fd);
	*len = n;
	return 0;
}

/* ---- JPEG decode ----------------------------------------------------------- */

struct ti_jerr {
	struct jpeg_error_mgr pub;
	jmp_buf jb;
	char msg[JMSG_LENGTH_MAX];
};

static inline void ti_jerr_exit(j_common_ptr ci)
{
	struct ti_jerr *e = (struct ti_jerr *)ci->err;
	(*ci->err->format_message)(ci, e->msg);
	longjmp(e->jb, 1);
}

static inline void ti_jerr_emit(j_common_ptr ci, int level)
{
	if (level >= 0)
		return; /* trace messages */
	struct ti_jerr *e = (struct ti_jerr *)ci->err;
	ci->err->num_warnings++;
	(*ci->err->format_message)(ci, e->msg);
	longjmp(e->jb, 1);
}

static inline void ti_jerr_output(j_common_ptr ci) { (void)ci; }

/* Decode c->file[0..len) into c->rgb (RGB, c->w x c->h). */
static inline int ti_decode(struct ti_ctx *c, size_t len, const char *path, char *err, size_t errlen)
{
	struct jpeg_decompress_struct ci;
	struct ti_jerr je;
	JSAMPROW rows[8];

	ci.err = jpeg_std_error(&je.pub);
	je.pub.error_exit = ti_jerr_exit;
	je.pub.emit_message = ti_jerr_emit;
	je.pub.output_message = ti_jerr_output;
	je.msg[0] = 0;
	if (setjmp(je.jb)) {
		jpeg_destroy_decompress(&ci);
		snprintf(err, errlen, "%s: corrupt or unsupported JPEG: %s", path, je.msg);
		return -1;
	}
	jpeg_create_decompress(&ci);
	jpeg_mem_src(&ci, c->file, (unsigned long)len);
	jpeg_read_header(&ci, TRUE);
	ci.out_color_space = JCS_RGB;
	jpeg_start_decompress(&ci);
	if (ci.output_components != 3 || ci.output_width == 0 || ci.output_height == 0 ||
	    (uint64_t)ci.output_width * ci.output_height > TI_MAX_PIXELS) {
		snprintf(err, errlen, "%s: unsupported JPEG: %ux%u with %d output components", path,
			 ci.output_width, ci.output_height, ci.output_components);
		jpeg_destroy_decompress(&ci);
		return -1;
	}
	size_t stride = (size_t)ci.output_width * 3;
	if (ti_reserve((void **)&c->rgb, &c->rgb_cap, stride * ci.output_height) < 0) {
		snprintf(err, errlen, "%s: out of memory for a %ux%u image", path, ci.output_width,
			 ci.output_height);
		jpeg_destroy_decompress(&ci);
		return -1;
	}
	while (ci.output_scanline < ci.output_height) {
		unsigned k, want = ci.output_height - ci.output_scanline;
		if (want > 8)
			want = 8;
		for (k = 0; k < want; k++)
			rows[k] = c->rgb + (size_t)(ci.output_scanline + k) * stride;
		jpeg_read_scanlines(&ci, rows, want);
	}
	jpeg_finish_decompress(&ci);
	c->w = (int)ci.output_width;
	c->h = (int)ci.output_height;
	jpeg_destroy_decompress(&ci);
	return 0;
}

/* ---- Pillow-style bilinear resampling -------------------------------------- */

#define TI_PRECISION_BITS (32 - 8 - 2) /* Pillow's fixed point for 8-bit images */

static inline double ti_tri(double x)
{
	if (x < 0)
		x = -x;
	return x < 1.0 ? 1.0 - x : 0.0;
}

/*
 * Coefficients for resizing in_size input pixels to out_full outputs, for
 * the out_n outputs starting at out_first, stored at c->bounds + boff and
 * c->kk + koff. Returns ksize (weights per output); bounds[2*i] = first
 * input pixel, bounds[2*i+1] = count. This is Pillow's precompute_coeffs()
 * for the bilinear filter followed by normalize_coeffs_8bpc().
 */
static inline int ti_coeffs(struct ti_ctx *c, int in_size, int out_full, int out_first, int out_n, size_t boff,
			    size_t koff)
{
	double scale = (double)in_size / out_full;
	double filterscale = scale < 1.0 ? 1.0 : scale;
	double support = 1.0 * filterscale;
	int ksize = (int)ceil(support) * 2 + 1;
	if (ti_reserve((void **)&c->pre, &c->pre_cap, (size_t)ksize * sizeof(double)) < 0 ||
	    ti_reserve((void **)&c->bounds, &c->bounds_cap, (boff + 2 * (size_t)out_n) * sizeof(int)) < 0 ||
	    ti_reserve((void **)&c->kk, &c->kk_cap, (koff + (size_t)out_n * ksize) * sizeof(int32_t)) < 0)
		return -1;
	int *bounds = c->bounds + boff;
	int32_t *kk = c->kk + koff;
	double *pre = c->pre;
	for (int i = 0; i < out_n; i++) {
		int xx = out_first + i;
		double center = (xx + 0.5) * scale;
		double ww = 0.0, ss = 1.0 / filterscale;
		int xmin = (int)(center - support + 0.5);
		if (xmin < 0)
			xmin = 0;
		int xmax = (int)(center + support + 0.5);
		if (xmax > in_size)
			xmax = in_size;
		xmax -= xmin;
		int x;
		for (x = 0; x < xmax; x++) {
			double w = ti_tri((x + xmin - center + 0.5) * ss);
			pre[x] = w;
			ww += w;
		}
		for (x = 0; x < xmax; x++)
			if (ww != 0.0)
				pre[x] /= ww;
		for (; x < ksize; x++)
			pre[x] = 0;
		int32_t *k = kk + (size_t)i * ksize;
		for (x = 0; x < ksize; x++)
			k[x] = (int32_t)(pre[x] < 0 ? -0.5 + pre[x] * (1 << TI_PRECISION_BITS)
						    : 0.5 + pre[x] * (1 << TI_PRECISION_BITS));
		bounds[2 * i] = xmin;
		bounds[2 * i + 1] = xmax;
	}
	return ksize;
}

static inline unsigned char ti_clip8(int32_t v)
{
	v >>= TI_PRECISION_BITS;
	return v < 0 ? 0 : v > 255 ? 255 : (unsigned char)v;
}

/* acc[x] += row[x] * k for x < n, eight at a time (GCC vector extensions:
 * -O2 does not vectorise this loop by itself). */
typedef int32_t ti_v8i __attribute__((vector_size(32)));

static inline void ti_madd(int32_t *acc, const unsigned char *row, int32_t k, size_t n)
{
	size_t x = 0;
	for (; x + 8 <= n; x += 8) {
		ti_v8i a, r = {row[x], row[x + 1], row[x + 2], row[x + 3], row[x + 4], row[x + 5], row[x + 6], row[x + 7]};
		memcpy(&a, acc + x, sizeof a);
		a += r * k;
		memcpy(acc + x, &a, sizeof a);
	}
	for (; x < n; x++)
		acc[x] += row[x] * k;
}

/*
 * Resize the rectangle (x0, y0, cw, ch) of the decoded image to
 * out_w x out_h and store the size x size window at (ox, oy) of that
 * result in c->out8 (RGB). Horizontal pass over the rows the vertical pass
 * needs, then the vertical pass, each rounded to 8 bits (Pillow's
 * ImagingResampleHorizontal_8bpc / ImagingResampleVertical_8bpc).
 */
static inline int ti_resample(struct ti_ctx *c, int x0, int y0, int cw, int ch, int out_w, int out_h, int ox,
			      int oy)
{
	int S = c->size;
	int hks = ti_coeffs(c, cw, out_w, ox, S, 0, 0);
	if (hks < 0)
		return -1;
	int vks = ti_coeffs(c, ch, out_h, oy, S, 2 * (size_t)S, (size_t)S * hks);
	if (vks < 0)
		return -1;
	const int *hb = c->bounds, *vb = c->bounds + 2 * (size_t)S;
	const int32_t *hk = c->kk, *vk = c->kk + (size_t)S * hks;

	/* rows of the crop the vertical pass needs */
	int rlo = vb[0], rhi = vb[0] + vb[1];
	for (int i = 1; i < S; i++) {
		if (vb[2 * i] < rlo)
			rlo = vb[2 * i];
		if (vb[2 * i] + vb[2 * i + 1] > rhi)
			rhi = vb[2 * i] + vb[2 * i + 1];
	}
	size_t tstride = (size_t)S * 3;
	if (ti_reserve((void **)&c->tmp, &c->tmp_cap, (size_t)(rhi - rlo) * tstride) < 0)
		return -1;
	size_t sstride = (size_t)c->w * 3;
	const int32_t half = 1 << (TI_PRECISION_BITS - 1);
	for (int r = rlo; r < rhi; r++) {
		const unsigned char *src = c->rgb + (size_t)(y0 + r) * sstride + (size_t)x0 * 3;
		unsigned char *dst = c->tmp + (size_t)(r - rlo) * tstride;
		for (int x = 0; x < S; x++) {
			const int32_t *k = hk + (size_t)x * hks;
			const unsigned char *s = src + (size_t)hb[2 * x] * 3;
			int n = hb[2 * x + 1];
			int32_t a0 = half, a1 = half, a2 = half;
			for (int j = 0; j < n; j++) {
				a0 += s[3 * j] * k[j];
				a1 += s[3 * j + 1] * k[j];
				a2 += s[3 * j + 2] * k[j];
			}
			dst[3 * x] = ti_clip8(a0);
			dst[3 * x + 1] = ti_clip8(a1);
			dst[3 * x + 2] = ti_clip8(a2);
		}
	}
	/* vertical: the same sums as Pillow, accumulated row by row (exact
	 * integer arithmetic, so the order does not change the result) */
	if (ti_reserve((void **)&c->acc, &c->acc_cap, tstride * sizeof(int32_t)) < 0)
		return -1;
	int32_t *acc = c->acc;
	for (int y = 0; y < S; y++) {
		const int32_t *k = vk + (size_t)y * vks;
		const unsigned char *first = c->tmp + (size_t)(vb[2 * y] - rlo) * tstride;
		int n = vb[2 * y + 1];
		unsigned char *dst = c->out8 + (size_t)y * tstride;
		for (size_t x = 0; x < tstride; x++)
			acc[x] = half;
		for (int j = 0; j < n; j++)
			ti_madd(acc, first + (size_t)j * tstride, k[j], tstride);
		for (size_t x = 0; x < tstride; x++)
			dst[x] = ti_clip8(acc[x]);
	}
	return 0;
}

/* Python's round(): half to even (the default rounding mode). */
static inline int ti_round(double v) { return (int)nearbyint(v); }

/*
 * Load sample `path` of `epoch` with dataset index `index` into out
 * (float32 [3][size][size]). Returns 0, or -1 with a message naming the
 * file in err.
 */
static inline int ti_load(struct ti_ctx *c, const char *path, uint64_t epoch, uint64_t index, float *out,
			  char *err, size_t errlen)
{
	size_t len;
	if (ti_read_file(c, path, &len, err, errlen) < 0)
		return -1;
	if (ti_decode(c, len, path, err, errlen) < 0)
		return -1;
	int W = c->w, H = c->h, S = c->size;
	int flip = 0, rc;
	if (c->train) {
		uint64_t rng = train_sample_rng(c->seed, epoch, index);
		double area = (double)W * H;
		double lr0 = log(3.0 / 4.0), lr1 = log(4.0 / 3.0);
		int top = -1, left = 0, cw = 0, ch = 0;
		for (int attempt = 0; attempt < 10; attempt++) {
			double target = area * (0.08 + (1.0 - 0.08) * splitmix64_unit(&rng));
			double aspect = exp(lr0 + (lr1 - lr0) * splitmix64_unit(&rng));
			int w = ti_round(sqrt(target * aspect));
			int h = ti_round(sqrt(target / aspect));
			if (w > 0 && w <= W && h > 0 && h <= H) {
				top = (int)(splitmix64_next(&rng) % (uint64_t)(H - h + 1));
				left = (int)(splitmix64_next(&rng) % (uint64_t)(W - w + 1));
				cw = w;
				ch = h;
				break;
			}
		}
		if (top < 0) { /* fallback: centre crop within the ratio range */
			double in_ratio = (double)W / H;
			if (in_ratio < 3.0 / 4.0) {
				cw = W;
				ch = ti_round(cw / (3.0 / 4.0));
			} else if (in_ratio > 4.0 / 3.0) {
				ch = H;
				cw = ti_round(ch * (4.0 / 3.0));
			} else {
				cw = W;
				ch = H;
			}
			top = (H - ch) / 2;
			left = (W - cw) / 2;
		}
		flip = splitmix64_unit(&rng) < 0.5;
		rc = ti_resample(c, left, top, cw, ch, S, S, 0, 0);
	} else {
		int R = S * 256 / 224;
		int shorter = W <= H ? W : H, longer = W <= H ? H : W;
		int nl = (int)((double)((int64_t)R * longer) / shorter);
		int nw = W <= H ? R : nl, nh = W <= H ? nl : R;
		int oy = ti_round((nh - S) / 2.0), ox = ti_round((nw - S) / 2.0);
		rc = ti_resample(c, 0, 0, W, H, nw, nh, ox, oy);
	}
	if (rc < 0) {
		snprintf(err, errlen, "%s: out of memory while resizing", path);
		return -1;
	}
	size_t plane = (size_t)S * S;
	for (int y = 0; y < S; y++) {
		const unsigned char *row = c->out8 + (size_t)y * S * 3;
		float *o0 = out + (size_t)y * S, *o1 = o0 + plane, *o2 = o1 + plane;
		for (int x = 0; x < S; x++) {
			int sx = flip ? S - 1 - x : x;
			o0[x] = c->lut[0][row[3 * sx]];
			o1[x] = c->lut[1][row[3 * sx + 1]];
			o2[x] = c->lut[2][row[3 * sx + 2]];
		}
	}
	return 0;
}

#endif
