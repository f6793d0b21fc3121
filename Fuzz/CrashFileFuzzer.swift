// libFuzzer target for the crash-file reader: whatever the bytes, parsing must not crash,
// must not hang, must never return a record it did not verify, and must stay bounded.
// Built and run by Fuzz/run.sh.

@_cdecl("LLVMFuzzerTestOneInput")
public func crashFileFuzzerTestOneInput(_ data: UnsafePointer<UInt8>, _ size: Int) -> Int32 {
    let bytes = Array(UnsafeBufferPointer(start: data, count: size))
    let contents = CrashFileReader.parse(bytes)
    var end = 0
    for record in contents.records {
        precondition(record.offset >= end, "records overlap or go backwards")
        precondition(record.payload.count <= CrashFileLayout.maximumPayload, "oversized record accepted")
        let start = record.offset + CrashFileLayout.headerSize
        precondition(Array(bytes[start..<start + record.payload.count]) == record.payload, "payload not from input")
        end = start + record.payload.count
        _ = record.json
    }
    let report = CrashReport(path: "fuzz", contents: contents)
    _ = report.frames
    _ = report.modules
    _ = report.timing
    return 0
}
