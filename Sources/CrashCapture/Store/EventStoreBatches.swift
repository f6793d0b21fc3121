internal import CSQLite
internal import Foundation

/// The uploader's side of the store: batches claimed in order, kept in flight while a request
/// is out, then completed (their rows acknowledged and deleted in bulk), released for a retry,
/// or rejected for good.
extension EventStore {
    /// The oldest events not yet in flight, claimed under a new token.
    package func claimBatch(limit: Int) throws -> Batch? {
        lock.lock()
        defer { lock.unlock() }
        return try claim(limit: limit).map(register)
    }

    /// `done` was accepted: its events leave the store; and the next batch is claimed. One
    /// transaction for both, because an upload does this for every batch.
    package func completeAndClaim(_ done: Batch?, limit: Int) throws -> Batch? {
        lock.lock()
        defer { lock.unlock() }
        guard let done else { return try claim(limit: limit).map(register) }
        let next = try change {
            try acknowledge(done)
            let next = try claim(limit: limit)
            if next == nil || acknowledgedRows >= Self.purgeRows { try purgeAcknowledged() }
            return next
        }
        // Only once the transaction is committed: a failed one changed nothing.
        inFlight[done.token] = nil
        return next.map(register)
    }

    func isInFlight(_ sequence: Int64) -> Bool { inFlight.values.contains { $0.contains(sequence) } }

    /// The oldest rows in no batch in flight, up to `limit`, stopping short of the next batch
    /// in flight so that a batch is one range of the table that holds no other batch's rows.
    private func claim(limit: Int) throws -> [Event]? {
        let select = try statement(
            "SELECT seq, event_id, \(Self.payloadColumn) FROM events WHERE seq > ? AND seq < ? ORDER BY seq LIMIT ?")
        var after = acknowledgedThrough
        for range in inFlight.values.sorted(by: { $0.lowerBound < $1.lowerBound }) + [Int64.max...Int64.max] {
            if range.lowerBound > after + 1 {
                defer { select.reset() }
                try select.bind(1, after)
                try select.bind(2, range.lowerBound)
                try select.bind(3, Int64(max(1, limit)))
                var events: [Event] = []
                while try select.step() {
                    events.append(Event(sequence: select.int64(0), eventID: select.text(1), payload: select.text(2)))
                }
                if !events.isEmpty { return events }
            }
            after = max(after, range.upperBound)
        }
        return nil
    }

    private func register(_ events: [Event]) -> Batch {
        let token = nextToken
        nextToken += 1
        inFlight[token] = events[0].sequence...events[events.count - 1].sequence
        return Batch(token: token, events: events)
    }

    /// Binds a batch's sequence range to a statement that ends in `batchClause` (the primary
    /// key: no operation on a batch scans the table). A batch no longer in flight (released,
    /// or from an earlier store) binds an empty range.
    private static let batchClause = "seq BETWEEN ? AND ?"

    private func bind(_ batch: Batch, to statement: SQLiteStatement, from index: Int32) throws {
        let range = inFlight[batch.token]
        try statement.bind(index, range?.lowerBound ?? 0)
        try statement.bind(index + 1, range?.upperBound ?? -1)
    }

    /// Takes a batch's rows out of the in-memory counts, then out of the table.
    private func remove(_ batch: Batch) throws {
        _ = try countOut(batch)
        let delete = try statement("DELETE FROM events WHERE \(Self.batchClause)")
        try bind(batch, to: delete, from: 1)
        _ = try delete.step()
    }

    /// A delivered batch leaves the counts at once and the table later: when it is the oldest
    /// undelivered range, the mark moves past it; otherwise (batches completed out of order)
    /// its rows are deleted now.
    private func acknowledge(_ batch: Batch) throws {
        guard let range = inFlight[batch.token] else { return }
        let older = try statement("SELECT EXISTS(SELECT 1 FROM events WHERE seq > ? AND seq < ?)")
        try older.bind(1, acknowledgedThrough)
        try older.bind(2, range.lowerBound)
        let undeliveredBefore = try older.step() && older.int64(0) != 0
        older.reset()
        if undeliveredBefore { return try remove(batch) }
        acknowledgedRows += try countOut(batch)
        acknowledgedThrough = range.upperBound
    }

    /// Takes a batch's rows out of the in-memory counts; how many there were.
    private func countOut(_ batch: Batch) throws -> Int {
        let counted = try statement("SELECT COUNT(*), COALESCE(SUM(bytes), 0) FROM events WHERE \(Self.batchClause)")
        try bind(batch, to: counted, from: 1)
        defer { counted.reset() }
        guard try counted.step() else { return 0 }
        eventCount -= Int(counted.int64(0))
        eventBytes -= Int(counted.int64(1))
        return Int(counted.int64(0))
    }

    /// Deletes the delivered rows in one statement. The mark goes back to 0: with those rows
    /// gone, a new row may take a sequence number at or below it.
    func purgeAcknowledged() throws {
        guard acknowledgedThrough > 0 else { return }
        let purge = try statement("DELETE FROM events WHERE seq <= ?")
        try purge.bind(1, acknowledgedThrough)
        _ = try purge.step()
        acknowledgedThrough = 0
        acknowledgedRows = 0
    }

    /// The batch was accepted: its events leave the store.
    package func complete(_ batch: Batch) throws {
        lock.lock()
        defer { lock.unlock() }
        try change {
            try acknowledge(batch)
            // The only batch out was this one: an upload ends here (its queue ran dry, or it stops).
            if acknowledgedRows >= Self.purgeRows || inFlight.count == 1 { try purgeAcknowledged() }
        }
        inFlight[batch.token] = nil
    }

    /// The attempt failed in a way worth retrying: the events go back in line, in place.
    package func release(_ batch: Batch) throws {
        lock.lock()
        defer { lock.unlock() }
        inFlight[batch.token] = nil
    }

    /// The server refused the batch as malformed: keep its events aside, out of the queue,
    /// for a person to inspect (`rejected_events`), rather than retry forever or lose them.
    package func reject(_ batch: Batch, status: Int, reason: String) throws {
        lock.lock()
        defer { lock.unlock() }
        let now = Int64(Date().timeIntervalSince1970 * 1000)
        try change {
            let move = try connection.prepare(
                """
                INSERT OR REPLACE INTO rejected_events(event_id, payload, status, reason, rejected_ms)
                SELECT event_id, \(Self.payloadColumn), ?, ?, ? FROM events WHERE \(Self.batchClause)
                """)
            try move.bind(1, Int64(status))
            try move.bind(2, reason)
            try move.bind(3, now)
            try bind(batch, to: move, from: 4)
            try move.step()
            try remove(batch)
        }
        inFlight[batch.token] = nil
    }
}
