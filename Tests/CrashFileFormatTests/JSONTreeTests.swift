import CrashFileFormat
import Foundation
import TestSupport
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// `JSONTree` stands in for JSONSerialization when crash records and journals are read: it
/// must accept and refuse the same texts and give the same trees.
@Suite struct JSONTreeTests {
    /// Foundation's answer: the tree, or nil when it refuses the text.
    func foundation(_ text: [UInt8]) -> Any? {
        try? JSONSerialization.jsonObject(with: Data(text), options: .fragmentsAllowed)
    }

    /// Equal trees, telling booleans from numbers and integers from doubles as Foundation does.
    func same(_ a: Any, _ b: Any) -> Bool {
        switch (a, b) {
        case (let a as String, let b as String): return a == b
        case (is NSNull, is NSNull): return true
        case (let a as [String: Any], let b as [String: Any]):
            return a.count == b.count && a.allSatisfy { key, value in b[key].map { same(value, $0) } ?? false }
        case (let a as [Any], let b as [Any]): return a.count == b.count && zip(a, b).allSatisfy(same)
        case (let a as NSNumber, let b as NSNumber):
            let boolean = { (n: NSNumber) in
                [UInt8(ascii: "c"), UInt8(ascii: "B")].contains(UInt8(bitPattern: n.objCType.pointee))
            }
            return boolean(a) == boolean(b) && a == b
        default: return false
        }
    }

    @Test func realCrashRecordsGiveFoundationsTree() throws {
        let directory = makeTemporaryDirectory("jsontree")
        _ = try run(Paths.cSample, ["null-read"], environment: ["CRASHCAPTURE_DIR": directory])
        let records = try CrashFileReader.read(path: crashFiles(in: directory)[0]).records
        #expect(records.count >= 3)
        // Every JSON record (the stacks record is binary).
        for record in records where record.type != .stacks {
            let ours = try JSONTree.parse(record.payload)
            let theirs = try #require(foundation(record.payload))
            #expect(same(ours, theirs), "record at \(record.offset)")
            // Written back and read again, by both.
            let written = Array(JSONTree.encode(ours).utf8)
            #expect(same(try JSONTree.parse(written), theirs))
            #expect(foundation(written).map { same($0, theirs) } == true)
        }
    }

    @Test(arguments: [
        #"{"a":1,"b":[true,false,null],"c":{"d":-0.5e3,"e":"x\"y\\z\/\b\f\n\r\t\u00e9\ud83d\ude00"}}"#,
        #"[9223372036854775807,-9223372036854775808,18446744073709551615,18446744073709551616,1.5,1E2,0]"#,
        #" "text" "#, "12", "-0", "true", "null", "[]", "{}", #"{"a":1,"a":2}"#, #"["é","日本"]"#,
        // Refused by both.
        "", "[", "{", #"{"a"}"#, #"{"a":}"#, "01", "1.", ".5", "-", "1e", "+1", "tru",
        "nul", "[1 2]", #"{"a" 1}"#, #""\x""#, #""\u12""#, #""\ud800""#, #""\udc00x""#, "\"a\u{1}\"", "[1]x",
        "NaN", "Infinity", "'a'", "{a:1}",
    ])
    func sameAnswerAsFoundation(_ text: String) throws {
        let bytes = Array(text.utf8)
        let theirs = foundation(bytes)
        let ours = try? JSONTree.parse(bytes)
        #expect((ours == nil) == (theirs == nil), "\(text): ours \(ours == nil ? "refused" : "accepted")")
        if let ours, let theirs { #expect(same(ours, theirs), "\(text)") }
    }

    /// Foundation on Linux takes a trailing comma; RFC 8259 does not, nor does anything we write.
    @Test func trailingCommasAreRefused() {
        #expect((try? JSONTree.parse(Array("[1,]".utf8))) == nil)
        #expect((try? JSONTree.parse(Array(#"{"a":1,}"#.utf8))) == nil)
    }

    @Test func invalidUTF8AndDeepNestingAreRefused() {
        #expect((try? JSONTree.parse([0x22, 0xff, 0x22])) == nil)
        #expect((try? JSONTree.parse([0x22, 0xc3, 0x22])) == nil)
        #expect((try? JSONTree.parse([0x22, 0xed, 0xa0, 0x80, 0x22])) == nil, "an encoded surrogate")
        #expect((try? JSONTree.parse(Array(repeating: UInt8(ascii: "["), count: 100_000))) == nil)
        let deep = String(repeating: "[", count: 200) + String(repeating: "]", count: 200)
        #expect((try? JSONTree.parse(Array(deep.utf8))) != nil)
    }

    /// Every one-byte change of a real record: both parsers refuse it, or both give one tree.
    @Test func mutatedRecordsGetFoundationsAnswer() throws {
        let directory = makeTemporaryDirectory("jsontree-mutated")
        _ = try run(Paths.cSample, ["null-read"], environment: ["CRASHCAPTURE_DIR": directory])
        let payload = try #require(
            try CrashFileReader.read(path: crashFiles(in: directory)[0]).records.first { $0.type == .event }?.payload)
        var state: UInt64 = 0x9E37_79B9_7F4A_7C15
        let replacements = Array("{}[],:\"\\0123456789.eE+-tfnu \u{7f}".utf8) + [0x00, 0x0a, 0x80, 0xc3, 0xff]
        for _ in 0..<3000 {
            state = state &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
            var text = payload
            let place = Int(state >> 33) % text.count
            let byte = replacements[Int(state >> 17) % replacements.count]
            switch state % 3 {
            case 0: text[place] = byte
            case 1: text.insert(byte, at: place)
            default: text.remove(at: place)
            }
            let ours = try? JSONTree.parse(text)
            // A trailing comma only Foundation takes (see above).
            let theirs = ours == nil && hasTrailingComma(text) ? nil : foundation(text)
            #expect((ours == nil) == (theirs == nil), "byte \(place) -> \(byte)")
            if let ours, let theirs { #expect(same(ours, theirs)) }
        }
    }

    /// What `crashcap show --json` and replay write large reports with: sorted keys by their
    /// bytes, exactly sized bytes, text written out a MiB at a time, and parts kept as text.
    @Test func largeTreesAreWrittenAndReadInParts() throws {
        let frame: [String: Any] = ["pc": "0x1", "function": "f\u{e9}\"", "line": 3, "z": NSNull(), "a": true]
        let tree: [String: Any] = [
            "threads": (0..<1500).map { tid -> Any in ["tid": tid, "frames": Array(repeating: frame as Any, count: 40)]
            },
            "b": ["y": 1, "x": [2.5, "\u{1}"]], "B": "upper first",
        ]
        let sorted = JSONTree.encode(tree, sortedKeys: true)
        #expect(sorted.hasPrefix("{\"B\":\"upper first\",\"b\":{\"x\":"), "\(sorted.prefix(40))")
        #expect(same(try #require(foundation(Array(sorted.utf8))), tree))
        let exact = JSONTree.encodedBytes(tree)
        #expect(exact.count == exact.capacity, "\(exact.count) of \(exact.capacity)")
        #expect(same(try #require(foundation(exact)), tree))
        var drained: [UInt8] = []
        var chunks = 0
        var out: [UInt8] = []
        JSONTree.write(tree, to: &out, sortedKeys: true) {
            chunks += 1
            drained += $0
            $0.removeAll(keepingCapacity: true)
        }
        drained += out
        #expect(chunks >= 2 && String(decoding: drained, as: UTF8.self) == sorted)
        // Each thread's frames kept as their text, and read again one thread at a time.
        let event: [String: Any] = ["crash": tree]
        let text = JSONTree.encode(event)
        let kept = try #require(JSONTree.object(Array(text.utf8), keepingAsText: ("frames", 4)))
        let threads = try #require((kept["crash"] as? [String: Any])?["threads"] as? [[String: Any]])
        #expect(threads.allSatisfy { $0["frames"] is JSONTree.Encoded })
        #expect(same(try #require(JSONTree.materialized(threads[7]["frames"])), Array(repeating: frame, count: 40)))
        #expect(same(try #require(foundation(Array(JSONTree.encode(kept).utf8))), event))
        // A value kept as text is still checked: a bad one refuses the whole text.
        let broken = text.replacingOccurrences(of: "\"line\":3", with: "\"line\":3x")
        #expect(JSONTree.object(Array(broken.utf8), keepingAsText: ("frames", 4)) == nil)
    }
}

/// A comma followed, past blanks, by a closing bracket or brace.
func hasTrailingComma(_ text: [UInt8]) -> Bool {
    var lastSignificant: UInt8 = 0
    for byte in text where ![0x20, 0x0a, 0x0d, 0x09].contains(byte) {
        if lastSignificant == UInt8(ascii: ","), byte == UInt8(ascii: "]") || byte == UInt8(ascii: "}") { return true }
        lastSignificant = byte
    }
    return false
}

@Suite struct ReservedSpaceTests {
    /// The reader skips the space reserved at install (a hole to the filesystem) yet still
    /// finds anything written past it. The crash comes after the install's rest (30 ms of work
    /// first): one before it has no space reserved.
    @Test func dataPastTheReservedSpaceIsStillFound() throws {
        let directory = makeTemporaryDirectory("reserved")
        _ = try run(
            Paths.cSample, ["null-read"], environment: ["CRASHCAPTURE_DIR": directory, "CRASH_SAMPLE_INSTALLED": "1"])
        let path = crashFiles(in: directory)[0]
        let clean = try CrashFileReader.read(path: path)
        #expect(clean.problems.isEmpty)
        let fd = open(path, O_WRONLY)
        try #require(fd >= 0)
        var info = stat()
        fstat(fd, &info)
        let junk: [UInt8] = Array("junk".utf8)
        #expect(pwrite(fd, junk, junk.count, off_t(info.st_size) - 100) == junk.count)
        close(fd)
        let damaged = try CrashFileReader.read(path: path)
        #expect(damaged.records.count == clean.records.count)
        #expect(Set(damaged.problems.map(\.offset)) == [Int(info.st_size) - 100], "\(damaged.problems)")
        #expect(damaged.problems.first?.reason.contains("after the zero-filled reserved space") == true)
    }

}
