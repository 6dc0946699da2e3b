/* A UMap program that stores through a writable mapping and exits without
 * uunmap or umap_flush: the stores reach the file, as they would through
 * the kernel's shared mapping.
 *
 * usage: umap_exit FILE */
#include <umap/umap.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv) {
  if (argc != 2) return 2;
  static char buf[4 * 4096];
  memset(buf, 'a', sizeof buf);
  int fd = open(argv[1], O_RDWR | O_CREAT | O_TRUNC, 0644);
  if (fd < 0 || write(fd, buf, sizeof buf) != (ssize_t)sizeof buf) {
    perror("create");
    return 1;
  }
  char *w = umap(NULL, sizeof buf, PROT_READ | PROT_WRITE, UMAP_PRIVATE, fd, 0);
  if (w == UMAP_FAILED) {
    perror("umap");
    return 1;
  }
  memcpy(w + 4096 + 10, "stored", 6);
  return 0; /* exit, no uunmap */
}
