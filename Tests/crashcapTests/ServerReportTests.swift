import CrashFileFormat
import Foundation
import ProcessSupport
import TestSupport
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// The Swift crash samples as servers ship: debug, release, and release with the Swift runtime
/// linked in. Each crash is judged beside the Swift runtime backtracer's report of the same
/// crash, which every Swift program on Linux already has.
enum SwiftBuilds {
    /// CrashSamples/Server, built outside the package by Scripts/build-server-sample.sh.
    static func serverSample(_ variant: String) -> String {
        Paths.packageRoot + "/.build/server-sample/\(variant)-bin/server-sample"
    }

    static func crashSample(_ configuration: String) -> String {
        Paths.packageRoot + "/.build/\(configuration)/crash-sample-swift"
    }

    /// The backtracer's helper for programs that carry their own runtime: the toolchain's
    /// `libexec/swift/linux/swift-backtrace-static`, found beside the `swift` on PATH.
    static let staticBacktracer: String? = {
        for directory in (ProcessInfo.processInfo.environment["PATH"] ?? "").split(separator: ":") {
            let swift = URL(fileURLWithPath: String(directory) + "/swift")
            guard FileManager.default.isExecutableFile(atPath: swift.path) else { continue }
            let helper = swift.resolvingSymlinksInPath().deletingLastPathComponent().deletingLastPathComponent()
                .appendingPathComponent("libexec/swift/linux/swift-backtrace-static").path
            if FileManager.default.isExecutableFile(atPath: helper) { return helper }
        }
        return nil
    }()
}

/// One crash of a sample: which binary, which of its kinds or routes.
struct SwiftCrash: CustomTestStringConvertible, Sendable {
    let binary: String
    let argument: String
    let label: String
    let isStatic: Bool

    var testDescription: String { label }

    static let crashSampleKinds = [
        "swift-fatal-error", "swift-force-unwrap", "swift-array-index", "swift-integer-overflow",
        "swift-divide-by-zero", "swift-precondition", "swift-try-bang", "swift-unowned", "swift-null-read",
        "swift-async-deep", "swift-async-other-task",
    ]
    static let serverRoutes = ["checkout", "refund", "profile", "report"]

    static let all: [SwiftCrash] =
        ["debug", "release"].flatMap { configuration in
            crashSampleKinds.map {
                SwiftCrash(
                    binary: SwiftBuilds.crashSample(configuration), argument: $0, label: "\(configuration) \($0)",
                    isStatic: false)
            }
        }
        + ["debug", "release", "static"].flatMap { variant in
            serverRoutes.map {
                SwiftCrash(
                    binary: SwiftBuilds.serverSample(variant), argument: $0, label: "server \(variant) \($0)",
                    isStatic: variant == "static")
            }
        }
}

/// A frame of the backtracer's crashed thread: its function and its marks.
struct BacktracerFrame: CustomStringConvertible {
    var function: String
    var image: String
    var marks: Set<String>
    var description: String { "\(marks.sorted().joined()) \(function) in \(image)" }
}

enum BacktracerOutput {
    /// The crashed thread's frames, from `*** Program crashed` output with color off.
    static func crashedThread(_ text: String) -> [BacktracerFrame] {
        let lines = text.split(separator: "\n", omittingEmptySubsequences: false)
        guard let start = lines.firstIndex(where: { $0.hasPrefix("Thread ") && $0.hasSuffix(" crashed:") }) else {
            return []
        }
        var frames: [BacktracerFrame] = []
        for line in lines[(start + 1)...].drop(while: { $0.isEmpty }) {
            if line.isEmpty { break }
            // `  3 [inlined] [system] 0x00005561252b4027 priceOrder(_:) + 87 in server-sample at /x.swift:1:2`
            guard let address = line.range(of: #" 0x[0-9a-f]+ "#, options: .regularExpression) else { continue }
            let marks = Set(
                line[..<address.lowerBound].split(separator: " ").filter { $0.hasPrefix("[") }.map(String.init))
            var rest = String(line[address.upperBound...])
            if let at = rest.range(of: " at /") ?? rest.range(of: " at //") { rest = String(rest[..<at.lowerBound]) }
            guard let inImage = rest.range(of: " in ", options: .backwards) else { continue }
            var function = String(rest[..<inImage.lowerBound])
            if let offset = function.range(of: #" \+ [0-9]+$"#, options: .regularExpression) {
                function.removeSubrange(offset)
            }
            frames.append(
                BacktracerFrame(function: function, image: String(rest[inImage.upperBound...]), marks: marks))
        }
        return frames
    }

    /// Whether our name is the backtracer's: ours carry the module (`server_sample.f()`), and
    /// name a top-level closure by its file where the backtracer leaves it empty.
    static func same(ours: String, theirs: String) -> Bool {
        if ours == theirs || ours.hasSuffix("." + theirs) { return true }
        let trimmed = theirs.trimmingCharacters(in: .whitespaces)
        if trimmed.hasSuffix(" in") { return ours.hasPrefix(trimmed + " ") }
        return false
    }
}

@Suite struct ServerReportTests {
    /// Our report of a crash, as `crashcap show --json` gives it, and what the crash path wrote of
    /// the task's chain (for a failure's message).
    func ourReport(_ crash: SwiftCrash) throws -> (report: [String: Any], names: [String], run: RunResult) {
        let directory = makeTemporaryDirectory("server-report")
        let crashed = try run(
            crash.binary, [crash.argument],
            environment: ["CRASHCAPTURE_DIR": directory, "SWIFT_BACKTRACE": "enable=no"], timeout: 60)
        let shown = try run(Paths.crashcap, ["show", directory, "--json"], timeout: 60)
        #expect(shown.exitCode == 0, "\(shown.stderr)")
        let report = try #require(
            try JSONSerialization.jsonObject(with: Data(shown.stdout.utf8)) as? [String: Any], "\(shown.stdout)")
        var names: [String] = []
        for frame in report["frames"] as? [[String: Any]] ?? [] {
            for inlined in frame["inlined"] as? [[String: Any]] ?? [] {
                names.append(inlined["function"] as? String ?? "?")
            }
            names.append(frame["function"] as? String ?? "?")
        }
        names += (report["async_frames"] as? [[String: Any]] ?? []).map { $0["function"] as? String ?? "?" }
        if report["async_frames"] == nil {
            // What the crash path found, raw: why replay named no caller.
            let event = (report["events"] as? [[String: Any]] ?? []).first { $0["event"] as? String == "$AppCrashed" }
            let raw = event?["crash"] as? [String: Any] ?? [:]
            names.append(
                "(no async callers; crash path's owner \(raw["async_owner"] ?? "none"), \((raw["async_frames"] as? [Any])?.count ?? 0) raw)"
            )
        }
        return (report, names, crashed)
    }

    /// The backtracer's report of the same crash, with nothing of ours installed.
    func backtracerReport(_ crash: SwiftCrash) throws -> [BacktracerFrame] {
        var setting = "enable=yes,interactive=no,color=no,symbolicate=full"
        if crash.isStatic {
            let helper = try #require(SwiftBuilds.staticBacktracer, "the toolchain's swift-backtrace-static")
            setting += ",swift-backtrace=" + helper
        }
        let result = try run(crash.binary, [crash.argument], environment: ["SWIFT_BACKTRACE": setting], timeout: 120)
        let frames = BacktracerOutput.crashedThread(result.stderr + result.stdout)
        #expect(!frames.isEmpty, "the backtracer printed no crashed thread:\n\(result.stderr)")
        return frames
    }

    /// Every function the backtracer prints for the crashing thread that is the app's (in the
    /// app's binary, not marked [system] or [thunk]) or an [async] caller is in our report, in
    /// the backtracer's order.
    @Test(arguments: SwiftCrash.all) func everyAppAndAsyncFrameOfTheBacktracerIsInOurReport(_ crash: SwiftCrash) throws
    {
        let theirs = try backtracerReport(crash)
        let (report, ours, crashed) = try ourReport(crash)
        let appFrames = (report["frames"] as? [[String: Any]] ?? []).filter {
            $0["role"] == nil && ($0["function"] as? String)?.contains("crash") == true
        }.count
        #expect(crashed.signal != nil, "\(crash.label) did not crash: \(crashed.stderr)")
        let binary = (crash.binary as NSString).lastPathComponent
        let wanted = theirs.filter {
            $0.marks.contains("[async]")
                || ($0.image == binary && !$0.marks.contains("[system]") && !$0.marks.contains("[thunk]"))
        }
        if wanted.isEmpty {
            // The backtracer saw none of the app (it stopped in libc's abort): ours must.
            #expect(appFrames > 0, "\(crash.label): the backtracer named no frame of the app, and neither did we")
        }
        var position = ours.startIndex
        var missing: [BacktracerFrame] = []
        for frame in wanted {
            if let found = ours[position...].firstIndex(where: {
                BacktracerOutput.same(ours: $0, theirs: frame.function)
            }) {
                position = found + 1
            } else {
                missing.append(frame)
            }
        }
        #expect(
            missing.isEmpty,
            "\(crash.label): \(missing.count) of the backtracer's \(wanted.count) frames missing or out of order: \(missing)\nours: \(ours)"
        )
    }

    /// The title names the reason and the app's function; the reason is `crash_message`; the
    /// runtime's own frames of a static binary are the system's.
    @Test(arguments: ["debug", "release", "static"]) func theTitleNamesTheReasonAndTheAppsFunction(_ variant: String)
        throws
    {
        let checkout = try ourReport(
            SwiftCrash(binary: SwiftBuilds.serverSample(variant), argument: "checkout", label: "", isStatic: false))
        #expect(checkout.report["title"] as? String == "Index out of range in server_sample.priceOfItem(_:at:)")
        #expect(checkout.report["message"] as? String == "Index out of range")
        for name in [
            "handleCheckout(_:)", "CallbackResponder.respond(to:context:)", "RouterResponder.respond(to:context:)",
        ] {
            #expect(checkout.names.contains { $0.contains(name) }, "\(name) in \(checkout.names)")
        }
        let profile = try ourReport(
            SwiftCrash(binary: SwiftBuilds.serverSample(variant), argument: "profile", label: "", isStatic: false))
        #expect(
            profile.report["title"] as? String
                == "Unexpectedly found nil while unwrapping an Optional value in server_sample.loadUser(_:)")
        let report = try ourReport(
            SwiftCrash(binary: SwiftBuilds.serverSample(variant), argument: "report", label: "", isStatic: false))
        #expect(
            (report.report["title"] as? String ?? "").hasPrefix("no template for report quarterly in "),
            "\(report.report["title"] ?? "")")
        // No frame of the runtime, Concurrency or Dispatch counts as the app's, wherever linked.
        let frames = checkout.report["frames"] as? [[String: Any]] ?? []
        for frame in frames {
            let function = frame["function"] as? String ?? ""
            if function.contains("swift_job_run") || function.contains("_dispatch_") || function.hasPrefix("swift::") {
                #expect(frame["role"] as? String == "system", "\(frame)")
            }
        }
    }

    /// A crash right after install, while a thread of ours may still be reading a static
    /// binary's symbol table, has its message all the same: the crash waits for the reader.
    @Test(arguments: ["release", "static"]) func aCrashRightAfterInstallHasItsMessage(_ variant: String) throws {
        let crash = try ourReport(
            SwiftCrash(binary: SwiftBuilds.serverSample(variant), argument: "fail-at-start", label: "", isStatic: false)
        )
        #expect(crash.report["message"] as? String == "the configuration is missing", "\(crash.report["title"] ?? "")")
        #expect((crash.report["title"] as? String ?? "").hasPrefix("the configuration is missing in server_sample"))
    }

    /// One bug is one group in every build; two bugs are two groups.
    @Test func oneBugIsOneGroupAndTwoBugsAreTwo() throws {
        var checkout: Set<String> = []
        // Each crash's fingerprint with what it was made of, for the message if they differ.
        var made: [String] = []
        for variant in ["debug", "release", "static"] {
            for _ in 0..<2 {
                let crash = try ourReport(
                    SwiftCrash(
                        binary: SwiftBuilds.serverSample(variant), argument: "checkout", label: "", isStatic: false))
                let fingerprint = crash.report["fingerprint"] as? String ?? "?"
                checkout.insert(fingerprint)
                made.append("\(variant) \(fingerprint): \(crash.names.joined(separator: " < "))")
                #expect(crash.report["fingerprint_version"] as? Int == 2)
            }
        }
        #expect(
            checkout.count == 1, "checkout crashed six times in three builds:\n\(made.joined(separator: "\n"))")
        let refund = try ourReport(
            SwiftCrash(binary: SwiftBuilds.serverSample("release"), argument: "refund", label: "", isStatic: false))
        #expect(
            (refund.report["title"] as? String ?? "").contains("refundLine(_:at:)"), "\(refund.report["title"] ?? "")")
        #expect(!checkout.contains(refund.report["fingerprint"] as? String ?? "?"))
    }

    /// Another thread's task, in a release build: its thread's stack carries the task's
    /// [async] callers and its name, as the crashing thread's does.
    @Test func anotherThreadsTaskKeepsItsCallersInRelease() throws {
        let crash = try ourReport(
            SwiftCrash(
                binary: SwiftBuilds.crashSample("release"), argument: "swift-async-other-task", label: "",
                isStatic: false))
        let threads = crash.report["threads"] as? [[String: Any]] ?? []
        let spinner = try #require(threads.first { $0["task_name"] as? String == "spinner" }, "\(threads)")
        let callers = (spinner["async_frames"] as? [[String: Any]] ?? []).compactMap { $0["function"] as? String }
        #expect(callers.first?.contains("spinLevel2") == true, "\(callers)")
        #expect(callers.dropFirst().first?.contains("spinLevel1") == true, "\(callers)")
    }

    /// A release server's handler that blocks: the hang names it, with the request's async path.
    @Test(arguments: ["release", "static"]) func aBlockedHandlerIsNamedWithItsAsyncCallers(_ variant: String) throws {
        let directory = makeTemporaryDirectory("server-hang")
        let result = try run(
            SwiftBuilds.serverSample(variant), ["export"],
            environment: ["CRASHCAPTURE_DIR": directory, "SERVER_SAMPLE_HANG_MS": "1200"], timeout: 60)
        #expect(result.exitCode == 0, "\(result.stderr)")
        let events = try storedEvents(in: directory)
        let hang = try #require(
            events.first { $0["event"] as? String == "$AppHang" }, "\(events.map { $0["event"] ?? "" })")
        let facts = hang["properties"] as? [String: Any] ?? [:]
        #expect(
            facts["hang_title"] as? String == "Hang in server_sample.waitForLegacyBackend(milliseconds:)", "\(facts)")
        let threads = (hang["hang"] as? [String: Any])?["threads"] as? [[String: Any]] ?? []
        let hung = try #require(threads.first { $0["hung"] as? Bool == true })
        let callers = (hung["async_frames"] as? [[String: Any]] ?? []).compactMap { $0["function"] as? String }
        for name in ["CallbackResponder.respond(to:context:)", "RouterResponder.respond(to:context:)"] {
            #expect(callers.contains { $0.contains(name) }, "\(name) in \(callers)")
        }
        #expect((hung["task_name"] as? String ?? "").hasPrefix("request "), "\(hung)")
    }
}
