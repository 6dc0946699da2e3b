/* preadv2(2) and pwritev2(2) on a file with a writable shared mapping:
 * a preadv2 sees what was stored through the mapping (at an offset, and
 * at the descriptor's position with offset -1); a pwritev2 over a page
 * the mapping has dirtied shows in the mapping and survives its unmap
 * (the mapping's older copy of the page must not be written over it).
 *
 * usage: vectored_v2 FILE */
#define _GNU_SOURCE
#include <sys/uio.h>

#include "util.h"

#define LEN (2 * PAGE)

int main(int argc, char **argv) {
  usage(argc, 1, "vectored_v2 FILE");
  int fd = create_filled(argv[1], 'a', LEN);
  char *p = map_and_store(fd, LEN);
  char b1[7] = {0}, b2[7] = {0};
  struct iovec v1 = {b1, 6}, v2 = {b2, 6};
  if (preadv2(fd, &v1, 1, 10, 0) != 6 || lseek(fd, 4096 + 10, SEEK_SET) < 0 ||
      preadv2(fd, &v2, 1, -1, 0) != 6) {
    perror("preadv2");
    return 1;
  }
  printf("preadv2: %s, at the position: %s\n", b1, b2);
  /* The page holding offset 200 is dirty in the mapping (the store at
   * 10 above); the write lands in it. */
  char w[] = "pwv2!!";
  struct iovec wv = {w, 6};
  if (pwritev2(fd, &wv, 1, 200, 0) != 6) {
    perror("pwritev2");
    return 1;
  }
  printf("mapping after pwritev2: %.6s\n", p + 200);
  if (munmap(p, LEN) != 0) {
    perror("munmap");
    return 1;
  }
  char f[7] = {0};
  if (pread(fd, f, 6, 200) != 6) {
    perror("pread");
    return 1;
  }
  printf("file after munmap: %s\n", f);
  return 0;
}
