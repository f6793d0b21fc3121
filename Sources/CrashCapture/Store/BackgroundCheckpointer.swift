internal import CSQLite
internal import Foundation

/// Copies a store's WAL into the database beside its writer, so that the writer does not stop
/// for it. SQLite's own checkpoint runs in the commit that crosses the threshold: it copies the
/// WAL and waits for two fsyncs (for the collector, 32 MiB and about 50 ms every 45,000
/// events, while every client waited; for an app's store, 5-9 ms every 60 batches the
/// uploader finished, while the next batch waited).
///
/// A passive checkpoint on a second connection copies what was committed when it started,
/// while the writer goes on appending; it runs again for what came meanwhile, until a pass
/// has little left to copy. The writer then runs one last passive checkpoint in its next
/// commit (a few hundred pages), which leaves the WAL wholly copied, so that the transaction
/// after it writes the WAL from its start again instead of growing it. Should the passes fall
/// behind, the writer waits for the pass under way to end and checkpoints by itself once the
/// WAL reaches `backstopPages`, as SQLite would.
final class BackgroundCheckpointer: @unchecked Sendable {  // state under `condition`; the connection on `queue`
    let startPages: Int32
    let backstopPages: Int32
    /// A pass that copied no more than this hands the rest to the writer.
    let handOverPages: Int32 = 512
    let path: String
    /// Opened at the first round, so that a store that never fills its WAL costs nothing more.
    private var connection: SQLiteConnection?
    /// The database file, to flush what the passes wrote before the writer's last one.
    private var database: Int32 = -1
    /// The rounds run here, on libdispatch's threads: no thread of our own waits in an app.
    private let queue = DispatchQueue(label: "CrashCapture.checkpoint", qos: .utility)
    private let condition = NSCondition()
    private var running = false
    private var handedOver = false
    private var writerWaiting = false
    private var stopped = false

    init(path: String, startPages: Int) {
        self.path = path
        self.startPages = Int32(clamping: startPages)
        backstopPages = Int32(clamping: startPages * 4)
    }

    /// Installs the WAL hook on the writer's connection (it replaces SQLite's automatic
    /// checkpoint on that connection).
    func attach(to writer: SQLiteConnection) {
        sqlite3_wal_hook(
            writer.handle,
            { context, database, _, frames in
                let checkpointer = Unmanaged<BackgroundCheckpointer>.fromOpaque(context!).takeUnretainedValue()
                if checkpointer.writerShouldCheckpoint(frames: frames) {
                    sqlite3_wal_checkpoint_v2(database, nil, SQLITE_CHECKPOINT_PASSIVE, nil, nil)
                }
                return SQLITE_OK
            }, Unmanaged.passUnretained(self).toOpaque())
    }

    /// After each commit of the writer's, with the WAL's length in frames: whether the writer
    /// checkpoints now (the passes handed over, or fell behind); otherwise the passes may start.
    private func writerShouldCheckpoint(frames: Int32) -> Bool {
        condition.lock()
        defer { condition.unlock() }
        if handedOver {
            handedOver = false
            return true
        }
        if frames >= backstopPages {
            // Fallen behind (a starved thread, a slow disk): the pass under way ends early, and
            // the writer copies the rest itself, as SQLite would have.
            writerWaiting = true
            while running { condition.wait() }
            writerWaiting = false
            handedOver = false
            return true
        }
        if frames >= startPages && !running && !handedOver && !stopped {
            running = true
            queue.async { self.round() }
        }
        return false
    }

    /// One round of passes, then the hand-over to the writer. Its writes, like every other of
    /// the store's, run with SIGXFSZ blocked (see `FileSizeSignal`).
    private func round() {
        FileSizeSignal.blocked { copyWhatTheWriterCommitted() }
        condition.lock()
        running = false
        handedOver = true
        condition.broadcast()
        condition.unlock()
    }

    private func copyWhatTheWriterCommitted() {
        if connection == nil {
            connection = try? SQLiteConnection(path: path)
            // The checkpoint's fsyncs are the checkpointing connection's to make.
            try? connection?.execute("PRAGMA synchronous = NORMAL")
            database = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW)
        }
        if let connection {
            var copied: Int32 = 0
            for _ in 0..<16 {
                var walFrames: Int32 = 0
                var backfilled: Int32 = 0
                let status = sqlite3_wal_checkpoint_v2(
                    connection.handle, nil, SQLITE_CHECKPOINT_PASSIVE, &walFrames, &backfilled)
                guard status == SQLITE_OK else { break }
                let thisPass = backfilled - copied
                copied = backfilled
                if thisPass <= handOverPages || condition.withLock({ writerWaiting || stopped }) { break }
            }
            // SQLite flushes the database only in a checkpoint that reaches the WAL's end, which
            // here is the writer's: it would wait for all the passes copied (20-30 ms for 32 MiB).
            if database >= 0 { fdatasync(database) }
        }
    }

    /// Waits for a round under way; none starts after.
    func stop() {
        condition.withLock { stopped = true }
        queue.sync {
            connection = nil
            if database >= 0 { close(database) }
            database = -1
        }
    }
}
