import ArgumentParser
import CrashCapture
import CrashFileFormat
import Foundation

#if canImport(Glibc)
    import Glibc
#endif

/// Written by the SIGTERM/SIGINT handler, read by the watch loop's poll.
nonisolated(unsafe) private var watchStopPipe: [Int32] = [-1, -1]

extension Crashcap {
    struct Watch: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract:
                "Watch capture directories: import each crash as it is written, close the sessions of processes that die, upload.",
            discussion: """
                A sidecar for processes that are replaced rather than restarted. inotify says when a \
                crash file gets its name or a process closes its session file (it died, or it ended); \
                each such directory is then recovered as `crashcap replay` would (every event once), \
                into DIRECTORY/events.sqlite, and uploaded in order with the uploader's backoff, so a \
                collector that is down only delays delivery. SIGTERM or SIGINT stops it after a last \
                upload of at most 2 s; exit status 0.
                """)

        @Argument(help: "Capture directories to watch.")
        var directories: [String]

        @OptionGroup var target: UploadTarget
        @OptionGroup var symbols: SymbolOptions

        mutating func run() throws {
            var watched: [Watched] = []
            let endpoint = try target.endpoint
            for directory in directories {
                let store = try DirectoryOptions.openStore(directory: directory)
                var uploader: Uploader?
                if let endpoint {
                    do {
                        uploader = try Uploader(
                            endpoint: endpoint, store: store, options: try target.uploadOptions(), format: target.format
                        )
                    } catch {
                        throw Crashcap.fail("\(error)", code: 64)
                    }
                    uploader?.start()
                }
                watched.append(
                    (
                        directory,
                        SessionRecovery(
                            replayer: CrashReplayer(
                                directory: directory, store: store, symbolicator: try symbols.symbolicator())),
                        uploader,
                        try target.minidumpUploader(store)
                    ))
            }
            let inotify = inotify_init1(Int32(IN_CLOEXEC | IN_NONBLOCK))
            guard inotify >= 0 else { throw Crashcap.fail("inotify: \(String(cString: strerror(errno)))", code: 71) }
            var directoryOf: [Int32: Int] = [:]
            for (index, entry) in watched.enumerated() {
                let mask = UInt32(IN_CREATE | IN_MOVED_TO | IN_CLOSE_WRITE)
                let descriptor = inotify_add_watch(inotify, entry.directory, mask)
                guard descriptor >= 0 else {
                    throw Crashcap.fail(
                        "cannot watch \(entry.directory): \(String(cString: strerror(errno)))", code: 66)
                }
                directoryOf[descriptor] = index
            }
            guard pipe(&watchStopPipe) == 0 else {
                throw Crashcap.fail("pipe: \(String(cString: strerror(errno)))", code: 71)
            }
            for fd in watchStopPipe {
                _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
                _ = fcntl(fd, F_SETFL, O_NONBLOCK)
            }
            for signo in [SIGTERM, SIGINT] {
                signal(signo) { number in
                    var byte = UInt8(truncatingIfNeeded: number)
                    _ = write(watchStopPipe[1], &byte, 1)
                }
            }
            signal(SIGPIPE, SIG_IGN)
            let shown = endpoint.map { " and uploading to " + Uploader.redacted($0) } ?? ""
            print("watching \(directories.joined(separator: ", "))\(shown)")
            fflush(nil)
            // What was left before we started, then whatever inotify reports.
            for index in watched.indices { recover(watched[index]) }
            var buffer = [UInt8](repeating: 0, count: 64 * 1024)
            var fds = [
                pollfd(fd: inotify, events: Int16(POLLIN), revents: 0),
                pollfd(fd: watchStopPipe[0], events: Int16(POLLIN), revents: 0),
            ]
            while true {
                let ready = poll(&fds, 2, -1)
                if ready < 0 && errno == EINTR { continue }
                if fds[1].revents != 0 { break }
                guard fds[0].revents != 0 else { continue }
                var touched = Set<Int>()
                var closedSessions: [Int: Set<String>] = [:]
                while true {
                    let count = read(inotify, &buffer, buffer.count)
                    if count <= 0 { break }
                    var offset = 0
                    while offset + MemoryLayout<inotify_event>.size <= count {
                        let (descriptor, mask, length, name) = buffer.withUnsafeBytes {
                            raw -> (Int32, UInt32, Int, String) in
                            let event = raw.loadUnaligned(fromByteOffset: offset, as: inotify_event.self)
                            let start = offset + MemoryLayout<inotify_event>.size
                            let bytes = raw[start..<start + Int(event.len)].prefix { $0 != 0 }
                            return (event.wd, event.mask, Int(event.len), String(decoding: bytes, as: UTF8.self))
                        }
                        offset += MemoryLayout<inotify_event>.size + length
                        if let index = directoryOf[descriptor],
                            CrashFileLayout.isCrashFileName(name) || SessionFile.isSessionFileName(name)
                        {
                            touched.insert(index)
                            if mask & UInt32(IN_CLOSE_WRITE) != 0,
                                let session = SessionFile.sessionID(fromFileName: name)
                            {
                                closedSessions[index, default: []].insert(session)
                            }
                        }
                    }
                }
                for index in touched.sorted() { recover(watched[index], closed: closedSessions[index] ?? []) }
            }
            for entry in watched { entry.uploader?.flushNow(deadline: Date().addingTimeInterval(2)) }
            print("stopped")
        }

        typealias Watched = (
            directory: String, recovery: SessionRecovery, uploader: Uploader?, minidumps: MinidumpUploader?
        )

        /// Recovers one directory and asks for an upload; prints what was imported. Minidumps are
        /// sent at once, each within 10 s (the watch waits for them).
        func recover(_ entry: Watched, closed: Set<String> = []) {
            var summary = entry.recovery.recoverAll()
            // A session file is reported closed while its process is still going away: the
            // kernel drops the process's lock, and the process leaves /proc, a moment later
            // (the crash file, closed first, wakes us before the session file's lock is free).
            // A session whose file was just closed is tried again until it is, for up to 5 s,
            // at 2 ms first and then less often, up to every 50 ms.
            let deadline = Date().addingTimeInterval(5)
            var pause: useconds_t = 2000
            while Date() < deadline,
                summary.sessions.contains(where: {
                    closed.contains($0.sessionID) && ($0.outcome == .busy || $0.outcome == .alive)
                })
            {
                usleep(pause)
                pause = min(pause * 2, 50_000)
                let again = entry.recovery.recoverAll()
                summary.sessions =
                    summary.sessions.filter { $0.outcome != .busy && $0.outcome != .alive } + again.sessions
                summary.crashFiles.files += again.crashFiles.files
            }
            for session in summary.sessions where session.outcome == .closed {
                var line = "session \(session.sessionID): \(session.importedEvents) events"
                if let reason = session.endReason { line += ", ended \(reason)" }
                if let crash = session.crashFile {
                    line += "; crash file \(crash.outcome.rawValue) (\(crash.importedEvents) events)"
                }
                print(CaptureFile.printable(line))
            }
            for file in summary.crashFiles.files {
                print(
                    CaptureFile.printable(
                        "\((file.path as NSString).lastPathComponent): \(file.outcome.rawValue) (\(file.importedEvents) events)"
                    ))
            }
            fflush(nil)
            if summary.importedEvents > 0 { entry.uploader?.requestFlush() }
            if let minidumps = entry.minidumps {
                _ = target.sendMinidumps(with: minidumps, timeout: 10)
                fflush(nil)
            }
        }
    }
}
