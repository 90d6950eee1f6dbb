/* SPDX-License-Identifier: MIT */
/*
 * tsshim-mkdata: write a synthetic ImageNet-like JPEG dataset, or verify one.
 *
 *   tsshim-mkdata [--classes N] [--train N] [--val N] [--seed S]
 *                 [--quality Q] [--threads N] [--force] ROOT
 *   tsshim-mkdata --verify [--threads N] ROOT
 *
 * Layout: ROOT/train/cNNN/NNNNN.jpg, ROOT/val/cNNN/NNNNN.jpg (the layout
 * torchvision's ImageFolder reads) and ROOT/manifest.tsv.
 *
 * Why synthetic images that look like photos: the shim's job is to save the
 * CPU time of reading and decoding, so the benchmark data must cost what
 * real photos cost to decode. Decode time in libjpeg-turbo is pixels plus
 * entropy-coded bits, so the generator aims at ImageNet's pixel counts
 * (sides 300..600, mostly 500x375) and bits per pixel (~100 KB per 500x375
 * file at quality 85, about 4 bits per pixel): regions of a per-class
 * palette with soft boundaries, illumination gradients and colour casts,
 * 1/f ("pink") value noise from 128 px cells down to single pixels, objects
 * with anti-aliased rims and their own textures or stripes, straight edges
 * (branches, wires, shadows) and sensor noise. Not flat colour (decodes too
 * fast), not white noise (too slow). Each class has its own palette.
 *
 * Kinds (the manifest's "kind" column):
 *   baseline     baseline, YCbCr 4:2:0, standard Huffman tables   (~64%)
 *   progressive  jpeg_simple_progression, 4:2:0, optimised Huffman (~20%)
 *   gray         one component (JCS_GRAYSCALE), baseline            (~4%)
 *   444          baseline, YCbCr 4:4:4                              (~6%)
 *   odd          baseline 4:2:0 with both sides odd (never a multiple of
 *                8 or 16): mostly 301..599, some ~49..95 and ~961..1099 (~6%)
 * Kinds follow a golden-ratio sequence over the image ordinal, so every
 * slice of the dataset holds them in these proportions (a small dataset
 * still has all of them), and per-image randomness picks everything else.
 *
 * Determinism: each image draws from its own splitmix64 stream seeded from
 * (seed, split, class, index) (sizes and shared texture tiles from streams
 * of their own); pixels are computed in integer arithmetic only (floating
 * point only bounds a loop, with a margin), and every compression parameter
 * is set explicitly, so a given seed and options give byte-identical files
 * with any --threads, and on any platform with the same libjpeg-turbo.
 *
 * manifest.tsv: one header line, then one line per image sorted by path
 * (byte order), tab-separated:
 *   path            relative to ROOT, e.g. train/c003/00017.jpg
 *   split           train | val
 *   class           class index (the number in cNNN)
 *   width height    pixels
 *   components      1 (gray) or 3
 *   kind            see above
 *   bytes           file size
 *   file_fnv1a64    FNV-1a 64 of the file's bytes, 16 lowercase hex digits
 *   decode_fnv1a64  FNV-1a 64 of the full decode, 16 lowercase hex digits
 * FNV-1a 64: h = 0xcbf29ce484222325; for each byte b: h ^= b,
 * h *= 0x100000001b3 (mod 2^64).
 * The decode: libjpeg(-turbo) jpeg_read_header(), then scale 1/1,
 * out_color_space left at its default (JCS_RGB for a 3-component YCbCr
 * file, JCS_GRAYSCALE for a 1-component one), dct_method JDCT_ISLOW,
 * do_fancy_upsampling TRUE, do_block_smoothing TRUE, quantize_colors
 * FALSE; the hash runs over the output scanlines top to bottom, each
 * width * components bytes with no padding (RGB interleaved). These are
 * libjpeg's defaults: Pillow's Image.open(path).tobytes() gives the same
 * bytes (mode RGB or L; tests/scenarios/mkdata.sh checks it), while draft
 * mode, DCT scaling or a conversion (ImageFolder's .convert("RGB") of a
 * gray image) give other bytes.
 *
 * A run writes into a staging directory, ROOT/.mkdata.tmp.PID, and moves
 * train/, val/ and then the manifest into ROOT only when all is written: a
 * ROOT with a manifest.tsv holds a complete dataset, and a run that fails or
 * is stopped (SIGINT, SIGTERM, SIGHUP) removes its partial output and leaves
 * ROOT as it was (with --force, the earlier dataset too). The staging
 * directory of a run that died (SIGKILL) is removed by the next run; that
 * of a live one makes the next run refuse ROOT.
 *
 * --verify re-reads every file, checks size and file hash, decodes it
 * (checking dimensions, components, kind against the JPEG header, and the
 * decode hash), checks each row's split and class against its path and
 * reports .jpg files under train/ and val/ that the manifest does not list.
 * It also reports the CPU time per decode.
 *
 * Exit status: 0 success, 1 failure (I/O, libjpeg, refused ROOT, verify
 * mismatch), 2 usage error; a stopped run, once cleaned up, dies of its signal.
 */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jpeglib.h>
#include <jerror.h>

#define PROG "tsshim-mkdata"

enum { EXIT_OK = 0, EXIT_FAIL = 1, EXIT_USAGE = 2 };

#define MAX_CLASSES 100000
#define MAX_PER_CLASS 10000000
#define MAX_IMAGES 50000000ull
#define MAX_THREADS 256
#define MANIFEST "manifest.tsv"
#define MANIFEST_HEADER "path\tsplit\tclass\twidth\theight\tcomponents\tkind\tbytes\t" \
	"file_fnv1a64\tdecode_fnv1a64"
#define REL_MAX 64 /* "train/c" + 5 digits + "/" + 8 digits + ".jpg" fits */

struct opts {
	unsigned classes, train, val, quality, threads;
	uint64_t seed;
	int force, verify;
	const char *root;
};

/* ---- hashing and randomness ---------------------------------------------- */

#define FNV_OFFSET 0xcbf29ce484222325ull
#define FNV_PRIME 0x100000001b3ull

static uint64_t fnv1a64(uint64_t h, const void *data, size_t len)
{
	const unsigned char *p = data;
	for (size_t i = 0; i < len; i++)
		h = (h ^ p[i]) * FNV_PRIME;
	return h;
}

/* splitmix64: a tiny generator with good statistics, and a good mixer. */
static uint64_t mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

struct rng { uint64_t s; };

static uint64_t rnext(struct rng *r)
{
	r->s += 0x9e3779b97f4a7c15ull;
	return mix64(r->s);
}

/* Uniform in [lo, hi]; the modulo bias is irrelevant at these ranges. */
static int rrange(struct rng *r, int lo, int hi)
{
	return lo + (int)(rnext(r) % (uint64_t)(hi - lo + 1));
}

/* ---- what each image is -------------------------------------------------- */

enum kind { K_BASELINE, K_PROGRESSIVE, K_GRAY, K_444, K_ODD, K_COUNT };
static const char *const kind_name[K_COUNT] = {"baseline", "progressive", "gray", "444", "odd"};
static const char *const split_name[2] = {"train", "val"};

struct spec {
	unsigned split, cls, idx;
	int w, h;
	enum kind kind;
	uint64_t seed; /* of this image's content stream */
	char rel[REL_MAX];
};

/* Zero-padded widths that keep byte order equal to numeric order. */
static int digits(unsigned long long n, int min)
{
	int d = 1;
	while (n >= 10) {
		n /= 10;
		d++;
	}
	return d < min ? min : d;
}

struct plan {
	const struct opts *o;
	size_t n;         /* images */
	int cdig, idig;   /* widths of class and index numbers */
	uint32_t kind_off;
};

static void plan_init(struct plan *p, const struct opts *o)
{
	unsigned per = o->train > o->val ? o->train : o->val;
	p->o = o;
	p->n = (size_t)o->classes * (o->train + o->val);
	p->cdig = digits(o->classes ? o->classes - 1 : 0, 3);
	p->idig = digits(per ? per - 1 : 0, 5);
	p->kind_off = (uint32_t)mix64(o->seed ^ 0x6b696e64ull);
}

/*
 * Ordinal -> (split, class, index) in path order (train before val, classes
 * and indices zero-padded), so the manifest needs no sort and workers that
 * take ordinals in turn write directories front to back.
 */
static void plan_image(const struct plan *p, size_t ord, struct spec *s)
{
	const struct opts *o = p->o;
	size_t ntrain = (size_t)o->classes * o->train;
	size_t k = ord;
	memset(s, 0, sizeof(*s));
	s->split = k >= ntrain;
	if (s->split)
		k -= ntrain;
	unsigned per = s->split ? o->val : o->train;
	s->cls = (unsigned)(k / per);
	s->idx = (unsigned)(k % per);
	snprintf(s->rel, sizeof(s->rel), "%s/c%0*u/%0*u.jpg", split_name[s->split], p->cdig,
		 s->cls, p->idig, s->idx);

	uint64_t h = mix64(o->seed ^ 0x746e6d6b64617461ull);
	h = mix64(h ^ (s->split + 1));
	h = mix64(h ^ ((uint64_t)s->cls << 20));
	s->seed = mix64(h ^ ((uint64_t)s->idx << 1));

	/* Golden-ratio sequence: equidistributed, so proportions hold in any slice. */
	uint32_t u = (uint32_t)(ord + 1) * 0x9e3779b9u + p->kind_off;
	const uint32_t pct = 42949673u; /* 2^32 / 100 */
	if (u < 20 * pct)
		s->kind = K_PROGRESSIVE;
	else if (u < 24 * pct)
		s->kind = K_GRAY;
	else if (u < 30 * pct)
		s->kind = K_444;
	else if (u < 36 * pct)
		s->kind = K_ODD;
	else
		s->kind = K_BASELINE;

	/* Sizes have their own stream: changing them leaves the content alone. */
	struct rng r = {mix64(s->seed ^ 0x73697a65ull)};
	if (s->kind == K_ODD) {
		switch (rnext(&r) % 8) {
		case 0: /* thumbnails */
			s->w = 49 + 2 * rrange(&r, 0, 23);
			s->h = 49 + 2 * rrange(&r, 0, 23);
			break;
		case 1: /* camera-sized */
			s->w = 961 + 2 * rrange(&r, 0, 69);
			s->h = 961 + 2 * rrange(&r, 0, 69);
			break;
		default:
			s->w = 301 + 2 * rrange(&r, 0, 149);
			s->h = 301 + 2 * rrange(&r, 0, 149);
		}
		return;
	}
	int pick = (int)(rnext(&r) % 100);
	if (pick < 40) {
		s->w = 500, s->h = 375;
	} else if (pick < 60) {
		s->w = 375, s->h = 500;
	} else if (pick < 70) {
		s->w = 500, s->h = 333;
	} else if (pick < 75) {
		s->w = 333, s->h = 500;
	} else {
		s->w = rrange(&r, 300, 600);
		s->h = rrange(&r, 300, 600);
	}
}

/* ---- image content -------------------------------------------------------- */

/*
 * Everything is fixed point. Intensities are in 1/16 grey levels (FP), so
 * 255 is 4080; blend weights and directions are 12-bit (ONE = 1.0).
 *
 * Cost matters (the generator must not dominate the run), so an image is
 * made in two layers:
 *  - smooth: region colours from the class palette, colour casts, 1/f
 *    luminance down to 16 px cells, illumination gradient, and the mask that
 *    says where the image is textured. Evaluated every STEP px on a coarse
 *    grid and interpolated: smooth by construction, 1/16 of the work.
 *  - detailed, per pixel: fine texture (cells of 1..8 px) read from a few
 *    periodic noise tiles made once per run (an image picks one tile and an
 *    offset, each object another), objects with sharp but anti-aliased rims,
 *    stripes, straight edges, sensor noise.
 */
#define FP 16
#define ONE 4096
#define MAX_SHIFT 9 /* value-noise cells are 1 << shift pixels, up to 512 */
#define MAX_OCT 4
#define MAX_SHAPES 24
#define STEP_SHIFT 2
#define STEP (1 << STEP_SHIFT)
#define TILE_SHIFT 9
#define TILE (1 << TILE_SHIFT)
#define NTILES 4
#define TILE_STD 1024 /* each tile is scaled to this standard deviation (>> 10) */

/* smoothstep(i / cell) for every cell size, 12-bit; filled once in main. */
static int32_t smooth_tab[MAX_SHIFT + 1][1 << MAX_SHIFT];
/* NTILES periodic fine-noise tiles, TILE x TILE each; read-only once made. */
static int16_t *tiles;

static void smooth_init(void)
{
	for (int k = 0; k <= MAX_SHIFT; k++) {
		int cell = 1 << k;
		for (int i = 0; i < cell; i++) {
			int64_t t = ((int64_t)i << 16) / cell; /* 16-bit t */
			int64_t s = (t * t >> 16) * (3 * 65536 - 2 * t) >> 16;
			smooth_tab[k][i] = (int32_t)(s >> 4);
		}
	}
}

static uint64_t isqrt64(uint64_t v)
{
	uint64_t r = 0, bit = 1ull << 62;
	while (bit > v)
		bit >>= 2;
	for (; bit; bit >>= 2) {
		if (v >= r + bit) {
			v -= r + bit;
			r = (r >> 1) + bit;
		} else {
			r >>= 1;
		}
	}
	return r;
}

/*
 * Fine texture tiles: periodic value noise (the lattice wraps, so a tile
 * repeats seamlessly) with octaves of 1, 2, 4, 8 px whose weights differ per
 * tile: grainy (film grain, gravel, foliage) to blotchy (bark, fabric).
 * They depend on the seed only, so every thread sees the same tiles.
 */
static int tiles_init(uint64_t seed)
{
	int32_t *acc = malloc((size_t)TILE * TILE * sizeof(*acc));
	int16_t *lat = malloc((size_t)TILE * TILE * sizeof(*lat));
	int32_t col[TILE + 1];
	tiles = malloc((size_t)NTILES * TILE * TILE * sizeof(*tiles));
	if (!acc || !lat || !tiles) {
		free(acc);
		free(lat);
		free(tiles);
		tiles = NULL;
		return -1;
	}
	for (int t = 0; t < NTILES; t++) {
		struct rng r = {mix64(seed ^ 0x74696c65ull ^ ((uint64_t)t << 40))};
		memset(acc, 0, (size_t)TILE * TILE * sizeof(*acc));
		for (int k = 0; k <= 3; k++) {
			int cell = 1 << k, n = TILE >> k, m = n - 1;
			int amp = rrange(&r, 300, 1000) * (5 - k) / 4;
			for (int i = 0; i < n * n; i++)
				lat[i] = (int16_t)((int32_t)(rnext(&r) & 0xffff) - 32768);
			for (int y = 0; y < TILE; y++) {
				const int16_t *r0 = lat + (size_t)(y >> k) * n;
				const int16_t *r1 = lat + (size_t)(((y >> k) + 1) & m) * n;
				int32_t sy = smooth_tab[k][y & (cell - 1)];
				int32_t *dst = acc + (size_t)y * TILE;
				for (int g = 0; g < n; g++)
					col[g] = r0[g] + (((r1[g] - r0[g]) * sy) >> 12);
				col[n] = col[0]; /* the tile wraps */
				for (int x = 0; x < TILE; x++) {
					int g = x >> k;
					int32_t v = col[g] + (((col[g + 1] - col[g]) *
							       smooth_tab[k][x & (cell - 1)]) >> 12);
					dst[x] += (v * amp) >> 10;
				}
			}
		}
		uint64_t sq = 0;
		for (size_t i = 0; i < (size_t)TILE * TILE; i++)
			sq += (uint64_t)((int64_t)acc[i] * acc[i]);
		int64_t sd = (int64_t)isqrt64(sq / ((size_t)TILE * TILE));
		int16_t *dst = tiles + (size_t)t * TILE * TILE;
		for (size_t i = 0; i < (size_t)TILE * TILE; i++) {
			int64_t v = sd ? (int64_t)acc[i] * TILE_STD / sd : 0;
			dst[i] = (int16_t)(v < -32767 ? -32767 : v > 32767 ? 32767 : v);
		}
	}
	free(acc);
	free(lat);
	return 0;
}

/* One octave of value noise: a random lattice, smoothly interpolated. */
struct octave {
	int shift, ox, oy, gw, gh;
	int32_t *lat;
	size_t cap;
};

struct field {
	int n;
	struct octave oct[MAX_OCT];
};

/* A field over the coarse grid: points (i * STEP, j * STEP), i < wc, j < hc. */
static int field_init(struct field *f, struct rng *r, int wc, int hc, int n, const int *shift,
		      const int *amp)
{
	int w = (wc - 1) * STEP + 1, h = (hc - 1) * STEP + 1;
	f->n = n;
	for (int i = 0; i < n; i++) {
		struct octave *o = &f->oct[i];
		int k = shift[i] < STEP_SHIFT ? STEP_SHIFT : shift[i] > MAX_SHIFT ? MAX_SHIFT : shift[i];
		int cell = 1 << k;
		o->shift = k;
		/* Random phase: octaves must not share lattice lines (visible grid). */
		o->ox = (int)(rnext(r) % (uint64_t)cell);
		o->oy = (int)(rnext(r) % (uint64_t)cell);
		o->gw = ((w - 1 + o->ox) >> k) + 2;
		o->gh = ((h - 1 + o->oy) >> k) + 2;
		size_t need = (size_t)o->gw * o->gh;
		if (need > o->cap) {
			int32_t *p = realloc(o->lat, need * sizeof(*p));
			if (!p)
				return -1;
			o->lat = p;
			o->cap = need;
		}
		for (size_t j = 0; j < need; j++) {
			int32_t v = (int32_t)(rnext(r) & 0xffff) - 32768;
			o->lat[j] = (int32_t)(((int64_t)v * amp[i]) >> 15);
		}
	}
	return 0;
}

static void field_free(struct field *f)
{
	for (int i = 0; i < MAX_OCT; i++)
		free(f->oct[i].lat);
}

/* out[0..wc) = the field on coarse row j. col: scratch of >= gw entries. */
static void field_row(const struct field *f, int j, int wc, int32_t *out, int32_t *col)
{
	memset(out, 0, (size_t)wc * sizeof(*out));
	for (int i = 0; i < f->n; i++) {
		const struct octave *o = &f->oct[i];
		int k = o->shift, cell = 1 << k, yy = j * STEP + o->oy;
		int32_t sy = smooth_tab[k][yy & (cell - 1)];
		const int32_t *r0 = o->lat + (size_t)(yy >> k) * o->gw, *r1 = r0 + o->gw;
		for (int g = 0; g < o->gw; g++)
			col[g] = r0[g] + (((r1[g] - r0[g]) * sy) >> 12);
		for (int x = 0; x < wc; x++) {
			int xx = x * STEP + o->ox, g = xx >> k;
			out[x] += col[g] + (((col[g + 1] - col[g]) * smooth_tab[k][xx & (cell - 1)]) >> 12);
		}
	}
}

/* cos(k * pi / 16), 12-bit: directions without libm (bit-exact everywhere). */
static const int16_t cos16[32] = {
	4096, 4017, 3784, 3406, 2896, 2276, 1567, 799, 0, -799, -1567, -2276, -2896, -3406,
	-3784, -4017, -4096, -4017, -3784, -3406, -2896, -2276, -1567, -799, 0, 799, 1567,
	2276, 2896, 3406, 3784, 4017,
};

static void direction(struct rng *r, int *c, int *s)
{
	int k = (int)(rnext(r) % 32);
	*c = cos16[k];
	*s = cos16[(k + 24) % 32]; /* sin x = cos(x - pi/2) */
}

/* Where an image or object reads its fine texture. */
struct texture {
	const int16_t *tile;
	int ox, oy;
	int32_t amp; /* FP per TILE_STD */
};

static void texture_init(struct texture *t, struct rng *r, int lo, int hi)
{
	t->tile = tiles + (size_t)(rnext(r) % NTILES) * TILE * TILE;
	t->ox = (int)(rnext(r) % TILE);
	t->oy = (int)(rnext(r) % TILE);
	t->amp = rrange(r, lo, hi) * FP;
}

static int32_t texel(const struct texture *t, int x, int y)
{
	int v = t->tile[(size_t)((y + t->oy) & (TILE - 1)) * TILE + ((x + t->ox) & (TILE - 1))];
	return (v * t->amp) >> 10; /* / TILE_STD */
}

enum shape_type { S_ELLIPSE, S_SHADE, S_BAND };

struct shape {
	enum shape_type type;
	int cx, cy, c, s;  /* centre (px) and direction (12-bit) */
	int a;             /* semi-major axis / half width (px) */
	int64_t ia, ib;    /* 2^24 / semi-axes */
	int32_t inv_ew;    /* 65536 / width of the anti-aliased rim (px) */
	int x0, x1, y0, y1;
	int32_t col[3];    /* FP */
	int32_t shade;     /* S_SHADE: added to every channel, FP */
	int pu, pv, p0, samp; /* stripes: phase per px in x and y, offset, amplitude FP */
	struct texture tex;
};

struct scene {
	int w, h, gray;
	int32_t pal[4][3];  /* class palette with this image's exposure, FP */
	int32_t region_gain, sharp, grad;
	int32_t noise, cnoise;
	int32_t tint[3];    /* how texture splits over R, G, B (12-bit): coloured detail */
	uint64_t noise_seed;
	struct texture tex;
	int nshapes;
	struct shape sh[MAX_SHAPES];
};

/* Integer HSV: hue 0..1535 (6 x 256), sat and val 0..255; result in FP. */
static void hsv(int hue, int sat, int val, int32_t rgb[3])
{
	int sector = (hue / 256) % 6, f = hue % 256;
	int p = val * (255 - sat) / 255;
	int q = val * (255 - sat * f / 255) / 255;
	int t = val * (255 - sat * (255 - f) / 255) / 255;
	int v3[6][3] = {{val, t, p}, {q, val, p}, {p, val, t}, {p, q, val}, {t, p, val}, {val, p, q}};
	for (int i = 0; i < 3; i++)
		rgb[i] = v3[sector][i] * FP;
}

/* A class's palette depends on (seed, class) only: classes look different. */
static void class_palette(uint64_t seed, unsigned cls, int32_t pal[4][3])
{
	struct rng r = {mix64(seed ^ 0x70616c65747465ull ^ ((uint64_t)cls << 32))};
	int hue = (int)(rnext(&r) % 1536);
	for (int i = 0; i < 4; i++) {
		int hh = (hue + rrange(&r, -180, 180) + 1536) % 1536;
		int sat = rrange(&r, 40, 220), val = rrange(&r, 60, 235);
		if (i == 3) /* a neutral: ground, shadow, sky */
			sat = rrange(&r, 0, 50);
		hsv(hh, sat, val, pal[i]);
	}
}

static int32_t clamp32(int32_t v, int32_t lo, int32_t hi)
{
	return v < lo ? lo : v > hi ? hi : v;
}

static void make_shape(struct rng *r, const struct scene *sc, struct shape *s)
{
	int w = sc->w, h = sc->h, side = w < h ? w : h;
	int pick = (int)(rnext(r) % 20);
	memset(s, 0, sizeof(*s));
	s->type = pick < 15 ? S_ELLIPSE : pick < 16 ? S_SHADE : S_BAND;
	s->cx = rrange(r, 0, w - 1);
	s->cy = rrange(r, 0, h - 1);
	direction(r, &s->c, &s->s);
	s->inv_ew = 65536 / rrange(r, 1, 3);
	s->x0 = 0, s->x1 = w - 1, s->y0 = 0, s->y1 = h - 1;
	const int32_t *pc = sc->pal[rnext(r) % 4];
	for (int i = 0; i < 3; i++)
		s->col[i] = clamp32(pc[i] + rrange(r, -40, 40) * FP, 0, 255 * FP);
	texture_init(&s->tex, r, 15, 60);
	switch (s->type) {
	case S_ELLIPSE: {
		/* Big objects, and clutter: leaves, pebbles, windows. */
		int a = rnext(r) % 5 < 2 ? rrange(r, side / 50 + 2, side / 12 + 3)
					 : rrange(r, side / 12 + 2, side * 2 / 5 + 3);
		int b = rrange(r, a / 3 + 1, a);
		s->a = a;
		s->ia = ((int64_t)1 << 24) / a;
		s->ib = ((int64_t)1 << 24) / b;
		int m = a + 4;
		s->x0 = s->cx - m, s->x1 = s->cx + m, s->y0 = s->cy - m, s->y1 = s->cy + m;
		if (rnext(r) % 2) { /* striped: fur, fabric, foliage */
			int pc2, ps2, period = rrange(r, 3, 14);
			direction(r, &pc2, &ps2);
			s->pu = pc2 * 16 / period;
			s->pv = ps2 * 16 / period;
			s->p0 = (int)(rnext(r) & 0xffff);
			s->samp = rrange(r, 6, 28) * FP;
		}
		break;
	}
	case S_SHADE: /* a shadow or light boundary across the image */
		s->shade = rrange(r, -50, 40) * FP;
		s->inv_ew = 65536 / rrange(r, 2, 12);
		break;
	case S_BAND: /* a branch, wire, pole */
		s->a = rrange(r, 1, side / 40 + 2);
		break;
	}
}

/* All scene parameters, drawn in a fixed order from the image's stream. */
static void scene_init(struct scene *sc, const struct spec *sp, const struct opts *o,
		       struct rng *r)
{
	memset(sc, 0, sizeof(*sc));
	sc->w = sp->w, sc->h = sp->h, sc->gray = sp->kind == K_GRAY;
	int32_t base[4][3];
	class_palette(o->seed, sp->cls, base);
	int expo = rrange(r, -25, 25) * FP;
	for (int i = 0; i < 4; i++)
		for (int c = 0; c < 3; c++)
			sc->pal[i][c] = clamp32(base[i][c] + expo, 0, 255 * FP);
	sc->region_gain = rrange(r, 3000, 7000);
	sc->sharp = rrange(r, 2, 8);
	sc->grad = rrange(r, -40, 40) * FP;
	sc->noise = rrange(r, 3, 10) * FP;
	sc->cnoise = rrange(r, 0, 3) * FP;
	for (int c = 0; c < 3; c++)
		sc->tint[c] = rrange(r, ONE / 2, ONE * 3 / 2);
	sc->noise_seed = rnext(r);
	texture_init(&sc->tex, r, 20, 80);
	sc->nshapes = rrange(r, 4, MAX_SHAPES);
	for (int i = 0; i < sc->nshapes; i++)
		make_shape(r, sc, &sc->sh[i]);
}

/* ---- per-thread state ------------------------------------------------------- */

struct buf {
	unsigned char *data;
	size_t cap, len;
};

static int buf_reserve(struct buf *b, size_t n)
{
	if (n <= b->cap)
		return 0;
	size_t cap = b->cap ? b->cap : 1;
	while (cap < n)
		cap *= 2;
	unsigned char *p = realloc(b->data, cap);
	if (!p)
		return -1;
	b->data = p;
	b->cap = cap;
	return 0;
}

enum { ROW_R, ROW_G, ROW_B, ROW_M, ROW_D, ROW_T, ROW_T2, ROW_COL, NROWS };
enum { PL_R, PL_G, PL_B, PL_M, NPLANES };

struct worker {
	struct field region, low, mask, chroma1, chroma2;
	int wc, hc;        /* coarse grid of the current image */
	int32_t *plane;    /* NPLANES coarse planes, wc x hc each */
	size_t plane_cap;
	int32_t *rows;     /* NROWS rows of int32 scratch */
	int rows_w;
	struct buf pix;    /* one output row for the encoder, the whole decoded image */
	struct buf jpg;    /* the compressed file */
	struct buf file;   /* --verify: the file read back */
	char err[512];
};

static int32_t *wrow(const struct worker *wk, int i)
{
	return wk->rows + (size_t)i * wk->rows_w;
}

static int32_t *wplane(const struct worker *wk, int p, int j)
{
	return wk->plane + ((size_t)p * wk->hc + j) * wk->wc;
}

static void worker_free(struct worker *wk)
{
	field_free(&wk->region);
	field_free(&wk->low);
	field_free(&wk->mask);
	field_free(&wk->chroma1);
	field_free(&wk->chroma2);
	free(wk->plane);
	free(wk->rows);
	free(wk->pix.data);
	free(wk->jpg.data);
	free(wk->file.data);
}

/* Buffers for a w x h image (kept and grown across images). */
static int worker_reserve(struct worker *wk, int w, int h)
{
	wk->wc = ((w + STEP - 1) >> STEP_SHIFT) + 1;
	wk->hc = ((h + STEP - 1) >> STEP_SHIFT) + 1;
	size_t pl = (size_t)NPLANES * wk->wc * wk->hc;
	if (pl > wk->plane_cap) {
		int32_t *p = realloc(wk->plane, pl * sizeof(*p));
		if (!p)
			return -1;
		wk->plane = p;
		wk->plane_cap = pl;
	}
	int need = w + 8; /* a pixel row (coarse_row fills up to w + 3), or a lattice row */
	if (need > wk->rows_w) {
		int32_t *p = realloc(wk->rows, NROWS * (size_t)need * sizeof(*p));
		if (!p)
			return -1;
		wk->rows = p;
		wk->rows_w = need;
	}
	return buf_reserve(&wk->pix, (size_t)w * 3) || buf_reserve(&wk->jpg, 256 * 1024);
}

/* ---- rendering ---------------------------------------------------------------- */

/* Octave shifts are relative to a ~500 px image; bigger images get bigger cells. */
static int fields_init(struct worker *wk, struct rng *r, int w, int h)
{
	int side = w > h ? w : h, wc = wk->wc, hc = wk->hc;
	int adj = side >= 800 ? 1 : side < 200 ? -2 : 0;
#define SH(...) ((const int[]){__VA_ARGS__})
	int s_region[] = {8 + adj, 7 + adj};
	int s_low[] = {7 + adj, 6 + adj, 5 + adj, 4 + adj};
	int s_mask[] = {7 + adj, 6 + adj};
	int s_chroma[] = {6 + adj, 5 + adj};
	if (field_init(&wk->region, r, wc, hc, 2, s_region, SH(4096, 2048)) ||
	    field_init(&wk->low, r, wc, hc, 4, s_low, SH(40 * FP, 24 * FP, 14 * FP, 9 * FP)) ||
	    field_init(&wk->mask, r, wc, hc, 2, s_mask, SH(6000, 3000)) ||
	    field_init(&wk->chroma1, r, wc, hc, 2, s_chroma, SH(14 * FP, 8 * FP)) ||
	    field_init(&wk->chroma2, r, wc, hc, 2, s_chroma, SH(14 * FP, 8 * FP)))
		return -1;
#undef SH
	return 0;
}

/* The smooth layer on the coarse grid: base colour (R, G, B) and texture mask. */
static void coarse_init(struct worker *wk, const struct scene *sc)
{
	int wc = wk->wc;
	int32_t *t = wrow(wk, ROW_T), *t2 = wrow(wk, ROW_T2), *col = wrow(wk, ROW_COL);
	for (int j = 0; j < wk->hc; j++) {
		int32_t *R = wplane(wk, PL_R, j), *G = wplane(wk, PL_G, j), *B = wplane(wk, PL_B, j),
			*M = wplane(wk, PL_M, j);
		/* Regions: a palette blend with sharpened transitions (object boundaries). */
		field_row(&wk->region, j, wc, t, col);
		int32_t grad = sc->grad * (2 * j * STEP - sc->h) / sc->h;
		for (int x = 0; x < wc; x++) {
			int32_t pos = clamp32(3 * ONE / 2 + ((t[x] * sc->region_gain) >> 12), 0,
					      3 * ONE - 1);
			int i = pos >> 12;
			int32_t fr = clamp32(((pos & (ONE - 1)) - ONE / 2) * sc->sharp + ONE / 2, 0, ONE);
			const int32_t *a = sc->pal[i], *b = sc->pal[i + 1];
			R[x] = a[0] + (((b[0] - a[0]) * fr) >> 12) + grad;
			G[x] = a[1] + (((b[1] - a[1]) * fr) >> 12) + grad;
			B[x] = a[2] + (((b[2] - a[2]) * fr) >> 12) + grad;
		}
		/* Colour casts that drift across the image. */
		field_row(&wk->chroma1, j, wc, t, col);
		field_row(&wk->chroma2, j, wc, t2, col);
		for (int x = 0; x < wc; x++) {
			R[x] += t[x];
			B[x] += t2[x];
			G[x] -= (t[x] + t2[x]) >> 1;
		}
		/* 1/f luminance down to 16 px; finer detail comes from the tiles. */
		field_row(&wk->low, j, wc, t, col);
		for (int x = 0; x < wc; x++) {
			R[x] += t[x];
			G[x] += t[x];
			B[x] += t[x];
		}
		field_row(&wk->mask, j, wc, t, col);
		for (int x = 0; x < wc; x++)
			M[x] = clamp32(ONE * 3 / 4 + t[x], ONE * 3 / 8, ONE);
	}
}

/* Row y of the smooth layer: bilinear interpolation of the coarse planes. */
static void coarse_row(const struct worker *wk, int y)
{
	int j = y >> STEP_SHIFT, fy = y & (STEP - 1);
	for (int p = 0; p < NPLANES; p++) {
		const int32_t *a = wplane(wk, p, j), *b = wplane(wk, p, j + 1);
		int32_t *d = wrow(wk, ROW_R + p);
		/* Whole cells: rows have room for wc * STEP entries, past w. */
		int32_t v0 = a[0] + (((b[0] - a[0]) * fy) >> STEP_SHIFT);
		for (int i = 0; i < wk->wc - 1; i++, d += STEP) {
			int32_t v1 = a[i + 1] + (((b[i + 1] - a[i + 1]) * fy) >> STEP_SHIFT);
			int32_t dv = v1 - v0;
			for (int k = 0; k < STEP; k++)
				d[k] = v0 + ((dv * k) >> STEP_SHIFT);
			v0 = v1;
		}
	}
}

/* 0..ONE coverage of a ramp centred on signed distance 0 (px * ONE). */
static int32_t ramp(int64_t dist, int32_t inv_ew)
{
	int64_t a = ((dist * inv_ew) >> 16) + ONE / 2;
	return (int32_t)(a < 0 ? 0 : a > ONE ? ONE : a);
}

struct rowset {
	int32_t *R, *G, *B, *D; /* colour and detail (texture) */
};

static inline void blend(const struct rowset *rs, int x, const int32_t c[3], int32_t d,
			 int32_t alpha)
{
	rs->R[x] += ((c[0] - rs->R[x]) * alpha) >> 12;
	rs->G[x] += ((c[1] - rs->G[x]) * alpha) >> 12;
	rs->B[x] += ((c[2] - rs->B[x]) * alpha) >> 12;
	rs->D[x] += ((d - rs->D[x]) * alpha) >> 12;
}

/*
 * The x span of row y where r^2 <= 2 (the pixel test's cutoff), widened by
 * a pixel each way. Floating point only bounds the loop: the pixels inside
 * are decided by the integer test, so rounding cannot change the output.
 */
static int ellipse_span(const struct shape *s, int y, int *x0, int *x1)
{
	double c = s->c / (double)ONE, sn = s->s / (double)ONE, dy = y - s->cy;
	double ia2 = (double)s->ia * s->ia / 281474976710656.0; /* (2^24 / a)^2 / 2^48 */
	double ib2 = (double)s->ib * s->ib / 281474976710656.0;
	double A = c * c * ia2 + sn * sn * ib2;
	double B = 2 * dy * c * sn * (ia2 - ib2);
	double C = dy * dy * (sn * sn * ia2 + c * c * ib2) - 2.0;
	double disc = B * B - 4 * A * C;
	if (disc < 0)
		return 0;
	double root = sqrt(disc);
	double lo = s->cx + (-B - root) / (2 * A) - 1, hi = s->cx + (-B + root) / (2 * A) + 1;
	if (lo > *x1 || hi < *x0)
		return 0;
	if (lo > *x0)
		*x0 = (int)lo;
	if (hi < *x1)
		*x1 = (int)hi;
	return 1;
}

static void draw_ellipse(const struct shape *s, int y, int x0, int x1, const struct rowset *rs)
{
	int dy = y - s->cy;
	if (!ellipse_span(s, y, &x0, &x1))
		return;
	/* u along the axis, v across it (px * ONE), stepped per pixel. */
	int64_t u = (int64_t)(x0 - s->cx) * s->c + (int64_t)dy * s->s;
	int64_t v = (int64_t)dy * s->c - (int64_t)(x0 - s->cx) * s->s;
	for (int x = x0; x <= x1; x++, u += s->c, v -= s->s) {
		int64_t p = u * s->ia >> 24, q = v * s->ib >> 24; /* ONE on the rim */
		int64_t r2 = p * p + q * q;
		if (r2 > (int64_t)2 * ONE * ONE)
			continue;
		/* Depth inside the rim in px: (1 - r) ~ (1 - r^2) / 2, times a. */
		int32_t alpha = ramp((((int64_t)ONE * ONE - r2) >> 13) * s->a, s->inv_ew);
		if (!alpha)
			continue;
		int32_t d = texel(&s->tex, x, y);
		if (s->samp) {
			int t = (x * s->pu + y * s->pv + s->p0) & 0xffff;
			d += ((t < 0x8000 ? t : 0xffff - t) - 0x4000) * s->samp >> 14;
		}
		blend(rs, x, s->col, d, alpha);
	}
}

static void draw_shape(const struct shape *s, int y, int w, const struct rowset *rs)
{
	if (y < s->y0 || y > s->y1)
		return;
	int x0 = s->x0 < 0 ? 0 : s->x0, x1 = s->x1 >= w ? w - 1 : s->x1;
	int dy = y - s->cy;
	switch (s->type) {
	case S_ELLIPSE:
		draw_ellipse(s, y, x0, x1, rs);
		break;
	case S_SHADE: {
		int64_t u = (int64_t)(x0 - s->cx) * s->c + (int64_t)dy * s->s;
		for (int x = x0; x <= x1; x++, u += s->c) {
			int32_t alpha = ramp(u, s->inv_ew);
			if (!alpha)
				continue;
			int32_t add = alpha == ONE ? s->shade : (s->shade * alpha) >> 12;
			rs->R[x] += add;
			rs->G[x] += add;
			rs->B[x] += add;
		}
		break;
	}
	case S_BAND: {
		/* v(x) = v0 - x * s: only the x where |v| is within the band and rim. */
		int64_t v0 = (int64_t)dy * s->c + (int64_t)s->cx * s->s;
		int64_t lim = (int64_t)(s->a + 4) * ONE;
		if (s->s != 0) {
			int64_t xa = (v0 - lim) / s->s, xb = (v0 + lim) / s->s;
			int64_t lo = (xa < xb ? xa : xb) - 1, hi = (xa < xb ? xb : xa) + 1;
			x0 = lo > x0 ? (int)lo : x0;
			x1 = hi < x1 ? (int)hi : x1;
		} else if (v0 > lim || v0 < -lim) {
			return;
		}
		for (int x = x0; x <= x1; x++) {
			int64_t v = v0 - (int64_t)x * s->s;
			int32_t alpha = ramp((int64_t)s->a * ONE - (v < 0 ? -v : v), s->inv_ew);
			if (alpha)
				blend(rs, x, s->col, texel(&s->tex, x, y), alpha);
		}
		break;
	}
	}
}

/* Render row y of the scene into out: RGB (w * 3 bytes) or grey (w bytes). */
static void render_row(const struct worker *wk, const struct scene *sc, int y, unsigned char *out)
{
	int w = sc->w;
	struct rowset rs = {wrow(wk, ROW_R), wrow(wk, ROW_G), wrow(wk, ROW_B), wrow(wk, ROW_D)};
	const int32_t *M = wrow(wk, ROW_M);

	coarse_row(wk, y);
	/* Background texture where the mask says "textured". */
	const int16_t *trow = sc->tex.tile + (size_t)((y + sc->tex.oy) & (TILE - 1)) * TILE;
	for (int x = 0; x < w; x++)
		rs.D[x] = (((trow[(x + sc->tex.ox) & (TILE - 1)] * sc->tex.amp) >> 10) * M[x]) >> 12;
	for (int i = 0; i < sc->nshapes; i++)
		draw_shape(&sc->sh[i], y, w, &rs);

	struct rng nr = {sc->noise_seed ^ ((uint64_t)y << 32)};
	uint64_t n = 0;
	for (int x = 0; x < w; x++) {
		/* 32 random bits per pixel: luma, luma, chroma, chroma. */
		n = x & 1 ? n >> 32 : rnext(&nr);
		int32_t d = rs.D[x];
		int32_t lum = (((int32_t)(n & 255) + (int32_t)(n >> 8 & 255) - 255) * sc->noise) >> 8;
		int32_t c1 = (((int32_t)(n >> 16 & 255) - 128) * sc->cnoise) >> 7;
		int32_t c2 = (((int32_t)(n >> 24 & 255) - 128) * sc->cnoise) >> 7;
		/* >> on negatives is arithmetic in GCC and Clang; clamping follows. */
		int32_t r = clamp32((rs.R[x] + ((d * sc->tint[0]) >> 12) + lum + c1 + FP / 2) >> 4, 0, 255);
		int32_t g = clamp32((rs.G[x] + ((d * sc->tint[1]) >> 12) + lum + FP / 2) >> 4, 0, 255);
		int32_t b = clamp32((rs.B[x] + ((d * sc->tint[2]) >> 12) + lum + c2 + FP / 2) >> 4, 0, 255);
		if (sc->gray) {
			out[x] = (unsigned char)((77 * r + 150 * g + 29 * b + 128) >> 8);
		} else {
			out[3 * x] = (unsigned char)r;
			out[3 * x + 1] = (unsigned char)g;
			out[3 * x + 2] = (unsigned char)b;
		}
	}
}

/* ---- libjpeg glue ------------------------------------------------------------ */

/* libjpeg's default error_exit calls exit(): report through longjmp instead. */
struct jerr {
	struct jpeg_error_mgr pub;
	jmp_buf jb;
	char msg[JMSG_LENGTH_MAX];
	int warned;
};

static void jerr_exit(j_common_ptr ci)
{
	struct jerr *e = (struct jerr *)ci->err;
	ci->err->format_message(ci, e->msg);
	longjmp(e->jb, 1);
}

/* Warnings (corrupt data) are errors here: keep the first, print nothing. */
static void jerr_emit(j_common_ptr ci, int level)
{
	struct jerr *e = (struct jerr *)ci->err;
	if (level >= 0)
		return;
	if (!e->warned)
		ci->err->format_message(ci, e->msg);
	e->warned = 1;
	ci->err->num_warnings++;
}

static void jerr_init(struct jerr *e, struct jpeg_error_mgr **slot)
{
	*slot = jpeg_std_error(&e->pub);
	e->pub.error_exit = jerr_exit;
	e->pub.emit_message = jerr_emit;
	e->warned = 0;
	e->msg[0] = 0;
}

/* Destination manager: a growable buffer we own (jpeg_mem_dest's is libjpeg's). */
struct dest {
	struct jpeg_destination_mgr pub;
	struct buf *b;
};

static void dest_init(j_compress_ptr ci)
{
	struct dest *d = (struct dest *)ci->dest;
	d->pub.next_output_byte = d->b->data;
	d->pub.free_in_buffer = d->b->cap;
}

static boolean dest_empty(j_compress_ptr ci)
{
	/* Called when the whole buffer is full (free_in_buffer is stale here). */
	struct dest *d = (struct dest *)ci->dest;
	size_t used = d->b->cap;
	if (buf_reserve(d->b, used * 2))
		ERREXIT1(ci, JERR_OUT_OF_MEMORY, 1);
	d->pub.next_output_byte = d->b->data + used;
	d->pub.free_in_buffer = d->b->cap - used;
	return TRUE;
}

static void dest_term(j_compress_ptr ci)
{
	struct dest *d = (struct dest *)ci->dest;
	d->b->len = d->b->cap - d->pub.free_in_buffer;
}

/*
 * Render the image described by sp and compress it into wk->jpg. Rows go
 * from the renderer straight to libjpeg: no full-size pixel buffer.
 */
static int make_jpeg(struct worker *wk, const struct spec *sp, const struct opts *o)
{
	struct jpeg_compress_struct ci;
	struct jerr je;
	struct dest dst = {.b = &wk->jpg};
	struct scene sc;
	struct rng r = {sp->seed};

	scene_init(&sc, sp, o, &r);
	if (worker_reserve(wk, sp->w, sp->h) || fields_init(wk, &r, sp->w, sp->h)) {
		snprintf(wk->err, sizeof(wk->err), "out of memory");
		return -1;
	}
	coarse_init(wk, &sc);

	jerr_init(&je, &ci.err);
	if (setjmp(je.jb)) {
		jpeg_destroy_compress(&ci);
		snprintf(wk->err, sizeof(wk->err), "libjpeg: %s", je.msg);
		return -1;
	}
	jpeg_create_compress(&ci);
	dst.pub.init_destination = dest_init;
	dst.pub.empty_output_buffer = dest_empty;
	dst.pub.term_destination = dest_term;
	ci.dest = &dst.pub;

	int gray = sp->kind == K_GRAY;
	ci.image_width = (JDIMENSION)sp->w;
	ci.image_height = (JDIMENSION)sp->h;
	ci.input_components = gray ? 1 : 3;
	ci.in_color_space = gray ? JCS_GRAYSCALE : JCS_RGB;
	jpeg_set_defaults(&ci);
	jpeg_set_colorspace(&ci, gray ? JCS_GRAYSCALE : JCS_YCbCr);
	jpeg_set_quality(&ci, (int)o->quality, TRUE);
	/* Explicit, so that output never depends on a library default. */
	int hs = sp->kind == K_444 ? 1 : 2;
	ci.comp_info[0].h_samp_factor = gray ? 1 : hs;
	ci.comp_info[0].v_samp_factor = gray ? 1 : hs;
	for (int c = 1; c < ci.num_components; c++)
		ci.comp_info[c].h_samp_factor = ci.comp_info[c].v_samp_factor = 1;
	ci.dct_method = JDCT_ISLOW;
	ci.arith_code = FALSE;
	ci.CCIR601_sampling = FALSE;
	ci.smoothing_factor = 0;
	ci.restart_interval = 0;
	ci.restart_in_rows = 0;
	ci.write_JFIF_header = TRUE;
	ci.JFIF_major_version = 1;
	ci.JFIF_minor_version = 1;
	ci.density_unit = 0;
	ci.X_density = ci.Y_density = 1;
	ci.write_Adobe_marker = FALSE;
	/* Baseline files use the standard tables, like most cameras; progressive
	 * mode needs optimised ones (libjpeg forces that anyway). */
	ci.optimize_coding = sp->kind == K_PROGRESSIVE;
	if (sp->kind == K_PROGRESSIVE)
		jpeg_simple_progression(&ci);

	jpeg_start_compress(&ci, TRUE);
	while (ci.next_scanline < ci.image_height) {
		JSAMPROW row = wk->pix.data;
		render_row(wk, &sc, (int)ci.next_scanline, row);
		jpeg_write_scanlines(&ci, &row, 1);
	}
	jpeg_finish_compress(&ci);
	jpeg_destroy_compress(&ci);
	return 0;
}

struct decoded {
	int w, h, comps, progressive;
	int samp[3][2];   /* h, v sampling factors of up to 3 components */
	uint64_t hash;
	uint64_t cpu_ns;  /* libjpeg's share: header to finish, not the hashing */
};

static uint64_t thread_cpu_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
	return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/*
 * Full decode with the documented parameters into wk->pix, then the hash
 * of the output pixels (after the decode, so cpu_ns is the decode alone).
 */
static int decode(struct worker *wk, const unsigned char *data, size_t len, struct decoded *d)
{
	struct jpeg_decompress_struct di;
	struct jerr je;

	memset(d, 0, sizeof(*d));
	d->cpu_ns = thread_cpu_ns();
	jerr_init(&je, &di.err);
	if (setjmp(je.jb)) {
		jpeg_destroy_decompress(&di);
		snprintf(wk->err, sizeof(wk->err), "libjpeg: %s", je.msg);
		return -1;
	}
	jpeg_create_decompress(&di);
	jpeg_mem_src(&di, data, (unsigned long)len);
	if (jpeg_read_header(&di, TRUE) != JPEG_HEADER_OK)
		ERREXIT(&di, JERR_NO_IMAGE);
	d->w = (int)di.image_width;
	d->h = (int)di.image_height;
	d->comps = di.num_components;
	d->progressive = di.progressive_mode;
	for (int c = 0; c < di.num_components && c < 3; c++) {
		d->samp[c][0] = di.comp_info[c].h_samp_factor;
		d->samp[c][1] = di.comp_info[c].v_samp_factor;
	}
	di.scale_num = di.scale_denom = 1;
	di.dct_method = JDCT_ISLOW;
	di.do_fancy_upsampling = TRUE;
	di.do_block_smoothing = TRUE;
	di.quantize_colors = FALSE;
	jpeg_start_decompress(&di);
	size_t stride = (size_t)di.output_width * di.output_components;
	size_t size = stride * di.output_height;
	if (buf_reserve(&wk->pix, size))
		ERREXIT1(&di, JERR_OUT_OF_MEMORY, 2);
	while (di.output_scanline < di.output_height) {
		JSAMPROW row = wk->pix.data + stride * di.output_scanline;
		if (jpeg_read_scanlines(&di, &row, 1) != 1)
			ERREXIT(&di, JERR_INPUT_EOF);
	}
	jpeg_finish_decompress(&di);
	jpeg_destroy_decompress(&di);
	d->cpu_ns = thread_cpu_ns() - d->cpu_ns;
	if (je.warned) {
		snprintf(wk->err, sizeof(wk->err), "libjpeg: %s", je.msg);
		return -1;
	}
	d->hash = fnv1a64(FNV_OFFSET, wk->pix.data, size);
	return 0;
}

/* Does the JPEG header say what the manifest's kind promises? */
static const char *kind_mismatch(enum kind k, const struct decoded *d)
{
	int s420 = d->comps == 3 && d->samp[0][0] == 2 && d->samp[0][1] == 2;
	int s444 = d->comps == 3 && d->samp[0][0] == 1 && d->samp[0][1] == 1;
	for (int c = 1; c < d->comps && c < 3; c++)
		if (d->samp[c][0] != 1 || d->samp[c][1] != 1)
			s420 = s444 = 0;
	switch (k) {
	case K_BASELINE: return !d->progressive && s420 ? NULL : "not baseline 4:2:0";
	case K_PROGRESSIVE: return d->progressive && s420 ? NULL : "not progressive 4:2:0";
	case K_GRAY: return !d->progressive && d->comps == 1 ? NULL : "not baseline grayscale";
	case K_444: return !d->progressive && s444 ? NULL : "not baseline 4:4:4";
	case K_ODD:
		return !d->progressive && s420 && d->w % 2 && d->h % 2 ? NULL
			: "not baseline 4:2:0 with odd sides";
	default: return "unknown kind";
	}
}

/* ---- files ------------------------------------------------------------------- */

static int write_all(int fd, const void *data, size_t len)
{
	const char *p = data;
	while (len) {
		ssize_t n = write(fd, p, len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -1;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

/* A file that cannot be written whole is removed (a full disk, a file size
 * limit): never a truncated image, even in the staging directory. */
static int write_file(const char *path, const void *data, size_t len, char *err, size_t errlen)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	if (fd < 0) {
		snprintf(err, errlen, "cannot write %s: %s", path, strerror(errno));
		return -1; /* not ours to unlink */
	}
	int rc = write_all(fd, data, len);
	int saved = errno; /* the first error is the one to report */
	if (close(fd) != 0 && rc == 0)
		rc = -1, saved = errno;
	if (rc == 0)
		return 0;
	snprintf(err, errlen, "cannot write %s: %s", path, strerror(saved));
	unlink(path);
	return -1;
}

static int read_file(const char *path, struct buf *b, char *err, size_t errlen)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	struct stat st;
	if (fd < 0 || fstat(fd, &st) != 0)
		goto fail;
	if (!S_ISREG(st.st_mode)) {
		close(fd);
		snprintf(err, errlen, "%s: not a regular file", path);
		return -1;
	}
	b->len = 0;
	for (;;) {
		if (buf_reserve(b, b->len + 65536)) {
			errno = ENOMEM;
			goto fail;
		}
		ssize_t n = read(fd, b->data + b->len, b->cap - b->len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			goto fail;
		if (n == 0)
			break;
		b->len += (size_t)n;
	}
	close(fd);
	return 0;
fail:
	snprintf(err, errlen, "cannot read %s: %s", path, strerror(errno));
	if (fd >= 0)
		close(fd);
	return -1;
}

static int join_path(char *dst, size_t n, const char *root, const char *rel)
{
	int len = snprintf(dst, n, "%s/%s", root, rel);
	return len < 0 || (size_t)len >= n ? -1 : 0;
}

/* mkdir -p; an existing directory is fine. */
static int mkdir_p(const char *path, char *err, size_t errlen)
{
	char tmp[PATH_MAX];
	if (snprintf(tmp, sizeof(tmp), "%s", path) >= (int)sizeof(tmp)) {
		snprintf(err, errlen, "path too long: %s", path);
		return -1;
	}
	for (char *p = tmp + 1;; p++) {
		if (*p != '/' && *p != 0)
			continue;
		char c = *p;
		*p = 0;
		struct stat st;
		if (mkdir(tmp, 0755) != 0 && errno != EEXIST) {
			snprintf(err, errlen, "cannot create directory %s: %s", tmp, strerror(errno));
			return -1;
		}
		if (stat(tmp, &st) != 0 || !S_ISDIR(st.st_mode)) {
			snprintf(err, errlen, "%s exists and is not a directory", tmp);
			return -1;
		}
		*p = c;
		if (!c)
			return 0;
	}
}

/* 1: has entries, 0: empty or missing, -1: error (reported). */
static int dir_nonempty(const char *path, char *err, size_t errlen)
{
	DIR *d = opendir(path);
	if (!d) {
		if (errno == ENOENT)
			return 0;
		snprintf(err, errlen, "cannot open %s: %s", path, strerror(errno));
		return -1;
	}
	struct dirent *e;
	int found = 0;
	while (!found && (e = readdir(d)))
		found = strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
	closedir(d);
	return found;
}

/* A name made of prefix then one or more digits then suffix. */
static int name_is(const char *name, const char *prefix, const char *suffix)
{
	size_t pl = strlen(prefix), sl = strlen(suffix), n = strlen(name);
	if (n <= pl + sl || strncmp(name, prefix, pl) || strcmp(name + n - sl, suffix))
		return 0;
	for (size_t i = pl; i < n - sl; i++)
		if (!isdigit((unsigned char)name[i]))
			return 0;
	return 1;
}

/*
 * --force: remove an earlier dataset's images (ROOT/{train,val}/cN/N.jpg),
 * its then-empty directories and its manifest, so that a smaller dataset
 * written over a bigger one leaves no stale classes behind for ImageFolder.
 * Anything else is left alone. The manifest goes first: a ROOT with a
 * manifest holds a complete dataset.
 */
static int remove_old_dataset(const char *root, char *err, size_t errlen)
{
	char p[PATH_MAX], q[PATH_MAX];
	snprintf(p, sizeof(p), "%s/" MANIFEST, root);
	if (unlink(p) != 0 && errno != ENOENT) {
		snprintf(err, errlen, "cannot remove %s: %s", p, strerror(errno));
		return -1;
	}
	for (int s = 0; s < 2; s++) {
		snprintf(p, sizeof(p), "%s/%s", root, split_name[s]);
		DIR *d = opendir(p);
		if (!d)
			continue;
		struct dirent *e;
		while ((e = readdir(d))) {
			if (!name_is(e->d_name, "c", ""))
				continue;
			if (snprintf(q, sizeof(q), "%s/%s", p, e->d_name) >= (int)sizeof(q))
				continue;
			DIR *cd = opendir(q);
			if (!cd)
				continue;
			struct dirent *f;
			char r[PATH_MAX];
			while ((f = readdir(cd))) {
				if (!name_is(f->d_name, "", ".jpg"))
					continue;
				if (snprintf(r, sizeof(r), "%s/%s", q, f->d_name) >= (int)sizeof(r))
					continue;
				if (unlink(r) != 0 && errno != ENOENT) {
					snprintf(err, errlen, "cannot remove %s: %s", r, strerror(errno));
					closedir(cd);
					closedir(d);
					return -1;
				}
			}
			closedir(cd);
			rmdir(q); /* fails harmlessly if something else lives there */
		}
		closedir(d);
		rmdir(p);
	}
	return 0;
}

/*
 * rm -r NAME under the directory PARENT (an open fd): for the staging
 * directory, which only this program writes. Symbolic links are removed,
 * never followed. 0 or -errno.
 */
static int remove_tree_at(int parent, const char *name)
{
	int fd = openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return errno == ENOENT ? 0 : -errno;
	DIR *d = fdopendir(fd);
	if (!d) {
		int rc = -errno;
		close(fd);
		return rc;
	}
	int rc = 0;
	struct dirent *e;
	while (rc == 0 && (e = readdir(d))) {
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		if (unlinkat(fd, e->d_name, 0) == 0 || errno == ENOENT)
			continue;
		rc = errno == EISDIR ? remove_tree_at(fd, e->d_name) : -errno;
	}
	closedir(d);
	if (rc == 0 && unlinkat(parent, name, AT_REMOVEDIR) != 0 && errno != ENOENT)
		rc = -errno;
	return rc;
}

static int remove_tree(const char *path)
{
	return remove_tree_at(AT_FDCWD, path);
}

/*
 * Move the directory SRC to DST. Where DST exists and is not empty (--force
 * left unrelated files in it), SRC's entries move into it one by one.
 * 0 or -errno.
 */
static int move_into(const char *src, const char *dst)
{
	if (rename(src, dst) == 0)
		return 0;
	if (errno != EEXIST && errno != ENOTEMPTY)
		return -errno;
	DIR *d = opendir(src);
	if (!d)
		return -errno;
	char s[PATH_MAX], t[PATH_MAX];
	int rc = 0;
	struct dirent *e;
	while (rc == 0 && (e = readdir(d))) {
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		if (join_path(s, sizeof(s), src, e->d_name) != 0 ||
		    join_path(t, sizeof(t), dst, e->d_name) != 0)
			rc = -ENAMETOOLONG;
		else
			rc = move_into(s, t);
	}
	closedir(d);
	if (rc == 0 && rmdir(src) != 0)
		rc = -errno;
	return rc;
}

/* ---- SIGINT, SIGTERM, SIGHUP --------------------------------------------------- */

/*
 * While generating, these signals stop the run cleanly: the handler notes
 * the signal, workers stop taking images, and generate() removes the
 * partial output before dying of the signal itself. 0: none seen.
 */
static atomic_int stop_signal;

static void note_stop_signal(int sig)
{
	atomic_store(&stop_signal, sig); /* lock-free: async-signal-safe */
}

static const int stop_signals[] = {SIGINT, SIGTERM, SIGHUP};

static void catch_stop_signals(void)
{
	struct sigaction sa = {.sa_handler = note_stop_signal, .sa_flags = SA_RESTART};
	sigemptyset(&sa.sa_mask);
	for (size_t i = 0; i < sizeof(stop_signals) / sizeof(stop_signals[0]); i++) {
		struct sigaction old;
		/* One ignored at start stays ignored (nohup, a shell's background job). */
		if (sigaction(stop_signals[i], NULL, &old) == 0 && old.sa_handler != SIG_IGN)
			sigaction(stop_signals[i], &sa, NULL);
	}
}

static const char *signal_name(int sig)
{
	return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "SIGHUP";
}

/* End as the signal would have ended us, so that the caller (a shell) sees it. */
static void die_of_signal(int sig)
{
	signal(sig, SIG_DFL);
	raise(sig);
}

/* ---- the thread pool and progress ----------------------------------------------- */

struct entry {
	struct spec sp;          /* rel, split, cls, kind, w, h */
	int comps;
	size_t bytes;
	uint64_t file_hash, decode_hash;
	uint64_t decode_ns;      /* --verify: CPU time of the decode (libjpeg only) */
	char *error;             /* --verify: what is wrong with it (malloc'd) */
};

struct pool;
typedef int (*job_fn)(struct pool *, struct worker *, size_t);

struct pool {
	const struct opts *o;
	const char *dir;         /* where the images are: ROOT, or the staging directory */
	const struct plan *plan;
	struct entry *e;
	size_t n;
	job_fn fn;
	atomic_size_t next, done;
	atomic_uint_fast64_t bytes;
	atomic_int failed;
	pthread_mutex_t lock;    /* progress output and error */
	char error[600];
	int tty;
	struct timespec t0;
	double last_print;
	int last_decile;
};

static double since(const struct timespec *t0)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)(t.tv_sec - t0->tv_sec) + (double)(t.tv_nsec - t0->tv_nsec) / 1e9;
}

static void progress_line(struct pool *p, size_t done, double el)
{
	fprintf(stderr, "%smkdata: %zu/%zu images, %.0f MB, %.0f img/s%s", p->tty ? "\r" : "",
		done, p->n, (double)atomic_load(&p->bytes) / 1e6, el > 0 ? (double)done / el : 0.0,
		p->tty ? "\033[K" : "\n");
	fflush(stderr);
}

/* In place ~10 times a second on a terminal, else a line per 10%. */
static void progress(struct pool *p)
{
	size_t done = atomic_fetch_add(&p->done, 1) + 1;
	pthread_mutex_lock(&p->lock);
	double el = since(&p->t0);
	if (p->tty ? el - p->last_print >= 0.1 || done == p->n
		   : (int)(done * 10 / p->n) > p->last_decile) {
		p->last_print = el;
		p->last_decile = (int)(done * 10 / p->n);
		progress_line(p, done, el);
	}
	pthread_mutex_unlock(&p->lock);
}

static void pool_fail(struct pool *p, const char *msg)
{
	pthread_mutex_lock(&p->lock);
	if (!atomic_load(&p->failed))
		snprintf(p->error, sizeof(p->error), "%s", msg);
	atomic_store(&p->failed, 1);
	pthread_mutex_unlock(&p->lock);
}

static void *pool_thread(void *arg)
{
	struct pool *p = arg;
	struct worker wk;
	memset(&wk, 0, sizeof(wk));
	while (!atomic_load(&p->failed) && !atomic_load(&stop_signal)) {
		size_t i = atomic_fetch_add(&p->next, 1);
		if (i >= p->n)
			break;
		if (p->fn(p, &wk, i) != 0) {
			pool_fail(p, wk.err);
			break;
		}
		progress(p);
	}
	worker_free(&wk);
	return NULL;
}

static int pool_run(struct pool *p, unsigned threads)
{
	pthread_t tid[MAX_THREADS];
	unsigned started = 0;
	if (threads > p->n)
		threads = p->n ? (unsigned)p->n : 1;
	pthread_mutex_init(&p->lock, NULL);
	p->tty = isatty(STDERR_FILENO);
	clock_gettime(CLOCK_MONOTONIC, &p->t0);
	for (; started < threads; started++) {
		int rc = pthread_create(&tid[started], NULL, pool_thread, p);
		if (rc != 0) {
			if (started == 0) {
				snprintf(p->error, sizeof(p->error), "cannot start a thread: %s",
					 strerror(rc));
				atomic_store(&p->failed, 1);
			}
			break; /* fewer threads is fine */
		}
	}
	for (unsigned i = 0; i < started; i++)
		/* cppcheck-suppress uninitvar ; tid[0..started) were set by pthread_create */
		pthread_join(tid[i], NULL);
	if (p->tty && atomic_load(&p->done))
		fputc('\n', stderr);
	pthread_mutex_destroy(&p->lock);
	return atomic_load(&p->failed) ? -1 : 0;
}

/* ---- generate ------------------------------------------------------------------ */

static int gen_one(struct pool *p, struct worker *wk, size_t i)
{
	struct entry *e = &p->e[i];
	struct decoded d;
	char path[PATH_MAX];

	plan_image(p->plan, i, &e->sp);
	if (make_jpeg(wk, &e->sp, p->o) != 0 || decode(wk, wk->jpg.data, wk->jpg.len, &d) != 0) {
		char m[sizeof(wk->err)];
		snprintf(m, sizeof(m), "%s", wk->err);
		snprintf(wk->err, sizeof(wk->err), "%s: %s", e->sp.rel, m);
		return -1;
	}
	/* Our own decode must agree with what we meant to write. */
	const char *bad = kind_mismatch(e->sp.kind, &d);
	if (bad || d.w != e->sp.w || d.h != e->sp.h) {
		snprintf(wk->err, sizeof(wk->err), "%s: internal error: decode is %dx%d, %s",
			 e->sp.rel, d.w, d.h, bad ? bad : "kind ok");
		return -1;
	}
	e->comps = d.comps;
	e->bytes = wk->jpg.len;
	e->file_hash = fnv1a64(FNV_OFFSET, wk->jpg.data, wk->jpg.len);
	e->decode_hash = d.hash;
	if (join_path(path, sizeof(path), p->dir, e->sp.rel) != 0) {
		snprintf(wk->err, sizeof(wk->err), "path too long under %s", p->dir);
		return -1;
	}
	if (write_file(path, wk->jpg.data, wk->jpg.len, wk->err, sizeof(wk->err)) != 0)
		return -1;
	atomic_fetch_add(&p->bytes, wk->jpg.len);
	return 0;
}

static int cmp_entry(const void *a, const void *b)
{
	return strcmp(((const struct entry *)a)->sp.rel, ((const struct entry *)b)->sp.rel);
}

/* Into DIR, through a temporary file: DIR never holds a partial manifest. */
static int write_manifest(const char *dir, struct entry *e, size_t n, char *err, size_t errlen)
{
	char path[PATH_MAX], tmp[PATH_MAX];
	snprintf(path, sizeof(path), "%s/" MANIFEST, dir);
	if (snprintf(tmp, sizeof(tmp), "%s/." MANIFEST ".tmp.%ld", dir, (long)getpid()) >=
	    (int)sizeof(tmp)) {
		snprintf(err, errlen, "path too long under %s", dir);
		return -1;
	}
	/* Already in path order by construction; sorting keeps that a guarantee. */
	qsort(e, n, sizeof(*e), cmp_entry);
	FILE *f = fopen(tmp, "we");
	if (!f)
		goto fail;
	fputs(MANIFEST_HEADER "\n", f);
	for (size_t i = 0; i < n; i++)
		fprintf(f, "%s\t%s\t%u\t%d\t%d\t%d\t%s\t%zu\t%016" PRIx64 "\t%016" PRIx64 "\n",
			e[i].sp.rel, split_name[e[i].sp.split], e[i].sp.cls, e[i].sp.w, e[i].sp.h,
			e[i].comps, kind_name[e[i].sp.kind], e[i].bytes, e[i].file_hash,
			e[i].decode_hash);
	if (fflush(f) != 0 || ferror(f) || fsync(fileno(f)) != 0) {
		int saved = errno;
		fclose(f);
		errno = saved;
		goto fail;
	}
	if (fclose(f) != 0 || rename(tmp, path) != 0)
		goto fail;
	return 0;
fail:
	snprintf(err, errlen, "cannot write %s: %s", path, strerror(errno));
	unlink(tmp);
	return -1;
}

/*
 * The staging directory, ROOT/.mkdata.tmp.PID: a failed or interrupted run
 * must not leave a partial dataset that a trainer could take for a whole
 * one. Inside ROOT, so that moving the dataset into place is renames.
 */
#define STAGING_PREFIX ".mkdata.tmp."

/* The pid in a staging directory's name, or 0 for any other name. */
static long staging_pid(const char *name)
{
	if (!name_is(name, STAGING_PREFIX, ""))
		return 0;
	errno = 0;
	long pid = strtol(name + strlen(STAGING_PREFIX), NULL, 10);
	return errno || pid > INT_MAX ? 0 : pid;
}

static int process_alive(long pid)
{
	return pid != (long)getpid() && (kill((pid_t)pid, 0) == 0 || errno == EPERM);
}

/*
 * A staging directory of a live process means another run writes into
 * ROOT: refuse. One whose run is gone (SIGKILL, a crash, a power cut) never
 * held a dataset: remove it, and say so.
 */
static int clear_stale_staging(const char *root, char *err, size_t errlen)
{
	DIR *d = opendir(root);
	if (!d) {
		snprintf(err, errlen, "cannot open %s: %s", root, strerror(errno));
		return -1;
	}
	char path[PATH_MAX];
	int rc = 0, r;
	struct dirent *e;
	while (rc == 0 && (e = readdir(d))) {
		long pid = staging_pid(e->d_name);
		if (!pid)
			continue;
		if (join_path(path, sizeof(path), root, e->d_name) != 0) {
			snprintf(err, errlen, "path too long under %s", root);
			rc = -1;
		} else if (process_alive(pid)) {
			snprintf(err, errlen, "another run (pid %ld) is writing into %s; if that "
				 "process is not " PROG ", remove %s", pid, root, path);
			rc = -1;
		} else if ((r = remove_tree(path)) != 0) {
			snprintf(err, errlen, "cannot remove %s: %s", path, strerror(-r));
			rc = -1;
		} else {
			fprintf(stderr, PROG ": removed %s, left by an interrupted run\n", path);
		}
	}
	closedir(d);
	return rc;
}

/*
 * ROOT must be a directory (made if missing) that is empty, or not empty
 * and --force given. *replace: commit() must remove an earlier dataset
 * first; *made: ROOT was made here (a failed run removes it again).
 */
static int prepare_root(const struct opts *o, int *replace, int *made, char *err,
			size_t errlen)
{
	struct stat st;
	*replace = *made = 0;
	if (stat(o->root, &st) != 0) {
		if (errno != ENOENT) {
			snprintf(err, errlen, "cannot open %s: %s", o->root, strerror(errno));
			return -1;
		}
		*made = 1;
		return mkdir_p(o->root, err, errlen);
	}
	if (!S_ISDIR(st.st_mode)) {
		snprintf(err, errlen, "%s exists and is not a directory", o->root);
		return -1;
	}
	if (clear_stale_staging(o->root, err, errlen) != 0)
		return -1;
	int ne = dir_nonempty(o->root, err, errlen);
	if (ne < 0)
		return -1;
	if (ne && !o->force) {
		snprintf(err, errlen, "%s is not empty; use --force to write into it "
			 "(replaces an earlier mkdata dataset there)", o->root);
		return -1;
	}
	*replace = ne;
	return 0;
}

/* ROOT/.mkdata.tmp.PID into STAGE; STAGE is "" unless it was made. */
static int make_staging(const char *root, char *stage, size_t n, char *err, size_t errlen)
{
	if (snprintf(stage, n, "%s/" STAGING_PREFIX "%ld", root, (long)getpid()) >= (int)n) {
		stage[0] = 0;
		snprintf(err, errlen, "path too long under %s", root);
		return -1;
	}
	if (mkdir(stage, 0755) != 0) {
		snprintf(err, errlen, "cannot create directory %s: %s", stage, strerror(errno));
		stage[0] = 0;
		return -1;
	}
	return 0;
}

/* The class directories of the splits that get images, under DIR. */
static int make_class_dirs(const struct plan *plan, const char *dir, char *err, size_t errlen)
{
	const struct opts *o = plan->o;
	char path[PATH_MAX];
	for (int s = 0; s < 2; s++) {
		if (!(s ? o->val : o->train))
			continue;
		for (unsigned c = 0; c < o->classes && !atomic_load(&stop_signal); c++) {
			snprintf(path, sizeof(path), "%s/%s/c%0*u", dir, split_name[s], plan->cdig, c);
			if (mkdir_p(path, err, errlen) != 0)
				return -1;
		}
	}
	return 0;
}

/*
 * Every image, then the manifest, into STAGE. 0 also when a stop signal cut
 * it short (the caller looks).
 */
static int build_dataset(struct pool *p, const char *stage, char *err, size_t errlen)
{
	if (make_class_dirs(p->plan, stage, err, errlen) != 0)
		return -1;
	p->dir = stage;
	if (pool_run(p, p->o->threads) != 0) {
		snprintf(err, errlen, "%s", p->error);
		return -1;
	}
	if (atomic_load(&stop_signal))
		return 0;
	return write_manifest(stage, p->e, p->n, err, errlen);
}

/*
 * Move the finished dataset from STAGE into ROOT: the earlier one out
 * (--force), then train/ and val/, the manifest last. A failure halfway
 * removes what was moved: ROOT never holds part of a dataset.
 */
static int commit(const struct opts *o, const char *stage, int replace, char *err,
		  size_t errlen)
{
	static const char *const what[] = {"train", "val", MANIFEST};
	char src[PATH_MAX], dst[PATH_MAX];
	if (replace && remove_old_dataset(o->root, err, errlen) != 0)
		return -1;
	for (int i = 0; i < 3; i++) {
		if ((i == 0 && !o->train) || (i == 1 && !o->val))
			continue;
		int r = -ENAMETOOLONG;
		if (join_path(src, sizeof(src), stage, what[i]) == 0 &&
		    join_path(dst, sizeof(dst), o->root, what[i]) == 0)
			r = move_into(src, dst);
		if (r != 0) {
			char ignored[600];
			snprintf(err, errlen, "cannot move %s into %s: %s", what[i], o->root,
				 strerror(-r));
			remove_old_dataset(o->root, ignored, sizeof(ignored));
			return -1;
		}
	}
	return 0;
}

/* After a failure or a stop signal: the staging directory goes, and ROOT if made here. */
static void discard(const struct opts *o, const char *stage, int made)
{
	int r = stage[0] ? remove_tree(stage) : 0;
	if (r != 0)
		fprintf(stderr, PROG ": cannot remove %s: %s\n", stage, strerror(-r));
	if (made)
		rmdir(o->root);
}

static int generate(const struct opts *o)
{
	char err[600], stage[PATH_MAX] = "";
	int replace, made, rc = -1, sig = 0;
	if (prepare_root(o, &replace, &made, err, sizeof(err)) != 0) {
		fprintf(stderr, PROG ": %s\n", err);
		return EXIT_FAIL;
	}
	struct plan plan;
	plan_init(&plan, o);
	struct pool *p = calloc(1, sizeof(*p));
	struct entry *e = calloc(plan.n, sizeof(*e));
	catch_stop_signals(); /* from here on, a signal has something to clean up */
	if (!p || !e) {
		snprintf(err, sizeof(err), "out of memory for %zu images", plan.n);
	} else if (make_staging(o->root, stage, sizeof(stage), err, sizeof(err)) == 0) {
		p->o = o, p->plan = &plan, p->e = e, p->n = plan.n, p->fn = gen_one;
		rc = build_dataset(p, stage, err, sizeof(err));
		sig = atomic_load(&stop_signal); /* once committing, the run completes */
		if (rc == 0 && !sig)
			rc = commit(o, stage, replace, err, sizeof(err));
	}
	if (rc == 0 && !sig) {
		discard(o, stage, 0); /* empty by now: only the directory goes */
		printf("mkdata: wrote %zu images (%.1f MB) to %s in %.2f s\n", plan.n,
		       (double)atomic_load(&p->bytes) / 1e6, o->root, since(&p->t0));
		rc = fflush(stdout) == 0 ? EXIT_OK : EXIT_FAIL;
	} else {
		if (rc != 0)
			fprintf(stderr, PROG ": %s\n", err);
		discard(o, stage, made);
		fprintf(stderr, PROG ": %s%s%sremoved the partial output; no dataset written to %s\n",
			sig ? "interrupted by " : "", sig ? signal_name(sig) : "", sig ? ": " : "",
			o->root);
		rc = EXIT_FAIL;
	}
	free(e);
	free(p);
	if (sig)
		die_of_signal(sig);
	return rc;
}

/* ---- verify ------------------------------------------------------------------- */

static void __attribute__((format(printf, 2, 3)))
set_error(struct entry *e, const char *fmt, ...)
{
	if (e->error)
		return; /* the first problem is the interesting one */
	va_list ap;
	va_start(ap, fmt);
	if (vasprintf(&e->error, fmt, ap) < 0)
		e->error = NULL;
	va_end(ap);
	if (!e->error)
		e->error = strdup("(out of memory describing the problem)");
}

/* A problem with one image is a finding, not a failure of the run: return 0. */
static int verify_one(struct pool *p, struct worker *wk, size_t i)
{
	struct entry *e = &p->e[i];
	char path[PATH_MAX];
	struct decoded d;

	if (join_path(path, sizeof(path), p->dir, e->sp.rel) != 0) {
		set_error(e, "path too long");
		return 0;
	}
	if (read_file(path, &wk->file, wk->err, sizeof(wk->err)) != 0) {
		set_error(e, "%s", wk->err);
		return 0;
	}
	atomic_fetch_add(&p->bytes, wk->file.len);
	if (wk->file.len != e->bytes)
		set_error(e, "size %zu, manifest says %zu", wk->file.len, e->bytes);
	uint64_t fh = fnv1a64(FNV_OFFSET, wk->file.data, wk->file.len);
	if (fh != e->file_hash)
		set_error(e, "file hash %016" PRIx64 ", manifest says %016" PRIx64, fh,
			  e->file_hash);
	if (decode(wk, wk->file.data, wk->file.len, &d) != 0) {
		set_error(e, "decode failed: %s", wk->err);
		return 0;
	}
	e->decode_ns = d.cpu_ns;
	const char *bad = kind_mismatch(e->sp.kind, &d);
	if (d.w != e->sp.w || d.h != e->sp.h)
		set_error(e, "decodes to %dx%d, manifest says %dx%d", d.w, d.h, e->sp.w, e->sp.h);
	if (d.comps != e->comps)
		set_error(e, "%d components, manifest says %d", d.comps, e->comps);
	if (bad)
		set_error(e, "kind %s, but the file is %s", kind_name[e->sp.kind], bad);
	if (d.hash != e->decode_hash)
		set_error(e, "decode hash %016" PRIx64 ", manifest says %016" PRIx64, d.hash,
			  e->decode_hash);
	return 0;
}

struct manifest {
	char *text;
	struct entry *e;
	size_t n;
};

static int parse_u64(const char *s, int base, uint64_t max, uint64_t *out)
{
	char *end;
	if (!*s || !isxdigit((unsigned char)*s))
		return -1;
	errno = 0;
	unsigned long long v = strtoull(s, &end, base);
	if (errno || *end || v > max)
		return -1;
	*out = v;
	return 0;
}

static int parse_line(char *line, struct entry *e)
{
	char *f[10];
	int n = 0;
	for (char *s = line, *tab; n < 10; s = tab + 1) {
		f[n++] = s;
		tab = strchr(s, '\t');
		if (!tab)
			break;
		*tab = 0;
	}
	uint64_t cls, w, h, comps, bytes;
	if (n != 10 || strlen(f[0]) >= REL_MAX || strstr(f[0], "..") || f[0][0] == '/')
		return -1;
	snprintf(e->sp.rel, sizeof(e->sp.rel), "%s", f[0]);
	if (!strcmp(f[1], "train"))
		e->sp.split = 0;
	else if (!strcmp(f[1], "val"))
		e->sp.split = 1;
	else
		return -1;
	int k;
	for (k = 0; k < K_COUNT && strcmp(f[6], kind_name[k]); k++)
		;
	if (k == K_COUNT || parse_u64(f[2], 10, MAX_CLASSES, &cls) || parse_u64(f[3], 10, 65535, &w) ||
	    parse_u64(f[4], 10, 65535, &h) || parse_u64(f[5], 10, 4, &comps) ||
	    parse_u64(f[7], 10, SIZE_MAX, &bytes) || strlen(f[8]) != 16 || strlen(f[9]) != 16 ||
	    parse_u64(f[8], 16, UINT64_MAX, &e->file_hash) ||
	    parse_u64(f[9], 16, UINT64_MAX, &e->decode_hash))
		return -1;
	e->sp.kind = (enum kind)k;
	e->sp.cls = (unsigned)cls, e->sp.w = (int)w, e->sp.h = (int)h;
	e->comps = (int)comps, e->bytes = (size_t)bytes;
	return 0;
}

static int load_manifest(const char *root, struct manifest *m)
{
	char path[PATH_MAX], err[600];
	struct buf b = {0};
	memset(m, 0, sizeof(*m));
	snprintf(path, sizeof(path), "%s/" MANIFEST, root);
	if (read_file(path, &b, err, sizeof(err)) != 0 || buf_reserve(&b, b.len + 1) != 0) {
		fprintf(stderr, PROG ": %s\n", err);
		free(b.data);
		return -1;
	}
	b.data[b.len] = 0;
	m->text = (char *)b.data;
	size_t lines = 0;
	for (size_t i = 0; i < b.len; i++)
		lines += b.data[i] == '\n';
	m->e = calloc(lines ? lines : 1, sizeof(*m->e));
	if (!m->e) {
		fprintf(stderr, PROG ": out of memory\n");
		return -1;
	}
	char *save = NULL, *line = strtok_r(m->text, "\n", &save);
	if (!line || strcmp(line, MANIFEST_HEADER) != 0) {
		fprintf(stderr, PROG ": %s: missing or unexpected header line\n", path);
		return -1;
	}
	size_t lineno = 1;
	while ((line = strtok_r(NULL, "\n", &save))) {
		lineno++;
		struct entry *e = &m->e[m->n];
		if (parse_line(line, e) != 0) {
			fprintf(stderr, PROG ": %s:%zu: malformed line\n", path, lineno);
			return -1;
		}
		if (m->n && strcmp(m->e[m->n - 1].sp.rel, e->sp.rel) >= 0) {
			fprintf(stderr, PROG ": %s:%zu: not sorted by path, or a duplicate\n", path,
				lineno);
			return -1;
		}
		m->n++;
	}
	return 0;
}

/*
 * A row's split and class must be those of its path, which the generator
 * writes as SPLIT/cNNN/ with classes zero-padded to the digits of the
 * largest (at least 3): a trainer takes labels from the path, a checker of
 * the data from the columns.
 */
static void check_row_paths(struct manifest *m)
{
	unsigned max_cls = 0;
	for (size_t i = 0; i < m->n; i++)
		if (m->e[i].sp.cls > max_cls)
			max_cls = m->e[i].sp.cls;
	int cdig = digits(max_cls, 3);
	char want[REL_MAX];
	for (size_t i = 0; i < m->n; i++) {
		struct entry *e = &m->e[i];
		int n = snprintf(want, sizeof(want), "%s/c%0*u/", split_name[e->sp.split], cdig,
				 e->sp.cls);
		if (strncmp(e->sp.rel, want, (size_t)n) != 0)
			set_error(e, "the manifest says split %s, class %u, but the path is not "
				  "under %s", split_name[e->sp.split], e->sp.cls, want);
	}
}

static void manifest_free(struct manifest *m)
{
	for (size_t i = 0; i < m->n; i++)
		free(m->e[i].error);
	free(m->e);
	free(m->text);
}

static int cmp_rel(const void *key, const void *elem)
{
	return strcmp(key, ((const struct entry *)elem)->sp.rel);
}

/* Images on disk that the manifest does not list (ImageFolder would train on them). */
static size_t report_unlisted(const char *root, const struct manifest *m)
{
	size_t extra = 0;
	char p[PATH_MAX], q[PATH_MAX], rel[PATH_MAX];
	for (int s = 0; s < 2; s++) {
		snprintf(p, sizeof(p), "%s/%s", root, split_name[s]);
		DIR *d = opendir(p);
		if (!d)
			continue;
		struct dirent *e;
		while ((e = readdir(d))) {
			if (e->d_name[0] == '.')
				continue;
			snprintf(q, sizeof(q), "%s/%s", p, e->d_name);
			DIR *cd = opendir(q);
			if (!cd)
				continue;
			struct dirent *f;
			while ((f = readdir(cd))) {
				if (f->d_name[0] == '.')
					continue;
				snprintf(rel, sizeof(rel), "%s/%s/%s", split_name[s], e->d_name,
					 f->d_name);
				if (!bsearch(rel, m->e, m->n, sizeof(*m->e), cmp_rel)) {
					fprintf(stderr, PROG ": %s: not in the manifest\n", rel);
					extra++;
				}
			}
			closedir(cd);
		}
		closedir(d);
	}
	return extra;
}

static int verify(const struct opts *o)
{
	struct manifest m;
	if (load_manifest(o->root, &m) != 0) {
		manifest_free(&m);
		return EXIT_FAIL;
	}
	struct pool *p = calloc(1, sizeof(*p));
	if (!p) {
		fprintf(stderr, PROG ": out of memory\n");
		manifest_free(&m);
		return EXIT_FAIL;
	}
	check_row_paths(&m);
	p->o = o, p->dir = o->root, p->e = m.e, p->n = m.n, p->fn = verify_one;
	int rc = EXIT_FAIL;
	if (pool_run(p, o->threads) != 0) {
		fprintf(stderr, PROG ": %s\n", p->error);
		goto out;
	}
	size_t bad = 0, per[K_COUNT] = {0};
	uint64_t ns = 0, kns[K_COUNT] = {0};
	for (size_t i = 0; i < m.n; i++) {
		if (m.e[i].error) {
			fprintf(stderr, PROG ": %s: %s\n", m.e[i].sp.rel, m.e[i].error);
			bad++;
			continue;
		}
		ns += m.e[i].decode_ns;
		kns[m.e[i].sp.kind] += m.e[i].decode_ns;
		per[m.e[i].sp.kind]++;
	}
	size_t extra = report_unlisted(o->root, &m);
	if (bad || extra) {
		fprintf(stderr, PROG ": verify failed: %zu of %zu images differ from the manifest, "
			"%zu files not listed\n", bad, m.n, extra);
		goto out;
	}
	printf("mkdata: verified %zu images (%.1f MB) in %s: files and decodes match the manifest\n",
	       m.n, (double)atomic_load(&p->bytes) / 1e6, o->root);
	printf("mkdata: decode CPU ms/image: all %.2f", m.n ? (double)ns / 1e6 / (double)m.n : 0.0);
	for (int k = 0; k < K_COUNT; k++)
		if (per[k])
			printf(", %s %.2f (%zu)", kind_name[k], (double)kns[k] / 1e6 / (double)per[k],
			       per[k]);
	printf("\n");
	rc = fflush(stdout) == 0 ? EXIT_OK : EXIT_FAIL;
out:
	free(p);
	manifest_free(&m);
	return rc;
}

/* ---- command line ------------------------------------------------------------- */

static void usage(FILE *f)
{
	fprintf(f,
		"usage: " PROG " [--classes N] [--train N] [--val N] [--seed S] [--quality Q]\n"
		"                     [--threads N] [--force] ROOT\n"
		"       " PROG " --verify [--threads N] ROOT\n"
		"\n"
		"Write a synthetic ImageNet-like JPEG dataset that costs what real photos cost\n"
		"to decode (sides 300..600 px, mostly 500x375 and 375x500; ~100 KB per\n"
		"500x375 image at quality 85), in ImageFolder layout:\n"
		"  ROOT/train/c000/00000.jpg ...   --train images per class\n"
		"  ROOT/val/c000/00000.jpg ...     --val images per class\n"
		"  ROOT/manifest.tsv               one line per image (written last)\n"
		"\n"
		"  --classes N    classes, each with its own palette (default 10)\n"
		"  --train N      training images per class (default 50)\n"
		"  --val N        validation images per class (default 10)\n"
		"  --seed S       seed (default 1): the same seed and options give\n"
		"                 byte-identical files with any --threads\n"
		"  --quality Q    JPEG quality 1..100 (default 85)\n"
		"  --threads N    threads (default: the CPUs this process may use)\n"
		"  --force        write into a non-empty ROOT: once the new dataset is\n"
		"                 complete, removes an earlier dataset there (train/cN/N.jpg,\n"
		"                 val/cN/N.jpg, their emptied directories, manifest.tsv);\n"
		"                 leaves anything else alone\n"
		"  --verify       check ROOT against its manifest instead: re-hash every\n"
		"                 file, re-decode it, compare size, hashes, dimensions,\n"
		"                 components and kind, and split and class with the path;\n"
		"                 report unlisted .jpg files; print the CPU time per decode\n"
		"  -h, --help     this text\n"
		"\n"
		"Kinds (manifest column \"kind\"): baseline (4:2:0, ~64%%), progressive\n"
		"(4:2:0, ~20%%), gray (1 component, ~4%%), 444 (baseline 4:4:4, ~6%%), odd\n"
		"(baseline 4:2:0, both sides odd: 301..599, some ~49..95 and ~961..1099, ~6%%).\n"
		"\n"
		"manifest.tsv columns (tab-separated, header line first, sorted by path):\n"
		"  path split class width height components kind bytes file_fnv1a64\n"
		"  decode_fnv1a64\n"
		"Hashes are FNV-1a 64 (offset 0xcbf29ce484222325, prime 0x100000001b3) in 16\n"
		"hex digits: file_fnv1a64 of the file's bytes, decode_fnv1a64 of the pixels of\n"
		"a full libjpeg decode: scale 1/1, default output colour space (RGB for colour\n"
		"files, grayscale for gray ones), JDCT_ISLOW, fancy upsampling on, block\n"
		"smoothing on, no colour quantisation; rows top to bottom, width*components\n"
		"bytes each, no padding.\n"
		"\n"
		"The dataset is written into ROOT/.mkdata.tmp.PID and moved into place when\n"
		"complete: a run that fails or is interrupted (SIGINT, SIGTERM, SIGHUP)\n"
		"leaves ROOT as it was. The next run removes the directory of one killed.\n"
		"\n"
		"Progress goes to stderr (in place on a terminal, else a line per 10%%); the\n"
		"summary line goes to stdout.\n"
		"\n"
		"Exit status: 0 success; 1 failure (I/O or libjpeg error, non-empty ROOT\n"
		"without --force, --verify found a difference); 2 usage error. An interrupted\n"
		"run, once cleaned up, ends by its signal (status 128+N in a shell).\n");
}

static int usage_error(const char *fmt, const char *arg)
{
	fprintf(stderr, PROG ": ");
	fprintf(stderr, fmt, arg);
	fprintf(stderr, "\nTry '" PROG " --help'.\n");
	return -1;
}

static int parse_uint(const char *s, unsigned long long lo, unsigned long long hi,
		      unsigned long long *out)
{
	char *end;
	if (!isdigit((unsigned char)*s))
		return -1;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno || *end || v < lo || v > hi)
		return -1;
	*out = v;
	return 0;
}

static unsigned default_threads(void)
{
	cpu_set_t set;
	if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0)
		return (unsigned)CPU_COUNT(&set);
	long n = sysconf(_SC_NPROCESSORS_ONLN);
	return n > 0 ? (unsigned)n : 1;
}

/* 0: run, 1: --help done, -1: usage error (already reported). */
static int parse_args(int argc, char **argv, struct opts *o)
{
	enum { O_CLASSES = 256, O_TRAIN, O_VAL, O_SEED, O_QUALITY, O_THREADS, O_FORCE, O_VERIFY };
	static const struct option longopts[] = {
		{"classes", required_argument, NULL, O_CLASSES},
		{"train", required_argument, NULL, O_TRAIN},
		{"val", required_argument, NULL, O_VAL},
		{"seed", required_argument, NULL, O_SEED},
		{"quality", required_argument, NULL, O_QUALITY},
		{"threads", required_argument, NULL, O_THREADS},
		{"force", no_argument, NULL, O_FORCE},
		{"verify", no_argument, NULL, O_VERIFY},
		{"help", no_argument, NULL, 'h'},
		{0},
	};
	struct {
		const char *name;
		unsigned long long lo, hi;
	} lim[] = {
		/* cppcheck-suppress duplicateExpression ; index 0, named like the rows below */
		[O_CLASSES - O_CLASSES] = {"--classes", 1, MAX_CLASSES}, /* NOLINT(misc-redundant-expression) */
		[O_TRAIN - O_CLASSES] = {"--train", 0, MAX_PER_CLASS},
		[O_VAL - O_CLASSES] = {"--val", 0, MAX_PER_CLASS},
		[O_SEED - O_CLASSES] = {"--seed", 0, UINT64_MAX},
		[O_QUALITY - O_CLASSES] = {"--quality", 1, 100},
		[O_THREADS - O_CLASSES] = {"--threads", 1, MAX_THREADS},
	};
	int c, gen_opts = 0;
	unsigned long long v;
	char msg[160];
	*o = (struct opts){.classes = 10, .train = 50, .val = 10, .seed = 1, .quality = 85};
	opterr = 0;
	while ((c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
		switch (c) {
		case 'h': usage(stdout); return 1;
		case O_FORCE: o->force = 1; gen_opts = 1; break;
		case O_VERIFY: o->verify = 1; break;
		case O_CLASSES: case O_TRAIN: case O_VAL: case O_SEED: case O_QUALITY:
		case O_THREADS: {
			int i = c - O_CLASSES;
			if (parse_uint(optarg, lim[i].lo, lim[i].hi, &v) != 0) {
				snprintf(msg, sizeof(msg), "%s: '%%s' is not an integer from %llu to %llu",
					 lim[i].name, lim[i].lo, lim[i].hi);
				return usage_error(msg, optarg);
			}
			if (c == O_CLASSES) o->classes = (unsigned)v;
			if (c == O_TRAIN) o->train = (unsigned)v;
			if (c == O_VAL) o->val = (unsigned)v;
			if (c == O_SEED) o->seed = v;
			if (c == O_QUALITY) o->quality = (unsigned)v;
			if (c == O_THREADS) o->threads = (unsigned)v;
			gen_opts |= c != O_THREADS;
			break;
		}
		case ':':
			return usage_error("option '%s' needs a value", argv[optind - 1]);
		default:
			return usage_error("unknown option '%s'", argv[optind - 1]);
		}
	}
	if (optind == argc)
		return usage_error("%s", "missing ROOT (the dataset directory)");
	o->root = argv[optind++];
	if (optind < argc)
		return usage_error("unexpected argument '%s' (one ROOT only)", argv[optind]);
	if (!*o->root)
		return usage_error("%s", "ROOT is empty");
	if (o->verify && gen_opts)
		return usage_error("%s", "--verify takes only --threads and ROOT");
	if (!o->verify && !o->train && !o->val)
		return usage_error("%s", "--train and --val are both 0: nothing to write");
	if (!o->verify && (unsigned long long)o->classes * (o->train + (unsigned long long)o->val) >
				  MAX_IMAGES)
		return usage_error("%s", "too many images (at most 50000000)");
	if (!o->threads)
		o->threads = default_threads();
	if (o->threads > MAX_THREADS)
		o->threads = MAX_THREADS;
	return 0;
}

int main(int argc, char **argv)
{
	struct opts o;
	int r = parse_args(argc, argv, &o);
	if (r)
		return r > 0 ? EXIT_OK : EXIT_USAGE;
	smooth_init();
	if (o.verify)
		return verify(&o);
	if (tiles_init(o.seed) != 0) {
		fprintf(stderr, PROG ": out of memory\n");
		return EXIT_FAIL;
	}
	r = generate(&o);
	free(tiles);
	return r;
}
