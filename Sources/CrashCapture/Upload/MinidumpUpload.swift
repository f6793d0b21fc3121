internal import CrashFileFormat
package import Foundation
internal import Minidump

/// Sends each crash the store keeps with its stacks as a minidump, the way crash backends take
/// one (Sentry's minidump endpoint; BugSplat and Backtrace accept the same form): a
/// `multipart/form-data` POST, the dump in `upload_file_minidump`, the release and tags as
/// `sentry[...]` fields. Exactly once: a crash is marked sent when the receiver answers 2xx (or
/// refused, on a 4xx that says it never will take it), and never sent again. 429 and 503 wait
/// for the Retry-After the receiver asks (within the longest delay), other failures back off as
/// the event uploader does.
package final class MinidumpUploader: @unchecked Sendable {
    package struct Result: Sendable {
        package var sent: [(eventID: String, answerID: String?)] = []
        package var refused = 0
        package var pending = 0
        package var lastError: String?
    }

    package let endpoint: URL
    let options: UploadOptions
    let store: EventStore
    private let plainConnection: PlainHTTPConnection?
    /// Called before each wait between attempts: how many attempts failed, why, and the wait.
    package var onRetry: ((Int, String, Double) -> Void)?

    package init(endpoint: URL, store: EventStore, options: UploadOptions) throws {
        guard Uploader.canUpload else {
            throw CrashCaptureError.invalidArgument(
                "this build of CrashCapture has no HTTP client (the package trait HTTPUpload is off)")
        }
        try options.validate()
        try Uploader.validate(endpoint, allowInsecureHTTP: options.allowInsecureHTTP)
        self.endpoint = endpoint
        self.options = options
        self.store = store
        plainConnection = endpoint.scheme?.lowercased() == "http" ? PlainHTTPConnection(endpoint: endpoint) : nil
    }

    /// Sends every pending crash, in time order, until `deadline`.
    package func sendPending(deadline: Date) -> Result {
        var result = Result()
        let pending: [String]
        do {
            pending = try store.pendingMinidumps()
        } catch {
            result.lastError = "the event store: \(error)"
            return result
        }
        var failures = 0
        var index = 0
        while index < pending.count {
            let id = pending[index]
            let body: (data: Data, boundary: String)
            do {
                guard let form = try form(for: id) else {
                    // Nothing to send after all (the report was let go meanwhile): never again.
                    try store.markMinidump(eventID: id, refused: true)
                    index += 1
                    continue
                }
                body = form
            } catch {
                result.lastError = "\(id): \(error)"
                try? store.markMinidump(eventID: id, refused: true)
                result.refused += 1
                index += 1
                continue
            }
            let left = deadline.timeIntervalSinceNow
            guard left > 0 else { break }
            let answer = post(
                body.data, contentType: "multipart/form-data; boundary=\(body.boundary)",
                timeout: min(options.requestTimeout.seconds, left))
            let outcome: Uploader.Outcome
            var answerID: String?
            switch answer {
            case .answer(let status, let text, let retryAfter):
                outcome = Uploader.classify(status: status, body: text, retryAfter: retryAfter)
                answerID = Self.eventID(in: text)
            case .failed(let reason):
                outcome = .retry(reason)
            }
            switch outcome {
            case .accepted, .acceptedWithRefusals:
                try? store.markMinidump(eventID: id)
                result.sent.append((id, answerID))
                failures = 0
                index += 1
            case .rejected(let status, let text):
                try? store.markMinidump(eventID: id, refused: true)
                result.refused += 1
                result.lastError = "HTTP \(status): \(text)"
                index += 1
            case .retry(let reason), .retryAfter(let reason, _):
                failures += 1
                result.lastError = reason
                var wait = Uploader.backoff(failures: failures, options: options)
                if case .retryAfter(_, let seconds) = outcome { wait = min(seconds, options.retryMaximumDelay.seconds) }
                guard Date().addingTimeInterval(wait) < deadline else {
                    result.pending = pending.count - index
                    return result
                }
                onRetry?(failures, reason, wait)
                Thread.sleep(forTimeInterval: wait)
            }
        }
        result.pending = pending.count - index
        return result
    }

    /// The form for one stored crash: nil when its report or stacks are no longer kept.
    func form(for eventID: String) throws -> (data: Data, boundary: String)? {
        guard let payload = try store.crashReport(eventID: eventID),
            let stacks = try store.crashStacks(eventID: eventID),
            let event = JSONTree.object(Array(payload.utf8))
        else { return nil }
        var report = CrashReport(path: "store, crash \(eventID)", storedEvent: event)
        report.stacks = try StackMemory.parse(stacks).get()
        let dump = MinidumpWriter.write(try MinidumpInput(report: report))
        let properties = report.properties
        var fields: [(String, String)] = []
        let app = properties["$app_name"] as? String ?? ""
        if let version = properties["$app_version"] as? String, !version.isEmpty {
            fields.append(("sentry[release]", app.isEmpty ? version : "\(app)@\(version)"))
        }
        fields.append(("sentry[platform]", "native"))
        for (tag, key) in [
            ("app", "$app_name"), ("crash_id", "event_id"), ("fingerprint", "crash_fingerprint"),
            ("signal", "crash_signal_name"), ("os_version", "$os_version"),
        ] {
            let value = key == "event_id" ? eventID : properties[key] as? String
            if let value, !value.isEmpty { fields.append(("sentry[tags][\(tag)]", value)) }
        }
        let boundary = "crashcapture-" + UUID().uuidString
        var data = Data()
        func line(_ text: String) { data.append(Data((text + "\r\n").utf8)) }
        for (name, value) in fields {
            line("--\(boundary)")
            line("Content-Disposition: form-data; name=\"\(name)\"")
            line("")
            line(value)
        }
        line("--\(boundary)")
        line("Content-Disposition: form-data; name=\"upload_file_minidump\"; filename=\"\(eventID).dmp\"")
        line("Content-Type: application/octet-stream")
        line("")
        data.append(contentsOf: dump)
        line("")
        line("--\(boundary)--")
        return (data, boundary)
    }

    func post(_ body: Data, contentType: String, timeout: Double) -> HTTPExchange {
        let headers = options.headers.sorted { $0.key < $1.key }.map { ($0.key, $0.value) }
        guard let plainConnection else {
            return HTTPTransport.exchange(
                body, to: endpoint, contentType: contentType, headers: headers, timeout: timeout)
        }
        switch plainConnection.post(body, contentType: contentType, headers: headers, timeout: timeout)() {
        case .success(let response): return .answer(response.status, response.body, response.retryAfter)
        case .failure(let failure): return .failed("network error: \(failure)")
        }
    }

    /// The receiver's id for what it stored: Sentry answers `{"id": "…"}`; other backends a
    /// plain id, or nothing of use.
    static func eventID(in body: [UInt8]) -> String? {
        if let object = JSONTree.object(body), let id = object["id"] as? String { return id }
        let text = String(decoding: body.prefix(128), as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
        return text.isEmpty || text.contains(" ") || text.contains("<") ? nil : text
    }
}

/// One request's answer, whole enough to read an id from: its status, the start of its body and
/// Retry-After; or why there was none.
enum HTTPExchange {
    case answer(Int, [UInt8], String?)
    case failed(String)
}
