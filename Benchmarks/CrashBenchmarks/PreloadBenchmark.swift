import CrashFileFormat
import Foundation
import ProcessSupport

#if canImport(Glibc)
    import Glibc
#endif

/// The floor for any in-process reporter that makes its report durable: libunwind's walk of
/// the crashing thread, one write of a report the size of ours (8.5 KiB), fdatasync, and the
/// signal raised again. Preloaded like ours, its file opened at load like ours.
let minimalHandlerSource = #"""
    #define _GNU_SOURCE
    #define UNW_LOCAL_ONLY
    #include <fcntl.h>
    #include <libunwind.h>
    #include <signal.h>
    #include <stdio.h>
    #include <stdlib.h>
    #include <string.h>
    #include <unistd.h>

    static int report_fd = -1;
    static char report[8704];

    static void handler(int signo, siginfo_t *info, void *context) {
        unw_cursor_t cursor;
        unw_init_local2(&cursor, (unw_context_t *)context, UNW_INIT_SIGNAL_FRAME);
        size_t at = 0;
        static const char hex[] = "0123456789abcdef";
        do {
            unw_word_t pc = 0;
            unw_get_reg(&cursor, UNW_REG_IP, &pc);
            for (int shift = 60; shift >= 0 && at < sizeof(report) - 1; shift -= 4) report[at++] = hex[(pc >> shift) & 15];
            if (at < sizeof(report) - 1) report[at++] = '\n';
        } while (unw_step(&cursor) > 0 && at < sizeof(report) - 20);
        write(report_fd, report, sizeof(report));
        fdatasync(report_fd);
        signal(signo, SIG_DFL);
        raise(signo);
    }

    __attribute__((constructor)) static void install_minimal_handler(void) {
        char path[4096];
        snprintf(path, sizeof(path), "%s/report-%d", getenv("MINIMAL_HANDLER_DIR"), getpid());
        report_fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        struct sigaction action;
        memset(&action, 0, sizeof(action));
        action.sa_sigaction = handler;
        action.sa_flags = SA_SIGINFO;
        sigaction(SIGSEGV, &action, NULL);
    }
    """#

let crashingProgramSource = "int main(void) { *(volatile int *)0 = 1; return 0; }\n"

/// The floor under any preloaded library: loaded, and nothing more.
let emptyLibrarySource = "void preload_floor_nothing(void) {}\n"

/// The floor under a library that does its work off the caller's thread: one detached thread
/// that sleeps 20 ms, as ours waits before its rest. What a process that exits or execs first
/// pays for such a thread is the kernel's, not the library's.
let idleThreadLibrarySource = #"""
    #include <pthread.h>
    #include <time.h>

    static void *idle(void *unused) {
        struct timespec delay = {0, 20 * 1000000};
        nanosleep(&delay, NULL);
        return unused;
    }

    __attribute__((constructor)) static void start_idle_thread(void) {
        pthread_attr_t attributes;
        pthread_attr_init(&attributes);
        pthread_attr_setdetachstate(&attributes, PTHREAD_CREATE_DETACHED);
        pthread_attr_setstacksize(&attributes, 128 * 1024);
        pthread_t thread;
        pthread_create(&thread, &attributes, idle, NULL);
        pthread_attr_destroy(&attributes);
    }
    """#

/// Compiles C source with the system compiler; the path of what it built.
func compileC(_ source: String, named name: String, shared: Bool, libraries: [String] = []) throws -> String {
    let directory = temporaryDirectory()
    try source.write(toFile: directory + "/\(name).c", atomically: true, encoding: .utf8)
    let output = directory + "/" + name
    let result = try ChildProcess.run(
        path: "/usr/bin/cc",
        arguments: ["-O2"] + (shared ? ["-shared", "-fPIC"] : []) + ["-o", output, directory + "/\(name).c"]
            + libraries,
        environment: ProcessInfo.processInfo.environment, timeout: 60)
    guard result.exitCode == 0 else { throw CrashCaptureBenchError("cc \(name): \(result.stderr)") }
    return output
}

struct CrashCaptureBenchError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

/// #32: what a process under the preload library pays for its presence. Variants alternate run
/// by run, so the machine's drift touches each alike; the wrapper (`env -C DIR`) is the same on
/// every side. `against`: another build of the library (the code before a change, built with
/// Scripts/build-preload.sh from its commit), measured in the same runs.
func preloadBenchmarks(runs: Int, against other: String?) throws {
    let preload = URL(fileURLWithPath: buildDirectory + "/../../lib/libCrashCapturePreload.so").standardized.path
    guard FileManager.default.fileExists(atPath: preload) else {
        throw CrashCaptureBenchError("no \(preload): run Scripts/build-preload.sh (Benchmarks/run.sh does)")
    }
    let minimal = try compileC(minimalHandlerSource, named: "minimal-handler.so", shared: true, libraries: ["-lunwind"])
    let crasher = try compileC(crashingProgramSource, named: "crasher", shared: false)
    let directory = temporaryDirectory()
    let capture = directory + "/capture"
    let minimalDirectory = directory + "/minimal"
    try FileManager.default.createDirectory(atPath: minimalDirectory, withIntermediateDirectories: true)
    let underPreload = ["LD_PRELOAD": preload, "CRASHCAPTURE_DIR": capture]
    let underOther = other.map { ["LD_PRELOAD": $0, "CRASHCAPTURE_DIR": capture] }
    if let other, !FileManager.default.fileExists(atPath: other) { throw CrashCaptureBenchError("no \(other)") }
    let underMinimal = ["LD_PRELOAD": minimal, "MINIMAL_HANDLER_DIR": minimalDirectory]

    // The handler's own time and its flush, from the timing record of each report, by variant.
    var handlerMs: [Int: [Double]] = [:]
    var fdatasyncMs: [Int: [Double]] = [:]

    func interleaved(_ program: String, _ variants: [[String: String]]) throws -> [Statistics] {
        var times = [[Double]](repeating: [], count: variants.count)
        // One round unmeasured: the page cache and the loader's first lookups.
        for round in 0...runs {
            for (index, environment) in variants.enumerated() {
                let (ms, _) = try timedRun("/usr/bin/env", ["-C", directory, program], environment)
                if round > 0 { times[index].append(ms) }
                for name in (try? FileManager.default.contentsOfDirectory(atPath: capture)) ?? []
                where name.hasPrefix("crash-") {
                    if round > 0, let timing = try? CrashReport(path: capture + "/" + name).timing {
                        handlerMs[index, default: []].append(Double(timing.handlerNanoseconds) / 1e6)
                        fdatasyncMs[index, default: []].append(Double(timing.fdatasyncNanoseconds) / 1e6)
                    }
                    try? FileManager.default.removeItem(atPath: capture + "/" + name)
                }
            }
            // The crashes' reports would pile up into the directory's bound: each round starts
            // clean, but for the distinct id, which a directory in use keeps (made again, it
            // would cost the round's first variant a file's creation that the others skip).
            for folder in [capture, minimalDirectory] {
                for name in (try? FileManager.default.contentsOfDirectory(atPath: folder)) ?? []
                where name != "distinct_id" {
                    try? FileManager.default.removeItem(atPath: folder + "/" + name)
                }
            }
        }
        return times.map(Statistics.init)
    }

    let empty = try compileC(emptyLibrarySource, named: "empty.so", shared: true)
    let idleThread = try compileC(idleThreadLibrarySource, named: "idle-thread.so", shared: true)
    let trueRuns = try interleaved(
        "/bin/true",
        [[:], ["LD_PRELOAD": empty], ["LD_PRELOAD": idleThread], underPreload] + (underOther.map { [$0] } ?? []))
    print("## The cost of being there: /bin/true under the preload library (\(runs) runs each, interleaved, ms)\n")
    print("| variant | median | p90 | added |")
    print("|---|---|---|---|")
    let trueNames = [
        "`env -C DIR /bin/true`", "the same under an empty preloaded library (the floor of any)",
        "the same under a library that only starts one idle thread (the floor of one that defers)",
        "the same under CrashCapture's preload library", "the same under \(other ?? "")",
    ]
    for (index, (name, statistics)) in zip(trueNames, trueRuns).enumerated() {
        let added = index == 0 ? "" : "+" + format(statistics.median - trueRuns[0].median, 2)
        print("| \(name) | \(format(statistics.median, 2)) | \(format(statistics.percentile(0.9), 2)) | \(added) |")
    }
    print(
        "\nadded by the preload library: +\(format(trueRuns[3].median - trueRuns[0].median, 2)) ms (target ≤ +0.3); by a library that only starts an idle thread: +\(format(trueRuns[2].median - trueRuns[0].median, 2)) ms\n"
    )

    let crashRuns = try interleaved(crasher, [[:], underMinimal, underPreload] + (underOther.map { [$0] } ?? []))
    print("## A crashing C program (null write), spawn to death (\(runs) runs each, interleaved, ms)\n")
    print("| variant | median | p90 | added |")
    print("|---|---|---|---|")
    let names = [
        "no handler", "minimal handler (libunwind walk, one 8.5 KiB write, fdatasync)",
        "CrashCapture's preload library", "\(other ?? "")",
    ]
    for (index, (name, statistics)) in zip(names, crashRuns).enumerated() {
        let added = index == 0 ? "" : "+" + format(statistics.median - crashRuns[0].median, 2)
        print("| \(name) | \(format(statistics.median, 2)) | \(format(statistics.percentile(0.9), 2)) | \(added) |")
    }
    for index in 2..<crashRuns.count {
        let handler = Statistics(handlerMs[index] ?? []), flush = Statistics(fdatasyncMs[index] ?? [])
        print(
            "\(names[index]): the handler's own time (its timing record) \(format(handler.median, 2)) ms median, \(format(handler.percentile(0.9), 2)) p90; its fdatasync \(format(flush.median, 2)) ms"
        )
    }
    // What one new file costs in the capture directory, measured alone, made as the session file
    // is (a name, O_CREAT) and as the crash file is (unnamed, O_TMPFILE): an early crash makes both.
    var named: [Double] = []
    var unnamed: [Double] = []
    for index in 0..<40 {
        let path = capture + "/new-file-\(index)"
        var start = DispatchTime.now().uptimeNanoseconds
        let fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        named.append(Double(DispatchTime.now().uptimeNanoseconds - start) / 1e6)
        if fd >= 0 { close(fd) }
        unlink(path)
        start = DispatchTime.now().uptimeNanoseconds
        // O_TMPFILE is a C macro Swift does not import: __O_TMPFILE with O_DIRECTORY.
        let temporary = open(capture, O_WRONLY | 0o20_000_000 | O_DIRECTORY | O_CLOEXEC, 0o600)
        unnamed.append(Double(DispatchTime.now().uptimeNanoseconds - start) / 1e6)
        if temporary >= 0 { close(temporary) }
    }
    for (how, values) in [("open with O_CREAT", named), ("open with O_TMPFILE", unnamed)] {
        let statistics = Statistics(values)
        print(
            "a new file in the capture directory (\(how), 40 times): \(format(statistics.median, 3)) ms median, \(format(statistics.percentile(0.9), 3)) p90"
        )
    }
    print("")
    let ours = crashRuns[2].median - crashRuns[0].median
    let floor = crashRuns[1].median - crashRuns[0].median
    print(
        "\nCrashCapture adds \(format(ours, 2)) ms (target ≤ +1.0), \(format(ours / floor, 2))x the minimal handler's \(format(floor, 2)) ms (target ≤ 1.25x)\n"
    )
}
