#!/usr/bin/env python3
"""An endless chunked body into the JSON gateway, against a running
server: one HTTP/1.1 connection posts to /v3/watch (no token needed) a JSON message that never
ends, in 64 KiB chunks as fast as the server takes them, for at most SECS seconds. Reports when
the server answered or closed the connection, how much it had taken by then, its CPU time and
the growth of its RSS (read from /proc/PID).

Usage: gateway_body_flood.py PORT PID [SECS]
"""
import os
import socket
import sys
import time


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def cpu_s(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main():
    port, pid = int(sys.argv[1]), int(sys.argv[2])
    secs = float(sys.argv[3]) if len(sys.argv) > 3 else 20.0
    rss0, cpu0, peak = rss_kib(pid), cpu_s(pid), 0
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(
        b"POST /v3/watch HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
    )
    head = b'{"create_request":{"key":"'
    s.sendall(b"%x\r\n%s\r\n" % (len(head), head))
    chunk = b"A" * 65536
    frame = b"%x\r\n%s\r\n" % (len(chunk), chunk)
    s.settimeout(0.0)
    sent, t0, answer, how = len(head), time.monotonic(), b"", "still sending"
    while time.monotonic() - t0 < secs:
        try:
            got = s.recv(4096)
            if got == b"":
                how = "closed"
                break
            answer += got
            how = "answered"
            break
        except BlockingIOError:
            pass
        except ConnectionError as e:
            how = f"reset ({e.__class__.__name__})"
            break
        try:
            n = s.send(frame)
            sent += n
            if n < len(frame):
                # The rest of the frame once the server takes it.
                s.settimeout(1.0)
                try:
                    s.sendall(frame[n:])
                    sent += len(frame) - n
                except (socket.timeout, ConnectionError):
                    pass
                s.settimeout(0.0)
        except BlockingIOError:
            time.sleep(0.001)
        except ConnectionError as e:
            how = f"reset while sending ({e.__class__.__name__})"
            break
        peak = max(peak, rss_kib(pid) - rss0)
    took = time.monotonic() - t0
    if how == "answered":
        s.settimeout(1.0)
        try:
            answer += s.recv(65536)
        except (socket.timeout, ConnectionError):
            pass
    first = answer.split(b"\r\n", 1)[0].decode(errors="replace")
    print(
        f"{how} after {took:.2f} s and {sent / 2**20:.1f} MiB sent; status line: {first!r}; "
        f"server CPU {cpu_s(pid) - cpu0:.2f} s; RSS +{peak / 1024:.1f} MiB at most, "
        f"+{(rss_kib(pid) - rss0) / 1024:.1f} MiB at the end"
    )


if __name__ == "__main__":
    main()
