// crash-sample-swift KIND [--context CONTEXT] [--chain CHAIN] [--main-waits WAIT]
//
// --main-waits: the crash comes 100 ms later in CONTEXT while the main thread waits once in
// WAIT (sample_main_wait's list, or dispatchMain) and then ends the program with exit(0).
//
// Crashes on request, for the crash-test harness. Installs CrashCapture first when
// CRASHCAPTURE_DIR is set; without it the same crash runs uncaptured (the baseline).
import CrashCapture
import CrashSampleSupport
import Dispatch
import Foundation
import Logging

#if canImport(Glibc)
    import Glibc
#endif
#if HTTPUpload
    import CrashCaptureNIO
    import NIOCore
    import NIOPosix
#endif

final class Victim {
    var value = 1
}

struct SampleError: Error {}

@inline(never) @_optimize(none) func opaque<T>(_ value: T) -> T { value }

@inline(never) @_optimize(none) func crashSwiftFatalError() -> Never { fatalError("sample fatal error") }

@inline(never) @_optimize(none) func crashSwiftForceUnwrap() -> Int {
    let missing: Int? = opaque(nil)
    return missing!
}

@inline(never) @_optimize(none) func crashSwiftArrayIndex() -> Int {
    let values = [1, 2, 3]
    return values[opaque(5)]
}

@inline(never) @_optimize(none) func crashSwiftIntegerOverflow() -> Int { Int.max + opaque(1) }

@inline(never) @_optimize(none) func crashSwiftDivideByZero() -> Int { 42 / opaque(0) }

@inline(never) @_optimize(none) func crashSwiftPrecondition() { precondition(opaque(false), "sample precondition") }

@inline(never) @_optimize(none) func throwSample() throws -> Int { throw SampleError() }

@inline(never) @_optimize(none) func crashSwiftTryBang() -> Int { try! throwSample() }

@inline(never) @_optimize(none) func crashSwiftUnowned() -> Int {
    var strong: Victim? = Victim()
    unowned let weakling = strong!
    strong = opaque(nil)
    _ = strong
    return weakling.value
}

@inline(never) @_optimize(none) func crashSwiftNullRead() -> Int {
    UnsafePointer<Int>(bitPattern: opaque(0x10))!.pointee
}

@inline(never) @_optimize(none) func crashSwiftRecursion(_ depth: Int) -> Int {
    var pad = (depth, depth, depth, depth, depth, depth, depth, depth)
    // Always true: a path that returns, as far as the compiler can tell, keeps this deliberate
    // overflow from being warned about as an infinite recursion.
    if opaque(true) { pad.0 = crashSwiftRecursion(depth + 1) }
    return pad.0 + pad.7
}

/// Pipeline kinds: N events tracked, then an ending. They exercise the event store, the
/// lifecycle events and the uploader in a real process.
func runPipelineKind(_ kind: String, count: Int) -> Bool {
    func trackAll() {
        for index in 0..<count {
            try! CrashCapture.track("sample_event", properties: ["index": .int(index), "kind": .string(kind)])
        }
    }
    switch kind {
    case "pipeline-track":
        trackAll()
    case "pipeline-stream":
        // Slowly enough that uploads happen while events are still being tracked.
        for index in 0..<count {
            try! CrashCapture.track("sample_event", properties: ["index": .int(index)])
            if index % 50 == 49 { usleep(2000) }
        }
    case "pipeline-wait":
        trackAll()
        CrashCapture.flush(timeout: .seconds(5))
        FileHandle.standardOutput.write(Data("ready\n".utf8))
        while true { sleep(10) }
    case "pipeline-crash":
        trackAll()
        CrashCapture.flush(timeout: .seconds(5))
        _ = crashSwiftNullRead()
    case "pipeline-crash-unwritable":
        // The report cannot be written (a file-size limit of 1 KiB, hard, lowered after
        // install): only the session file, made at install, can tell of the crash.
        trackAll()
        CrashCapture.flush(timeout: .seconds(5))
        var limit = rlimit(rlim_cur: 1024, rlim_max: 1024)
        setrlimit(__rlimit_resource_t(RLIMIT_FSIZE.rawValue), &limit)
        _ = crashSwiftNullRead()
    case "pipeline-login":
        try! CrashCapture.login("user-42")
        trackAll()
    case "pipeline-login-crash":
        trackAll()
        try! CrashCapture.login("user-42")
        trackAll()
        _ = crashSwiftNullRead()
    case "pipeline-crash-now":
        // No flush: the events are only in the journal when the crash comes.
        trackAll()
        _ = crashSwiftNullRead()
    case "pipeline-storm":
        trackUntilKilled()
    case "pipeline-burst":
        trackBurst(count)
    case "pipeline-notes-crash":
        // Context, breadcrumbs and an attached log (CRASH_SAMPLE_LOG) among tracked events,
        // then a crash.
        do {
            try CrashCapture.setContext("order_id", "A-17")
            try CrashCapture.setContext("tier", .int(3))
            try CrashCapture.setContext("gone", "x")
            try CrashCapture.setContext("gone", nil)
            if let log = ProcessInfo.processInfo.environment["CRASH_SAMPLE_LOG"] {
                try CrashCapture.attachFile(log, maxBytes: 1000)
            }
        } catch {
            fail("notes refused: \(error)")
        }
        // A few milliseconds apart: the report puts events and breadcrumbs in time order.
        try! CrashCapture.track("before_cart")
        usleep(5000)
        CrashCapture.addBreadcrumb("opened cart")
        usleep(5000)
        try! CrashCapture.track("after_cart")
        usleep(5000)
        CrashCapture.addBreadcrumb("paid")
        _ = crashSwiftNullRead()
    case "pipeline-last-run":
        // How the previous run ended, as one JSON line; then a crash when asked.
        let last = CrashCapture.lastRun
        let object: [String: Any] = [
            "crashed": last?.crashed ?? false, "signal": last?.signal ?? "", "title": last?.title ?? "",
            "consecutive": last?.consecutiveCrashes ?? -1,
        ]
        let line = try! JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])
        FileHandle.standardOutput.write(line + Data("\n".utf8))
        if ProcessInfo.processInfo.environment["CRASH_SAMPLE_CRASH_AFTER"] != nil { _ = crashSwiftNullRead() }
    case "pipeline-install-twice":
        // The crash file's path (absolute, whatever CRASHCAPTURE_DIR was), then a second install
        // with another directory, which must be refused.
        print("crash file \(CrashCapture.crashFilePath ?? "none")")
        let directory = ProcessInfo.processInfo.environment["CRASHCAPTURE_DIR"]! + "-other"
        do {
            try CrashCapture.install(.init(directory: directory, appName: "other", appVersion: "2"))
            print("second install accepted")
        } catch {
            print("second install refused: \(error)")
        }
    case "pipeline-static-key":
        // A tracked property named as a static property (sample_kind) would give the event's
        // properties one key twice, and the collector refuses the whole batch for it.
        do {
            try CrashCapture.track("sample_event", properties: ["sample_kind": .string("again")])
            print("static key accepted")
        } catch {
            print("static key refused: \(error)")
        }
        try! CrashCapture.track("sample_event", properties: ["own_key": .string("kept")])
    case "pipeline-fork":
        // The child's events must not land in the parent's journal: they are dropped there.
        trackAll()
        let child = sample_fork()
        if child == 0 {
            trackAll()
            let dropped = CrashCapture.droppedBeforeStore
            _exit(dropped == count ? 0 : 3)
        }
        var status: Int32 = 0
        waitpid(child, &status, 0)
        trackAll()
        FileHandle.standardOutput.write(Data("child wait status \(status)\n".utf8))
    case "pipeline-oom":
        trackAll()
        FileHandle.standardOutput.write(Data("ready\n".utf8))
        var hoard: [UnsafeMutableRawPointer] = []
        while true {
            // Touched, so the pages count against the memory cgroup until the OOM killer acts.
            let block = malloc(1 << 20)!
            memset(block, 0x5a, 1 << 20)
            hoard.append(block)
        }
    default:
        return false
    }
    return true
}

/// The disk this live process holds in the capture directory (its session and crash files), then
/// `count` events from four threads as fast as they can, then the flush: one JSON line with the
/// disk in bytes, the events dropped, and one thread's track() latencies (p99, ns).
func trackBurst(_ count: Int) {
    let directory = ProcessInfo.processInfo.environment["CRASHCAPTURE_DIR"]!
    var disk = 0
    for name in (try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? []
    where name.hasPrefix("session-") || name.hasPrefix("crash-") {
        var info = stat()
        if stat(directory + "/" + name, &info) == 0 { disk += Int(info.st_blocks) * 512 }
    }
    let group = DispatchGroup()
    let latencies = UnsafeMutablePointer<UInt64>.allocate(capacity: count / 4)
    let address = UInt(bitPattern: latencies)
    for thread in 0..<4 {
        group.enter()
        Thread {
            let latencies = UnsafeMutablePointer<UInt64>(bitPattern: address)!
            var clock = timespec()
            for index in 0..<(count / 4) {
                clock_gettime(CLOCK_MONOTONIC, &clock)
                let start = UInt64(clock.tv_sec) * 1_000_000_000 + UInt64(clock.tv_nsec)
                try! CrashCapture.track("burst_event", properties: ["thread": .int(thread), "index": .int(index)])
                if thread == 0 {
                    clock_gettime(CLOCK_MONOTONIC, &clock)
                    latencies[index] = UInt64(clock.tv_sec) * 1_000_000_000 + UInt64(clock.tv_nsec) - start
                }
            }
            group.leave()
        }.start()
    }
    group.wait()
    let sorted = UnsafeMutableBufferPointer(start: latencies, count: count / 4).sorted()
    let p99 = sorted.isEmpty ? 0 : sorted[sorted.count * 99 / 100]
    CrashCapture.flush(timeout: .seconds(60))
    FileHandle.standardOutput.write(
        Data("{\"disk\":\(disk),\"dropped\":\(CrashCapture.droppedBeforeStore),\"p99_ns\":\(p99)}\n".utf8))
}

/// Four threads track numbered events until the process is killed (at most 24,000 each, then
/// they wait for the kill). After each track() returns,
/// the thread's count in CRASH_SAMPLE_ACK_FILE (five little-endian Int64, mapped shared) says so,
/// and the fifth is `droppedBeforeStore`: the test knows which events the library accepted,
/// whenever the kill comes.
func trackUntilKilled() -> Never {
    guard let path = ProcessInfo.processInfo.environment["CRASH_SAMPLE_ACK_FILE"] else {
        fail("pipeline-storm needs CRASH_SAMPLE_ACK_FILE")
    }
    let fd = open(path, O_RDWR | O_CREAT, 0o600)
    guard fd >= 0, ftruncate(fd, 40) == 0,
        let mapped = mmap(nil, 40, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0), mapped != MAP_FAILED
    else { fail("cannot map \(path)") }
    let address = UInt(bitPattern: mapped)
    for thread in 0..<4 {
        Thread {
            let counts = UnsafeMutablePointer<Int64>(bitPattern: address)!
            var index = 0
            // At most 24,000 each: four threads stay under the store's cap of 100,000 events,
            // past which the oldest are dropped (a fast machine reached 102,000 before the kill).
            while index < 24_000 {
                try! CrashCapture.track(
                    "storm_event", properties: ["thread": .int(thread), "index": .int(index), "pad": "0123456789"])
                index += 1
                counts[4] = Int64(CrashCapture.droppedBeforeStore)
                counts[thread] = Int64(index)
            }
            while true { sleep(10) }
        }.start()
    }
    FileHandle.standardOutput.write(Data("ready\n".utf8))
    while true { sleep(10) }
}

// Three async calls deep, each suspending first: once resumed, a caller's frame is on no stack,
// only in the task's async context chain.
@inline(never) func asyncLevel3() async -> Int {
    await Task.yield()
    return crashSwiftNullRead()
}

@inline(never) func asyncLevel2() async -> Int {
    await Task.yield()
    return await asyncLevel3() + opaque(1)
}

@inline(never) func asyncLevel1() async -> Int {
    await Task.yield()
    return await asyncLevel2() + opaque(1)
}

// A task that runs (spins) three async calls deep while the main thread crashes: its thread's
// report shows the task's [async] callers too.
nonisolated(unsafe) var spinning = true
@inline(never) func spinLevel3() async -> Int {
    await Task.yield()
    // Blocked in the kernel, still inside the task: the thread's stack shows it mid-call.
    while opaque(spinning) { usleep(1000) }
    return 0
}

@inline(never) func spinLevel2() async -> Int {
    await Task.yield()
    return await spinLevel3() + opaque(1)
}

@inline(never) func spinLevel1() async -> Int {
    await Task.yield()
    return await spinLevel2() + opaque(1)
}

let swiftKindNames = [
    "swift-fatal-error", "swift-force-unwrap", "swift-array-index", "swift-integer-overflow", "swift-divide-by-zero",
    "swift-precondition", "swift-try-bang", "swift-unowned", "swift-null-read", "swift-stack-overflow",
]

func runSwiftKind(_ name: String) -> Bool {
    switch name {
    case "swift-fatal-error": crashSwiftFatalError()
    case "swift-force-unwrap": _ = crashSwiftForceUnwrap()
    case "swift-array-index": _ = crashSwiftArrayIndex()
    case "swift-integer-overflow": _ = crashSwiftIntegerOverflow()
    case "swift-divide-by-zero": _ = crashSwiftDivideByZero()
    case "swift-precondition": crashSwiftPrecondition()
    case "swift-try-bang": _ = crashSwiftTryBang()
    case "swift-unowned": _ = crashSwiftUnowned()
    case "swift-null-read": _ = crashSwiftNullRead()
    case "swift-stack-overflow": _ = crashSwiftRecursion(0)
    case "swift-async-other-task":
        Task.detached(name: "spinner") { _ = await spinLevel1() }
        usleep(200_000)
        _ = crashSwiftNullRead()
    case "swift-async-deep":
        let done = DispatchSemaphore(value: 0)
        Task.detached(name: "checkout-flow") {
            _ = await asyncLevel1()
            done.signal()
        }
        done.wait()
    default: return false
    }
    return true
}

func allKinds() -> [String] {
    var names =
        swiftKindNames + [
            "pipeline-track", "pipeline-stream", "pipeline-wait", "pipeline-crash", "pipeline-crash-unwritable",
            "pipeline-login", "pipeline-crash-now", "pipeline-storm", "pipeline-burst", "pipeline-install-twice",
            "pipeline-static-key", "pipeline-notes-crash",
            "pipeline-last-run", "pipeline-login-crash", "swift-async-deep", "swift-async-other-task",
            "pipeline-oom",
            "pipeline-fork", "hang-nio", "hang-continuation", "hang-main-queue", "hang-watch-reuse",
            "hang-watch-thread-ended", "hang-in-task",
        ]
    var index: Int32 = 0
    while let name = sample_c_kind_at(index) {
        names.append(String(cString: name))
        index += 1
    }
    return names
}

/// A request handler that makes a synchronous call on its event loop: the hang a watch catches.
@inline(never) @_optimize(none) func handleRequestBlockingInSleep(milliseconds: Int) {
    usleep(useconds_t(milliseconds * 1000))
}

/// A task's work that makes a synchronous call two async calls deep: the thread running the
/// task is what hangs, and its report carries the task's [async] callers and name.
@inline(never) func ingestLevel2(milliseconds: Int) async -> Int {
    handleRequestBlockingInSleep(milliseconds: milliseconds)
    return opaque(milliseconds)
}

@inline(never) func ingestLevel1(milliseconds: Int) async -> Int {
    let result = await ingestLevel2(milliseconds: milliseconds)
    return opaque(result) + 1
}

/// Work on the main queue that takes too long.
@inline(never) @_optimize(none) func blockTheMainQueue(milliseconds: Int) {
    usleep(useconds_t(milliseconds * 1000))
}

/// Sync-over-async: the calling thread waits for a task that awaits a continuation nobody
/// resumes. The task is suspended on no thread; the waiting thread is what hangs.
@inline(never) @_optimize(none) func waitForTaskAnswer() {
    let answered = DispatchSemaphore(value: 0)
    Task.detached {
        await withCheckedContinuation { (_: CheckedContinuation<Void, Never>) in }
        answered.signal()
    }
    answered.wait()
}

/// hang-nio: a SwiftNIO event loop blocked by a handler that sleeps (CRASH_SAMPLE_HANG_MS,
/// 3 s), then running on until its hang has ended; hang-continuation: the main thread waits
/// forever (the harness kills it).
func runHangKind(_ kind: String, thresholdMilliseconds: Int, hangMilliseconds: Int) {
    let threshold = Duration.milliseconds(thresholdMilliseconds)
    switch kind {
    case "hang-nio":
        #if HTTPUpload
            let group = MultiThreadedEventLoopGroup(numberOfThreads: 2)
            let watches = group.watchEventLoops(threshold: threshold, name: "nio-loop")
            usleep(100_000)
            let loop = group.next()
            print("blocking an event loop")
            try? loop.submit { handleRequestBlockingInSleep(milliseconds: hangMilliseconds) }.wait()
            usleep(useconds_t(3 * thresholdMilliseconds * 1000))
            watches.stop()
            CrashCapture.flush()
            print("loop unblocked")
        #else
            fail("this build has no SwiftNIO (the HTTPUpload trait brings it)")
        #endif
    case "hang-main-queue":
        let watch = CrashCapture.watchMainQueue(threshold: threshold)
        DispatchQueue.main.asyncAfter(deadline: .now() + .milliseconds(200)) {
            blockTheMainQueue(milliseconds: hangMilliseconds)
        }
        DispatchQueue.main.asyncAfter(
            deadline: .now() + .milliseconds(200 + hangMilliseconds + 3 * thresholdMilliseconds)
        ) {
            watch.stop()
            CrashCapture.flush()
            exit(0)
        }
        // RunLoop, not dispatchMain(): on Linux dispatchMain() ends the main thread and the main
        // queue runs on whichever worker is free, so no one thread is the queue's.
        RunLoop.main.run()
    case "hang-in-task":
        let done = DispatchSemaphore(value: 0)
        Task.detached(name: "ingest-loop") {
            let watch = CrashCapture.watch(name: "ingest", threshold: threshold)
            for _ in 0..<10 {
                watch.beat()
                usleep(10_000)
            }
            _ = await ingestLevel1(milliseconds: hangMilliseconds)
            for _ in 0..<(3 * thresholdMilliseconds / 10) {
                watch.beat()
                usleep(10_000)
            }
            watch.stop()
            done.signal()
        }
        done.wait()
        CrashCapture.flush()
    case "hang-watch-thread-ended":
        // Beaten only from a thread that then ends, never stopped: no hang of "thread 0" is
        // reported; the watch is no longer checked, which is logged once.
        let watch = CrashCapture.watch(name: "orphan", threshold: threshold)
        let beater = Thread {
            for _ in 0..<3 {
                watch.beat()
                usleep(10_000)
            }
        }
        beater.start()
        usleep(useconds_t(6 * thresholdMilliseconds * 1000))
        withExtendedLifetime(watch) {}
        CrashCapture.flush()
    case "hang-watch-reuse":
        // A watch stopped, then released after another took its slot: the other stays watched.
        var first: HangWatch? = CrashCapture.watch(name: "first", threshold: threshold)
        first?.stop()
        let second = CrashCapture.watch(name: "second", threshold: threshold)
        first = nil
        usleep(useconds_t(4 * thresholdMilliseconds * 1000))
        withExtendedLifetime(second) {}
        CrashCapture.flush()
    case "hang-continuation":
        let watch = CrashCapture.watch(name: "main", threshold: threshold)
        for _ in 0..<10 {
            watch.beat()
            usleep(10_000)
        }
        print("waiting for a task")
        waitForTaskAnswer()
    default:
        fail("unknown hang kind \(kind)")
    }
}

func run(_ kind: String) {
    if !runSwiftKind(kind) && sample_run_c_kind(kind) == 0 {
        FileHandle.standardError.write("unknown kind \(kind); --list shows them\n".data(using: .utf8)!)
        exit(64)
    }
}

// A named function, not a closure: closures in top-level code are main-actor isolated, and
// the runtime traps when one runs on a plain pthread.
func runNamedKind(_ name: UnsafePointer<CChar>?) { run(String(cString: name!)) }

func fail(_ message: String) -> Never {
    FileHandle.standardError.write((message + "\n").data(using: .utf8)!)
    exit(64)
}

var arguments = Array(CommandLine.arguments.dropFirst())
if arguments.first == "--can-upload" {
    // False when built without the package trait HTTPUpload.
    print(CrashCapture.canUpload)
    exit(0)
}
if arguments.first == "--has-nio" {
    #if HTTPUpload
        print("yes")
    #else
        print("no")
    #endif
    exit(0)
}
if arguments.first == "--build-config" {
    #if DEBUG
        print("debug")
    #else
        print("release")
    #endif
    exit(0)
}
if arguments.first == "--list" {
    print(allKinds().joined(separator: "\n"))
    exit(0)
}
guard let kind = arguments.first else {
    fail("usage: crash-sample-swift KIND [--context main|pthread|dispatch|thread|task] [--chain CHAIN]")
}
var context = "main"
var chain = "none"
var mainWaits: String?
var index = 1
while index < arguments.count {
    switch arguments[index] {
    case "--context" where index + 1 < arguments.count: context = arguments[index + 1]
    case "--chain" where index + 1 < arguments.count: chain = arguments[index + 1]
    case "--main-waits" where index + 1 < arguments.count: mainWaits = arguments[index + 1]
    default: fail("unexpected argument \(arguments[index])")
    }
    index += 2
}
guard allKinds().contains(kind) else { fail("unknown kind \(kind); --list shows them") }

let chainedSignals = [SIGSEGV, SIGABRT, SIGBUS, SIGILL, SIGFPE, SIGTRAP]
switch chain {
case "none": break
case "previous-siginfo": chainedSignals.forEach { sample_install_previous_siginfo_handler($0) }
case "previous-plain": chainedSignals.forEach { sample_install_previous_plain_handler($0) }
case "ignore": chainedSignals.forEach { signal($0, SIG_IGN) }
case "after-capture": break
default: fail("unknown chain \(chain): none, previous-siginfo, previous-plain, ignore, after-capture")
}

let environment = ProcessInfo.processInfo.environment
if let directory = environment["CRASHCAPTURE_DIR"] {
    // The library reports through swift-log; this app wants its diagnostics on stderr.
    LoggingSystem.bootstrap(StreamLogHandler.standardError)
    var upload = UploadOptions()
    // Tests shorten the retry and exit delays; the defaults are the product's.
    if let base = environment["CRASH_SAMPLE_RETRY_BASE"].flatMap(Double.init) { upload.retryBaseDelay = .seconds(base) }
    if let exit = environment["CRASH_SAMPLE_EXIT_FLUSH"].flatMap(Double.init) {
        upload.exitFlushTimeout = .seconds(exit)
    }
    if let timeout = environment["CRASH_SAMPLE_REQUEST_TIMEOUT"].flatMap(Double.init) {
        upload.requestTimeout = .seconds(timeout)
    }
    var configuration = CrashCapture.Configuration(
        directory: directory, appName: "crash-sample-swift", appVersion: "1.0.0",
        staticProperties: ["sample_kind": .string(kind), "sample_context": .string(context)],
        upload: upload,
        journalBytes: environment["CRASH_SAMPLE_JOURNAL_BYTES"].flatMap { Int($0) }
            ?? CrashCapture.Configuration(directory: "", appName: "", appVersion: "").journalBytes)
    // OpenTelemetry logs instead of the Sensors format, through the Configuration setting.
    configuration.otlpURL = environment["CRASH_SAMPLE_OTLP_URL"].flatMap { URL(string: $0) }
    do {
        try CrashCapture.install(configuration)
    } catch {
        fail("crash capture not installed: \(error)")
    }
}
if chain == "after-capture" { chainedSignals.forEach { sample_install_handler_after_capture($0) } }
let sampleKind = kind
if kind.hasPrefix("hang-") {
    runHangKind(
        kind, thresholdMilliseconds: environment["CRASH_SAMPLE_HANG_THRESHOLD_MS"].flatMap { Int($0) } ?? 500,
        hangMilliseconds: environment["CRASH_SAMPLE_HANG_MS"].flatMap { Int($0) } ?? 3000)
    exit(0)
}
if kind.hasPrefix("pipeline-") {
    let count = Int(environment["CRASH_SAMPLE_EVENTS"] ?? "10") ?? 10
    _ = runPipelineKind(kind, count: count)
    exit(0)
}
/// CRASH_SAMPLE_CRASH_TIME=1: CLOCK_MONOTONIC in ns on stdout just before the crash, so that a
/// benchmark can time the crash alone, apart from the program's start.
@Sendable func markCrashTime() {
    guard getenv("CRASH_SAMPLE_CRASH_TIME") != nil else { return }
    var now = timespec()
    clock_gettime(CLOCK_MONOTONIC, &now)
    let line = "crash-at-ns \(Int64(now.tv_sec) * 1_000_000_000 + Int64(now.tv_nsec))\n"
    _ = line.withCString { write(1, $0, strlen($0)) }
}

// CRASH_SAMPLE_DISPATCH_WORKERS=N: N Dispatch workers parked before the crash, as a server's are.
if let workers = environment["CRASH_SAMPLE_DISPATCH_WORKERS"].flatMap(Int.init), workers > 0 {
    let parked = DispatchGroup()
    for _ in 0..<workers {
        parked.enter()
        DispatchQueue.global().async {
            parked.leave()
            while true { sleep(3600) }
        }
    }
    parked.wait()
}
if let mainWaits {
    // Long enough for the main thread to be inside its wait.
    let settle: useconds_t = 100_000
    switch context {
    case "pthread": sample_start_crash_later(runNamedKind, strdup(kind))  // read 100 ms later
    case "dispatch": DispatchQueue.global().asyncAfter(deadline: .now() + .milliseconds(100)) { run(sampleKind) }
    case "thread":
        let thread = Thread {
            usleep(settle)
            run(sampleKind)
        }
        thread.stackSize = 1 << 20
        thread.start()
    case "task":
        Task.detached {
            usleep(settle)
            run(sampleKind)
        }
    default: fail("--main-waits needs a context other than main: pthread, dispatch, thread, task")
    }
    if mainWaits == "dispatchMain" { dispatchMain() }
    if mainWaits == "nio-wait" {
        // A server's main thread: waiting on a future of its event loop, whose thread sits in
        // epoll_wait.
        #if HTTPUpload
            let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
            // A name of its own: NIO numbers its loops' threads by group, and the SDK may have one.
            try? group.next().submit { sample_name_this_thread("nio-loop") }.wait()
            let never = group.next().makePromise(of: Void.self)
            try? never.futureResult.wait()
            exit(0)
        #else
            fail("this build has no SwiftNIO (the HTTPUpload trait brings it)")
        #endif
    }
    guard sample_main_wait(mainWaits) == 0 else { fail("unknown wait \(mainWaits)") }
    exit(0)
}
switch context {
case "main":
    run(kind)
case "pthread":
    sample_on_pthread(runNamedKind, kind)
case "dispatch":
    DispatchQueue.global().async {
        markCrashTime()
        run(sampleKind)
    }
    dispatchMain()
case "thread":
    let thread = Thread { run(sampleKind) }
    thread.stackSize = 1 << 20
    thread.start()
    while true { sleep(10) }
case "task":
    Task.detached { run(sampleKind) }
    while true { sleep(10) }
default:
    fail("unknown context \(context): main, pthread, dispatch, thread, task")
}
// A kind that did not crash (a sent signal that was ignored, say) ends normally.
print("survived \(kind)")
exit(0)
