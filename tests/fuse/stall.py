"""A FUSE filesystem of one file whose reads stall: a test's stand-in for a
disk that stops answering (the helper's third audit, A12).

Usage: stall.py MOUNTPOINT NAME SIZE STALL_FROM STALL_TO [HEAD]

Mounts at MOUNTPOINT (mfusepy over libfuse 3; root mounts without
fusermount) a directory holding NAME, SIZE bytes of zeros but for HEAD
(hexadecimal) at its start. A read or a
write that reaches into [STALL_FROM, STALL_TO) never answers: it waits
until the process ends, when the kernel ends it with an error; other
writes are taken and forgotten (the file reads as zeros still). Each is
printed on stdout as it comes: `stalled read OFFSET`, `stalled write
OFFSET`, `write OFFSET`.
"""

import errno
import stat
import sys
import threading

import mfusepy as fuse


class Stalling(fuse.Operations):
    use_ns = True

    def __init__(self, name, size, stall_from, stall_to, head):
        self.path = "/" + name
        self.head = head
        self.size = size
        self.stalled = range(stall_from, stall_to)
        self.never = threading.Event()
        self.printing = threading.Lock()

    def getattr(self, path, fh=None):
        if path == "/":
            return {"st_mode": stat.S_IFDIR | 0o755, "st_nlink": 2}
        if path == self.path:
            return {"st_mode": stat.S_IFREG | 0o644, "st_nlink": 1, "st_size": self.size}
        raise fuse.FuseOSError(errno.ENOENT)

    def readdir(self, path, fh):
        return [".", "..", self.path[1:]]

    def open(self, path, flags):
        return 0

    def read(self, path, size, offset, fh):
        end = min(offset + size, self.size)
        self.stall_within("read", offset, end)
        data = bytearray(max(0, end - offset))
        head = self.head[offset:end]
        data[: len(head)] = head
        return bytes(data)

    def write(self, path, data, offset, fh):
        self.stall_within("write", offset, offset + len(data))
        self.say(f"write {offset}")
        return len(data)

    def stall_within(self, what, start, end):
        """Never returns when [start, end) reaches into the stalled range."""
        if start < self.stalled.stop and end > self.stalled.start:
            self.say(f"stalled {what} {start}")
            self.never.wait()

    def say(self, line):
        """Prints `line` whole, though requests come on several threads."""
        with self.printing:
            print(line, flush=True)


def main():
    mountpoint, name = sys.argv[1], sys.argv[2]
    size, stall_from, stall_to = (int(a) for a in sys.argv[3:6])
    head = bytes.fromhex(sys.argv[6]) if len(sys.argv) > 6 else b""
    fuse.FUSE(Stalling(name, size, stall_from, stall_to, head), mountpoint, foreground=True)


if __name__ == "__main__":
    main()
