"""An OTLP/HTTP logs receiver for the tests: every request body is gunzipped and decoded by the
official opentelemetry-proto package (not by CrashCapture's code), and written as one JSON line
(protobuf's own JSON mapping) to OUTPUT. Answers an ExportLogsServiceResponse.

    python3 Tests/otlp_receiver.py OUTPUT PACKAGES [--fail-first N --status S [--retry-after SECONDS]]
        [--partial N MESSAGE] [--require-header NAME VALUE]

--partial answers every request with a partial success that refuses N records, saying MESSAGE.
--require-header answers 401 to a request without that header and value (an API key).

Prints "listening on PORT" once it listens on 127.0.0.1.
"""
import gzip
import http.server
import sys

sys.path.insert(0, sys.argv[2])
from google.protobuf import json_format  # noqa: E402
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2  # noqa: E402

output = sys.argv[1]
options = sys.argv[3:]


def option(name, default):
    return type(default)(options[options.index(name) + 1]) if name in options else default


fail_first = option("--fail-first", 0)
fail_status = option("--status", 503)
retry_after = option("--retry-after", "")
partial = option("--partial", 0)
partial_message = options[options.index("--partial") + 2] if "--partial" in options else ""
required = options[options.index("--require-header") + 1 : options.index("--require-header") + 3] if "--require-header" in options else None
requests = 0


class Receiver(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        global requests
        body = self.rfile.read(int(self.headers["Content-Length"]))
        requests += 1
        if requests <= fail_first:
            self.answer(fail_status, b"failure on purpose", "text/plain", retry_after)
            return
        if required and self.headers.get(required[0]) != required[1]:
            self.answer(401, b"missing or wrong API key", "text/plain")
            return
        if self.path != "/v1/logs":
            self.answer(404, b"no route", "text/plain")
            return
        if self.headers.get("Content-Type") != "application/x-protobuf":
            self.answer(415, b"protobuf only", "text/plain")
            return
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        request = logs_service_pb2.ExportLogsServiceRequest()
        try:
            request.ParseFromString(body)
        except Exception as error:  # a body the official decoder refuses
            self.answer(400, str(error).encode(), "text/plain")
            return
        with open(output, "a") as out:
            out.write(json_format.MessageToJson(request, indent=None) + "\n")
        response = logs_service_pb2.ExportLogsServiceResponse()
        if partial:
            response.partial_success.rejected_log_records = partial
            response.partial_success.error_message = partial_message
        self.answer(200, response.SerializeToString(), "application/x-protobuf")

    def answer(self, status, data, content_type, retry=""):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
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
