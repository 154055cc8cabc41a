// Gangway's dashboard: plain JavaScript, no framework, no build step, nothing from elsewhere.
//
// It reads GET /v1/dashboard/stream (server-sent events, read with fetch so that it can send
// the bearer token) and redraws from each `snapshot` event: the GPU grid, the queue, usage and
// queue waits. Clicking a job opens its page: facts, timeline (its events) and rank logs.
"use strict";

const TOKEN_KEY = "gangway.token";
const STATE_COLOURS = {
  free: "var(--free)", allocated: "var(--allocated)", mine: "var(--mine)",
  draining: "var(--draining)", drained: "var(--drained)", unhealthy: "var(--unhealthy)",
  lost: "var(--lost)",
};
const $ = (id) => document.getElementById(id);
let token = localStorage.getItem(TOKEN_KEY);
let latest = null;
let stream = null;

// ------------------------------------------------------------------ helpers

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "class") node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value);
  }
  for (const child of children) node.append(child instanceof Node ? child : String(child ?? ""));
  return node;
}

function svg(tag, attrs = {}, ...children) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, value);
  for (const child of children) node.append(child instanceof Node ? child : String(child));
  return node;
}

function duration(seconds) {
  if (seconds == null) return "-";
  const d = Math.floor(seconds / 86400), h = Math.floor((seconds % 86400) / 3600);
  const m = Math.floor((seconds % 3600) / 60), s = Math.floor(seconds % 60);
  if (d) return `${d}d${h}h`;
  if (h) return `${h}h${String(m).padStart(2, "0")}m`;
  return `${m}m${String(s).padStart(2, "0")}s`;
}

function when(iso) {
  return iso ? new Date(iso).toLocaleString() : "-";
}

async function api(path) {
  const response = await fetch(path, { headers: { Authorization: `Bearer ${token}` } });
  if (!response.ok) {
    let detail = response.statusText;
    try { detail = (await response.json()).detail || detail; } catch (_) { /* not JSON */ }
    const error = new Error(detail);
    error.status = response.status;
    throw error;
  }
  return response;
}

// ------------------------------------------------------------------ login

function showLogin(message = "") {
  $("login").hidden = false;
  $("app").hidden = true;
  $("logout").hidden = true;
  $("login-error").textContent = message;
}

$("login").addEventListener("submit", (event) => {
  event.preventDefault();
  token = $("token").value.trim();
  localStorage.setItem(TOKEN_KEY, token);
  start();
});

$("logout").addEventListener("click", () => {
  localStorage.removeItem(TOKEN_KEY);
  token = null;
  if (stream) stream.abort();
  showLogin();
});

// ------------------------------------------------------------------ the live stream

async function start() {
  if (!token) return showLogin();
  if (stream) stream.abort();
  stream = new AbortController();
  try {
    const response = await fetch("/v1/dashboard/stream", {
      headers: { Authorization: `Bearer ${token}`, Accept: "text/event-stream" },
      signal: stream.signal,
    });
    if (response.status === 401) return showLogin("That token was not accepted.");
    if (!response.ok) throw new Error(response.statusText);
    $("login").hidden = true;
    $("app").hidden = false;
    $("logout").hidden = false;
    setLive(true);
    await readEvents(response.body.getReader(), (name, data) => {
      if (name === "snapshot") render(JSON.parse(data));
    });
  } catch (error) {
    if (error.name === "AbortError") return;
  }
  setLive(false);
  setTimeout(start, 2000); // the API restarted or the network blinked: reconnect
}

async function readEvents(reader, onEvent) {
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      let name = "message";
      const data = [];
      for (const line of block.split("\n")) {
        if (line.startsWith("event:")) name = line.slice(6).trim();
        else if (line.startsWith("data:")) data.push(line.slice(5).trimStart());
      }
      if (data.length) onEvent(name, data.join("\n"));
    }
  }
}

function setLive(on) {
  $("live").textContent = on ? "live" : "offline";
  $("live").className = `live ${on ? "on" : "off"}`;
}

// ------------------------------------------------------------------ rendering

function render(snapshot) {
  latest = snapshot;
  const c = snapshot.cluster;
  $("viewer").textContent = snapshot.viewer === "admin" ? "admin" : `team ${snapshot.viewer}`;
  $("totals").textContent =
    `${c.allocated_gpus}/${c.healthy_gpus} GPUs allocated · ${c.free_gpus} free · ` +
    `fragmentation ${(100 * c.fragmentation).toFixed(0)}% · ` +
    `${c.running_jobs} running · ${c.pending_jobs} pending`;
  renderLegend();
  renderGrid(c.blocks, snapshot.viewer);
  renderQueue(snapshot.queue);
  renderUsage(snapshot.usage);
  renderWaits(snapshot.waits);
}

function renderLegend() {
  const legend = $("legend");
  legend.replaceChildren(
    ...Object.entries(STATE_COLOURS).map(([state, colour]) =>
      el("span", { style: `--c: ${colour}` }, state === "mine" ? "allocated (yours)" : state)),
    el("span", { style: "--c: var(--allocated); opacity: .35" }, "allocated, idle (telemetry)"),
  );
}

function renderGrid(blocks, viewer) {
  const tip = $("tip");
  const grid = blocks.map((block) =>
    el("div", { class: "block", "data-block": block.id },
      el("div", { class: "label" }, `block ${block.id}`),
      el("div", { class: "racks" }, ...block.racks.map((rack) =>
        el("div", { class: "rack", "data-rack": rack.id },
          el("div", { class: "label" }, `rack ${rack.id}`),
          ...rack.nodes.map((node) =>
            el("div", { class: "node", "data-node": node.id },
              el("span", { class: "label", title: node.id }, node.id),
              ...node.gpus.map((gpu) => {
                const visible = gpu.job && (viewer === "admin" || gpu.team === viewer);
                const state = gpu.state === "allocated" && visible && viewer !== "admin" ? "mine" : gpu.state;
                const text = `${node.id} GPU ${gpu.index} (${node.gpu_type}): ${gpu.state}` +
                  (gpu.job ? ` · job ${gpu.job} · team ${gpu.team}` : "") +
                  (node.state !== "ready" ? ` · node ${node.state}` : "") +
                  (node.reason ? ` · ${node.reason}` : "") +
                  (node.degraded.length ? ` · degraded: ${node.degraded.join(", ")}` : "") +
                  (gpu.utilization != null ? ` · busy ${Math.round(100 * gpu.utilization)}%` : "");
                // Real activity from telemetry: an allocated GPU that idles is drawn faint.
                const faint = gpu.state === "allocated" && gpu.utilization != null;
                return el("div", {
                  class: `gpu ${state}`,
                  "data-state": gpu.state,
                  "data-job": gpu.job || "",
                  style: faint ? `opacity: ${(0.3 + 0.7 * gpu.utilization).toFixed(2)}` : "",
                  onmouseenter: (e) => { tip.textContent = text; tip.hidden = false; moveTip(e); },
                  onmousemove: moveTip,
                  onmouseleave: () => { tip.hidden = true; },
                  onclick: () => gpu.job && openJob(gpu.job),
                });
              }))))))));
  $("grid").replaceChildren(...grid);
}

function moveTip(event) {
  const tip = $("tip");
  tip.style.left = `${event.clientX + 12}px`;
  tip.style.top = `${event.clientY + 12}px`;
}

function jobLink(id) {
  return el("a", { onclick: () => openJob(id), "data-job-link": id }, id);
}

function renderQueue(queue) {
  const waitingHead = ["job", "name", "team", "class", "state", "GPUs", "waited", "reason", "estimated start"];
  $("waiting").replaceChildren(
    el("tr", {}, ...waitingHead.map((h) => el("th", {}, h))),
    ...queue.waiting.map((job) => el("tr", { "data-job-row": job.id, "data-state": job.state },
      el("td", {}, jobLink(job.id)), el("td", {}, job.name), el("td", {}, job.team),
      el("td", {}, job.priority), el("td", {}, job.state), el("td", {}, job.gpus),
      el("td", {}, duration(job.waited_s)), el("td", {}, job.reason || ""),
      el("td", {}, when(job.estimated_start)))),
  );
  const runningHead = ["job", "name", "team", "class", "state", "GPUs", "elapsed", "nodes"];
  $("running").replaceChildren(
    el("tr", {}, ...runningHead.map((h) => el("th", {}, h))),
    ...queue.running.map((job) => el("tr", { "data-job-row": job.id, "data-state": job.state },
      el("td", {}, jobLink(job.id)), el("td", {}, job.name), el("td", {}, job.team),
      el("td", {}, job.priority), el("td", {}, job.state), el("td", {}, job.gpus),
      el("td", {}, duration(job.elapsed_s)),
      el("td", {}, Object.keys(job.placement || {}).join(" ")))),
  );
}

// Grouped bars per day: allocated (solid) and used (light) GPU-hours, one row per team, with
// the guarantee (guaranteed GPUs × 24 h) as a line.
function renderUsage(teams) {
  const width = 520, rowHeight = 90, left = 60;
  const chart = svg("svg", { width, height: Math.max(rowHeight, teams.length * rowHeight) });
  teams.forEach((team, row) => {
    const top = row * rowHeight + 10, height = rowHeight - 30;
    const guarantee = team.guaranteed_gpus * 24;
    const max = Math.max(1, guarantee, ...team.allocated_gpu_hours);
    const step = (width - left - 10) / team.days.length;
    chart.append(svg("text", { x: 0, y: top + 10 }, team.team));
    chart.append(svg("text", { x: 0, y: top + 24 }, `${team.allocated_gpus} GPUs now`));
    team.days.forEach((day, i) => {
      const x = left + i * step;
      const a = (team.allocated_gpu_hours[i] / max) * height;
      const u = (team.used_gpu_hours[i] / max) * height;
      chart.append(svg("rect", { x, y: top + height - a, width: step * 0.45, height: a, fill: "#3b7dd8" },
        svg("title", {}, `${day}: ${team.allocated_gpu_hours[i]} GPU-h allocated`)));
      chart.append(svg("rect", { x: x + step * 0.45, y: top + height - u, width: step * 0.45, height: u, fill: "#9fc5f8" },
        svg("title", {}, `${day}: ${team.used_gpu_hours[i]} GPU-h used`)));
      if (i % 3 === 0) chart.append(svg("text", { x, y: top + height + 12 }, day.slice(5)));
    });
    if (guarantee) {
      const y = top + height - (guarantee / max) * height;
      chart.append(svg("line", { x1: left, x2: width - 10, y1: y, y2: y, stroke: "#1f9d55", "stroke-dasharray": "4 3" },
        svg("title", {}, `guarantee: ${guarantee} GPU-h a day`)));
    }
  });
  $("usage").replaceChildren(chart,
    el("div", { class: "legend" },
      el("span", { style: "--c: #3b7dd8" }, "allocated"), el("span", { style: "--c: #9fc5f8" }, "used"),
      el("span", { style: "--c: #1f9d55" }, "guarantee")));
}

// One histogram per priority class: reservations by how long they waited.
function renderWaits(waits) {
  const labels = [...waits.bounds_s.map((b) => `≤${duration(b)}`), "more"];
  const classes = Object.entries(waits.by_class);
  const width = 520, rowHeight = 80, left = 90;
  const chart = svg("svg", { width, height: Math.max(rowHeight, classes.length * rowHeight + 20) });
  if (!classes.length) chart.append(svg("text", { x: 0, y: 20 }, "no job has been placed yet"));
  classes.forEach(([name, counts], row) => {
    const top = row * rowHeight + 5, height = rowHeight - 25;
    const max = Math.max(1, ...counts), step = (width - left) / counts.length;
    chart.append(svg("text", { x: 0, y: top + height / 2 }, name));
    counts.forEach((count, i) => {
      const h = (count / max) * height;
      chart.append(svg("rect", { x: left + i * step, y: top + height - h, width: step * 0.8, height: h, fill: "#f0b429" },
        svg("title", {}, `${labels[i]}: ${count}`)));
      if (row === classes.length - 1 && i % 2 === 0) {
        chart.append(svg("text", { x: left + i * step, y: top + height + 12 }, labels[i]));
      }
    });
  });
  $("waits").replaceChildren(chart);
}

// ------------------------------------------------------------------ the job page

async function openJob(id) {
  const dialog = $("job");
  $("job-title").textContent = `job ${id}`;
  $("job-facts").replaceChildren();
  $("job-timeline").replaceChildren();
  $("job-logs").textContent = "";
  if (!dialog.open) dialog.showModal();
  try {
    const job = await (await api(`/v1/jobs/${encodeURIComponent(id)}`)).json();
    const facts = {
      name: job.name, team: job.team, class: job.priority, state: job.state,
      reason: job.reason || "-", "estimated start": when(job.estimated_start),
      GPUs: `${job.tasks} × ${job.gpus_per_task}`, attempts: job.attempts,
      preemptions: job.preemptions, submitted: when(job.submitted_at),
      finished: when(job.finished_at), command: (job.spec.command || []).join(" ") || "-",
      placement: Object.entries(job.placement).map(([n, g]) => `${n}:${g.join(",")}`).join(" ") || "-",
    };
    $("job-facts").replaceChildren(...Object.entries(facts).flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
    const events = await (await api(`/v1/jobs/${encodeURIComponent(id)}/events`)).json();
    $("job-timeline").replaceChildren(...events.items.map((event) => {
      const p = event.payload;
      const detail = [p.attempt && `attempt ${p.attempt}`, p.rank != null && `rank ${p.rank}`,
        p.code, p.reason, p.node_id].filter(Boolean).join(" · ");
      return el("li", { "data-type": event.type }, `${when(event.recorded_at)} ${event.type} ${detail}`);
    }));
    const ranks = Array.from({ length: job.tasks }, (_, r) => el("option", { value: r }, `rank ${r}`));
    $("job-rank").replaceChildren(...ranks);
    $("job-rank").onchange = () => loadLogs(id);
    await loadLogs(id);
  } catch (error) {
    $("job-facts").replaceChildren(el("dd", { class: "error" }, error.message));
  }
}

async function loadLogs(id) {
  const rank = $("job-rank").value || 0;
  try {
    const response = await api(`/v1/jobs/${encodeURIComponent(id)}/logs?rank=${rank}&tail=200`);
    $("job-logs").textContent = await response.text() || "(no output yet)";
  } catch (error) {
    $("job-logs").textContent = error.status === 404 ? "(no output yet)" : error.message;
  }
}

$("job-close").addEventListener("click", () => $("job").close());

start();
