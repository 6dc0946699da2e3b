/* A thread blocked in read, readv, write or writev on a pipe takes a
 * pthread_cancel, as under libc alone: POSIX makes these calls
 * cancellation points. The shim passed them on as raw system calls, which
 * are not, and the join waited for ever.
 *
 * With FILE (paged by the shim), the read's buffer is in a shared mapping
 * of it: the shim keeps the buffer resident for the call (a residency
 * guard), and the cancelled thread's unwinding must give the guard back,
 * or the munmap after would wait for it.
 *
 * usage: cancel_blocked_io [FILE]
 * Prints `NAME cancelled` for each call; exits 1 if one is not cancelled
 * within 5 s. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

static int fds[2];
static char *byte;
static char big[1 << 16];

static void *do_read(void *a) { (void)a; read(fds[0], byte, 1); return NULL; }
static void *do_readv(void *a) {
  (void)a;
  struct iovec v = {byte, 1};
  readv(fds[0], &v, 1);
  return NULL;
}
static void *do_write(void *a) { (void)a; write(fds[1], big, sizeof big); return NULL; }
static void *do_writev(void *a) {
  (void)a;
  struct iovec v = {big, sizeof big};
  writev(fds[1], &v, 1);
  return NULL;
}

/* Fills the pipe, so that a write blocks. */
static int fill(void) {
  int fl = fcntl(fds[1], F_GETFL);
  if (fcntl(fds[1], F_SETFL, fl | O_NONBLOCK) != 0) return -1;
  while (write(fds[1], big, sizeof big) > 0) {}
  if (errno != EAGAIN) return -1;
  return fcntl(fds[1], F_SETFL, fl);
}

static int cancelled(const char *name, void *(*f)(void *), int full) {
  if (pipe(fds) != 0 || (full && fill() != 0)) {
    perror("pipe");
    return 0;
  }
  pthread_t t;
  if (pthread_create(&t, NULL, f, NULL) != 0) return 0;
  usleep(100 * 1000); /* in the call, blocked */
  pthread_cancel(t);
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += 5;
  void *res = NULL;
  int rc = pthread_timedjoin_np(t, &res, &until);
  if (rc != 0 || res != PTHREAD_CANCELED) {
    printf("%s not cancelled (%s)\n", name, rc ? strerror(rc) : "returned");
    return 0;
  }
  printf("%s cancelled\n", name);
  close(fds[0]);
  close(fds[1]);
  return 1;
}

static char *paged;

/* With a cancel already pending: a load from an untouched paged page (the
 * engine reads it from the file in this thread, under in-thread delivery)
 * and a read(2) into another (the shim's residency guard faults it in
 * first). The engine's own reads must not act on the cancel; the thread is
 * cancelled at the program's read, or at pthread_testcancel after the
 * load. */
static void *pending_load(void *a) {
  (void)a;
  pthread_cancel(pthread_self());
  volatile char c = paged[8 * 4096 + 5];
  if (c != 'p') return (void *)1;
  pthread_testcancel();
  return NULL;
}
static void *pending_read(void *a) {
  (void)a;
  pthread_cancel(pthread_self());
  read(fds[0], paged + 12 * 4096, 1);
  return NULL;
}

static int cancelled_pending(const char *name, void *(*f)(void *)) {
  if (pipe(fds) != 0) return 0;
  pthread_t t;
  void *res = NULL;
  if (pthread_create(&t, NULL, f, NULL) != 0 || pthread_join(t, &res) != 0) return 0;
  close(fds[0]);
  close(fds[1]);
  if (res != PTHREAD_CANCELED) {
    printf("%s not cancelled\n", name);
    return 0;
  }
  printf("%s cancelled\n", name);
  return 1;
}

int main(int argc, char **argv) {
  static char own[1];
  byte = own;
  char *map = NULL;
  size_t len = 1 << 20;
  if (argc == 2) {
    int fd = open(argv[1], O_RDWR | O_CREAT | O_TRUNC, 0644);
    static char fill[1 << 20];
    memset(fill, 'p', sizeof fill);
    if (fd < 0 || write(fd, fill, sizeof fill) != (ssize_t)sizeof fill) {
      perror("file");
      return 1;
    }
    map = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
      perror("mmap");
      return 1;
    }
    byte = map + 4096;
  }
  int ok = cancelled("read", do_read, 0) & cancelled("readv", do_readv, 0) &
           cancelled("write", do_write, 1) & cancelled("writev", do_writev, 1);
  if (map) {
    paged = map;
    ok &= cancelled_pending("pending load", pending_load) &
          cancelled_pending("pending read", pending_read);
  }
  if (map && munmap(map, len) != 0) {
    perror("munmap");
    return 1;
  }
  return ok ? 0 : 1;
}
