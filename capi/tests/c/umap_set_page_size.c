/* A UMap program started with a bad UMAP_PAGESIZE that sets a good page
 * size itself before its first umap: the setter's value is the one in
 * force, so umap works.
 *
 * usage: umap_set_page_size FILE */
#include <umap/umap.h>
#include <fcntl.h>
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
  char *r = umap(NULL, sizeof buf, PROT_READ, UMAP_PRIVATE, fd, 0);
  if (r == UMAP_FAILED) {
    perror("umap");
    return 1;
  }
  for (size_t i = 0; i < sizeof buf; i += 4096)
    if (r[i] != 'u') return 1;
  if (uunmap(r, sizeof buf) != 0) return 1;
  printf("umap after set: ok\n");
  return 0;
}
