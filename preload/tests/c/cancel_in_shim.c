/* A cancel pending while the shim works: a thread with a cancel on its
 * way maps the paged file and unmaps it, then reaches a cancellation
 * point of its own. mmap and munmap are not cancellation points under
 * the kernel alone, so the thread is cancelled at that point. The shim
 * opens and closes descriptors of its own meanwhile (its store's for the
 * file, /proc files), which glibc makes cancellation points: the cancel
 * acted there, and its unwind reached the shim's panic guard as a
 * foreign exception, which aborted the process.
 *
 * usage: cancel_in_shim FILE */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>

#include "util.h"

static atomic_int go;
static int fd;

static void *thread(void *arg) {
  (void)arg;
  while (!atomic_load(&go))
    ;
  /* A cancel is pending now. */
  char *p = mmap(NULL, 4 * PAGE, PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED)
    return "mmap failed";
  volatile char c = p[0];
  (void)c;
  if (munmap(p, 4 * PAGE) != 0)
    return "munmap failed";
  pthread_testcancel();
  return "not cancelled";
}

int main(int argc, char **argv) {
  usage(argc, 1, "cancel_in_shim FILE");
  fd = create_filled(argv[1], 'a', 4 * PAGE);
  pthread_t t;
  if (pthread_create(&t, NULL, thread, NULL) != 0)
    return 1;
  pthread_cancel(t);
  atomic_store(&go, 1);
  void *r;
  pthread_join(t, &r);
  printf("%s\n", r == PTHREAD_CANCELED ? "cancelled at its own cancellation point" : (char *)r);
  return 0;
}
