/* SPDX-License-Identifier: MIT */
/*
 * libjpeg decompression interposition (the API Pillow and torchvision use).
 *
 * Finding the real library. Python loads extension modules RTLD_LOCAL, so
 * the libjpeg that Pillow's _imaging.so is bound to is not in the global
 * scope and dlsym(RTLD_NEXT) finds nothing (or another copy). We resolve
 * from the caller: dladdr(return address) names the calling object, and
 * dlsym on that object's handle searches its own dependency tree, which
 * holds its libjpeg and not us; where the global scope holds a copy of the
 * same symbol version, or the caller's is unversioned, the linker binds to
 * the global copy, and so do we (ts_real_bind). A decompress object stays
 * bound to the library that created it, so two copies are never mixed
 * within one object. dlsym of our names finds ours only where a libjpeg
 * stands behind them (ts_jpeg_dlsym).
 *
 * What is hooked: create, read_header, start, read_scanlines, skip/crop,
 * finish, abort_decompress, destroy_decompress, which libjpeg never calls
 * through its PLT; the generic jpeg_abort and jpeg_destroy, which it does
 * (from finish, abort_decompress, destroy_decompress, a tables-only
 * read_header), and the rest of the decompress API a program may call
 * during a hit (consume_input, which read_header calls, input_complete, raw
 * data, buffered-image output, coefficients, colormap: they leave the hit
 * first): the library's own calls are told apart by their return address
 * and pass straight through. Anything else (jpeg_calc_output_dimensions,
 * which libjpeg calls too) goes straight to the real library.
 *
 * Exact mode. A decode whose compressed bytes are proven to be a dataset
 * file's (ts_io_provenance) and whose parameters we understand is looked up
 * in the shared decoded cache: a hit is served row by row from a private
 * copy without decoding; a miss decodes for real and fills the cache.
 * Anything unusual (raw output, colour quantisation, buffered image, crop,
 * skip, a struct of another libjpeg version) decodes for real, untouched.
 */
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <jpeglib.h>
#include <jerror.h>

#include "exact.h"
#include "hash.h"
#include "io.h"
#include "log.h"
#include "real.h"
#include "shim.h"

#define TS_EXPORT __attribute__((visibility("default")))
#define CALLER() __builtin_return_address(0)

/* libjpeg's global_state for an object between images (jpegint.h): a
 * header read in this state starts a new image. */
#define TS_DSTATE_START 200
/* After the header, before start_decompress began: the only state in which
 * we may decide (calc_output_dimensions refuses any other). A suspending
 * source makes start_decompress return FALSE and be called again in a
 * later state: the decision was made at the first call. */
#define TS_DSTATE_READY 202
#define TS_DSTATE_SCANNING 205

/* ---- the real library, per calling object ---------------------------------- */

struct jpeg_api {
	const void *caller_base; /* dli_fbase of the calling object */
	_Atomic int dead;        /* that object, or the library, was unloaded */
	uint64_t lib_id;         /* identity of the real libjpeg file, for cache keys */
	void (*create)(j_decompress_ptr, int, size_t);
	int (*read_header)(j_decompress_ptr, boolean);
	boolean (*start)(j_decompress_ptr);
	JDIMENSION (*read_scanlines)(j_decompress_ptr, JSAMPARRAY, JDIMENSION);
	JDIMENSION (*skip_scanlines)(j_decompress_ptr, JDIMENSION);
	void (*crop_scanline)(j_decompress_ptr, JDIMENSION *, JDIMENSION *);
	boolean (*finish)(j_decompress_ptr);
	void (*abort_d)(j_decompress_ptr);
	void (*destroy_d)(j_decompress_ptr);
	void (*abort_c)(j_common_ptr);   /* jpeg_abort */
	void (*destroy_c)(j_common_ptr); /* jpeg_destroy */
	void (*calc_output_dimensions)(j_decompress_ptr);
	boolean (*has_multiple_scans)(j_decompress_ptr);
	/* the rest a program may call on a hit (after_hit): the hit is left first */
	int (*consume_input)(j_decompress_ptr);
	boolean (*input_complete)(j_decompress_ptr);
	JDIMENSION (*read_raw_data)(j_decompress_ptr, JSAMPIMAGE, JDIMENSION);
	boolean (*start_output)(j_decompress_ptr, int);
	boolean (*finish_output)(j_decompress_ptr);
	jvirt_barray_ptr *(*read_coefficients)(j_decompress_ptr);
	void (*new_colormap)(j_decompress_ptr);
	const void *lib_base;    /* dli_fbase of the real libjpeg: its own source managers */
	int names_crop;          /* the calling object may crop (may_crop) */
};

#define MAX_APIS 32
static struct jpeg_api apis[MAX_APIS];
static int napis;
static pthread_mutex_t api_lock = PTHREAD_MUTEX_INITIALIZER;

/* Fork handlers: a child must not inherit api_lock held by another thread. */
void ts_jpeg_fork_lock(void) { pthread_mutex_lock(&api_lock); }
void ts_jpeg_fork_unlock(void) { pthread_mutex_unlock(&api_lock); }
static void fills_to_pass(void);

/*
 * A forked child inherits every decode in progress, fills included: the
 * range in the shared cache is its parent's to write, commit or abort.
 * The child's copies of them decode for real, on their own.
 */
void ts_jpeg_fork_child(void)
{
	pthread_mutex_unlock(&api_lock);
	fills_to_pass();
}

static void *pick(void *handle, const char *name, void *ours)
{
	void *f = handle ? ts_real_dlsym(handle, name) : NULL;
	if (!f || f == ours)
		f = ts_real_next(name);
	return f == ours ? NULL : f;
}

static uint64_t library_id(void *fn)
{
	Dl_info info;
	struct stat sb;
	if (!fn || !dladdr(fn, &info) || !info.dli_fname || stat(info.dli_fname, &sb) != 0)
		return 0;
	uint64_t v[4] = { (uint64_t)sb.st_dev, (uint64_t)sb.st_ino, (uint64_t)sb.st_size,
			  (uint64_t)sb.st_mtim.tv_sec };
	return ts_hash64(v, sizeof(v), 0x6a706567ull);
}

TS_EXPORT int jpeg_read_header(j_decompress_ptr, boolean);

struct names_query {
	uintptr_t addr;
	const char *sym;
	int found; /* -1: no object holds addr */
};

static int names_in_object(struct dl_phdr_info *info, size_t size, void *arg)
{
	struct names_query *q = arg;
	const ElfW(Dyn) *dyn = NULL;
	int holds = 0;
	for (int i = 0; i < info->dlpi_phnum; i++) {
		const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
		uintptr_t lo = info->dlpi_addr + ph->p_vaddr;
		if (ph->p_type == PT_LOAD && q->addr >= lo && q->addr - lo < ph->p_memsz)
			holds = 1;
		else if (ph->p_type == PT_DYNAMIC)
			dyn = (const ElfW(Dyn) *)(info->dlpi_addr + ph->p_vaddr);
	}
	if (!holds)
		return 0;
	uintptr_t strtab = 0;
	size_t strsz = 0;
	for (; dyn && dyn->d_tag != DT_NULL; dyn++) {
		if (dyn->d_tag == DT_STRTAB)
			strtab = dyn->d_un.d_ptr;
		else if (dyn->d_tag == DT_STRSZ)
			strsz = dyn->d_un.d_val;
	}
	/* glibc relocates these in place on most targets; where it does not,
	 * the value is still the link-time address */
	if (strtab && strtab < info->dlpi_addr)
		strtab += info->dlpi_addr;
	size_t n = strlen(q->sym) + 1; /* the terminator: a whole name, not a prefix */
	q->found = strtab && strsz && memmem((const void *)strtab, strsz, q->sym, n) != NULL;
	return 1;
}

/* Does the object holding code at addr name sym among its dynamic symbols
 * (so that it can call it)? Unknown counts as yes. */
static int object_names(const void *addr, const char *sym)
{
	struct names_query q = { (uintptr_t)addr, sym, -1 };
	dl_iterate_phdr(names_in_object, &q);
	return q.found != 0;
}

/* May code in the object at `caller` crop or skip rows? When it links
 * jpeg_crop_scanline or jpeg_skip_scanlines, or dlsym (it may look them up
 * when it needs them, after the start). Either makes a hit decode for real. */
static int may_crop(const void *caller)
{
	return object_names(caller, "jpeg_crop_scanline") || object_names(caller, "jpeg_skip_scanlines") ||
	       object_names(caller, "dlsym") || object_names(caller, "dlvsym");
}

static void fill_api(struct jpeg_api *a, void *h);

/*
 * A handle on the libjpeg that the object opened as `h` calls without the
 * shim. Its own tree's copy, unless the linker binds its references to the
 * global scope's: a copy of the same symbol version there, or any there when
 * its own is unversioned (ts_real_bind). Decided by jpeg_read_header for the
 * whole API, so that one decompress object never mixes two copies. NULL:
 * the global scope's.
 */
static void *library_for(void *h)
{
	void *own = h ? ts_real_dlsym(h, "jpeg_read_header") : NULL;
	if (own == (void *)jpeg_read_header)
		own = NULL;
	void *f = ts_real_bind("jpeg_read_header", own);
	Dl_info info;
	if (!f || f == ts_real_next("jpeg_read_header") || !dladdr(f, &info) || !info.dli_fname)
		return NULL;
	return dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
}

static int api_is(const struct jpeg_api *a, const void *base)
{
	return a->caller_base == base && !atomic_load_explicit(&a->dead, memory_order_acquire);
}

/* The real functions for calls made from code at `caller`. */
static const struct jpeg_api *api_for(const void *caller)
{
	Dl_info info = { 0 };
	const void *base = dladdr(caller, &info) ? info.dli_fbase : NULL;
	for (int i = 0; i < __atomic_load_n(&napis, __ATOMIC_ACQUIRE); i++)
		if (api_is(&apis[i], base))
			return &apis[i];
	pthread_mutex_lock(&api_lock);
	struct jpeg_api *a = NULL;
	for (int i = 0; i < napis && !a; i++)
		if (api_is(&apis[i], base))
			a = &apis[i];
	if (!a && napis < MAX_APIS) {
		a = &apis[napis];
		a->caller_base = base;
		void *h = base && info.dli_fname ? dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD) : NULL;
		void *lib = library_for(h);
		fill_api(a, lib);
		a->names_crop = may_crop(caller);
		/* NOLOAD took references; the objects stay loaded */
		ts_real_dlclose(lib);
		ts_real_dlclose(h);
		if (a->read_header)
			__atomic_store_n(&napis, napis + 1, __ATOMIC_RELEASE);
		else
			a = NULL;
	}
	if (!a && napis == MAX_APIS) {
		/* Table full: the global scope's copy, for every caller not in it. */
		static struct jpeg_api next_api;
		if (!next_api.read_header) {
			ts_info("jpeg: more than %d objects called libjpeg; later ones get the global copy",
				MAX_APIS);
			fill_api(&next_api, NULL);
			next_api.names_crop = 1;
		}
		a = next_api.read_header ? &next_api : NULL;
	}
	pthread_mutex_unlock(&api_lock);
	if (!a) {
		/* No libjpeg reachable at all: nothing to pass the call to. */
		ts_error("libjpeg called, but no libjpeg can be found from %s; aborting",
			 info.dli_fname ? info.dli_fname : "the caller");
		abort();
	}
	return a;
}

/* Is the object whose ELF header is at `base` still mapped there? */
static int still_loaded(const void *base)
{
	Dl_info info;
	return dladdr(base, &info) && info.dli_fbase == base;
}

/*
 * After a dlclose (shim/cuda.c): the entries of what it unloaded, caller or
 * library, are dead; an object loaded later at the same address gets an
 * entry of its own. Entries are never reused: a decompress object may still
 * point at a dead one.
 */
void ts_jpeg_unloaded(void)
{
	int n = __atomic_load_n(&napis, __ATOMIC_ACQUIRE);
	for (int i = 0; i < n; i++) {
		struct jpeg_api *a = &apis[i];
		if (atomic_load_explicit(&a->dead, memory_order_relaxed))
			continue;
		if ((a->caller_base && !still_loaded(a->caller_base)) || (a->lib_base && !still_loaded(a->lib_base)))
			atomic_store_explicit(&a->dead, 1, memory_order_release);
	}
}

/* ---- per decompress-object state --------------------------------------------- */

/*
 * D_ABSORB: a hit must wait for the real start to finish (start_later_ok);
 * the real start runs, and the decision is made once it returns TRUE.
 */
enum dmode { D_PASS = 0, D_FILL, D_HIT, D_ABSORB };

/*
 * Rows a hit hands out per jpeg_read_scanlines call: those libjpeg-turbo's
 * would (rowsim_call). Before, a hit filled every row asked for; libjpeg
 * hands out one row group (max_v_samp_factor rows) a call, two at an iMCU
 * row's end when the upsampler needs context rows, and a program whose
 * reads depend on the count (reading until row 7, then skipping) went
 * elsewhere in the image.
 */
enum { CTX_POSTPONED, CTX_PREPARE, CTX_PROCESS };
struct rowsim {
	int ok;          /* simulated; else a call asking more than one row leaves the hit */
	int context;     /* the upsampler needs context rows (fancy h2v2, h1v2) */
	unsigned g;      /* output rows a row group (max_v_samp_factor) */
	unsigned r;      /* row groups an iMCU row (min_DCT_scaled_size) */
	unsigned last;   /* row groups of the last iMCU row (set_bottom_pointers) */
	unsigned imcus;  /* iMCU rows */
	unsigned done, full, state, ctr, avail; /* jdmainct.c */
	unsigned next;   /* jdsample.c: rows of the row group handed out */
};

/* finish's walk to EOI on a hit (walk_eoi): where it stands */
enum { W_SCAN, W_FF, W_LEN_HI, W_LEN_LO, W_SKIP };
struct eoi_walk {
	int st;
	unsigned hi;
	uint32_t skip;
};

struct dstate {
	_Atomic(const void *) cinfo;
	const struct jpeg_api *api;
	int trackable;        /* struct of our libjpeg version */
	int headers;          /* read_header calls since the last start */
	int proven;
	struct ts_file_id id;
	char path[512];
	enum dmode mode;
	uint64_t row_bytes, rows_done, rows_total, t0;
	unsigned char *hit;   /* HIT: private copy of the decoded image */
	struct eoi_walk walk; /* HIT: how far finish consumed the source towards EOI */
	struct rowsim sim;    /* HIT: the real decoder's rows a call */
	struct ts_cache_fill fill;
};

#define MAX_DSTATES 1024
static struct dstate dstates[MAX_DSTATES];

static unsigned slot_of(const void *p)
{
	return (unsigned)(ts_mix64((uint64_t)(uintptr_t)p) % MAX_DSTATES);
}

static struct dstate *state_find(const void *cinfo)
{
	unsigned i = slot_of(cinfo);
	for (unsigned k = 0; k < MAX_DSTATES; k++, i = (i + 1) % MAX_DSTATES)
		if (atomic_load_explicit(&dstates[i].cinfo, memory_order_acquire) == cinfo)
			return &dstates[i];
	return NULL;
}

static struct dstate *state_new(const void *cinfo)
{
	struct dstate *s = state_find(cinfo);
	if (s)
		return s;
	unsigned i = slot_of(cinfo);
	for (unsigned k = 0; k < MAX_DSTATES; k++, i = (i + 1) % MAX_DSTATES) {
		const void *empty = NULL;
		if (atomic_compare_exchange_strong(&dstates[i].cinfo, &empty, cinfo))
			return &dstates[i];
	}
	return NULL; /* table full: this object passes through untracked */
}

static void fills_to_pass(void)
{
	for (unsigned i = 0; i < MAX_DSTATES; i++)
		if (dstates[i].mode == D_FILL) {
			dstates[i].fill = (struct ts_cache_fill){ .slot = TS_CACHE_NONE };
			dstates[i].mode = D_PASS;
		}
}

/* End of one image: drop the hit copy, abort an unfinished fill. */
static void image_reset(struct dstate *s)
{
	if (s->mode == D_FILL)
		ts_exact_abort(&s->fill);
	free(s->hit);
	s->hit = NULL;
	s->mode = D_PASS;
	s->headers = 0;
	s->proven = 0;
	s->rows_done = 0;
}

static void state_free(struct dstate *s)
{
	image_reset(s);
	s->api = NULL;
	atomic_store_explicit(&s->cinfo, NULL, memory_order_release);
}

/* The real functions for this object: bound at creation, else by caller. */
static const struct jpeg_api *api_of(j_decompress_ptr cinfo, const void *caller, struct dstate **sp)
{
	struct dstate *s = state_find(cinfo);
	*sp = s;
	return s && s->api ? s->api : api_for(caller);
}

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- exact mode: keys and the decision at start ------------------------------ */

/* Only plain 8-bit full-image output is cached; everything else decodes. */
static int params_supported(j_decompress_ptr c)
{
	/* Values must fit the key's bytes; anything odd decodes for real. */
	if (c->scale_num > 255 || c->scale_denom > 255 || (unsigned)c->out_color_space > 255 ||
	    (unsigned)c->jpeg_color_space > 255 || (unsigned)c->dct_method > 255 ||
	    (unsigned)c->dither_mode > 255)
		return 0;
	/*
	 * A row is output_width * output_components bytes, but for RGB565 (3
	 * components in 2 bytes a pixel): that one decodes for real, or a hit
	 * would write a third past every row the program gave.
	 */
	return !c->buffered_image && !c->raw_data_out && !c->quantize_colors && c->data_precision == 8 &&
	       c->out_color_space != JCS_RGB565 && c->output_components >= 1 && c->output_components <= 4 &&
	       c->output_width > 0 && c->output_height > 0;
}

/*
 * Everything that changes the decoded bytes: the file, the library that
 * decodes it, and every output parameter, packed raw (not hashed).
 */
static void make_key(const struct dstate *s, j_decompress_ptr c, struct ts_cache_key *k)
{
	memset(k, 0, sizeof(*k));
	k->dev = s->id.dev;
	k->ino = s->id.ino;
	k->size = s->id.size;
	k->mtime_ns = (int64_t)s->id.mtime_ns;
	k->ctime_ns = (int64_t)s->id.ctime_ns;
	uint8_t *p = k->params;
	memcpy(p, &s->api->lib_id, 8);
	uint32_t w = c->output_width, h = c->output_height;
	memcpy(p + 8, &w, 4);
	memcpy(p + 12, &h, 4);
	p[16] = (uint8_t)c->jpeg_color_space;
	p[17] = (uint8_t)c->out_color_space;
	p[18] = (uint8_t)c->scale_num;
	p[19] = (uint8_t)c->scale_denom;
	p[20] = (uint8_t)c->dct_method;
	p[21] = (uint8_t)c->do_fancy_upsampling;
	p[22] = (uint8_t)c->do_block_smoothing;
	p[23] = (uint8_t)c->output_components;
	p[24] = (uint8_t)c->out_color_components;
	p[25] = (uint8_t)c->data_precision;
	p[26] = JPEG_LIB_VERSION;
	p[27] = (uint8_t)c->dither_mode; /* RGB565 output is dithered without quantisation */
}

/* Output dimensions, and whether the cache may serve them. In DSTATE_READY only. */
static int exact_eligible(struct dstate *s, j_decompress_ptr c)
{
	if (!s->proven || !ts_exact_enabled())
		return 0;
	/* Allowed in DSTATE_READY; fills output_* without decoding anything. */
	s->api->calc_output_dimensions(c);
	return params_supported(c);
}

#if JPEG_LIB_VERSION >= 70
#define TS_DCT_SCALED(p) ((p)->DCT_h_scaled_size)
#define TS_MIN_DCT_SCALED(c) ((c)->min_DCT_h_scaled_size)
#else
#define TS_DCT_SCALED(p) ((p)->DCT_scaled_size)
#define TS_MIN_DCT_SCALED(c) ((c)->min_DCT_scaled_size)
#endif

/* The real decoder's structure, as jinit_upsampler and set_bottom_pointers
 * see it, from what calc_output_dimensions set (DSTATE_READY). */
static void rowsim_init(struct rowsim *m, j_decompress_ptr c)
{
	*m = (struct rowsim){ 0 };
	int mins = TS_MIN_DCT_SCALED(c);
	if (c->num_components < 1 || c->num_components > MAX_COMPONENTS || c->max_v_samp_factor < 1 ||
	    c->max_h_samp_factor < 1 || mins < 1 || !c->comp_info || !c->total_iMCU_rows)
		return;
	int fancy = c->do_fancy_upsampling && mins > 1;
	for (int ci = 0; ci < c->num_components; ci++) {
		const jpeg_component_info *p = &c->comp_info[ci];
		if (ci > 0 && c->out_color_space == JCS_GRAYSCALE && c->jpeg_color_space == JCS_YCbCr)
			continue; /* only Y is needed (jdcolor.c) */
		int hin = p->h_samp_factor * TS_DCT_SCALED(p) / mins, vin = p->v_samp_factor * TS_DCT_SCALED(p) / mins;
		int hout = c->max_h_samp_factor, vout = c->max_v_samp_factor;
		if (fancy && vin * 2 == vout && (hin == hout || (hin * 2 == hout && p->downsampled_width > 2)))
			m->context = 1;
	}
	const jpeg_component_info *p0 = &c->comp_info[0];
	unsigned ih = (unsigned)(p0->v_samp_factor * TS_DCT_SCALED(p0)), rg = ih / (unsigned)mins;
	if (!ih || !rg)
		return;
	unsigned left = p0->downsampled_height % ih;
	m->last = ((left ? left : ih) - 1) / rg + 1;
	m->g = (unsigned)c->max_v_samp_factor;
	m->r = (unsigned)mins;
	m->imcus = c->total_iMCU_rows;
	m->next = m->g; /* the conversion buffer is empty */
	m->state = CTX_PREPARE;
	m->ok = 1;
}

/* sep_upsample (or the merged upsampler): the rest of one row group, at most */
static void rowsim_emit(struct rowsim *m, unsigned *n, unsigned max, unsigned *left, unsigned *ctr)
{
	if (m->next >= m->g)
		m->next = 0;
	unsigned k = m->g - m->next;
	if (k > *left)
		k = *left;
	if (k > max - *n)
		k = max - *n;
	*n += k;
	*left -= k;
	m->next += k;
	if (m->next >= m->g)
		(*ctr)++;
}

/* The rows of one jpeg_read_scanlines(max) with `left` rows to come: main
 * controller's process_data_simple_main or process_data_context_main. */
static unsigned rowsim_call(struct rowsim *m, unsigned max, unsigned left)
{
	unsigned n = 0;
	if (!m->context) {
		rowsim_emit(m, &n, max, &left, &m->ctr);
		if (m->ctr >= m->r)
			m->ctr = 0;
		return n;
	}
	if (!m->full) {
		m->full = 1;
		m->done++;
	}
	switch (m->state) {
	case CTX_POSTPONED:
		rowsim_emit(m, &n, max, &left, &m->ctr);
		if (m->ctr < m->avail)
			return n;
		m->state = CTX_PREPARE;
		if (n >= max)
			return n;
		/* fall through */
	case CTX_PREPARE:
		m->ctr = 0;
		m->avail = m->done == m->imcus ? m->last : m->r - 1;
		m->state = CTX_PROCESS;
		/* fall through */
	default:
		rowsim_emit(m, &n, max, &left, &m->ctr);
		if (m->ctr < m->avail)
			return n;
		m->full = 0;
		m->ctr = m->r + 1;
		m->avail = m->r + 2;
		m->state = CTX_POSTPONED;
	}
	return n;
}

/* Look the image up: HIT (served from now on), FILL (the decode fills it), or PASS. */
static int exact_decide(struct dstate *s, j_decompress_ptr c)
{
	s->row_bytes = (uint64_t)c->output_width * (uint64_t)c->output_components;
	s->rows_total = c->output_height;
	uint64_t len = s->row_bytes * c->output_height;
	struct ts_cache_key k;
	make_key(s, c, &k);
	unsigned char *copy = malloc(len);
	if (!copy)
		return 0;
	enum ts_exact_result r = ts_exact_get(&k, len, copy, &s->fill);
	if (r == TS_EXACT_HIT) {
		s->hit = copy;
		s->mode = D_HIT;
		s->walk = (struct eoi_walk){ .st = W_SCAN };
		rowsim_init(&s->sim, c);
		c->output_scanline = 0;
		return 1;
	}
	free(copy);
	if (r == TS_EXACT_FILL) {
		s->mode = D_FILL;
		s->t0 = now_ns();
	}
	return 0;
}

/*
 * The walk from the entropy-coded data after an SOS header to just past the
 * EOI marker, as libjpeg's marker reader goes: FF 00 and RSTn are entropy
 * data, FF FF is fill, and any other marker but EOI starts a segment that is
 * passed over by its length (a later scan's SOS and DHT, COM, APPn), so that
 * an FF D9 inside a comment is not taken for the end. Before, the first
 * FF D9 was: a stream of two images whose first held one in a COM segment
 * left the source inside that image, and the second failed ("Not a JPEG
 * file"). A walk goes on across buffers (the source's refills).
 */
static size_t walk_eoi(struct eoi_walk *w, const JOCTET *buf, size_t n, int *found)
{
	size_t i = 0;
	*found = 0;
	while (i < n) {
		switch (w->st) {
		case W_SCAN: {
			/* memchr: a byte loop over a whole image cost as much as the hit's copy */
			const JOCTET *ff = memchr(buf + i, 0xFF, n - i);
			if (!ff)
				return n;
			i = (size_t)(ff - buf) + 1;
			w->st = W_FF;
			break;
		}
		case W_FF: {
			JOCTET b = buf[i++];
			if (b == 0xD9) {
				*found = 1;
				return i;
			}
			if (b != 0xFF) /* fill stays */
				w->st = b == 0x00 || (b >= 0xD0 && b <= 0xD7) || b == 0x01 || b == 0xD8 ? W_SCAN : W_LEN_HI;
			break;
		}
		case W_LEN_HI:
			w->hi = buf[i++];
			w->st = W_LEN_LO;
			break;
		case W_LEN_LO: {
			unsigned len = (w->hi << 8) | buf[i++];
			w->skip = len > 2 ? len - 2 : 0;
			w->st = w->skip ? W_SKIP : W_SCAN;
			break;
		}
		default: { /* W_SKIP */
			size_t k = n - i < w->skip ? n - i : (size_t)w->skip;
			i += k;
			w->skip -= k;
			if (!w->skip)
				w->st = W_SCAN;
			break;
		}
		}
	}
	return n;
}

/* Does the source's buffer hold the image's end (the source where read_header left it)? */
static int eoi_in_buffer(j_decompress_ptr c)
{
	struct jpeg_source_mgr *src = c->src;
	struct eoi_walk w = { .st = W_SCAN };
	int found = 0;
	if (src && src->next_input_byte)
		walk_eoi(&w, src->next_input_byte, src->bytes_in_buffer, &found);
	return found;
}

/*
 * Consume the source through the EOI as finish would, refilling it as
 * libjpeg does (a program's own source manager that reads a file in chunks
 * is read to the image's end: before, it was left at its first chunk, and a
 * second image in the stream failed). FALSE: the source suspended; a later
 * finish goes on from there.
 */
static boolean consume_to_eoi(struct dstate *s, j_decompress_ptr c)
{
	struct jpeg_source_mgr *src = c->src;
	if (!src)
		return TRUE;
	for (unsigned empty = 0; empty < 1000;) {
		if (!src->bytes_in_buffer || !src->next_input_byte) {
			if (!src->fill_input_buffer(c))
				return FALSE;
			empty = src->bytes_in_buffer ? 0 : empty + 1;
			continue;
		}
		int found;
		size_t k = walk_eoi(&s->walk, src->next_input_byte, src->bytes_in_buffer, &found);
		src->next_input_byte += k;
		src->bytes_in_buffer -= k;
		if (found)
			return TRUE;
	}
	return TRUE; /* a source that keeps giving nothing: as far as it goes */
}

/* The source is libjpeg's own (memory or stdio): its buffer is all it has, or it reads on by itself. */
static int source_is_libs(const struct dstate *s, j_decompress_ptr c)
{
	Dl_info info;
	return c->src && s->api->lib_base && dladdr((void *)c->src->fill_input_buffer, &info) &&
	       info.dli_fbase == s->api->lib_base;
}

/*
 * May a hit be served before the real start ran? Only if a real start could
 * still run later without the program's help, which a crop after the hit
 * needs. A single-scan image starts from its headers alone. A multi-scan
 * one (progressive) reads every scan in start, so its data must be at hand:
 * libjpeg's own source managers (stdio, memory) never suspend, and a
 * buffer that already holds the EOI has it all. Otherwise (a file fed in
 * chunks, as Pillow does) the hit is early only for code that cannot crop:
 * neither the object that created the decompressor nor the one starting it
 * links jpeg_crop_scanline or dlsym (Pillow links neither). For code that
 * can crop, the real start runs, suspending as it would without the shim,
 * and the hit saves only the output pass: for progressive images, next to
 * nothing. Not covered: a crop looked up by a third object and handed to
 * code linking neither, which then crops after an early hit: libjpeg fails
 * (JERR_BAD_STATE).
 */
static int start_later_ok(const struct dstate *s, j_decompress_ptr c, const void *caller)
{
	if (s->api->has_multiple_scans && !s->api->has_multiple_scans(c))
		return 1;
	if (source_is_libs(s, c))
		return 1;
	if (eoi_in_buffer(c))
		return 1;
	return !s->api->names_crop && !api_for(caller)->names_crop;
}

/* ---- hooks ----------------------------------------------------------------------- */

TS_EXPORT void jpeg_CreateDecompress(j_decompress_ptr cinfo, int version, size_t structsize)
{
	const struct jpeg_api *a = api_for(CALLER());
	a->create(cinfo, version, structsize);
	struct dstate *s = state_new(cinfo);
	if (s) {
		image_reset(s);
		s->api = a;
		s->trackable = version == JPEG_LIB_VERSION && structsize == sizeof(struct jpeg_decompress_struct);
	}
}

TS_EXPORT int jpeg_read_header(j_decompress_ptr cinfo, boolean require_image)
{
	struct dstate *s;
	const struct jpeg_api *a = api_of(cinfo, CALLER(), &s);
	if (s && cinfo->global_state == TS_DSTATE_START)
		image_reset(s); /* whatever the last image left (a jpeg_abort of libjpeg's own) */
	if (s && s->trackable && s->headers++ == 0 && ts_shim_ready() && cinfo->src &&
	    cinfo->src->next_input_byte && cinfo->src->bytes_in_buffer > 0) {
		/* The buffer now starts at the stream's first byte: prove whose it is. */
		/* a source of libjpeg's holding bytes is the memory source: it never
		 * gets more, so a prefix of the file there is just that prefix */
		s->proven = ts_io_provenance(cinfo->src->next_input_byte, cinfo->src->bytes_in_buffer,
					     !source_is_libs(s, cinfo), &s->id, s->path, sizeof(s->path));
		if (s->proven) {
			ts_io_decoded(s->path);
			ts_shim_dataset_work();
		}
		ts_debug("decode of %s: %s", s->proven ? s->path : "an unknown buffer",
			 s->proven ? "proven dataset file" : "not a dataset file (passes through)");
	}
	return a->read_header(cinfo, require_image);
}

TS_EXPORT boolean jpeg_start_decompress(j_decompress_ptr cinfo)
{
	struct dstate *s;
	const struct jpeg_api *a = api_of(cinfo, CALLER(), &s);
	if (s && s->trackable && s->mode == D_PASS && cinfo->global_state == TS_DSTATE_READY &&
	    exact_eligible(s, cinfo)) {
		if (!start_later_ok(s, cinfo, CALLER())) {
			s->mode = D_ABSORB;
			ts_debug("decode of %s: multi-scan, fed in parts, to code that can crop: "
				 "a hit waits for the real start", s->path);
		} else if (exact_decide(s, cinfo)) {
			return TRUE;
		}
	}
	if (s && s->mode == D_HIT)
		return TRUE;
	boolean ok = a->start(cinfo);
	if (ok && s && s->mode == D_ABSORB) {
		s->mode = D_PASS;
		exact_decide(s, cinfo); /* the real start is done: rows from the cache, or a fill */
	}
	return ok;
}

/*
 * Give up a hit part-way and go on with the real decoder: its start, if the
 * hit skipped it, then the rows the hit already handed out, decoded again
 * (into a scratch row; they are the hit's, byte for byte), so that the real
 * decoder stands where the program believes it is. A skip or a crop then
 * runs for real, as without the shim.
 */
static void leave_hit(struct dstate *s, j_decompress_ptr c, const struct jpeg_api *a)
{
	JDIMENSION at = c->output_scanline;
	free(s->hit);
	s->hit = NULL;
	s->mode = D_PASS;
	if (c->global_state == TS_DSTATE_READY)
		a->start(c); /* output_scanline 0 */
	else
		c->output_scanline = 0; /* the real start ran before the hit; it made no row yet */
	if (!at)
		return;
	JSAMPROW row = malloc((size_t)c->output_width * (size_t)c->output_components);
	if (!row) {
		c->err->msg_code = JERR_OUT_OF_MEMORY;
		c->err->error_exit((j_common_ptr)c);
		return;
	}
	while (c->output_scanline < at && a->read_scanlines(c, &row, 1) == 1)
		;
	free(row);
}

TS_EXPORT JDIMENSION jpeg_read_scanlines(j_decompress_ptr cinfo, JSAMPARRAY rows, JDIMENSION max)
{
	struct dstate *s;
	const struct jpeg_api *a = api_of(cinfo, CALLER(), &s);
	if (s && s->mode == D_HIT) {
		if (cinfo->output_scanline >= s->rows_total) {
			/* as libjpeg: a warning (WARNMS), and no rows */
			cinfo->err->msg_code = JWRN_TOO_MUCH_DATA;
			cinfo->err->emit_message((j_common_ptr)cinfo, -1);
			return 0;
		}
		if (max > 1 && !s->sim.ok) {
			leave_hit(s, cinfo, a); /* how many rows the real decoder gives is not known */
			return a->read_scanlines(cinfo, rows, max);
		}
		JDIMENSION n = 0;
		max = rowsim_call(&s->sim, max, (unsigned)(s->rows_total - cinfo->output_scanline));
		while (n < max && cinfo->output_scanline < s->rows_total) {
			memcpy(rows[n], s->hit + (uint64_t)cinfo->output_scanline * s->row_bytes, s->row_bytes);
			cinfo->output_scanline++;
			n++;
		}
		return n;
	}
	JDIMENSION first = cinfo->output_scanline;
	JDIMENSION n = a->read_scanlines(cinfo, rows, max);
	if (s && s->mode == D_FILL) {
		uint64_t row = (uint64_t)cinfo->output_width * (uint64_t)cinfo->output_components;
		if (first != s->rows_done || row != s->row_bytes || (uint64_t)first + n > s->rows_total) {
			/* rows went past us (skip), or the output is not the one we
			 * reserved for: never write outside the fill */
			ts_exact_abort(&s->fill);
			s->mode = D_PASS;
		} else {
			unsigned char *dst = (unsigned char *)s->fill.ptr + (uint64_t)first * s->row_bytes;
			for (JDIMENSION i = 0; i < n; i++)
				memcpy(dst + (uint64_t)i * s->row_bytes, rows[i], s->row_bytes);
			s->rows_done += n;
		}
	}
	return n;
}

TS_EXPORT JDIMENSION jpeg_skip_scanlines(j_decompress_ptr cinfo, JDIMENSION num)
{
	struct dstate *s;
	const struct jpeg_api *a = api_of(cinfo, CALLER(), &s);
	if (s && s->mode == D_HIT)
		leave_hit(s, cinfo, a); /* the rows after a skip are not always a full decode's */
	if (s && s->mode == D_FILL) {
		ts_exact_abort(&s->fill); /* skipped rows are never decoded */
		s->mode = D_PASS;
	}
	if (!a->skip_scanlines) {
		ts_error("jpeg_skip_scanlines is not in the real libjpeg");
		abort();
	}
	return a->skip_scanlines(cinfo, num);
}

TS_EXPORT void jpeg_crop_scanline(j_decompress_ptr cinfo, JDIMENSION *xoffset, JDIMENSION *width)
{
	struct dstate *s;
	const struct jpeg_api *a = api_of(cinfo, CALLER(), &s);
	if (s && s->mode == D_HIT && cinfo->output_scanline != 0) {
		/* as libjpeg: a crop once rows were read is an error (in the scanning state) */
		cinfo->err->msg_code = JERR_BAD_STATE;
		cinfo->err->msg_parm.i[0] = TS_DSTATE_SCANNING;
		cinfo->err->error_exit((j_common_ptr)cinfo);
		return; /* an error_exit that returns */
	}
	if (s && s->mode == D_HIT) {
		leave_hit(s, cinfo, a); /* cropping changes the output: decode for real after all */
	} else if (s && s->mode == D_FILL) {
		ts_exact_abort(&s->fill);
		s->mode = D_PASS;
	}
	if (!a->crop_scanline) {
		ts_error("jpeg_crop_scanline is not in the real libjpeg");
		abort();
	}
	a->crop_scanline(cinfo, xoffset, width);
}

TS_EXPORT boolean jpeg_finish_decompress(j_decompress_ptr cinfo)
{
	struct dstate *s;
	const struct jpeg_api *a = api_of(cinfo, CALLER(), &s);
	if (s && s->mode == D_HIT && cinfo->output_scanline < s->rows_total) {
		/* As libjpeg: a program that finishes before the last row is wrong */
		cinfo->err->msg_code = JERR_TOO_LITTLE_DATA;
		cinfo->err->error_exit((j_common_ptr)cinfo);
		return FALSE; /* an error_exit that returns: the image is not finished */
	}
	if (s && s->mode == D_HIT && cinfo->global_state != TS_DSTATE_READY && a->has_multiple_scans &&
	    a->has_multiple_scans(cinfo)) {
		/* The real start ran and read every scan to the EOI (D_ABSORB):
		 * the real finish ends the image as without us. */
		free(s->hit);
		s->hit = NULL;
		s->mode = D_PASS;
	} else if (s && s->mode == D_HIT) {
		/* Nothing was decoded: consume the image's bytes up to its EOI as
		 * finish would (a stream may hold more images), return the object
		 * to its start state and let the source manager finish. */
		if (!consume_to_eoi(s, cinfo))
			return FALSE; /* suspended, as libjpeg's finish is */
		if (cinfo->src && cinfo->src->term_source)
			cinfo->src->term_source(cinfo);
		a->abort_d(cinfo);
		image_reset(s);
		return TRUE;
	}
	boolean ok = a->finish(cinfo);
	if (s && ok) {
		/* A decode that warned (corrupt data patched over by libjpeg) is not
		 * shared: a hit could not repeat the warnings the program may check. */
		if (s->mode == D_FILL && s->rows_done == cinfo->output_height &&
		    (!cinfo->err || cinfo->err->num_warnings == 0)) {
			ts_exact_commit(&s->fill, now_ns() - s->t0);
			s->mode = D_PASS;
		}
		image_reset(s);
	}
	return ok;
}

TS_EXPORT void jpeg_abort_decompress(j_decompress_ptr cinfo)
{
	struct dstate *s;
	const struct jpeg_api *a = api_of(cinfo, CALLER(), &s);
	if (s)
		image_reset(s);
	a->abort_d(cinfo);
}

TS_EXPORT void jpeg_destroy_decompress(j_decompress_ptr cinfo)
{
	struct dstate *s;
	const struct jpeg_api *a = api_of(cinfo, CALLER(), &s);
	if (s)
		state_free(s);
	a->destroy_d(cinfo);
}

/*
 * The generic jpeg_abort and jpeg_destroy. libjpeg calls them itself, from
 * inside the calls we hook; those calls come from code in the library and
 * pass straight through (our hook around them does the bookkeeping). A
 * program's own call on a decompressor ends its image, or the object, as
 * the _decompress variants do: a fill it interrupts is given up at once (it
 * stalled every job's lookup of the image until this process exited), and
 * a hit's copy is freed (300 decodes of hits ended with jpeg_destroy kept
 * 145 MiB).
 */
/* Is the caller code of the object's libjpeg? Unknown counts as yes: a
 * call of libjpeg's own taken for the program's would abort a fill inside
 * our finish, before its commit; the other way round only keeps a state. */
static int called_by_lib(const struct jpeg_api *a, const void *caller)
{
	Dl_info info;
	return !a->lib_base || !dladdr(caller, &info) || info.dli_fbase == a->lib_base;
}

/* The real one of the object's library (or the caller's), or abort: a program
 * that calls it links a libjpeg that has it. */
static void *generic_of(void *f, const char *name)
{
	if (!f)
		f = ts_real_next(name);
	if (!f) {
		ts_error("%s called, but the real libjpeg has none; aborting", name);
		abort();
	}
	return f;
}

/* jpeg_abort (destroy 0) or jpeg_destroy (1) of `cinfo`, called from `caller`. */
static void generic_end(j_common_ptr cinfo, const void *caller, int destroy)
{
	struct dstate *s = state_find(cinfo);
	const struct jpeg_api *a = s && s->api ? s->api : api_for(caller);
	void (*real)(j_common_ptr) = destroy ? generic_of((void *)a->destroy_c, "jpeg_destroy")
					     : generic_of((void *)a->abort_c, "jpeg_abort");
	if (s && !called_by_lib(a, caller)) {
		if (destroy)
			state_free(s);
		else
			image_reset(s);
	}
	real(cinfo);
}

TS_EXPORT void jpeg_abort(j_common_ptr cinfo)
{
	generic_end(cinfo, CALLER(), 0);
}

TS_EXPORT void jpeg_destroy(j_common_ptr cinfo)
{
	generic_end(cinfo, CALLER(), 1);
}

/*
 * The rest of the decompress API, called by the program while a hit serves
 * its rows. The hit skipped the real decoder, so what these read is not
 * what it would be without us: jpeg_consume_input never reached EOI (a
 * loop waiting for it spun for ever), jpeg_input_complete answered 0 for a
 * progressive image the real start had read whole, and the state checks of
 * the others answered for DSTATE_READY. The hit is left first (leave_hit),
 * so that the real decoder stands where the program believes it is; calls
 * from libjpeg's own code (jpeg_read_header calls jpeg_consume_input) pass
 * straight through.
 */
static const struct jpeg_api *after_hit(j_decompress_ptr cinfo, const void *caller)
{
	struct dstate *s;
	const struct jpeg_api *a = api_of(cinfo, caller, &s);
	if (s && s->mode == D_HIT && !called_by_lib(a, caller))
		leave_hit(s, cinfo, a);
	return a;
}

TS_EXPORT int jpeg_consume_input(j_decompress_ptr cinfo)
{
	const struct jpeg_api *a = after_hit(cinfo, CALLER());
	int (*real)(j_decompress_ptr) = generic_of((void *)a->consume_input, "jpeg_consume_input");
	return real(cinfo);
}

TS_EXPORT boolean jpeg_input_complete(j_decompress_ptr cinfo)
{
	const struct jpeg_api *a = after_hit(cinfo, CALLER());
	boolean (*real)(j_decompress_ptr) = generic_of((void *)a->input_complete, "jpeg_input_complete");
	return real(cinfo);
}

TS_EXPORT JDIMENSION jpeg_read_raw_data(j_decompress_ptr cinfo, JSAMPIMAGE data, JDIMENSION max)
{
	const struct jpeg_api *a = after_hit(cinfo, CALLER());
	JDIMENSION (*real)(j_decompress_ptr, JSAMPIMAGE, JDIMENSION) =
		generic_of((void *)a->read_raw_data, "jpeg_read_raw_data");
	return real(cinfo, data, max);
}

TS_EXPORT boolean jpeg_start_output(j_decompress_ptr cinfo, int scan)
{
	const struct jpeg_api *a = after_hit(cinfo, CALLER());
	boolean (*real)(j_decompress_ptr, int) = generic_of((void *)a->start_output, "jpeg_start_output");
	return real(cinfo, scan);
}

TS_EXPORT boolean jpeg_finish_output(j_decompress_ptr cinfo)
{
	const struct jpeg_api *a = after_hit(cinfo, CALLER());
	boolean (*real)(j_decompress_ptr) = generic_of((void *)a->finish_output, "jpeg_finish_output");
	return real(cinfo);
}

TS_EXPORT jvirt_barray_ptr *jpeg_read_coefficients(j_decompress_ptr cinfo)
{
	const struct jpeg_api *a = after_hit(cinfo, CALLER());
	jvirt_barray_ptr *(*real)(j_decompress_ptr) =
		generic_of((void *)a->read_coefficients, "jpeg_read_coefficients");
	return real(cinfo);
}

TS_EXPORT void jpeg_new_colormap(j_decompress_ptr cinfo)
{
	const struct jpeg_api *a = after_hit(cinfo, CALLER());
	void (*real)(j_decompress_ptr) = generic_of((void *)a->new_colormap, "jpeg_new_colormap");
	real(cinfo);
}

/* ---- dlsym of our names (shim/cuda.c's dlsym entry) ---------------------------- */

static int is_export(const void *p)
{
	return p == (void *)jpeg_CreateDecompress || p == (void *)jpeg_read_header ||
	       p == (void *)jpeg_start_decompress || p == (void *)jpeg_read_scanlines ||
	       p == (void *)jpeg_skip_scanlines || p == (void *)jpeg_crop_scanline ||
	       p == (void *)jpeg_finish_decompress || p == (void *)jpeg_abort_decompress ||
	       p == (void *)jpeg_destroy_decompress || p == (void *)jpeg_abort || p == (void *)jpeg_destroy ||
	       p == (void *)jpeg_consume_input || p == (void *)jpeg_input_complete ||
	       p == (void *)jpeg_read_raw_data || p == (void *)jpeg_start_output ||
	       p == (void *)jpeg_finish_output || p == (void *)jpeg_read_coefficients ||
	       p == (void *)jpeg_new_colormap;
}

/* Does the object at `caller`, or the global scope, define `name`? Not us. */
static int defined_for(const void *caller, const char *name)
{
	if (ts_real_next(name))
		return 1;
	Dl_info info;
	void *h = caller && dladdr(caller, &info) && info.dli_fname
			  ? dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD)
			  : NULL;
	void *p = h ? ts_real_dlsym(h, name) : NULL;
	ts_real_dlclose(h);
	return p && !is_export(p);
}

void *ts_jpeg_dlsym(const char *name, const void *caller, void *found)
{
	if (!found || !is_export(found))
		return found;
	/* Ours, found first: a libjpeg the lookup would find without us is
	 * reached through it. None: not found, as without us. A program asking
	 * whether libjpeg is loaded must not be told yes because we are. */
	int saved = errno;
	void *r = found;
	if (defined_for(caller, name)) {
		(void)dlerror(); /* our misses left an error; a found symbol leaves none */
	} else {
		(void)ts_real_dlsym(RTLD_NEXT, name); /* so that dlerror() tells "undefined symbol" */
		r = NULL;
	}
	errno = saved;
	return r;
}

static void fill_api(struct jpeg_api *a, void *h)
{
	a->create = pick(h, "jpeg_CreateDecompress", (void *)jpeg_CreateDecompress);
	a->read_header = pick(h, "jpeg_read_header", (void *)jpeg_read_header);
	a->start = pick(h, "jpeg_start_decompress", (void *)jpeg_start_decompress);
	a->read_scanlines = pick(h, "jpeg_read_scanlines", (void *)jpeg_read_scanlines);
	a->skip_scanlines = pick(h, "jpeg_skip_scanlines", (void *)jpeg_skip_scanlines);
	a->crop_scanline = pick(h, "jpeg_crop_scanline", (void *)jpeg_crop_scanline);
	a->finish = pick(h, "jpeg_finish_decompress", (void *)jpeg_finish_decompress);
	a->abort_d = pick(h, "jpeg_abort_decompress", (void *)jpeg_abort_decompress);
	a->destroy_d = pick(h, "jpeg_destroy_decompress", (void *)jpeg_destroy_decompress);
	a->abort_c = pick(h, "jpeg_abort", (void *)jpeg_abort);
	a->destroy_c = pick(h, "jpeg_destroy", (void *)jpeg_destroy);
	a->calc_output_dimensions = pick(h, "jpeg_calc_output_dimensions", NULL);
	a->has_multiple_scans = pick(h, "jpeg_has_multiple_scans", NULL);
	a->consume_input = pick(h, "jpeg_consume_input", (void *)jpeg_consume_input);
	a->input_complete = pick(h, "jpeg_input_complete", (void *)jpeg_input_complete);
	a->read_raw_data = pick(h, "jpeg_read_raw_data", (void *)jpeg_read_raw_data);
	a->start_output = pick(h, "jpeg_start_output", (void *)jpeg_start_output);
	a->finish_output = pick(h, "jpeg_finish_output", (void *)jpeg_finish_output);
	a->read_coefficients = pick(h, "jpeg_read_coefficients", (void *)jpeg_read_coefficients);
	a->new_colormap = pick(h, "jpeg_new_colormap", (void *)jpeg_new_colormap);
	a->lib_id = library_id((void *)a->read_header);
	Dl_info info;
	a->lib_base = a->read_header && dladdr((void *)a->read_header, &info) ? info.dli_fbase : NULL;
	/* A partial library is no library: decode calls would crash half-way. */
	if (!a->create || !a->start || !a->read_scanlines || !a->finish || !a->abort_d || !a->destroy_d ||
	    !a->calc_output_dimensions)
		a->read_header = NULL;
}
