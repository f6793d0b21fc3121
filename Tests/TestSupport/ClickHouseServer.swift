internal import Foundation
package import ProcessSupport

#if canImport(Glibc)
    import Glibc
#endif
#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

/// A ClickHouse server of its own for one test or benchmark: Debian's `clickhouse-server`
/// (installed by Scripts/install-dependencies.sh), on loopback, with its data, logs and
/// configuration in `directory`, killed with the object. Only its HTTP interface listens.
package final class ClickHouseServer {
    package struct Failure: Error, CustomStringConvertible {
        package let description: String
    }

    package static let executable = "/usr/sbin/clickhouse-server"
    package static var isInstalled: Bool { access(executable, X_OK) == 0 }

    package let directory: String
    package let port: Int
    package private(set) var child: ChildProcess
    /// `http://127.0.0.1:PORT/`
    package var url: String { "http://127.0.0.1:\(port)/" }

    /// `tcpPort`: also ClickHouse's native protocol, which a `Distributed` table speaks to its
    /// shards. `clusterShards`: the native ports of the shards (on 127.0.0.1) of a cluster named
    /// `crashcap_cluster`, one replica each, as the README's two-shard setup has.
    package init(directory: String, tcpPort: Int? = nil, clusterShards: [Int] = []) throws {
        guard Self.isInstalled else {
            throw Failure(
                description: "\(Self.executable) is missing: Scripts/install-dependencies.sh installs clickhouse-server"
            )
        }
        self.directory = directory
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        var lastError = ""
        // A port found free may be taken before the server binds it: try another.
        for _ in 0..<5 {
            let port = Self.freePort()
            try Self.configuration(port: port, tcpPort: tcpPort, shards: clusterShards, directory: directory).write(
                toFile: directory + "/config.xml", atomically: true, encoding: .utf8)
            try Self.users.write(toFile: directory + "/users.xml", atomically: true, encoding: .utf8)
            let child = try Self.launch(directory)
            if Self.answers(port: port, while: child) {
                self.port = port
                self.child = child
                return
            }
            lastError = (try? String(contentsOfFile: directory + "/error.log", encoding: .utf8)) ?? child.stderr
        }
        throw Failure(description: "clickhouse-server did not start: \(lastError.suffix(2000))")
    }

    private static func launch(_ directory: String) throws -> ChildProcess {
        try ChildProcess(
            path: executable, arguments: ["--config-file=\(directory)/config.xml"],
            environment: ProcessInfo.processInfo.environment)
    }

    /// Kills the server, for a test of a server gone away (a graceful stop waits seconds for
    /// its clients' connections).
    package func kill() {
        Glibc.kill(child.pid, SIGKILL)
        _ = child.wait(timeout: 30)
    }

    /// Starts it again on the same port and data.
    package func start() throws {
        child = try Self.launch(directory)
        guard Self.answers(port: port, while: child) else {
            throw Failure(description: "clickhouse-server did not restart")
        }
    }

    /// One statement's answer, as text; an HTTP error throws with ClickHouse's words.
    @discardableResult
    package func query(_ statement: String, database: String = "default") throws -> String {
        var request = URLRequest(url: URL(string: url + "?database=\(database)")!, timeoutInterval: 60)
        request.httpMethod = "POST"
        request.httpBody = Data(statement.utf8)
        let done = DispatchSemaphore(value: 0)
        let box = Answer()
        URLSession.shared.dataTask(with: request) { data, response, error in
            box.value = ((response as? HTTPURLResponse)?.statusCode ?? 0, data ?? Data(), error)
            done.signal()
        }.resume()
        if done.wait(timeout: .now() + 70) == .timedOut {
            throw Failure(description: "ClickHouse did not answer \(statement)")
        }
        let (status, data, error) = box.value
        let text = String(decoding: data, as: UTF8.self)
        guard status == 200 else {
            throw Failure(description: "ClickHouse: \(status) \(text) \(error.map { "\($0)" } ?? "")")
        }
        return text
    }

    private static func answers(port: Int, while child: ChildProcess) -> Bool {
        let deadline = Date().addingTimeInterval(30)
        while Date() < deadline {
            if child.exitCode != nil || child.signal != nil { return false }
            if let (status, _) = try? ping(port), status == 200 { return true }
            usleep(50_000)
        }
        return false
    }

    private static func ping(_ port: Int) throws -> (Int, Data) {
        let done = DispatchSemaphore(value: 0)
        let box = Answer()
        URLSession.shared.dataTask(with: URL(string: "http://127.0.0.1:\(port)/ping")!) { data, response, error in
            box.value = ((response as? HTTPURLResponse)?.statusCode ?? 0, data ?? Data(), error)
            done.signal()
        }.resume()
        _ = done.wait(timeout: .now() + 2)
        return (box.value.0, box.value.1)
    }

    /// A port nobody listens on now: one the kernel picks for a socket bound to port 0.
    package static func freePort() -> Int {
        let socket = Glibc.socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(socket) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(socket, $0, length) }
        }
        _ = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(socket, $0, &length) }
        }
        return Int(UInt16(bigEndian: address.sin_port))
    }

    /// The settings both ClickHouse 18.16 and today's releases read: the root element is
    /// `yandex` there and `clickhouse` (or still `yandex`) here.
    private static func configuration(port: Int, tcpPort: Int?, shards: [Int], directory: String) -> String {
        let native = tcpPort.map { "<tcp_port>\($0)</tcp_port>" } ?? ""
        let cluster =
            shards.isEmpty
            ? ""
            : "<remote_servers><crashcap_cluster>"
                + shards.map { "<shard><replica><host>127.0.0.1</host><port>\($0)</port></replica></shard>" }.joined()
                + "</crashcap_cluster></remote_servers>"
        return """
            <?xml version="1.0"?>
            <yandex>
                <logger><level>warning</level><log>\(directory)/server.log</log><errorlog>\(directory)/error.log</errorlog><console>0</console></logger>
                <listen_host>127.0.0.1</listen_host>
                <http_port>\(port)</http_port>
                \(native)
                \(cluster)
                <path>\(directory)/data/</path>
                <tmp_path>\(directory)/tmp/</tmp_path>
                <user_files_path>\(directory)/user_files/</user_files_path>
                <format_schema_path>\(directory)/format_schemas/</format_schema_path>
                <mark_cache_size>5368709120</mark_cache_size>
                <max_concurrent_queries>100</max_concurrent_queries>
                <users_config>users.xml</users_config>
                <default_profile>default</default_profile>
                <default_database>default</default_database>
                <timezone>UTC</timezone>
            </yandex>
            """
    }

    private static let users = """
        <?xml version="1.0"?>
        <yandex>
            <profiles><default></default></profiles>
            <users><default><password></password><networks><ip>127.0.0.1</ip></networks><profile>default</profile><quota>default</quota></default></users>
            <quotas><default></default></quotas>
        </yandex>
        """
}

/// An answer handed from URLSession's thread to the waiting test. `@unchecked`: written before
/// the semaphore is signalled, read after the wait.
private final class Answer: @unchecked Sendable {
    var value: (Int, Data, Error?) = (0, Data(), nil)
}
