/* msync(MS_SYNC) of a shared file mapping makes the file's bytes in the
 * range durable, whichever way they got there: through the mapping, or
 * with pwrite(2) (the kernel's msync syncs the file's range). The file's
 * dirty page-cache pages after it are counted with cachestat(2) (Linux
 * 6.5).
 *
 * A range that runs on past the mapping into a hole is ENOMEM, but the
 * kernel has synced the mappings before the hole by then, so the stores
 * are durable all the same.
 *
 * usage: msync_durable FILE */
#define _GNU_SOURCE
#include <errno.h>
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

/* stores: through the mapping, else pwrite(2). hole: the msync range
 * runs one page past the mapping, onto a page nothing maps. */
static int run(const char *path, int stores, int hole) {
  static char a[N * PAGE];
  memset(a, 'a', sizeof a);
  int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
  if (fd < 0 || write(fd, a, sizeof a) != (ssize_t)sizeof a || fsync(fd) != 0) {
    perror("create");
    return 1;
  }
  /* The mapping goes where a range one page longer was free (reserved and
   * unmapped again), so the page after it is a hole. */
  char *p = map_or_exit((N + 1) * PAGE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0, "reserve");
  if (munmap(p, (N + 1) * PAGE) != 0 ||
      mmap(p, N * PAGE, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED_NOREPLACE, fd, 0) != p) {
    perror("mmap");
    return 1;
  }
  for (int i = 0; i < N; i++) {
    if (stores)
      p[i * PAGE] = 's';
    else if (pwrite(fd, "w", 1, (off_t)i * PAGE + 7) != 1)
      return 1;
  }
  int rc = msync(p, (N + hole) * PAGE, MS_SYNC);
  if (hole ? rc != -1 || errno != ENOMEM : rc != 0) {
    perror("msync");
    return 1;
  }
  printf("%s, then msync%s: %ld dirty pages\n", stores ? "stores" : "pwrite",
         hole ? " past the end (ENOMEM)" : "", dirty(fd));
  munmap(p, N * PAGE);
  close(fd);
  return 0;
}

int main(int argc, char **argv) {
  usage(argc, 1, "msync_durable FILE");
  return run(argv[1], 1, 0) || run(argv[1], 0, 0) || run(argv[1], 1, 1) || run(argv[1], 0, 1);
}
