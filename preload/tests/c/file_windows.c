/* Small windows of a large sparse file, kept mapped, then a large
 * anonymous reservation: the windows take only their own address space
 * under the kernel, so the reservation fits.
 *
 * usage: file_windows FILE GIB WINDOWS */
#define _GNU_SOURCE
#include <errno.h>

#include "util.h"

int main(int argc, char **argv) {
  usage(argc, 3, "file_windows FILE GIB WINDOWS");
  long long size = atoll(argv[2]) << 30;
  int n = atoi(argv[3]);
  int fd = open(argv[1], O_RDWR | O_CREAT | O_TRUNC, 0644);
  if (fd < 0 || ftruncate(fd, size) != 0) {
    perror("create");
    return 1;
  }
  int failed = 0;
  for (int i = 0; i < n; i++) {
    char *p = mmap(NULL, 4096, PROT_READ, MAP_SHARED, fd, (off_t)i * 4096);
    if (p == MAP_FAILED || p[0] != 0)
      failed++;
  }
  void *big = mmap(NULL, 1L << 44, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  printf("%d windows, %d failed; 16 TiB reserved: %s\n", n, failed,
         big == MAP_FAILED ? strerror(errno) : "ok");
  unlink(argv[1]);
  return 0;
}
