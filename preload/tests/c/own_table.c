/* A thread with a descriptor table of its own (unshare(CLONE_FILES))
 * maps FILE writable and shared at a descriptor number that the process's
 * first thread's table holds for FILE.other, stores through the mapping
 * and syncs it: the stores land in FILE, and FILE.other keeps its bytes.
 * Read back with raw system calls, which no interposer sees.
 *
 * usage: own_table FILE */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>

#include "util.h"

#define LEN (4 * PAGE)

static const char *path;
static int m;

static void *in_own_table(void *arg) {
  (void)arg;
  if (unshare(CLONE_FILES) != 0 || close(m) != 0) {
    perror("unshare, close");
    exit(1);
  }
  /* Every lower number taken, so the open below gets m. */
  for (;;) {
    int n = open("/dev/null", O_RDONLY);
    if (n < 0) {
      perror("open /dev/null");
      exit(1);
    }
    if (n == m) {
      close(n);
      break;
    }
  }
  int fd = open(path, O_RDWR);
  if (fd != m) {
    fprintf(stderr, "open: got %d, not %d\n", fd, m);
    exit(1);
  }
  char *p = map_or_exit(LEN, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0, "mmap");
  memcpy(p + PAGE + 10, "stored", 6);
  msync_or_exit(p, LEN);
  munmap(p, LEN);
  close(fd);
  return NULL;
}

int main(int argc, char **argv) {
  usage(argc, 1, "own_table FILE");
  static char a[LEN], b[LEN];
  char other[4096];
  memset(a, 'a', sizeof a);
  memset(b, 'b', sizeof b);
  path = argv[1];
  snprintf(other, sizeof other, "%s.other", path);
  close(create_with(path, 0, a, sizeof a));
  m = create_with(other, 0, b, sizeof b);
  pthread_t t;
  if (pthread_create(&t, NULL, in_own_table, NULL) != 0 || pthread_join(t, NULL) != 0) {
    perror("pthread");
    return 1;
  }
  char at[7] = {0}, there[7] = {0};
  int fd = open(path, O_RDONLY);
  if (syscall(SYS_pread64, fd, at, 6, PAGE + 10) != 6 ||
      syscall(SYS_pread64, m, there, 6, PAGE + 10) != 6) {
    perror("read back");
    return 1;
  }
  printf("at the page: %s, the other file there: %s\n", at, there);
  return 0;
}
