import CrashCapture
import CrashCaptureCollector
import CrashFileFormat
import CrashSymbolication
import Foundation
import ProcessSupport

#if canImport(Glibc)
    import Glibc
#endif

/// The writer's half alone: rows shaped as the journal hands them over, into a new store.
func writerAlone(events: Int, directory: String) throws -> Double {
    unlink(directory + "/writer.sqlite")
    unlink(directory + "/writer.sqlite-wal")
    let rows = (0..<events).map { index -> ([UInt8], [UInt8]) in
        let id = "0123456789abcdef0123456789abcdef-" + String(1_000_000_000_000 + index).dropFirst()
        let payload =
            "{\"type\":\"track\",\"event\":\"bench_event\",\"time\":1795394899135,\"event_id\":\"\(id)\",\"lib\":{\"$lib_method\":\"code\",\u{1},\"thread\":\(index % 4),\"index\":\(index),\"screen\":\"checkout\"}}"
        return (Array(id.utf8), Array(payload.utf8))
    }
    let writerStore = try EventStore(
        path: directory + "/writer.sqlite", limits: .init(maximumEvents: events * 2, maximumBytes: 4 << 30))
    let writerStart = monotonic()
    for chunk in stride(from: 0, to: rows.count, by: 8192) {
        let part = rows[chunk..<min(rows.count, chunk + 8192)]
        try withRawRows(Array(part)) { raw in
            _ = try writerStore.insert(
                raw: raw, context: "\"$lib\":\"x\"},\"properties\":{\"$pid\":1",
                mark: .init(sessionID: "bench", position: UInt64(chunk), distinctID: "d", loginID: nil))
        }
    }
    let writerRate = Double(rows.count) / (Double(monotonic() - writerStart) / 1e9)
    return writerRate
}

/// Hands `rows` to `body` as the raw byte views the journal's writer binds.
func withRawRows(_ rows: [([UInt8], [UInt8])], _ body: ([EventStore.RawRow]) throws -> Void) throws {
    var raw: [EventStore.RawRow] = []
    var pinned: [UnsafeMutableRawBufferPointer] = []
    defer { pinned.forEach { $0.deallocate() } }
    for (id, payload) in rows {
        let idCopy = UnsafeMutableRawBufferPointer.allocate(byteCount: id.count, alignment: 1)
        idCopy.copyBytes(from: id)
        let payloadCopy = UnsafeMutableRawBufferPointer.allocate(byteCount: payload.count, alignment: 1)
        payloadCopy.copyBytes(from: payload)
        pinned += [idCopy, payloadCopy]
        raw.append((UnsafeRawBufferPointer(idCopy), UnsafeRawBufferPointer(payloadCopy)))
    }
    try body(raw)
}

/// The journal seen from the next start, and what keeping a session's last-alive time costs.
func journalBenchmarks(idleSeconds: Int) throws {
    let sample = buildDirectory + "/crash-sample-swift"
    // A full default journal: a storm killed long after the ring first filled, its header then
    // told that nothing was stored, so the next start reads every entry the ring holds.
    let directory = temporaryDirectory()
    let ackFile = directory + ".ack"
    let storm = try ChildProcess(
        path: sample, arguments: ["pipeline-storm"],
        environment: ["CRASHCAPTURE_DIR": directory, "CRASH_SAMPLE_ACK_FILE": ackFile])
    _ = storm.waitForOutput("ready")
    usleep(1_500_000)
    kill(storm.pid, SIGKILL)
    _ = storm.wait(timeout: 20)
    unlink(ackFile)
    let name = try FileManager.default.contentsOfDirectory(atPath: directory).first {
        SessionFile.isSessionFileName($0)
    }!
    let path = directory + "/" + name
    let fd = open(path, O_RDWR)
    var reserved: UInt64 = 0
    _ = pread(fd, &reserved, 8, 80)
    var ring: UInt64 = 0
    _ = pread(fd, &ring, 8, 16)
    var unconsumed = reserved > ring ? reserved - ring : 0
    _ = pwrite(fd, &unconsumed, 8, 88)
    close(fd)
    try? FileManager.default.removeItem(atPath: directory + "/events.sqlite")
    let store = try EventStore(path: directory + "/events.sqlite")
    let recovery = SessionRecovery(replayer: CrashReplayer(directory: directory, store: store))
    let start = monotonic()
    let result = recovery.recover(path)
    let seconds = Double(monotonic() - start) / 1e9
    print("## The journal at the next start\n")
    print("| | value |")
    print("|---|---|")
    print("| default journal size | \(ring >> 20) MiB (\(Int(ring) / 1024) KiB on disk, reserved at install) |")
    print(
        "| recovering a full journal: \(result.importedEvents) events imported, session closed (\(result.endReason ?? "-")) | \(format(seconds * 1000, 1)) ms |"
    )

    // An installed app that does nothing: the writer's 2 s timer is the only thing that wakes.
    let idle = try ChildProcess(
        path: sample, arguments: ["pipeline-wait"],
        environment: ["CRASHCAPTURE_DIR": temporaryDirectory(), "CRASH_SAMPLE_EVENTS": "0"])
    _ = idle.waitForOutput("ready")
    sleep(3)
    let before = (
        cpu: processCPUNanoseconds(idle.pid), switches: contextSwitches(idle.pid), threads: threadCount(idle.pid)
    )
    sleep(UInt32(idleSeconds))
    let after = (
        cpu: processCPUNanoseconds(idle.pid), switches: contextSwitches(idle.pid), threads: threadCount(idle.pid)
    )
    kill(idle.pid, SIGKILL)
    _ = idle.wait(timeout: 20)
    let cpuPerHour = Double(after.cpu - before.cpu) / 1e9 * 3600 / Double(idleSeconds)
    print(
        "| idle app, \(idleSeconds) s: context switches of all its threads (the 2 s timer wakes libdispatch's timer thread, then the writer) | \(format(Double(after.switches - before.switches) / Double(idleSeconds), 2)) per second |"
    )
    print(
        "| idle app: CPU per idle hour, all its threads | \(format(cpuPerHour * 1000, 0)) ms |"
    )
    print(
        "| idle app: threads before / after (no thread of the journal's own) | \(before.threads) / \(after.threads) |\n"
    )
}
