import ArgumentParser
import CrashFileFormat
import CrashSymbolication
import Foundation

#if canImport(Glibc)
    import Glibc
#endif

/// Where debug info comes from, for every command that names frames.
struct SymbolOptions: ParsableArguments {
    @Option(
        name: .customLong("symbols"),
        help: ArgumentHelp(
            "A symbol store (from `crashcap symbols add`); repeatable. CRASHCAPTURE_SYMBOLS adds more.",
            valueName: "DIR"))
    var stores: [String] = []

    @Flag(help: "Print Swift names in full (module, types, return type) instead of as the Swift backtracer does.")
    var fullNames = false

    func symbolicator() throws -> Symbolicator {
        for store in stores { try Crashcap.requireUTF8Path(store) }
        return Symbolicator(options: .fromEnvironment(adding: stores, fullSwiftNames: fullNames))
    }
}

extension Crashcap {
    struct Symbols: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Keep the debug info of the binaries you ship, by build-id.",
            discussion: """
                A crash replayed after its binary was redeployed (or from a stripped binary) is \
                named from the symbol store: point CRASHCAPTURE_SYMBOLS, Configuration.symbolStores \
                or `--symbols` at it.
                """,
            subcommands: [Add.self])

        struct Add: ParsableCommand {
            static let configuration = CommandConfiguration(
                abstract: "Copy binaries and their debug info into a symbol store.",
                discussion: """
                    Each BINARY goes to STORE/.build-id/xx/rest, and its separate debug info, when it \
                    has some (found by build-id or .gnu_debuglink), to STORE/.build-id/xx/rest.debug.
                    """)

            @Option(
                name: .customLong("store"),
                help: ArgumentHelp("The symbol store (default: the first of CRASHCAPTURE_SYMBOLS).", valueName: "DIR"))
            var store: String?

            @Argument(help: "Binaries or shared libraries, built with a GNU build-id.")
            var binaries: [String]

            func run() throws {
                let environmentStore = Symbolicator.Options.fromEnvironment().symbolStores.first
                guard let store = store ?? environmentStore else {
                    throw Crashcap.fail("no symbol store: give --store DIR or set CRASHCAPTURE_SYMBOLS", code: 64)
                }
                try Crashcap.requireUTF8Path(store)
                let symbolicator = Symbolicator(options: .fromEnvironment())
                var failed = false
                for binary in binaries {
                    do {
                        let added = try SymbolStore(path: store).add(binary: binary, symbolicator: symbolicator)
                        print(
                            "\(binary): build-id \(added.buildID)"
                                + (added.debugFile.map { ", debug info from \($0)" } ?? ", no debug info"))
                    } catch {
                        FileHandle.standardError.write(Data("crashcap: \(binary): \(error)\n".utf8))
                        failed = true
                    }
                }
                if failed { throw ExitCode(65) }
            }
        }
    }
}
