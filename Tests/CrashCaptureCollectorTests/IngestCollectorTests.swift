import CrashCaptureCollector
import CrashFileFormat
import Foundation
import TestSupport
import Testing

@testable import CrashCapture

@Suite struct CollectorTests {
    @Test func rejectsMalformedBatchesWithAReason() throws {
        let collector = try CollectorProcess()
        let (status, body) = try collector.request("POST", "/sa", body: Data("crc=1&gzip=1&data_list=abc".utf8))
        #expect(status == 400)
        #expect(String(decoding: body, as: UTF8.self).contains("crc mismatch"))
        let noID = try WireFormat.encode(events: ["{\"event\":\"x\",\"properties\":{}}"])
        let (missing, message) = try collector.request("POST", "/sa", body: noID)
        #expect(missing == 400)
        #expect(String(decoding: message, as: UTF8.self).contains("no event_id"))
        #expect(try collector.get("/nowhere").0 == 404)
        #expect(try collector.request("DELETE", "/events", body: nil).0 == 405)
    }

    @Test func faultsApplyToUploadsOnly() throws {
        let collector = try CollectorProcess(["--drop-first", "1", "--fail-first", "1"])
        let batch = String(
            decoding: try WireFormat.encode(events: ["{\"event_id\":\"a\",\"event\":\"x\",\"properties\":{}}"]),
            as: UTF8.self)
        // A plain client, one connection per request: URLSession retries a dropped keep-alive
        // connection on its own, which would hide what the server did.
        let client = """
            import http.client, sys
            host, port = sys.argv[1].split("//")[1].split("/")[0].split(":")
            def ask(method, path, body=None):
                connection = http.client.HTTPConnection(host, int(port), timeout=10)
                try:
                    connection.request(method, path, body)
                    print(method, path, connection.getresponse().status)
                except (http.client.RemoteDisconnected, ConnectionResetError):
                    print(method, path, "dropped")
            ask("GET", "/events"); ask("GET", "/health")
            for _ in range(3): ask("POST", "/sa", sys.argv[2])
            """
        let result = try run("/usr/bin/env", ["python3", "-c", client, collector.url, batch])
        #expect(
            result.stdout
                == "GET /events 200\nGET /health 200\nPOST /sa dropped\nPOST /sa 500\nPOST /sa 200\n",
            "\(result.stderr)")
    }

    @Test func deduplicatesByEventID() throws {
        let collector = try CollectorProcess()
        let batch = try WireFormat.encode(events: [
            "{\"event_id\":\"a\",\"event\":\"x\",\"properties\":{}}",
            "{\"event_id\":\"b\",\"event\":\"x\",\"properties\":{}}",
        ])
        let (_, first) = try collector.request("POST", "/sa", body: batch)
        #expect(String(decoding: first, as: UTF8.self) == "{\"inserted\":2,\"duplicates\":0}")
        let (_, second) = try collector.request("POST", "/sa", body: batch)
        #expect(String(decoding: second, as: UTF8.self) == "{\"inserted\":0,\"duplicates\":2}")
        #expect(try collector.events().count == 2)
    }

    @Test func badArgumentsAreClearErrors() throws {
        let busy = try CollectorProcess()
        let port = String(busy.base.split(separator: ":").last!)
        let result = try run(
            Paths.crashcap, ["collect", "--port", port, "--db", makeTemporaryDirectory("busy") + "/x.db"])
        #expect(result.exitCode == 69)
        #expect(result.stderr.contains("cannot listen"))
        let noDB = try run(Paths.crashcap, ["collect"])
        #expect(noDB.exitCode != 0 && noDB.stderr.contains("--db"))
    }
}
