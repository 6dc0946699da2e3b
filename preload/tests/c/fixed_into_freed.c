/* A file mapped with MAP_FIXED (or MAP_FIXED_NOREPLACE) into a range that
 * was free: one the program reserved and unmapped just before, so the
 * first free range of its size, where any mapping made in the meantime
 * would go. The stores reach the file and the bytes read back.
 *
 * usage: fixed_into_freed FILE */
#define _GNU_SOURCE
#include "util.h"

#define N 16

static int run(const char *path, int flag, const char *what) {
  int fd = create_filled(path, 'a', N * PAGE);
  char *p = map_or_exit(N * PAGE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0, "reserve");
  if (munmap(p, N * PAGE) != 0 ||
      mmap(p, N * PAGE, PROT_READ | PROT_WRITE, MAP_SHARED | flag, fd, 0) != p) {
    perror(what);
    return 1;
  }
  int same = 1;
  for (int i = 0; i < N; i++) {
    same &= p[i * PAGE + 1] == 'a';
    p[i * PAGE] = 'b';
  }
  if (msync(p, N * PAGE, MS_SYNC) != 0 || munmap(p, N * PAGE) != 0) {
    perror("msync");
    return 1;
  }
  char c = 0;
  if (pread(fd, &c, 1, 5 * PAGE) != 1)
    return 1;
  printf("%s: %s, stored '%c'\n", what, same ? "read back" : "wrong bytes", c);
  close(fd);
  return 0;
}

int main(int argc, char **argv) {
  usage(argc, 1, "fixed_into_freed FILE");
  return run(argv[1], MAP_FIXED, "MAP_FIXED") ||
         run(argv[1], MAP_FIXED_NOREPLACE, "MAP_FIXED_NOREPLACE");
}
