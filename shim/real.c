/* SPDX-License-Identifier: MIT */
#include "real.h"

#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <link.h>

typedef void *(*dlsym_fn)(void *, const char *);
static dlsym_fn _Atomic real_dlsym_ptr;

void *ts_real_dlsym(void *handle, const char *name)
{
	dlsym_fn fn = atomic_load_explicit(&real_dlsym_ptr, memory_order_relaxed);
	if (!fn) {
		/* glibc >= 2.34 versions dlsym in libc; older ones in libdl. */
		fn = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
		if (!fn)
			fn = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
		if (!fn)
			return NULL;
		atomic_store_explicit(&real_dlsym_ptr, fn, memory_order_relaxed);
	}
	return fn(handle, name);
}

void *ts_real_next(const char *name)
{
	int saved = errno;
	void *p = ts_real_dlsym(RTLD_NEXT, name);
	errno = saved;
	return p;
}

typedef int (*dlclose_fn)(void *);
static dlclose_fn _Atomic real_dlclose_ptr;

void ts_real_dlclose(void *handle)
{
	int saved = errno;
	dlclose_fn fn = atomic_load_explicit(&real_dlclose_ptr, memory_order_relaxed);
	if (!fn) {
		fn = (dlclose_fn)ts_real_next("dlclose");
		atomic_store_explicit(&real_dlclose_ptr, fn, memory_order_relaxed);
	}
	if (fn && handle)
		fn(handle);
	errno = saved;
}

/* A dynamic-section address: glibc relocates some entries in place (symbol
 * and string tables, on most targets), never others (DT_VERDEF); one not
 * relocated lies below the load address. */
static const void *dyn_addr(const struct link_map *m, ElfW(Addr) a)
{
	return (const void *)(a < m->l_addr ? a + m->l_addr : a);
}

const char *ts_real_def_version(const void *p)
{
	Dl_info info;
	struct link_map *m = NULL;
	const ElfW(Sym) *sym = NULL;
	if (!dladdr1(p, &info, (void **)&m, RTLD_DL_LINKMAP) || !m ||
	    !dladdr1(p, &info, (void **)&sym, RTLD_DL_SYMENT) || !sym)
		return NULL;
	const ElfW(Sym) *symtab = NULL;
	const ElfW(Versym) *versym = NULL;
	const char *strtab = NULL, *verdef = NULL;
	for (const ElfW(Dyn) *d = m->l_ld; d->d_tag != DT_NULL; d++) {
		if (d->d_tag == DT_SYMTAB)
			symtab = dyn_addr(m, d->d_un.d_ptr);
		else if (d->d_tag == DT_VERSYM)
			versym = dyn_addr(m, d->d_un.d_ptr);
		else if (d->d_tag == DT_STRTAB)
			strtab = dyn_addr(m, d->d_un.d_ptr);
		else if (d->d_tag == DT_VERDEF)
			verdef = dyn_addr(m, d->d_un.d_ptr);
	}
	if (!symtab || !versym || !strtab || !verdef || sym < symtab)
		return NULL;
	unsigned ndx = versym[sym - symtab] & 0x7fffu; /* the top bit says hidden */
	if (ndx <= VER_NDX_GLOBAL)
		return NULL;
	for (const char *v = verdef;;) {
		const ElfW(Verdef) *vd = (const ElfW(Verdef) *)v;
		if (vd->vd_ndx == ndx && !(vd->vd_flags & VER_FLG_BASE))
			return strtab + ((const ElfW(Verdaux) *)(v + vd->vd_aux))->vda_name;
		if (!vd->vd_next)
			return NULL;
		v += vd->vd_next;
	}
}

/* own was linked against, so the reference asks for own's version. RTLD_NEXT
 * from here starts after the shim: never one of ours. */
void *ts_real_bind(const char *name, void *own)
{
	void *g = ts_real_next(name);
	if (!own || !g || g == own)
		return own ? own : g;
	const char *v = ts_real_def_version(own);
	if (!v)
		return g;
	int saved = errno;
	void *gv = dlvsym(RTLD_NEXT, name, v);
	errno = saved;
	return gv ? gv : own;
}
