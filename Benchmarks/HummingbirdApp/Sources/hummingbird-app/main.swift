import CrashCapture
import Foundation
import Hummingbird

struct Order: Decodable {
    var items: [Int]
}

func priceOfItem(_ items: [Int], at index: Int) -> Int { items[index] * 100 }

func refundLine(_ lines: [Int], at index: Int) -> Int { -lines[index] }

func handleCheckout(_ body: String) async throws -> String {
    let order = try JSONDecoder().decode(Order.self, from: Data(body.utf8))
    try await Task.sleep(for: .milliseconds(1))
    return String(priceOfItem(order.items, at: 5))  // index out of range
}

func handleRefund(_ body: String) async throws -> String {
    let order = try JSONDecoder().decode(Order.self, from: Data(body.utf8))
    try await Task.sleep(for: .milliseconds(1))
    return String(refundLine(order.items, at: 9))  // another index out of range
}

let environment = ProcessInfo.processInfo.environment
// Under capture when CRASHCAPTURE_DIR is set; without it the Swift runtime backtracer reports.
if let directory = environment["CRASHCAPTURE_DIR"] {
    try CrashCapture.install(.init(directory: directory, appName: "hummingbird-app", appVersion: "1.0.0"))
}

let router = Router()
router.post("checkout") { request, _ -> String in
    try await handleCheckout(String(buffer: try await request.body.collect(upTo: 1 << 16)))
}
router.post("refund") { request, _ -> String in
    try await handleRefund(String(buffer: try await request.body.collect(upTo: 1 << 16)))
}
let port = Int(environment["PORT"] ?? "8080") ?? 8080
let app = Application(router: router, configuration: .init(address: .hostname("127.0.0.1", port: port)))
try await app.runService()
