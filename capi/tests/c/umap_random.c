/* A UMap program (UMap's calls only, built against <umap/umap.h>): random
 * one-word reads of every page of a file, in a shuffled order per thread,
 * as UMap's pfbenchmark-read --shuffle does; every value is checked. Then
 * a writable mapping, umap_flush, and the file read back.
 *
 * usage: umap_random FILE PAGES THREADS   (UMAP_BUFSIZE etc. from the env) */
#define _GNU_SOURCE /* memfd_create, O_PATH */
#include <umap/umap.h>
#include <uffd_pager.h> /* umap_uffd_pager_stats */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CHECK(c)                                                   \
  do {                                                             \
    if (!(c)) {                                                    \
      fprintf(stderr, "%s:%d: %s (errno %d)\n", __FILE__, __LINE__, #c, errno); \
      exit(1);                                                     \
    }                                                              \
  } while (0)

static uint64_t npages, psize;
static int nthreads;
static char *base;
static long bad;

static uint64_t rnd(uint64_t *s) {
  *s ^= *s << 13; *s ^= *s >> 7; *s ^= *s << 17;
  return *s;
}

static void *reader(void *arg) {
  long t = (long)arg;
  uint64_t lo = npages * t / nthreads, hi = npages * (t + 1) / nthreads;
  uint64_t n = hi - lo, seed = 0x9e3779b97f4a7c15ull + t;
  uint64_t *order = malloc(n * sizeof *order);
  for (uint64_t i = 0; i < n; i++) order[i] = lo + i;
  for (uint64_t i = n - 1; i > 0; i--) {
    uint64_t j = rnd(&seed) % (i + 1), x = order[i];
    order[i] = order[j]; order[j] = x;
  }
  long wrong = 0;
  for (uint64_t i = 0; i < n; i++) {
    uint64_t p = order[i];
    if (*(volatile uint64_t *)(base + p * psize) != p) wrong++;
  }
  __atomic_add_fetch(&bad, wrong, __ATOMIC_RELAXED);
  free(order);
  return NULL;
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
  CHECK(argc == 4);
  npages = strtoull(argv[2], NULL, 0);
  nthreads = atoi(argv[3]);
  psize = umapcfg_get_umap_page_size();
  CHECK(umapcfg_get_system_page_size() == 4096 && psize % 4096 == 0);
  int fd = open(argv[1], O_RDWR | O_CREAT | O_TRUNC, 0600);
  CHECK(fd >= 0);
  CHECK(ftruncate(fd, (off_t)(npages * psize)) == 0);
  for (uint64_t p = 0; p < npages; p++)
    CHECK(pwrite(fd, &p, sizeof p, (off_t)(p * psize)) == sizeof p);
  fsync(fd);

  printf("umap_page_size %llu max_pages_in_buffer %llu fillers %llu evictors %llu read_ahead %llu\n",
         (unsigned long long)psize, (unsigned long long)umapcfg_get_max_pages_in_buffer(),
         (unsigned long long)umapcfg_get_num_fillers(),
         (unsigned long long)umapcfg_get_num_evictors(),
         (unsigned long long)umapcfg_get_read_ahead());
  CHECK(umapcfg_get_evict_low_water_threshold() <= umapcfg_get_evict_high_water_threshold());

  size_t len = npages * psize;
  base = umap(NULL, len, PROT_READ, UMAP_PRIVATE, fd, 0);
  CHECK(base != UMAP_FAILED);
  struct umap_prefetch_item items[2] = {{base}, {base + psize}};
  umap_prefetch(2, items);

  pthread_t th[64];
  CHECK(nthreads > 0 && nthreads <= 64);
  double t0 = now();
  for (long t = 0; t < nthreads; t++) CHECK(pthread_create(&th[t], NULL, reader, (void *)t) == 0);
  for (int t = 0; t < nthreads; t++) pthread_join(th[t], NULL);
  double secs = now() - t0;
  CHECK(bad == 0);
  /* The UMap pager's statistics, declared in uffd_pager.h. */
  uffd_pager_stats st;
  CHECK(umap_uffd_pager_stats(&st, sizeof st) == (int)sizeof st && st.pgfault > 0);
  printf("random-read pages %llu threads %d us_per_page %.3f\n", (unsigned long long)npages,
         nthreads, secs * 1e6 / (double)npages);
  CHECK(uunmap(base, len) == 0);
  CHECK(uunmap(base, len) == -1 && errno == EINVAL);

  /* Writable: changes reach the file at umap_flush. */
  char *w = umap(NULL, len, PROT_READ | PROT_WRITE, UMAP_PRIVATE, fd, 0);
  CHECK(w != UMAP_FAILED);
  for (uint64_t p = 0; p < npages; p += 7) *(uint64_t *)(w + p * psize + 8) = p * 11;
  CHECK(umap_flush() == 0);
  for (uint64_t p = 0; p < npages; p += 7) {
    uint64_t v = 0;
    CHECK(pread(fd, &v, sizeof v, (off_t)(p * psize + 8)) == sizeof v && v == p * 11);
  }
  CHECK(uunmap(w, len) == 0);

  /* A bad offset is UMAP_FAILED with errno, not a crash. */
  CHECK(umap(NULL, len, PROT_READ, UMAP_PRIVATE, fd, 100) == UMAP_FAILED && errno == EINVAL);
  CHECK(umap(NULL, len, PROT_READ, UMAP_PRIVATE, -1, 0) == UMAP_FAILED && errno == EBADF);

  /* Descriptors mmap refuses are refused as mmap refuses them (each was
   * mapped, and its first touch was SIGBUS or its write-backs failed). */
  int path_only = open(argv[1], O_PATH);
  CHECK(path_only >= 0);
  CHECK(umap(NULL, psize, PROT_READ, UMAP_PRIVATE, path_only, 0) == UMAP_FAILED &&
        errno == EBADF);
  close(path_only);
  int dir = open("/", O_RDONLY | O_DIRECTORY);
  CHECK(dir >= 0);
  CHECK(umap(NULL, psize, PROT_READ, UMAP_PRIVATE, dir, 0) == UMAP_FAILED && errno == ENODEV);
  close(dir);
  int sealed = memfd_create("umap-sealed", MFD_ALLOW_SEALING);
  CHECK(sealed >= 0 && ftruncate(sealed, (off_t)psize) == 0);
  CHECK(fcntl(sealed, F_ADD_SEALS, F_SEAL_WRITE) == 0);
  CHECK(umap(NULL, psize, PROT_READ | PROT_WRITE, UMAP_PRIVATE, sealed, 0) == UMAP_FAILED &&
        errno == EPERM);
  char *ro = umap(NULL, psize, PROT_READ, UMAP_PRIVATE, sealed, 0);
  CHECK(ro != UMAP_FAILED && ro[0] == 0);
  CHECK(uunmap(ro, psize) == 0);
  close(sealed);

  /* A refused map drops none of the caller's record locks on the file (a
   * descriptor of it opened and closed again drops them all). A file no
   * region has used: a region's store closes its descriptor when its
   * release ends, which may be after the caller took the lock. */
  char lpath[4096];
  snprintf(lpath, sizeof lpath, "%s.lock", argv[1]);
  int lfd = open(lpath, O_RDWR | O_CREAT | O_TRUNC, 0600);
  CHECK(lfd >= 0 && ftruncate(lfd, (off_t)psize) == 0);
  struct flock lk = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 1};
  CHECK(fcntl(lfd, F_SETLK, &lk) == 0);
  CHECK(umap(NULL, psize, PROT_READ | PROT_WRITE, UMAP_PRIVATE, lfd, (off_t)psize) ==
            UMAP_FAILED &&
        errno == EINVAL);
  pid_t child = fork();
  CHECK(child >= 0);
  if (child == 0) {
    struct flock q = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 1};
    _exit(fcntl(lfd, F_GETLK, &q) == 0 && q.l_type == F_WRLCK ? 0 : 1);
  }
  int status = 0;
  CHECK(waitpid(child, &status, 0) == child && WIFEXITED(status) && WEXITSTATUS(status) == 0);
  close(lfd);
  unlink(lpath);
  close(fd);
  printf("umap: ok\n");
  return 0;
}
