// The window. Everything an agent sent is put on screen with textContent, never as HTML.
import * as api from "./api.js";

const $ = (id) => document.getElementById(id);
const LONG_TARGET = 160;

let requests = [];
let selected = null;
let approveDelay = 1000;
let enabledAt = Infinity;
let timer = null;

function text(id, value) {
  $(id).textContent = value;
}

/** Approve stays disabled for the delay after a request is shown, after the window regains
 *  focus, and after what is shown changes. */
function holdApprove() {
  enabledAt = Date.now() + approveDelay;
  $("approve").disabled = true;
  clearInterval(timer);
  timer = setInterval(refreshApprove, 100);
  refreshApprove();
}

function typedOk() {
  return !selected || !selected.type_target || $("typed-target").value === selected.target;
}

function refreshApprove() {
  const left = enabledAt - Date.now();
  const ready = left <= 0;
  $("approve").disabled = !ready || !typedOk() || !selected;
  text("wait", ready ? (typedOk() ? "" : "Type the target to enable Approve.") : `Approve in ${Math.ceil(left / 1000)} s`);
  if (ready) clearInterval(timer);
}

function renderQueue() {
  const list = $("queue");
  list.replaceChildren();
  for (const r of requests) {
    const li = document.createElement("li");
    li.tabIndex = 0;
    li.className = (selected && selected.id === r.id ? "selected " : "") + (r.reversible ? "" : "irreversible");
    const tool = document.createElement("strong");
    tool.textContent = r.tool;
    const target = document.createElement("span");
    target.textContent = r.target_shown.length > 40 ? r.target_shown.slice(0, 40) + "…" : r.target_shown;
    const who = document.createElement("small");
    who.textContent = `${r.agent} · ${r.server}`;
    li.append(tool, target, who);
    li.addEventListener("click", () => select(r.id));
    list.append(li);
  }
  text("count", requests.length ? `(${requests.length})` : "");
  // The desk sets the native title too; this keeps the page's own title in step.
  document.title = requests.length ? `Countersign (${requests.length} pending)` : "Countersign";
}

function select(id) {
  const next = requests.find((r) => r.id === id) || requests[0] || null;
  const changed = !selected || !next || selected.id !== next.id;
  selected = next;
  renderQueue();
  renderDetail(changed);
}

function renderDetail(changed) {
  $("empty").hidden = !!selected;
  $("detail").hidden = !selected;
  if (!selected) return;
  const r = selected;
  const badge = $("reversibility");
  badge.textContent = r.reversible ? "Reversible" : "IRREVERSIBLE: this cannot be undone";
  badge.className = "badge " + (r.reversible ? "reversible" : "irreversible");
  $("detail").className = r.reversible ? "" : "irreversible";
  text("d-agent", r.agent);
  text("d-server", r.server);
  text("d-tool", r.tool);
  const long = r.target_shown.length > LONG_TARGET;
  text("d-target", long ? `${r.target_shown.slice(0, 80)} … ${r.target_shown.slice(-60)}` : r.target_shown);
  $("d-target-whole").hidden = !long;
  const flags = $("d-flags");
  flags.replaceChildren();
  const labels = { bidi: "contains direction-changing characters (shown escaped)", invisible: "contains invisible characters (shown escaped)", non_ascii: "contains non-ASCII characters that may look like others" };
  for (const f of r.target_flags) {
    const chip = document.createElement("span");
    chip.className = "flag";
    chip.dataset.flag = f;
    chip.textContent = "⚠ " + (labels[f] || f);
    flags.append(chip);
  }
  text("d-action", r.action);
  text("d-summary", r.summary);
  const minutes = Math.round(r.token_ttl_ms / 60000);
  text("d-use", (r.works_once ? "Works once" : "Works until it expires") + ` · the token would expire ${minutes} minute${minutes === 1 ? "" : "s"} after approval`);
  text("d-details", r.details || "(none)");
  text("d-hash", r.plan_hash);
  $("typed").hidden = !r.type_target;
  if (changed) {
    $("typed-target").value = "";
    $("deny-note").value = "";
    text("error", "");
    holdApprove();
  } else {
    refreshApprove();
  }
}

function showError(e) {
  text("error", e && e.message ? e.message : String(e));
}

async function onApprove() {
  if (!selected || Date.now() < enabledAt || !typedOk()) return;
  const id = selected.id;
  try {
    await api.approve(id, selected.type_target ? $("typed-target").value : null);
  } catch (e) {
    showError(e);
  }
}

async function onDeny() {
  if (!selected) return;
  try {
    await api.deny(selected.id, $("deny-note").value.trim());
  } catch (e) {
    showError(e);
  }
}

function onQueue(list) {
  const before = selected ? JSON.stringify(selected) : null;
  requests = list;
  const still = selected && requests.find((r) => r.id === selected.id);
  selected = still || requests[0] || null;
  const changed = !selected || JSON.stringify(selected) !== before;
  renderQueue();
  renderDetail(changed);
  if (!$("view-history").hidden) loadHistory();
}

async function loadHistory() {
  const rows = await api.history({ server: $("f-server").value, tool: $("f-tool").value, kind: $("f-kind").value });
  const body = $("history");
  body.replaceChildren();
  for (const row of rows) {
    const tr = document.createElement("tr");
    tr.className = "event-" + row.kind;
    const code = row.refusal || (row.kind === "executed" ? (row.ok ? "ok" : "failed") : "");
    for (const cell of [new Date(row.at_ms).toLocaleString(), row.kind, code, row.server || "", row.tool, row.target || "", row.nonce || ""]) {
      const td = document.createElement("td");
      td.textContent = cell;
      tr.append(td);
    }
    body.append(tr);
  }
}

async function loadSettings() {
  const view = await api.settings();
  $("s-minutes").value = view.settings.token_minutes;
  $("s-delay").value = view.settings.approve_delay_ms;
  $("s-policy").value = view.policy;
}

async function saveSettings() {
  text("s-error", "");
  try {
    const view = await api.saveSettings({
      settings: { token_minutes: Number($("s-minutes").value), approve_delay_ms: Number($("s-delay").value) },
      policy: $("s-policy").value,
    });
    approveDelay = view.settings.approve_delay_ms;
    $("s-delay").value = approveDelay;
    text("s-saved", "Saved.");
  } catch (e) {
    text("s-error", e.message || String(e));
  }
}

function tab(name) {
  for (const t of ["queue", "history", "settings"]) {
    $("view-" + t).hidden = t !== name;
    $("tab-" + t).classList.toggle("active", t === name);
  }
  if (name === "history") loadHistory();
  if (name === "settings") loadSettings();
  if (name === "queue") holdApprove();
}

async function start() {
  $("approve").addEventListener("click", onApprove);
  $("deny").addEventListener("click", onDeny);
  $("typed-target").addEventListener("input", refreshApprove);
  $("d-target-whole").addEventListener("click", () => {
    text("d-target", selected.target_shown);
    $("d-target-whole").hidden = true;
  });
  // Enter never approves: not on the button, not in a field.
  document.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && (e.target === $("approve") || e.target.tagName === "INPUT")) e.preventDefault();
  }, true);
  window.addEventListener("focus", holdApprove);
  document.addEventListener("visibilitychange", () => { if (!document.hidden) holdApprove(); });
  $("tab-queue").addEventListener("click", () => tab("queue"));
  $("tab-history").addEventListener("click", () => tab("history"));
  $("tab-settings").addEventListener("click", () => tab("settings"));
  for (const id of ["f-server", "f-tool", "f-kind"]) $(id).addEventListener("input", loadHistory);
  $("s-save").addEventListener("click", saveSettings);
  $("s-rotate").addEventListener("click", () => { $("s-rotate-now").hidden = false; });
  $("s-rotate-now").addEventListener("click", async () => {
    try {
      await api.rotateSecret();
      $("s-rotate-now").hidden = true;
      text("s-error", "Rotated. Outstanding tokens no longer work.");
    } catch (e) {
      text("s-error", e.message || String(e));
    }
  });
  const s = await api.status();
  approveDelay = Math.max(1000, s.approve_delay_ms);
  if (s.secret_problem) {
    const banner = $("banner");
    banner.hidden = false;
    banner.textContent = "Nothing can be approved: " + s.secret_problem;
  }
  await api.onQueue(onQueue);
  onQueue(await api.pending());
}

start();
