/*
 * UMap's C interface, served by uffd-pager (link with -luffd_pager).
 *
 * The declarations follow UMap's published API so that programs written
 * for UMap build unchanged; the implementation is uffd-pager's own
 * (capi/src/umap.rs). How UMap's settings and flags map onto the engine is
 * in the README, "From C and from unmodified programs".
 */
#ifndef UFFD_PAGER_UMAP_H
#define UFFD_PAGER_UMAP_H

#include <stdint.h>
#include <stddef.h>
#include <unistd.h>
#include <sys/mman.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Maps `length` bytes of file `fd` from `offset`; UMAP_FAILED and errno on failure. */
void *umap(void *addr, size_t length, int prot, int flags, int fd, off_t offset);
/* Unmaps the region starting at `addr`, writing dirty pages back. 0 or -1. */
int uunmap(void *addr, size_t length);
/* Writes every region's dirty pages back. 0 or -1. */
int umap_flush(void);

struct umap_prefetch_item {
  void *page_base_addr;
};

/* Fetches the UMap page around each item's address now. */
void umap_prefetch(int npages, struct umap_prefetch_item *page_array);
/* Fetches [paddr, paddr+size) now (not pinned: the budget still applies). */
void umap_fetch_and_pin(char *paddr, uint64_t size);
/* 1: regions may be written; dirty pages go back to their files. */
int umap_has_write_support(void);

long umapcfg_get_system_page_size(void);
uint64_t umapcfg_get_umap_page_size(void);
void umapcfg_set_umap_page_size(uint64_t page_size);
uint64_t umapcfg_get_max_pages_in_buffer(void);
void umapcfg_set_max_pages_in_buffer(uint64_t max_pages);
uint64_t umapcfg_get_num_fillers(void);
void umapcfg_set_num_fillers(uint64_t num_fillers);
uint64_t umapcfg_get_num_evictors(void);
void umapcfg_set_num_evictors(uint64_t num_evictors);
uint64_t umapcfg_get_read_ahead(void);
void umapcfg_set_read_ahead(uint64_t num_pages);
uint64_t umapcfg_get_max_fault_events(void);
void umapcfg_set_max_fault_events(uint64_t max_events);
int umapcfg_get_evict_low_water_threshold(void);
void umapcfg_set_evict_low_water_threshold(int percent);
int umapcfg_get_evict_high_water_threshold(void);
void umapcfg_set_evict_high_water_threshold(int percent);

#ifdef __cplusplus
}
#endif

#define UMAP_PRIVATE MAP_PRIVATE
#define UMAP_FIXED MAP_FIXED
#define UMAP_FAILED ((void *)-1)

#endif /* UFFD_PAGER_UMAP_H */
