"""A timed TCP stream between two namespaces, for the schedule tests (no torch: starts in milliseconds).

    tcp_meter.py recv ADDR PORT OUT      accept one connection, read to the end; write [[monotonic s, bytes], ...] to OUT
    tcp_meter.py send ADDR PORT SECONDS  connect, send for SECONDS, close
"""
import json
import socket
import sys
import time

mode, addr, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
if mode == "recv":
    with socket.create_server((addr, port)) as server:
        conn, _ = server.accept()
        buf = bytearray(1 << 20)
        got, marks, next_mark = 0, [], 0.0
        while True:
            n = conn.recv_into(buf)
            if not n:
                break
            got += n
            now = time.monotonic()
            if now >= next_mark:  # a sample every 20 ms is enough for rates over seconds
                marks.append([now, got])
                next_mark = now + 0.02
        marks.append([time.monotonic(), got])
    with open(sys.argv[4], "w") as f:
        json.dump(marks, f)
else:
    seconds = float(sys.argv[4])
    deadline = time.monotonic() + 10
    while True:  # the receiver may not listen yet
        try:
            conn = socket.create_connection((addr, port))
            break
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)
    chunk = bytes(1 << 16)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        conn.sendall(chunk)
    conn.close()
