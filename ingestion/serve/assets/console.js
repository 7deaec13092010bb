// The console's live updates and actions (ingestion/serve/console.py).
//
// The `state` server-sent events redraw the jobs and nodes tables in place, with text only
// (textContent, setAttribute): nothing a source or Redis holds can become markup here. On a job's
// page, the `job` events carry the sections below the job's row as the server rendered them
// (every value escaped there, as on a page load) and replace them whole.
//
// Actions (a job's page, when the node has a console token): a JSON POST with the token as a
// bearer token, typed by the operator and kept for this tab only (sessionStorage).
"use strict";

const JOB_COLUMNS = ["job", "kind", "leader", "token", "since", "lease", "cursor", "rate", "lag", "why"];
const NODE_COLUMNS = ["live", "heartbeat", "leads", "share", "health", "held", "version"];

function cell(row, col, text) {
  const td = row.querySelector(`td[data-col="${col}"]`);
  if (td && td.textContent !== text) td.textContent = text;
}

function when(ms) {
  return ms == null ? "" : new Date(ms).toISOString().replace("T", " ");
}

function unit(value, suffix) {
  return value == null || value === "" ? "" : `${value}${suffix}`;
}

function rowOf(body, key, value) {
  for (const r of body.rows) if (r.dataset[key] === value) return r;
  return null;
}

function newRow(body, key, value, columns) {
  const row = document.createElement("tr");
  row.dataset[key] = value;
  for (const col of columns) {
    const td = document.createElement("td");
    td.dataset.col = col;
    row.appendChild(td);
  }
  body.appendChild(row);
  return row;
}

function jobRow(body, job) {
  let row = rowOf(body, "job", job.job);
  if (row === null) {
    row = newRow(body, "job", job.job, JOB_COLUMNS);
    const link = document.createElement("a");
    link.href = "/console/job/" + encodeURIComponent(job.job);
    link.textContent = job.job;
    row.querySelector('td[data-col="job"]').appendChild(link);
  }
  row.setAttribute("data-leader", job.leader);
  row.classList.toggle("leaderless", !job.leader);
  cell(row, "kind", job.kind);
  cell(row, "leader", job.leader || "(none)");
  cell(row, "token", job.token == null ? "" : String(job.token));
  cell(row, "since", when(job.leader_since_ms));
  cell(row, "lease", unit(job.lease_ttl_ms_left, " ms"));
  cell(row, "cursor", job.cursor);
  cell(row, "rate", unit(job.rate, "/s"));
  cell(row, "lag", unit(job.lag_seconds, " s"));
  cell(row, "why", job.why || "");
}

function nodeRow(body, node) {
  let row = rowOf(body, "node", node.node);
  if (row === null) {
    row = newRow(body, "node", node.node, ["name", ...NODE_COLUMNS]);
    row.querySelector('td[data-col="name"]').textContent = node.node;
  }
  row.setAttribute("data-live", node.live ? "yes" : "no");
  cell(row, "live", node.live ? "live" : "down");
  cell(row, "heartbeat", `${node.heartbeat_ms_ago} ms ago`);
  cell(row, "leads", node.leads.join(", "));
  cell(row, "share", node.share);
  cell(row, "health", Object.entries(node.health).map(([j, h]) => `${j}: ${h}`).join(", "));
  cell(row, "held", Object.entries(node.held_off).map(([j, r]) => `${j}: ${r}`).join(", "));
  cell(row, "version", node.version);
}

function apply(state) {
  const error = document.getElementById("error");
  if (error) {
    error.hidden = !state.error;
    error.textContent = state.error || "";
  }
  const jobs = document.querySelector("#jobs tbody");
  const only = document.body.dataset.pageJob || null;
  if (jobs) {
    for (const job of state.jobs) if (only === null || job.job === only) jobRow(jobs, job);
  }
  const nodes = document.querySelector("#nodes tbody");
  if (nodes) {
    const present = new Set(state.nodes.map((n) => n.node));
    for (const node of state.nodes) nodeRow(nodes, node);
    for (const r of Array.from(nodes.rows)) if (!present.has(r.dataset.node)) r.remove();
  }
  const api = document.getElementById("api-section");
  // Rendered (and escaped) by the server from the same code as the page itself.
  if (api && state.api_html !== undefined && api.innerHTML !== state.api_html) api.innerHTML = state.api_html;
  document.body.dataset.updated = String(Date.now());
}

function applyJob(doc) {
  const detail = document.getElementById("detail");
  // Rendered (and escaped) by the server from the same code as the page itself.
  if (detail && detail.innerHTML !== doc.html) detail.innerHTML = doc.html;
  const jobs = document.querySelector("#jobs tbody");
  if (jobs && doc.job && !doc.job.leader) {
    const row = rowOf(jobs, "job", doc.job.job);
    if (row) cell(row, "why", doc.job.why || "");
  }
}

async function act(action) {
  const result = document.getElementById("result");
  const tokenInput = document.getElementById("token");
  const token = tokenInput ? tokenInput.value || sessionStorage.getItem("console-token") || "" : "";
  if (tokenInput && tokenInput.value) sessionStorage.setItem("console-token", tokenInput.value);
  const operator = document.getElementById("operator");
  result.textContent = `${action}: asking...`;
  try {
    const answer = await fetch("/console/action", {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${token}` },
      body: JSON.stringify({
        action, job: document.body.dataset.pageJob, operator: operator ? operator.value : "",
      }),
    });
    const doc = await answer.json();
    result.textContent = `${action}: ${answer.status} ${doc.message}`;
    result.dataset.status = String(answer.status);
  } catch (err) {
    result.textContent = `${action}: failed: ${err}`;
    result.dataset.status = "error";
  }
}

for (const button of document.querySelectorAll("button[data-action]")) {
  button.addEventListener("click", () => act(button.dataset.action));
}

const pageJob = document.body.dataset.pageJob;
const source = new EventSource("/console/events" + (pageJob ? "?job=" + encodeURIComponent(pageJob) : ""));
source.addEventListener("state", (e) => {
  apply(JSON.parse(e.data));
  document.getElementById("live").textContent = " live";
});
source.addEventListener("job", (e) => applyJob(JSON.parse(e.data)));
source.onerror = () => {
  document.getElementById("live").textContent = " reconnecting";
};
