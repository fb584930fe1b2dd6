// The swelake console: each page is drawn from the JSON endpoints it names. Every text from the
// lake (titles, bodies, file contents, patches) enters the page through text nodes only: `el`
// never parses markup.
"use strict";

const main = () => document.getElementById("main");

function el(tag, attrs, ...children) {
  const n = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") n.className = v;
    else if (k.startsWith("on")) n.addEventListener(k.slice(2), v);
    else n.setAttribute(k, String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    n.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return n;
}

function show(...nodes) {
  main().replaceChildren(...nodes.flat(Infinity).filter((n) => n !== null && n !== undefined && n !== false));
}

// The token, when the server asks for one, is typed by the user and kept for this tab only.
function token() { return sessionStorage.getItem("swelake-token"); }

async function api(path, opts = {}) {
  const headers = Object.assign({}, opts.headers || {});
  if (token()) headers["Authorization"] = "Bearer " + token();
  const r = await fetch(path, Object.assign({}, opts, { headers }));
  if (r.status === 401) {
    const form = document.getElementById("token-form");
    form.hidden = false;
    throw new Error("this console needs its token");
  }
  return r;
}

async function apiJson(path, opts) {
  const r = await api(path, opts);
  const body = await r.json();
  if (!r.ok) throw new Error(body.error || r.statusText);
  return body;
}

function errorLine(e) {
  return el("div", { class: "error", id: "error" }, String(e.message || e));
}

const fmt = (n) => (n === null || n === undefined ? "-" : typeof n === "number" ? n.toLocaleString("en-US") : String(n));

function table(headers, rows, attrs) {
  return el("table", attrs || {},
    el("thead", {}, el("tr", {}, headers.map((h) => el("th", {}, h)))),
    el("tbody", {}, rows));
}

// ---- Status -------------------------------------------------------------------------------

let statusTimer = null;

async function pageStatus() {
  const draw = async () => {
    let s;
    try { s = await apiJson("/api/status"); } catch (e) { show(errorLine(e)); return; }
    document.getElementById("lake").textContent = s.lake;
    const jobs = s.jobs.map((j) => {
      const r = j.last_run;
      return el("tr", { "data-job": j.job },
        el("td", {}, j.job),
        el("td", {}, j.watermark || "-"),
        el("td", { class: "num" }, fmt(j.partitions_done)),
        el("td", { class: "num" }, j.partitions_pending === null ? "-" : fmt(j.partitions_pending.length)),
        el("td", {}, r ? r.finished_at : "never"),
        el("td", { class: r ? r.outcome : "" }, r ? r.outcome : ""),
        el("td", { class: "num" }, r ? r.seconds.toFixed(1) + " s" : ""),
        el("td", { class: "num" }, r ? fmt(r.rows_out) : ""),
        el("td", { class: "failed" }, r && r.error ? r.error : ""));
    });
    const tables = s.tables.map((t) => el("tr", { "data-table": t.table },
      el("td", {}, t.table),
      el("td", { class: "num" }, fmt(t.version)),
      el("td", { class: "num" }, fmt(t.files)),
      el("td", { class: "num" }, fmt(t.bytes)),
      el("td", { class: "num" }, fmt(t.small_files)),
      el("td", {}, t.last_optimize_ms ? new Date(t.last_optimize_ms).toISOString() : "never"),
      el("td", {}, t.last_checkpoint_version === null || t.last_checkpoint_version === undefined ? "-" : "v" + t.last_checkpoint_version)));
    const leases = s.leases.length
      ? table(["job", "key", "holder", "until"], s.leases.map((l) => el("tr", {},
          el("td", {}, l.job), el("td", {}, l.key), el("td", {}, l.holder),
          el("td", {}, new Date(l.expires_at).toISOString()))), { id: "leases" })
      : el("p", { class: "muted", id: "leases" }, "No lease is held.");
    const h = s.hours;
    const hours = h
      ? el("p", { id: "hours-summary" },
          `GH Archive hours ${h.first_hour} .. ${h.last_hour}: ${fmt(h.hours_ingested)} ingested, ${fmt(h.complete)} complete, ` +
          `${fmt(h.no_baseline)} without a baseline yet, ${fmt(h.flagged.length)} flagged (expected hours: ${h.expected.mode}, ${h.expected.reason}). `,
          el("a", { href: "/sources" }, "See them."))
      : el("p", { class: "muted", id: "hours-summary" }, "No GH Archive hour was ingested into this lake.");
    show(
      el("h1", {}, "Status"),
      el("p", { class: "muted" }, "Refreshes every 5 seconds. Also: GET /api/status (what swelake status --json prints)."),
      el("h2", {}, "Jobs"),
      table(["job", "watermark", "done", "pending", "last run", "outcome", "took", "rows", "error"], jobs, { id: "jobs" }),
      el("h2", {}, "Tables"),
      table(["table", "version", "files", "bytes", "small files", "last compaction", "checkpoint"], tables, { id: "tables" }),
      el("h2", {}, "Leases held"), leases,
      el("h2", {}, "Sources"), hours);
  };
  await draw();
  statusTimer = setInterval(draw, 5000);
}

// ---- Sources ------------------------------------------------------------------------------

const VERDICTS = {
  complete: "complete",
  low: "low: far below the same hour of earlier weeks",
  missing: "missing",
  no_baseline: "no baseline yet (too few earlier weeks)",
  not_expected: "not held, and the lake does not mean to hold it",
};

async function pageSources() {
  let v, g;
  try {
    [v, g] = await Promise.all([apiJson("/api/hours"), apiJson("/api/github")]);
  } catch (e) { show(errorLine(e)); return; }
  show(hoursSection(v), githubSection(g.repos));
}

function hoursSection(v) {
  if (!v.hours.length) {
    return [el("h1", {}, "Sources"), el("p", { class: "muted" }, "No GH Archive hour was ingested into this lake (its PRs come from git).")];
  }
  // Rows are days; a day shown has an hour of the range that is held or expected (the days
  // of a sample's long gaps are folded into one line).
  const byDay = new Map();
  for (const h of v.hours) {
    const i = h.hour.lastIndexOf("-");
    const day = h.hour.slice(0, i);
    if (!byDay.has(day)) byDay.set(day, new Array(24).fill(null));
    byDay.get(day)[Number(h.hour.slice(i + 1))] = h;
  }
  const counts = {};
  for (const h of v.hours) counts[h.verdict] = (counts[h.verdict] || 0) + 1;
  const grid = el("div", { class: "heat", id: "heatmap" }, el("div", {}, ""));
  for (let i = 0; i < 24; i++) grid.append(el("div", { class: "hourlabel" }, i % 6 === 0 ? String(i) : ""));
  let folded = 0;
  for (const [day, cells] of byDay) {
    if (cells.every((c) => c === null || c.verdict === "not_expected")) { folded++; continue; }
    grid.append(el("div", { class: "day" }, day));
    cells.forEach((c, i) => {
      if (c === null) { grid.append(el("div", { class: "cell v-outside", "data-verdict": "outside" })); return; }
      const counts = c.events === null ? "not ingested"
        : `${fmt(c.events)} events, ${fmt(c.rejected)} rejected, ${fmt(c.repos)} repos, ${fmt(c.pr_events)} PR events`;
      const base = c.baseline === null ? "" : `; baseline ${fmt(Math.round(c.baseline))}`;
      grid.append(el("div", {
        class: "cell v-" + c.verdict, "data-hour": c.hour, "data-verdict": c.verdict,
        title: `${c.hour} UTC: ${counts}${base} (${VERDICTS[c.verdict]})`,
      }));
    });
  }
  const legend = el("p", { class: "legend" }, Object.keys(VERDICTS).map((k) =>
    [el("span", { class: "sw v-" + k }), `${k.replace("_", " ")} ${fmt(counts[k] || 0)}`]));
  return [
    el("h1", {}, "Sources: GH Archive hours"),
    el("p", {}, `${v.first_hour} .. ${v.last_hour}, UTC. Each cell is an hour, as swelake status judges it; hover for its counts.`),
    el("p", { id: "expected" }, el("b", {}, "Expected hours: " + v.expected.mode), " — " + v.expected.reason +
      " ([completeness] expect in the curation config: auto, range, days, held or a list)."),
    legend,
    folded ? el("p", { class: "muted" }, `${fmt(folded)} days with no hour held or expected are not drawn.`) : null,
    grid,
  ];
}

// What `swelake ingest --github` read from GitHub's REST API, per repository.
function githubSection(repos) {
  const head = el("h2", {}, "GitHub REST API");
  if (!repos.length) {
    return [head, el("p", { class: "muted", id: "github-none" },
      "No repository was read through GitHub's API (swelake ingest --github --repos-file F fills in the text the archive lost).")];
  }
  const sum = (k) => repos.reduce((a, r) => a + (r[k] || 0), 0);
  // The quota is the token's, not the repository's: the one the newest read left (within a
  // second, the lower one: it only falls until the hour's reset).
  const later = (r, a) => r.last_run_at > a.last_run_at ||
    (r.last_run_at === a.last_run_at && r.quota_remaining < a.quota_remaining);
  const latest = repos.filter((r) => r.quota_remaining !== null)
    .reduce((a, r) => (a === null || later(r, a) ? r : a), null);
  const rows = repos.map((r) => el("tr", { "data-repo": r.repo_name },
    el("td", {}, r.current_name && r.current_name !== r.repo_name ? `${r.repo_name} (now ${r.current_name})` : r.repo_name),
    el("td", { class: "status-" + r.status, title: r.reason || null }, r.reason ? `${r.status}: ${r.reason}` : r.status),
    [r.calls_last_run, r.not_modified_last_run, r.prs_last_run, r.issues_last_run, r.comments_last_run, r.calls_total]
      .map((n) => el("td", { class: "num" }, fmt(n))),
    el("td", {}, r.watermark || "-"),
    el("td", { class: "num" }, fmt(r.quota_remaining)),
    el("td", {}, r.last_run_at)));
  return [
    head,
    el("p", { id: "github-summary" }, `${fmt(repos.length)} repositories; over all runs ${fmt(sum("calls_total"))} calls read ` +
      `${fmt(sum("prs_total"))} PRs, ${fmt(sum("issues_total"))} issues, ${fmt(sum("comments_total"))} comments ` +
      `and ${fmt(sum("reviews_total"))} reviews` +
      (latest ? `; quota left after the last call: ${fmt(latest.quota_remaining)}.` : ".") +
      " The counts per repository are its last run's; a 304 (list unchanged) costs no quota."),
    table(["repository", "status", "calls", "304s", "PRs", "issues", "comments", "calls in all", "watermark", "quota left", "last run"],
      rows, { id: "github-repos" }),
  ];
}

// ---- SQL ----------------------------------------------------------------------------------

const HISTORY = "swelake-sql-history";

function pastQueries() {
  try { return JSON.parse(localStorage.getItem(HISTORY) || "[]"); } catch (_) { return []; }
}

function remember(q) {
  const h = [q, ...pastQueries().filter((x) => x !== q)].slice(0, 50);
  localStorage.setItem(HISTORY, JSON.stringify(h));
}

async function pageSql() {
  const q = new URLSearchParams(location.search).get("q") || "";
  const editor = el("textarea", { id: "editor", rows: 8, spellcheck: "false" });
  editor.value = q || "SELECT repo_name, count(*) AS merged_prs\nFROM pull_requests\nWHERE merged\nGROUP BY repo_name\nORDER BY merged_prs DESC\nLIMIT 20";
  const limit = el("input", { id: "limit", type: "number", min: 1, value: 1000, style: "width:90px" });
  const out = el("div", { id: "result" });
  const hist = el("ol", { class: "history", id: "history" });
  const drawHistory = () => hist.replaceChildren(...pastQueries().map((h) =>
    el("li", { title: h, onclick: () => { editor.value = h; run(); } }, h.replace(/\s+/g, " "))));
  const run = async () => {
    const sql = editor.value;
    window.history.replaceState(null, "", "/sql?q=" + encodeURIComponent(sql));
    remember(sql);
    drawHistory();
    out.replaceChildren(el("p", { class: "muted" }, "Running…"));
    try {
      const r = await apiJson("/api/sql", { method: "POST", headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ sql, limit: Number(limit.value) || 1000 }) });
      const rows = r.rows.map((row) => el("tr", {}, row.map((v) =>
        el("td", { class: typeof v === "number" ? "num" : "" }, v === null ? "NULL" : typeof v === "object" ? JSON.stringify(v) : String(v)))));
      out.replaceChildren(
        el("p", { class: "muted", id: "result-summary" },
          `${fmt(r.rows.length)} rows in ${r.elapsed_ms} ms` + (r.truncated ? ` (cut to the first ${fmt(r.limit)}: raise the limit or add LIMIT)` : "")),
        el("table", { id: "result-table" },
          el("thead", {}, el("tr", {}, r.columns.map((c) => el("th", {}, c.name, el("span", { class: "type" }, c.type))))),
          el("tbody", {}, rows)));
    } catch (e) {
      out.replaceChildren(errorLine(e));
    }
  };
  const download = async (format) => {
    try {
      const r = await api("/api/sql", { method: "POST", headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ sql: editor.value, format, limit: Number(limit.value) || 1000 }) });
      if (!r.ok) throw new Error((await r.json()).error);
      const url = URL.createObjectURL(await r.blob());
      const a = el("a", { href: url, download: "query." + format });
      document.body.append(a); a.click(); a.remove();
      setTimeout(() => URL.revokeObjectURL(url), 10000);
    } catch (e) { out.replaceChildren(errorLine(e)); }
  };
  editor.addEventListener("keydown", (e) => { if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) { e.preventDefault(); run(); } });
  const side = el("div", { class: "side table-list", id: "table-list" }, el("p", { class: "muted" }, "Loading tables…"));
  show(
    el("h1", {}, "SQL"),
    el("div", { class: "cols" },
      side,
      el("div", { class: "body" },
        editor,
        el("div", { class: "toolbar" },
          el("button", { class: "primary", id: "run", onclick: run }, "Run (Ctrl-Enter)"),
          el("label", {}, "row limit ", limit),
          el("span", { class: "muted" }, "Download:"),
          ["csv", "json", "parquet"].map((f) => el("button", { onclick: () => download(f) }, f.toUpperCase())),
          el("span", { class: "muted" }, "Read-only; the address holds the query, so a link shares it.")),
        out,
        el("h3", {}, "History"), hist)));
  drawHistory();
  apiJson("/api/tables").then((t) => {
    side.replaceChildren(...t.tables.map((tb) => el("details", { "data-table": tb.name },
      el("summary", { title: tb.description || "" }, tb.name),
      tb.description ? el("div", { class: "muted col" }, tb.description) : null,
      tb.columns.map((c) => el("div", { class: "col", title: c.description || "" },
        c.name, " ", el("span", { class: "type" }, c.type),
        c.description ? el("div", { class: "muted" }, c.description) : null)))));
  }).catch((e) => side.replaceChildren(errorLine(e)));
  if (q) run();
}

// ---- Dataset ------------------------------------------------------------------------------

// The card's Markdown as nodes: headings, paragraphs, tables and its charts (no markup passes).
function markdown(md, charts) {
  const out = [];
  const lines = md.split("\n");
  for (let i = 0; i < lines.length; i++) {
    const l = lines[i];
    if (!l.trim()) continue;
    const h = /^(#{1,4})\s+(.*)$/.exec(l);
    if (h) { out.push(el("h" + Math.min(4, h[1].length + 1), {}, h[2])); continue; }
    const img = /^!\[([^\]]*)\]\(([^)]+)\)$/.exec(l.trim());
    if (img) { if (charts[img[2]]) out.push(el("img", { src: charts[img[2]], alt: img[1] })); continue; }
    if (l.trim().startsWith("|")) {
      const rows = [];
      while (i < lines.length && lines[i].trim().startsWith("|")) { rows.push(lines[i].trim()); i++; }
      i--;
      const cells = (r) => r.replace(/^\||\|$/g, "").split("|").map((c) => c.trim().replace(/`/g, ""));
      const body = rows.slice(2).map((r) => el("tr", {}, cells(r).map((c) => el("td", {}, c))));
      out.push(table(cells(rows[0]), body));
      continue;
    }
    out.push(el("p", {}, l.replace(/`/g, "").replace(/\*\*/g, "")));
  }
  return out;
}

async function pageDataset() {
  const cardBox = el("div", { class: "card", id: "card" }, el("p", { class: "muted" }, "Building the card…"));
  const list = el("div", { id: "instances" });
  const params = new URLSearchParams(location.search);
  const sel = (id, label) => el("label", {}, label + " ", el("select", { id }, el("option", { value: "" }, "any")));
  const filters = el("div", { class: "toolbar", id: "filters" },
    sel("f-repo", "repository"), sel("f-language", "language"), sel("f-split", "split"),
    el("label", {}, "prompt tokens ", el("input", { id: "f-min", type: "number", placeholder: "min", style: "width:80px" }),
      " – ", el("input", { id: "f-max", type: "number", placeholder: "max", style: "width:80px" })),
    el("button", { class: "primary", onclick: () => load(true) }, "Filter"));
  const ids = { repo: "f-repo", language: "f-language", split: "f-split", min_tokens: "f-min", max_tokens: "f-max" };
  const load = async (fromForm) => {
    const q = new URLSearchParams();
    for (const [k, id] of Object.entries(ids)) {
      const v = fromForm ? document.getElementById(id).value : params.get(k) || "";
      if (v) q.set(k, v);
    }
    if (fromForm) window.history.replaceState(null, "", "/dataset?" + q.toString());
    try {
      const r = await apiJson("/api/instances?" + q.toString());
      for (const [k, id] of [["repos", "f-repo"], ["languages", "f-language"], ["splits", "f-split"]]) {
        const s = document.getElementById(id);
        const cur = q.get({ "f-repo": "repo", "f-language": "language", "f-split": "split" }[id]) || "";
        s.replaceChildren(el("option", { value: "" }, "any"), ...r.facets[k].map((v) => el("option", { value: v, selected: v === cur }, v)));
      }
      document.getElementById("f-min").value = q.get("min_tokens") || "";
      document.getElementById("f-max").value = q.get("max_tokens") || "";
      list.replaceChildren(
        el("p", { class: "muted" }, `${fmt(r.total)} instances` + (r.total > r.instances.length ? `, the first ${r.instances.length} shown` : "")),
        table(["instance", "repository", "PR", "split", "language", "prompt tokens", "changed files", "problem"],
          r.instances.map((x) => el("tr", {},
            el("td", {}, el("a", { href: "/instances/" + encodeURIComponent(x.instance_id) }, x.instance_id)),
            el("td", {}, x.repo_name), el("td", { class: "num" }, x.pr_number), el("td", {}, x.split),
            el("td", {}, x.language || ""), el("td", { class: "num" }, fmt(x.prompt_tokens)),
            el("td", { class: "num" }, fmt(x.changed_files)), el("td", {}, x.problem_start))),
          { id: "instance-list" }));
    } catch (e) { list.replaceChildren(errorLine(e)); }
  };
  show(el("h1", {}, "Dataset"), el("h2", {}, "Instances"), filters, list, el("h2", {}, "Card"), cardBox);
  load(false);
  try {
    const c = await apiJson("/api/card");
    cardBox.replaceChildren(...markdown(c.markdown, c.charts));
  } catch (e) { cardBox.replaceChildren(errorLine(e)); }
}

function diffNode(patch, id) {
  const pre = el("pre", { class: "diff", id });
  for (const line of patch.split("\n")) {
    const cls = line.startsWith("diff --git") || line.startsWith("+++") || line.startsWith("---") ? "file"
      : line.startsWith("@@") ? "hunk" : line.startsWith("+") ? "add" : line.startsWith("-") ? "del" : "";
    pre.append(el("span", { class: cls }, line + "\n"));
  }
  return pre;
}

async function pageInstance(id) {
  let x;
  try { x = await apiJson("/api/instances/" + encodeURIComponent(id)); } catch (e) { show(el("h1", {}, id), errorLine(e)); return; }
  const info = x.extra_info || {};
  const files = Object.keys(x.context || {}).sort();
  const changed = new Set(info.changed_files || []);
  const fileNodes = files.map((p) => {
    const shown = (x.prompt_context || {})[p];
    const whole = x.context[p];
    // prompt_context says "whole", or holds the segments the prompt shows.
    const segments = shown !== undefined && shown !== "whole" && shown !== whole;
    return el("details", { "data-path": p },
      el("summary", {}, p, " ", el("span", { class: "tag" }, changed.has(p) ? "changed" : "relevant"),
        el("span", { class: "tag" }, segments ? "segments in the prompt" : "whole in the prompt")),
      segments ? [el("h4", {}, "As the prompt shows it"), el("pre", {}, shown), el("h4", {}, "The whole file")] : null,
      el("pre", {}, whole));
  });
  const answer = el("textarea", { id: "answer", rows: 10, spellcheck: "false", placeholder: "<think>…</think>\n<solution>\n```python\n### path/to/file.py\n<<<<<<< SEARCH\n…\n=======\n…\n>>>>>>> REPLACE\n```\n</solution>" });
  const scoreOut = el("div", { id: "score-result" });
  const score = async () => {
    try {
      const d = await apiJson("/api/instances/" + encodeURIComponent(id) + "/score", { method: "POST",
        headers: { "Content-Type": "application/json" }, body: JSON.stringify({ answer: answer.value }) });
      scoreOut.replaceChildren(
        el("p", { class: "score", id: "score" }, "reward " + d.reward.toFixed(6)),
        d.error ? el("p", { class: "failed" }, "format error: " + d.error) : null,
        d.similarities.map((s) => el("div", {},
          el("h4", {}, `${s.path}: similarity ${s.similarity.toFixed(6)}`),
          el("div", { class: "cols" },
            el("div", { class: "body" }, el("div", { class: "muted" }, "predicted change"), diffNode(s.pred_change || "(none)")),
            el("div", { class: "body" }, el("div", { class: "muted" }, "oracle change"), diffNode(s.oracle_change || "(none)"))))));
    } catch (e) { scoreOut.replaceChildren(errorLine(e)); }
  };
  show(
    el("p", {}, el("a", { href: "/dataset" }, "← Dataset")),
    el("h1", { id: "instance-id" }, x.instance_id),
    el("p", {}, el("span", { class: "tag" }, x.repo_name), el("span", { class: "tag" }, "PR #" + info.pr_number),
      el("span", { class: "tag" }, x.split), el("span", { class: "tag" }, info.language || "?"),
      el("span", { class: "tag" }, fmt(info.prompt_tokens) + " prompt tokens"),
      el("span", { class: "tag" }, "oracle reward " + info.oracle_reward),
      el("span", { class: "tag" }, "problem from " + x.problem_source)),
    el("h2", {}, "Problem statement"), el("pre", { id: "problem" }, x.problem_statement),
    el("h2", {}, "Oracle patch"), diffNode(x.oracle_patch || "", "oracle-patch"),
    el("h2", {}, "Files shown"), el("div", { id: "files" }, fileNodes),
    el("h2", {}, "Relevant files, as ranked"),
    (x.relevant || []).length
      ? table(["rank", "path", "score", "model"], x.relevant.map((r) => el("tr", {},
          el("td", { class: "num" }, r.rank), el("td", {}, r.path), el("td", { class: "num" }, Number(r.score).toFixed(4)), el("td", {}, r.model))), { id: "relevant" })
      : el("p", { class: "muted", id: "relevant" }, "No relevant file was ranked for this PR."),
    el("h2", {}, "Prompt, as the model sees it"),
    (x.prompt || []).map((m) => el("div", {}, el("h4", {}, m.role), el("pre", { class: "prompt" }, m.content))),
    el("h2", {}, "Score an answer"),
    el("p", { class: "muted" }, "Paste a model's whole output (thought and answer): the reward is swelake's, bit for bit the reference's."),
    answer, el("div", { class: "toolbar" }, el("button", { class: "primary", id: "score-button", onclick: score }, "Score")),
    scoreOut);
}

// ---- Routing ------------------------------------------------------------------------------

async function route() {
  if (statusTimer) { clearInterval(statusTimer); statusTimer = null; }
  const path = location.pathname;
  const page = path.startsWith("/instances/") ? "dataset" : path.slice(1) || "status";
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.dataset.page === page);
  if (path.startsWith("/instances/")) return pageInstance(decodeURIComponent(path.slice("/instances/".length)));
  switch (page) {
    case "sources": return pageSources();
    case "sql": return pageSql();
    case "dataset": return pageDataset();
    default: return pageStatus();
  }
}

document.addEventListener("DOMContentLoaded", () => {
  document.getElementById("token-form").addEventListener("submit", (e) => {
    e.preventDefault();
    sessionStorage.setItem("swelake-token", document.getElementById("token").value);
    document.getElementById("token-form").hidden = true;
    route();
  });
  route();
});
