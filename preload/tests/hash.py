# A real tool's way to read a large file: Python's mmap module.
import hashlib, mmap, sys
with open(sys.argv[1], "rb") as f:
    m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
    h = hashlib.sha256()
    for i in range(0, len(m), 1 << 16):
        h.update(m[i:i + (1 << 16)])
    print(len(m), h.hexdigest())
    m.close()
