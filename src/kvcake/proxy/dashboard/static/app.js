// kvcake dashboard: renders /dashboard/api/snapshot, then follows /dashboard/api/stream (SSE).
// No dependencies, no network beyond the proxy. Every rendered value carries data-field /
// data-value (the raw number) so tests can compare the page with the JSON.
"use strict";

const opts = new URLSearchParams(location.search);
const LIVE = opts.get("stream") !== "0";
const INTERVAL = opts.get("interval") || "1";
const RECENT = opts.get("recent") || "50";
const MAX_EVENTS = opts.get("max_events");  // given: follow one bounded stream, then stop
const SVG = "http://www.w3.org/2000/svg";
const COLORS = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1"];

const dash = "–";
const fmt = {
  int: (v) => (v == null ? dash : Math.round(v).toString()),
  pct: (v) => (v == null ? dash : (100 * v).toFixed(1) + "%"),
  ms: (v) => (v == null ? dash : (1000 * v).toFixed(1) + " ms"),
  s: (v) => (v == null ? dash : v.toFixed(3) + " s"),
  mib: (v) => (v == null ? dash : (v / 1048576).toFixed(1) + " MiB"),
  // sizes in binary units: KiB below 1 MiB (a block), MiB below 1 GiB, GiB above
  bytes: (v) => (v == null ? dash : v >= 1073741824 ? (v / 1073741824).toFixed(2) + " GiB"
    : v >= 1048576 ? (v / 1048576).toFixed(1) + " MiB" : (v / 1024).toFixed(1) + " KiB"),
  text: (v) => (v == null ? dash : String(v)),
};

function el(tag, attrs, text) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

function cell(field, value, kind, cls) {
  const td = el("td", { "data-field": field, "data-value": value == null ? "" : String(value) });
  td.textContent = fmt[kind || "text"](value);
  if (cls) td.className = cls;
  return td;
}

function fill(tbodySel, rows) {
  const tb = document.querySelector(tbodySel + " tbody");
  tb.replaceChildren(...rows);
}

function health(alive) {
  return cell("alive", alive ? "up" : "down", "text", alive ? "ok" : "bad");
}

function renderInstances(snap) {
  fill("#instances", snap.instances.map((i) => {
    const tr = el("tr", { "data-instance": i.id });
    const bar = el("td", { "data-field": "kv_pct", "data-value": String(i.kv_pct) });
    const meter = el("div", { class: "meter" });
    meter.append(el("span", { style: `width:${(100 * i.kv_pct).toFixed(1)}%` }));
    bar.append(meter, document.createTextNode(" " + fmt.pct(i.kv_pct)));
    tr.append(cell("id", i.id), cell("role", i.role), health(i.alive),
      cell("restarts", i.restarts, "int"), cell("running", i.running, "int"),
      cell("queued", i.queued, "int"), cell("queued_prefill_s", i.queued_prefill_s, "s"),
      cell("kv_used", `${i.kv_used}/${i.kv_total}`), bar,
      cell("indexed_blocks", i.indexed_blocks, "int"));
    return tr;
  }));
  fill("#processes", snap.processes.map((p) => {
    const tr = el("tr", { "data-process": p.name });
    tr.append(cell("name", p.name), health(p.alive), cell("restarts", p.restarts, "int"),
      cell("last_exit", p.last_exit || dash));
    return tr;
  }));
}

function renderRequests(snap) {
  for (const dd of document.querySelectorAll("#requests [data-stat]")) {
    const k = dd.dataset.stat;
    const v = snap.requests[k];
    dd.dataset.value = v == null ? "" : String(v);
    dd.textContent = k === "hit_rate" ? fmt.pct(v) : fmt.int(v);
  }
  const reasons = Object.entries(snap.rejections);
  fill("#rejections", reasons.length ? reasons.map(([r, n]) => {
    const tr = el("tr", { "data-reason": r });
    tr.append(cell("reason", r), cell("count", n, "int"));
    return tr;
  }) : [el("tr", {}, "")].map((tr) => { tr.append(el("td", { colspan: "2", class: "muted" }, "none")); return tr; }));
}

// An axis under a chart: labels spread from its left edge to its right edge (the SVGs
// stretch to their box, so their own text would stretch too).
function axis(id, labels) {
  const box = document.getElementById(id);
  box.replaceChildren(...labels.map((t) => el("span", {}, t)));
  box.dataset.labels = labels.join("|");
}

function renderHitRate(snap) {
  const svg = document.getElementById("hitrate");
  const pts = snap.hit_rate.points;
  const tiers = snap.hit_rate.tiers;
  svg.replaceChildren();
  svg.dataset.points = String(pts.length);
  for (const y of [0, 0.5, 1]) {
    const line = document.createElementNS(SVG, "line");
    const py = 150 - 140 * y;
    Object.entries({ x1: 0, x2: 400, y1: py, y2: py, class: "grid" }).forEach(([k, v]) => line.setAttribute(k, v));
    svg.append(line);
  }
  const legend = document.getElementById("hitrate-legend");
  legend.replaceChildren();
  if (pts.length < 1) { legend.append(el("span", { class: "muted" }, "collecting samples…")); return; }
  const t0 = pts[0].at, t1 = pts[pts.length - 1].at, span = Math.max(1e-9, t1 - t0);
  axis("hitrate-x", [`−${Math.round(span)} s`, `−${Math.round(span / 2)} s`, "now"]);
  tiers.forEach((tier, k) => {
    const xy = [];
    let last = null;
    for (const p of pts) {
      const v = p.hit_rate[tier];
      if (v == null) continue;
      last = v;
      const y = 150 - 140 * Math.max(0, Math.min(1, v));  // counters move apart within a sample
      xy.push(`${(400 * (p.at - t0) / span).toFixed(1)},${y.toFixed(1)}`);
    }
    const pl = document.createElementNS(SVG, "polyline");
    pl.setAttribute("points", xy.length === 1 ? `0,${xy[0].split(",")[1]} 400,${xy[0].split(",")[1]}` : xy.join(" "));
    pl.setAttribute("stroke", COLORS[k % COLORS.length]);
    pl.setAttribute("data-tier", tier);
    svg.append(pl);
    const item = el("span", { "data-tier": tier, "data-value": last == null ? "" : String(last) });
    item.append(el("span", { class: "sw", style: `background:${COLORS[k % COLORS.length]}` }),
      document.createTextNode(`${tier}: ${fmt.pct(last)} (last interval with lookups)`));
    legend.append(item);
  });
}

function renderPool(snap) {
  const p = snap.pool;
  fill("#pool", p.segments.map((s) => {
    const tr = el("tr", { "data-segment": s.name, "data-tier": s.tier });
    tr.append(cell("name", s.name), cell("host", s.host), cell("tier", s.tier),
      cell("used", s.used, "bytes"), cell("capacity", s.capacity, "bytes"),
      cell("use", s.capacity ? s.used / s.capacity : null, "pct"));
    return tr;
  }));
  const sum = document.getElementById("pool-summary");
  sum.dataset.objects = String(p.objects);
  sum.dataset.evicted = String(p.evicted);
  sum.textContent = p.error ? p.error : `objects ${fmt.int(p.objects)}, evicted ${fmt.int(p.evicted)}`;
}

function renderHot(snap) {
  fill("#hot", snap.hot_blocks.map((b) => {
    const tr = el("tr", { "data-key": b.key });
    const reps = b.replicas.map((r) => `${r.segment} (${r.tier})`).join(", ");
    tr.append(cell("block", b.block || b.key, "text", "mono"), cell("size", b.size, "bytes"),
      cell("replicas", reps || dash), cell("holders", b.holders.join(", ") || dash));
    tr.querySelector('[data-field="replicas"]').dataset.count = String(b.replicas.length);
    return tr;
  }));
}

function renderTimeline(snap) {
  const svg = document.getElementById("timeline");
  svg.replaceChildren();
  const rows = snap.recent;
  if (!rows.length) return;
  const t0 = Math.min(...rows.map((r) => r.at));
  const t1 = Math.max(...rows.map((r) => r.at + r.e2e_s));
  const span = Math.max(1e-6, t1 - t0), lanes = Math.min(rows.length, 12), h = 120 / lanes;
  axis("timeline-x", ["0 s", `${(span / 2).toFixed(1)} s`, `${span.toFixed(1)} s`]);
  rows.slice().reverse().forEach((r, i) => {
    const y = (i % lanes) * h + 1, x = (v) => 1000 * (v - t0) / span;
    const ttft = r.ttft_s || 0, total = Math.max(1, r.prompt_tokens);
    const pre = x(r.at + ttft) - x(r.at), reused = pre * (r.cached_tokens / total);
    const parts = [["cached", x(r.at), reused], ["computed", x(r.at) + reused, pre - reused],
      ["decode", x(r.at + ttft), x(r.at + r.e2e_s) - x(r.at + ttft)]];
    for (const [cls, px, w] of parts) {
      const rect = document.createElementNS(SVG, "rect");
      Object.entries({ x: px.toFixed(1), y: y.toFixed(1), width: Math.max(0.5, w).toFixed(1), height: (h - 2).toFixed(1), class: cls })
        .forEach(([k, v]) => rect.setAttribute(k, v));
      rect.setAttribute("data-request", r.id);
      svg.append(rect);
    }
  });
  fill("#recent", rows.map((r) => {
    const tr = el("tr", { "data-request": r.id });
    const src = Object.entries(r.kv).map(([k, v]) => `${k} ${v}`).join(" · ");
    const kv = cell("kv", src);
    kv.dataset.value = JSON.stringify(r.kv);
    tr.append(cell("id", r.id, "text", "mono"), cell("placement", `${r.prefill} → ${r.decode}`),
      cell("prompt_tokens", r.prompt_tokens, "int"), kv, cell("ttft_s", r.ttft_s, "ms"),
      cell("tbt_s", r.tbt_s, "ms"), cell("output_tokens", r.output_tokens, "int"),
      cell("finish", r.finish, "text", r.error ? "bad" : ""), cell("error", r.error));
    if (r.error) tr.className = "failed";  // failed and rejected requests, with their reason
    return tr;
  }));
}

function render(snap) {
  const st = document.getElementById("status");
  const h = snap.health;  // serve/health.py: the same report as kvcake status / top
  const failed = h ? h.failed : [];
  st.dataset.ready = String(snap.ready);
  st.dataset.failed = failed.join(",");
  st.textContent = snap.ready ? "ready" : "not ready" + (failed.length ? ": " + failed.join(", ") : "");
  st.className = "pill " + (snap.ready ? "ok" : "bad");
  document.getElementById("reasons").textContent = h ? h.reasons.join(" · ") : "";
  document.getElementById("updated").textContent = new Date(snap.at * 1000).toLocaleTimeString();
  document.getElementById("errors").textContent = snap.errors.join(" · ");
  renderInstances(snap);
  renderRequests(snap);
  renderHitRate(snap);
  renderPool(snap);
  renderHot(snap);
  renderTimeline(snap);
  document.body.dataset.rendered = String(Number(document.body.dataset.rendered) + 1);
  document.body.dataset.snapshotAt = String(snap.at);
}

function offline(msg) {
  const st = document.getElementById("status");
  st.textContent = msg;
  st.className = "pill bad";
}

function follow() {
  const bound = MAX_EVENTS ? `&max_events=${MAX_EVENTS}` : "";
  const es = new EventSource(`/dashboard/api/stream?interval=${INTERVAL}&recent=${RECENT}${bound}`);
  es.addEventListener("snapshot", (ev) => render(JSON.parse(ev.data)));
  es.addEventListener("end", () => {  // the server bounds every stream: open the next one
    es.close();
    document.body.dataset.streamEnded = "1";
    if (!MAX_EVENTS) setTimeout(follow, 100);
  });
  es.onerror = () => offline("reconnecting…");
}

// The first snapshot: embedded in the page by the proxy (rendered at once, before the load
// event), else fetched; then the live stream.
function embedded() {
  try {
    const tag = document.getElementById("first-snapshot");
    const snap = tag ? JSON.parse(tag.textContent) : null;
    return snap && snap.version ? snap : null;
  } catch (e) {
    return null;
  }
}

const snap0 = embedded();
if (snap0) {
  render(snap0);
  document.body.dataset.firstRenderMs = String(Math.round(performance.now()));
  if (LIVE) follow();
} else {
  fetch(`/dashboard/api/snapshot?recent=${RECENT}`)
    .then((r) => (r.ok ? r.json() : Promise.reject(new Error(`HTTP ${r.status}`))))
    .then((snap) => { render(snap); if (LIVE) follow(); })
    .catch((e) => { offline(`proxy unreachable (${e.message})`); if (LIVE) setTimeout(() => location.reload(), 3000); });
}
