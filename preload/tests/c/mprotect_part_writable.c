/* A private anonymous mapping made PROT_READ, then part of it
 * PROT_READ|PROT_WRITE again (the pattern of a collector's write barrier,
 * which unprotects the page a write faulted on): writes inside the part
 * succeed, on a page that was in and on one that was not, and a write
 * outside it still faults (SIGSEGV), as the kernel's.
 *
 * usage: mprotect_part_writable */
#define _GNU_SOURCE
#include "util.h"

#define LEN ((size_t)16 << 20)

int main(int argc, char **argv) {
  usage(argc, 0, "mprotect_part_writable");
  (void)argv;
  char *p = map_or_exit(LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0, "mmap");
  p[5 * PAGE] = 'w';
  p[100 * PAGE] = 'v';
  if (mprotect(p, LEN, PROT_READ) != 0 ||
      mprotect(p + 64 * PAGE, 64 * PAGE, PROT_READ | PROT_WRITE) != 0) {
    perror("mprotect");
    return 1;
  }
  int in = try_store(&p[100 * PAGE], 'x');
  int absent = try_store(&p[110 * PAGE], 'y');
  int out = try_store(&p[6 * PAGE], 'z');
  printf("read '%c', inside: %s '%c', %s '%c'; outside: %s\n", p[5 * PAGE],
         in ? "stored" : "refused", p[100 * PAGE] ? p[100 * PAGE] : '-',
         absent ? "stored" : "refused", p[110 * PAGE] ? p[110 * PAGE] : '-',
         out ? "stored" : "refused");
  return 0;
}
