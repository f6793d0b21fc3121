import CrashFileFormat
import CrashSymbolication
import Foundation

/// A C program generated to carry about `units` × 11 MiB of DWARF (types with hundreds of
/// members, each function inlining two helpers), built -O1 -g two units at a time.
func buildLargeDebugProgram(units: Int) throws -> String {
    let directory = temporaryDirectory()
    for unit in 0..<units {
        var source = ""
        for group in 0..<1000 {
            let n = unit * 1000 + group
            let members = (0..<400).map { "long field_\($0)_\(n);" }.joined(separator: " ")
            source += """
                struct record_\(n) { int amount; long balance; \(members) struct record_\(n) *next; };
                static inline __attribute__((always_inline)) int weigh_\(n)(const struct record_\(n) *r, int x) { return r->amount * x + (int)r->balance; }
                static inline __attribute__((always_inline)) int total_\(n)(const struct record_\(n) *r, int count) { int s = 0; for (int i = 0; i < count; i++) s += weigh_\(n)(r, i); return s; }
                __attribute__((noinline)) int process_\(n)(const struct record_\(n) *r, int count) { return total_\(n)(r, count) + (r->next ? r->next->amount : 0); }

                """
        }
        try source.write(toFile: directory + "/unit\(unit).c", atomically: false, encoding: .utf8)
    }
    try "int main(void) { return 0; }\n".write(toFile: directory + "/main.c", atomically: false, encoding: .utf8)
    let script = """
        cd '\(directory)' && ls unit*.c main.c | xargs -P 2 -n 1 gcc -O1 -g -c && gcc -o large *.o
        """
    let built = try timedRun("/bin/sh", ["-c", script], [:])
    guard built.signal == nil, FileManager.default.fileExists(atPath: directory + "/large") else {
        throw CrashCaptureError.io("building the large program failed")
    }
    return directory + "/large"
}

func debugInfoBytes(_ path: String) throws -> Int {
    let out = try output("/usr/bin/readelf", ["-S", "-W", path], [:])
    var total = 0
    for line in out.split(separator: "\n") where line.contains(" .debug_") {
        guard let bracket = line.firstIndex(of: "]") else { continue }
        let fields = line[line.index(after: bracket)...].split(separator: " ")
        if fields.count > 4, let size = Int(fields[4], radix: 16) { total += size }
    }
    return total
}

func symbolicationBenchmarks(units: Int) throws {
    let program = try buildLargeDebugProgram(units: units)
    let image = try ELFImage(path: program)
    let buildID = image.buildID ?? ""
    let functions = image.symbols.filter { $0.name.hasPrefix("process_") && $0.size > 8 }
    let dwarfBytes = try debugInfoBytes(program)
    print("## Symbolication (\(functions.count) functions, \(dwarfBytes >> 20) MiB of DWARF)\n")
    print("| | value |")
    print("|---|---|")
    // A report's worth of frames spread over the program: each names a function and the two it inlined.
    var generator = SystemRandomNumberGenerator()
    let report = (0..<24).map { _ in functions.randomElement(using: &generator)! }
    func frames(of symbolicator: Symbolicator, _ picked: [ELFImage.Symbol], returnAddresses: Bool) -> Int {
        var inlined = 0
        for function in picked {
            let symbol = symbolicator.symbolicate(
                modulePath: program, buildID: buildID, offset: function.address + function.size / 2,
                isReturnAddress: returnAddresses)
            inlined += symbol.inlined.count
        }
        return inlined
    }
    var firsts: [Double] = []
    for _ in 0..<5 {
        let start = monotonic()
        _ = frames(of: Symbolicator(), report, returnAddresses: true)
        firsts.append(Double(monotonic() - start) / 1e6)
    }
    print(
        "| first report, 24 frames (fresh symbolicator; file in the page cache) | median \(format(Statistics(firsts).median, 1)) ms |"
    )

    let symbolicator = Symbolicator()
    _ = frames(of: symbolicator, report, returnAddresses: true)
    let distinctStart = monotonic()
    let inlinedFrames = frames(of: symbolicator, functions, returnAddresses: false)
    let distinctSeconds = Double(monotonic() - distinctStart) / 1e9
    print(
        "| warm, each address new (\(functions.count) frames, \(inlinedFrames) inlined frames found) | \(format(Double(functions.count) / distinctSeconds, 0)) frames/s |"
    )
    let rounds = 1_000_000
    let hot = Array(functions.prefix(1000))
    let repeatStart = monotonic()
    for round in 0..<rounds {
        let function = hot[round % hot.count]
        _ = symbolicator.symbolicate(
            modulePath: program, buildID: buildID, offset: function.address + function.size / 2, isReturnAddress: false)
    }
    let repeatSeconds = Double(monotonic() - repeatStart) / 1e9
    print(
        "| warm, addresses seen before (1,000 addresses, \(rounds) frames) | \(format(Double(rounds) / repeatSeconds, 0)) frames/s |"
    )
}
