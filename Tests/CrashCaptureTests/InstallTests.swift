import CrashCapture
import CrashFileFormat
import Foundation
import TestSupport
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// Install refuses bad input with a clear error before touching any signal disposition, so
/// these run in the test process; the install that succeeds runs in a subprocess.
@Suite struct InstallTests {
    func install(_ directory: String, properties: [String: PropertyValue] = [:], distinctID: String? = nil) throws {
        try CrashCapture.install(
            .init(
                directory: directory, appName: "tests", appVersion: "1", distinctID: distinctID,
                staticProperties: properties))
    }

    func expectInstallError(_ fragment: String, _ body: () throws -> Void) {
        do {
            try body()
            Issue.record("install succeeded; expected an error about \(fragment)")
            CrashCapture.uninstall()
        } catch {
            #expect("\(error)".contains(fragment), "\(error)")
        }
        #expect(!CrashCapture.isInstalled)
    }

    @Test func refusesASymlinkedDirectory() throws {
        let base = makeTemporaryDirectory("symlink")
        try FileManager.default.createDirectory(atPath: base + "/real", withIntermediateDirectories: true)
        try FileManager.default.createSymbolicLink(atPath: base + "/link", withDestinationPath: base + "/real")
        expectInstallError("symbolic link") { try install(base + "/link") }
    }

    @Test func refusesAForeignOwnedDirectory() throws {
        guard geteuid() == 0 else { return }  // only root can give a directory away
        let directory = makeTemporaryDirectory("foreign")
        #expect(chown(directory, 65534, 65534) == 0)
        expectInstallError("owned by uid 65534") { try install(directory) }
    }

    @Test func refusesAFileInPlaceOfTheDirectory() throws {
        let base = makeTemporaryDirectory("file")
        _ = FileManager.default.createFile(atPath: base + "/crashes", contents: Data())
        expectInstallError("not a directory") { try install(base + "/crashes") }
    }

    /// Only the capture directory itself is made: a typo in its parent is an error, and
    /// nothing is created.
    @Test func refusesADirectoryWhoseParentIsMissing() throws {
        let base = makeTemporaryDirectory("missing-parent")
        expectInstallError("does not exist") { try install(base + "/typo/crashes") }
        #expect(!FileManager.default.fileExists(atPath: base + "/typo"))
    }

    /// A relative directory is made absolute once, at install; a second install with another
    /// directory is an error, not silently ignored.
    @Test func aRelativeDirectoryIsMadeAbsoluteAndASecondInstallElsewhereIsRefused() throws {
        let base = makeTemporaryDirectory("relative")
        let result = try run(
            "/bin/sh", ["-c", "cd '\(base)' && exec '\(Paths.swiftSample)' pipeline-install-twice"],
            environment: ["CRASHCAPTURE_DIR": "crashes", "CRASH_SAMPLE_EVENTS": "0"], timeout: 30)
        #expect(result.exitCode == 0, "\(result.stderr)")
        #expect(result.stdout.contains("crash file \(base)/crashes/crash-"), "\(result.stdout)")
        #expect(result.stdout.contains("second install refused"), "\(result.stdout)")
        #expect(result.stdout.contains("already installed"), "\(result.stdout)")
        #expect(!FileManager.default.fileExists(atPath: base + "/crashes-other"))
    }

    @Test func refusesBadPropertiesBeforeInstalling() throws {
        let directory = makeTemporaryDirectory("props")
        expectInstallError("reserved") { try install(directory, properties: ["$custom": 1]) }
        expectInstallError("reserved name") { try install(directory, properties: ["distinct_id": "x"]) }
        expectInstallError("must match") { try install(directory, properties: ["9lives": 1]) }
        expectInstallError("must match") { try install(directory, properties: ["has space": 1]) }
        expectInstallError("finite") { try install(directory, properties: ["ratio": .double(.nan)]) }
        expectInstallError("bytes") {
            try install(directory, properties: ["long": .string(String(repeating: "x", count: 9000))])
        }
        expectInstallError("distinct_id") { try install(directory, distinctID: "quote\"inside") }
    }

    @Test func installUninstallAndReinstallFromAnotherProcess() throws {
        let directory = makeTemporaryDirectory("selfcheck") + "/crashes"
        let result = try run(Paths.cSample, ["selfcheck"], environment: ["CRASHCAPTURE_DIR": directory])
        #expect(result.stdout.contains("selfcheck ok"), "\(result.stdout)")
        #expect(result.exitCode == 0)
        var info = stat()
        #expect(stat(directory, &info) == 0)
        #expect(info.st_mode & 0o777 == 0o700, "created 0700")
        #expect(crashFiles(in: directory).isEmpty, "uninstall leaves no crash file")
    }

    /// A new store is made off the installing thread. When it cannot be made there (its WAL's
    /// name taken by a folder), the app runs on, says so, and its events wait in the session
    /// file: the next start, with the obstacle gone, stores every one of them.
    @Test func aStoreThatCannotBeMadeInTheBackgroundLosesNoEvent() throws {
        let directory = makeTemporaryDirectory("store-background")
        try FileManager.default.createDirectory(
            atPath: directory + "/events.sqlite-wal", withIntermediateDirectories: false)
        let environment = ["CRASHCAPTURE_DIR": directory, "CRASH_SAMPLE_EVENTS": "7", "CRASH_SAMPLE_EXIT_FLUSH": "0.5"]
        let first = try run(Paths.swiftSample, ["pipeline-track"], environment: environment, timeout: 30)
        #expect(first.exitCode == 0, "\(first.stderr)")
        #expect(first.stderr.contains("could not be made"), "\(first.stderr)")
        try FileManager.default.removeItem(atPath: directory + "/events.sqlite-wal")
        try? FileManager.default.removeItem(atPath: directory + "/events.sqlite")
        let second = try run(Paths.swiftSample, ["pipeline-track"], environment: environment, timeout: 30)
        #expect(second.exitCode == 0, "\(second.stderr)")
        let stored = try EventStore(path: directory + "/events.sqlite").events(limit: 1000).map(\.payload)
        let tracked = stored.filter { $0.contains("\"sample_event\"") }
        #expect(tracked.count == 14, "both runs' events: \(tracked.count) of 14")
    }

    @Test func distinctIDPersistsAcrossSessions() throws {
        let directory = makeTemporaryDirectory("identity")
        var ids: [String] = []
        for _ in 0..<2 {
            _ = try run(Paths.cSample, ["abort"], environment: ["CRASHCAPTURE_DIR": directory])
            ids += try reports(in: directory).compactMap { $0.crashed?["distinct_id"] as? String }
            for file in crashFiles(in: directory) { try FileManager.default.removeItem(atPath: file) }
        }
        #expect(ids.count == 2 && ids[0] == ids[1])
        let stored = try String(contentsOfFile: directory + "/distinct_id", encoding: .utf8)
        #expect(stored == ids[0])
    }

    @Test func staticPropertiesReachTheReport() throws {
        let directory = makeTemporaryDirectory("static")
        _ = try run(Paths.swiftSample, ["swift-null-read"], environment: ["CRASHCAPTURE_DIR": directory])
        let report = try verifiedReport(in: directory, signal: "SIGSEGV")
        let properties = report.properties
        #expect(properties["sample_kind"] as? String == "swift-null-read")
        #expect(properties["$os"] as? String == "Linux")
        #expect(properties["$app_name"] as? String == "crash-sample-swift")
        #expect(properties["$app_version"] as? String == "1.0.0")
        #expect(properties["$lib"] as? String == "CrashCapture")
        #expect(properties["$lib_method"] as? String == "autoTrack")
        #expect((properties["$model"] as? String)?.isEmpty == false)
        #expect((properties["$process_start_time"] as? NSNumber)?.int64Value ?? 0 > 1_600_000_000_000)
    }

    /// track() refuses a property named as a static property: the event would name that key
    /// twice, and the collector refuses the whole batch it travels in.
    @Test func trackRefusesAStaticPropertysKey() throws {
        let directory = makeTemporaryDirectory("static-key")
        let result = try run(
            Paths.swiftSample, ["pipeline-static-key"],
            environment: ["CRASHCAPTURE_DIR": directory, "SWIFT_BACKTRACE": "enable=no"], timeout: 60)
        #expect(result.exitCode == 0, "\(result.stdout)\(result.stderr)")
        #expect(result.stdout.contains("static key refused: "), "\(result.stdout)")
        #expect(result.stdout.contains("\"sample_kind\""), "\(result.stdout)")
    }
}
