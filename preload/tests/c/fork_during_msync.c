/* Forks while another thread writes back a shared file mapping (in
 * msync), and each child writes one byte to a file and exits, as a child
 * may before it execs. Prints "children N hung H": a child that does not
 * end within 2 s is killed and counted as hung.
 *
 * usage: fork_during_msync DATA_FILE OUT_FILE CHILDREN */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

#include "util.h"

static char *map;
static size_t len;
static atomic_int stop;
/* Set while the writer thread is inside msync. */
static atomic_int syncing;

static void *dirty_and_sync(void *arg) {
    (void)arg;
    unsigned char v = 0;
    while (!atomic_load(&stop)) {
        for (size_t i = 0; i < len; i += 4096)
            map[i] = (char)v;
        v++;
        atomic_store(&syncing, 1);
        int rc = msync(map, len, MS_SYNC);
        atomic_store(&syncing, 0);
        if (rc != 0) {
            perror("msync");
            exit(1);
        }
    }
    return NULL;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s DATA_FILE OUT_FILE CHILDREN\n", argv[0]);
        return 2;
    }
    int fd = open(argv[1], O_RDWR);
    int out = open(argv[2], O_WRONLY | O_CREAT | O_APPEND, 0644);
    struct stat st;
    if (fd < 0 || out < 0 || fstat(fd, &st) != 0) {
        perror("open");
        return 1;
    }
    len = (size_t)st.st_size;
    map = map_or_exit(len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0, "mmap");
    pthread_t t;
    pthread_create(&t, NULL, dirty_and_sync, NULL);
    int children = atoi(argv[3]), hung = 0;
    for (int k = 0; k < children; k++) {
        /* Fork while the write-back runs (it has had 0.2 ms to start). */
        while (!atomic_load(&syncing))
            ;
        usleep(200);
        pid_t pid = fork();
        if (pid == 0) {
            if (write(out, "x", 1) != 1)
                _exit(3);
            _exit(0);
        }
        double deadline = now() + 2;
        int status;
        while (waitpid(pid, &status, WNOHANG) == 0) {
            if (now() > deadline) {
                kill(pid, SIGKILL);
                waitpid(pid, &status, 0);
                hung++;
                break;
            }
            usleep(1000);
        }
    }
    atomic_store(&stop, 1);
    pthread_join(t, NULL);
    printf("children %d hung %d\n", children, hung);
    return 0;
}
