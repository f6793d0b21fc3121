import CrashCapture
import CrashFileFormat
import Foundation
import TestSupport
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// The records as the official Sensors Analytics SDKs send them (their sources: `track_signup`
/// with a top-level `original_id`; `login_id` beside `distinct_id` once logged in), checked on a
/// real session: events, a login, more events, a crash, and the replay that closes it.
@Suite struct WireFormatExactnessTests {
    @Test func aLoginAndACrashGiveTheRecordsTheOfficialSDKsSend() throws {
        let directory = makeTemporaryDirectory("wire-exact")
        let crashed = try run(
            Paths.swiftSample, ["pipeline-login-crash"],
            environment: ["CRASHCAPTURE_DIR": directory, "CRASH_SAMPLE_EVENTS": "2", "SWIFT_BACKTRACE": "enable=no"],
            timeout: 30)
        #expect(crashed.signal == SIGSEGV, "\(crashed.stderr)")
        let replay = try run(Paths.crashcap, ["replay", directory], timeout: 60)
        #expect(replay.exitCode == 0, "\(replay.stdout)")
        let events = try EventStore(path: directory + "/events.sqlite").events(limit: 1000).compactMap {
            try JSONSerialization.jsonObject(with: Data($0.payload.utf8)) as? [String: Any]
        }
        let names = events.map { $0["event"] as? String ?? "?" }
        #expect(
            names == [
                "$AppStart", "sample_event", "sample_event", "$SignUp", "sample_event", "sample_event", "$AppCrashed",
                "$AppEnd",
            ],
            "\(names)")
        let anonymous = try #require(events.first?["distinct_id"] as? String)
        let signUp = try #require(events.first { $0["event"] as? String == "$SignUp" })
        #expect(signUp["type"] as? String == "track_signup")
        #expect(signUp["original_id"] as? String == anonymous)
        #expect(signUp["distinct_id"] as? String == "user-42")
        #expect((signUp["properties"] as? [String: Any])?["$original_id"] == nil)
        let afterLogin = events.drop { $0["event"] as? String != "$SignUp" }.dropFirst()
        #expect(afterLogin.count == 4)
        for event in afterLogin {
            #expect(event["distinct_id"] as? String == "user-42", "\(event["event"] ?? "")")
            #expect(event["login_id"] as? String == "user-42", "\(event["event"] ?? "") lacks login_id")
        }
        for event in events where event["event"] as? String != "$SignUp" {
            #expect(event["type"] as? String == "track")
        }
        for event in events {
            let lib = (event["lib"] as? [String: Any])?["$lib_method"] as? String
            let property = (event["properties"] as? [String: Any])?["$lib_method"] as? String
            #expect(
                lib != nil && property == lib,
                "\(event["event"] ?? ""): lib \(lib ?? "-"), properties \(property ?? "-")")
        }
    }
}
