"""What the collector must hold up under: 200 idle connections, 64 that send one byte and
stall, and gzip bombs (a 1 GiB stream of zeros, about 1 MiB gzip'd). Run by crashcap-bench
ingest against a `crashcap collect` it started; prints the bombs' answers."""
import base64
import socket
import sys
import time
import zlib

host, port = sys.argv[1].rsplit(":", 1)


def connect():
    return socket.create_connection((host, int(port)), timeout=30)


idle = [connect() for _ in range(200)]
slow = [connect() for _ in range(64)]
for s in slow:
    s.sendall(b"P")
packer = zlib.compressobj(9, zlib.DEFLATED, 31)
block = b"\0" * (1 << 20)
bomb = b"".join(packer.compress(block) for _ in range(1024)) + packer.flush()
data = base64.b64encode(bomb).decode()
body = ("gzip=1&data_list=" + data.replace("+", "%2B").replace("/", "%2F").replace("=", "%3D")).encode()
answers = []
for _ in range(4):
    s = connect()
    s.sendall(b"POST /sa HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    answers.append(s.recv(100).split(b"\r\n")[0].decode())
time.sleep(float(sys.argv[2]) if len(sys.argv) > 2 else 1)
print(" | ".join(answers))
