"""A TCP transfer between two namespaces, for the shaping tests (no torch: starts in milliseconds).

    tcp_pair.py recv ADDR PORT            accept one connection, read to the end, answer one byte
    tcp_pair.py send ADDR PORT NBYTES OUT connect, send NBYTES, wait for the answer, write seconds to OUT
"""
import socket
import sys
import time

mode, addr, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
if mode == "recv":
    with socket.create_server((addr, port)) as server:
        conn, _ = server.accept()
        buf = bytearray(1 << 20)
        while conn.recv_into(buf):
            pass
        conn.sendall(b"k")
else:
    nbytes, out = int(sys.argv[4]), sys.argv[5]
    chunk = bytes(1 << 20)
    deadline = time.monotonic() + 10
    while True:  # the receiver may not listen yet
        try:
            conn = socket.create_connection((addr, port))
            break
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)
    t0 = time.perf_counter()
    sent = 0
    while sent < nbytes:
        n = min(len(chunk), nbytes - sent)
        conn.sendall(chunk[:n])
        sent += n
    conn.shutdown(socket.SHUT_WR)
    conn.recv(1)
    with open(out, "w") as f:
        f.write(repr(time.perf_counter() - t0))
