// corral web UI: one live view (server-sent events from /api/live) drawn as plain DOM and SVG.
// No framework, no build step; every text from the log goes in through textContent, never as HTML.
"use strict";

// Queue colours; none is the red of an unhealthy GPU.
const PALETTE = ["#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2", "#bcbd22",
                 "#393b79", "#637939", "#7f7f7f", "#5b8fa8"];
const live = { cluster: null, jobs: new Map(), nodes: new Map(), events: [], samples: [], seq: 0, now: 0, at: 0 };
let page = null;          // the page shown: {update()}
let redraw = false;

// --- small helpers --------------------------------------------------------------------------------

function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") e.className = v;
    else if (k === "text") e.textContent = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (k === "style") Object.assign(e.style, v);
    else e.setAttribute(k, v === true ? "" : String(v));
  }
  for (const kid of kids.flat()) if (kid !== null && kid !== undefined && kid !== false)
    e.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
  return e;
}
const svgNS = "http://www.w3.org/2000/svg";
function sv(tag, attrs, ...kids) {
  const e = document.createElementNS(svgNS, tag);
  for (const [k, v] of Object.entries(attrs || {})) if (k === "text") e.textContent = v; else e.setAttribute(k, v);
  for (const kid of kids.flat()) if (kid) e.append(kid);
  return e;
}
const byName = new Intl.Collator(undefined, { numeric: true });  // node-2 before node-10
function nowServer() { return live.now + (Date.now() - live.at) / 1000; }
function dur(s) {
  if (s === null || s === undefined || !isFinite(s)) return "-";
  s = Math.max(0, s);
  if (s < 60) return `${s.toFixed(s < 10 ? 1 : 0)}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m${String(Math.floor(s % 60)).padStart(2, "0")}s`;
  if (s < 86400) return `${Math.floor(s / 3600)}h${String(Math.floor(s % 3600 / 60)).padStart(2, "0")}m`;
  return `${Math.floor(s / 86400)}d${Math.floor(s % 86400 / 3600)}h`;
}
function clock(t, withDay) {
  if (!t) return "-";
  const d = new Date(t * 1000);
  const time = d.toLocaleTimeString([], { hour12: false });
  return withDay ? `${d.toLocaleDateString([], { month: "short", day: "numeric" })} ${time}` : time;
}
function queueColor(q) {
  const order = live.cluster ? live.cluster.queue_order : [];
  let i = order.indexOf(q);
  if (i < 0) i = order.length + [...q].reduce((a, c) => a + c.charCodeAt(0), 0);
  return PALETTE[i % PALETTE.length];
}
function statusBadge(s) { return el("span", { class: `st ${s}`, text: s }); }
async function getJSON(url) {
  const r = await fetch(url, { credentials: "same-origin" });
  const body = await r.json().catch(() => ({ error: `HTTP ${r.status}` }));
  if (!r.ok) throw new Error(body.error || `HTTP ${r.status}`);
  return body;
}

// --- the live stream ------------------------------------------------------------------------------

function connect() {
  const src = new EventSource("/api/live");
  src.addEventListener("full", (m) => {
    const d = JSON.parse(m.data);
    live.jobs = new Map(d.jobs.map((j) => [j.id, j]));
    live.nodes = new Map(d.nodes.map((n) => [n.node_id, n]));
    live.events = d.events; live.samples = d.samples;
    apply(d, d.jobs.map((j) => j.id));
  });
  src.addEventListener("delta", (m) => {
    const d = JSON.parse(m.data);
    for (const j of d.jobs) live.jobs.set(j.id, j);
    for (const id of d.gone) live.jobs.delete(id);
    for (const n of d.nodes) live.nodes.set(n.node_id, n);
    for (const id of d.nodes_gone) live.nodes.delete(id);
    live.events = live.events.concat(d.events).slice(-20);
    if (d.sample) live.samples = live.samples.concat([d.sample]).slice(-720);
    apply(d, d.jobs.map((j) => j.id));
  });
  src.onopen = () => setStatus(true);
  src.onerror = () => setStatus(false);  // EventSource reconnects by itself, and gets a full view again
}
function apply(d, touched) {
  live.cluster = d.cluster; live.seq = d.seq; live.now = d.now; live.at = Date.now();
  live.cluster.nodes = [...live.nodes.values()].sort((a, b) => byName.compare(a.node_id, b.node_id));
  live.touched = new Set(touched);
  document.getElementById("position").textContent = `log position #${d.seq}`;
  if (!redraw) { redraw = true; requestAnimationFrame(() => { redraw = false; if (page && page.update) page.update(); }); }
}
function setStatus(ok) {
  const s = document.getElementById("status");
  s.textContent = ok ? "live" : "reconnecting…";
  s.className = ok ? "status" : "status down";
}

// --- cluster ---------------------------------------------------------------------------------------

function gpuCell(node, i, cluster) {
  const owner = node.owners[i];
  const fault = node.faults.find((f) => f.index === i);
  const mark = node.earmarks && node.earmarks[i];
  const cls = ["gpu"];
  let title = `${node.node_id} GPU ${i}`;
  let text = "";
  const style = {};
  if (owner) {
    const job = cluster.active[owner] || {};
    cls.push("busy");
    style.background = queueColor(job.queue || "");
    title += ` · ${owner} (${job.name || "?"}, queue ${job.queue || "?"}, ${job.status || "?"})`;
    text = (job.name || owner).slice(0, 1).toUpperCase();
  } else if (mark) { cls.push("earmarked"); title += ` · free, earmarked for ${mark}`; }
  else title += " · free";
  if (fault) {
    const drained = fault.source === "operator";
    cls.push(drained ? "drained" : "unhealthy");
    title += drained ? ` · drained: ${fault.reason}` : ` · unhealthy: ${fault.reason}`;
    text = drained ? "D" : (fault.xid !== null ? "X" : "!");
  }
  return el("div", { class: cls.join(" "), id: `gpu-${node.node_id}-${i}`, title, "data-job": owner || "",
                     "data-health": !fault ? "ok" : (fault.xid !== null ? `xid-${fault.xid}` : fault.source),
                     style, onclick: owner ? () => { location.hash = `#/job/${owner}`; } : null }, text);
}
function nodeCard(node, cluster) {
  const cls = ["node", node.state];
  const badges = [];
  if (node.state !== "ready") badges.push(el("span", { class: `badge ${node.state === "failed" ? "bad" : "warn"}`,
                                                     text: node.state }));
  if (node.faults.length) badges.push(el("span", { class: "badge bad", text: `${node.faults.length} GPU out` }));
  const labels = Object.entries(node.labels).map(([k, v]) => `${k}=${v}`).join(" ");
  return el("div", { class: cls.join(" "), id: `node-${node.node_id}`, "data-used": node.used, title: labels },
    el("div", {}, el("span", { class: "name", text: node.node_id }), badges),
    el("div", { class: "gpus" }, node.owners.map((_, i) => gpuCell(node, i, cluster))),
    el("div", { class: "ds muted", text: `${node.used}/${node.owners.length} used · ${node.model || ""}` +
      (node.clique !== null && node.clique !== undefined ? ` · NVLink clique ${node.clique}` : "") }),
    node.faults.map((f) => el("div", { class: "ds fault", text: `GPU ${f.index} ${f.source === "operator" ? "drained" :
      "unhealthy"}: ${f.reason}` })),
    node.datasets.length ? el("div", { class: "ds", text: `cached: ${node.datasets.join(", ")}` }) : null);
}
function grouped(nodes, levels, cluster) {
  // Coarse to fine (block > leaf > ...): nested boxes, one per label value; nodes without the label together.
  if (!levels.length) return el("div", { class: "groups" }, nodes.map((n) => nodeCard(n, cluster)));
  const [level, ...rest] = levels;
  const by = new Map();
  for (const n of nodes) {
    const v = n.labels[level] || "";
    if (!by.has(v)) by.set(v, []);
    by.get(v).push(n);
  }
  if (by.size === 1 && by.has("")) return grouped(nodes, rest, cluster);
  return el("div", { class: "groups" }, [...by].map(([v, ns]) =>
    el("div", { class: "group", "data-level": level, "data-value": v },
      el("div", { class: "label", text: v ? `${level} ${v}` : `no ${level}` }), grouped(ns, rest, cluster))));
}
function clusterView(cluster, recent) {
  const jobs = cluster.jobs_by_status;
  const out = el("div", {});
  out.append(el("div", { class: "cards" },
    stat(`${cluster.gpus_used}/${cluster.gpus_total}`, "GPUs in use", "stat-gpus"),
    stat(cluster.nodes.length, "nodes"),
    stat(jobs.running || 0, "running"), stat(cluster.pending_count, "pending"),
    stat(cluster.scheduler_id ? `epoch ${cluster.epoch}` : "none", "scheduler")));
  out.append(el("h2", { text: "GPUs" }));
  out.append(el("div", { id: "grid" }, grouped(cluster.nodes, cluster.levels, cluster)));
  const legend = el("div", { class: "legend" });
  for (const [id, j] of Object.entries(cluster.active))
    legend.append(el("span", {}, el("i", { style: { background: queueColor(j.queue) } }),
      el("a", { href: `#/job/${id}`, text: id }), ` ${j.shape} ${j.queue} ${j.status}`));
  legend.append(el("span", { class: "muted", text: "X: unhealthy (Xid) · D: drained · dotted: earmarked for a preemptor" }));
  out.append(legend);
  if (cluster.pending.length) {
    out.append(el("h2", { text: `Pending (${cluster.pending_count})` }));
    out.append(table(["job", "queue", "prio", "GPUs", "why"], cluster.pending.map((p) => [
      el("a", { href: `#/job/${p.job_id}`, text: p.job_id }), p.queue, p.priority, p.gpus,
      p.code ? `${p.code}: ${p.message}` : "not looked at yet"])));
  }
  if (recent) {
    out.append(el("h2", { text: "Recent events" }));
    out.append(el("div", { class: "events", text: recent.join("\n") || "no events yet" }));
  }
  return out;
}
function stat(value, label, id) { return el("div", { class: "stat", id }, el("b", { text: value }), el("span", { text: label })); }
function table(headers, rows, attrs) {
  return el("table", attrs || {}, el("thead", {}, el("tr", {}, headers.map((h) => el("th", { text: h })))),
    el("tbody", {}, rows.map((r) => el("tr", {}, r.map((c) => el("td", {}, c))))));
}
const clusterPage = {
  mount(main) { this.main = main; this.update(); },
  update() {
    if (!live.cluster) { this.main.replaceChildren(el("p", { class: "muted", text: "waiting for the log…" })); return; }
    this.main.replaceChildren(clusterView(live.cluster, live.events));
  },
};

// --- queues ----------------------------------------------------------------------------------------

function queueBar(q, total) {
  const scale = Math.max(total, q.gpus, q.guaranteed_gpus, q.limit_gpus || 0, 1);
  const pct = (n) => `${(100 * n / scale).toFixed(1)}%`;
  return el("div", { class: "bar", title: `${q.gpus} used, ${q.guaranteed_gpus} guaranteed, limit ${q.limit_gpus ?? "none"}` },
    el("div", { class: "used", style: { width: pct(q.gpus), background: queueColor(q.queue) } }),
    q.guaranteed_gpus ? el("div", { class: "guar", style: { left: pct(q.guaranteed_gpus) } }) : null,
    q.limit_gpus !== null ? el("div", { class: "limit", style: { left: pct(q.limit_gpus) } }) : null);
}
function lineChart(series, opts) {
  // series: [{name, color, points: [[t, v]]}]; a small hand-drawn SVG line chart.
  const W = opts.width || 900, H = opts.height || 220, L = 44, B = 22, T = 10, R = 10;
  const pts = series.flatMap((s) => s.points);
  const svg = sv("svg", { class: "chart", width: W, height: H, viewBox: `0 0 ${W} ${H}`, id: opts.id || "" });
  if (!pts.length) { svg.append(sv("text", { x: L, y: H / 2, text: opts.empty || "no data yet" })); return svg; }
  const t0 = Math.min(...pts.map((p) => p[0])), t1 = Math.max(...pts.map((p) => p[0]), t0 + 1);
  const vmax = Math.max(opts.min || 0, ...pts.map((p) => p[1])) || 1;
  const x = (t) => L + (W - L - R) * (t - t0) / (t1 - t0), y = (v) => H - B - (H - B - T) * v / vmax;
  for (let i = 0; i <= 4; i++) {
    const v = vmax * i / 4;
    svg.append(sv("line", { x1: L, x2: W - R, y1: y(v), y2: y(v), stroke: "#eceff3" }));
    svg.append(sv("text", { x: 4, y: y(v) + 4, text: opts.fmt ? opts.fmt(v) : v.toFixed(v < 10 ? 1 : 0) }));
  }
  const days = t1 - t0 > 20 * 3600;
  svg.append(sv("text", { x: L, y: H - 6, text: clock(t0, days) }),
    sv("text", { x: W - R, y: H - 6, "text-anchor": "end", text: clock(t1, days) }));
  for (const s of series) {
    if (!s.points.length) continue;
    svg.append(sv("polyline", { fill: "none", stroke: s.color, "stroke-width": 2,
      points: s.points.map((p) => `${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join(" ") }));
  }
  return svg;
}
const queuesPage = {
  mount(main) { this.main = main; this.update(); },
  update() {
    const c = live.cluster;
    if (!c) return;
    const rows = c.queues.map((q) => el("tr", { id: `queue-${q.queue}`, "data-used": q.gpus },
      el("td", {}, el("i", { class: "swatch" }), el("b", { text: q.queue }), q.defined ? "" : el("span", { class: "muted", text: " (undefined)" })),
      el("td", {}, queueBar(q, c.gpus_total)),
      el("td", { class: "num", text: q.gpus }), el("td", { class: "num", text: q.guaranteed_gpus }),
      el("td", { class: "num", text: q.weight }), el("td", { class: "num", text: q.limit_gpus ?? "-" }),
      el("td", { class: "num", text: q.borrowed }), el("td", { class: "num", text: q.lent }),
      el("td", { class: "num", text: `${q.pending} (${q.demand_gpus} GPUs)` }),
      el("td", { class: "num", text: q.fair_share_usage.toFixed(2) }), el("td", { text: q.parent || "-" })));
    const heads = ["queue", "used | guarantee | limit", "used", "guarantee", "weight", "limit", "borrowed", "lent",
                   "pending (demand)", "fair-share usage", "parent"];
    const names = c.queues.map((q) => q.queue);
    const seriesOf = (k) => names.map((n) => ({ name: n, color: queueColor(n),
      points: live.samples.filter((s) => s.queues[n] && s.queues[n][k] !== null).map((s) => [s.t, s.queues[n][k]]) }));
    const legend = el("div", { class: "legend" }, names.map((n) => el("span", {}, el("i", { style: { background: queueColor(n) } }), n)));
    this.main.replaceChildren(
      el("h2", { text: "Queues" }),
      el("table", { id: "queues" }, el("thead", {}, el("tr", {}, heads.map((h) => el("th", { text: h })))), el("tbody", {}, rows)),
      el("h2", { text: "Fair-share standing over time (usage / weight; lower goes first)" }), legend,
      lineChart(seriesOf(1), { id: "fairshare", empty: "sampled every 5 s while this UI runs" }),
      el("h2", { text: "GPUs in use per queue" }),
      lineChart(seriesOf(0), { id: "queue-gpus", min: 1 }));
  },
};

// --- jobs ------------------------------------------------------------------------------------------

const COLUMNS = [
  ["id", "job", (j) => el("a", { href: `#/job/${j.id}`, text: j.id })],
  ["name", "name", (j) => j.name],
  ["status", "state", (j) => statusBadge(j.status)],
  ["user", "user", (j) => j.user || "-"],
  ["queue", "queue", (j) => j.queue],
  ["gpus", "GPUs", (j) => `${j.gpus} (${j.shape})`],
  ["priority", "prio", (j) => j.priority],
  ["since", "age", (j) => dur(nowServer() - j.since)],
  ["array", "array", (j) => j.array || ""],
  ["deps", "after", (j) => j.deps.join(", ")],
  ["note", "note", (j) => j.note],
];
const jobsPage = {
  filter: { text: "", state: "", queue: "", user: "" }, sort: { key: "submitted_at", dir: -1 },
  history: null,  // rows the index listed (the "finished too" search), or null: the live rows
  mount(main) {
    this.main = main;
    const f = this.filter;
    const input = (key, ph) => el("input", { id: `filter-${key}`, placeholder: ph, value: f[key],
      oninput: (e) => { f[key] = e.target.value; this.update(); if (this.history) this.search(); } });
    this.stateSel = el("select", { id: "filter-state",
      onchange: (e) => { f.state = e.target.value; this.update(); if (this.history) this.search(); } },
      ["", "pending", "reserved", "running", "preempting", "completed", "failed", "cancelled", "rejected"].map((s) =>
        el("option", { value: s, text: s || "any state", selected: s === f.state })));
    this.body = el("tbody", {});
    this.count = el("span", { class: "muted" });
    const head = el("tr", {}, COLUMNS.map(([key, label]) => el("th", { class: "sort", "data-key": key, text: label,
      onclick: () => { this.sort = { key, dir: this.sort.key === key ? -this.sort.dir : 1 }; this.update(); } })));
    this.head = head;
    main.replaceChildren(el("h2", { text: "Jobs" }),
      el("div", { class: "filters" }, input("text", "search id, name, note"), this.stateSel, input("queue", "queue"),
        input("user", "user"), el("label", {}, el("input", { type: "checkbox", id: "filter-history", checked: !!this.history,
          onchange: (e) => { if (e.target.checked) this.search(); else { this.history = null; this.update(); } } }),
          " every job of the last 7 days (the index)"), this.count),
      el("table", { id: "jobs" }, el("thead", {}, head), this.body),
      el("p", { class: "muted", text: "Live: every job not finished, and the newest finished ones. Older ones: tick the index search." }));
    this.update();
  },
  update() {
    const f = this.filter, text = f.text.toLowerCase();
    let rows = (this.history || [...live.jobs.values()]).filter((j) => (!f.state || j.status === f.state)
      && (!f.queue || j.queue.includes(f.queue)) && (!f.user || (j.user || "").includes(f.user))
      && (!text || `${j.id} ${j.name} ${j.note}`.toLowerCase().includes(text)));
    const { key, dir } = this.sort;
    const val = (j) => key === "deps" ? j.deps.length : key === "since" ? -j.since : j[key];
    rows.sort((a, b) => { const x = val(a), y = val(b); return (x > y ? 1 : x < y ? -1 : 0) * dir || (a.id > b.id ? 1 : -1); });
    for (const th of this.head.children) th.className = `sort${th.dataset.key === key ? (dir > 0 ? " asc" : " desc") : ""}`;
    this.count.textContent = this.history ? `${rows.length} from the index` : `${rows.length} of ${live.jobs.size}`;
    this.body.replaceChildren(...rows.slice(0, 1000).map((j) => el("tr", { id: `job-row-${j.id}`, "data-status": j.status },
      COLUMNS.map(([, , cell]) => el("td", {}, cell(j))))));
  },
};

jobsPage.search = async function () {
  const f = this.filter, q = new URLSearchParams({ history: "1", since: "7d", limit: "1000" });
  if (f.state) q.set("state", f.state);
  if (f.queue) q.set("queue", f.queue);
  if (f.user) q.set("user", f.user);
  try { this.history = (await getJSON(`/api/jobs?${q}`)).jobs; }
  catch (e) { this.history = []; this.count.textContent = e.message; return; }
  this.update();
};

// --- one job ---------------------------------------------------------------------------------------

const jobPage = {
  mount(main, id) { this.main = main; this.id = id; this.logs = {}; this.load(); },
  async load() {
    try { this.data = await getJSON(`/api/job/${encodeURIComponent(this.id)}`); this.error = null; }
    catch (e) { this.error = e.message; }
    this.draw();
  },
  update() {
    if (live.touched && live.touched.has(this.id)) {
      clearTimeout(this.timer);
      this.timer = setTimeout(() => this.load(), 300);
    }
  },
  draw() {
    if (this.error) { this.main.replaceChildren(el("p", { class: "error", id: "job-error", text: this.error })); return; }
    const d = this.data, s = d.story;
    const kv = [["job", `${d.job_id} (${d.name})`], ["state", statusBadge(d.status)], ["user", d.submitted_by || "-"],
      ["queue", d.queue], ["shape", `${d.ranks} rank(s) x ${d.gpus_per_rank} GPU(s), priority ${d.priority}${d.preemptible ? "" : ", not preemptible"}`],
      ["attempt", `${d.attempt} (gang restarts ${d.restarts}/${d.max_restarts})`]];
    if (d.waiting) kv.push(["waiting", `${d.waiting.code}: ${d.waiting.message}`]);
    if (s.gate) kv.push(["gated", s.gate]);
    const pend = Object.entries(s.pending_s);
    if (pend.length) kv.push(["pending", pend.map(([c, t]) => `${dur(t)} ${c}`).join(", ")]);
    if (d.preemptor) kv.push(["preempted for", d.preemptor]);
    if (d.checkpoint) kv.push(["checkpoint", `step ${d.checkpoint.step} (attempt ${d.checkpoint.attempt}) ${d.checkpoint.path}`]);
    if (d.resume_from) kv.push(["resumes from", d.resume_from]);
    if (s.estimate) kv.push(["estimate", s.estimate]);
    if (d.failure) kv.push(["failure", d.failure]);
    if (d.end_reason) kv.push(["ended", d.end_reason]);
    if (d.exit_code !== null) kv.push(["exit code", d.exit_code]);
    kv.push(["environment", d.spec.env_vars]);
    const t0 = s.entries.length ? s.entries[0].time : 0;
    const timeline = el("ol", { class: "timeline", id: "timeline" }, s.entries.map((e) =>
      el("li", { class: `kind-${e.type}${e.void ? " void" : ""}`, "data-type": e.type },
        el("span", { class: "muted", text: clock(e.time) }), el("span", { class: "muted", text: `+${dur(e.time - t0)}` }),
        el("span", {}, e.text, e.told > 1 ? el("span", { class: "muted", text: ` (told ${e.told}x over ${dur(e.last_time - e.time)})` }) : null))));
    const ranks = table(["rank", "node", "GPUs", "state", "exit", "log"], d.rank_states.map((r) => [r.rank, r.node_id,
      r.gpus.join(","), `${r.status}${r.reason ? " " + r.reason : ""}`, r.exit_code ?? "",
      el("button", { onclick: () => this.tail(r.rank), text: "tail" })]), { id: "ranks" });
    const logs = Object.entries(this.logs).map(([rank, text]) => el("div", {}, el("b", { text: `rank ${rank}` }),
      el("pre", { class: "log", id: `log-${rank}`, text })));
    this.main.replaceChildren(el("h2", { text: s.summary, id: "job-summary" }), el("div", { class: "kv" },
      kv.flatMap(([k, v]) => [el("div", { text: k }), el("div", {}, v)])),
      el("h2", { text: "Ranks and nodes" }), ranks, ...logs,
      el("h2", { text: "Timeline (from the log: corral explain)" }), timeline);
  },
  async tail(rank) {
    try {
      const r = await getJSON(`/api/job/${encodeURIComponent(this.id)}/log?rank=${rank}&bytes=8192`);
      this.logs[rank] = r.error ? `(${r.error})` : (r.text || "(no output yet)");
    } catch (e) { this.logs[rank] = `(${e.message})`; }
    this.draw();
  },
};

// --- history ---------------------------------------------------------------------------------------

const WINDOWS = ["1h", "6h", "24h", "7d", "30d"];
const historyPage = {
  window: "24h",
  mount(main, arg) {
    this.main = main;
    if (WINDOWS.includes(arg)) this.window = arg;
    const sel = el("select", { id: "window", onchange: (e) => { this.window = e.target.value; this.load(); } },
      WINDOWS.map((w) => el("option", { value: w, text: `last ${w}`, selected: w === this.window })));
    this.body = el("div", {}, el("p", { class: "muted", text: "asking the index…" }));
    this.atInput = el("input", { id: "at", placeholder: "10m, #1234 or an ISO time",
      onkeydown: (e) => { if (e.key === "Enter") this.at(); } });
    this.atOut = el("div", { id: "at-view" });
    main.replaceChildren(el("h2", { text: "History" }), el("div", { class: "filters" }, sel), this.body,
      el("h2", { text: "The cluster at a moment (replay --at)" }),
      el("div", { class: "filters" }, this.atInput, el("button", { text: "show", onclick: () => this.at() })), this.atOut);
    this.load();
  },
  async load() {
    try {
      const h = await getJSON(`/api/history?window=${this.window}&buckets=24`);
      const util = h.buckets.map((b) => [b.to, 100 * (b.utilisation || 0)]);
      const queues = Object.keys(h.gpu_hours);
      this.body.replaceChildren(
        el("div", { class: "two" },
          el("div", {}, el("b", { text: "Utilisation (% of today's GPUs)" }),
            lineChart([{ name: "util", color: "#1f77b4", points: util }], { id: "util", width: 560, height: 200, min: 100,
              fmt: (v) => `${v.toFixed(0)}%` })),
          el("div", {}, el("b", { text: "GPU-hours per queue" }),
            table(["queue", "GPU-hours", "finished"], queues.map((q) => [q, h.gpu_hours[q].toFixed(2),
              Object.entries(h.finished[q] || {}).map(([k, v]) => `${v} ${k}`).join(", ") || "-"]), { id: "gpu-hours" }))),
        el("b", { text: "GPUs in use per queue (average per bucket)" }),
        el("div", { class: "legend" }, queues.map((q) => el("span", {}, el("i", { style: { background: queueColor(q) } }), q))),
        lineChart(queues.map((q) => ({ name: q, color: queueColor(q), points: h.buckets.map((b) =>
          [b.to, (b.gpu_hours[q] || 0) * 3600 / (b.to - b.from)]) })), { id: "queue-usage", width: 1240, height: 180, min: 1 }),
        el("h2", { text: "Wait from submit to start" }),
        table(["queue", "jobs", "p50", "p90", "p99"], Object.entries(h.waits).map(([q, w]) => [q, w.jobs, dur(w.p50),
          dur(w.p90), dur(w.p99)]), { id: "waits" }),
        el("p", { class: "muted", text: `index as of #${h.as_of_seq}; ${h.still_pending} job(s) of the window still pending` }));
    } catch (e) { this.body.replaceChildren(el("p", { class: "error", text: e.message })); }
  },
  async at() {
    try {
      const c = await getJSON(`/api/at?at=${encodeURIComponent(this.atInput.value)}`);
      this.atOut.replaceChildren(el("p", { class: "muted", text: `at ${new Date(c.at * 1000).toLocaleString()}, log position #${c.seq}` }),
        clusterView(c, null));
    } catch (e) { this.atOut.replaceChildren(el("p", { class: "error", text: e.message })); }
  },
};

// --- routing ---------------------------------------------------------------------------------------

function route() {
  const [, name, arg] = (location.hash || "#/cluster").split("/");
  const pages = { cluster: clusterPage, queues: queuesPage, jobs: jobsPage, job: jobPage, history: historyPage };
  page = pages[name] || clusterPage;
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("on", a.dataset.page === (name === "job" ? "jobs" : name));
  const main = document.getElementById("main");
  page.mount(main, arg ? decodeURIComponent(arg) : undefined);
}
window.addEventListener("hashchange", route);
document.addEventListener("DOMContentLoaded", () => { connect(); route(); });
setInterval(() => { if (page === jobsPage) jobsPage.update(); }, 5000);  // ages tick; no request is made
