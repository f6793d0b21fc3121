// libFuzzer target for the collector's batch validator: it must never crash, and anything it
// accepts must be what Foundation's parser also reads as an array of objects, with each
// event's text cut exactly at its own braces. Built and run by Fuzz/run.sh.
internal import Foundation

@_cdecl("LLVMFuzzerTestOneInput")
public func jsonScannerFuzzerTestOneInput(_ data: UnsafePointer<UInt8>, _ size: Int) -> Int32 {
    let bytes = Array(UnsafeBufferPointer(start: data, count: size))
    guard let events = try? bytes.withUnsafeBufferPointer({ try JSONScanner.events(in: $0) }) else { return 0 }
    guard let parsed = try? JSONSerialization.jsonObject(with: Data(bytes)) as? [Any] else {
        fatalError("scanner accepted what Foundation rejects")
    }
    precondition(parsed.count == events.count, "element count differs")
    for (event, element) in zip(events, parsed) {
        precondition(element is [String: Any], "accepted a non-object event")
        precondition(bytes[event.text.lowerBound] == UInt8(ascii: "{"), "event text does not start at its brace")
        precondition(bytes[event.text.upperBound - 1] == UInt8(ascii: "}"), "event text does not end at its brace")
        let text = Data(bytes[event.text])
        precondition((try? JSONSerialization.jsonObject(with: text)) is [String: Any], "event text is not its object")
    }
    return 0
}
