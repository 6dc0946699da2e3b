/* The kernel alone: warm scans, one word per page, over mappings of 16384
 * pages, 300 rounds, the order rotated each round (MADV_DONTNEED before
 * each pass). In creation order:
 *   tmpfs        a tmpfs file;
 *   memfd        a memfd;
 *   memfd+uffd   a memfd registered MISSING with userfaultfd;
 *   engine-like  a memfd mapped as the engine maps a kernel-mapped region
 *                (read-write, MADV_DONTFORK, mprotect read-only, registered
 *                MISSING, filled through a pipe with splice; SHUF=1 fills
 *                it in random order);
 *   chunked      the same mapping, zapped 64 pages at a time as
 *                Region::dontneed does;
 *   tmpfs+view   a tmpfs file that a second mapping also maps (as the
 *                engine's file store keeps its view);
 *   tmpfs-late, memfd+uffd-late  the first and third again, made last.
 * Pages allocated later scan faster whatever maps them (compare the late
 * pair with their early twins), so compare only mappings made at the same
 * point: the late pair are level with each other, and tmpfs+view beats
 * tmpfs-late, made after it, by the second mapping alone.
 * Build: gcc -O2 -o scan-mappings scan-mappings.c */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <unistd.h>
#include <fcntl.h>
#include <time.h>
#include <sys/mman.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <linux/userfaultfd.h>
#define PG 4096
#define N 8
static long pages = 16384;
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e9+t.tv_nsec;}
static uint64_t scan(char*b){uint64_t s=0;for(long p=0;p<pages;p++)s+=*(volatile uint64_t*)(b+p*PG+8*(p%512));return s;}
static void fill(int fd){char buf[PG];for(long p=0;p<pages;p++){memset(buf,p,PG);pwrite(fd,buf,PG,p*PG);}}
static void reg(char*b,size_t len,uint64_t feat){
  int u=syscall(SYS_userfaultfd,O_CLOEXEC|O_NONBLOCK);
  struct uffdio_api api={.api=UFFD_API,.features=feat};
  if(ioctl(u,UFFDIO_API,&api)){perror("api");exit(1);}
  struct uffdio_register r={.range={(uint64_t)b,len},.mode=UFFDIO_REGISTER_MODE_MISSING};
  if(ioctl(u,UFFDIO_REGISTER,&r)){perror("reg");exit(1);}
}
int main(int argc,char**argv){
  size_t len=pages*PG;
  int f=open("/dev/shm/scanexp",O_RDWR|O_CREAT|O_TRUNC,0600); fill(f);
  int m=memfd_create("x",0); ftruncate(m,len); fill(m);
  int m2=memfd_create("y",0); ftruncate(m2,len); fill(m2);
  char*K=mmap(0,len,PROT_READ,MAP_SHARED,f,0);
  char*M=mmap(0,len,PROT_READ,MAP_SHARED,m,0);
  char*U=mmap(0,len,PROT_READ,MAP_SHARED,m2,0);
  reg(U,len,argc>1?atol(argv[1]):0);
  int m3=memfd_create("z",0); ftruncate(m3,len);
  { int pp[2]; pipe(pp); char buf[PG]; long *perm=malloc(pages*8); for(long i=0;i<pages;i++)perm[i]=i; srand(1); for(long i=pages-1;i>0;i--){long j=rand()%(i+1); long t=perm[i];perm[i]=perm[j];perm[j]=t;} for(long q=0;q<pages;q++){long p=getenv("SHUF")?perm[q]:q; memset(buf,p,PG); write(pp[1],buf,PG); loff_t o=p*PG; splice(pp[0],0,m3,&o,PG,0);} }
  char*V=mmap(0,len,PROT_READ|PROT_WRITE,MAP_SHARED,m3,0); madvise(V,len,MADV_DONTFORK); mprotect(V,len,PROT_READ); reg(V,len,0);
  int f2=open("/dev/shm/scanexp2",O_RDWR|O_CREAT|O_TRUNC,0600); fill(f2); char*K2=mmap(0,len,PROT_READ,MAP_SHARED,f2,0); char*view=mmap(0,len,PROT_READ,MAP_SHARED,f2,0); scan(view); for(long p=0;p<pages;p++) (void)*(volatile char*)(view+p*PG);
  int f3=open("/dev/shm/scanexp3",O_RDWR|O_CREAT|O_TRUNC,0600); fill(f3); char*K3=mmap(0,len,PROT_READ,MAP_SHARED,f3,0);
  int m4=memfd_create("w",0); ftruncate(m4,len); fill(m4); char*U4=mmap(0,len,PROT_READ,MAP_SHARED,m4,0); reg(U4,len,0);
  char*names[]={"tmpfs","memfd","memfd+uffd","engine-like","chunked","tmpfs+view","tmpfs-late","memfd+uffd-late"}; char*bs[]={K,M,U,V,V,K2,K3,U4}; double t[8]={0};
  for(int i=0;i<N;i++)scan(bs[i]);
  int rounds=300;
  for(int r=0;r<rounds;r++)for(int q=0;q<N;q++){int i=(q+r)%N;{if(i==4){for(long p=0;p<pages;p+=64)madvise(bs[i]+p*PG,64*PG,MADV_DONTNEED);}else madvise(bs[i],len,MADV_DONTNEED);double a=now();scan(bs[i]);t[i]+=now()-a;}}
  for(int i=0;i<N;i++)printf("%-12s %.1f ns/page ratio-to-tmpfs %.3f\n",names[i],t[i]/rounds/pages,t[0]/t[i]);
  unlink("/dev/shm/scanexp");unlink("/dev/shm/scanexp2");unlink("/dev/shm/scanexp3");
}
