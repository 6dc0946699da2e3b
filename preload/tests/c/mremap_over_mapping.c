/* mremap(MREMAP_MAYMOVE | MREMAP_FIXED) of a file mapping onto another
 * mapping: the kernel unmaps what is at the target and moves there. Onto
 * all of a read-only mapping of the same file; onto half of a writable
 * mapping of another file, whose stores in the half that goes and in the
 * half that stays reach that file; and a growing move onto a mapping.
 *
 * usage: mremap_over_mapping FILE1 FILE2 */
#define _GNU_SOURCE
#include <errno.h>
#include <sys/syscall.h>

#include "util.h"

#define PAGES 16
#define LEN (4 * PAGE)
#define RW (PROT_READ | PROT_WRITE)
#define FIX (MREMAP_MAYMOVE | MREMAP_FIXED)

/* Page i of the file holds 'a' + i. */
static int create(const char *path) {
  static char buf[PAGES * PAGE];
  for (int i = 0; i < PAGES * PAGE; i++)
    buf[i] = 'a' + i / PAGE;
  return create_with(path, 0, buf, sizeof buf);
}

/* A mapping of `fd` at `off` and one at eight pages into a free range of
 * 32 pages (so that a move onto it or around it is not a move onto the
 * first one): the second is returned, the first put in `*first`. */
static char *two(char **first, int prot, int fd1, off_t off1, int fd2, off_t off2) {
  char *free = map_or_exit(32 * PAGE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0, "reserve");
  *first = map_or_exit(LEN, prot, MAP_SHARED, fd1, off1, "mmap");
  munmap(free, 32 * PAGE);
  char *o = mmap(free + 8 * PAGE, LEN, prot, MAP_SHARED | MAP_FIXED_NOREPLACE, fd2, off2);
  if (o != free + 8 * PAGE) {
    perror("mmap at");
    exit(1);
  }
  return o;
}

static char *move(const char *what, char *p, size_t new_len, char *to) {
  char *q = mremap(p, LEN, new_len, FIX, to);
  printf("%s: %s\n", what, q == MAP_FAILED ? strerror(errno) : q == to ? "moved" : "elsewhere");
  return q;
}

static void file_at(int fd, const char *what, off_t off) {
  char c = 0;
  if (syscall(SYS_pread64, fd, &c, 1, off) != 1) {
    perror("pread");
    exit(1);
  }
  printf("%s: %c\n", what, c);
}

int main(int argc, char **argv) {
  usage(argc, 2, "mremap_over_mapping FILE1 FILE2");
  int f1 = create(argv[1]), f2 = create(argv[2]);

  char *p;
  char *o = two(&p, PROT_READ, f1, 0, f1, 8 * PAGE);
  char *q = move("onto all of another mapping of the file", p, LEN, o);
  if (q != MAP_FAILED) {
    printf("it reads %c %c\n", q[0], q[3 * PAGE]);
    munmap(q, LEN);
  } else {
    munmap(p, LEN);
    munmap(o, LEN);
  }

  o = two(&p, RW, f1, 0, f2, 0);
  p[0] = 'P';
  o[PAGE] = 'S';     /* in the half that stays */
  o[2 * PAGE] = 'T'; /* in the half the move replaces */
  q = move("onto half of a writable mapping", p, LEN, o + 2 * PAGE);
  if (q != MAP_FAILED) {
    printf("it reads %c %c, the other half %c %c\n", q[0], q[2 * PAGE], o[0], o[PAGE]);
    q[PAGE] = 'Q';
    o[0] = 'R';
    munmap(o, 2 * PAGE);
    munmap(q, LEN);
  } else {
    munmap(p, LEN);
    munmap(o, LEN);
  }
  file_at(f1, "file 1 page 0", 0);
  file_at(f1, "file 1 page 1", PAGE);
  file_at(f2, "file 2 page 0", 0);
  file_at(f2, "file 2 page 1", PAGE);
  file_at(f2, "file 2 page 2", 2 * PAGE);

  o = two(&p, PROT_READ, f1, 0, f1, 8 * PAGE);
  q = move("growing onto another mapping", p, 2 * LEN, o);
  if (q == MAP_FAILED)
    printf("both still read %c %c\n", p[0], o[0]);
  else
    printf("it reads %c %c\n", q[0], q[7 * PAGE]);
  return 0;
}
