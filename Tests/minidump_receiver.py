"""A minidump receiver for the tests, parsing each request as Sentry's minidump endpoint does
(`POST /api/<project>/minidump/`, multipart/form-data, the dump in `upload_file_minidump`,
which must start with MDMP, `sentry[...]` fields, a key in `?sentry_key=` or X-Sentry-Auth).
The multipart body is parsed by Python's own email parser, not by CrashCapture's code. Each
accepted request is written as one JSON line to OUTPUT and answered `{"id": "<32 hex>"}`.

    python3 Tests/minidump_receiver.py OUTPUT [--fail-first N --status S [--retry-after SECONDS]]

Prints "listening on PORT" once it listens on 127.0.0.1.
"""
import email.parser
import email.policy
import http.server
import json
import re
import sys
import urllib.parse
import uuid

output = sys.argv[1]
options = sys.argv[2:]


def option(name, default):
    return type(default)(options[options.index(name) + 1]) if name in options else default


fail_first = option("--fail-first", 0)
fail_status = option("--status", 503)
retry_after = option("--retry-after", "")
requests = 0


class Receiver(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        global requests
        body = self.rfile.read(int(self.headers["Content-Length"]))
        requests += 1
        url = urllib.parse.urlparse(self.path)
        if not re.fullmatch(r"/api/[0-9]+/minidump/?", url.path):
            return self.answer(404, {"detail": "no route"})
        key = urllib.parse.parse_qs(url.query).get("sentry_key", [None])[0]
        auth = self.headers.get("X-Sentry-Auth", "")
        if not key and "sentry_key=" not in auth:
            return self.answer(401, {"detail": "missing authorization information"})
        if requests <= fail_first:
            return self.answer(fail_status, {"detail": "failure on purpose"}, retry_after)
        content_type = self.headers.get("Content-Type", "")
        if not content_type.startswith("multipart/form-data"):
            return self.answer(400, {"detail": "expected multipart/form-data"})
        message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
            b"Content-Type: " + content_type.encode() + b"\r\n\r\n" + body)
        fields = {}
        dumps = []
        for part in message.iter_parts():
            name = part.get_param("name", header="content-disposition")
            data = part.get_payload(decode=True)
            if name == "upload_file_minidump":
                dumps.append({"filename": part.get_filename(), "size": len(data), "magic": data[:4].decode("latin-1")})
            else:
                fields[name] = data.decode("utf-8")
        if len(dumps) != 1 or dumps[0]["magic"] != "MDMP":
            return self.answer(400, {"detail": "invalid minidump"})
        event_id = uuid.uuid4().hex
        with open(output, "a") as out:
            out.write(json.dumps({"id": event_id, "fields": fields, "dump": dumps[0], "key": key,
                                  "auth": auth}) + "\n")
        self.answer(200, {"id": event_id})

    def answer(self, status, document, retry=""):
        data = json.dumps(document).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if retry:
            self.send_header("Retry-After", retry)
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
print(f"listening on {server.server_address[1]}", flush=True)
server.serve_forever()
