/// The pages' one stylesheet, compiled into the binary and served at `/style.css` (the pages'
/// Content-Security-Policy allows styles from our own origin only, so none is inline). SwiftPM's
/// resources would be a folder beside the executable, which copying the binary loses.
enum Style {
    static let css = """
        :root { --fg: #1d232a; --dim: #66717d; --line: #dde2e7; --accent: #b3261e; --bar: #4a6fa5; --bg: #fff; }
        * { box-sizing: border-box; }
        body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--fg); background: var(--bg); }
        header { display: flex; gap: 1.2em; align-items: baseline; padding: .6em 1.2em; border-bottom: 1px solid var(--line); background: #f6f8fa; }
        header a { color: var(--fg); text-decoration: none; } header a.brand { font-weight: 700; }
        header a.on { border-bottom: 2px solid var(--accent); }
        main { padding: 1em 1.2em; max-width: 1400px; }
        h1 { font-size: 1.35em; margin: .2em 0 .5em; word-break: break-word; } h2 { font-size: 1.1em; margin: 1.4em 0 .4em; }
        a { color: #1f5fa8; }
        table { border-collapse: collapse; width: 100%; }
        th, td { text-align: left; padding: .35em .6em; border-bottom: 1px solid var(--line); vertical-align: top; }
        th { font-weight: 600; color: var(--dim); white-space: nowrap; } td.n, th.n { text-align: right; font-variant-numeric: tabular-nums; }
        td.title { max-width: 40em; word-break: break-word; }
        table.facts { width: auto; } table.facts th { padding-right: 2em; }
        .dim { color: var(--dim); } .small { font-size: .85em; }
        .new { display: inline-block; background: var(--accent); color: #fff; border-radius: 3px; padding: 0 .35em; font-size: .78em; font-weight: 600; margin-left: .3em; }
        form.filters { display: flex; flex-wrap: wrap; gap: .5em; align-items: end; margin-bottom: 1em; }
        form.filters label { display: flex; flex-direction: column; font-size: .8em; color: var(--dim); }
        input, select, button { font: inherit; padding: .2em .4em; }
        svg.chart rect { fill: var(--bar); } svg.chart rect.zero { fill: var(--line); }
        .counts { display: flex; gap: 2em; margin: .5em 0 1em; } .counts div b { display: block; font-size: 1.5em; }
        .facets { display: flex; flex-wrap: wrap; gap: 1.5em; } .facets table { width: auto; min-width: 16em; }
        pre, code { font: 12.5px/1.4 ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace; }
        pre { background: #f6f8fa; padding: .7em; overflow-x: auto; white-space: pre-wrap; word-break: break-all; }
        ol.frames { list-style: none; padding-left: 0; margin: .2em 0; font: 12.5px/1.5 ui-monospace, Menlo, Consolas, monospace; }
        ol.frames li { padding: 0 .3em; word-break: break-all; } ol.frames li.app { font-weight: 700; background: #fff5d6; }
        ol.frames li.system { color: var(--dim); } .mark { color: #8a4baf; font-weight: 400; }
        details { margin: .3em 0; } summary { cursor: pointer; } details.thread > summary { font-family: ui-monospace, Menlo, Consolas, monospace; }
        .crashed { color: var(--accent); font-weight: 700; }
        .pager { margin: 1em 0; display: flex; gap: 1em; }
        .up { color: var(--accent); } .down { color: #2d7d46; }
        """
}
