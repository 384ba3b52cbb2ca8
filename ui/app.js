// The window. Everything an agent or an upstream sent arrives escaped and flagged by the desk (a
// Shown: { text, flags }) and is put on screen with textContent, never as HTML.
import * as api from "./api.js";
import * as clients from "./clients.js";
import * as grants from "./grants.js";
import * as servers from "./servers.js";
import { FLAG_LABELS, shownNode } from "./shown.js";
import { diffRowNode, previewNodes } from "./preview.js";

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

const SHORT_LABELS = { bidi: "direction-changing", invisible: "invisible", non_ascii: "non-ASCII" };

/** One chip per flag of a Shown: the whole sentence for the target, a word elsewhere (the
 *  sentence then in its tooltip). */
function flagChips(flags, long) {
  return flags.map((f) => {
    const chip = document.createElement("span");
    chip.className = long ? "flag" : "flag short";
    chip.dataset.flag = f;
    chip.textContent = "⚠ " + ((long ? FLAG_LABELS : SHORT_LABELS)[f] || f);
    chip.title = FLAG_LABELS[f] || f;
    return chip;
  });
}

/** A Shown into element `id`, its flags into `id`-flags. */
function shown(id, value, long = false) {
  text(id, value.text);
  $(id + "-flags").replaceChildren(...flagChips(value.flags, long));
}

/** The first `n` characters (code points, so an escape's surrogate pair is never split). */
function head(s, n) {
  const chars = [...s];
  return chars.length > n ? chars.slice(0, n).join("") + "…" : s;
}

/** Approve stays disabled for the delay after a request is shown, after the window regains
 *  focus, and after what is shown changes; and for as long as the engine says when it refuses
 *  an approval as too soon (`atLeast`, in ms). */
function holdApprove(atLeast = 0) {
  enabledAt = Date.now() + Math.max(approveDelay, atLeast);
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
  grants.refresh();
}

function renderQueue() {
  const list = $("queue");
  list.replaceChildren();
  for (const r of requests) {
    const li = document.createElement("li");
    li.tabIndex = 0;
    // Which request the entry is (a decimal string): tests tell two requests of the same plan apart.
    li.dataset.id = String(r.id);
    li.className = (selected && selected.id === r.id ? "selected " : "") + (r.change ? "change" : r.reversible ? "" : "irreversible");
    li.addEventListener("click", () => select(r.id));
    list.append(li);
    if (r.change) {
      const what = document.createElement("strong");
      what.textContent = `Change: ${r.change.kind}`;
      const subject = shownNode("span", { text: head(r.change.subject.text, 40), flags: r.change.subject.flags });
      li.append(what, subject, shownNode("small", r.change.origin));
      continue;
    }
    const tool = shownNode("strong", r.tool);
    const target = shownNode("span", { text: head(r.target_shown.text, 40), flags: r.target_shown.flags });
    const who = document.createElement("small");
    who.append(shownNode("span", r.agent), " · ", shownNode("span", r.server));
    if (typeof r.stopped_waiting_at_ms === "number") who.append(" · the agent stopped waiting");
    li.append(tool, target, who);
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

/** The moment each request first stands on screen (the page visible, its detail shown), as a
 *  performance mark `countersign:shown:<id>` on the page's own clock: what the desk's bench reads
 *  for a window the desk has just started, which no watcher can be inside before it exists. */
const markedShown = new Set();
function markShown() {
  if (document.visibilityState !== "visible" || !selected || $("detail").hidden) return;
  if (markedShown.has(selected.id)) return;
  markedShown.add(selected.id);
  performance.mark(`countersign:shown:${selected.id}`);
}

function renderDetail(changed) {
  renderDetailOnly(changed);
  markShown();
}

function renderDetailOnly(changed) {
  $("empty").hidden = !!selected;
  $("detail").hidden = !selected;
  if (!selected) {
    $("typed-target").value = "";
    $("deny-note").value = "";
    grants.select(null);
    return;
  }
  const r = selected;
  $("change").hidden = !r.change;
  $("call").hidden = !!r.change;
  $("reversibility").hidden = !!r.change;
  if (r.change) {
    $("d-unknown").hidden = true;
    $("d-stopped").hidden = true;
  }
  text("deny-note-label", r.change ? "Note for whoever proposed it (optional, sent with Deny):" : "Note for the agent (optional, sent with Deny):");
  if (r.change) renderChange(r.change);
  else renderCall(r);
  $("typed").hidden = !r.type_target;
  if (changed) {
    // Another request (or the same one changed): read from its top.
    $("fields").scrollTop = 0;
    $("typed-target").value = "";
    $("deny-note").value = "";
    text("error", "");
    grants.select(r);
    holdApprove();
  } else {
    refreshApprove();
  }
}

const CHANGE_KINDS = { server: "A registered server", policy: "The policy", tool: "A tool's definition" };

/** A change to the desk: what, who proposed it, and old beside new with the differing lines
 *  marked (the rows come from the desk, each line already escaped and flagged). */
function renderChange(c) {
  $("detail").className = "";
  text("c-kind", CHANGE_KINDS[c.kind] || c.kind);
  shown("c-subject", c.subject);
  shown("c-summary", c.summary);
  shown("c-origin", c.origin);
  // What a change of the rules widens, as the solver decided it (or that it is not known).
  const analysed = Boolean(c.analysis);
  $("c-analysis-head").hidden = !analysed;
  $("c-analysis-row").hidden = !analysed;
  shown("c-analysis", analysed ? c.analysis : { text: "", flags: [] });
  text("c-before-head", c.added ? "Now: nothing (new)" : "Now");
  text("c-after-head", c.removed ? "After approval: removed" : "After approval");
  const rows = c.rows.map((row) => diffRowNode(row, ["sign before-sign", "sign after-sign"]));
  $("c-rows").replaceChildren(...rows);
}

function renderCall(r) {
  const badge = $("reversibility");
  badge.textContent = r.reversible ? "Reversible" : "IRREVERSIBLE: this cannot be undone";
  badge.className = "badge " + (r.reversible ? "reversible" : "irreversible");
  $("detail").className = r.reversible ? "" : "irreversible";
  // The same call was run before and never answered: it may have run already.
  const unknown = typeof r.last_unknown_at_ms === "number";
  $("d-unknown").hidden = !unknown;
  text("d-unknown", unknown
    ? `The last identical call, at ${new Date(r.last_unknown_at_ms).toLocaleString()}, was handed to its server and never answered: whether it ran is not known. Check before approving it again.`
    : "");
  // The agent stopped waiting (its cancel, or its client's own timeout): the request stays for a
  // while, and an approval is collected when the agent asks the same call again.
  const stopped = typeof r.stopped_waiting_at_ms === "number";
  $("d-stopped").hidden = !stopped;
  text("d-stopped", stopped
    ? `The agent stopped waiting for this call; it will collect the approval if it asks again. The request leaves the queue at ${new Date(r.leaves_at_ms).toLocaleTimeString()}.`
    : "");
  shown("d-agent", r.agent);
  shown("d-server", r.server);
  shown("d-tool", r.tool);
  shown("d-target", r.target_shown, true);
  const chars = [...r.target_shown.text];
  const long = chars.length > LONG_TARGET;
  if (long) text("d-target", `${chars.slice(0, 80).join("")} … ${chars.slice(-60).join("")}`);
  $("d-target-whole").hidden = !long;
  shown("d-action", r.action);
  shown("d-summary", r.summary);
  const minutes = Math.round(r.token_ttl_ms / 60000);
  text("d-use", (r.works_once ? "Works once" : "Works until it expires") + ` · the token would expire ${minutes} minute${minutes === 1 ? "" : "s"} after approval`);
  shown("d-why", r.why);
  $("d-preview").replaceChildren(...previewNodes(r.preview));
  shown("d-details", r.details);
  text("d-hash", r.plan_hash);
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
    // The engine keeps its own delay (from the window's focus and the request's arrival): wait
    // as long as it says, then Approve works again.
    if (e && e.code === "too_soon") holdApprove(e.wait_ms || 0);
    else showError(e);
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

/** What a request asks, for telling whether it changed: whether its agent still waits is not part
 *  of it (the agent stopping and coming back does not hold Approve again). */
function asked(r) {
  return r ? JSON.stringify({ ...r, stopped_waiting_at_ms: null, leaves_at_ms: null }) : null;
}

function onQueue(list) {
  const before = asked(selected);
  requests = list;
  const still = selected && requests.find((r) => r.id === selected.id);
  selected = still || requests[0] || null;
  const changed = !selected || asked(selected) !== before;
  renderQueue();
  renderDetail(changed);
  if (!$("view-history").hidden) loadHistory();
  if (!$("view-grants").hidden) grants.loadGrants();
}

/** A countersign://request/<id> URL was opened: show that request if it still waits, else say
 *  it does not. Selecting it holds Approve for the delay, as any newly shown request does. */
async function onFocusWanted() {
  const id = await api.takeFocus();
  if (typeof id !== "string") return;
  tab("queue");
  const wanted = requests.find((r) => String(r.id) === id);
  $("focus-note").hidden = !!wanted;
  text("focus-note", wanted ? "" : `Request ${id} is no longer waiting.`);
  if (!wanted) return;
  select(wanted.id);
  const shown = $("queue").querySelector("li.selected");
  if (shown) shown.scrollIntoView({ block: "nearest" });
}

async function loadExportStatus() {
  const line = $("export-status");
  const view = await api.exportStatus().catch(() => null);
  if (!view) {
    line.hidden = true;
    return;
  }
  let said = view.waiting === 0
    ? `Every event was sent to the OpenTelemetry collector at ${view.endpoint}.`
    : `${view.waiting} events wait for the OpenTelemetry collector at ${view.endpoint}.`;
  if (view.failing_since_ms !== null) {
    said += ` It cannot be reached since ${new Date(view.failing_since_ms).toLocaleString()}: ${view.last_error || "no answer"}. Nothing is lost: they are sent when it answers.`;
  }
  line.textContent = said;
  line.hidden = false;
}

async function saveHistory(format) {
  text("saved", "");
  try {
    const saved = await api.saveHistory(format);
    text("saved", `Saved ${saved.events} events to ${saved.path}`);
  } catch (e) {
    text("saved", e.message || String(e));
  }
}

async function loadHistory() {
  loadExportStatus();
  const rows = await api.history({ server: $("f-server").value, tool: $("f-tool").value, kind: $("f-kind").value });
  const body = $("history");
  body.replaceChildren();
  for (const row of rows) {
    const tr = document.createElement("tr");
    tr.className = "event-" + row.kind;
    const code = row.refusal || (row.kind === "executed" ? (row.ok ? "ok" : "failed") : row.kind === "outcome_unknown" ? "may have run" : "");
    const plain = (s) => ({ text: s, flags: [] });
    const cells = [plain(new Date(row.at_ms).toLocaleString()), plain(row.kind), plain(code), row.server, row.tool, row.target, row.note, plain(row.nonce || "")];
    for (const cell of cells) tr.append(shownNode("td", cell));
    body.append(tr);
  }
}

async function loadSettings() {
  const view = await api.settings();
  $("s-minutes").value = view.settings.token_minutes;
  $("s-delay").value = view.settings.approve_delay_ms;
  $("s-otlp").value = view.settings.otlp_endpoint || "";
  $("s-policy").value = view.policy;
}

async function saveSettings() {
  text("s-error", "");
  try {
    const view = await api.saveSettings({
      settings: {
        token_minutes: Number($("s-minutes").value),
        approve_delay_ms: Number($("s-delay").value),
        otlp_endpoint: $("s-otlp").value.trim(),
      },
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
  for (const t of ["queue", "history", "grants", "settings"]) {
    $("view-" + t).hidden = t !== name;
    $("tab-" + t).classList.toggle("active", t === name);
  }
  if (name === "history") loadHistory();
  if (name === "grants") grants.loadGrants();
  if (name === "settings") loadSettings();
  if (name === "queue") holdApprove();
}

/** The banner says why nothing can be approved, for as long as that is so. */
function showSecretProblem(problem) {
  const banner = $("banner");
  banner.hidden = !problem;
  banner.textContent = problem ? "Nothing can be approved: " + problem : "";
}

async function start() {
  $("approve").addEventListener("click", onApprove);
  $("deny").addEventListener("click", onDeny);
  $("typed-target").addEventListener("input", refreshApprove);
  $("d-target-whole").addEventListener("click", () => {
    text("d-target", selected.target_shown.text);
    $("d-target-whole").hidden = true;
  });
  // Enter and Space never approve: not on the focused button (which a browser would click on
  // keydown or keyup), not from a field. Only a pointer's click does.
  const activates = (e) => e.key === "Enter" || e.key === " " || e.key === "Spacebar" || e.code === "Space";
  for (const type of ["keydown", "keypress", "keyup"]) {
    document.addEventListener(type, (e) => {
      const onApproveButton = (e.target === $("approve") || e.target === $("approve-widen")) && activates(e);
      const enterInField = e.key === "Enter" && e.target.tagName === "INPUT";
      if (onApproveButton || enterInField) {
        e.preventDefault();
        e.stopPropagation();
      }
    }, true);
  }
  window.addEventListener("focus", holdApprove);
  document.addEventListener("visibilitychange", () => { if (!document.hidden) { holdApprove(); markShown(); } });
  $("tab-queue").addEventListener("click", () => tab("queue"));
  $("tab-history").addEventListener("click", () => tab("history"));
  $("tab-grants").addEventListener("click", () => tab("grants"));
  grants.start({
    selected: () => selected,
    typed: () => (selected && selected.type_target ? $("typed-target").value : null),
    canApprove: () => !!selected && !selected.change && Date.now() >= enabledAt && typedOk(),
    onTooSoon: (ms) => holdApprove(ms),
    showError,
  });
  $("tab-settings").addEventListener("click", () => tab("settings"));
  for (const id of ["f-server", "f-tool", "f-kind"]) $(id).addEventListener("input", loadHistory);
  $("save-jsonl").addEventListener("click", () => saveHistory("jsonl"));
  $("save-csv").addEventListener("click", () => saveHistory("csv"));
  $("s-save").addEventListener("click", saveSettings);
  servers.start({ onClients: clients.loadClients });
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
  showSecretProblem(s.secret_problem);
  await api.onSecret(showSecretProblem);
  await api.onHeld(() => holdApprove());
  // The queue comes whole in every event. The first read races the first event: a request that
  // arrives while `pending` is in flight is in the event, and perhaps not in the answer, which
  // may come second. So the answer counts only if no event came meanwhile (each change is
  // followed by an event, so nothing is lost by dropping it).
  let events = 0;
  await api.onQueue((list) => { events += 1; onQueue(list); });
  const seen = events;
  const first = await api.pending();
  if (events === seen) onQueue(first);
  await api.onFocus(onFocusWanted);
  // The note about a request no longer waiting goes once the person picks one from the queue.
  $("queue").addEventListener("click", () => { $("focus-note").hidden = true; });
  await onFocusWanted();
}

start();
