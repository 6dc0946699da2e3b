/* A program with an allocator of its own that maps and unmaps memory
 * while it holds its lock (as arena allocators do), beside a thread whose
 * calls the shim serves (msync, mmap and munmap of a paged file), where
 * the shim allocates under the lock of its table. The shim took its
 * table's lock for every anonymous mmap and for munmap of any memory, so
 * one thread in the allocator waited for the table and the other, in the
 * shim, for the allocator: the program hung (killed here by its alarm).
 * Its mprotect(PROT_WRITE) while a file is paged read /proc/self/maps
 * under the table's lock into memory it allocated: the allocator's own
 * thread then waited for itself.
 *
 * usage: own_allocator FILE */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdint.h>

#include "util.h"

/* The allocator: a header of 16 bytes before each block. `info` is 0 for
 * a block cut from a chunk (never given back), 1 for a block mapped on
 * its own (unmapped by free), else the block an aligned one sits in. */
struct hdr {
  size_t size;
  uintptr_t info;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static char *cur;
static size_t left;

#define CHUNK (64 << 10)
#define BIG (32 << 10)

/* Mapped inaccessible, then made read-write, as allocators and JITs that
 * guard their memory do. */
static void *map_locked(size_t len) {
  void *p = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    return NULL;
  if (mprotect(p, len, PROT_READ | PROT_WRITE) != 0) {
    munmap(p, len);
    return NULL;
  }
  return p;
}

void *malloc(size_t n) {
  size_t need = (n + sizeof(struct hdr) + 15) & ~(size_t)15;
  struct hdr *h;
  pthread_mutex_lock(&lock);
  if (n >= BIG) {
    h = map_locked(need);
    if (h != NULL)
      h->info = 1;
  } else {
    if (left < need) {
      cur = map_locked(CHUNK);
      left = cur == NULL ? 0 : CHUNK;
    }
    h = NULL;
    if (left >= need) {
      h = (struct hdr *)cur;
      cur += need;
      left -= need;
      h->info = 0;
    }
  }
  pthread_mutex_unlock(&lock);
  if (h == NULL) {
    errno = ENOMEM;
    return NULL;
  }
  h->size = n;
  return h + 1;
}

void free(void *p) {
  if (p == NULL)
    return;
  struct hdr *h = (struct hdr *)p - 1;
  if (h->info == 1) {
    size_t len = (h->size + sizeof(struct hdr) + 15) & ~(size_t)15;
    pthread_mutex_lock(&lock);
    madvise(h, len, MADV_DONTNEED);
    munmap(h, len);
    pthread_mutex_unlock(&lock);
  } else if (h->info > 1) {
    free((void *)h->info);
  }
}

void *calloc(size_t k, size_t n) {
  if (n != 0 && k > SIZE_MAX / n) {
    errno = ENOMEM;
    return NULL;
  }
  void *p = malloc(k * n);
  if (p != NULL)
    memset(p, 0, k * n);
  return p;
}

size_t malloc_usable_size(void *p) { return p == NULL ? 0 : ((struct hdr *)p - 1)->size; }

void *realloc(void *p, size_t n) {
  void *q = malloc(n);
  if (q != NULL && p != NULL) {
    size_t old = malloc_usable_size(p);
    memcpy(q, p, old < n ? old : n);
    free(p);
  }
  return q;
}

void *memalign(size_t align, size_t n) {
  if (align <= 16)
    return malloc(n);
  char *outer = malloc(n + align + sizeof(struct hdr));
  if (outer == NULL)
    return NULL;
  uintptr_t a = ((uintptr_t)outer + sizeof(struct hdr) + align - 1) & ~(uintptr_t)(align - 1);
  struct hdr *h = (struct hdr *)a - 1;
  h->size = n;
  h->info = (uintptr_t)outer;
  return (void *)a;
}

int posix_memalign(void **out, size_t align, size_t n) {
  void *p = memalign(align, n);
  if (p == NULL)
    return ENOMEM;
  *out = p;
  return 0;
}

void *aligned_alloc(size_t align, size_t n) { return memalign(align, n); }
void *valloc(size_t n) { return memalign(PAGE, n); }

#define ROUNDS 3000

static const char *path;

/* The allocator's thread: blocks mapped and unmapped under its lock. */
static void *allocating(void *arg) {
  (void)arg;
  for (int i = 0; i < ROUNDS * 4; i++) {
    char *p = malloc(BIG + (i % 7) * PAGE);
    if (p == NULL)
      exit(1);
    p[0] = (char)i;
    free(p);
    free(malloc(100 + i % 900));
  }
  return NULL;
}

int main(int argc, char **argv) {
  usage(argc, 1, "own_allocator FILE");
  path = argv[1];
  alarm(60);
  int fd = create_filled(path, 'a', 16 * PAGE);
  pthread_t t;
  if (pthread_create(&t, NULL, allocating, NULL) != 0)
    return 1;
  /* The shim's thread: calls it serves on the paged file. */
  for (int i = 0; i < ROUNDS; i++) {
    char *p = map_or_exit(16 * PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0, "mmap");
    p[(i % 16) * PAGE] = 'b';
    if (msync(p, 16 * PAGE, MS_ASYNC) != 0 || munmap(p, 16 * PAGE) != 0) {
      perror("msync or munmap");
      return 1;
    }
  }
  pthread_join(t, NULL);
  printf("done\n");
  return 0;
}
