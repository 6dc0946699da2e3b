/* 2 MiB pages through the C API, on real faults: an anonymous region and a
 * file region, each 4x the budget, every byte checked after eviction and
 * (for the file) after flush through read(2); a size the engine does not
 * offer and a misaligned length as negative errno. The caller reserves the
 * huge pages (argv[2] of them at least). */
#include <uffd_pager.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"

#define HUGE UFFD_PAGER_HUGE_PAGE_SIZE
#define BUDGET_PAGES 2
#define PAGES (4 * BUDGET_PAGES)


/* A byte of page `p` at offset `off` in round `r`. */
static unsigned char want(size_t p, size_t off, int r) {
  return (unsigned char)(p * 31 + off / 4096 + r);
}

/* Writes round `r` at every 4 KiB of every page, then checks it all (the
 * budget holds a quarter of them: each pass evicts every page). */
static void write_and_check(unsigned char *m, int r) {
  for (size_t p = 0; p < PAGES; p++)
    for (size_t off = 0; off < HUGE; off += 4096) m[p * HUGE + off] = want(p, off, r);
  for (size_t p = 0; p < PAGES; p++)
    for (size_t off = 0; off < HUGE; off += 4096) CHECK(m[p * HUGE + off] == want(p, off, r));
}

int main(int argc, char **argv) {
  CHECK(argc == 3);
  const char *path = argv[1];
  CHECK(uffd_pager_huge_pages_available() >= (uint64_t)atoi(argv[2]));

  uffd_pager_config cfg;
  CHECK(uffd_pager_config_init(&cfg, sizeof cfg) == 0);
  cfg.budget_bytes = BUDGET_PAGES * (uint64_t)HUGE;
  uffd_pager *p = NULL;
  CHECK(uffd_pager_new(&cfg, &p) == 0);

  uffd_pager_map_options o;
  CHECK(uffd_pager_map_options_init(&o, sizeof o) == 0);
  CHECK(o.page_size == 0);
  uffd_pager_region *r = NULL;

  /* Sizes the engine does not offer, and a length of 4 KiB pages. */
  o.page_size = 8192;
  CHECK(uffd_pager_map_anonymous_with(p, PAGES * HUGE, &o, &r) == -EINVAL && r == NULL);
  o.page_size = HUGE;
  CHECK(uffd_pager_map_anonymous_with(p, HUGE + 4096, &o, &r) == -EINVAL && r == NULL);
  CHECK(strstr(uffd_pager_last_error(), "2097152") != NULL ||
        strstr(uffd_pager_last_error(), "2 MiB") != NULL);

  /* Anonymous 2 MiB pages, 4x the budget. */
  o.kind = UFFD_PAGER_KIND_ANONYMOUS;
  CHECK(uffd_pager_map_anonymous_with(p, PAGES * HUGE, &o, &r) == 0);
  CHECK(uffd_pager_region_len(r) == PAGES * HUGE);
  unsigned char *m = uffd_pager_region_addr(r);
  CHECK(((uintptr_t)m & (HUGE - 1)) == 0);
  for (int round = 0; round < 3; round++) write_and_check(m, round);
  uffd_pager_stats st;
  CHECK(uffd_pager_stats_get(p, &st, sizeof st) == (int)sizeof st);
  CHECK(st.pgsteal >= 2 * PAGES && st.writeback >= PAGES);
  /* 2 MiB pages: a few faults per page and pass (4 KiB ones: 512 each). */
  CHECK(st.pgfault <= 6 * 3 * PAGES);
  CHECK(uffd_pager_region_unmap(r) == 0);

  /* A file on 2 MiB shared pages: writes reach it at flush. */
  int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
  CHECK(fd >= 0 && ftruncate(fd, PAGES * HUGE) == 0);
  o.kind = UFFD_PAGER_KIND_SHARED;
  CHECK(uffd_pager_map_file(p, path, 0, &o, &r) == 0);
  m = uffd_pager_region_addr(r);
  for (int round = 0; round < 2; round++) write_and_check(m, round + 7);
  CHECK(uffd_pager_region_flush(r) == 0);
  static unsigned char page[4096];
  for (size_t pg = 0; pg < PAGES; pg++)
    for (size_t off = 0; off < HUGE; off += 4096) {
      CHECK(pread(fd, page, 4096, (off_t)(pg * HUGE + off)) == 4096);
      CHECK(page[0] == want(pg, off, 8));
    }
  /* Refresh is not offered on huge regions: an error, not a stale page. */
  CHECK(uffd_pager_region_refresh(r, 0, 4096) < 0);
  CHECK(uffd_pager_region_unmap(r) == 0);
  uffd_pager_free(p);
  close(fd);
  unlink(path);
  printf("c api huge: ok\n");
  return 0;
}
