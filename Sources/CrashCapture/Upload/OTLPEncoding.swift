internal import CrashFileFormat
internal import CrashSymbolication
package import Foundation

#if HTTPUpload
    import OTLPLogs
    import SwiftProtobuf
#endif

/// Stored events as OpenTelemetry logs (OTLP/HTTP, protobuf, gzip), for `--otlp` and
/// `Configuration.otlpURL`. A crash becomes a record named `app.crash`, severity FATAL, with
/// the `exception.*` attributes of OpenTelemetry's semantic conventions and the place of the
/// first frame of the app's own code; every other event a record named by its event (or its
/// record type), severity INFO, its properties as attributes. Records are grouped under one
/// resource for each process that wrote them (`service.name`, `process.pid`, ...).
package enum OTLPEncoding {
    package static let contentType = "application/x-protobuf"

    /// Where the logs go: the URL as given when it has a path, else its `/v1/logs` (as
    /// OpenTelemetry's exporters read OTEL_EXPORTER_OTLP_LOGS_ENDPOINT and ..._ENDPOINT).
    package static func logsEndpoint(_ url: URL) -> URL {
        guard url.path.isEmpty || url.path == "/" else { return url }
        var components = URLComponents(url: url, resolvingAgainstBaseURL: false)
        components?.path = "/v1/logs"
        return components?.url ?? url
    }

    /// The request body for a batch of stored events (each the JSON text of one record).
    package static func body(events: [String], observedNanoseconds: UInt64) throws -> Data {
        #if HTTPUpload
            let request = try self.request(events: events, observedNanoseconds: observedNanoseconds)
            return try WireFormat.gzip(Data(request), level: 6)
        #else
            throw CrashCaptureError.invalidArgument(
                "this build of CrashCapture has no OTLP encoder (the package trait HTTPUpload is off)")
        #endif
    }

    /// A receiver's answer that refused records: how many, and its message; nil when it
    /// refused none, or the answer is not an `ExportLogsServiceResponse`.
    package static func refusals(in body: [UInt8]) -> (Int, String)? {
        #if HTTPUpload
            guard !body.isEmpty, let response = try? OTLPExportLogsServiceResponse(serializedBytes: body),
                response.hasPartialSuccess, response.partialSuccess.rejectedLogRecords > 0
            else { return nil }
            return (Int(response.partialSuccess.rejectedLogRecords), response.partialSuccess.errorMessage)
        #else
            return nil
        #endif
    }

    #if HTTPUpload
        /// An `ExportLogsServiceRequest`, serialized. swift-protobuf serializes each log record;
        /// the three messages around the records (request, resource logs, scope logs) are framed
        /// here, field by field as protobuf frames an embedded message (tag, length, bytes). The
        /// library computes the size of every embedded message at every level above it, so a
        /// record's attribute was visited seven times with the request serialized whole, four
        /// this way: encoding went from 16.6 to 11.9 µs an event (`crashcap-bench otlp`).
        static func request(events: [String], observedNanoseconds: UInt64) throws -> [UInt8] {
            var order: [Process] = []
            var records: [Process: [[UInt8]]] = [:]
            var executables: [Process: String] = [:]
            for (index, text) in events.enumerated() {
                guard let event = JSONTree.object(text.utf8) else {
                    throw CrashCaptureError.corrupt("stored event \(index) is not a JSON object")
                }
                let properties = event["properties"] as? [String: Any] ?? [:]
                let process = Process(properties: properties)
                if records[process] == nil { order.append(process) }
                // Only a crash report names the program (its first module): the name then goes
                // on the resource of every record of that process in the request.
                if let modules = (event["crash"] as? [String: Any])?["modules"] as? [[String: Any]],
                    let path = modules.first?["path"] as? String
                {
                    executables[process] = (path as NSString).lastPathComponent
                }
                var record = logRecord(event, properties: properties)
                record.observedTimeUnixNano = observedNanoseconds
                records[process, default: []].append(try record.serializedBytes())
            }
            var scope = OTLPInstrumentationScope()
            scope.name = "CrashCapture"
            scope.version = CrashCapture.version
            let scopeBytes: [UInt8] = try scope.serializedBytes()
            var request: [UInt8] = []
            for process in order {
                var resource = OTLPResource()
                resource.attributes = process.attributes(executable: executables[process])
                var scopeLogs: [UInt8] = []
                embed(1, scopeBytes, into: &scopeLogs)  // ScopeLogs.scope
                for record in records[process] ?? [] { embed(2, record, into: &scopeLogs) }  // .log_records
                var resourceLogs: [UInt8] = []
                embed(1, try resource.serializedBytes(), into: &resourceLogs)  // ResourceLogs.resource
                embed(2, scopeLogs, into: &resourceLogs)  // .scope_logs
                embed(1, resourceLogs, into: &request)  // ExportLogsServiceRequest.resource_logs
            }
            return request
        }

        /// An embedded message as field `number` of the message being written: its tag (wire
        /// type 2, length-delimited), its length as a varint, its bytes.
        static func embed(_ number: UInt64, _ message: [UInt8], into out: inout [UInt8]) {
            func varint(_ value: UInt64) {
                var rest = value
                while rest >= 0x80 {
                    out.append(UInt8(truncatingIfNeeded: rest) | 0x80)
                    rest >>= 7
                }
                out.append(UInt8(rest))
            }
            varint(number << 3 | 2)
            varint(UInt64(message.count))
            out += message
        }

        /// What tells one process's records from another's: their resource.
        struct Process: Hashable {
            var serviceName: String
            var serviceVersion: String?
            var pid: Int64?
            var host: String?
            var os: String?

            init(properties: [String: Any]) {
                serviceName = properties["$app_name"] as? String ?? "unknown_service"
                serviceVersion = properties["$app_version"] as? String
                pid = (properties["$pid"] as? NSNumber)?.int64Value
                host = properties["$hostname"] as? String
                os = (properties["$os"] as? String)?.lowercased()
            }

            func attributes(executable: String?) -> [OTLPKeyValue] {
                var list = [OTLPEncoding.attribute("service.name", serviceName)]
                if let serviceVersion { list.append(OTLPEncoding.attribute("service.version", serviceVersion)) }
                if let pid { list.append(OTLPEncoding.attribute("process.pid", pid)) }
                if let executable { list.append(OTLPEncoding.attribute("process.executable.name", executable)) }
                if let host { list.append(OTLPEncoding.attribute("host.name", host)) }
                if let os { list.append(OTLPEncoding.attribute("os.type", os)) }
                return list
            }
        }

        /// One record. Its own attributes first (`log.record.uid` is the event id, so a receiver
        /// can drop a record sent twice), then every property under its own name.
        static func logRecord(_ event: [String: Any], properties: [String: Any]) -> OTLPLogRecord {
            var record = OTLPLogRecord()
            let type = event["type"] as? String ?? "track"
            let name = event["event"] as? String ?? type
            if let time = event["time"] as? NSNumber, time.int64Value > 0 {
                record.timeUnixNano = UInt64(time.int64Value) * 1_000_000
            }
            var attributes: [OTLPKeyValue] = []
            if let id = event["event_id"] as? String { attributes.append(attribute("log.record.uid", id)) }
            if let session = event["session_id"] as? String { attributes.append(attribute("session.id", session)) }
            if let user = event["distinct_id"] { attributes.append(attribute("user.id", "\(user)")) }
            if let login = event["login_id"] as? String { attributes.append(attribute("crashcapture.login_id", login)) }
            attributes.append(attribute("crashcapture.type", type))
            if name == "$AppCrashed" {
                record.eventName = "app.crash"
                record.severityNumber = .fatal
                record.severityText = "FATAL"
                let crash = Crash(event: event, properties: properties)
                record.body = value(crash.title)
                attributes += crash.attributes
            } else {
                record.eventName = name
                record.severityNumber = .info
                record.severityText = "INFO"
                record.body = value(name)
            }
            let skipped: Set<String> = ["app_crashed_reason"]
            for key in properties.keys.sorted() where !skipped.contains(key) {
                if let converted = anyValue(properties[key]!) {
                    var pair = OTLPKeyValue()
                    pair.key = key
                    pair.value = converted
                    attributes.append(pair)
                }
            }
            record.attributes = attributes
            return record
        }

        /// The `exception.*`, `thread.*` and `code.*` attributes of a replayed `$AppCrashed`.
        struct Crash {
            var title: String
            var attributes: [OTLPKeyValue] = []

            init(event: [String: Any], properties: [String: Any]) {
                let crash = event["crash"] as? [String: Any] ?? [:]
                let signal = properties["crash_signal_name"] as? String ?? "crash"
                let code = properties["crash_code_name"] as? String
                title = properties["crash_title"] as? String ?? signal
                let exceptionType =
                    properties["crash_exception_type_demangled"] as? String
                    ?? (code.map { "\(signal) (\($0))" } ?? signal)
                let reason = properties["app_crashed_reason"] as? String ?? ""
                // The handler's lines before the frames, less the line naming the thread.
                let message = reason.split(separator: "\n", omittingEmptySubsequences: false)
                    .prefix { !$0.hasPrefix("#") }.filter { !$0.hasPrefix("thread ") }.joined(separator: "\n")
                attributes.append(attribute("exception.type", exceptionType))
                attributes.append(attribute("exception.message", message.isEmpty ? title : message))
                attributes.append(attribute("exception.stacktrace", Self.stacktrace(reason: reason, crash: crash)))
                if let tid = properties["crash_tid"] as? NSNumber {
                    attributes.append(attribute("thread.id", tid.int64Value))
                }
                if let name = properties["crash_thread_name"] as? String {
                    attributes.append(attribute("thread.name", name))
                }
                // The app's innermost function: inlined ones first, and none the replay marked
                // as the system's (`role`), wherever the runtime was linked.
                let frames = crash["frames"] as? [[String: Any]] ?? []
                let functions = frames.flatMap { frame -> [[String: Any]] in
                    guard !CrashFingerprint.isSystemModule(frame["module_name"] as? String ?? "") else { return [] }
                    return (frame["inlined"] as? [[String: Any]] ?? []) + [frame]
                }
                if let top = functions.first(where: { $0["role"] == nil && $0["function"] != nil }) {
                    // The names the issue and older receivers use, and those of semantic conventions 1.30.
                    if let function = top["function"] as? String {
                        attributes.append(attribute("code.function", function))
                        attributes.append(attribute("code.function.name", function))
                    }
                    if let file = top["file"] as? String {
                        attributes.append(attribute("code.filepath", file))
                        attributes.append(attribute("code.file.path", file))
                    }
                    if let line = top["line"] as? NSNumber {
                        attributes.append(attribute("code.lineno", line.int64Value))
                        attributes.append(attribute("code.line.number", line.int64Value))
                    }
                }
            }

            /// The crashed thread as the reason gives it, then every other thread's frames.
            static func stacktrace(reason: String, crash: [String: Any]) -> String {
                var text = reason
                for thread in crash["threads"] as? [[String: Any]] ?? [] where thread["crashed"] as? Bool != true {
                    let tid = (thread["tid"] as? NSNumber)?.int64Value ?? 0
                    text += "\n\nthread \(tid) \"\(thread["name"] as? String ?? "")\""
                    for (index, frame) in (thread["frames"] as? [[String: Any]] ?? []).enumerated() {
                        text +=
                            "\n#\(index) \(frame["pc"] as? String ?? "?") \(frame["module_name"] as? String ?? "???")"
                        if let function = frame["function"] as? String { text += " \(function)" }
                        if let file = frame["file"] as? String {
                            text += " at \(file)"
                            if let line = frame["line"] as? NSNumber { text += ":\(line.int64Value)" }
                        }
                    }
                }
                return text
            }
        }

        static func attribute(_ key: String, _ text: String) -> OTLPKeyValue {
            var pair = OTLPKeyValue()
            pair.key = key
            pair.value = value(text)
            return pair
        }

        static func attribute(_ key: String, _ number: Int64) -> OTLPKeyValue {
            var pair = OTLPKeyValue()
            pair.key = key
            pair.value.intValue = number
            return pair
        }

        static func value(_ text: String) -> OTLPAnyValue {
            var value = OTLPAnyValue()
            value.stringValue = text
            return value
        }

        /// A JSON value as an attribute value: objects as key-value lists, arrays as arrays,
        /// numbers as integers where they are whole; nil for null.
        static func anyValue(_ json: Any) -> OTLPAnyValue? {
            var value = OTLPAnyValue()
            switch json {
            case let text as String: value.stringValue = text
            case let number as NSNumber:
                switch UInt8(bitPattern: number.objCType.pointee) {
                case UInt8(ascii: "c"), UInt8(ascii: "B"): value.boolValue = number.boolValue
                case UInt8(ascii: "d"), UInt8(ascii: "f"): value.doubleValue = number.doubleValue
                default: value.intValue = number.int64Value
                }
            case let array as [Any]:
                var list = OTLPArrayValue()
                list.values = array.compactMap(anyValue)
                value.arrayValue = list
            case let object as [String: Any]:
                var list = OTLPKeyValueList()
                list.values = object.keys.sorted().compactMap { key in
                    anyValue(object[key]!).map { converted in
                        var pair = OTLPKeyValue()
                        pair.key = key
                        pair.value = converted
                        return pair
                    }
                }
                value.kvlistValue = list
            default: return nil
            }
            return value
        }
    #endif
}
