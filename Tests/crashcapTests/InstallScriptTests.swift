import Foundation
import TestSupport
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// Scripts/install.sh as a user runs it, into a prefix of its own (in debug, to keep the test
/// command's time: the same layout and the same static linking as the release the README
/// installs); then, from another directory and with a bare environment, what it installed works
/// without the checkout or the toolchain, as the README says it does.
@Suite(.serialized) struct InstallScriptTests {
    static let subcommands = [
        "harness", "show", "list", "export", "replay", "upload", "watch", "collect", "serve", "symbols",
    ]

    /// The fenced block that follows `<!-- marker -->` in the README, verbatim.
    static func readmeBlock(after marker: String) throws -> String {
        let readme = try String(contentsOfFile: Paths.packageRoot + "/README.md", encoding: .utf8)
        let lines = readme.split(separator: "\n", omittingEmptySubsequences: false)
        let start = try #require(lines.firstIndex { $0 == "<!-- \(marker) -->" }, "no <!-- \(marker) --> in README.md")
        let body = lines[(start + 2)...].prefix { !$0.hasPrefix("```") }
        try #require(lines[start + 1].hasPrefix("```"), "a fenced block follows <!-- \(marker) -->")
        return body.joined(separator: "\n")
    }

    @Test func anInstallWorksFromAnyDirectoryWithoutTheToolchainAndUninstallsWhole() throws {
        // A prefix that does not exist yet: the uninstall must leave nothing of it behind.
        let prefix = makeTemporaryDirectory("prefix") + "/usr"
        let script = Paths.packageRoot + "/Scripts/install.sh"
        let install = try run("/bin/sh", [script, "--prefix", prefix, "--configuration", "debug"], timeout: 1500)
        try #require(install.exitCode == 0, "\(install.stdout)\n\(install.stderr)")
        var installed = [
            "bin/crashcap", "lib/libcrashcapture.so.1", "lib/libcrashcapture.so", "lib/libCrashCapturePreload.so",
            "include/crashcapture.h", "lib/pkgconfig/crashcapture.pc", "share/man/man1/crashcap.1",
            "share/bash-completion/completions/crashcap", "share/zsh/site-functions/_crashcap",
            "share/fish/vendor_completions.d/crashcap.fish", "lib/systemd/system/crashcap-collect.service",
            "lib/systemd/system/crashcap-watch@.service",
        ]
        installed += Self.subcommands.map { "share/man/man1/crashcap.\($0).1" }
        for path in installed {
            #expect(FileManager.default.fileExists(atPath: prefix + "/" + path), "not installed: \(path)")
        }
        let link = try FileManager.default.destinationOfSymbolicLink(atPath: prefix + "/lib/libcrashcapture.so")
        #expect(link == "libcrashcapture.so.1")
        let soname = try run("/usr/bin/readelf", ["-d", prefix + "/lib/libcrashcapture.so.1"])
        #expect(soname.stdout.contains("Library soname: [libcrashcapture.so.1]"), "\(soname.stdout)")
        // The Swift runtime, Foundation and Dispatch are inside the binary: no toolchain needed.
        let ldd = try run("/usr/bin/ldd", [prefix + "/bin/crashcap"])
        #expect(ldd.exitCode == 0, "\(ldd.stderr)")
        for toolchainLibrary in ["swift", "Foundation", "dispatch", "BlocksRuntime", "/opt/"] {
            #expect(!ldd.stdout.contains(toolchainLibrary), "crashcap needs \(toolchainLibrary):\n\(ldd.stdout)")
        }

        // From another directory, with nothing in the environment but a PATH without the
        // toolchain (and where pkg-config finds this prefix's .pc, as it finds /usr/local's).
        let elsewhere = makeTemporaryDirectory("elsewhere")
        func bare(_ command: String) throws -> RunResult {
            try run(
                "/usr/bin/env",
                [
                    "-i", "PATH=/usr/bin:/bin", "PKG_CONFIG_PATH=\(prefix)/lib/pkgconfig", "/bin/sh", "-c",
                    "cd '\(elsewhere)' && \(command)",
                ], timeout: 120, inheritEnvironment: false)
        }
        let crashcap = "'\(prefix)/bin/crashcap'"
        let help = try bare("\(crashcap) --help")
        #expect(help.exitCode == 0 && help.stdout.contains("USAGE: crashcap"), "\(help.stdout)\(help.stderr)")
        #expect(Self.subcommands.allSatisfy { help.stdout.contains("  \($0) ") }, "\(help.stdout)")
        let page = try bare("man -l '\(prefix)/share/man/man1/crashcap.1'")
        #expect(page.exitCode == 0 && page.stdout.contains("crashcap"), "\(page.stdout)\(page.stderr)")
        #expect(page.stdout.contains("show"), "the page lists the subcommands: \(page.stdout)")
        let showPage = try bare("man -M '\(prefix)/share/man' crashcap.show")
        #expect(showPage.exitCode == 0 && showPage.stdout.contains("--json"), "\(showPage.stdout)\(showPage.stderr)")
        let flags = try bare("pkg-config --cflags --libs crashcapture")
        #expect(flags.stdout.contains("-I\(prefix)/include") && flags.stdout.contains("-lcrashcapture"), "\(flags)")
        let completion = try bare(
            "bash -c \". '\(prefix)/share/bash-completion/completions/crashcap' && complete -p crashcap\"")
        #expect(completion.stdout.contains("crashcap"), "\(completion.stdout)\(completion.stderr)")

        // The README's C program and the line that builds it, as written there; the program
        // then crashes, and the installed crashcap reads its report.
        let crashes = elsewhere + "/c-crashes"
        let program = try Self.readmeBlock(after: "readme-c: app.c")
        #expect(program.contains("/var/tmp/myapp-crashes") && program.contains("/* ... */"), "\(program)")
        try program.replacingOccurrences(of: "/var/tmp/myapp-crashes", with: crashes)
            .replacingOccurrences(of: "/* ... */", with: "*(volatile int *)8 = 42;")
            .write(toFile: elsewhere + "/app.c", atomically: true, encoding: .utf8)
        let buildLine = try Self.readmeBlock(after: "readme-c: build")
        #expect(buildLine.hasPrefix("cc app.c ") && buildLine.contains("pkg-config"), "\(buildLine)")
        let built = try bare(buildLine)
        try #require(built.exitCode == 0, "\(buildLine)\n\(built.stderr)")
        let crashed = try bare("./app; echo \"status $?\"")
        #expect(
            crashed.stdout.contains("status 139"), "the program dies of SIGSEGV: \(crashed.stdout)\(crashed.stderr)")
        let shown = try bare("\(crashcap) show '\(crashes)'")
        #expect(shown.exitCode == 0, "\(shown.stderr)")
        #expect(shown.stdout.contains("SIGSEGV in main"), "\(shown.stdout)")

        // The README's preload line, with this prefix for /usr/local, under a Python program.
        let pythonCrashes = elsewhere + "/python-crashes"
        let preloadLine = try Self.readmeBlock(after: "readme-preload")
        #expect(preloadLine.contains("/usr/local/lib/libCrashCapturePreload.so"), "\(preloadLine)")
        try "import ctypes\nctypes.string_at(0)\n".write(
            toFile: elsewhere + "/app.py", atomically: true, encoding: .utf8)
        let preloaded = try bare(
            preloadLine.replacingOccurrences(of: "/usr/local", with: prefix)
                .replacingOccurrences(of: "/var/tmp/app-crashes", with: pythonCrashes) + "; echo \"status $?\"")
        #expect(preloaded.stdout.contains("status 139"), "\(preloaded.stdout)\(preloaded.stderr)")
        let pythonShown = try bare("\(crashcap) show '\(pythonCrashes)'")
        #expect(pythonShown.exitCode == 0 && pythonShown.stdout.contains("SIGSEGV"), "\(pythonShown.stdout)")

        try checkUnits(in: prefix)

        let uninstall = try run("/bin/sh", [script, "--uninstall", "--prefix", prefix], timeout: 60)
        #expect(uninstall.exitCode == 0, "\(uninstall.stderr)")
        let left = (FileManager.default.enumerator(atPath: prefix)?.allObjects as? [String]) ?? []
        #expect(!FileManager.default.fileExists(atPath: prefix), "left behind: \(left)")
    }

    /// The units run the installed crashcap, with their hardening; systemd's own check passes
    /// where systemd-analyze is installed.
    func checkUnits(in prefix: String) throws {
        let units = prefix + "/lib/systemd/system"
        let collect = try String(contentsOfFile: units + "/crashcap-collect.service", encoding: .utf8)
        let watch = try String(contentsOfFile: units + "/crashcap-watch@.service", encoding: .utf8)
        #expect(collect.contains("ExecStart=\(prefix)/bin/crashcap collect "), "\(collect)")
        #expect(watch.contains("ExecStart=\(prefix)/bin/crashcap watch /var/crash/%i "), "\(watch)")
        for unit in [collect, watch] {
            for setting in [
                "NoNewPrivileges=yes", "ProtectSystem=strict", "PrivateTmp=yes", "ProtectHome=", "PrivateDevices=yes",
                "CapabilityBoundingSet=\n", "SystemCallFilter=@system-service", "RestrictAddressFamilies=",
            ] {
                #expect(unit.contains(setting), "\(setting) missing")
            }
        }
        #expect(watch.contains("ReadWritePaths=-/var/crash/%i"))
        #expect(collect.contains("DynamicUser=yes") && collect.contains("StateDirectory=crashcapture"))
        guard FileManager.default.isExecutableFile(atPath: "/usr/bin/systemd-analyze") else { return }
        // A template is checked as one of its instances.
        let instances = makeTemporaryDirectory("units")
        try FileManager.default.copyItem(
            atPath: units + "/crashcap-collect.service", toPath: instances + "/crashcap-collect.service")
        try FileManager.default.copyItem(
            atPath: units + "/crashcap-watch@.service", toPath: instances + "/crashcap-watch@root.service")
        for unit in ["crashcap-collect.service", "crashcap-watch@root.service"] {
            let verify = try run("/usr/bin/systemd-analyze", ["verify", "--man=no", instances + "/" + unit])
            // An unknown or misspelt setting is only a warning to it: none at all is expected.
            #expect(
                verify.exitCode == 0 && (verify.stdout + verify.stderr).isEmpty,
                "\(unit): \(verify.stdout)\(verify.stderr)")
        }
    }
}
