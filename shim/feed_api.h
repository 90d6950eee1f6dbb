/* SPDX-License-Identifier: MIT */
/*
 * Data-feed entry points for the PyTorch layer (shim/python/tsshim_feed.py,
 * through ctypes). Not part of the public C API in include/tsshim.h: their
 * shape follows what the Python layer needs and may change with it.
 */
#ifndef TSSHIM_SHIM_FEED_API_H
#define TSSHIM_SHIM_FEED_API_H

#include <stdint.h>

int tsshim_feed_open(const char *key, const char *label, uint64_t nindex);
const char *tsshim_feed_open_why(void);
void tsshim_feed_close(int h);
int tsshim_feed_role(int h);
int tsshim_feed_timeout_ms(int h);
int tsshim_feed_stall_ms(int h);
int tsshim_feed_take_idle(int h);
int tsshim_feed_set_idle(int h, int idle);
int tsshim_feed_idle_while_away(int h, int away);
int tsshim_feed_flags(int h);
int tsshim_feed_set_unshareable(int h);
int tsshim_feed_made(int h, uint32_t flags, uint64_t nsamples, const int64_t *index, uint64_t stream_epoch,
	uint64_t nth);
int tsshim_feed_publish(int h, uint32_t npos, uint32_t flags, uint64_t nsamples, const uint64_t *len,
	const void *const *src, const int64_t *index, uint64_t stream_epoch,
	const char *schema, uint32_t schema_len, uint64_t cpu_ns, uint32_t timeout_ms);
int tsshim_feed_evict_laggards(int h);
int tsshim_feed_evict_away(int h, uint32_t min_ms);
int tsshim_feed_set_away(int h, int away);
int tsshim_feed_stream_state(int h, uint64_t *epoch, int *ended, int64_t *rest, uint64_t *nrest,
	uint64_t *npublished, uint32_t timeout_ms);
int tsshim_feed_attach(int h, int at_epoch_start);
int tsshim_feed_epoch_begin(int h);
int tsshim_feed_note_loss(int h);
int tsshim_feed_lost(int h, int64_t *out, uint64_t cap, uint64_t *n);
int tsshim_feed_detach(int h);
int tsshim_feed_at_head(int h);
int tsshim_feed_holds_producer(int h);
int tsshim_feed_others(int h);
int tsshim_feed_next(int h, uint32_t timeout_ms, uint32_t *npos, uint64_t *nsamples, uint64_t *stream_epoch,
	uint64_t *sample_bytes, char *schema, uint32_t *schema_len);
int tsshim_feed_next_index(int h, uint32_t timeout_ms, int64_t *index);
int tsshim_feed_read(int h, uint32_t npos, const uint64_t *want, void *const *dst, uint64_t *got, int *eoe,
	uint32_t timeout_ms);
int tsshim_feed_read_view(int h, uint32_t npos, const uint64_t *want, void **ptr, uint64_t *got, int *eoe,
	uint64_t *id, uint32_t timeout_ms);
int tsshim_feed_release_view(int h, uint64_t id);
int tsshim_feed_read_ids(int h, int64_t *out, uint64_t cap, uint64_t *n);
int tsshim_feed_served(int h, uint64_t batches, uint64_t samples);
/* GPU serving of the batches the layer yields (feed_api.c) */
int tsshim_feed_gpu(int h);
int tsshim_feed_gpu_published(int h, uint32_t npos, void *const *ptr, const uint64_t *len);
int tsshim_feed_gpu_read(int h, uint32_t npos, void *const *ptr, const uint64_t *len, int view);

#endif
