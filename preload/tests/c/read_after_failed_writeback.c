/* A store through a shared mapping, then a pread of the stored bytes,
 * where the pager cannot write the page back first (the file size limit,
 * RLIMIT_FSIZE, is below the page: its write fails with EFBIG). The
 * kernel's read sees the store (one page cache). The shim's read went on
 * after its failed write-back and returned the file's older bytes with no
 * error: a read must see the store, or fail. A read of another page,
 * which needs no write-back, still reads.
 *
 * usage: read_after_failed_writeback FILE */
#define _GNU_SOURCE
#include <errno.h>
#include <sys/resource.h>

#include "util.h"

#define LEN (8 * PAGE)

int main(int argc, char **argv) {
  usage(argc, 1, "read_after_failed_writeback FILE");
  int fd = create_filled(argv[1], 'o', LEN);
  char *p = map_or_exit(LEN, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0, "mmap");
  p[6 * PAGE] = 'n';
  signal(SIGXFSZ, SIG_IGN);
  struct rlimit lim = {4 * PAGE, RLIM_INFINITY};
  if (setrlimit(RLIMIT_FSIZE, &lim) != 0)
    return 1;
  /* A read of a page with no store in it still reads. */
  char c = 0;
  ssize_t r0 = pread(fd, &c, 1, 0);
  printf("other page: %s\n", r0 == 1 && c == 'o' ? "read" : "failed");
  c = 0;
  errno = 0;
  ssize_t r = pread(fd, &c, 1, 6 * PAGE);
  int e = errno;
  if (r == 1)
    printf("pread: %s\n", c == 'n' ? "the store" : "older bytes");
  else
    printf("pread %zd %s\n", r, e == EFBIG ? "EFBIG" : e == EIO ? "EIO" : "other");
  /* Unlimited again: the exit's write-back lands. */
  lim.rlim_cur = RLIM_INFINITY;
  setrlimit(RLIMIT_FSIZE, &lim);
  return 0;
}
