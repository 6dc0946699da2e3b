/* A UMap program started with a bad UMAP_PAGESIZE and UMAP_READ_AHEAD that
 * sets both itself before its first umap: the setters' values are the
 * ones in force, so umap works. A page size set after the first umap changes only
 * the getter: umap_prefetch still fetches UMap pages of the size in force
 * (four 4 KiB pages here, not sixteen). Calls that fail on their arguments
 * (a length, a descriptor, an offset or range its file refuses) before the
 * first good one do not fix the settings.
 *
 * usage: umap_set_page_size FILE */
#include <umap/umap.h>
#include <uffd_pager.h> /* umap_uffd_pager_stats */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv) {
  if (argc != 2) return 2;
  static char buf[16 * 4096];
  memset(buf, 'u', sizeof buf);
  int fd = open(argv[1], O_RDWR | O_CREAT | O_TRUNC, 0644);
  if (fd < 0 || write(fd, buf, sizeof buf) != (ssize_t)sizeof buf) {
    perror("create");
    return 1;
  }
  umapcfg_set_umap_page_size(8192);
  if (umapcfg_get_umap_page_size() != 8192) return 1;
  /* The run's UMAP_READ_AHEAD is not a number: the program's own value
   * replaces it, as its page size replaces UMAP_PAGESIZE's. */
  umapcfg_set_read_ahead(0);
  /* Probes with bad arguments fail without making the pager, so a setting
   * changed after them is the one in force. */
  if (umap(NULL, 0, PROT_READ, UMAP_PRIVATE, fd, 0) != UMAP_FAILED || errno != EINVAL) return 1;
  if (umap(NULL, sizeof buf, PROT_READ, UMAP_PRIVATE, -1, 0) != UMAP_FAILED || errno != EBADF)
    return 1;
  /* Refused by the file's store (an unaligned offset; a range past the
   * end of the file), which is opened before the pager is made. */
  if (umap(NULL, 4096, PROT_READ, UMAP_PRIVATE, fd, 100) != UMAP_FAILED) return 1;
  if (umap(NULL, 4096, PROT_READ, UMAP_PRIVATE, fd, sizeof buf) != UMAP_FAILED) return 1;
  umapcfg_set_umap_page_size(16384);
  /* The buffer is UMap's default with UMAP_BUFSIZE unset, not 0. */
  if (umapcfg_get_max_pages_in_buffer() == 0) return 1;
  char *r = umap(NULL, sizeof buf, PROT_READ, UMAP_PRIVATE, fd, 0);
  if (r == UMAP_FAILED) {
    perror("umap");
    return 1;
  }
  umapcfg_set_umap_page_size(65536);
  if (umapcfg_get_umap_page_size() != 65536) return 1;
  uffd_pager_stats st;
  if (umap_uffd_pager_stats(&st, sizeof st) != (int)sizeof st) return 1;
  uint64_t before = st.pgread;
  struct umap_prefetch_item item = {r};
  umap_prefetch(1, &item);
  if (umap_uffd_pager_stats(&st, sizeof st) != (int)sizeof st) return 1;
  printf("prefetch read %llu pages\n", (unsigned long long)(st.pgread - before));
  for (size_t i = 0; i < sizeof buf; i += 4096)
    if (r[i] != 'u') return 1;
  if (uunmap(r, sizeof buf) != 0) return 1;
  printf("umap after set: ok\n");
  return 0;
}
