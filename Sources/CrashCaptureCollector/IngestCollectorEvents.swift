internal import CrashCapture
internal import Foundation

/// `GET /events?after=SEQ&limit=N`: what the collector stored, as JSON lines, from either store.
extension IngestCollector {
    func listEvents(_ target: String) -> Response {
        let query = URLComponents(string: "http://x" + target)?.queryItems ?? []
        guard let after = Int64(query.first { $0.name == "after" }?.value ?? "0"), after >= 0,
            let asked = Int(query.first { $0.name == "limit" }?.value ?? "100000"), asked > 0
        else {
            return Response(status: 400, body: "{\"error\":\"after must be 0 or more and limit 1 or more\"}")
        }
        let limit = min(asked, 1_000_000)
        let payloads: [String]
        do {
            if let clickHouse {
                payloads = try clickHouse.events(after: Int(after), limit: limit)
            } else if let store {
                payloads = try store.events(after: after, limit: limit).map(\.payload)
            } else {
                payloads = []
            }
        } catch {
            return Response(status: 500, body: "{\"error\":\(JSONText.quoted("cannot read the store: \(error)"))}")
        }
        let lines = payloads.joined(separator: "\n")
        return Response(status: 200, body: lines.isEmpty ? "" : lines + "\n", contentType: "application/x-ndjson")
    }
}
