internal import Foundation

/// Text made safe for the place it goes. Everything a page shows that came from an event (a
/// title, a thread name, a module path, a context value) is written by whoever could post to
/// the collector: it only ever reaches a page through these.
enum HTML {
    /// For element content and for attribute values in double quotes (the only quoting the pages
    /// use): `&`, `<`, `>`, `"` and `'` as entities, and control characters other than tab and
    /// newline as U+FFFD, so that no byte of the text can end an element, an attribute or a
    /// comment, or start a tag, inside HTML or inline SVG.
    static func escape(_ text: String) -> String {
        var out = ""
        out.reserveCapacity(text.utf8.count + 16)
        for scalar in text.unicodeScalars {
            switch scalar {
            case "&": out += "&amp;"
            case "<": out += "&lt;"
            case ">": out += "&gt;"
            case "\"": out += "&quot;"
            case "'": out += "&#39;"
            case "\t", "\n": out.unicodeScalars.append(scalar)
            case _ where scalar.value < 0x20 || (0x7f...0x9f).contains(scalar.value): out += "\u{FFFD}"
            default: out.unicodeScalars.append(scalar)
            }
        }
        return out
    }

    /// A query component: everything but unreserved characters percent-encoded, so that a value
    /// (`javascript:…` included) stays a value of our own path's query, never a scheme or a new
    /// parameter.
    static func component(_ text: String) -> String {
        var allowed = CharacterSet.alphanumerics.intersection(
            CharacterSet(charactersIn: Unicode.Scalar(0)..<Unicode.Scalar(128)))
        allowed.insert(charactersIn: "-._~")
        return text.addingPercentEncoding(withAllowedCharacters: allowed) ?? ""
    }

    /// A link to one of our own paths (always starting with `/`) with its query, escaped for an
    /// attribute.
    static func href(_ path: String, _ items: [(String, String)]) -> String {
        let query = items.map { component($0.0) + "=" + component($0.1) }.joined(separator: "&")
        return escape(query.isEmpty ? path : path + "?" + query)
    }

    /// A whole page: the shell, our one stylesheet, no script.
    static func page(title: String, nav: String, body: String) -> String {
        """
        <!DOCTYPE html>
        <html lang="en"><head><meta charset="utf-8">
        <meta name="viewport" content="width=device-width, initial-scale=1">
        <title>\(escape(title)) · crashcap</title>
        <link rel="stylesheet" href="/style.css"><link rel="icon" href="data:,">
        </head><body>
        <header><a class="brand" href="/">crashcap</a>\(nav)</header>
        <main>
        \(body)
        </main></body></html>
        """
    }

    static func time(_ milliseconds: Int64) -> String {
        guard milliseconds > 0 else { return "–" }
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = [.withFullDate, .withTime, .withColonSeparatorInTime, .withSpaceBetweenDateAndTime]
        return formatter.string(from: Date(timeIntervalSince1970: Double(milliseconds) / 1000)) + " UTC"
    }

    /// "3 h ago", against `now`.
    static func ago(_ milliseconds: Int64, now: Int64) -> String {
        let seconds = max(0, (now - milliseconds) / 1000)
        switch seconds {
        case ..<60: return "\(seconds) s ago"
        case ..<3600: return "\(seconds / 60) min ago"
        case ..<86400: return "\(seconds / 3600) h ago"
        default: return "\(seconds / 86400) d ago"
        }
    }

    static func percent(_ part: Int, of whole: Int) -> String {
        guard whole > 0 else { return "–" }
        return String(format: "%.1f %%", Double(part) * 100 / Double(whole))
    }
}

/// Bar charts drawn on the server, as inline SVG: numbers only go into it, and the one text (a
/// bar's tooltip) is escaped as any other.
enum Chart {
    /// A baseline and one bar for each day with events, whole pixels, and one `<title>` with
    /// every day's count: 50 rows of the list with their charts stay a few KiB each.
    static func bars(_ counts: [Int], width: Int, height: Int, label: String) -> String {
        let top = max(counts.max() ?? 0, 1)
        let step = max(width / max(counts.count, 1), 2)
        var svg =
            "<svg class=\"chart\" width=\"\(step * counts.count)\" height=\"\(height)\" viewBox=\"0 0 \(step * counts.count) \(height)\">"
            + "<title>\(HTML.escape(label))</title><rect class=\"zero\" x=\"0\" y=\"\(height - 1)\" width=\"\(step * counts.count)\" height=\"1\"/>"
        for (index, count) in counts.enumerated() where count > 0 {
            let barHeight = max(2, Int((Double(count) / Double(top) * Double(height)).rounded()))
            svg +=
                "<rect x=\"\(index * step)\" y=\"\(height - barHeight)\" width=\"\(step - 1)\" height=\"\(barHeight)\"/>"
        }
        return svg + "</svg>"
    }
}
