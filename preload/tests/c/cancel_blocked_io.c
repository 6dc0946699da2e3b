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

int main(int argc, char **argv) {
  static char own[1];
  byte = own;
  char *map = NULL;
  size_t len = 1 << 20;
  if (argc == 2) {
    int fd = open(argv[1], O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || ftruncate(fd, len) != 0) {
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
  if (map && munmap(map, len) != 0) {
    perror("munmap");
    return 1;
  }
  return ok ? 0 : 1;
}
