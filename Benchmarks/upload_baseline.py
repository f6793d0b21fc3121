"""A plain keep-alive HTTP client sending the same wire format as the uploader: one batch of
50 events at a time, in order, to a collector at URL. What the collector and loopback allow
without URLSession in between. Run by crashcap-bench pipeline; prints events per second.

    python3 Benchmarks/upload_baseline.py http://127.0.0.1:PORT/sa [BATCHES]
    python3 Benchmarks/upload_baseline.py http://127.0.0.1:PORT/sa --bodies FILE EVENTS

With --bodies, the requests are FILE's lines (each a whole form body, as our uploader sends
them) and the rate counts EVENTS events.
"""
import base64
import gzip
import http.client
import json
import sys
import time
import urllib.parse


def java_hash(text):
    value = 0
    for character in text:
        value = (value * 31 + ord(character)) & 0xFFFFFFFF
    return value - (1 << 32) if value >= (1 << 31) else value


def body(batch, prefix):
    events = [
        {"type": "track", "distinct_id": "bench", "time": 1700000000000, "event_id": f"{prefix}-{batch}-{index}", "event": "bench_event", "properties": {"pad": "p" * 600, "index": index}}
        for index in range(50)
    ]
    data = base64.b64encode(gzip.compress(json.dumps(events).encode())).decode()
    return f"crc={java_hash(data)}&gzip=1&data_list={urllib.parse.quote(data, safe='')}"


def main():
    url = urllib.parse.urlparse(sys.argv[1])
    given = len(sys.argv) > 2 and sys.argv[2] == "--bodies"
    if given:
        with open(sys.argv[3], "rb") as lines:
            bodies = [line.rstrip(b"\n") for line in lines if line.strip()]
        events = int(sys.argv[4])
    else:
        batches = int(sys.argv[2]) if len(sys.argv) > 2 else 300
        prefix = sys.argv[3] if len(sys.argv) > 3 else "baseline"
        bodies = [body(batch, prefix) for batch in range(batches)]
        events = batches * 50
    latencies = []
    connection = http.client.HTTPConnection(url.hostname, url.port)
    start = time.perf_counter()
    for payload in bodies:
        sent = time.perf_counter()
        connection.request("POST", url.path, payload, {"Content-Type": "application/x-www-form-urlencoded"})
        response = connection.getresponse()
        response.read()
        latencies.append(time.perf_counter() - sent)
        if response.status != 200:
            sys.exit(f"HTTP {response.status}")
    seconds = time.perf_counter() - start
    if len(sys.argv) > 3 and not given:
        # For the concurrent ingest benchmark: events/s and each request's latency in ms.
        # Loop start and end on the shared wall clock, so that the overlap can be measured.
        wall_end = time.time()
        print(f"{wall_end - seconds:.6f} {wall_end:.6f} " + " ".join(f"{l * 1000:.3f}" for l in latencies))
    else:
        print(f"{events / seconds:.0f}")


main()
