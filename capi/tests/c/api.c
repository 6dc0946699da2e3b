/* The C API with real faults: 4 threads over a file 4x the budget, writes,
 * flush, data checked through read(2); errors as negative errno. */
#include <uffd_pager.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

#define PAGE 4096
#define BUDGET_PAGES 64
#define FILE_PAGES (4 * BUDGET_PAGES)
#define THREADS 4
#define ROUNDS 20
#define ADVISED_PAGES 1024

static unsigned char *base;
static int failures;


static void *worker(void *arg) {
  long t = (long)arg;
  for (int r = 0; r < ROUNDS; r++)
    for (long p = t; p < FILE_PAGES; p += THREADS) {
      unsigned char *pg = base + p * PAGE;
      unsigned char want = (unsigned char)(p + r);
      if (pg[100] != want) __atomic_add_fetch(&failures, 1, __ATOMIC_RELAXED);
      pg[100] = (unsigned char)(want + 1); /* next round's value */
    }
  return NULL;
}

static int read_ctx_calls;
static int numbered_read(void *ctx, uint64_t off, void *buf, size_t len) {
  (void)ctx;
  __atomic_add_fetch(&read_ctx_calls, 1, __ATOMIC_RELAXED);
  memset(buf, (int)(off / PAGE) & 0xff, len);
  return 0;
}

static int released;
static void count_release(void *ctx) {
  (void)ctx;
  __atomic_add_fetch(&released, 1, __ATOMIC_RELAXED);
}

int main(int argc, char **argv) {
  CHECK(argc == 2);
  const char *path = argv[1];
  int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
  CHECK(fd >= 0);
  static unsigned char page[PAGE];
  for (int p = 0; p < FILE_PAGES; p++) {
    memset(page, 0, PAGE);
    page[100] = (unsigned char)p;
    CHECK(pwrite(fd, page, PAGE, (off_t)p * PAGE) == PAGE);
  }

  /* The library loaded has the header's ABI (its SONAME says so too). */
  CHECK(uffd_pager_abi_version() == UFFD_PAGER_ABI_VERSION);

  /* Errors: negative errno and a message; never a crash. */
  uffd_pager_config cfg;
  CHECK(uffd_pager_config_init(&cfg, sizeof cfg) == 0);
  cfg.policy = 99;
  uffd_pager *p = NULL;
  CHECK(uffd_pager_new(&cfg, &p) == -EINVAL && p == NULL);
  CHECK(strstr(uffd_pager_last_error(), "policy") != NULL);
  CHECK(uffd_pager_new(NULL, NULL) == -EINVAL);
  /* A config not made by _init has no size: refused, not misread. */
  uffd_pager_config zeroed = {0};
  CHECK(uffd_pager_new(&zeroed, &p) == -EINVAL && p == NULL);
  CHECK(strstr(uffd_pager_last_error(), "_init") != NULL);
  /* One from a newer header (larger): taken while what this library does
   * not know is zero, refused while any of it is set. */
  struct {
    uffd_pager_config c;
    uint64_t newer;
  } big;
  CHECK(uffd_pager_config_init(&big.c, sizeof big) == 0 && big.newer == 0);
  big.c.budget_bytes = BUDGET_PAGES * PAGE;
  CHECK(uffd_pager_new(&big.c, &p) == 0 && p != NULL);
  uffd_pager_free(p);
  p = NULL;
  big.newer = 1;
  CHECK(uffd_pager_new(&big.c, &p) == -E2BIG && p == NULL);

  CHECK(uffd_pager_config_init(&cfg, sizeof cfg) == 0);
  cfg.budget_bytes = BUDGET_PAGES * PAGE;
  cfg.policy = UFFD_PAGER_POLICY_RETRY_ONCE;
  CHECK(uffd_pager_new(&cfg, &p) == 0 && p != NULL);

  uffd_pager_region *bad = NULL;
  CHECK(uffd_pager_map_file(p, "/nonexistent/file", 0, NULL, &bad) == -ENOENT);
  CHECK(bad == NULL && strlen(uffd_pager_last_error()) > 0);
  CHECK(uffd_pager_map_anonymous(p, 100, &bad) == -EINVAL);
  CHECK(uffd_pager_region_flush(NULL) == -EINVAL);
  /* A descriptor opened read-only, mapped writable (the default): EACCES,
   * as mmap answers (it was EBADF, which says the number is bad). */
  int ro = open(path, O_RDONLY);
  CHECK(ro >= 0);
  CHECK(uffd_pager_map_fd(p, ro, 0, PAGE, NULL, &bad) == -EACCES && bad == NULL);
  CHECK(strstr(uffd_pager_last_error(), "reading and writing") != NULL);
  close(ro);
  /* One opened for appending: EACCES too, as mmap answers (a write-back
   * through it would append). */
  int ap = open(path, O_RDWR | O_APPEND);
  CHECK(ap >= 0);
  CHECK(uffd_pager_map_fd(p, ap, 0, PAGE, NULL, &bad) == -EACCES && bad == NULL);
  close(ap);
  /* An empty length is refused before the file is opened again: that
     open's close dropped the caller's record lock (a child sees it). */
  {
    struct flock lk = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = PAGE};
    CHECK(fcntl(fd, F_SETLK, &lk) == 0);
    CHECK(uffd_pager_map_fd(p, fd, 0, 0, NULL, &bad) == -EINVAL && bad == NULL);
    pid_t c = fork();
    CHECK(c >= 0);
    if (c == 0) {
      struct flock q = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = PAGE};
      _exit(fcntl(fd, F_GETLK, &q) == 0 && q.l_type == F_WRLCK ? 0 : 1);
    }
    int cst = 0;
    CHECK(waitpid(c, &cst, 0) == c && WIFEXITED(cst) && WEXITSTATUS(cst) == 0);
    lk.l_type = F_UNLCK;
    CHECK(fcntl(fd, F_SETLK, &lk) == 0);
  }
  /* Set to append after the map (the open file the caller keeps): the
   * store writes through one of its own, in place (it appended before). */
  {
    int rw = open(path, O_RDWR);
    CHECK(rw >= 0);
    struct stat before;
    CHECK(fstat(rw, &before) == 0);
    uffd_pager_region *fr = NULL;
    CHECK(uffd_pager_map_fd(p, rw, 0, PAGE, NULL, &fr) == 0);
    CHECK(fcntl(rw, F_SETFL, O_APPEND) == 0);
    volatile unsigned char *b = uffd_pager_region_addr(fr);
    b[0] = b[0];
    CHECK(uffd_pager_region_flush(fr) == 0);
    struct stat after;
    CHECK(fstat(rw, &after) == 0 && after.st_size == before.st_size);
    CHECK(uffd_pager_region_unmap(fr) == 0);
    close(rw);
  }

  uffd_pager_region *r = NULL;
  CHECK(uffd_pager_map_file(p, path, 0, NULL, &r) == 0);
  CHECK(uffd_pager_region_len(r) == FILE_PAGES * PAGE);
  base = uffd_pager_region_addr(r);

  pthread_t th[THREADS];
  for (long t = 0; t < THREADS; t++) CHECK(pthread_create(&th[t], NULL, worker, (void *)t) == 0);
  for (int t = 0; t < THREADS; t++) pthread_join(th[t], NULL);
  CHECK(failures == 0);
  CHECK(uffd_pager_region_flush(r) == 0);
  for (int p2 = 0; p2 < FILE_PAGES; p2++) {
    CHECK(pread(fd, page, PAGE, (off_t)p2 * PAGE) == PAGE);
    CHECK(page[100] == (unsigned char)(p2 + ROUNDS));
  }

  /* write(2) behind the pager's back, then refresh: never stale. */
  CHECK(base[5 * PAGE + 100] == (unsigned char)(5 + ROUNDS));
  unsigned char nine = 9;
  CHECK(uffd_pager_region_flush_range(r, 5 * PAGE + 100, 1) == 0);
  CHECK(pwrite(fd, &nine, 1, 5 * PAGE + 100) == 1);
  CHECK(uffd_pager_region_refresh(r, 5 * PAGE + 100, 1) == 0);
  CHECK(base[5 * PAGE + 100] == 9);

  /* MADV_DONTNEED's rule: an unaligned start is refused, and drops nothing. */
  CHECK(uffd_pager_region_dontneed(r, 5 * PAGE + 100, 1) == -EINVAL);
  CHECK(base[5 * PAGE + 100] == 9);
  CHECK(uffd_pager_region_dontneed(r, 5 * PAGE, PAGE) == 0);
  CHECK(base[5 * PAGE + 100] == 9); /* a shared region's page stays cached */
  /* ... also for an empty range (it was let through), as madvise. */
  CHECK(uffd_pager_region_dontneed(r, 5 * PAGE + 100, 0) == -EINVAL);
  CHECK(uffd_pager_region_dontneed(r, 5 * PAGE, 0) == 0);

  /* A caller without the prototype (dlsym, a foreign-function interface)
     passes an int: neither 0 nor 1 is refused, not read as a bool. */
  int (*protect_int)(const struct uffd_pager_region *, int) =
      (int (*)(const struct uffd_pager_region *, int))(void (*)(void))uffd_pager_region_protect;
  CHECK(protect_int(r, 2) == -EINVAL);
  CHECK(strstr(uffd_pager_last_error(), "0 (false) or 1 (true)") != NULL);
  CHECK(uffd_pager_region_protect(r, true) == 0);

  uffd_pager_stats st;
  CHECK(uffd_pager_stats_get(p, &st, sizeof st) == (int)sizeof st);
  CHECK(st.pgfault >= FILE_PAGES && st.pgsteal > 0 && st.writeback > 0);
  CHECK(st.budget_pages == BUDGET_PAGES);
  CHECK(st.peak_resident_pages <= BUDGET_PAGES + 64);
  long n = uffd_pager_stats_vmstat(p, NULL, 0);
  CHECK(n > 0);
  char *text = malloc((size_t)n + 1);
  CHECK(uffd_pager_stats_vmstat(p, text, (size_t)n + 1) == n);
  CHECK(strstr(text, "pgfault ") != NULL && strstr(text, "budget_pages 64\n") != NULL);
  char small[8];
  CHECK(uffd_pager_stats_vmstat(p, small, sizeof small) == n && strlen(small) == 7);
  free(text);
  CHECK(uffd_pager_region_unmap(r) == 0);

  /* A window of the file from page 4 (map_fd at an offset): flush_range
     and refresh take offsets in the file, as the write(2) behind the
     pager's back names them (they took them as offsets in the window:
     the flush wrote nothing and the refresh refreshed nothing). */
  {
    uffd_pager_region *w = NULL;
    CHECK(uffd_pager_map_fd(p, fd, 4 * PAGE, 2 * PAGE, NULL, &w) == 0);
    volatile unsigned char *wb = uffd_pager_region_addr(w);
    CHECK(wb[PAGE + 100] == 9); /* file page 5, written above */
    wb[100] = 0x77;             /* file page 4 */
    CHECK(uffd_pager_region_flush_range(w, 4 * PAGE + 100, 1) == 0);
    unsigned char got = 0;
    CHECK(pread(fd, &got, 1, 4 * PAGE + 100) == 1 && got == 0x77);
    unsigned char six = 6;
    CHECK(pwrite(fd, &six, 1, 5 * PAGE + 100) == 1);
    CHECK(uffd_pager_region_refresh(w, 5 * PAGE + 100, 1) == 0);
    CHECK(wb[PAGE + 100] == 6);
    /* A range before the window is none of the region's. */
    CHECK(uffd_pager_region_refresh(w, 0, 4 * PAGE) == 0);
    CHECK(uffd_pager_region_flush_range(w, 0, 4 * PAGE) == 0);
    CHECK(uffd_pager_region_unmap(w) == 0);
  }

  /* A store of C callbacks. */
  uffd_pager_store s = {0};
  s.len = 16 * PAGE;
  s.read = numbered_read;
  uffd_pager_map_options o;
  CHECK(uffd_pager_map_options_init(&o, sizeof o) == 0);
  o.writable = false;
  /* Every struct says its size: a store without one is refused. */
  CHECK(uffd_pager_map_store(p, &s, 16 * PAGE, &o, &r) == -EINVAL);
  CHECK(strstr(uffd_pager_last_error(), "uffd_pager_store") != NULL);
  CHECK(uffd_pager_store_init(&s, sizeof s) == 0 && s.size == sizeof s);
  s.len = 16 * PAGE;
  s.read = numbered_read;
  /* On a failure `release` is never called, whatever failed (before, a
   * bad signal_safe byte left ctx the caller's and a bad length freed it,
   * both -EINVAL); on success, once, when the store is let go (below). */
  s.release = count_release;
  s.len = PAGE + 1;
  CHECK(uffd_pager_map_store(p, &s, 16 * PAGE, &o, &r) == -EINVAL);
  s.len = 16 * PAGE;
  CHECK(uffd_pager_map_store(p, &s, 16 * PAGE, &o, NULL) == -EINVAL);
  CHECK(uffd_pager_map_store(p, &s, 3, &o, &r) == -EINVAL);
  CHECK(released == 0);
  s.release = NULL;
  CHECK(uffd_pager_map_store(p, &s, 16 * PAGE, &o, &r) == 0);
  unsigned char *m = uffd_pager_region_addr(r);
  CHECK(m[7 * PAGE + 1] == 7 && m[15 * PAGE] == 15 && read_ctx_calls >= 2);
  CHECK(uffd_pager_region_unmap(r) == 0);

  /* Access advice (a pager of its own, so that no readahead of the
   * regions above is counted): advised random, a region read in order
   * reads nothing ahead; advised normal again, it does. */
  uffd_pager *q = NULL;
  CHECK(uffd_pager_config_init(&cfg, sizeof cfg) == 0);
  CHECK(uffd_pager_new(&cfg, &q) == 0);
  s.len = 2 * ADVISED_PAGES * PAGE;
  s.release = count_release;
  CHECK(uffd_pager_map_store(q, &s, 2 * ADVISED_PAGES * PAGE, &o, &r) == 0);
  CHECK(released == 0);
  CHECK(uffd_pager_region_advise(r, 7) == -EINVAL);
  CHECK(strstr(uffd_pager_last_error(), "advice") != NULL);
  CHECK(uffd_pager_region_advise(NULL, UFFD_PAGER_ACCESS_RANDOM) == -EINVAL);
  CHECK(uffd_pager_region_advise(r, UFFD_PAGER_ACCESS_RANDOM) == 0);
  m = uffd_pager_region_addr(r);
  for (int i = 0; i < ADVISED_PAGES; i++) CHECK(m[i * PAGE + 3] == (unsigned char)i);
  CHECK(uffd_pager_stats_get(q, &st, sizeof st) == (int)sizeof st);
  CHECK(st.readahead_pages == 0);
  CHECK(uffd_pager_region_advise(r, UFFD_PAGER_ACCESS_NORMAL) == 0);
  for (int i = ADVISED_PAGES; i < 2 * ADVISED_PAGES; i++)
    CHECK(m[i * PAGE + 3] == (unsigned char)i);
  CHECK(uffd_pager_stats_get(q, &st, sizeof st) == (int)sizeof st);
  CHECK(st.readahead_pages > 0);
  CHECK(uffd_pager_region_unmap(r) == 0);
  uffd_pager_free(q);
  CHECK(released == 1);

  /* Anonymous memory larger than the budget. */
  CHECK(uffd_pager_map_anonymous(p, FILE_PAGES * PAGE, &r) == 0);
  m = uffd_pager_region_addr(r);
  for (int i = 0; i < FILE_PAGES; i++) m[i * PAGE] = (unsigned char)(i * 3);
  for (int i = 0; i < FILE_PAGES; i++) CHECK(m[i * PAGE] == (unsigned char)(i * 3));
  /* A residency guard: a system call into a guarded range succeeds with
   * in-thread delivery (the kernel does not deliver a fault inside it),
   * whatever reclaim does meanwhile; a range over the budget is refused. */
  uffd_pager_resident *g = NULL;
  CHECK(uffd_pager_region_lock_resident(r, 0, (BUDGET_PAGES + 1) * PAGE, &g) == -ENOMEM);
  CHECK(uffd_pager_region_lock_resident(r, 0, PAGE, NULL) == -EINVAL);
  CHECK(uffd_pager_region_lock_resident(r, 8 * PAGE, 4 * PAGE, &g) == 0 && g != NULL);
  CHECK(pread(fd, m + 8 * PAGE, 4 * PAGE, 5 * PAGE) == 4 * PAGE);
  CHECK(pread(fd, page, PAGE, 8 * PAGE) == PAGE);
  CHECK(memcmp(m + 11 * PAGE, page, PAGE) == 0);
  uffd_pager_resident_free(g);
  uffd_pager_resident_free(NULL);
  CHECK(uffd_pager_region_unmap(r) == 0);
  uffd_pager_free(p);
  close(fd);
  unlink(path);
  printf("c api: ok\n");
  return 0;
}
