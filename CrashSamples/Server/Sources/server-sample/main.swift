// A server as Hummingbird and Vapor shape one: routes are async closures behind a protocol's
// witness, wrapped by generic responders, called from a connection handler on a task per
// request. A listener thread waits in epoll_wait for requests, Dispatch workers are parked,
// and the crash is three async calls below the route, each call suspended once: after a
// suspension the route and the responders are on no stack, only in the task's async contexts.
//
//   server-sample ROUTE [ROUTE ...]   serve each route once, in turn (see `routes` below)
//
// Under capture when CRASHCAPTURE_DIR is set; without it, the Swift runtime backtracer (or
// nothing) reports, which is what the tests compare us with.
import CrashCapture
import Foundation
import ServerSampleSupport

#if canImport(Glibc)
    import Glibc
#endif

struct Request: Sendable {
    var method: String
    var path: String
    var body: String
}

struct Response: Sendable {
    var status: Int
    var body: String
}

struct RequestContext: Sendable {
    var requestID: Int
}

protocol HTTPResponder<Context>: Sendable {
    associatedtype Context: Sendable
    func respond(to request: Request, context: Context) async throws -> Response
}

struct CallbackResponder<Context: Sendable>: HTTPResponder {
    let callback: @Sendable (Request, Context) async throws -> Response
    func respond(to request: Request, context: Context) async throws -> Response {
        try await callback(request, context)
    }
}

struct RouterResponder<Context: Sendable>: HTTPResponder {
    let routes: [String: any HTTPResponder<Context>]
    func respond(to request: Request, context: Context) async throws -> Response {
        guard let route = routes[request.method + " " + request.path] else {
            return Response(status: 404, body: "no route")
        }
        return try await route.respond(to: request, context: context)
    }
}

struct Router<Context: Sendable> {
    private var routes: [String: any HTTPResponder<Context>] = [:]

    mutating func on(
        _ method: String, _ path: String, use handler: @escaping @Sendable (Request, Context) async throws -> String
    ) {
        routes[method + " /" + path] = CallbackResponder { request, context in
            Response(status: 200, body: try await handler(request, context))
        }
    }

    func buildResponder() -> RouterResponder<Context> { RouterResponder(routes: routes) }
}

struct HTTPServer<Responder: HTTPResponder>: Sendable where Responder.Context == RequestContext {
    let responder: Responder

    func handleHTTP(_ request: Request, id: Int) async -> Response {
        do {
            return try await responder.respond(to: request, context: RequestContext(requestID: id))
        } catch {
            return Response(status: 500, body: "\(error)")
        }
    }

    /// Requests one after another, each on a task of its own, as a connection's are.
    func run(_ requests: AsyncStream<Request>) async {
        var id = 0
        for await request in requests {
            id += 1
            let response = await Task(name: "request \(id)") { [id] in await handleHTTP(request, id: id) }.value
            print("\(request.method) \(request.path): \(response.status) \(response.body)")
        }
    }
}

// MARK: - The app's own code, three async calls below the route

struct Order: Codable {
    var items: [Int]
}

func priceOfItem(_ items: [Int], at index: Int) -> Int { items[index] * 100 }

func refundLine(_ lines: [Int], at index: Int) -> Int { -lines[index] }

func loadUser(_ id: String) -> String {
    let users = ["ada": "Ada Lovelace"]
    return users[id]!
}

func applyDiscounts(_ order: Order) async throws -> Int {
    try await Task.sleep(for: .milliseconds(1))
    return priceOfItem(order.items, at: 5)
}

func priceOrder(_ order: Order) async throws -> Int {
    try await Task.sleep(for: .milliseconds(1))
    return try await applyDiscounts(order) + 1
}

func handleCheckout(_ body: String) async throws -> String {
    let order = try JSONDecoder().decode(Order.self, from: Data(body.utf8))
    try await Task.sleep(for: .milliseconds(1))
    return String(try await priceOrder(order))
}

func handleRefund(_ body: String) async throws -> String {
    let order = try JSONDecoder().decode(Order.self, from: Data(body.utf8))
    try await Task.sleep(for: .milliseconds(1))
    return String(refundLine(order.items, at: 9))
}

func handleProfile(_ id: String) async throws -> String {
    try await Task.sleep(for: .milliseconds(1))
    return loadUser(id)
}

func renderReport(_ name: String) async throws -> String {
    try await Task.sleep(for: .milliseconds(1))
    fatalError("no template for report \(name)")
}

/// A handler that makes a blocking call on the task's thread: the hang a watch catches.
func waitForLegacyBackend(milliseconds: Int) -> String {
    usleep(useconds_t(milliseconds * 1000))
    return "done"
}

func handleExport(_ milliseconds: Int) async throws -> String {
    try await Task.sleep(for: .milliseconds(1))
    // Beaten on the thread that then blocks: no suspension in between.
    let watch = CrashCapture.watch(name: "export", threshold: .milliseconds(200))
    defer { watch.stop() }
    watch.beat()
    return waitForLegacyBackend(milliseconds: milliseconds)
}

// MARK: - Serving

let environment = ProcessInfo.processInfo.environment
if let directory = environment["CRASHCAPTURE_DIR"] {
    do {
        try CrashCapture.install(.init(directory: directory, appName: "server-sample", appVersion: "1.0.0"))
    } catch {
        print("running without crash capture: \(error)")
    }
}

/// Right after install, before a thread of ours has read a static binary's symbol table.
func failAtStart() -> Never { fatalError("the configuration is missing") }
if CommandLine.arguments.dropFirst().first == "fail-at-start" { failAtStart() }

var router = Router<RequestContext>()
router.on("POST", "checkout") { request, _ in try await handleCheckout(request.body) }
router.on("POST", "refund") { request, _ in try await handleRefund(request.body) }
router.on("GET", "profile") { request, _ in try await handleProfile(request.body) }
router.on("GET", "report") { request, _ in try await renderReport(request.body) }
router.on("GET", "export") { request, _ in try await handleExport(Int(request.body) ?? 1000) }
let routes: [String: Request] = [
    "checkout": Request(method: "POST", path: "/checkout", body: #"{"items":[1,2,3]}"#),
    "refund": Request(method: "POST", path: "/refund", body: #"{"items":[4,5]}"#),
    "profile": Request(method: "GET", path: "/profile", body: "grace"),
    "report": Request(method: "GET", path: "/report", body: "quarterly"),
    "export": Request(method: "GET", path: "/export", body: environment["SERVER_SAMPLE_HANG_MS"] ?? "1000"),
    "ok": Request(method: "GET", path: "/nothing", body: ""),
]
let asked = CommandLine.arguments.dropFirst().map { name -> Request in
    guard let request = routes[name] else {
        FileHandle.standardError.write(Data("unknown route \(name): \(routes.keys.sorted())\n".utf8))
        exit(64)
    }
    return request
}

// The listener: a thread in epoll_wait on a pipe, as an event loop waits on its sockets.
let (requests, incoming) = AsyncStream<Request>.makeStream()
var pipeEnds: [Int32] = [0, 0]
guard pipe(&pipeEnds) == 0 else { fatalError("pipe: \(errno)") }
let readEnd = pipeEnds[0]
let writeEnd = pipeEnds[1]
let listener = Thread {
    var index: UInt8 = 0
    while server_sample_wait_readable(readEnd) == 0 {
        guard read(readEnd, &index, 1) == 1 else { break }
        if index == 0xff {
            incoming.finish()
            break
        }
        incoming.yield(asked[Int(index)])
    }
}
listener.name = "listener"
listener.start()
// Dispatch workers that wait, as a server's background queues do.
DispatchQueue.global().async { Thread.sleep(forTimeInterval: 600) }

let server = HTTPServer(responder: router.buildResponder())
for index in asked.indices {
    var byte = UInt8(index)
    _ = write(writeEnd, &byte, 1)
}
var end: UInt8 = 0xff
_ = write(writeEnd, &end, 1)
await server.run(requests)
CrashCapture.flush()
