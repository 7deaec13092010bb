// The console's live updates (ingestion/serve/console.py): the `state` server-sent events redraw
// the jobs and nodes tables in place. Text only (textContent, setAttribute): nothing a source or
// Redis holds can become markup here.
"use strict";

function cell(row, col, text) {
  let td = row.querySelector(`td[data-col="${col}"]`);
  if (td && td.textContent !== text) td.textContent = text;
}

function when(ms) {
  return ms == null ? "" : new Date(ms).toISOString().replace("T", " ");
}

function rowOf(body, key, value) {
  for (const r of body.rows) if (r.dataset[key] === value) return r;
  return null;
}

function jobRow(body, job) {
  let row = rowOf(body, "job", job.job);
  if (row === null) {
    row = document.createElement("tr");
    row.dataset.job = job.job;
    for (const col of ["job", "kind", "leader", "token", "since", "lease", "cursor", "records"]) {
      const td = document.createElement("td");
      td.dataset.col = col;
      row.appendChild(td);
    }
    const link = document.createElement("a");
    link.href = "/console/job/" + encodeURIComponent(job.job);
    link.textContent = job.job;
    row.querySelector('td[data-col="job"]').appendChild(link);
    body.appendChild(row);
  }
  row.setAttribute("data-leader", job.leader);
  row.classList.toggle("leaderless", !job.leader);
  cell(row, "kind", job.kind);
  cell(row, "leader", job.leader || "(none)");
  cell(row, "token", String(job.token));
  cell(row, "since", when(job.leader_since_ms));
  cell(row, "lease", job.lease_ttl_ms_left == null ? "" : `${job.lease_ttl_ms_left} ms`);
  cell(row, "cursor", job.cursor);
  cell(row, "records", String(job.records));
}

function nodeRow(body, node) {
  let row = rowOf(body, "node", node.node);
  if (row === null) {
    row = document.createElement("tr");
    row.dataset.node = node.node;
    const name = document.createElement("td");
    name.textContent = node.node;
    row.appendChild(name);
    for (const col of ["live", "heartbeat", "leads", "hosts", "version"]) {
      const td = document.createElement("td");
      td.dataset.col = col;
      row.appendChild(td);
    }
    body.appendChild(row);
  }
  row.setAttribute("data-live", node.live ? "yes" : "no");
  cell(row, "live", node.live ? "live" : "down");
  cell(row, "heartbeat", node.heartbeat_ms_ago == null ? "" : `${node.heartbeat_ms_ago} ms ago`);
  cell(row, "leads", node.leads.join(", "));
  cell(row, "hosts", node.hosts.join(", "));
  cell(row, "version", node.version);
}

function apply(state) {
  const error = document.getElementById("error");
  if (error) {
    error.hidden = !state.error;
    error.textContent = state.error || "";
  }
  const jobs = document.querySelector("#jobs tbody");
  if (jobs) {
    const only = jobs.rows.length === 1 && document.getElementById("audit") ? jobs.rows[0].dataset.job : null;
    for (const job of state.jobs) if (only === null || job.job === only) jobRow(jobs, job);
  }
  const nodes = document.querySelector("#nodes tbody");
  if (nodes) {
    const live = new Set(state.nodes.map((n) => n.node));
    for (const node of state.nodes) nodeRow(nodes, node);
    for (const r of Array.from(nodes.rows)) if (!live.has(r.dataset.node)) r.remove();
  }
  document.body.dataset.updated = String(Date.now());
}

const source = new EventSource("/console/events");
source.addEventListener("state", (e) => {
  apply(JSON.parse(e.data));
  document.getElementById("live").textContent = " live";
});
source.onerror = () => {
  document.getElementById("live").textContent = " reconnecting";
};
