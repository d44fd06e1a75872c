// The gandiva dashboard: the GPU map, the job table, utilisation over time, a sweep's
// learning curves and one job's timeline and curves, read from the REST API every
// REFRESH_MS with the user's bearer token.
// Plain DOM and SVG, no libraries: the page must work on machines without internet.
"use strict";

const REFRESH_MS = 2000;
const WINDOW_S = 600; // the utilisation chart's span, at most...
const MIN_WINDOW_S = 60; // ...and at least: a young server's few samples fill the chart
// the token lives as long as the tab: sessionStorage, not localStorage, which keeps it on
// disk for every later visitor of this browser profile
const TOKEN_KEY = "gandiva.token";
const SVG_NS = "http://www.w3.org/2000/svg";
const FINISHED = new Set(["done", "failed", "cancelled"]);

const $ = (selector) => document.querySelector(selector);

let selected = decodeURIComponent((location.hash.match(/^#job=(.+)$/) || [])[1] || "") || null;
let session = 0; // bumped on sign-in and sign-out, so a stale refresh loop stops
let jobsById = new Map();

class Unauthorised extends Error {}

// ---- the API ----------------------------------------------------------------------------

// jobs per page ("Show older jobs" adds a page); a browser may keep its own size
const JOBS_PAGE = Number(localStorage.getItem("gandiva.jobsPage")) || 100;
let jobPages = 1;

// The newest `pages` pages of jobs (newest first), following each answer's Link: rel="next".
async function fetchJobs(pages) {
  const jobs = [];
  let path = `/v1/jobs?limit=${JOBS_PAGE}`;
  let more = false;
  for (let page = 0; page < pages && path; page++) {
    const { data, next } = await apiPage(path);
    jobs.push(...data);
    path = next;
    more = Boolean(next);
  }
  return { jobs, more };
}

async function apiPage(path) {
  const response = await answer(path);
  const link = response.headers.get("Link") || "";
  const next = (link.match(/<([^>]+)>;\s*rel="next"/) || [])[1] || null;
  return { data: await response.json(), next };
}

async function api(path) {
  return (await answer(path)).json();
}

async function answer(path) {
  let response;
  try {
    response = await fetch(path, {
      headers: { Authorization: `Bearer ${sessionStorage.getItem(TOKEN_KEY)}` },
      cache: "no-store",
    });
  } catch (e) {
    throw new Error(`cannot reach the server (${e.message})`);
  }
  if (response.status === 401) throw new Unauthorised();
  if (!response.ok) {
    const body = await response.json().catch(() => ({}));
    const detail = typeof body.detail === "string" ? `: ${body.detail}` : "";
    throw new Error(`GET ${path} answered ${response.status} ${response.statusText}${detail}`);
  }
  return response;
}

// ---- signing in -------------------------------------------------------------------------

function askToken(message) {
  session += 1;
  sessionStorage.removeItem(TOKEN_KEY);
  $("#dashboard").hidden = true;
  $("#sign-out").hidden = true;
  $("#whoami").textContent = "";
  $("#updated").textContent = "";
  showProblems([]);
  $("#token-form").hidden = false;
  $("#token-error").textContent = message;
  $("#token-input").value = "";
  $("#token-input").focus();
}

async function signIn(token) {
  sessionStorage.setItem(TOKEN_KEY, token);
  const mine = ++session;
  try {
    const me = await api("/v1/whoami");
    $("#whoami").textContent = me.admin ? `${me.name} (admin)` : me.name;
  } catch (e) {
    if (e instanceof Unauthorised) {
      askToken("The server refused this token (401). Check it and try again.");
      return;
    }
    showProblems([e.message]);
  }
  $("#token-form").hidden = true;
  $("#dashboard").hidden = false;
  $("#sign-out").hidden = false;
  tick(mine);
}

async function tick(mine) {
  if (mine !== session) return;
  const problems = [];
  const guard = (promise) => promise.catch((e) => {
    if (e instanceof Unauthorised) throw e;
    problems.push(e.message);
  });
  try {
    await Promise.all([guard(refreshOverview()), guard(refreshDetail()),
      guard(refreshSweeps()), guard(refreshShares())]);
  } catch (e) {
    if (mine === session) askToken("The server no longer accepts this token (401). Sign in again.");
    return;
  }
  if (mine !== session) return;
  showProblems(problems);
  $("#updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
  setTimeout(() => tick(mine), REFRESH_MS);
}

function showProblems(problems) {
  $("#error").hidden = problems.length === 0;
  $("#error").textContent = problems.join("\n");
}

// ---- refreshing -------------------------------------------------------------------------

async function refreshOverview() {
  const since = Math.floor(Date.now() / 1000 - WINDOW_S);
  const [jobs, cluster, utilisation] = await Promise.allSettled([
    fetchJobs(jobPages), api("/v1/cluster"), api(`/v1/utilisation?since=${since}`),
  ]);
  const failures = [jobs, cluster, utilisation].filter((r) => r.status === "rejected");
  if (jobs.status === "fulfilled") {
    renderJobs(jobs.value.jobs);
    $("#older-jobs").hidden = !jobs.value.more;
  }
  if (cluster.status === "fulfilled") renderCluster(cluster.value);
  if (utilisation.status === "fulfilled") renderUtilisation(utilisation.value);
  if (failures.length) {
    const unauthorised = failures.find((r) => r.reason instanceof Unauthorised);
    throw unauthorised ? unauthorised.reason : new Error(failures.map((r) => r.reason.message)
      .join("\n"));
  }
}

async function refreshDetail() {
  const job = selected;
  $("#job-detail").hidden = !job;
  if (!job) return;
  const path = `/v1/jobs/${encodeURIComponent(job)}`;
  const [events, explain, series] = await Promise.all([api(`${path}/events`),
    api(`${path}/explain`), curves.of(job)]);
  if (job === selected) {
    renderDetail(job, events, explain);
    renderJobCurves(series);
  }
}

function select(job) {
  selected = job;
  history.replaceState(null, "", job ? `#job=${encodeURIComponent(job)}` : "#");
  for (const row of document.querySelectorAll("#jobs tr[data-job]")) {
    row.classList.toggle("selected", row.dataset.job === job);
  }
  refreshDetail().catch((e) => {
    if (e instanceof Unauthorised) askToken("The server no longer accepts this token (401).");
    else showProblems([e.message]);
  });
}

// ---- drawing helpers --------------------------------------------------------------------

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  setAttrs(node, attrs);
  node.append(...children);
  return node;
}

function svg(tag, attrs = {}, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  setAttrs(node, attrs);
  node.append(...children);
  return node;
}

function setAttrs(node, attrs) {
  for (const [key, value] of Object.entries(attrs)) {
    if (value === null || value === undefined) continue;
    // a style through the CSSOM: the page's Content-Security-Policy refuses style attributes
    if (key === "style") node.style.cssText = value;
    else node.setAttribute(key, value);
  }
}

function tooltip(text) {
  return svg("title", {}, text);
}

// A job's colour, the same in the map, the table and its timeline.
function jobColour(id) {
  let hash = 2166136261; // FNV-1a: ids that differ in one character get far-apart hues
  for (const c of id) hash = Math.imul(hash ^ c.charCodeAt(0), 16777619) >>> 0;
  return `hsl(${hash % 360}, 55%, 42%)`;
}

function duration(seconds) {
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s} s`;
  const [big, small] = s < 3600 ? [`${Math.floor(s / 60)} min`, s % 60 ? ` ${s % 60} s` : ""]
    : [`${Math.floor(s / 3600)} h`, s % 3600 >= 60 ? ` ${Math.floor((s % 3600) / 60)} min` : ""];
  return big + small;
}

const ago = (at) => `${duration(Date.now() / 1000 - at)} ago`;

// ---- the GPU map ------------------------------------------------------------------------

function renderCluster(cluster) {
  $("#cluster-summary").textContent =
    `policy ${cluster.policy} · ${cluster.total} devices, ${cluster.free} free`;
  $("#gpu-map").replaceChildren(...cluster.nodes.map(renderNode));
  const queue = cluster.queue.map((id) => id ?? "(another user)");
  const more = (cluster.queue_length ?? queue.length) - queue.length;
  $("#queue").textContent = queue.length
    ? `In line (${queue.length + more}): ${queue.join(", ")}${more > 0 ? `, and ${more} more` : ""}`
    : "Nobody in line.";
}

function renderNode(node) {
  const devices = node.devices.map((d) => el("div",
    { class: `device ${d.mode}`, "data-device": d.id, "data-mode": d.mode },
    el("div", { class: "device-name" }, d.name, el("span", { class: "muted small" }, ` ${d.kind}`)),
    el("div", { class: "mode small" }, d.mode),
    el("div", { class: "chips" }, ...d.jobs.map(chip))));
  const sliced = el("div", { class: "time-sliced", "data-node": node.id },
    el("span", { class: "small muted" }, node.time_sliced.length
      ? "time-sliced, waiting for their turn:" : "no job waiting for its turn"),
    ...node.time_sliced.map(chip));
  return el("div", { class: "node", "data-node": node.id },
    el("h3", {}, node.name), el("div", { class: "devices" }, ...devices), sliced);
}

function chip(job) {
  const mine = job.mine && job.id;
  const node = el("span", {
    class: mine ? "chip mine" : "chip other", "data-job": job.id, title: job.id ?? job.name,
  }, job.name);
  if (mine) {
    node.style.background = jobColour(job.id);
    node.addEventListener("click", () => select(job.id));
  }
  return node;
}

// ---- the job table ----------------------------------------------------------------------

function renderJobs(jobs) {
  jobsById = new Map(jobs.map((j) => [j.id, j]));
  const body = $("#jobs tbody");
  const rows = new Map([...body.children].map((tr) => [tr.dataset.job, tr]));
  const ordered = [...jobs].sort((a, b) => b.submitted_at - a.submitted_at);
  ordered.forEach((job, i) => {
    const row = rows.get(job.id) ?? el("tr", { "data-job": job.id });
    rows.delete(job.id);
    fillRow(row, job);
    if (body.children[i] !== row) body.insertBefore(row, body.children[i] ?? null);
  });
  for (const stale of rows.values()) stale.remove();
  $("#no-jobs").hidden = jobs.length > 0;
}

function fillRow(row, job) {
  const end = job.finished_at ?? Date.now() / 1000;
  const cells = [
    el("td", {}, el("span", { class: "swatch", style: `background:${jobColour(job.id)}` }),
      el("code", {}, job.id)),
    el("td", {}, job.name),
    el("td", {}, el("span", { class: `state ${job.state}` }, job.state)),
    el("td", { class: "num" }, String(job.gpus)),
    el("td", { class: "num" }, String(job.priority)),
    el("td", { title: new Date(job.submitted_at * 1000).toLocaleString() }, ago(job.submitted_at)),
    el("td", {}, job.started_at ? duration(end - job.started_at) : "–"),
    el("td", { class: "why" }, job.why || job.reason || ""),
  ];
  row.dataset.state = job.state;
  row.classList.toggle("selected", job.id === selected);
  row.replaceChildren(...cells);
}

// ---- utilisation over time --------------------------------------------------------------

const CHART = { height: 170, left: 40, right: 10, top: 10, bottom: 24 };

// SVGs are drawn at their container's width, so that their text keeps the page's size.
const widthOf = (container) => Math.max(container.clientWidth, 320);

function renderUtilisation(data) {
  const samples = data.samples;
  const now = Date.now() / 1000;
  const span = Math.min(WINDOW_S, Math.max(MIN_WINDOW_S, now - (samples[0]?.at ?? now)));
  const { height, left, right, top, bottom } = CHART;
  const width = widthOf($("#utilisation"));
  const x = (t) => left + ((t - now + span) / span) * (width - left - right);
  const y = (f) => top + (1 - f) * (height - top - bottom);
  const grid = [0, 0.5, 1].flatMap((f) => [
    svg("line", { class: "grid", x1: left, x2: width - right, y1: y(f), y2: y(f) }),
    svg("text", { class: "axis", x: left - 4, y: y(f) + 4, "text-anchor": "end" },
      `${f * 100}%`),
  ]);
  const ticks = niceTicks(span).map((s) => svg("text", {
    class: "axis", x: x(now - s), y: height - 6, "text-anchor": s === 0 ? "end" : "middle",
  }, s === 0 ? "now" : `−${duration(s)}`));
  const allocated = samples.map((s) => [s.at, data.total ? s.allocated / data.total : 0]);
  const busy = samples.map((s) => [s.at, s.busy]);
  const chart = svg("svg", {
    width, height, viewBox: `0 0 ${width} ${height}`, "data-samples": samples.length, role: "img",
    "aria-label": `devices allocated and how busy their jobs are, over the last ${duration(span)}`,
  }, ...grid, ...ticks,
  svg("path", { class: "allocated", "data-series": "allocated", d: area(allocated, x, y) }),
  svg("path", { class: "busy", "data-series": "busy", d: line(busy, x, y) }));
  const last = samples[samples.length - 1];
  const legend = el("p", { class: "legend small" },
    el("span", { class: "key allocated" }), "devices holding a job ",
    el("span", { class: "key busy" }), "how busy the jobs report they are",
    el("span", { class: "muted" }, last
      ? ` — now ${last.allocated} of ${data.total} allocated, ${Math.round(last.busy * 100)}% busy`
      : " — no samples yet"));
  $("#utilisation-span").textContent = `last ${duration(span)}`;
  $("#utilisation").replaceChildren(chart, legend);
}

// ---- shares over time -------------------------------------------------------------------

const SHARES_EVERY_MS = 30_000; // usage is counted from every job's events: not at each tick
let sharesAt = -Infinity;

async function refreshShares() {
  if (Date.now() - sharesAt < SHARES_EVERY_MS) return;
  sharesAt = Date.now();
  renderShares(await api("/v1/usage?since=6h&by=team&window=10m"));
}

// Each team's GPUs received and its fair share, per window, as steps (an admin sees every
// team; a member their own team, or themselves under "-" when in none).
function renderShares(usage) {
  const teams = [...new Set(usage.series.flatMap((p) => Object.keys(p.teams)))].sort();
  $("#shares-panel").hidden = teams.length === 0;
  if (!teams.length) return;
  const { height, left, right, top, bottom } = CHART;
  const width = widthOf($("#shares"));
  const w = usage.window_s;
  const first = usage.series[0].start;
  const end = usage.until;
  const gpus = usage.series.flatMap((p) => Object.values(p.teams).flat().map((v) => v / w));
  const most = Math.max(1, ...gpus);
  const x = (t) => left + ((t - first) / (end - first)) * (width - left - right);
  const y = (g) => top + (1 - g / most) * (height - top - bottom);
  const steps = (team, i) => usage.series.map((p) => {
    const [a, b] = [x(p.start), x(Math.min(p.start + w, end))];
    const g = y((p.teams[team]?.[i] ?? 0) / w);
    return `M${a.toFixed(1)},${g.toFixed(1)}L${b.toFixed(1)},${g.toFixed(1)}`;
  }).join("");
  const paths = teams.flatMap((team) => ["fair", "received"].map((kind, i) => svg("path", {
    class: `share ${kind}`, "data-team": team, "data-kind": kind, d: steps(team, i),
    style: `stroke: ${jobColour(team)}`,
  }, tooltip(`${team}: ${kind}`))));
  const grid = [0, most].flatMap((g) => [
    svg("line", { class: "grid", x1: left, x2: width - right, y1: y(g), y2: y(g) }),
    svg("text", { class: "axis", x: left - 4, y: y(g) + 4, "text-anchor": "end" },
      `${+g.toFixed(1)}`),
  ]);
  const chart = svg("svg", { width, height, viewBox: `0 0 ${width} ${height}`, role: "img",
    "data-teams": teams.length, "aria-label": "GPUs each team received against its fair share",
  }, ...grid, svg("text", { class: "axis", x: width - right, y: height - 6,
    "text-anchor": "end" }, "now"), ...paths);
  const total = (team, i) => usage.series.reduce((s, p) => s + (p.teams[team]?.[i] ?? 0), 0);
  const legend = el("p", { class: "legend small" }, ...teams.map((team) => el("span", {},
    el("span", { class: "key", style: `background: ${jobColour(team)}` }),
    `${team}: ${(total(team, 1) / 3600).toFixed(2)} of ${(total(team, 0) / 3600).toFixed(2)}`
    + " GPU-h fair  ")));
  $("#shares").replaceChildren(chart, legend);
}

// Runs of samples with no gap much longer than the usual interval (a stopped server
// leaves a gap; the chart should not draw a line across it).
function runs(points) {
  const gaps = points.slice(1).map((p, i) => p[0] - points[i][0]).sort((a, b) => a - b);
  const limit = 5 * (gaps[Math.floor(gaps.length / 2)] || Infinity);
  const out = [];
  points.forEach((p, i) => {
    if (i === 0 || p[0] - points[i - 1][0] > limit) out.push([]);
    out[out.length - 1].push(p);
  });
  return out;
}

function line(points, x, y) {
  return runs(points).map((run) => run.map(([t, f], i) =>
    `${i ? "L" : "M"}${x(t).toFixed(1)},${y(f).toFixed(1)}`).join("")).join("");
}

// A step area: the number of allocated devices holds until the next sample.
function area(points, x, y) {
  return runs(points).map((run) => {
    const steps = run.flatMap(([t, f], i) => (i ? [[t, run[i - 1][1]], [t, f]] : [[t, f]]));
    const first = x(run[0][0]).toFixed(1);
    const last = x(run[run.length - 1][0]).toFixed(1);
    return `M${first},${y(0)}` + steps.map(([t, f]) => `L${x(t).toFixed(1)},${y(f).toFixed(1)}`)
      .join("") + `L${last},${y(0)}Z`;
  }).join("");
}

// ---- one job: its explanation and timeline ----------------------------------------------

const STATE_AFTER = { submitted: "queued", requeued: "queued", running: "running",
  suspended: "suspended", held: "held" };
const MOVES = new Set(["migrated", "resized"]); // still running, on other devices
const MARKS = new Set(["migrated", "resized", "restarted", "priority", "cancel-requested"]);

// The job's states as segments [{state, from, to, devices}], from its events.
function segments(events, now) {
  const out = [];
  let current = null;
  const open = (state, at, devices) => {
    if (current) current.to = at;
    current = { state, from: at, to: now, devices };
    out.push(current);
  };
  for (const e of events) {
    const devices = e.data && e.data.devices;
    if (e.kind in STATE_AFTER) open(STATE_AFTER[e.kind], e.at, devices);
    else if (e.kind === "resumed" && current && current.state === "held") open("queued", e.at);
    else if (MOVES.has(e.kind)) open("running", e.at, devices);
    else if (FINISHED.has(e.kind)) {
      if (current) current.to = e.at;
      current = null;
    }
  }
  return out;
}

function renderDetail(id, events, explain) {
  const job = jobsById.get(id);
  $("#detail-title").textContent = job ? `${id} · ${job.name} (${job.state})` : id;
  const where = explain.queue_position ? ` (number ${explain.queue_position} in line)` : "";
  $("#explain").replaceChildren(el("span", { class: `state ${explain.state}` }, explain.state),
    ` ${explain.reason}${where}`, ...(explain.share ? [el("br"), explain.share] : []));
  const finished = events.find((e) => FINISHED.has(e.kind));
  const end = finished ? finished.at : Math.max(Date.now() / 1000,
    ...events.map((e) => e.at));
  const legend = el("p", { class: "legend small" }, ...["running", "suspended", "queued", "held"]
    .flatMap((state) => [el("span", { class: `key ${state}` }), `${state} `]));
  $("#timeline").replaceChildren(timeline(events, end), legend);
  renderEvents(events);
}

const TL = { height: 74, left: 10, right: 10, bar: 22, top: 18 };

function timeline(events, end) {
  const start = events.length ? events[0].at : end;
  const span = Math.max(end - start, 1);
  const { height, left, right, bar, top } = TL;
  const width = widthOf($("#timeline"));
  const x = (t) => left + ((t - start) / span) * (width - left - right);
  const parts = segments(events, end).map((s) => {
    const w = Math.max(x(s.to) - x(s.from), 1);
    const on = s.devices ? ` on device(s) ${s.devices.join(", ")}` : "";
    const label = s.state === "running" && s.devices ? `dev ${s.devices.join(",")}` : s.state;
    return svg("g", {},
      svg("rect", { class: `segment ${s.state}`, "data-segment": s.state,
        x: x(s.from), y: top, width: w, height: bar },
      tooltip(`${s.state} for ${duration(s.to - s.from)}${on}`)),
      w > 8 * label.length ? svg("text", { class: "segment-label", x: x(s.from) + 4,
        y: top + bar / 2 + 4 }, label) : "");
  });
  const marks = events.filter((e) => MARKS.has(e.kind)).map((e) => svg("g",
    { class: "mark", "data-mark": e.kind },
    svg("line", { x1: x(e.at), x2: x(e.at), y1: top - 6, y2: top + bar + 4 }),
    svg("text", { x: x(e.at), y: top - 8, "text-anchor": "middle" }, e.kind),
    tooltip(`${e.kind} at +${duration(e.at - start)} ${describe(e.data)}`)));
  const ticks = niceTicks(span).map((s) => svg("text", {
    class: "axis", x: x(start + s), y: height - 8,
    "text-anchor": s === 0 ? "start" : "middle",
  }, `+${duration(s)}`));
  return svg("svg", { width, height, viewBox: `0 0 ${width} ${height}`, role: "img",
    "aria-label": "the job's states over time" }, ...parts, ...marks, ...ticks);
}

function niceTicks(span) {
  const steps = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400];
  const step = steps.find((s) => span / s <= 6) ?? span / 6;
  const out = [];
  for (let s = 0; s <= span * 0.92; s += step) out.push(s);
  return out;
}

function describe(data) {
  return Object.entries(data || {}).filter(([, v]) => v !== null && v !== undefined)
    .map(([k, v]) => `${k} ${Array.isArray(v) ? v.join(",") : v}`).join(", ");
}

const EVENTS_SHOWN = 40;

function renderEvents(events) {
  const start = events.length ? events[0].at : 0;
  const shown = events.slice(-EVENTS_SHOWN).map((e) => el("li", { "data-kind": e.kind },
    el("span", { class: "muted" }, `+${duration(e.at - start)} `),
    el("span", { class: `state ${e.kind}` }, e.kind), ` ${describe(e.data)}`));
  const earlier = events.length - shown.length;
  $("#events").replaceChildren(
    ...(earlier > 0 ? [el("li", { class: "muted" }, `… ${earlier} earlier events`)] : []),
    ...shown);
}

// ---- learning curves ----------------------------------------------------------------------

// Each job's points, kept between refreshes: a refresh asks only for the steps after the last
// one it has (GET /v1/jobs/{id}/metrics?after=STEP), so a long curve is fetched once.
const curves = {
  kept: new Map(), // job -> {last, series: {metric: [[step, value], ...]}}
  async of(job, names) {
    const entry = this.kept.get(job) ?? { last: -1, series: {} };
    const query = `after=${entry.last}${names ? `&names=${encodeURIComponent(names)}` : ""}`;
    const data = await api(`/v1/jobs/${encodeURIComponent(job)}/metrics?${query}`);
    for (const [name, points] of Object.entries(data.series)) {
      const mine = (entry.series[name] ??= []);
      for (const [step, value] of points) {
        if (mine.length && mine[mine.length - 1][0] === step) mine[mine.length - 1][1] = value;
        else mine.push([step, value]);
        entry.last = Math.max(entry.last, step);
      }
    }
    this.kept.set(job, entry);
    return entry.series;
  },
};

const CURVE = { height: 200, left: 52, right: 12, top: 10, bottom: 26 };
const CURVES_SHOWN = 3; // a job's metrics drawn (one chart each)

// Lines [{points, attrs, title}] on one chart of steps (x) against values (y). Each axis is
// logarithmic where its values span more than two decades: steps, so that the first rungs
// (where most trials of a sweep stop) are not squeezed into the left edge; values, for a
// loss that falls by orders of magnitude.
function curveChart(lines, name, container) {
  const all = lines.flatMap((l) => l.points);
  const { height, left, right, top, bottom } = CURVE;
  const width = widthOf(container);
  if (!all.length) return el("p", { class: "muted small" }, `no ${name} reported yet`);
  const steps = all.map((p) => p[0]);
  const values = all.map((p) => p[1]);
  const [x0, x1] = [Math.min(...steps), Math.max(...steps, Math.min(...steps) + 1)];
  let [y0, y1] = [Math.min(...values), Math.max(...values)];
  const log = y0 > 0 && y1 / y0 > 100;
  const logX = x0 > 0 && x1 / x0 > 100;
  const f = log ? Math.log10 : (v) => v;
  const g = logX ? Math.log10 : (s) => s;
  if (y0 === y1) [y0, y1] = [y0 - 1, y1 + 1];
  const x = (s) => left + ((g(s) - g(x0)) / (g(x1) - g(x0))) * (width - left - right);
  const y = (v) => top + (1 - (f(v) - f(y0)) / (f(y1) - f(y0))) * (height - top - bottom);
  const label = (v) => (Math.abs(v) < 0.01 && v !== 0 ? v.toExponential(1) : v.toPrecision(3));
  const paths = lines.map((l) => svg("path", { class: "curve", ...l.attrs,
    d: l.points.map(([s, v], i) => `${i ? "L" : "M"}${x(s).toFixed(1)},${y(v).toFixed(1)}`)
      .join("") }, tooltip(l.title)));
  const axis = [y0, y1].flatMap((v) => [
    svg("line", { class: "grid", x1: left, x2: width - right, y1: y(v), y2: y(v) }),
    svg("text", { class: "axis", x: left - 4, y: y(v) + 4, "text-anchor": "end" }, label(v)),
  ]);
  const marks = logX ? [1, 10, 100, 1000, 10000, 100000].filter((s) => s > x0 && s < x1) : [];
  const ticks = [x0, ...marks, x1].map((s, i, all) => svg("text", { class: "axis", x: x(s),
    y: height - 8, "text-anchor": i === 0 ? "start" : i === all.length - 1 ? "end" : "middle" },
  i === all.length - 1 ? `${s} mini-batches${logX ? " (log)" : ""}` : String(s)));
  return svg("svg", { width, height, viewBox: `0 0 ${width} ${height}`, role: "img",
    "data-metric": name, "data-log": log, "data-log-steps": logX,
    "aria-label": `${name} against mini-batches${log || logX ? " (log scale)" : ""}` },
  ...axis, ...ticks, ...paths);
}

function renderJobCurves(series) {
  const container = $("#curve");
  const names = Object.keys(series).sort((a, b) => (a === "loss" ? -1 : b === "loss" ? 1
    : a.localeCompare(b))).slice(0, CURVES_SHOWN);
  container.replaceChildren(...names.flatMap((name) => [
    el("h3", { class: "small" }, name),
    curveChart([{ points: series[name], attrs: { "data-metric": name,
      style: "stroke: var(--done)" }, title: name }], name, container)]));
}

let sweepShown = null; // the sweep whose curves are drawn (the newest, until one is chosen)

async function refreshSweeps() {
  const sweeps = await api("/v1/sweeps?limit=20&brief=true"); // the list: ids only
  $("#sweeps-panel").hidden = sweeps.length === 0;
  if (!sweeps.length) return;
  const select = $("#sweep-select");
  const ids = sweeps.map((s) => s.id);
  if (!ids.includes(sweepShown)) sweepShown = ids[0];
  if ([...select.options].map((o) => o.value).join() !== ids.join()) {
    select.replaceChildren(...sweeps.map((s) => el("option", { value: s.id }, s.id)));
  }
  select.value = sweepShown;
  const sweep = await api(`/v1/sweeps/${encodeURIComponent(sweepShown)}`);
  const series = await Promise.all(sweep.trials.map((t) => curves.of(t.job_id, sweep.metric)));
  if (sweep.id === sweepShown) renderSweep(sweep, series);
}

function renderSweep(sweep, series) {
  const container = $("#sweep-curves");
  const out = (t) => t.decision === "stopped" || t.decision === "paused";
  const stopped = sweep.trials.filter(out).length;
  const done = sweep.trials.filter((t) => t.state === "done").length;
  $("#sweep-summary").textContent = `${sweep.metric} (${sweep.mode}), ${sweep.rule} at rungs `
    + `${sweep.rungs.join(", ") || "none"} · ${sweep.trials.length} trials, ${stopped} paused or stopped, `
    + `${done} done${sweep.best ? ` · best: trial ${sweep.best.trial}, `
    + `${sweep.best.value.toPrecision(4)}` : ""}`;
  const lines = sweep.trials.map((t, i) => {
    const rungs = Object.keys(t.rungs).length;
    const cls = out(t) ? "stopped" : `rung${Math.min(rungs, 3)}`;
    const best = sweep.best && sweep.best.trial === t.trial;
    return {
      points: series[i][sweep.metric] ?? [],
      attrs: { class: `curve ${cls}${best ? " best" : ""}`, "data-trial": t.trial,
        "data-job": t.job_id, "data-decision": t.decision, "data-state": t.state,
        style: out(t) ? null : `stroke: var(--rung${Math.min(rungs, 3)})` },
      title: `trial ${t.trial} (${t.state}, ${t.decision}): ${JSON.stringify(t.params)}`,
    };
  }).sort((a, b) => (a.attrs.class.includes("stopped") ? -1 : 0)
    - (b.attrs.class.includes("stopped") ? -1 : 0)); // paused, stopped: drawn underneath
  const legend = el("p", { class: "legend small" },
    ...["rung0", "rung1", "rung2", "rung3"].flatMap((k, i) => [el("span", { class: `key ${k}` }),
      i === 0 ? "no rung passed " : `${i}${i === 3 ? "+" : ""} passed `]),
    el("span", { class: "key stopped" }), "paused or stopped by the sweep");
  container.replaceChildren(curveChart(lines, sweep.metric, container), legend);
}

// ---- start ------------------------------------------------------------------------------

$("#token-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const token = $("#token-input").value.trim();
  if (token) signIn(token);
});
$("#sign-out").addEventListener("click", () => askToken(""));
$("#jobs tbody").addEventListener("click", (event) => {
  const row = event.target.closest("tr[data-job]");
  if (row) select(row.dataset.job);
});
$("#detail-close").addEventListener("click", () => select(null));
$("#sweep-select").addEventListener("change", (event) => {
  sweepShown = event.target.value;
  refreshSweeps().catch(() => {}); // the refresh loop reports failures
});
$("#sweep-curves").addEventListener("click", (event) => {
  const line = event.target.closest("path[data-job]");
  if (line) select(line.dataset.job);
});
$("#older-jobs").addEventListener("click", () => {
  jobPages += 1;
  refreshOverview().catch(() => {}); // the refresh loop reports failures
});

const stored = sessionStorage.getItem(TOKEN_KEY);
if (stored) signIn(stored);
else askToken("");
