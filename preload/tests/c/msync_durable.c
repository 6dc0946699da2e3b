/* msync(MS_SYNC) of a shared file mapping makes the file's bytes in the
 * range durable, whichever way they got there: through the mapping, or
 * with pwrite(2) (the kernel's msync syncs the file's range). The file's
 * dirty page-cache pages after it are counted with cachestat(2) (Linux
 * 6.5).
 *
 * usage: msync_durable FILE */
#define _GNU_SOURCE
#include <stdint.h>
#include <sys/syscall.h>

#include "util.h"

#define N 16

struct cs_range {
  uint64_t off, len;
};
struct cs {
  uint64_t cache, dirty, writeback, evicted, recently_evicted;
};

static long dirty(int fd) {
  struct cs_range r = {0, 0};
  struct cs c;
  if (syscall(451, fd, &r, &c, 0) != 0) {
    perror("cachestat");
    exit(1);
  }
  return (long)c.dirty;
}

static int run(const char *path, int stores) {
  static char a[N * PAGE];
  memset(a, 'a', sizeof a);
  int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
  if (fd < 0 || write(fd, a, sizeof a) != (ssize_t)sizeof a || fsync(fd) != 0) {
    perror("create");
    return 1;
  }
  char *p = map_or_exit(N * PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0, "mmap");
  for (int i = 0; i < N; i++) {
    if (stores)
      p[i * PAGE] = 's';
    else if (pwrite(fd, "w", 1, (off_t)i * PAGE + 7) != 1)
      return 1;
  }
  if (msync(p, N * PAGE, MS_SYNC) != 0) {
    perror("msync");
    return 1;
  }
  printf("%s, then msync: %ld dirty pages\n", stores ? "stores" : "pwrite", dirty(fd));
  munmap(p, N * PAGE);
  close(fd);
  return 0;
}

int main(int argc, char **argv) {
  usage(argc, 1, "msync_durable FILE");
  return run(argv[1], 1) || run(argv[1], 0);
}
