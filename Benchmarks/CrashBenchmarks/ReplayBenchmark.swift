import CrashCapture
import CrashCaptureCollector
import CrashFileFormat
import CrashSymbolication
import Foundation
import ProcessSupport

#if canImport(Glibc)
    import Glibc
#endif

/// Replay of many crash files (64-frame stacks) into a store, and symbolication throughput.
func replayBenchmarks(files: Int) throws {
    let sample = buildDirectory + "/crash-sample-c"
    let source = temporaryDirectory()
    _ = try timedRun(sample, ["deep-stack-64"], ["CRASHCAPTURE_DIR": source, "SWIFT_BACKTRACE": "enable=no"])
    guard
        let template = try FileManager.default.contentsOfDirectory(atPath: source).first(where: { $0.hasSuffix(".ccr") }
        )
    else { throw CrashCaptureError.io("the sample left no crash file") }
    let contents = try CrashFileReader.read(path: source + "/" + template)
    let report = CrashReport(path: template, contents: contents)
    guard let session = report.session?["session_id"] as? String,
        let time = (report.events.first?["time"] as? NSNumber)?.int64Value
    else { throw CrashCaptureError.corrupt("no session or time") }
    print("## Replay (\(files) crash files, \(report.frames.count) frames each)\n")
    print("| | time |")
    print("|---|---|")
    // One crash site crashing at every start (all but the first five imported compact), and
    // crashes two hours apart (every stack kept: the most work per file).
    for (label, spacing) in [("a crash loop (one site, one time)", Int64(0)), ("crashes 2 h apart", 7_200_000)] {
        let directory = temporaryDirectory()
        // Copies of one real crash, each under its own session id (so its own event ids), re-framed.
        for index in 0..<files {
            let fresh = String(format: "%032x", index + 1)
            var file = [UInt8]()
            for record in contents.records {
                let payload = Array(
                    String(decoding: record.payload, as: UTF8.self).replacingOccurrences(of: session, with: fresh)
                        .replacingOccurrences(of: "\"time\":\(time)", with: "\"time\":\(time + Int64(index) * spacing)")
                        .utf8)
                var header = [UInt8]("CCR1".utf8)
                for value in [record.type.rawValue, UInt32(payload.count)] {
                    header += [
                        UInt8(value & 0xff), UInt8(value >> 8 & 0xff), UInt8(value >> 16 & 0xff), UInt8(value >> 24),
                    ]
                }
                let crc = CRC32.update(CRC32.update(0, header[4..<12]), payload)
                header += [UInt8(crc & 0xff), UInt8(crc >> 8 & 0xff), UInt8(crc >> 16 & 0xff), UInt8(crc >> 24)]
                file += header + payload
            }
            let path = directory + "/crash-\(fresh).ccr"
            try Data(file).write(to: URL(fileURLWithPath: path))
            // The rest of the space a crash file reserves reads as zeros.
            truncate(path, 256 * 1024)
        }
        // Crash files reach replay already on disk (the handler fdatasyncs them): the copies are
        // flushed before timing, or their writeback would be timed as replay.
        sync()
        let store = try EventStore(
            path: directory + "/events.sqlite", limits: .init(maximumEvents: files * 4, maximumBytes: 8 << 30))
        let start = monotonic()
        let summary = CrashReplayer(directory: directory, store: store).replayAll()
        let seconds = Double(monotonic() - start) / 1e9
        for file in summary.files where file.outcome != .imported {
            print("not imported: \(file.path): \(file.outcome.rawValue) \(file.problems)")
        }
        let compact = try store.events(limit: files * 4).filter { $0.payload.contains("\"crash_compact\":true") }.count
        print(
            "| \(label): \(summary.count(.imported)) imported, \(summary.importedEvents) events, \(compact) compact "
                + "| \(format(seconds, 2)) s (\(format(Double(files) / seconds, 0)) files/s) |")
    }

    // Symbolication: first frame of each module reads its image; after that, lookups only.
    let symbolicator = Symbolicator()
    let firstStart = monotonic()
    _ = symbolicator.symbolicate(report)
    let first = Double(monotonic() - firstStart) / 1e6
    let rounds = 2000
    let warmStart = monotonic()
    var named = 0
    for _ in 0..<rounds { named += symbolicator.symbolicate(report).filter { $0.function != nil }.count }
    let warm = Double(monotonic() - warmStart) / 1e9
    let frames = Double(rounds * report.frames.count)
    print(
        "| symbolication, first report (reads \(Set(report.frames.compactMap(\.module)).count) modules) | \(format(first, 1)) ms |"
    )
    print(
        "| symbolication after that | \(format(frames / warm, 0)) frames/s (\(named / rounds) of \(report.frames.count) frames named) |"
    )
}
