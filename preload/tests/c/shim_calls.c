/* The calls the shim serves on one writable shared file mapping, each
 * printed with its result and errno, so a test can see which one failed
 * and how. The program goes on after a failed call, as a careful program
 * would, and ends with "done".
 *
 * usage: shim_calls FILE */
#define _GNU_SOURCE
#include <errno.h>

#include "util.h"

#define LEN (4 * PAGE)

static void say(const char *call, long rc) {
  printf("%s %ld %d\n", call, rc < 0 ? -1L : 0L, rc < 0 ? errno : 0);
}

int main(int argc, char **argv) {
  usage(argc, 1, "shim_calls FILE");
  int fd = create_filled(argv[1], 'a', LEN);
  char *p = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  say("mmap", p == MAP_FAILED ? -1 : 0);
  if (p != MAP_FAILED) {
    p[10] = 'b';
    say("msync", msync(p, LEN, MS_SYNC));
  }
  say("write", pwrite(fd, "c", 1, 20));
  char c = 0;
  say("read", pread(fd, &c, 1, 0));
  say("fsync", fsync(fd));
  if (p != MAP_FAILED) {
    say("mprotect", mprotect(p, LEN, PROT_READ));
    say("munmap", munmap(p, LEN));
  }
  printf("done\n");
  return 0;
}
