/* A UMap program that forks while another thread's first UMap call makes
 * the library's state (reading the UMAP_* environment). The child's own
 * UMap call answers at once (a getter its fallback) instead of waiting for
 * ever for a state that a thread it does not have was making.
 *
 * The program's own getenv, which the library's environment reads reach,
 * sleeps 300 ms on UMAP_* names while `slow` is set, so that the fork
 * lands inside that first call every time.
 *
 * exit 0: the child answered; 1: an error; 2: the child hung (SIGALRM). */
#define _GNU_SOURCE
#include <umap/umap.h>
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static volatile int slow;

char *getenv(const char *name) {
  static char *(*real)(const char *);
  if (!real) real = (char *(*)(const char *))dlsym(RTLD_NEXT, "getenv");
  if (slow && strncmp(name, "UMAP_", 5) == 0) usleep(300000);
  return real ? real(name) : NULL;
}

static void *first_call(void *arg) {
  (void)arg;
  (void)umapcfg_get_read_ahead();
  return NULL;
}

int main(void) {
  slow = 1;
  pthread_t t;
  if (pthread_create(&t, NULL, first_call, NULL) != 0) return 1;
  usleep(100000); /* the thread is in its first getenv by now */
  pid_t c = fork();
  if (c < 0) return 1;
  if (c == 0) {
    slow = 0;
    alarm(5);
    (void)umapcfg_get_read_ahead();
    _exit(0);
  }
  int st = 0;
  if (waitpid(c, &st, 0) != c) return 1;
  pthread_join(t, NULL);
  if (WIFSIGNALED(st) && WTERMSIG(st) == SIGALRM) {
    printf("the child hung\n");
    return 2;
  }
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) return 1;
  printf("the child answered\n");
  return 0;
}
