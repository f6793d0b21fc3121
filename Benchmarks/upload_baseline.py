"""A plain keep-alive HTTP client sending the same wire format as the uploader: one batch of
50 events at a time, in order, to a collector at URL. What the collector and loopback allow
without URLSession in between. Run by crashcap-bench pipeline; prints events per second.

    python3 Benchmarks/upload_baseline.py http://127.0.0.1:PORT/sa [BATCHES]
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


def body(batch):
    events = [
        {"event_id": f"baseline-{batch}-{index}", "event": "bench_event", "properties": {"pad": "p" * 600, "index": index}}
        for index in range(50)
    ]
    data = base64.b64encode(gzip.compress(json.dumps(events).encode())).decode()
    return f"crc={java_hash(data)}&gzip=1&data_list={urllib.parse.quote(data, safe='')}"


def main():
    url = urllib.parse.urlparse(sys.argv[1])
    batches = int(sys.argv[2]) if len(sys.argv) > 2 else 300
    bodies = [body(batch) for batch in range(batches)]
    connection = http.client.HTTPConnection(url.hostname, url.port)
    start = time.perf_counter()
    for payload in bodies:
        connection.request("POST", url.path, payload, {"Content-Type": "application/x-www-form-urlencoded"})
        response = connection.getresponse()
        response.read()
        if response.status != 200:
            sys.exit(f"HTTP {response.status}")
    seconds = time.perf_counter() - start
    print(f"{batches * 50 / seconds:.0f}")


main()
