/* mmap of a descriptor opened O_WRONLY: the kernel refuses every kind
 * (EACCES), since a mapping must read its file. Then, on a descriptor
 * opened O_RDWR, the file maps and reads as usual.
 *
 * usage: write_only FILE */
#define _GNU_SOURCE
#include <errno.h>

#include "util.h"

#define LEN (4 * 4096)

int main(int argc, char **argv) {
  usage(argc, 1, "write_only FILE");
  setvbuf(stdout, NULL, _IONBF, 0);
  int fd = create_filled(argv[1], 'w', LEN);
  close(fd);
  int wo = open(argv[1], O_WRONLY);
  const char *kinds[] = {"read-only shared", "writable shared", "read-only private"};
  int prots[] = {PROT_READ, PROT_READ | PROT_WRITE, PROT_READ};
  int flags[] = {MAP_SHARED, MAP_SHARED, MAP_PRIVATE};
  for (int i = 0; i < 3; i++) {
    volatile char *p = mmap(NULL, LEN, prots[i], flags[i], wo, 0);
    if (p == MAP_FAILED) {
      printf("%s: %s\n", kinds[i], strerror(errno));
    } else {
      printf("%s: mapped, reads %c\n", kinds[i], p[4096]);
      munmap((void *)p, LEN);
    }
  }
  int rw = open(argv[1], O_RDWR);
  volatile char *p = map_or_exit(LEN, PROT_READ | PROT_WRITE, MAP_SHARED, rw, 0, "mmap O_RDWR");
  printf("O_RDWR: reads %c\n", p[4096]);
  return 0;
}
