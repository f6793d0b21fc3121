import Foundation
import TestSupport
import Testing

/// The symbolicator declares the few elfutils types and constants it uses itself
/// (Sources/CElfutils/libdw_abi.h) so that nothing building CrashCapture needs libdw-dev. Here
/// the same layouts are printed once through elfutils' own headers and once through ours.
@Suite struct ElfutilsABITests {
    static let probe = """
        #include <stddef.h>
        #include <stdio.h>
        int main(void) {
            printf("die %zu attribute %zu valp %zu callbacks %zu path %zu\\n", sizeof(Dwarf_Die),
                   sizeof(Dwarf_Attribute), offsetof(Dwarf_Attribute, valp), sizeof(Dwfl_Callbacks),
                   offsetof(Dwfl_Callbacks, debuginfo_path));
            printf("tags %d %d %d %d %d\\n", TAG(inlined_subroutine), TAG(subprogram), TAG(entry_point), TAG(module),
                   TAG(namespace));
            printf("attributes %d %d %d %d %d %d\\n", AT(name), AT(call_file), AT(call_line), AT(call_column),
                   AT(linkage_name), AT(MIPS_linkage_name));
            return 0;
        }
        """

    func printed(header: String, prefix: String) throws -> String {
        let folder = makeTemporaryDirectory("abi")
        let source = folder + "/probe.c"
        let program = """
            \(header)
            #define TAG(name) \(prefix)TAG_##name
            #define AT(name) \(prefix)AT_##name
            \(Self.probe)
            """
        try Data(program.utf8).write(to: URL(fileURLWithPath: source))
        let built = try run(
            "/usr/bin/gcc", ["-I", Paths.packageRoot + "/Sources/CElfutils", "-o", folder + "/probe", source])
        guard built.exitCode == 0 else { throw TestFailure(built.stderr) }
        return try run(folder + "/probe").stdout
    }

    @Test func ourDeclarationsMatchElfutilsHeaders() throws {
        let theirs = try printed(header: "#include <elfutils/libdwfl.h>\n#include <dwarf.h>", prefix: "DW_")
        let ours = try printed(header: "#include \"libdw_abi.h\"", prefix: "CC_DW_")
        #expect(theirs.contains("die 32"))
        #expect(ours == theirs)
    }
}
