/* What seed 000's reproducer does, written here: N threads, each with a
 * 16 MiB file of its own, map it PROT_READ/MAP_SHARED, read one byte per
 * page, unmap, and count rounds, for a number of seconds.
 *
 * usage: mmap_thrash DIR THREADS SECONDS */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#define FILE_SIZE (16 * 1024 * 1024)

static atomic_int stop;
static const char *dir;

struct arg {
  long id;
  uint64_t rounds;
  int ok;
};

static void *worker(void *p) {
  struct arg *a = p;
  char path[4096];
  snprintf(path, sizeof path, "%s/test_file_%d_%ld.dat", dir, getpid(), a->id);
  int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0666);
  if (fd < 0 || ftruncate(fd, FILE_SIZE) < 0) return NULL;
  /* One non-zero byte per page, so a wrong page shows. */
  for (long off = 0; off < FILE_SIZE; off += 4096) {
    unsigned char b = (unsigned char)(off / 4096 % 251 + 1);
    if (pwrite(fd, &b, 1, off) != 1) return NULL;
  }
  a->ok = 1;
  while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
    unsigned char *m = mmap(NULL, FILE_SIZE, PROT_READ, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) continue;
    for (long off = 0; off < FILE_SIZE; off += 4096)
      if (m[off] != (unsigned char)(off / 4096 % 251 + 1)) a->ok = 0;
    munmap(m, FILE_SIZE);
    a->rounds++;
  }
  close(fd);
  unlink(path);
  return NULL;
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: %s DIR THREADS SECONDS\n", argv[0]);
    return 2;
  }
  dir = argv[1];
  int n = atoi(argv[2]), secs = atoi(argv[3]);
  pthread_t t[1024];
  static struct arg args[1024];
  if (n < 1 || n > 1024 || secs < 1) return 2;
  for (long i = 0; i < n; i++) {
    args[i].id = i;
    pthread_create(&t[i], NULL, worker, &args[i]);
  }
  sleep((unsigned)secs);
  atomic_store(&stop, 1);
  uint64_t total = 0;
  int ok = 1;
  for (int i = 0; i < n; i++) {
    pthread_join(t[i], NULL);
    total += args[i].rounds;
    ok &= args[i].ok;
  }
  printf("threads %d seconds %d\n", n, secs);
  printf("data %s\n", ok ? "ok" : "WRONG");
  printf("Total rounds : %llu\n", (unsigned long long)total);
  printf("Throughput : %.2f rounds/sec\n", (double)total / secs);
  return ok ? 0 : 1;
}
