/* umap with UMAP_FIXED into a range that was free: one the program
 * reserved and unmapped just before, so the first free range of its size,
 * where the library's own mappings (its first umap builds the pager) would
 * go. The region lands there and reads the file. A second uunmap of it
 * fails with EINVAL, and uffd_pager_last_error says why.
 *
 * usage: umap_fixed FILE */
#include <umap/umap.h>
#include <uffd_pager.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define LEN (16 * 4096)

int main(int argc, char **argv) {
  if (argc != 2) return 2;
  static char buf[LEN];
  memset(buf, 'a', sizeof buf);
  int fd = open(argv[1], O_RDWR | O_CREAT | O_TRUNC, 0644);
  if (fd < 0 || write(fd, buf, sizeof buf) != (ssize_t)sizeof buf) {
    perror("create");
    return 1;
  }
  char *p = mmap(NULL, LEN, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED || munmap(p, LEN) != 0) {
    perror("reserve");
    return 1;
  }
  char *r = umap(p, LEN, PROT_READ, UMAP_PRIVATE | UMAP_FIXED, fd, 0);
  if (r == UMAP_FAILED) {
    perror("umap");
    return 1;
  }
  printf("umap fixed: %s, read '%c'\n", r == p ? "at the address" : "elsewhere", r[5 * 4096]);
  if (uunmap(r, LEN) != 0)
    return 1;
  if (uunmap(r, LEN) != -1 || errno != EINVAL)
    return 1;
  printf("again: %s\n", strstr(uffd_pager_last_error(), "no region starts at") ? "said" : "silent");
  return 0;
}
