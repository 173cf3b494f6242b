// The explorer page. It only draws and keeps the click history: every number it shows (tiles,
// dependencies, cache contents, hits, misses, traffic, bounds, named orders) comes from the C++
// model behind /api/*, so the page can never disagree with `tileweave sim`.
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";
const SERIES_COLORS = ["#2f6fdf", "#d9480f", "#2e9d5b", "#8e44ad", "#c2185b", "#00838f", "#6d4c41", "#5c6bc0"];

const state = {
  meta: null,       // /api/meta: presets, limits
  problem: null,    // the problem as the server normalised it
  layout: null,     // /api/layout: ops, tiles with dependencies, named orders, bounds
  order: [],        // tiles run so far, in order
  redo: [],         // tiles undone (or the rest of a loaded order), next one last
  orderLabel: "clicked",
  sim: null,        // /api/simulate for `order`
  compare: null,    // /api/compare for the chart
  playTimer: null,
};

const $ = (id) => document.getElementById(id);

// ---------------------------------------------------------------- server calls

// Requests in flight, on <body data-pending>: tests wait for 0 before reading the page.
let pending = 0;
function setPending(delta) {
  pending += delta;
  document.body.dataset.pending = String(pending);
}

async function api(path, body) {
  setPending(+1);
  try {
    return await apiCall(path, body);
  } finally {
    // After the caller's continuation has drawn the answer.
    setTimeout(() => setPending(-1), 0);
  }
}

async function apiCall(path, body) {
  const init = body === undefined ? {} : {
    method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
  };
  const res = await fetch(path, init);
  let data;
  try {
    data = await res.json();
  } catch (e) {
    throw new ApiError(`server answered ${res.status} without JSON`, res.status);
  }
  if (!res.ok) throw new ApiError(data.error || `server answered ${res.status}`, res.status);
  return data;
}

class ApiError extends Error {
  constructor(message, status) { super(message); this.status = status; }
}

function formatBytes(b) {
  if (b === null || b === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let v = b, u = 0;
  while (Math.abs(v) >= 1024 && u < units.length - 1) { v /= 1024; u++; }
  const short = u === 0 ? `${v} B` : `${v.toFixed(v < 10 ? 2 : 1)} ${units[u]}`;
  return u === 0 ? short : `${short} (${b.toLocaleString("en-US")} B)`;
}

// Accepts "65536", "64K", "64 KiB", "60MiB", "1.5M": the server checks the range.
function parseBytes(text) {
  const m = String(text).trim().match(/^(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?$/i);
  if (!m) return text;  // let the server name the bad value
  const scale = { "": 1, k: 1024, m: 1024 ** 2, g: 1024 ** 3, t: 1024 ** 4 }[m[2].toLowerCase()];
  return Math.round(parseFloat(m[1]) * scale);
}

function setMessage(text, refused = false) {
  const el = $("message");
  el.textContent = text;
  el.classList.toggle("refused", refused);
}

function showError(text) { $("error").textContent = text; }

// ---------------------------------------------------------------- the form

function readProblem() {
  const num = (id) => {
    const v = $(id).value.trim();
    return v === "" || isNaN(Number(v)) ? v : Number(v);
  };
  return {
    kind: $("kind").value,
    m: num("m"), n: num("n"), k: num("k"),
    bm: num("bm"), bn: num("bn"), bk: num("bk"),
    elem_bytes: num("elem_bytes"),
    cache_bytes: parseBytes($("cache_bytes").value),
    line_bytes: num("line_bytes"),
    in_flight: num("in_flight"),
  };
}

function writeProblem(p) {
  for (const key of ["kind", "m", "n", "k", "bm", "bn", "bk", "elem_bytes", "cache_bytes", "line_bytes", "in_flight"])
    if (p[key] !== undefined) $(key).value = p[key];
  labelDimensions();
}

// The chain views name their sizes after the FFN: y[M,d] = f(x[M,d] W0^T) W1^T, W0 is [F, d].
function labelDimensions() {
  const gemm = $("kind").value === "gemm";
  $("label-m").textContent = "M";
  $("label-n").textContent = gemm ? "N" : "F (inner)";
  $("label-k").textContent = gemm ? "K" : "d (model)";
}

function applyModelPreset() {
  const name = $("model").value;
  const model = state.meta.models.find((x) => x.name === name);
  if (!model) return;
  if ($("kind").value === "gemm") $("kind").value = "ffn";
  $("m").value = $("batch").value;
  // Decode batches are small: a row tile taller than the batch would be refused, so shrink it.
  if (Number($("bm").value) > Number($("batch").value)) $("bm").value = $("batch").value;
  $("n").value = model.ffn;
  $("k").value = model.hidden;
  labelDimensions();
}

function applyGpuPreset() {
  const gpu = state.meta.gpus.find((x) => x.name === $("gpu").value);
  if (!gpu) return;
  $("cache_bytes").value = gpu.cache_bytes;
  $("in_flight").value = gpu.in_flight;
  if (gpu.line_bytes) $("line_bytes").value = gpu.line_bytes;
}

async function applyProblem() {
  stopPlaying();
  showError("");
  let layout;
  try {
    layout = await api("/api/layout", { problem: readProblem() });
  } catch (e) {
    showError(e.message);
    return;
  }
  state.problem = layout.problem;
  state.layout = layout;
  window.__layouts = (window.__layouts || 0) + 1;  // lets tests see that a new problem is shown
  state.order = [];
  state.redo = [];
  state.orderLabel = "clicked";
  writeProblem(layout.problem);
  fillOrderSelect(layout.orders);
  fillChartOrders(layout.orders);
  setMessage(`${layout.tiles.length} tiles. Click a tile to run it next, or load an order.`);
  await resimulate();
  await refreshChart();
}

function fillOrderSelect(names) {
  const sel = $("order-name");
  sel.innerHTML = "";
  for (const name of names) sel.add(new Option(name, name));
}

function fillChartOrders(names) {
  const box = $("chart-orders");
  box.innerHTML = "";
  const wanted = new Set(state.layout.chart_default_orders || names.slice(0, 4));
  for (const name of names) {
    const label = document.createElement("label");
    const cb = document.createElement("input");
    cb.type = "checkbox";
    cb.value = name;
    cb.checked = wanted.has(name);
    cb.addEventListener("change", refreshChart);
    label.append(cb, name);
    box.append(label);
  }
}

// ---------------------------------------------------------------- the order being built

async function resimulate() {
  const sim = await api("/api/simulate", { problem: state.problem, order: state.order });
  state.sim = sim;
  render();
}

// Runs `tile` next. The server validates the order with the graph's dependencies and refuses
// a tile whose producers have not run; the page then keeps its old state and shows why.
// Simulates `order` on the server and makes it the current path; false (with the server's
// reason shown) if the server refuses it.
async function adoptOrder(order) {
  try {
    state.sim = await api("/api/simulate", { problem: state.problem, order });
  } catch (e) {
    setMessage(`Refused: ${e.message}`, true);
    return false;
  }
  state.order = order;
  return true;
}

async function runTile(tile) {
  if (state.order.includes(tile)) {
    setMessage(`${tileName(tile)} already ran at step ${state.order.indexOf(tile) + 1}.`);
    return;
  }
  const order = state.order.concat([tile]);
  if (!(await adoptOrder(order))) return;
  // A click off the loaded path forgets the rest of that path; a click on it just steps it.
  if (state.redo.length && state.redo[state.redo.length - 1] === tile) state.redo.pop();
  else { state.redo = []; if (state.orderLabel !== "clicked") state.orderLabel += " + clicks"; }
  const s = state.sim.steps[state.sim.steps.length - 1];
  setMessage(`Step ${order.length}: ${tileName(tile)} — ${stepSummary(s)}.`);
  render();
}

async function undo() {
  if (!state.order.length) return;
  state.redo.push(state.order.pop());
  await resimulate();
  setMessage(`Undid ${tileName(state.redo[state.redo.length - 1])}.`);
}

async function redo() {
  if (!state.redo.length) return false;
  await runTile(state.redo[state.redo.length - 1]);
  return true;
}

async function resetOrder() {
  stopPlaying();
  state.redo = state.order.slice().reverse().concat(state.redo);
  state.order = [];
  await resimulate();
  setMessage("Back to step 0 (Redo replays).");
}

async function loadOrder() {
  stopPlaying();
  const name = $("order-name").value;
  let res;
  try {
    res = await api("/api/order", { problem: state.problem, name });
  } catch (e) {
    setMessage(e.message, true);
    return;
  }
  state.order = [];
  state.redo = res.order.slice().reverse();
  state.orderLabel = res.name;
  await resimulate();
  setMessage(`Loaded order '${res.name}' (${res.order.length} tiles${res.note ? "; " + res.note : ""}): Step or Play walks it.`);
}

async function toEnd() {
  stopPlaying();
  if (!state.redo.length) return;
  const order = state.order.concat(state.redo.slice().reverse());
  if (!(await adoptOrder(order))) return;
  state.redo = [];
  setMessage(`Ran all ${order.length} steps of '${state.orderLabel}'.`);
  render();
}

function togglePlay() {
  if (state.playTimer) { stopPlaying(); return; }
  if (!state.redo.length) { setMessage("Nothing to play: load an order first (or undo some steps)."); return; }
  $("play").textContent = "Pause";
  const delay = Math.max(30, Math.min(400, 8000 / (state.redo.length + 1)));
  const tick = async () => {
    if (!(await redo()) || !state.redo.length) { stopPlaying(); return; }
    if (state.playTimer) state.playTimer = setTimeout(tick, delay);
  };
  state.playTimer = setTimeout(tick, 0);
}

function stopPlaying() {
  if (state.playTimer) clearTimeout(state.playTimer);
  state.playTimer = null;
  $("play").textContent = "Play";
}

function tileName(id) {
  const t = state.layout.tiles[id];
  const op = state.layout.ops[t.op];
  return state.layout.ops.length > 1 ? `${op.name}(${t.tm},${t.tn})` : `tile (${t.tm},${t.tn})`;
}

function stepSummary(s) {
  return `hits ${formatBytes(s.hit_bytes)}, misses ${formatBytes(s.miss_bytes)}, writes ${formatBytes(s.write_bytes)}`;
}

// ---------------------------------------------------------------- drawing the grids

function el(tag, attrs, parent) {
  const e = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (parent) parent.append(e);
  return e;
}

// Styles live inside the SVG so that an exported SVG/PNG looks the same as the page.
const GRID_STYLE = `
  text { font: 11px system-ui, sans-serif; fill: #1d2330; }
  .title { font-weight: 600; font-size: 12px; }
  .tile { stroke: #8d96a8; stroke-width: 1; cursor: pointer; }
  .tile.blocked { fill: #eceef2; } .tile.ready { fill: #fff; stroke: #2f6fdf; stroke-width: 1.5; }
  .tile.done { fill: #cfe0fb; } .tile.last { fill: #f7c65b; }
  .block { stroke: #c5cad5; stroke-width: 0.5; fill: #fff; } .block.cached { fill: #2e9d5b; } .block.dirty { fill: #8e44ad; } .block.tiny { stroke: none; }
  .stepno { font-size: 10px; text-anchor: middle; dominant-baseline: central; pointer-events: none; }
  .out-block { pointer-events: none; } .out-block.cached { fill: #2e9d5b; } .out-block.dirty { fill: #8e44ad; }
  .path { stroke: #d9480f; stroke-width: 1; fill: none; pointer-events: none; }
  .arrow { stroke: #d9480f; stroke-width: 1.6; fill: none; marker-end: url(#arrowhead); pointer-events: none; }
`;

// The output tensor's blocks that are in the cache, as a bar along the bottom of each block (the
// tile colours already say what ran): purple while written and not yet back in DRAM.
function drawOutputResidency(parent, ti, x, y, w, h) {
  const T = state.layout.tensors[ti];
  const res = state.sim && state.sim.resident ? state.sim.resident[ti] : null;
  if (!res) return;
  for (let r = 0; r < T.num_rows; r++)
    for (let c = 0; c < T.num_cols; c++) {
      if (!res[r][c]) continue;
      const y1 = y + h * Math.min(T.rows, (r + 1) * T.block_rows) / T.rows;
      const x0 = x + w * (c * T.block_cols) / T.cols, x1 = x + w * Math.min(T.cols, (c + 1) * T.block_cols) / T.cols;
      const bar = Math.max(2, Math.min(5, (y1 - y) / T.num_rows / 5));
      el("rect", { x: x0 + 1, y: y1 - bar - 1, width: Math.max(1, x1 - x0 - 2), height: bar,
                   class: `out-block ${res[r][c] === 2 ? "dirty" : "cached"}` }, parent);
    }
}

// Cache state of a block, as /api/simulate reports it: 0 absent, 1 clean, 2 dirty (written, not
// yet back in DRAM). Draws tensor `ti` cut into the cache model's blocks inside the box (x, y, w, h); `across`
// puts the tensor's rows along x (the B operand above the output grid).
function drawTensorPanel(parent, ti, x, y, w, h, across, cls) {
  const T = state.layout.tensors[ti];
  const res = state.sim && state.sim.resident ? state.sim.resident[ti] : null;
  const rowLen = across ? w : h, colLen = across ? h : w;
  for (let r = 0; r < T.num_rows; r++) {
    const r0 = rowLen * (r * T.block_rows) / T.rows, r1 = rowLen * Math.min(T.rows, (r + 1) * T.block_rows) / T.rows;
    for (let c = 0; c < T.num_cols; c++) {
      const c0 = colLen * (c * T.block_cols) / T.cols, c1 = colLen * Math.min(T.cols, (c + 1) * T.block_cols) / T.cols;
      const state_ = res ? res[r][c] : 0;
      el("rect", across
        ? { x: x + r0, y: y + c0, width: r1 - r0, height: c1 - c0 }
        : { x: x + c0, y: y + r0, width: c1 - c0, height: r1 - r0 },
        parent).setAttribute("class", `block ${cls}` + (state_ ? (state_ === 2 ? " dirty" : " cached") : "") +
                             (Math.min(r1 - r0, c1 - c0) < 3 ? " tiny" : ""));
    }
  }
}

function render() {
  const L = state.layout;
  if (!L) return;
  const svg = $("grid");
  svg.innerHTML = "";
  el("style", {}, svg).textContent = GRID_STYLE;
  const defs = el("defs", {}, svg);
  const marker = el("marker", { id: "arrowhead", viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 6, markerHeight: 6, orient: "auto-start-reverse" }, defs);
  el("path", { d: "M0,0 L10,5 L0,10 z", fill: "#d9480f" }, marker);

  const done = new Map(state.order.map((t, i) => [t, i]));
  const last = state.order.length ? state.order[state.order.length - 1] : -1;

  // One group per op: the A operand (rows x K) left of the output grid, the B operand (its rows
  // across, K downwards) above it -- the textbook picture of C = A B^T. Operand panels are cut
  // into the cache model's blocks and coloured by what is in the cache after the last step.
  // Tiles are square where there is room; a decode GEMM (1 x 112 tiles) gets thin tall ones.
  const depthOf = (op) => Math.max(24, Math.min(Math.ceil(op.k / op.bk) * 22, 120));  // pixels for K
  const across = L.ops.reduce((sum, op) => sum + op.grid_n * Math.max(1, L.tensors[op.b].rows / op.n), 0);
  const fixed = L.ops.reduce((sum, op) => sum + depthOf(op) + 120, 0);
  const avail = Math.max(600, $("grid-wrap").clientWidth - 20);
  const clamp = (v) => Math.max(4, Math.min(44, Math.floor(v)));
  let cw = clamp((avail - fixed) / across), ch = clamp(420 / Math.max(...L.ops.map((o) => o.grid_m)));
  if (Math.min(cw, ch) >= 12) cw = ch = Math.min(cw, ch);
  const cell = Math.min(cw, ch);
  const centers = [];
  let x0 = 10;
  let height = 0;
  L.ops.forEach((op, oi) => {
    const depth = depthOf(op);
    const gx = x0 + depth + 8, gy = 44 + depth + 8;
    const gw = op.grid_n * cw, gh = op.grid_m * ch;
    const A = L.tensors[op.a], B = L.tensors[op.b];
    const bw = gw * B.rows / op.n;  // the gated FFN's B is [gate; up]: twice as wide as its output
    const g = el("g", { class: "op", "data-op": oi }, svg);
    el("text", { x: x0, y: 16, class: "title" }, g).textContent =
      `${op.name}: ${op.c_name}[${op.m}×${op.n}] = ${op.a_name}[${op.m}×${op.k}] · ${op.b_name}[${B.rows}×${op.k}]ᵀ`;
    el("text", { x: x0, y: 32 }, g).textContent = `tiles ${op.bm}×${op.bn}×${op.bk}, grid ${op.grid_m}×${op.grid_n}`;
    drawTensorPanel(g, op.a, x0, gy, depth, gh, false, "a-block");
    el("text", { x: x0, y: gy + gh + 14 }, g).textContent = `A: ${op.a_name}`;
    drawTensorPanel(g, op.b, gx, 44, bw, depth, true, "b-block");
    el("text", { x: gx + bw + 4, y: 54 }, g).textContent = `B: ${op.b_name}`;
    for (let tm = 0; tm < op.grid_m; tm++)
      for (let tn = 0; tn < op.grid_n; tn++) {
        const id = op.tiles[tm * op.grid_n + tn];
        const t = L.tiles[id];
        const cls = id === last ? "last" : done.has(id) ? "done" : t.deps.every((d) => done.has(d)) ? "ready" : "blocked";
        const r = el("rect", { x: gx + tn * cw, y: gy + tm * ch, width: cw, height: ch,
                               class: `tile ${cls}`, "data-tile": id, "data-op": oi, "data-tm": tm, "data-tn": tn }, g);
        el("title", {}, r).textContent = `${tileName(id)} = tile ${id}` +
          (t.deps.length ? `; needs ${t.deps.length} tile(s) of ${L.ops[L.tiles[t.deps[0]].op].name}` : "");
        r.addEventListener("click", () => runTile(id));
        centers[id] = [gx + (tn + 0.5) * cw, gy + (tm + 0.5) * ch];
      }
    drawOutputResidency(g, op.c, gx, gy, gw, gh);
    x0 = Math.max(gx + Math.max(gw, bw + 60) + 50, x0 + 380);  // room for the title too
    height = Math.max(height, gy + gh + 24);
  });

  // Arrows from each tile to the next along the path, then the step numbers on top.
  // Tiny tiles get a plain line through the path: arrowheads would hide them.
  if (cell < 10 && state.order.length > 1)
    el("polyline", { points: state.order.map((id) => centers[id].join(",")).join(" "), class: "path" }, svg);
  // Neighbour steps are straight arrows; jumps bend, so that they do not hide the tiles they pass.
  const shorten = Math.min(cell * 0.35, 10);
  for (let i = 1; i < state.order.length && cell >= 10; i++) {
    const [ax, ay] = centers[state.order[i - 1]], [bx, by] = centers[state.order[i]];
    const len = Math.hypot(bx - ax, by - ay) || 1;
    const ux = (bx - ax) / len, uy = (by - ay) / len;
    const x1 = ax + ux * shorten, y1 = ay + uy * shorten, x2 = bx - ux * shorten, y2 = by - uy * shorten;
    if (len <= 1.5 * Math.max(cw, ch)) {
      el("line", { x1, y1, x2, y2, class: "arrow" }, svg);
    } else {
      const bend = Math.min(0.2 * len, 40);
      const cx = (x1 + x2) / 2 - uy * bend, cy = (y1 + y2) / 2 + ux * bend;
      el("path", { d: `M${x1},${y1} Q${cx},${cy} ${x2},${y2}`, class: "arrow" }, svg);
    }
  }
  if (cell >= 14)
    state.order.forEach((id, i) => {
      const [cx, cy] = centers[id];
      el("text", { x: cx, y: cy, class: "stepno" }, svg).textContent = String(i + 1);
    });

  svg.setAttribute("width", x0);
  svg.setAttribute("height", height);
  svg.setAttribute("viewBox", `0 0 ${x0} ${height}`);
  renderStatus();
  drawChart();
}

function renderStatus() {
  const L = state.layout, sim = state.sim;
  $("order-label").textContent = state.orderLabel;
  $("step-count").textContent = state.order.length;
  $("tile-count").textContent = L.tiles.length;
  const lastStep = sim && sim.steps.length ? sim.steps[sim.steps.length - 1] : null;
  $("last-step").textContent = lastStep ? stepSummary(lastStep) : "–";
  const total = sim ? sim.total_bytes : 0;
  let note = "";
  if (sim && sim.complete) note = ` incl. ${formatBytes(sim.flush_bytes).split(" (")[0]} final write-back`;
  else if (sim && sim.dirty_bytes) note = ` + ${formatBytes(sim.dirty_bytes).split(" (")[0]} dirty in cache`;
  // With P > 1 and dependencies, simulate() stalls tiles where the step view cuts waves: say so.
  if (sim && sim.complete && sim.simulate_bytes !== sim.total_bytes)
    note += `; simulate() with P in flight: ${formatBytes(sim.simulate_bytes)}`;
  $("traffic").textContent = formatBytes(total);
  $("traffic-note").textContent = note;
  $("traffic").dataset.bytes = String(total);
  $("compulsory").textContent = formatBytes(L.compulsory_bytes);
  $("lower-bound").textContent = L.lower_bound_bytes === null ? "–" : formatBytes(L.lower_bound_bytes);
  $("lower-bound").title = L.bounds.map((b) => `${b.name}: ${b.bytes.toLocaleString("en-US")} B — ${b.note}`).join("\n");
  $("undo").disabled = !state.order.length;
  $("redo").disabled = $("step").disabled = $("to-end").disabled = !state.redo.length;
}

// ---------------------------------------------------------------- the chart

async function refreshChart() {
  const names = [...document.querySelectorAll("#chart-orders input:checked")].map((cb) => cb.value);
  try {
    state.compare = await api("/api/compare", { problem: state.problem, names });
  } catch (e) {
    setMessage(e.message, true);
    state.compare = null;
  }
  drawChart();
}

function drawChart() {
  const svg = $("chart");
  svg.innerHTML = "";
  const L = state.layout;
  if (!L) return;
  const W = 820, H = 280, pad = { l: 78, r: 190, t: 12, b: 34 };
  el("style", {}, svg).textContent = `text { font: 11px system-ui, sans-serif; fill: #1d2330; }
    .axis { stroke: #8d96a8; } .grid { stroke: #eceef2; } .bound { stroke-dasharray: 5 4; stroke-width: 1.3; }`;
  el("rect", { x: 0, y: 0, width: W, height: H, fill: "#fff" }, svg);
  const series = (state.compare ? state.compare.series : []).map((s, i) => ({ ...s, color: SERIES_COLORS[i % SERIES_COLORS.length] }));
  if (state.sim && state.sim.steps.length) {
    const cumulative = state.sim.steps.map((s) => s.cumulative_bytes);
    if (state.sim.complete) cumulative[cumulative.length - 1] = state.sim.total_bytes;  // with the final write-back, as simulate()
    series.push({ name: `current (${state.orderLabel})`, cumulative, color: "#111", width: 2.5 });
  }
  const steps = L.tiles.length;
  const bounds = L.lower_bound_bytes === L.compulsory_bytes
    ? [["compulsory = lower bound", L.compulsory_bytes, "#b3261e"]]
    : [["compulsory", L.compulsory_bytes, "#555"], ["lower bound", L.lower_bound_bytes, "#b3261e"]].filter((b) => b[1] !== null);
  const ymax = Math.max(1, ...series.flatMap((s) => s.cumulative), ...bounds.map((b) => b[1])) * 1.05;
  const X = (i) => pad.l + (W - pad.l - pad.r) * i / Math.max(1, steps);
  const Y = (v) => H - pad.b - (H - pad.t - pad.b) * v / ymax;
  for (let q = 0; q <= 4; q++) {
    const v = ymax * q / 4;
    el("line", { x1: pad.l, x2: W - pad.r, y1: Y(v), y2: Y(v), class: "grid" }, svg);
    el("text", { x: pad.l - 6, y: Y(v) + 4, "text-anchor": "end" }, svg).textContent = formatBytes(Math.round(v)).split(" (")[0];
  }
  el("line", { x1: pad.l, x2: pad.l, y1: pad.t, y2: H - pad.b, class: "axis" }, svg);
  el("line", { x1: pad.l, x2: W - pad.r, y1: H - pad.b, y2: H - pad.b, class: "axis" }, svg);
  el("text", { x: (W - pad.r + pad.l) / 2, y: H - 6, "text-anchor": "middle" }, svg).textContent = `step (tiles run), of ${steps}`;
  for (const [name, v, color] of bounds) {
    el("line", { x1: pad.l, x2: W - pad.r, y1: Y(v), y2: Y(v), stroke: color, class: "bound" }, svg);
    el("text", { x: W - pad.r + 4, y: Y(v) + 4, fill: color }, svg).textContent = name;
  }
  series.forEach((s, i) => {
    const pts = [[X(0), Y(0)], ...s.cumulative.map((v, j) => [X(j + 1), Y(v)])];
    el("polyline", { points: pts.map((p) => p.join(",")).join(" "), fill: "none", stroke: s.color, "stroke-width": s.width || 1.6, class: "series", "data-name": s.name }, svg);
    el("text", { x: W - pad.r + 4, y: pad.t + 30 + 14 * i, fill: s.color }, svg).textContent =
      `${s.name}: ${formatBytes(s.cumulative[s.cumulative.length - 1]).split(" (")[0]}`;
  });
  svg.setAttribute("width", W);
  svg.setAttribute("height", H);
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
}

// ---------------------------------------------------------------- export

function download(name, blob) {
  const a = document.createElement("a");
  a.href = URL.createObjectURL(blob);
  a.download = name;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 5000);
}

// The order file is written by the server, in the format `tileweave sim --order-file` reads.
async function exportJson() {
  try {
    const res = await api("/api/export", { problem: state.problem, order: state.order, name: state.orderLabel });
    download("tileweave-order.json", new Blob([JSON.stringify(res.file, null, 2) + "\n"], { type: "application/json" }));
    setMessage(`Exported ${state.order.length} steps as tileweave-order.json. ` +
               (res.cli ? `Check it with: ${res.cli}` : `(No CLI line: ${res.cli_note}.)`));
  } catch (e) {
    setMessage(e.message, true);
  }
}

function svgText() {
  const svg = $("grid").cloneNode(true);
  svg.setAttribute("xmlns", SVG_NS);
  return new XMLSerializer().serializeToString(svg);
}

function exportSvg() {
  download("tileweave-order.svg", new Blob([svgText()], { type: "image/svg+xml" }));
}

function exportPng() {
  const svg = $("grid");
  const img = new Image();
  img.onload = () => {
    const canvas = document.createElement("canvas");
    canvas.width = svg.width.baseVal.value * 2;
    canvas.height = svg.height.baseVal.value * 2;
    const ctx = canvas.getContext("2d");
    ctx.fillStyle = "#fff";
    ctx.fillRect(0, 0, canvas.width, canvas.height);
    ctx.scale(2, 2);
    ctx.drawImage(img, 0, 0);
    canvas.toBlob((blob) => download("tileweave-order.png", blob), "image/png");
  };
  img.src = "data:image/svg+xml;charset=utf-8," + encodeURIComponent(svgText());
}

// ---------------------------------------------------------------- start

async function start() {
  try {
    state.meta = await api("/api/meta");
  } catch (e) {
    showError(`cannot reach the tileweave server: ${e.message}`);
    return;
  }
  for (const m of state.meta.models) $("model").add(new Option(`${m.name} (d=${m.hidden}, F=${m.ffn})`, m.name));
  for (const g of state.meta.gpus) $("gpu").add(new Option(`${g.name} (${formatBytes(g.cache_bytes).split(" (")[0]}, ${g.in_flight} SMs)`, g.name));
  writeProblem(state.meta.default_problem);
  $("problem-form").addEventListener("submit", (e) => { e.preventDefault(); applyProblem(); });
  $("kind").addEventListener("change", labelDimensions);
  $("model").addEventListener("change", applyModelPreset);
  $("batch").addEventListener("change", applyModelPreset);
  $("gpu").addEventListener("change", applyGpuPreset);
  $("undo").addEventListener("click", undo);
  $("redo").addEventListener("click", redo);
  $("step").addEventListener("click", redo);
  $("reset").addEventListener("click", resetOrder);
  $("load-order").addEventListener("click", loadOrder);
  $("play").addEventListener("click", togglePlay);
  $("to-end").addEventListener("click", toEnd);
  $("export-json").addEventListener("click", exportJson);
  $("export-svg").addEventListener("click", exportSvg);
  $("export-png").addEventListener("click", exportPng);
  document.addEventListener("keydown", (e) => {
    if (!(e.ctrlKey || e.metaKey) || e.target.tagName === "INPUT") return;
    if (e.key === "z") { e.preventDefault(); undo(); }
    if (e.key === "y") { e.preventDefault(); redo(); }
  });
  await applyProblem();
  document.body.dataset.ready = "1";  // tests wait for this
}

start();
