// The page of edgerl serve: picks a run, polls its documents, draws the game from the frame
// WebSocket (answering "next" after each frame, so a slow link gets fewer frames, not a queue).
"use strict";

// The token: given once in the address (/?token=TOKEN, as edgerl serve prints it), then kept in
// this tab's sessionStorage, which no other port or site can read (a cookie would go to every
// port of this host), and sent with every request. The address drops it at once.
const TOKEN_KEY = "edgerl-serve-token";
function takeToken() {
  const given = new URLSearchParams(location.search).get("token");
  if (given !== null) {
    // an address reads "+" as a space; a token holds no spaces: a base64 one pasted as it is
    sessionStorage.setItem(TOKEN_KEY, given.replace(/ /g, "+"));
    history.replaceState(null, "", location.pathname + location.hash);
  }
  return sessionStorage.getItem(TOKEN_KEY);
}
const token = takeToken();

const POLL_MS = { runs: 10000, summary: 2000, load: 3000, curves: 10000 };
const $ = (id) => document.getElementById(id);
const { lineChart, compact, clock } = window.charts;

const page = { run: null, x: "steps", socket: null, timers: [], docs: {}, frames: 0, shown: [] };
const cache = new Map(); // url -> [etag, document]

class Unauthorized extends Error {}

async function getJSON(url) {
  const held = cache.get(url);
  const headers = held ? { "If-None-Match": held[0] } : {};
  if (token) headers.Authorization = "Bearer " + token;
  const response = await fetch(url, { headers, cache: "no-cache" });
  if (response.status === 304 && held) return held[1];
  if (response.status === 401) throw new Unauthorized();
  const doc = await response.json();
  if (response.ok && response.headers.get("ETag")) cache.set(url, [response.headers.get("ETag"), doc]);
  if (!response.ok) throw new Error(doc.problem || response.statusText);
  return doc;
}

function text(el, value) {
  el.textContent = value === null || value === undefined ? "" : String(value);
}

function number(v, digits) {
  if (v === null || v === undefined) return "–";
  return v.toLocaleString("en-US", { maximumFractionDigits: digits === undefined ? 2 : digits });
}

function duration(s) {
  if (s === null || s === undefined) return "–";
  if (s < 90) return Math.round(s) + " s";
  if (s < 5400) return Math.round(s / 60) + " min";
  if (s < 172800) return (s / 3600).toFixed(1) + " h";
  return (s / 86400).toFixed(1) + " days";
}

function figures(dl, pairs) {
  dl.replaceChildren();
  for (const [name, value, title] of pairs) {
    const dt = document.createElement("dt");
    const dd = document.createElement("dd");
    dt.textContent = name;
    dd.textContent = value;
    if (title) dd.title = title;
    dl.append(dt, dd);
  }
}

function notes(ul, lines, cls) {
  ul.replaceChildren();
  for (const line of lines.filter(Boolean)) {
    const li = document.createElement("li");
    li.textContent = line;
    if (cls) li.className = cls;
    ul.append(li);
  }
}

// -- the run picker ----------------------------------------------------------------------------

async function refreshRuns() {
  let doc;
  try {
    doc = await getJSON("api/runs");
  } catch (e) {
    if (e instanceof Unauthorized) return wantToken();
    return showConnection(false);
  }
  showConnection(true);
  const select = $("run");
  const wanted = decodeURIComponent(location.hash.replace(/^#run=/, "")) || page.run;
  const ids = doc.runs.map((r) => r.id);
  const labels = doc.runs.map((r) => `${r.id} · ${r.env || "?"} · ${r.state}`);
  if (ids.join("\n") + labels.join("\n") !== page.shown.join("\n")) {
    select.replaceChildren(...doc.runs.map((r, i) => new Option(labels[i], r.id)));
    page.shown = ids.concat(labels);
  }
  const choice = ids.includes(wanted) ? wanted : ids[0] || null;
  if (!choice) {
    $("problem").hidden = false;
    text($("problem"), "no runs here yet: they appear once a trainer has written status.json or metrics.csv");
  } else if (choice !== page.run) {
    select.value = choice;
    openRun(choice);
  }
}

function wantToken() {
  // Nothing more is asked for until the page is opened with the token again (a server started
  // again on 127.0.0.1 without a token file made another one): the runs' poll alone goes on.
  page.timers.forEach(clearInterval);
  page.timers = [];
  page.run = null; // the frame stream's onclose then opens no other
  if (page.socket) page.socket.close();
  document.body.classList.remove("offline");
  setPill("wants the token", "bad");
  $("problem").hidden = false;
  text($("problem"), token
    ? "this token is not the server's: open the address edgerl serve printed at its start again"
    : "this page wants the token: open the address edgerl serve printed at its start (…/?token=…)");
}

function showConnection(ok) {
  document.body.classList.toggle("offline", !ok);
  if (!ok) {
    setPill("no connection", "bad");
  }
}

function setPill(label, kind) {
  const pill = $("state");
  text(pill, label);
  pill.className = "pill " + (kind || "");
}

function openRun(id) {
  page.timers.forEach(clearInterval);
  page.timers = [];
  if (page.socket) page.socket.close();
  page.run = id;
  page.docs = {};
  page.frames = 0;
  history.replaceState(null, "", "#run=" + encodeURIComponent(id));
  clearPanels();
  const base = "api/runs/" + encodeURIComponent(id) + "/";
  const every = (what, draw) => {
    const tick = async () => {
      try {
        const doc = await getJSON(base + what);
        if (page.run !== id) return;
        page.docs[what] = doc;
        draw(doc);
      } catch (e) {
        if (e instanceof Unauthorized) wantToken();
        else showConnection(false);
      }
    };
    tick();
    page.timers.push(setInterval(tick, POLL_MS[what]));
  };
  every("summary", drawSummary);
  every("curves", drawCurves);
  every("load", drawLoad);
  watchFrames(base + "frames", id);
}

// Nothing of the run shown before stays on the page while the new one's documents come.
function clearPanels() {
  $("problem").hidden = true;
  for (const id of ["returns", "sps", "load"]) $(id).replaceChildren();
  for (const id of ["game-figures", "status", "board", "q", "notes", "curves-notes", "load-notes", "cores"]) {
    $(id).replaceChildren();
  }
  for (const legend of document.querySelectorAll(".legend")) legend.replaceChildren();
  const canvas = $("game");
  canvas.getContext("2d").clearRect(0, 0, canvas.width, canvas.height);
  text($("game-rate"), "");
  text($("progress-text"), "");
  $("progress-bar").style.width = "0";
  delete document.body.dataset.gameNote;
  document.body.dataset.frames = 0;
  setPill("loading");
}

// -- status ------------------------------------------------------------------------------------

const STATE_KIND = { running: "good", finished: "done", stale: "warn", failed: "bad" };

function drawSummary(doc) {
  showConnection(true);
  const s = doc.status;
  if (!s) {
    setPill("no status", doc.problem ? "bad" : "");
    figures($("status"), [["learner", doc.learner || "–"], ["checkpoint", doc.checkpoint || "none"]]);
    notes($("notes"), [doc.problem], "damage");
    text($("progress-text"), "");
    $("progress-bar").style.width = "0";
    return;
  }
  const live = doc.live;
  const state = live.running ? "running" : live.stale ? "stale" : live.finished ? "finished" : s.state;
  setPill(state, STATE_KIND[state]);
  text($("updated"), "updated " + duration(live.age_s) + " ago");
  const share = s.total_steps ? Math.min(s.step / s.total_steps, 1) : 0;
  $("progress-bar").style.width = (share * 100).toFixed(2) + "%";
  text($("progress-text"), `step ${number(s.step, 0)} of ${number(s.total_steps, 0)} (${(share * 100).toFixed(1)}%)`);
  const best = doc.best_eval;
  const filling = s.step < (s.learning_starts || 0);
  figures($("status"), [
    ["game", doc.env || "–"],
    ["learner", doc.learner || "–"],
    ["steps/s", number(s.sps, 0)],
    ["time left", filling ? "filling replay" : live.running ? duration(doc.eta_s) : "–"],
    ["episodes", number(s.episodes, 0)],
    ["return (last 100)", number(s.return_mean)],
    ["newest evaluation", s.eval_return === null ? "–" : `${number(s.eval_return)} at ${compact(s.eval_step)}` +
      (s.eval_human_normalised === null || s.eval_human_normalised === undefined ? "" : ` (${number(s.eval_human_normalised, 2)} human-normalised)`)],
    ["best evaluation", best ? `${number(best.return_mean)} at ${compact(best.step)}` : "–"],
    // null for a learner that does not explore by epsilon (a policy's noise, sampled actions)
    ...(s.epsilon === null || s.epsilon === undefined ? [] : [["epsilon", number(s.epsilon, 3)]]),
    ["updates", number(s.updates, 0)],
    // The learner's own figures (a genetic algorithm's generation and scores).
    ...Object.entries(s.figures || {}).map(([name, v]) => [name.replace(/_/g, " "), v === null ? "–" : number(v)]),
    ["balance", s.who_waits || "–"],
    ["energy", s.energy_j === null || s.energy_j === undefined ? "not reported here" : `${number(s.energy_j / 3600, 3)} Wh`],
    ["clocks", s.clocks || "–"],
    ["checkpoint", doc.checkpoint || "none yet", s.checkpoint || ""],
    ["started", s.started_at ? s.started_at.replace("T", " ") : "–"],
  ]);
  const lines = [live.running ? null : live.reason, s.message, s.checkpoint_error && "checkpoint: " + s.checkpoint_error];
  const moves = (s.balance_moves || []).map((m) => "balance: " + m);
  notes($("notes"), lines.concat((s.write_problems || []).map((p) => p + ": training goes on"), moves));
  drawBoardNow(doc.load);
}

// -- the game ----------------------------------------------------------------------------------

function watchFrames(url, id) {
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  const address = new URL(url, location.href);
  if (token) address.searchParams.set("token", token); // a WebSocket takes no header
  const socket = new WebSocket(address.href.replace(/^https?:/, scheme));
  socket.binaryType = "arraybuffer";
  page.socket = socket;
  const started = performance.now();
  let count = 0;
  socket.onmessage = async (event) => {
    if (typeof event.data === "string") {
      const note = JSON.parse(event.data).note;
      $("game-note").hidden = false;
      text($("game-note"), note);
      document.body.dataset.gameNote = note;
      return;
    }
    const view = new DataView(event.data);
    const length = view.getUint32(0, true);
    const meta = JSON.parse(new TextDecoder().decode(new Uint8Array(event.data, 4, length)));
    const image = await createImageBitmap(new Blob([new Uint8Array(event.data, 4 + length)], { type: "image/png" }));
    drawFrame(image, meta);
    count += 1;
    page.frames += 1;
    document.body.dataset.frames = page.frames;
    text($("game-rate"), (count / ((performance.now() - started) / 1000)).toFixed(0) + " frames/s");
    if (socket.readyState === WebSocket.OPEN) socket.send("next"); // drawn: the next one
  };
  socket.onclose = () => {
    if (page.run === id && page.socket === socket) setTimeout(() => page.run === id && watchFrames(url, id), 2000);
  };
}

function drawFrame(image, meta) {
  const canvas = $("game");
  if (canvas.width !== image.width || canvas.height !== image.height) {
    canvas.width = image.width;
    canvas.height = image.height;
  }
  canvas.getContext("2d").drawImage(image, 0, 0);
  $("game-note").hidden = true;
  figures($("game-figures"), [
    ["score", number(meta.score, 1)],
    ["episode", number(meta.episode, 0)],
    ["step", number(meta.step, 0)],
    ["action", meta.action || "–"],
    ["epsilon", number(meta.epsilon, 3)],
  ]);
  drawQ(meta);
}

function drawQ(meta) {
  const box = $("q");
  const q = meta.q || [];
  if (!q.length) return box.replaceChildren();
  const finite = q.filter((v) => v !== null);
  const lo = Math.min(...finite);
  const hi = Math.max(...finite);
  box.replaceChildren(...q.map((v, i) => {
    const row = document.createElement("div");
    row.className = "qrow" + (meta.actions[i] === meta.action ? " chosen" : "");
    const bar = document.createElement("span");
    bar.style.width = (hi > lo ? ((v - lo) / (hi - lo)) * 100 : 50).toFixed(1) + "%";
    const label = document.createElement("b");
    label.textContent = meta.actions[i] || i;
    row.append(label, bar);
    return row;
  }));
}

// -- curves ------------------------------------------------------------------------------------

function drawCurves(doc) {
  const x = (c) => (page.x === "steps" ? c.steps : c.wall_s);
  const xFormat = page.x === "steps" ? compact : clock;
  const r = doc.returns || { steps: [], wall_s: [], y: [] };
  const e = doc.evals || { steps: [], wall_s: [], y: [] };
  const series = [
    { x: x(r), y: r.y, cls: doc.per_episode ? "episodes" : "mean", label: doc.per_episode ? "episode return" : "return (last 100)" },
  ];
  if (r.smooth) series.push({ x: x(r), y: r.smooth, cls: "mean", label: "mean of 100" });
  series.push({ x: x(e), y: e.y, cls: "evals", dots: true, label: "greedy evaluation" });
  lineChart($("returns"), { series, xFormat, empty: doc.problem || "no episode finished yet" });
  const sps = doc.sps || { steps: [], wall_s: [], y: [] };
  lineChart($("sps"), { series: [{ x: x(sps), y: sps.y, cls: "sps", label: "steps/s" }], xFormat, yMin: 0 });
  notes($("curves-notes"), doc.damage || [], "damage");
}

// -- the board ---------------------------------------------------------------------------------

function drawBoardNow(load) {
  const cores = $("cores");
  if (!load) {
    cores.replaceChildren();
    figures($("board"), [["now", "no trainer runs: no load to show"]]);
    return;
  }
  cores.replaceChildren(...load.cpu.map((v, i) => {
    const core = document.createElement("div");
    core.className = "core" + (v === null ? " off" : "");
    const fill = document.createElement("span");
    fill.style.height = (v || 0) + "%";
    const label = document.createElement("b");
    label.textContent = v === null ? "off" : Math.round(v) + "%";
    core.title = `core ${i}` + (load.cpu_mhz[i] ? ` at ${load.cpu_mhz[i]} MHz` : "");
    core.append(fill, label);
    return core;
  }));
  const rows = [];
  if (load.gr3d !== null) rows.push(["GPU (GR3D)", Math.round(load.gr3d) + "%" + (load.gr3d_mhz ? ` at ${load.gr3d_mhz} MHz` : "")]);
  if (load.emc !== null) rows.push(["memory (EMC)", Math.round(load.emc) + "%" + (load.emc_mhz ? ` at ${load.emc_mhz} MHz` : "")]);
  if (load.ram_used_mb !== null) rows.push(["RAM", `${number(load.ram_used_mb, 0)} of ${number(load.ram_total_mb, 0)} MB`]);
  for (const [name, deg] of Object.entries(load.temps)) rows.push([name, deg.toFixed(1) + " °C"]);
  for (const [rail, mw] of Object.entries(load.power_mw)) rows.push([rail, (mw / 1000).toFixed(2) + " W"]);
  figures($("board"), rows);
}

function drawLoad(doc) {
  const t0 = doc.t.length ? doc.t[doc.t.length - 1] : 0;
  const x = doc.t.map((t) => t - t0);
  const series = [
    { x, y: doc.cpu_max_core, cls: "cpumax", label: "busiest core" },
    { x, y: doc.cpu_mean, cls: "cpu", label: "CPU mean" },
    { x, y: doc.gr3d, cls: "gpu", label: "GPU" },
    { x, y: doc.emc, cls: "emc", label: "EMC" },
  ].filter((s) => s.y.some((v) => v !== null));
  lineChart($("load"), {
    series, yMin: 0, yMax: 100, yFormat: (v) => v + "%", xFormat: (v) => (v ? "-" + clock(-v) : "now"),
    empty: "no load samples yet",
  });
  notes($("load-notes"), [doc.damage], "damage");
}

// -- start -------------------------------------------------------------------------------------

$("run").addEventListener("change", (event) => openRun(event.target.value));
for (const button of document.querySelectorAll(".toggle button")) {
  button.addEventListener("click", () => {
    page.x = button.dataset.x;
    document.querySelectorAll(".toggle button").forEach((b) => b.classList.toggle("on", b === button));
    if (page.docs.curves) drawCurves(page.docs.curves);
  });
}
let resizing = null;
window.addEventListener("resize", () => {
  clearTimeout(resizing);
  resizing = setTimeout(() => {
    if (page.docs.curves) drawCurves(page.docs.curves);
    if (page.docs.load) drawLoad(page.docs.load);
  }, 150);
});
refreshRuns();
setInterval(refreshRuns, POLL_MS.runs);
