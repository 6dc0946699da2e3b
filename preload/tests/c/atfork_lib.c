/* A shared library whose constructor registers a fork child handler: it
 * is initialised before the shim (an LD_PRELOAD library's constructor runs
 * after those of the program's own libraries), so its handler runs in the
 * child before the shim's. The handler maps 32 MiB of anonymous memory,
 * over the pager's threshold, and uses it, then writes a byte with
 * pwrite(2) to the file the program set; the program reports what it
 * found (atfork_first.c). Built with -shared -fPIC. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#define LEN (32 << 20)

/* What the child handler found: -1 not run, 0 the memory held what was
 * stored, 1 the mapping failed, 2 it read back wrong. */
int atfork_lib_result = -1;
/* The file the handler writes 'Z' to at offset 0 (-1: none), and whether
 * the write was made (1) or failed (0). */
int atfork_lib_fd = -1;
int atfork_lib_wrote = -1;

static void child(void) {
  if (atfork_lib_fd >= 0)
    atfork_lib_wrote = pwrite(atfork_lib_fd, "Z", 1, 0) == 1;
  char *p = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    atfork_lib_result = 1;
    return;
  }
  for (long i = 0; i < LEN; i += 4096)
    p[i] = (char)(i >> 12);
  int ok = 1;
  for (long i = 0; i < LEN; i += 4096)
    ok &= p[i] == (char)(i >> 12);
  atfork_lib_result = ok ? 0 : 2;
  munmap(p, LEN);
}

__attribute__((constructor)) static void init(void) { pthread_atfork(NULL, NULL, child); }
