/* mprotect(PROT_WRITE) on read-only MAP_SHARED file mappings, as the
 * kernel answers it: allowed on a descriptor opened for writing (in whole
 * or in part), and the stores through the mapping reach the file;
 * EACCES on a descriptor opened read-only. The file is read back with raw
 * system calls, which no interposer sees.
 *
 * usage: mprotect_write DIR        the cases above, one line each
 *        mprotect_write DIR twice  two read-only mappings of one file
 *                                  opened for writing, then mprotect of
 *                                  the first: prints its result
 *        mprotect_write DIR raw    made writable by a raw mprotect system
 *                                  call (no interposer sees it), stored
 *                                  to, and left mapped at exit
 *        mprotect_write DIR move   made writable by the kernel (PROT_WRITE
 *                                  alone), stored to, then mremap */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#define PAGE 4096
#define PAGES 1024 /* 4 MiB: four times the test's budget */
#define LEN ((size_t)PAGES * PAGE)

static char *path(const char *dir, const char *name) {
  static char buf[4096];
  snprintf(buf, sizeof buf, "%s/%s", dir, name);
  return buf;
}

/* A file of PAGES pages of 'a', opened with `flags`. */
static int make(const char *dir, const char *name, int flags) {
  static char page[PAGE];
  memset(page, 'a', sizeof page);
  int fd = open(path(dir, name), O_RDWR | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) {
    perror("create");
    exit(1);
  }
  for (int i = 0; i < PAGES; i++) {
    if (write(fd, page, PAGE) != PAGE) {
      perror("write");
      exit(1);
    }
  }
  close(fd);
  fd = open(path(dir, name), flags);
  if (fd < 0) {
    perror("open");
    exit(1);
  }
  return fd;
}

static char *map_ro(int fd) {
  char *p = mmap(NULL, LEN, PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    perror("mmap");
    exit(1);
  }
  return p;
}

static const char *err(int rc) {
  static char buf[64];
  snprintf(buf, sizeof buf, "%d %s", rc, rc == 0 ? "ok" : strerror(errno));
  return buf;
}

/* Pages `from`..`to` of the file whose byte 7 is `tag` (raw pread). */
static int tagged(int fd, int from, int to, char tag) {
  int n = 0;
  for (int i = from; i < to; i++) {
    char c = 0;
    if (syscall(SYS_pread64, fd, &c, 1, (off_t)i * PAGE + 7) != 1) {
      perror("pread");
      exit(1);
    }
    n += c == tag;
  }
  return n;
}

/* Reads every page (through the pager, most are evicted again), then
 * makes pages `from`..`to` writable and tags them. */
static void write_through(int fd, char *p, int from, int to, char tag,
                          const char *what) {
  long sum = 0;
  for (int i = 0; i < PAGES; i++)
    sum += p[(size_t)i * PAGE];
  size_t len = (size_t)(to - from) * PAGE;
  int rc = mprotect(p + (size_t)from * PAGE, len, PROT_READ | PROT_WRITE);
  printf("%s: read %ld, mprotect %s\n", what, sum, err(rc));
  if (rc != 0)
    return;
  for (int i = from; i < to; i++)
    p[(size_t)i * PAGE + 7] = tag;
  rc = fsync(fd);
  printf("%s: fsync %s, %d of %d pages in the file\n", what, err(rc),
         tagged(fd, from, to, tag), to - from);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: mprotect_write DIR [twice]\n");
    return 2;
  }
  const char *dir = argv[1];
  if (argc == 3 && strcmp(argv[2], "twice") == 0) {
    int fd = make(dir, "twice.dat", O_RDWR);
    char *a = map_ro(fd), *b = map_ro(fd);
    printf("twice: mprotect %s\n", err(mprotect(a, LEN, PROT_READ | PROT_WRITE)));
    printf("twice: b %c\n", b[PAGE]);
    return 0;
  }

  if (argc == 3 && strcmp(argv[2], "raw") == 0) {
    int fd = make(dir, "raw.dat", O_RDWR);
    char *p = map_ro(fd);
    printf("raw: mprotect %s\n",
           err((int)syscall(SYS_mprotect, p, LEN, PROT_READ | PROT_WRITE)));
    for (int i = 0; i < PAGES; i += 3)
      p[(size_t)i * PAGE + 7] = 'r';
    return 0; /* no munmap, no msync: the exit writes it back */
  }
  if (argc == 3 && strcmp(argv[2], "move") == 0) {
    int fd = make(dir, "move.dat", O_RDWR);
    char *p = map_ro(fd);
    printf("move: mprotect %s\n", err(mprotect(p, LEN, PROT_WRITE)));
    p[5 * PAGE + 7] = 'm';
    char *q = mremap(p, LEN, LEN, MREMAP_MAYMOVE);
    printf("move: mremap %s\n", err(q == MAP_FAILED ? -1 : 0));
    if (q != MAP_FAILED)
      p = q;
    p[6 * PAGE + 7] = 'm';
    printf("move: munmap %s\n", err(munmap(p, LEN)));
    printf("move: %d of 2 pages in the file\n", tagged(fd, 5, 7, 'm'));
    return 0;
  }

  /* Opened for writing: the whole mapping, then another one in part. */
  int fd = make(dir, "rw.dat", O_RDWR);
  char *p = map_ro(fd);
  write_through(fd, p, 0, PAGES, 'w', "whole");
  printf("whole: munmap %s\n", err(munmap(p, LEN)));
  p = map_ro(fd);
  write_through(fd, p, PAGES / 4, PAGES / 2, 'x', "part");
  printf("part: rest %d of %d pages untouched\n",
         tagged(fd, PAGES / 2, PAGES, 'w'), PAGES / 2);
  printf("part: munmap %s\n", err(munmap(p, LEN)));

  /* With pkey_mprotect (no key), then fsync. */
  p = map_ro(fd);
  int rc = pkey_mprotect(p, LEN, PROT_READ | PROT_WRITE, -1);
  printf("pkey: pkey_mprotect %s\n", err(rc));
  if (rc == 0) {
    p[9 * PAGE + 7] = 'k';
    rc = fsync(fd);
    printf("pkey: fsync %s, %d of 1 in the file\n", err(rc), tagged(fd, 9, 10, 'k'));
  }
  /* A failed mprotect, and one back to read-only: the file can be mapped
   * again. */
  printf("again: unaligned %s\n", err(mprotect(p + 1, PAGE, PROT_READ | PROT_WRITE)));
  printf("again: read-only %s\n", err(mprotect(p, LEN, PROT_READ)));
  char *o = mmap(NULL, LEN, PROT_READ, MAP_SHARED, fd, 0);
  printf("again: second mapping %s\n", err(o == MAP_FAILED ? -1 : 0));
  if (o != MAP_FAILED) {
    printf("again: it reads %c\n", o[9 * PAGE + 7]);
    munmap(o, LEN);
  }
  printf("again: munmap %s\n", err(munmap(p, LEN)));
  close(fd);

  /* Opened read-only: never writable, in whole or in part. */
  fd = make(dir, "ro.dat", O_RDONLY);
  p = map_ro(fd);
  printf("read-only: whole %s\n", err(mprotect(p, LEN, PROT_READ | PROT_WRITE)));
  printf("read-only: part %s\n", err(mprotect(p, PAGE, PROT_READ | PROT_WRITE)));
  printf("read-only: still %c\n", p[PAGE]);
  printf("done\n");
  return 0;
}
