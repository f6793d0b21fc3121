import CrashFileFormat
import Foundation
import TestSupport
import Testing

@Suite struct CrashFileTests {
    /// A real crash file from a real crash, to cut and damage: one that came after the
    /// install's rest, so that the file holds its reserved space. Without the stacks record
    /// (CRASHCAPTURE_STACK_MEMORY=off), whose 70 KiB would make cutting at every byte quadratic
    /// in them; `stacksRecordFollowsTheEvents` cuts a file with one.
    static let sample: (path: String, bytes: [UInt8], records: Int, end: Int) = {
        let directory = makeTemporaryDirectory("torn")
        _ = try! run(
            Paths.cSample, ["null-read"],
            environment: [
                "CRASHCAPTURE_DIR": directory, "CRASH_SAMPLE_INSTALLED": "1", "CRASHCAPTURE_STACK_MEMORY": "off",
            ])
        let path = crashFiles(in: directory)[0]
        let bytes = [UInt8](FileManager.default.contents(atPath: path)!)
        let contents = CrashFileReader.parse(bytes)
        let last = contents.records.last!
        return (path, bytes, contents.records.count, last.offset + CrashFileLayout.headerSize + last.payload.count)
    }()

    @Test func crc32MatchesZlib() {
        #expect(CRC32.update(0, Array("123456789".utf8)) == 0xCBF4_3926)
    }

    @Test func realFileHasSessionTwoEventsAndTiming() {
        let contents = CrashFileReader.parse(Self.sample.bytes)
        #expect(contents.problems.isEmpty)
        #expect(contents.records.map(\.type) == [.session, .event, .event, .timing])
        #expect(Self.sample.bytes.count >= 256 * 1024, "the reserved space is part of the file")
    }

    /// The stacks record: after the events, before the timing; the crashing thread first, its
    /// stack from SP-128 of the context before the signal up to where the main thread's frames
    /// end (a C main thread a few frames deep has only argv and the environment above it, which
    /// are never copied); a cut inside it loses it alone, never half-read.
    @Test func stacksRecordFollowsTheEvents() throws {
        let directory = makeTemporaryDirectory("stacks")
        _ = try run(
            Paths.cSample, ["null-read"],
            environment: [
                "CRASHCAPTURE_DIR": directory, "CRASH_SAMPLE_INSTALLED": "1", "SAMPLE_SECRET": "env-secret-5e11a",
            ])
        let path = crashFiles(in: directory)[0]
        let bytes = [UInt8](FileManager.default.contents(atPath: path)!)
        let contents = CrashFileReader.parse(bytes)
        #expect(contents.problems.isEmpty)
        #expect(contents.records.map(\.type) == [.session, .event, .event, .stacks, .timing])
        #expect(!String(decoding: bytes, as: UTF8.self).contains("env-secret-5e11a"), "the environment is never kept")
        let report = CrashReport(path: path, contents: contents)
        let stacks = try #require(report.stacks)
        #expect(stacks.architecture == .x86_64)
        let crashed = try #require(stacks.threads.first)
        #expect(crashed.crashed && !crashed.cut)
        #expect(crashed.tid == (report.properties["crash_tid"] as? NSNumber)?.intValue)
        #expect(crashed.registers.count == 23 && crashed.floatingPoint.count == 512)
        // gregs[15] is rsp, gregs[16] rip: the report's own registers say the same.
        let registers = report.crashed?["crash"].flatMap { ($0 as? [String: Any])?["registers"] as? [String: Any] }
        #expect(registers?["sp"] as? String == "0x" + String(crashed.registers[15], radix: 16))
        #expect(registers?["pc"] as? String == "0x" + String(crashed.registers[16], radix: 16))
        #expect(crashed.stackStart == crashed.registers[15] - 128)
        #expect(crashed.stack.count >= 64 && crashed.stack.count < 64 * 1024, "\(crashed.stack.count)")
        #expect(stacks.threadsLeftOut == 0 && stacks.bytesCut == 0)
        let record = try #require(contents.records.first { $0.type == .stacks })
        let end = record.offset + CrashFileLayout.headerSize + record.payload.count
        for cut in stride(from: record.offset + 1, to: end, by: 997) {
            let torn = CrashFileReader.parse(Array(bytes[0..<cut]))
            #expect(torn.records.map(\.type) == [.session, .event, .event], "cut at \(cut)")
            #expect(!torn.problems.isEmpty)
        }
    }

    @Test func truncationAtAnyByteIsDetectedAndNeverHalfRead() {
        let bytes = Self.sample.bytes
        let complete = CrashFileReader.parse(bytes).records
        let boundaries = Set(complete.map { $0.offset + CrashFileLayout.headerSize + $0.payload.count } + [0])
        for cut in 0..<Self.sample.end {
            let contents = CrashFileReader.parse(Array(bytes[0..<cut]))
            let whole = complete.filter { $0.offset + CrashFileLayout.headerSize + $0.payload.count <= cut }
            #expect(contents.records.map(\.offset) == whole.map(\.offset), "cut at \(cut)")
            for (got, expected) in zip(contents.records, whole) where got.payload != expected.payload {
                Issue.record("record at \(got.offset) differs after a cut at \(cut)")
            }
            if !boundaries.contains(cut) && contents.problems.isEmpty {
                Issue.record("a cut inside a record at \(cut) was not reported")
            }
        }
    }

    /// Every byte of every record's header (magic, type, length, checksum) set to 0, 0xff and
    /// its neighbours, and each length also pointed past the file and at 2^32 − 1: the damaged
    /// record is reported, never half read, and every other record is still found whole.
    @Test func everyRecordHeaderByteIsCheckedAgainstTheFile() {
        let bytes = Self.sample.bytes
        let records = CrashFileReader.parse(bytes).records
        var tried = 0
        for (index, record) in records.enumerated() {
            var variants: [(Int, UInt8)] = []
            for byte in record.offset..<(record.offset + CrashFileLayout.headerSize) {
                for value in [0, 0xff, bytes[byte] &+ 1, bytes[byte] &- 1] where value != bytes[byte] {
                    variants.append((byte, value))
                }
            }
            // The length (bytes 8 to 11) past the file, and as large as it can be.
            let pastTheFile = UInt32(bytes.count - record.offset)
            let lengths = [pastTheFile, UInt32.max].map { value in
                (0..<4).map { (record.offset + 8 + $0, UInt8(truncatingIfNeeded: value >> (8 * UInt32($0)))) }
            }
            for change in variants.map({ [$0] }) + lengths {
                var damaged = bytes
                for (byte, value) in change { damaged[byte] = value }
                let contents = CrashFileReader.parse(damaged)
                tried += 1
                let others = records.enumerated().filter { $0.offset != index }.map(\.element)
                let found = contents.records.filter { $0.offset != record.offset }
                if found.map(\.offset) != others.map(\.offset)
                    || zip(found, others).contains(where: {
                        $0.payload != $1.payload
                    })
                {
                    Issue.record("record \(index) changed at \(change): the others are not all found whole")
                }
                let kept = contents.records.first { $0.offset == record.offset }
                if let kept, kept.payload != record.payload || kept.type != record.type {
                    Issue.record("record \(index) changed at \(change) was read as another")
                }
                if kept == nil && contents.problems.isEmpty {
                    Issue.record("record \(index) changed at \(change) was dropped in silence")
                }
            }
        }
        #expect(tried > 150)
    }

    @Test func zeroedTailIsATornRecordNotData() {
        // The fdatasync never finished: the tail of the last record is still the reserved zeros.
        var bytes = Self.sample.bytes
        for index in (Self.sample.end - 40)..<Self.sample.end { bytes[index] = 0 }
        let contents = CrashFileReader.parse(bytes)
        #expect(contents.records.count == Self.sample.records - 1)
        #expect(contents.problems.contains { $0.reason.contains("checksum") })
    }

    @Test func flippedBitIsCaughtByTheChecksumAndLaterRecordsSurvive() throws {
        var bytes = Self.sample.bytes
        let contents = CrashFileReader.parse(bytes)
        let crashed = contents.records[1]
        bytes[crashed.offset + CrashFileLayout.headerSize + 100] ^= 0x04
        let damaged = CrashFileReader.parse(bytes)
        #expect(damaged.problems.first?.offset == crashed.offset)
        #expect(damaged.problems.first?.reason.contains("checksum") == true)
        #expect(damaged.records.map(\.type) == [.session, .event, .timing], "records after the damage are recovered")
    }

    @Test func foreignAndEmptyFilesAreReportedNotRead() {
        let foreign = CrashFileReader.parse(Array("{\"not\":\"a crash file\"}".utf8))
        #expect(foreign.records.isEmpty)
        #expect(foreign.problems.first?.reason.contains("not a CrashCapture record") == true)
        let empty = CrashFileReader.parse([])
        #expect(empty.records.isEmpty && empty.problems.isEmpty)
        let zeros = CrashFileReader.parse([UInt8](repeating: 0, count: 4096))
        #expect(zeros.records.isEmpty && zeros.problems.isEmpty)
    }

    @Test func oversizedLengthIsRejectedWithoutAllocating() {
        var header = Array("CCR1".utf8)
        header += [2, 0, 0, 0] + [0xff, 0xff, 0xff, 0x7f] + [0, 0, 0, 0]
        let contents = CrashFileReader.parse(header + [UInt8](repeating: 0x20, count: 64))
        #expect(contents.records.isEmpty)
        #expect(contents.problems.first?.reason.contains("exceeds") == true)
    }

    @Test func reportDecodesFramesAndModules() throws {
        let report = try CrashReport(path: Self.sample.path)
        #expect(report.frames.count >= 3)
        #expect(report.modules.contains { $0.path.hasSuffix("crash-sample-c") && !$0.buildID.isEmpty })
        for frame in report.frames where frame.module != nil {
            let module = report.modules[frame.module!]
            #expect(frame.pc >= module.start && frame.pc < module.end)
            #expect(frame.offset == frame.pc - module.loadBias)
        }
    }
}

@Suite struct CrashFileAdversarialTests {
    @Test func craftedResyncStormIsBounded() {
        // A header claiming almost 1 MiB, then a magic every 16 bytes: each candidate would be
        // checksummed over ~1 MiB if the reader did not bound its work.
        var bytes = [UInt8]()
        bytes.reserveCapacity(2 << 20)
        while bytes.count < 2 << 20 {
            bytes += Array("CCR1".utf8) + [2, 0, 0, 0] + [0x00, 0x00, 0x0f, 0x00] + [1, 2, 3, 4]
        }
        let start = Date()
        let contents = CrashFileReader.parse(bytes)
        #expect(Date().timeIntervalSince(start) < 10)
        #expect(contents.records.isEmpty)
        #expect(contents.problems.contains { $0.reason.contains("too much damage") })
    }
}

@Suite struct FuzzTests {
    @Test(arguments: ["crashfile", "jsonscanner"])
    func fuzzerBuildsAndFindsNothingInTenSeconds(target: String) throws {
        let result = try run("/bin/sh", [Paths.packageRoot + "/Fuzz/run.sh", "10", target], timeout: 300)
        #expect(result.exitCode == 0, "\(result.stderr.suffix(2000))")
        #expect(result.stderr.contains("Done "), "libFuzzer did not run: \(result.stderr.suffix(500))")
    }
}
