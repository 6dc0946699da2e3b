/* A SIGALRM handler that write(2)s to a log file (write is
 * async-signal-safe) every 100 us, while the program maps, stores to,
 * pwrite(2)s, msyncs and unmaps a shared mapping of FILE over and over:
 * under the shim each of those takes the shim's table lock, and the
 * handler's write looks the log file up in that table. A handler that
 * interrupts the shim's own work on the same thread must not wait for
 * the lock that work holds (a hang), nor fail. Prints the handler's
 * writes that failed and whether the log holds one byte per write.
 *
 * usage: signal_write FILE */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>

#include "util.h"

#define PAGES 16

static int log_fd = -1;
static volatile sig_atomic_t writes, failed;

static void on_alarm(int sig) {
  (void)sig;
  int e = errno;
  if (write(log_fd, "x", 1) == 1)
    writes++;
  else
    failed++;
  errno = e;
}

int main(int argc, char **argv) {
  usage(argc, 1, "signal_write FILE");
  static char buf[PAGES * PAGE];
  memset(buf, 'a', sizeof buf);
  int fd = create_with(argv[1], 0, buf, sizeof buf);
  char log_path[4096];
  snprintf(log_path, sizeof log_path, "%s.log", argv[1]);
  log_fd = open(log_path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND, 0644);
  if (log_fd < 0) {
    perror("open log");
    return 1;
  }
  struct sigaction sa = {0};
  sa.sa_handler = on_alarm;
  sa.sa_flags = SA_RESTART;
  sigaction(SIGALRM, &sa, NULL);
  struct itimerval it = {{0, 100}, {0, 100}};
  setitimer(ITIMER_REAL, &it, NULL);
  struct timespec t0, t;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  int rounds = 0;
  do {
    char *p = map_or_exit(sizeof buf, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0, "mmap");
    p[(rounds % PAGES) * PAGE] = 'b';
    char c = 'c';
    if (pwrite(fd, &c, 1, ((rounds + 1) % PAGES) * PAGE + 1) != 1) {
      perror("pwrite");
      return 1;
    }
    if (p[((rounds + 1) % PAGES) * PAGE + 1] != 'c') {
      printf("round %d: the mapping does not show the pwrite\n", rounds);
      return 1;
    }
    msync_or_exit(p, sizeof buf);
    munmap(p, sizeof buf);
    rounds++;
    clock_gettime(CLOCK_MONOTONIC, &t);
  } while ((t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) < 1500000000L);
  struct itimerval off = {{0, 0}, {0, 0}};
  setitimer(ITIMER_REAL, &off, NULL);
  struct stat st;
  fstat(log_fd, &st);
  printf("failed writes %d; log holds every write: %s; many writes: %s\n", (int)failed,
         st.st_size == writes ? "yes" : "no", writes > 100 ? "yes" : "no");
  return 0;
}
