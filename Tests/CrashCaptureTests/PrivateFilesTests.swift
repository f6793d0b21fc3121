import Foundation
import TestSupport
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// What a capture directory holds is for its owner alone, whatever the umask of the processes
/// that write it: real processes under umask 022 and 077, modes read back with stat.
@Suite struct PrivateFilesTests {
    func mode(_ path: String) -> mode_t? {
        var info = stat()
        return lstat(path, &info) == 0 ? info.st_mode & 0o777 : nil
    }

    /// Runs `program` with `umask` set first, as a shell would.
    func run(umask: String, _ program: String, _ arguments: [String], environment: [String: String]) throws -> RunResult
    {
        let quoted = ([program] + arguments).map { "'\($0)'" }.joined(separator: " ")
        return try TestSupport.run("/bin/sh", ["-c", "umask \(umask) && exec \(quoted)"], environment: environment)
    }

    @Test(arguments: ["022", "077"])
    func everyFileIs0600AndEveryFolder0700(umask: String) throws {
        let directory = makeTemporaryDirectory("modes")
        chmod(directory, 0o755)
        let environment = ["CRASHCAPTURE_DIR": directory, "CRASH_SAMPLE_EVENTS": "3", "SWIFT_BACKTRACE": "enable=no"]
        // A session that logs in, one that crashes, then a damaged crash file to set aside.
        #expect(try run(umask: umask, Paths.swiftSample, ["pipeline-login"], environment: environment).exitCode == 0)
        #expect(try run(umask: umask, Paths.cSample, ["abort"], environment: environment).signal == SIGABRT)
        try Data("CCR1 not a record".utf8).write(to: URL(fileURLWithPath: directory + "/crash-damaged.ccr"))
        chmod(directory + "/crash-damaged.ccr", 0o600)
        let replay = try run(umask: umask, Paths.crashcap, ["replay", directory, "--archive"], environment: [:])
        #expect(replay.exitCode == 65, "the damaged file is reported: \(replay.stdout)")
        #expect(mode(directory) == 0o700, "a directory others could read is made private")
        for name in ["events.sqlite", "login_id", "distinct_id"] {
            #expect(mode(directory + "/" + name) == 0o600, "\(name) under umask \(umask)")
        }
        // SQLite removes its -wal and -shm when the last connection closes: look while one is open.
        let open = try Child(
            "/bin/sh", ["-c", "umask \(umask) && exec '\(Paths.swiftSample)' pipeline-wait"], environment: environment)
        #expect(open.waitForOutput("ready"))
        for name in ["events.sqlite-wal", "events.sqlite-shm"] {
            #expect(mode(directory + "/" + name) == 0o600, "\(name) under umask \(umask)")
        }
        kill(open.pid, SIGKILL)
        _ = open.wait(timeout: 20)
        #expect(mode(directory + "/damaged") == 0o700)
        #expect(mode(directory + "/damaged/crash-damaged.ccr.txt") == 0o600, "the damage note")
        #expect(mode(directory + "/archive") == 0o700)
        let archived = try FileManager.default.contentsOfDirectory(atPath: directory + "/archive")
        #expect(archived.count == 1 && archived.allSatisfy { mode(directory + "/archive/" + $0) == 0o600 })

        // The collector's database too.
        let collectorDirectory = makeTemporaryDirectory("collector-modes")
        let database = collectorDirectory + "/collected.sqlite"
        let collector = try Child(
            "/bin/sh", ["-c", "umask \(umask) && exec '\(Paths.crashcap)' collect --port 0 --db '\(database)'"],
            environment: [:])
        #expect(collector.waitForOutput("listening on"))
        kill(collector.pid, SIGTERM)
        _ = collector.wait(timeout: 20)
        #expect(mode(database) == 0o600)
    }

    @Test func filesLeftLooserByAnEarlierVersionAreTightened() throws {
        let directory = makeTemporaryDirectory("tighten")
        let environment = ["CRASHCAPTURE_DIR": directory, "CRASH_SAMPLE_EVENTS": "1"]
        #expect(try TestSupport.run(Paths.swiftSample, ["pipeline-login"], environment: environment).exitCode == 0)
        for name in ["events.sqlite", "login_id"] { chmod(directory + "/" + name, 0o644) }
        #expect(try TestSupport.run(Paths.swiftSample, ["pipeline-login"], environment: environment).exitCode == 0)
        #expect(mode(directory + "/events.sqlite") == 0o600)
        #expect(mode(directory + "/login_id") == 0o600, "rewritten at each login")
    }

    @Test func aDamagedFolderThatIsALinkIsNeverWrittenThrough() throws {
        let directory = makeTemporaryDirectory("damaged-link")
        let elsewhere = makeTemporaryDirectory("elsewhere")
        symlink(elsewhere, directory + "/damaged")
        try Data("CCR1 not a record".utf8).write(to: URL(fileURLWithPath: directory + "/crash-bad.ccr"))
        let replay = try TestSupport.run(Paths.crashcap, ["replay", directory])
        #expect(replay.exitCode == 65)
        #expect(try FileManager.default.contentsOfDirectory(atPath: elsewhere).isEmpty, "nothing went through the link")
        #expect(FileManager.default.fileExists(atPath: directory + "/crash-bad.ccr"), "the file stays where it was")
    }
}
