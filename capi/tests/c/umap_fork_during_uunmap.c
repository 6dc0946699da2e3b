/* A UMap program that forks while another thread's uunmap writes a region
 * back (and so holds the library's state): the child inherits that state
 * locked by a thread it does not have. Its UMap calls answer at once (a
 * getter its fallback, umap EPERM) and its exit does not wait for a call
 * that will never end. The page size is set to 8192 first, so a child
 * whose getter says 8192 forked outside the write-back: the program tries
 * again, up to 20 times.
 *
 * First, a child of a process that has made no pager makes its own and
 * writes its region back at exit.
 *
 * usage: umap_fork_during_uunmap FILE
 * exit 0: a child forked inside the write-back, and it answered and
 * exited in time; 1: an error; 3: no fork landed inside the write-back. */
#include <umap/umap.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PAGES 16384
#define PAGE 4096

static char *w;

static void *unmap(void *arg) {
  (void)arg;
  if (uunmap(w, (size_t)PAGES * PAGE) != 0) perror("uunmap");
  return NULL;
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Sets and reads a setting 20000 times; returns non-NULL if a read ever
 * saw anything but what is set, or a pair of calls took 90 ms or more (a
 * call that took the other thread for the parent's waited 100 ms). */
static void *turns(void *arg) {
  (void)arg;
  for (int i = 0; i < 20000; i++) {
    double t0 = now();
    umapcfg_set_read_ahead(7);
    if (umapcfg_get_read_ahead() != 7) return (void *)1;
    if (now() - t0 >= 0.09) return (void *)2;
  }
  return NULL;
}

int main(int argc, char **argv) {
  if (argc != 2) return 2;
  static char page[PAGE];
  memset(page, 'a', sizeof page);
  int fd = open(argv[1], O_RDWR | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return 1;
  for (int i = 0; i < PAGES; i++)
    if (write(fd, page, PAGE) != PAGE) return 1;
  umapcfg_set_umap_page_size(8192);
  /* A child of a process that has made no pager yet (a setter made the
   * library's state, nothing more) makes its own, and its exit writes its
   * region back. */
  pid_t first = fork();
  if (first < 0) return 1;
  if (first == 0) {
    alarm(10);
    char *c = umap(NULL, PAGE, PROT_READ | PROT_WRITE, UMAP_PRIVATE, fd, 0);
    if (c == UMAP_FAILED) _exit(1);
    c[5] = 'X';
    exit(0); /* without uunmap: the exit writes it back */
  }
  int st = 0;
  if (waitpid(first, &st, 0) != first || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    fprintf(stderr, "the first child: status %d\n", st);
    return 1;
  }
  char c5 = 0;
  if (pread(fd, &c5, 1, 5) != 1 || c5 != 'X') {
    fprintf(stderr, "the first child's store did not reach the file (%c)\n", c5);
    return 1;
  }
  /* A child's own threads taking turns at the library's state: neither
   * takes the other for a thread of the parent (a holder writes its tid
   * only after it locks). */
  pid_t second = fork();
  if (second < 0) return 1;
  if (second == 0) {
    alarm(20);
    pthread_t t2;
    if (pthread_create(&t2, NULL, turns, NULL) != 0) _exit(1);
    long bad = (long)turns(NULL);
    void *other = NULL;
    pthread_join(t2, &other);
    _exit(bad == 0 && other == NULL ? 0 : 1);
  }
  if (waitpid(second, &st, 0) != second || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    fprintf(stderr, "the second child: status %d\n", st);
    return 1;
  }
  for (int attempt = 0; attempt < 20; attempt++) {
    w = umap(NULL, (size_t)PAGES * PAGE, PROT_READ | PROT_WRITE, UMAP_PRIVATE, fd, 0);
    if (w == UMAP_FAILED) return 1;
    for (int i = 0; i < PAGES; i++) w[(size_t)i * PAGE] = 's';
    pthread_t t;
    if (pthread_create(&t, NULL, unmap, NULL) != 0) return 1;
    usleep(1000 + 500 * attempt);
    double t0 = now();
    pid_t child = fork();
    if (child < 0) return 1;
    if (child == 0) {
      alarm(5); /* a hang dies of SIGALRM */
      if (umapcfg_get_umap_page_size() == 8192) _exit(3); /* not inside */
      errno = 0;
      if (umap(NULL, PAGE, PROT_READ, UMAP_PRIVATE, fd, 0) != UMAP_FAILED || errno != EPERM)
        _exit(1);
      exit(0); /* runs the library's exit write-back */
    }
    int status = 0;
    if (waitpid(child, &status, 0) != child) return 1;
    double took = now() - t0;
    pthread_join(t, NULL);
    if (WIFSIGNALED(status)) {
      fprintf(stderr, "the child died of signal %d\n", WTERMSIG(status));
      return 1;
    }
    int code = WEXITSTATUS(status);
    if (code == 3) continue;
    if (code != 0) {
      fprintf(stderr, "the child exited %d\n", code);
      return 1;
    }
    printf("forked inside the write-back on attempt %d; the child took %.3f s\n", attempt, took);
    return took < 2.0 ? 0 : 1;
  }
  return 3;
}
