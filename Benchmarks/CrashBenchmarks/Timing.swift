import CrashCapture
import CrashCaptureCollector
import CrashFileFormat
import CrashSymbolication
import Foundation
import ProcessSupport

#if canImport(Glibc)
    import Glibc
#endif

let buildDirectory = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath().deletingLastPathComponent().path

struct Statistics {
    let values: [Double]
    init(_ values: [Double]) { self.values = values.sorted() }
    func percentile(_ p: Double) -> Double {
        guard !values.isEmpty else { return .nan }
        return values[min(values.count - 1, Int((Double(values.count - 1) * p).rounded()))]
    }
    var median: Double { percentile(0.5) }
}

func format(_ value: Double, _ digits: Int = 3) -> String { String(format: "%.\(digits)f", value) }

/// Spawns a program with a clean signal mask, waits with waitpid, and returns its wall time in
/// ms and the signal that ended it. (Foundation's Process polls for the child's end, adding ~50 ms.)
func timedRun(_ path: String, _ arguments: [String], _ environment: [String: String]) throws -> (
    ms: Double, signal: Int32?
) {
    var env = ProcessInfo.processInfo.environment
    env.removeValue(forKey: "CRASHCAPTURE_DIR")
    for (key, value) in environment { env[key] = value }
    let start = DispatchTime.now().uptimeNanoseconds
    let pid = try CleanSpawn.spawn(
        path, arguments: arguments, environment: env, stdout: "/dev/null", stderr: "/dev/null")
    var wait: Int32 = 0
    while waitpid(pid, &wait, 0) < 0 && errno == EINTR {}
    let ms = Double(DispatchTime.now().uptimeNanoseconds - start) / 1e6
    let signaled = (wait & 0x7f) != 0 && (wait & 0x7f) != 0x7f
    return (ms, signaled ? wait & 0x7f : nil)
}

/// From the moment the program says it crashes (`crash-at-ns`, CLOCK_MONOTONIC, on stdout) to its
/// death as the parent sees it: the crash alone, without the program's start.
func timedCrash(_ path: String, _ arguments: [String], _ environment: [String: String]) throws -> (
    ms: Double, signal: Int32?
) {
    var env = ProcessInfo.processInfo.environment
    env.removeValue(forKey: "CRASHCAPTURE_DIR")
    for (key, value) in environment { env[key] = value }
    env["CRASH_SAMPLE_CRASH_TIME"] = "1"
    let output = temporaryDirectory() + "/stdout"
    let pid = try CleanSpawn.spawn(path, arguments: arguments, environment: env, stdout: output, stderr: "/dev/null")
    var wait: Int32 = 0
    while waitpid(pid, &wait, 0) < 0 && errno == EINTR {}
    var now = timespec()
    clock_gettime(CLOCK_MONOTONIC, &now)
    let died = Int64(now.tv_sec) * 1_000_000_000 + Int64(now.tv_nsec)
    let text = (try? String(contentsOfFile: output, encoding: .utf8)) ?? ""
    guard let line = text.split(separator: "\n").first(where: { $0.hasPrefix("crash-at-ns ") }),
        let crashed = Int64(line.dropFirst("crash-at-ns ".count))
    else { throw CrashCaptureError.io("\(path) printed no crash-at-ns: \(text.prefix(200))") }
    let signaled = (wait & 0x7f) != 0 && (wait & 0x7f) != 0x7f
    return (Double(died - crashed) / 1e6, signaled ? wait & 0x7f : nil)
}

/// Every directory made, removed when the benchmarks end: a pipeline run writes hundreds of
/// megabytes, and left behind they would slow the next run's disk.
nonisolated(unsafe) var temporaryDirectories: [String] = []

/// Events shaped like a tracked one as the store keeps it (about 700 bytes), ids in order.
func syntheticEvents(_ count: Int) -> [(id: String, payload: String)] {
    let pad = String(repeating: "0123456789", count: 22)
    return (0..<count).map { index in
        let id = "bench-" + String(format: "%012d", index)
        return (
            id,
            #"{"type":"track","event":"bench_event","time":1795460217041,"event_id":"\#(id)","lib":{"$lib_method":"code","$lib":"CrashCapture","$lib_version":"0.1.0"},"distinct_id":"d-1234567890","properties":{"$app_name":"bench","$app_version":"1.0","$os":"Linux","$os_version":"6.1","$model":"x86_64","$manufacturer":"QEMU","$lib":"CrashCapture","tier":"bench","$session_id":"0d9c0a3e-6a34-4b9f-a0d5-1c8b34d9e2a7","index":\#(index),"label":"row-\#(index)","flag":true,"pad":"\#(pad)"}}"#
        )
    }
}

func temporaryDirectory() -> String {
    let path = NSTemporaryDirectory() + "crashcap-bench-\(UUID().uuidString)"
    try! FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
    temporaryDirectories.append(path)
    return path
}

/// What making a report durable costs on this disk with no handler at all: `bytes` written over
/// blocks already on the disk (as install's zeros are, once written back), then fdatasync, each
/// after 100 ms of work as the crash benchmark's settled runs do. No handler can be faster.
func flushFloor(directory: String, runs: Int, bytes: Int) throws -> [Double] {
    let path = directory + "/floor"
    let fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
    guard fd >= 0 else { throw CrashCaptureError.io("cannot create \(path): \(String(cString: strerror(errno)))") }
    defer {
        close(fd)
        unlink(path)
    }
    let page = [UInt8](repeating: 0x5a, count: 65536)
    guard pwrite(fd, page, page.count, 0) == page.count, fsync(fd) == 0 else {
        throw CrashCaptureError.io("cannot write \(path): \(String(cString: strerror(errno)))")
    }
    sync()
    var times: [Double] = []
    for _ in 0..<runs {
        let workUntil = DispatchTime.now().uptimeNanoseconds + 100_000_000
        while DispatchTime.now().uptimeNanoseconds < workUntil {}
        let start = DispatchTime.now().uptimeNanoseconds
        guard pwrite(fd, page, bytes, 0) == bytes, fdatasync(fd) == 0 else {
            throw CrashCaptureError.io("cannot write \(path): \(String(cString: strerror(errno)))")
        }
        times.append(Double(DispatchTime.now().uptimeNanoseconds - start) / 1e6)
    }
    return times
}

/// Runs a program to its end and returns its stdout.
func output(_ path: String, _ arguments: [String], _ environment: [String: String]) throws -> String {
    try ChildProcess.run(
        path: path, arguments: arguments,
        environment: ProcessInfo.processInfo.environment.merging(environment) { $1 }, timeout: 60
    ).stdout
}

/// Timings gathered by several threads; `@unchecked`: `nanoseconds` is written only under `lock`.
final class Samples: @unchecked Sendable {
    private let lock = NSLock()
    private(set) var nanoseconds: [Double] = []
    func add(_ values: [Double]) {
        lock.lock()
        nanoseconds += values
        lock.unlock()
    }
}

/// User and system time of this process so far.
func processCPUSeconds() -> Double {
    var usage = rusage()
    getrusage(RUSAGE_SELF.rawValue, &usage)
    let total = [usage.ru_utime, usage.ru_stime].map { Double($0.tv_sec) + Double($0.tv_usec) / 1e6 }
    return total[0] + total[1]
}

func monotonic() -> UInt64 {
    var now = timespec()
    clock_gettime(CLOCK_MONOTONIC, &now)
    return UInt64(now.tv_sec) * 1_000_000_000 + UInt64(now.tv_nsec)
}

func procStat(_ pid: Int32) -> [Substring] {
    guard let text = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
        let close = text.lastIndex(of: ")")
    else { return [] }
    return text[text.index(after: close)...].split(separator: " ")
}

/// Nanoseconds on a CPU, all threads together (/proc/PID/task/*/schedstat, first field).
func processCPUNanoseconds(_ pid: Int32) -> Int {
    let tasks = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task")) ?? []
    return tasks.reduce(0) { total, task in
        let text = (try? String(contentsOfFile: "/proc/\(pid)/task/\(task)/schedstat", encoding: .utf8)) ?? ""
        return total + (Int(text.split(separator: " ").first ?? "") ?? 0)
    }
}

func threadCount(_ pid: Int32) -> Int {
    (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task").count) ?? 0
}

/// Voluntary and involuntary context switches of every thread: each wake-up is at least one.
func contextSwitches(_ pid: Int32) -> Int {
    let tasks = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task")) ?? []
    return tasks.reduce(0) { total, task in
        let status = (try? String(contentsOfFile: "/proc/\(pid)/task/\(task)/status", encoding: .utf8)) ?? ""
        return total
            + status.split(separator: "\n").filter { $0.contains("ctxt_switches") }.reduce(0) {
                $0 + (Int($1.split(separator: "\t").last ?? "") ?? 0)
            }
    }
}
