# Run under the shim: a file mapped and also written with os.pwrite / os.write
# must never read stale through the mapping; a writable shared mapping's
# stores reach the file at flush; a second writable mapping is refused.
import mmap, os, sys

path = sys.argv[1]
with open(path, "wb") as f:
    f.write(bytes(range(256)) * (4096 * 64 // 256))   # 64 pages
fd = os.open(path, os.O_RDWR)
ro = mmap.mmap(fd, 0, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
assert ro[5000] == 5000 % 256
os.pwrite(fd, b"\xee" * 10, 4998)                      # behind the mapping
assert ro[4997:5009] == bytes([4997 % 256]) + b"\xee" * 10 + bytes([5008 % 256]), ro[4997:5009]
os.lseek(fd, 3 * 4096, os.SEEK_SET)
os.write(fd, b"written")                               # at the descriptor's offset
assert ro[3 * 4096:3 * 4096 + 7] == b"written"
ro.close()

rw = mmap.mmap(fd, 0, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
rw[100:104] = b"abcd"
assert os.pread(fd, 4, 100) == b"abcd"                 # no msync: read(2) sees it
rw[200] = 0x5a
os.lseek(fd, 200, os.SEEK_SET)
assert os.read(fd, 1) == b"\x5a"
rw.flush()
try:
    mmap.mmap(fd, 0, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
    print("second mapping allowed")
    sys.exit(1)
except OSError as e:
    assert e.errno == 19, e                            # ENODEV
os.pwrite(fd, b"XY", 102)
assert rw[100:104] == b"abXY", rw[100:104]
rw[0] = 0x41
rw.close()                                             # munmap writes it back
assert os.pread(fd, 1, 0) == b"A"
print("coherence ok")
