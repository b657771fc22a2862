"""The status page served at ``GET /``: one self-contained HTML document
(inline CSS and JS, nothing fetched from elsewhere, no framework).

It polls ``v1/stats`` (status.py) once a second with the browser's own
credentials for this origin, keeps the last ten minutes in the tab and
draws them itself; at load it asks for the server's samples of the last
ten minutes (``?since=``), so the chart starts with what happened before
it was opened (``#chart[data-past]``: how many points came from them).
Elements a test or a script reads carry stable ids and data attributes:
``#chart[data-points][data-denied][data-allowed][data-past]``,
``#rule-chart[data-series][data-selected]`` (a rule picked by a click
on its row, else the most denied), ``#top-denied tbody tr[data-rule]``
(``data-denied``), ``#denied-total``, ``#allowed-total``, ``#ops``,
``#buckets``, ``#clients``, ``#repl-role``, ``#conn-status[data-state]``,
``#overload[data-level][data-forced]`` (``#shed-level``: the level's name,
``#loop-busy``, ``#loop-lag``) and ``#shed-counts tbody tr[data-priority]``
(``data-allowed``, ``data-denied``).
A string constant rather than a data file: the wheel needs no
package-data entry and the server reads no file at run time.
"""

PAGE = r"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<title>fastlimit status</title>
<style>
:root { --bg:#0f1419; --panel:#172029; --line:#263342; --text:#d8e1ea; --dim:#8696a7;
        --allowed:#3fb950; --denied:#f85149; --shadow:#d29922; --accent:#58a6ff; }
* { box-sizing: border-box; }
body { margin:0; background:var(--bg); color:var(--text);
       font:14px/1.4 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; }
header { display:flex; align-items:baseline; gap:1rem; padding:.8rem 1.2rem;
         border-bottom:1px solid var(--line); flex-wrap:wrap; }
header h1 { font-size:1.15rem; margin:0; font-weight:600; }
header .meta { color:var(--dim); font-size:.85rem; }
#conn-status { margin-left:auto; font-size:.85rem; padding:.1rem .6rem; border-radius:1rem;
               background:var(--line); }
#conn-status[data-state="live"] { background:#12381f; color:var(--allowed); }
#conn-status[data-state="error"] { background:#3d1414; color:var(--denied); }
main { padding:1rem 1.2rem; display:grid; gap:1rem;
       grid-template-columns:repeat(auto-fit, minmax(460px, 1fr)); }
.cards { grid-column:1/-1; display:grid; gap:.6rem;
         grid-template-columns:repeat(auto-fit, minmax(130px, 1fr)); }
.card, section { background:var(--panel); border:1px solid var(--line); border-radius:6px; }
.card { padding:.55rem .8rem; }
.card .label { color:var(--dim); font-size:.75rem; text-transform:uppercase; letter-spacing:.04em; }
.card .value { font-size:1.35rem; font-variant-numeric:tabular-nums; white-space:nowrap; }
.card .sub { color:var(--dim); font-size:.75rem; }
.allowed { color:var(--allowed); } .denied { color:var(--denied); } .shadow { color:var(--shadow); }
section { padding:.7rem .9rem; min-width:0; }
section.wide { grid-column:1/-1; }
section h2 { font-size:.9rem; margin:0 0 .5rem; font-weight:600; display:flex; gap:.6rem;
             align-items:center; }
section h2 .hint { color:var(--dim); font-weight:400; font-size:.8rem; }
.windows { margin-left:auto; display:flex; gap:.25rem; }
.windows button { background:var(--line); color:var(--text); border:0; border-radius:4px;
                  padding:.15rem .5rem; cursor:pointer; font:inherit; font-size:.8rem; }
.windows button[aria-pressed="true"] { background:var(--accent); color:#000; }
canvas { width:100%; height:240px; display:block; }
.legend { display:flex; flex-wrap:wrap; gap:.3rem 1rem; font-size:.8rem; color:var(--dim);
          margin-top:.35rem; min-height:1.2em; }
.legend i { display:inline-block; width:.8rem; height:.22rem; vertical-align:middle;
            margin-right:.3rem; border-radius:1px; }
table { width:100%; border-collapse:collapse; font-variant-numeric:tabular-nums; }
th, td { padding:.28rem .45rem; text-align:right; border-bottom:1px solid var(--line);
         white-space:nowrap; }
th { color:var(--dim); font-weight:500; font-size:.78rem; }
th:first-child, td:first-child { text-align:left; white-space:normal; word-break:break-all; }
#top-denied tbody tr[data-rule], .legend [data-rule] { cursor:pointer; }
#top-denied tbody tr[aria-selected="true"] td { background:#1f2d3a; }
.legend button { background:none; border:0; color:var(--accent); cursor:pointer; font:inherit;
                 padding:0; }
td.empty { text-align:center; color:var(--dim); padding:1rem; }
.bar { display:inline-block; height:.5rem; background:var(--denied); border-radius:1px;
       vertical-align:middle; margin-right:.35rem; opacity:.8; }
dl { display:grid; grid-template-columns:max-content 1fr; gap:.2rem 1rem; margin:0; }
dt { color:var(--dim); } dd { margin:0; font-variant-numeric:tabular-nums; word-break:break-all; }
.note { color:var(--dim); font-size:.78rem; margin-top:.4rem; }
#shed-counts { margin-top:.5rem; }
</style>
</head>
<body>
<header>
  <h1>fastlimit</h1>
  <span class="meta" id="server-meta">connecting&hellip;</span>
  <span id="conn-status" data-state="connecting">connecting</span>
</header>
<main>
  <div class="cards">
    <div class="card"><div class="label">allowed / s</div>
      <div class="value allowed" id="allowed-rate">&ndash;</div>
      <div class="sub">total <span id="allowed-total">&ndash;</span></div></div>
    <div class="card"><div class="label">denied / s</div>
      <div class="value denied" id="denied-rate">&ndash;</div>
      <div class="sub">total <span id="denied-total">&ndash;</span></div></div>
    <div class="card"><div class="label">shadow denied / s</div>
      <div class="value shadow" id="shadow-rate">&ndash;</div>
      <div class="sub">total <span id="shadow-total">&ndash;</span></div></div>
    <div class="card"><div class="label">ops / s</div>
      <div class="value" id="ops">&ndash;</div>
      <div class="sub"><span id="commands-total">&ndash;</span> commands</div></div>
    <div class="card"><div class="label">buckets</div>
      <div class="value" id="buckets">&ndash;</div>
      <div class="sub"><span id="rules-count">&ndash;</span> rules</div></div>
    <div class="card"><div class="label">clients</div>
      <div class="value" id="clients">&ndash;</div>
      <div class="sub">of <span id="clients-max">&ndash;</span></div></div>
    <div class="card"><div class="label">memory (RSS)</div>
      <div class="value" id="memory">&ndash;</div>
      <div class="sub">buckets <span id="memory-buckets">&ndash;</span></div></div>
    <div class="card"><div class="label">replication</div>
      <div class="value" id="repl-role">&ndash;</div>
      <div class="sub" id="repl-summary">&ndash;</div></div>
  </div>

  <section class="wide">
    <h2>Decisions per second <span class="hint">all rules</span>
      <span class="windows" id="windows">
        <button data-window="60">1 min</button><button data-window="300">5 min</button>
        <button data-window="600">10 min</button></span></h2>
    <canvas id="chart" data-points="0" data-allowed="0" data-denied="0" data-shadow="0"
            data-past="0"></canvas>
    <div class="legend"><span><i style="background:var(--allowed)"></i>allowed</span>
      <span><i style="background:var(--denied)"></i>denied</span>
      <span><i style="background:var(--shadow)"></i>shadow denied</span></div>
  </section>

  <section class="wide">
    <h2><span id="rule-chart-title">Denied per second by rule</span>
      <span class="hint" id="rule-chart-hint"></span></h2>
    <canvas id="rule-chart" data-series="[]" data-selected=""></canvas>
    <div class="legend" id="rule-legend"></div>
  </section>

  <section class="wide">
    <h2>Top denied rules <span class="hint" id="top-hint"></span></h2>
    <table id="top-denied">
      <thead><tr><th>rule</th><th title="mean over the last 10 s">denied/s (10 s)</th>
        <th>denied</th><th>shadow</th><th>allowed</th><th>denied %</th></tr></thead>
      <tbody><tr><td class="empty" colspan="6">waiting for the first snapshot</td></tr></tbody>
    </table>
    <div class="note" id="rules-note"></div>
  </section>

  <section>
    <h2>Hot keys <span class="hint" id="hot-hint"></span></h2>
    <table id="hot-keys">
      <thead><tr><th>key</th><th>source</th>
        <th title="estimated checks per second; at least the second figure">checks/s</th>
        <th title="Space-Saving's guaranteed part of the estimate">at least</th></tr></thead>
      <tbody><tr><td class="empty" colspan="4">waiting for the first snapshot</td></tr></tbody>
    </table>
  </section>

  <section>
    <h2>Latency <span class="hint">mean per call since start</span></h2>
    <table id="latency">
      <thead><tr><th>command</th><th>front</th><th>calls</th><th>&micro;s/call</th>
        <th>errors</th></tr></thead>
      <tbody><tr><td class="empty" colspan="5">waiting for the first snapshot</td></tr></tbody>
    </table>
  </section>

  <section>
    <h2>Overload <span class="hint" id="overload-hint"></span></h2>
    <dl id="overload" data-level="" data-forced="">
      <dt>shedding</dt><dd id="shed-level">&ndash;</dd>
      <dt>loop busy</dt><dd id="loop-busy">&ndash;</dd>
      <dt>loop lag</dt><dd id="loop-lag">&ndash;</dd>
      <dt>held-back input</dt><dd id="held-input">&ndash;</dd>
    </dl>
    <table id="shed-counts">
      <thead><tr><th>priority</th>
        <th title="shed checks answered allowed, their buckets untouched">shed, allowed</th>
        <th title="shed checks of fail-closed rules, answered denied">shed, denied</th></tr></thead>
      <tbody><tr><td class="empty" colspan="3">waiting for the first snapshot</td></tr></tbody>
    </table>
  </section>

  <section>
    <h2>Replication</h2>
    <dl id="replication"><dt>role</dt><dd>&ndash;</dd></dl>
    <table id="replicas" hidden>
      <thead><tr><th>replica</th><th>state</th><th>offset</th><th>lag s</th></tr></thead>
      <tbody></tbody>
    </table>
  </section>
</main>
<script>
"use strict";
(function () {
  const POLL_MS = 1000;
  const KEEP_S = 600;                 // history kept in the tab
  const TOP_RULES = 100;              // rules asked for in each snapshot
  const TABLE_ROWS = 15;
  const CHART_RULES = 6;
  const RULE_COLORS = ["#f85149", "#58a6ff", "#d29922", "#bc8cff", "#39c5cf", "#ff7b72"];
  const $ = (id) => document.getElementById(id);

  // One entry per snapshot after the first: the seconds it covers and what
  // happened in them (totals, and per rule only the rules that moved).
  const history = [];
  let last = null;                    // the previous snapshot
  let windowS = 60;
  let latest = null;
  let selected = null;                // a rule picked in the table: its own decisions charted

  const fmt = new Intl.NumberFormat("en-US");
  function num(n) { return n === undefined || n === null ? "\u2013" : fmt.format(n); }
  function rate(n) {
    if (!isFinite(n)) return "\u2013";
    return n >= 100 ? fmt.format(Math.round(n)) : n >= 10 ? n.toFixed(1) : n.toFixed(2);
  }
  function bytes(n) {
    const units = [["GiB", 1 << 30], ["MiB", 1 << 20], ["KiB", 1 << 10]];
    for (const [u, size] of units) if (n >= size) return (n / size).toFixed(1) + " " + u;
    return n + " B";
  }
  function micros(us) {
    return us >= 1000 ? (us / 1000).toFixed(1) + " ms" : fmt.format(us) + " \u00b5s";
  }
  function duration(s) {
    const d = Math.floor(s / 86400), h = Math.floor(s / 3600) % 24, m = Math.floor(s / 60) % 60;
    if (d) return d + "d " + h + "h";
    if (h) return h + "h " + m + "m";
    return m ? m + "m " + (s % 60) + "s" : s + "s";
  }
  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") e.className = v; else e.setAttribute(k, v);
    }
    for (const c of children) e.append(c instanceof Node ? c : String(c));
    return e;
  }
  function setText(id, text) { const e = $(id); if (e.textContent !== text) e.textContent = text; }

  // ---- history -------------------------------------------------------------------------
  function record(s) {
    // A restart starts the counters over; a deleted rule takes its counts
    // out of the totals (a negative step, shown as none).
    const restarted = last && s.uptime_s < last.uptime_s;
    if (restarted) history.length = 0;
    if (last && !restarted) {
      const dt = Math.max((s.time_ms - last.time_ms) / 1000, 0.001);
      const before = new Map(last.rules.top.map((r) => [r.id, r]));
      // A Map, not an object: a rule id is any string, "__proto__" too.
      const rules = new Map();
      for (const r of s.rules.top) {
        const b = before.get(r.id);
        if (!b) continue;             // newly listed: no delta to show yet
        const d = [r.allowed - b.allowed, r.denied - b.denied, r.shadow_denied - b.shadow_denied];
        if (d[0] > 0 || d[1] > 0 || d[2] > 0) rules.set(r.id, d.map((x) => Math.max(x, 0)));
      }
      const t = s.rules.totals, p = last.rules.totals;
      history.push({ t: s.time_ms, dt: dt, allowed: Math.max(t.allowed - p.allowed, 0),
                     denied: Math.max(t.denied - p.denied, 0),
                     shadow: Math.max(t.shadow_denied - p.shadow_denied, 0), rules: rules });
      const cutoff = s.time_ms - KEEP_S * 1000;
      while (history.length && history[0].t < cutoff) history.shift();
    }
    last = s;
  }

  function inWindow() {
    if (!history.length) return [];
    const cutoff = history[history.length - 1].t - windowS * 1000;
    let i = history.length;
    while (i > 0 && history[i - 1].t > cutoff) i--;
    return history.slice(i);
  }

  // Per rule over the samples given: sums of allowed, denied, shadow denied.
  function ruleSums(samples) {
    const sums = new Map();
    for (const h of samples) {
      for (const [id, d] of h.rules) {
        const s = sums.get(id) || [0, 0, 0];
        s[0] += d[0]; s[1] += d[1]; s[2] += d[2];
        sums.set(id, s);
      }
    }
    return sums;
  }

  // ---- chart ------------------------------------------------------------------------------
  function niceMax(v) {
    if (v <= 0) return 1;
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 2, 2.5, 5, 10]) if (v <= m * p) return m * p;
    return 10 * p;
  }

  // series: [{color, dash, values: [per-second value per sample]}], times: sample ends (ms)
  function draw(canvas, times, series) {
    const dpr = window.devicePixelRatio || 1;
    const w = canvas.clientWidth, h = canvas.clientHeight;
    if (canvas.width !== Math.round(w * dpr) || canvas.height !== Math.round(h * dpr)) {
      canvas.width = Math.round(w * dpr); canvas.height = Math.round(h * dpr);
    }
    const g = canvas.getContext("2d");
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    g.clearRect(0, 0, w, h);
    const css = getComputedStyle(document.documentElement);
    const dim = css.getPropertyValue("--dim").trim(), grid = css.getPropertyValue("--line").trim();
    const left = 56, right = 10, top = 10, bottom = 22;
    const pw = Math.max(w - left - right, 1), ph = Math.max(h - top - bottom, 1);
    let max = 0;
    for (const s of series) for (const v of s.values) if (v > max) max = v;
    max = niceMax(max);
    g.font = "11px system-ui, sans-serif";
    g.fillStyle = dim; g.strokeStyle = grid; g.lineWidth = 1;
    g.textAlign = "right"; g.textBaseline = "middle";
    for (let i = 0; i <= 4; i++) {
      const y = top + ph - (ph * i) / 4;
      g.beginPath(); g.moveTo(left, Math.round(y) + 0.5); g.lineTo(left + pw, Math.round(y) + 0.5);
      g.stroke();
      g.fillText(rate((max * i) / 4) + "/s", left - 6, y);
    }
    const end = times.length ? times[times.length - 1] : Date.now();
    const start = end - windowS * 1000;
    const x = (t) => left + ((t - start) / (windowS * 1000)) * pw;
    g.textAlign = "center"; g.textBaseline = "top";
    const step = windowS <= 60 ? 10 : windowS <= 300 ? 60 : 120;
    for (let a = 0; a <= windowS; a += step) {
      g.fillText(a ? "-" + (a >= 60 ? a / 60 + "m" : a + "s") : "now", x(end - a * 1000),
                 top + ph + 5);
    }
    if (!times.length) {
      g.textAlign = "center"; g.textBaseline = "middle";
      g.fillText("collecting\u2026 (one point a second)", left + pw / 2, top + ph / 2);
      return;
    }
    for (const s of series) {
      g.strokeStyle = s.color; g.lineWidth = 1.6; g.setLineDash(s.dash ? [4, 3] : []);
      g.beginPath();
      s.values.forEach((v, i) => {
        const px = x(times[i]), py = top + ph - (v / max) * ph;
        if (i) g.lineTo(px, py); else g.moveTo(px, py);
      });
      if (s.values.length === 1) g.lineTo(x(times[0]) - 2, top + ph - (s.values[0] / max) * ph);
      g.stroke();
    }
    g.setLineDash([]);
  }

  function color(name) {
    return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
  }

  function decisionSeries(samples, part) {
    return [{ color: color("--allowed"), values: samples.map((h) => part(h, 0)) },
            { color: color("--shadow"), dash: true, values: samples.map((h) => part(h, 2)) },
            { color: color("--denied"), values: samples.map((h) => part(h, 1)) }];
  }

  function drawCharts() {
    const samples = inWindow();
    const times = samples.map((h) => h.t);
    const chart = $("chart");
    const TOTALS = ["allowed", "denied", "shadow"];
    draw(chart, times, decisionSeries(samples, (h, k) => h[TOTALS[k]] / h.dt));
    const sum = (k) => samples.reduce((a, h) => a + h[k], 0);
    chart.dataset.points = samples.length;
    chart.dataset.allowed = sum("allowed");
    chart.dataset.denied = sum("denied");
    chart.dataset.shadow = sum("shadow");
    if (selected === null) drawTopRules(samples, times); else drawSelectedRule(samples, times);
  }

  // The selected rule's allowed, denied and shadow denied per second.
  function drawSelectedRule(samples, times) {
    const ruleChart = $("rule-chart");
    draw(ruleChart, times, decisionSeries(samples, (h, k) => {
      const d = h.rules.get(selected);
      return d ? d[k] / h.dt : 0;
    }));
    const d = ruleSums(samples).get(selected) || [0, 0, 0];
    ruleChart.dataset.selected = selected;
    ruleChart.dataset.series = JSON.stringify([{ id: selected, allowed: d[0], denied: d[1],
                                                 shadow_denied: d[2] }]);
    setText("rule-chart-title", "Rule " + selected);
    setText("rule-chart-hint", "decisions per second");
    const back = el("button", { type: "button", id: "show-top-rules" },
                    "← the most denied rules");
    $("rule-legend").replaceChildren(
      el("span", {}, el("i", { style: "background:var(--allowed)" }), "allowed"),
      el("span", {}, el("i", { style: "background:var(--denied)" }), "denied"),
      el("span", {}, el("i", { style: "background:var(--shadow)" }), "shadow denied"), back);
  }

  // Denied (and shadow denied) per second of the most denied rules.
  function drawTopRules(samples, times) {
    const sums = ruleSums(samples);
    const ranked = [...sums.entries()].filter(([, s]) => s[1] + s[2] > 0)
      .sort((a, b) => (b[1][1] + b[1][2]) - (a[1][1] + a[1][2]) || (a[0] < b[0] ? -1 : 1))
      .slice(0, CHART_RULES);
    const series = ranked.map(([id], i) => ({
      id: id, color: RULE_COLORS[i % RULE_COLORS.length],
      values: samples.map((h) => {
        const d = h.rules.get(id);
        return d ? (d[1] + d[2]) / h.dt : 0;
      }) }));
    const ruleChart = $("rule-chart");
    draw(ruleChart, times, series);
    ruleChart.dataset.selected = "";
    setText("rule-chart-title", "Denied per second by rule");
    setText("rule-chart-hint", "the most denied rules in the window, shadow denials " +
            "included; pick a rule below for its own chart");
    ruleChart.dataset.series = JSON.stringify(ranked.map(([id, s]) => ({ id: id, denied: s[1],
                                                                        shadow_denied: s[2] })));
    const legend = $("rule-legend");
    legend.replaceChildren(...(series.length ? series.map((s) => el("span", { "data-rule": s.id },
      el("i", { style: "background:" + s.color }), s.id))
      : [el("span", {}, samples.length ? "no denials in this window" : "")]));
  }

  // ---- tables and cards ---------------------------------------------------------------------
  function renderRules(s) {
    const body = $("top-denied").tBodies[0];
    const rules = s.rules;
    const recent = ruleSums(history.filter((h) => h.t > s.time_ms - 10000));
    const recentS = history.filter((h) => h.t > s.time_ms - 10000).reduce((a, h) => a + h.dt, 0);
    const rows = rules.top.map((r) => {
      const d = recent.get(r.id);
      return { r: r, rate: d && recentS ? (d[1] + d[2]) / recentS : 0 };
    }).sort((a, b) => b.rate - a.rate || (b.r.denied + b.r.shadow_denied) -
             (a.r.denied + a.r.shadow_denied) || (a.r.id < b.r.id ? -1 : 1))
      .slice(0, TABLE_ROWS);
    const most = Math.max(1, ...rows.map((x) => x.r.denied + x.r.shadow_denied));
    if (!rows.length) {
      body.replaceChildren(el("tr", {}, el("td", { class: "empty", colspan: 6 },
        "no rules yet \u2014 add one with CL.RULE SET or PUT /v1/rules/{id}")));
    } else {
      body.replaceChildren(...rows.map(({ r, rate: rps }) => {
        const decided = r.allowed + r.denied + r.shadow_denied;
        const denied = r.denied + r.shadow_denied;
        const width = Math.round((denied / most) * 48);
        return el("tr", { "data-rule": r.id, "data-denied": r.denied,
                          "aria-selected": String(r.id === selected),
                          "data-shadow-denied": r.shadow_denied, "data-allowed": r.allowed },
          el("td", {}, el("span", { class: "bar", style: "width:" + width + "px" }), r.id,
             r.mode === "shadow" ? el("span", { class: "shadow" }, " (shadow)") : ""),
          el("td", { class: rps ? "denied" : "" }, rate(rps)), el("td", {}, num(r.denied)),
          el("td", {}, num(r.shadow_denied)), el("td", {}, num(r.allowed)),
          el("td", {}, decided ? ((100 * denied) / decided).toFixed(1) : "\u2013"));
      }));
    }
    setText("top-hint", rules.count ? "of " + num(rules.count) + " rules" : "");
    setText("rules-note", rules.truncated ? "The snapshot lists the " + num(rules.listed) +
            " most denied rules of " + num(rules.count) + "; totals cover all of them." : "");
  }

  function renderHotKeys(h) {
    setText("hot-hint", h.mode === "off" ? "tracking off (hotkeys-top-k 0)"
            : h.mode + ", 1 check in " + num(h.sample));
    const body = $("hot-keys").tBodies[0];
    body.replaceChildren(...(h.keys.length ? h.keys.map((k) => el("tr",
      { "data-key": k.name },
      el("td", {}, k.name + (k.truncated ? "\u2026" : "")),
      el("td", {}, k.rule === undefined ? "CL.CHECK" : "rule " + k.rule),
      el("td", {}, rate(k.ops)), el("td", {}, rate(k.ops_min))))
      : [el("tr", {}, el("td", { class: "empty", colspan: 4 }, "no checks yet"))]));
  }

  function renderLatency(s) {
    const rows = [...s.latency.resp.map((c) => ["RESP", c]),
                  ...s.latency.http.map((c) => ["HTTP", c])]
      .sort((a, b) => b[1].calls - a[1].calls).slice(0, 12);
    const body = $("latency").tBodies[0];
    body.replaceChildren(...(rows.length ? rows.map(([front, c]) => el("tr",
      { "data-command": c.name, "data-front": front.toLowerCase() },
      el("td", {}, c.name), el("td", {}, front), el("td", {}, num(c.calls)),
      el("td", {}, c.usec_per_call.toFixed(2)), el("td", {}, num(c.failed + c.rejected))))
      : [el("tr", {}, el("td", { class: "empty", colspan: 5 }, "no commands yet"))]));
  }

  // The level's name is what it sheds: none, low, low+normal.
  function renderOverload(o) {
    const dl = $("overload");
    dl.dataset.level = o.level;
    dl.dataset.forced = String(o.forced);
    setText("shed-level", o.level_name);
    $("shed-level").className = o.level ? "denied" : "";
    setText("overload-hint", o.forced ? "level held by DEBUG SHED-LEVEL"
            : "measured over the last window");
    setText("loop-busy", o.busy_percent + "%");
    setText("loop-lag", micros(o.loop_lag_us));
    setText("held-input", bytes(o.held_input_bytes) + ", waited up to " +
            micros(o.held_input_wait_us));
    $("shed-counts").tBodies[0].replaceChildren(...Object.entries(o.shed).map(([name, n]) =>
      el("tr", { "data-priority": name, "data-allowed": n.allowed, "data-denied": n.denied },
        el("td", {}, name), el("td", {}, num(n.allowed)), el("td", {}, num(n.denied)))));
  }

  const REPL_FIELDS = [["role", "role"], ["master_host", "primary"],
    ["master_port", "primary port"],
    ["master_link_status", "link"], ["master_last_io_seconds_ago", "last I/O (s ago)"],
    ["master_sync_in_progress", "syncing"], ["master_link_down_since_seconds", "down for (s)"],
    ["connected_slaves", "replicas"], ["master_repl_offset", "replication offset"],
    ["slave_repl_offset", "applied offset"], ["repl_lag_p99_ms", "lag p99 (ms)"],
    ["master_replid", "replication id"]];

  function renderReplication(r) {
    const role = r.role === "slave" ? "replica" : r.role === "master" ? "primary" : String(r.role);
    setText("repl-role", role);
    setText("repl-summary", r.role === "slave" ? "link " + r.master_link_status
            : num(r.connected_slaves || 0) + " replicas");
    const dl = $("replication");
    dl.dataset.role = r.role;
    dl.replaceChildren(...REPL_FIELDS.filter(([k]) => k in r).flatMap(([k, label]) =>
      [el("dt", {}, label), el("dd", { "data-field": k }, k === "role" ? role : r[k])]));
    const table = $("replicas");
    table.hidden = !r.replicas.length;
    table.tBodies[0].replaceChildren(...r.replicas.map((f) => el("tr", {},
      el("td", {}, f.ip + ":" + f.port), el("td", {}, f.state), el("td", {}, num(f.offset)),
      el("td", {}, f.lag))));
  }

  function render(s) {
    const t = s.rules.totals;
    const h = history.length ? history[history.length - 1] : null;
    setText("allowed-rate", h ? rate(h.allowed / h.dt) : "\u2013");
    setText("denied-rate", h ? rate(h.denied / h.dt) : "\u2013");
    setText("shadow-rate", h ? rate(h.shadow / h.dt) : "\u2013");
    setText("allowed-total", num(t.allowed));
    setText("denied-total", num(t.denied));
    setText("shadow-total", num(t.shadow_denied));
    $("denied-total").dataset.value = t.denied;
    $("allowed-total").dataset.value = t.allowed;
    setText("ops", num(s.ops_per_sec));
    setText("commands-total", num(s.total_commands));
    setText("buckets", num(s.buckets));
    setText("rules-count", num(s.rules.count));
    setText("clients", num(s.clients.connected));
    setText("clients-max", num(s.clients.max));
    setText("memory", bytes(s.memory.rss_bytes));
    setText("memory-buckets", bytes(s.memory.bucket_table_bytes));
    setText("server-meta", "v" + s.version + " \u00b7 up " + duration(s.uptime_s));
    renderRules(s);
    renderLatency(s);
    renderHotKeys(s.hotkeys);
    if (s.overload) renderOverload(s.overload);
    renderReplication(s.replication);
    drawCharts();
  }

  function status(state, text) {
    const e = $("conn-status");
    e.dataset.state = state;
    setText("conn-status", text);
  }

  // ---- polling ----------------------------------------------------------------------------------
  const statsUrl = new URL("v1/stats?rules=" + TOP_RULES, location.href);
  async function poll() {
    const started = Date.now();
    try {
      const res = await fetch(statsUrl, { cache: "no-store", credentials: "same-origin",
                                          headers: { Accept: "application/json" } });
      if (res.status === 401 || res.status === 403) {
        status("error", "not authorised: reload the page to sign in");
      } else if (!res.ok) {
        status("error", "server answered " + res.status);
      } else {
        const s = await res.json();
        record(s);
        latest = s;
        render(s);
        status("live", "live \u00b7 " + new Date(s.time_ms).toLocaleTimeString());
      }
    } catch (e) {
      status("error", "unreachable (" + (e && e.message ? e.message : e) + ")");
    }
    setTimeout(poll, Math.max(POLL_MS - (Date.now() - started), 100));
  }

  function setWindow(seconds) {
    windowS = seconds;
    for (const b of $("windows").querySelectorAll("button")) {
      b.setAttribute("aria-pressed", String(Number(b.dataset.window) === seconds));
    }
    drawCharts();
  }
  $("windows").addEventListener("click", (ev) => {
    const b = ev.target.closest("button");
    if (b) setWindow(Number(b.dataset.window));
  });
  function select(ruleId) {
    selected = ruleId === selected ? null : ruleId;
    if (latest) renderRules(latest);
    drawCharts();
  }
  $("top-denied").addEventListener("click", (ev) => {
    const tr = ev.target.closest("tr[data-rule]");
    if (tr) select(tr.dataset.rule);
  });
  $("rule-legend").addEventListener("click", (ev) => {
    if (ev.target.closest("#show-top-rules")) { select(selected); return; }
    const item = ev.target.closest("[data-rule]");
    if (item) select(item.dataset.rule);
  });
  window.addEventListener("resize", () => { if (latest) drawCharts(); });
  setWindow(windowS);

  // The server's own samples of the totals (one a second, the last ten
  // minutes: /v1/stats?since=) are the chart's past: what happened before
  // the page was opened.  Rules' own series start with the page.
  function seed(s) {
    const h = s.history;
    if (!h || !h.seconds) return;
    const at = Object.fromEntries(h.fields.map((f, i) => [f, i]));
    const rows = h.seconds.filter((r) => r[at.time_ms] > s.time_ms - KEEP_S * 1000);
    for (let i = 1; i < rows.length; i++) {
      const a = rows[i - 1], b = rows[i];
      const step = (f) => Math.max(b[at[f]] - a[at[f]], 0);
      history.push({ t: b[at.time_ms], dt: Math.max((b[at.time_ms] - a[at.time_ms]) / 1000, 0.001),
                     allowed: step("allowed"), denied: step("denied"),
                     shadow: step("shadow_denied"), rules: new Map(), past: true });
    }
    // from the last sample to this snapshot
    const last = rows[rows.length - 1];
    if (last && s.time_ms > last[at.time_ms]) {
      const t = s.rules.totals;
      history.push({ t: s.time_ms, dt: Math.max((s.time_ms - last[at.time_ms]) / 1000, 0.001),
                     allowed: Math.max(t.allowed - last[at.allowed], 0),
                     denied: Math.max(t.denied - last[at.denied], 0),
                     shadow: Math.max(t.shadow_denied - last[at.shadow_denied], 0),
                     rules: new Map(), past: true });
    }
    $("chart").dataset.past = history.length;
  }
  (async function start() {
    try {
      // since=0: every sample kept (the browser's clock may not be the server's)
      const url = new URL("v1/stats?rules=" + TOP_RULES + "&since=0", location.href);
      const res = await fetch(url, { cache: "no-store", credentials: "same-origin",
                                     headers: { Accept: "application/json" } });
      if (res.ok) {
        const s = await res.json();
        seed(s);
        record(s);
        latest = s;
        render(s);
        status("live", "live \u00b7 " + new Date(s.time_ms).toLocaleTimeString());
      }
    } catch (e) { /* the polls say what is wrong */ }
    setTimeout(poll, POLL_MS);
  })();
})();
</script>
</body>
</html>
"""
