// radixflow /dashboard: polls GET /dashboard/state once a second and draws it.
// Text from the cache is hostile: it only ever goes through textContent and setAttribute.
"use strict";

const KEY_STORE = "radixflow.apiKey";
const POLL_MS = 1000;
const MAX_NODES = 512;
const SVG = "http://www.w3.org/2000/svg";
const ROW_H = 30;
const $ = (id) => document.getElementById(id);
let picked = 0; // the replica whose tree is drawn
let timer = null;

function el(tag, attrs, ...kids) {
  const node = tag.startsWith("svg:") ? document.createElementNS(SVG, tag.slice(4))
    : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined) continue;
    if (k === "style") node.style.cssText = v; // (the CSP refuses style attributes)
    else node.setAttribute(k, String(v));
  }
  for (const kid of kids) node.append(kid instanceof Node ? kid : String(kid));
  return node;
}

const fmt = (n) => n === null || n === undefined ? "–" : typeof n !== "number" ? String(n)
  : Math.abs(n) >= 1e6 ? (n / 1e6).toFixed(1) + "M" : Math.abs(n) >= 1e4
    ? (n / 1e3).toFixed(1) + "k" : Number.isInteger(n) ? String(n) : n.toFixed(1);

function authHeaders() {
  const key = sessionStorage.getItem(KEY_STORE);
  return key ? { Authorization: "Bearer " + key } : {};
}

function setStatus(state, text) {
  const s = $("status");
  s.dataset.state = state;
  s.textContent = text;
}

function askKey(message) {
  $("key-panel").hidden = false;
  $("main").hidden = true;
  $("key-error").textContent = message || "";
  $("key-input").focus();
  setStatus("locked", "API key needed");
}

async function poll() {
  clearTimeout(timer);
  try {
    const r = await fetch("/dashboard/state?max_nodes=" + MAX_NODES,
      { headers: authHeaders(), cache: "no-store" });
    if (r.status === 401) {
      const had = sessionStorage.getItem(KEY_STORE);
      sessionStorage.removeItem(KEY_STORE);
      askKey(had ? "that key was refused" : "");
      return; // until a key is given
    }
    if (!r.ok) throw new Error("HTTP " + r.status + ": " + (await r.text()).slice(0, 200));
    const state = await r.json();
    $("key-panel").hidden = true;
    $("main").hidden = false;
    $("forget-key").hidden = !sessionStorage.getItem(KEY_STORE);
    draw(state);
    setStatus("live", "live");
  } catch (err) {
    setStatus("error", String(err.message || err).slice(0, 120));
  }
  timer = setTimeout(poll, POLL_MS);
}

function draw(state) {
  $("model").textContent = state.model + (state.dp_size > 1 ? ` · ${state.dp_size} replicas` : "");
  drawReplicas(state.replicas);
  const pick = $("replica-pick");
  $("replica-pick-label").hidden = state.replicas.length < 2;
  if (pick.options.length !== state.replicas.length) {
    pick.replaceChildren(...state.replicas.map((r) => el("option", { value: r.dp_rank },
      "replica " + r.dp_rank)));
    pick.value = String(picked);
  }
  const rep = state.replicas.find((r) => r.dp_rank === picked) || state.replicas[0];
  if (rep) drawTree(rep);
  drawRequests(state.replicas);
  drawGrammar(state.replicas);
  const pts = state.history ? state.history.points : [];
  chart($("chart-throughput"), pts, "generation_tokens_per_s", "prompt_tokens_per_s");
  chart($("chart-ttft"), pts, "ttft_ms");
  chart($("chart-tpot"), pts, "tpot_ms");
}

function drawReplicas(replicas) {
  $("replicas").replaceChildren(...replicas.map((r) => {
    const total = r.kv_total_tokens || 1;
    const held = Math.max(0, total - r.kv_free_tokens - r.tree_tokens);
    const locked = r.tree_tokens - r.evictable_tokens;
    const parts = [["held", held], ["locked", locked], ["evictable", r.evictable_tokens],
      ["free", r.kv_free_tokens]];
    const bar = el("div", { class: "kvbar" }, ...parts.map(([k, v]) =>
      el("span", { class: "kv-" + k, style: `width:${(100 * v / total).toFixed(2)}%`,
        title: `${k}: ${v} tokens` })));
    const s = r.stats || {};
    const phases = { waiting: 0, prefilling: 0, running: 0 };
    for (const q of r.requests) phases[q.phase] += 1;
    const rows = [["KV used", `${fmt(total - r.kv_free_tokens)} / ${fmt(total)} tokens`],
      ["in tree", `${fmt(r.tree_tokens)} (${fmt(r.evictable_tokens)} evictable)`],
      ["evicted", `${fmt(r.evicted_tokens)} tokens`],
      ["running / prefilling / waiting",
        `${phases.running} / ${phases.prefilling} / ${phases.waiting}`],
      ["cache hit rate", s.cache_hit_rate === undefined ? "–"
        : (100 * s.cache_hit_rate).toFixed(1) + "%"],
      ["routed requests", fmt(s.routed_requests)]];
    return el("div", { class: "panel replica", "data-replica": r.dp_rank,
      "data-kv-free": r.kv_free_tokens, "data-evicted": r.evicted_tokens },
    el("h2", {}, "replica " + r.dp_rank, r.radix_cache ? "" : " (radix cache off)"), bar,
    el("div", { class: "legend" }, ...parts.map(([k]) => el("span", { class: "kv-" + k }, k))),
    el("table", {}, el("tbody", {}, ...rows.map(([k, v]) =>
      el("tr", {}, el("th", {}, k), el("td", {}, v))))));
  }));
}

function drawTree(rep) {
  viewTime = rep.time;
  const byId = new Map(rep.nodes.map((n) => [n.id, { ...n, kids: [] }]));
  for (const n of byId.values()) {
    if (n.parent !== null && byId.has(n.parent)) byId.get(n.parent).kids.push(n);
  }
  const weight = (n) => (n.w = Math.max(n.tokens, 1) + n.kids.reduce((a, k) => a + weight(k), 0));
  const root = byId.get(0);
  if (!root) return;
  weight(root);
  const maxHits = Math.max(1, ...rep.nodes.map((n) => n.hits));
  const wrap = $("tree-wrap");
  const width = Math.max(600, wrap.clientWidth - 4);
  const rects = [];
  let depth = 0;
  const place = (n, x, w, d) => {
    depth = Math.max(depth, d);
    rects.push(nodeRect(n, x, w, d, maxHits));
    let cx = x;
    const kidsW = n.kids.reduce((a, k) => a + k.w, 0) || 1;
    for (const k of n.kids.sort((a, b) => b.w - a.w)) {
      const kw = (w * k.w) / kidsW; // the children fill their parent's width
      if (kw >= 1) place(k, cx, kw, d + 1);
      cx += kw;
    }
  };
  place(root, 0, width, 0);
  const svg = $("tree");
  svg.setAttribute("viewBox", `0 0 ${width} ${(depth + 1) * ROW_H}`);
  svg.setAttribute("width", width);
  svg.setAttribute("height", (depth + 1) * ROW_H);
  svg.replaceChildren(...rects);
  $("tree-info").textContent = `${rep.nodes.length} nodes shown` +
    (rep.truncated ? ` (the ${MAX_NODES} most recently used; more are in the tree)` : "");
}

let viewTime = 0;  // the shown tree's snapshot time (the scheduler's clock, as last_access)

function ago(t) {
  const s = Math.max(0, viewTime - t);
  return s < 1 ? "just now" : s < 120 ? `${s.toFixed(0)} s ago` : `${(s / 60).toFixed(0)} min ago`;
}

function nodeRect(n, x, w, d, maxHits) {
  const label = n.id === 0 ? "root" : n.namespace ? "(cache_salt namespace)" : n.text;
  const g = el("svg:g", { class: "node" + (n.requests.length ? " held" : ""),
    "data-node-id": n.id, "data-parent": n.parent, "data-tokens": n.tokens,
    "data-hits": n.hits, "data-locks": n.locks, "data-last-access": n.last_access,
    "data-requests": n.requests.join(" "), "data-text": n.text,
    transform: `translate(${x.toFixed(1)},${d * ROW_H})` });
  const heat = Math.min(1, n.hits / maxHits);
  g.append(el("svg:rect", { width: Math.max(1, w - 1).toFixed(1), height: ROW_H - 2, rx: 3,
    fill: `hsl(${210 - 180 * heat},70%,${88 - 30 * heat}%)` }));
  if (w > 40) {
    const chars = Math.floor((w - 8) / 6.5);
    const info = n.id === 0 ? "" : `${n.tokens}t · ${n.hits}h `;
    const text = (info + label.replace(/\s+/g, " ")).slice(0, chars);
    g.append(el("svg:text", { x: 4, y: ROW_H / 2 + 4 }, text));
  }
  g.addEventListener("mousemove", (ev) => showTip(ev, n, label));
  g.addEventListener("mouseleave", () => { $("tooltip").hidden = true; });
  return g;
}

function showTip(ev, n, label) {
  const tip = $("tooltip");
  tip.replaceChildren(el("div", { class: "tip-text" }, label || "(no tokens)"),
    el("div", {}, `${n.tokens} tokens · ${n.hits} hits · last use ${ago(n.last_access)}` +
      ` · ${n.locks} locks`),
    el("div", {}, n.requests.length ? "held by " + n.requests.join(", ") : "held by no request"));
  tip.hidden = false;
  tip.style.left = Math.min(ev.pageX + 12, window.innerWidth - 380) + "px";
  tip.style.top = ev.pageY + 14 + "px";
}

function drawRequests(replicas) {
  const rows = replicas.flatMap((r) => r.requests.map((q) => el("tr", { "data-rid": q.rid,
    "data-phase": q.phase }, el("td", {}, r.dp_rank), el("td", {}, q.rid),
  el("td", { class: "phase-" + q.phase }, q.phase), el("td", {}, q.prompt_tokens),
  el("td", {}, q.output_tokens), el("td", {}, q.cached_tokens))));
  $("requests").tBodies[0].replaceChildren(...(rows.length ? rows
    : [el("tr", {}, el("td", { colspan: 6, class: "muted" }, "no request in flight"))]));
}

function drawGrammar(replicas) {
  const rows = [];
  for (const r of replicas) {
    const g = r.grammar;
    const head = replicas.length > 1 ? `replica ${r.dp_rank}: ` : "";
    if (!g) { rows.push([head + "backend", "not built (no constrained request yet)"]); continue; }
    rows.push([head + "cached grammars", g.entries], [head + "hits / compiles",
      `${g.hits} / ${g.compiles}`], [head + "masked tokens", g.num_masked_rows],
    [head + "jump-forwards", `${g.num_jumps} (${g.num_forced_tokens} tokens)`],
    [head + "closed early", g.num_closed_early]);
  }
  $("grammar").tBodies[0].replaceChildren(...rows.map(([k, v]) =>
    el("tr", {}, el("th", {}, k), el("td", {}, fmt(v)))));
}

function chart(svg, points, key, key2) {
  const W = 320, H = 110, P = 22;
  const vals = points.flatMap((p) => [p[key], key2 ? p[key2] : null]).filter((v) => v !== null);
  const max = Math.max(1e-9, ...vals);
  const line = (k, cls) => {
    const segs = [];
    let cur = [];
    points.forEach((p, i) => {
      if (p[k] === null) { if (cur.length) segs.push(cur); cur = []; return; }
      const x = P + (i * (W - P - 4)) / Math.max(1, points.length - 1);
      cur.push(`${x.toFixed(1)},${(H - 16 - (p[k] / max) * (H - 26)).toFixed(1)}`);
    });
    if (cur.length) segs.push(cur);
    return segs.map((s) => el("svg:polyline", { class: cls, points: s.length > 1 ? s.join(" ")
      : s[0] + " " + s[0] }));
  };
  const secs = points.length > 1 ? points[points.length - 1].t - points[0].t : 0;
  svg.replaceChildren(el("svg:line", { class: "axis", x1: P, y1: H - 16, x2: W - 4, y2: H - 16 }),
    el("svg:text", { class: "tick", x: 2, y: 12 }, vals.length ? fmt(max) : "no data yet"),
    el("svg:text", { class: "tick", x: P, y: H - 3 }, `-${Math.round(secs / 60)} min`),
    el("svg:text", { class: "tick", x: W - 30, y: H - 3 }, "now"),
    ...line(key, "series"), ...(key2 ? line(key2, "series second") : []));
  if (key2) svg.append(el("svg:text", { class: "tick", x: W - 150, y: 12 }, "generated · prompt"));
}

async function play() {
  const kind = $("play-kind").value;
  const maxTokens = Math.max(1, Math.min(256, parseInt($("play-max").value, 10) || 16));
  const system = $("play-system").value, user = $("play-user").value;
  const headers = { "Content-Type": "application/json", ...authHeaders() };
  let url, body;
  if (kind === "chat") {
    const models = await fetch("/v1/models", { headers });
    const model = models.ok ? (await models.json()).data[0].id : "default";
    url = "/v1/chat/completions";
    body = { model, max_tokens: maxTokens, messages: [
      ...(system ? [{ role: "system", content: system }] : []), { role: "user", content: user }] };
  } else {
    const forks = Math.max(1, Math.min(8, parseInt($("play-forks").value, 10) || 3));
    const branch = (i) => [{ type: "text", text: `${user} (${i + 1})` },
      { type: "gen", name: "b" + i, sampling_params: { max_new_tokens: maxTokens } }];
    url = "/program";
    body = { text: "", nodes: [{ type: "text", text: system },
      { type: "fork", branches: [...Array(forks).keys()].map(branch) },
      { type: "join", mode: "gather" }] };
  }
  $("play-status").textContent = "sending…";
  const r = await fetch(url, { method: "POST", headers, body: JSON.stringify(body) });
  const out = await r.json().catch(() => ({}));
  $("play-status").textContent = `HTTP ${r.status}`;
  $("play-output").textContent = !r.ok ? (out.error && out.error.message) || "failed"
    : kind === "chat" ? out.choices[0].message.content || "" : JSON.stringify(out.variables);
  poll();
}

$("key-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const key = $("key-input").value.trim();
  if (!key) return;
  sessionStorage.setItem(KEY_STORE, key);
  $("key-input").value = "";
  poll();
});
$("forget-key").addEventListener("click", () => { sessionStorage.removeItem(KEY_STORE); poll(); });
$("replica-pick").addEventListener("change", (ev) => { picked = Number(ev.target.value); poll(); });
$("play-send").addEventListener("click", () => play().catch((err) => {
  $("play-status").textContent = String(err.message || err);
}));
poll();
