// The approvers' page. Everything an agent or an upstream sent arrives escaped and flagged by
// the server (a Shown: { text, flags }) and goes on screen as textContent, never as HTML. The
// page decides nothing: the server computes each decision's challenge from the waiting call, and
// the person's passkey signs it.
import { FLAG_LABELS } from "/shown.js";
import { diffRowNode } from "/preview.js";

const $ = (id) => document.getElementById(id);
const SHORT_LABELS = { bidi: "direction-changing", invisible: "invisible", non_ascii: "non-ASCII" };
const REFRESH_MS = 2000;

let calls = [];
// The server's mark of when the page first had each call (by id and plan): the approve delay runs
// from then, not from the latest refresh.
const firstSeen = new Map();
let selected = null;
let approveDelay = 1000;
let enabledAt = Infinity;
let busy = false;

// --- bytes and WebAuthn's JSON -------------------------------------------------------------

function fromB64url(text) {
  const b64 = text.replace(/-/g, "+").replace(/_/g, "/");
  const raw = atob(b64 + "===".slice((b64.length + 3) % 4));
  return Uint8Array.from(raw, (c) => c.charCodeAt(0)).buffer;
}

function toB64url(buffer) {
  let raw = "";
  for (const b of new Uint8Array(buffer)) raw += String.fromCharCode(b);
  return btoa(raw).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}

/** The server's creation options, with the bytes WebAuthn wants as bytes. */
function creationOptions(options) {
  const key = structuredClone(options.publicKey);
  key.challenge = fromB64url(key.challenge);
  key.user.id = fromB64url(key.user.id);
  key.excludeCredentials = (key.excludeCredentials || []).map((c) => ({ ...c, id: fromB64url(c.id) }));
  return { publicKey: key };
}

/** The server's request options, the same way. */
function requestOptions(options) {
  const key = structuredClone(options.publicKey);
  key.challenge = fromB64url(key.challenge);
  key.allowCredentials = (key.allowCredentials || []).map((c) => ({ ...c, id: fromB64url(c.id) }));
  return { publicKey: key };
}

function credentialJSON(cred) {
  const r = cred.response;
  const response = { clientDataJSON: toB64url(r.clientDataJSON) };
  if (r.attestationObject) {
    response.attestationObject = toB64url(r.attestationObject);
    if (r.getTransports) response.transports = r.getTransports();
  } else {
    response.authenticatorData = toB64url(r.authenticatorData);
    response.signature = toB64url(r.signature);
    if (r.userHandle) response.userHandle = toB64url(r.userHandle);
  }
  return { id: cred.id, rawId: toB64url(cred.rawId), type: cred.type, response, extensions: {} };
}

// --- the server ----------------------------------------------------------------------------

class Refused extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

async function call(method, path, body) {
  const init = { method, credentials: "same-origin", headers: {} };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  const answer = await response.json().catch(() => ({}));
  if (!response.ok) throw new Refused(response.status, answer.error || "error", answer.message || response.statusText);
  return answer;
}

function say(text, code) {
  const m = $("message");
  m.hidden = !text;
  m.textContent = text || "";
  if (code) m.dataset.code = code;
  else delete m.dataset.code;
}

function fail(e) {
  if (e instanceof Refused) say(e.message, e.code);
  else say(String(e && e.message ? e.message : e), "browser");
}

// --- showing a call ------------------------------------------------------------------------

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

function shown(id, value, long = false) {
  $(id).textContent = value.text;
  $(id + "-flags").replaceChildren(...flagChips(value.flags, long));
}

function isShown(v) {
  return v && typeof v === "object" && typeof v.text === "string" && Array.isArray(v.flags);
}

/** A preview (the engine's, every string a Shown) as nested text. */
function previewNode(value) {
  if (isShown(value)) {
    const span = document.createElement("span");
    span.textContent = value.text;
    span.append(...flagChips(value.flags, false));
    return span;
  }
  if (Array.isArray(value)) {
    const list = document.createElement("ul");
    for (const item of value) {
      const li = document.createElement("li");
      li.append(previewNode(item));
      list.append(li);
    }
    return list;
  }
  if (value && typeof value === "object") {
    const dl = document.createElement("dl");
    for (const [k, v] of Object.entries(value)) {
      const dt = document.createElement("dt");
      dt.textContent = k;
      const dd = document.createElement("dd");
      dd.append(previewNode(v));
      dl.append(dt, dd);
    }
    return dl;
  }
  const span = document.createElement("span");
  span.textContent = value === null || value === undefined ? "" : String(value);
  return span;
}

function listItem(c) {
  const li = document.createElement("li");
  const button = document.createElement("button");
  button.type = "button";
  button.dataset.id = c.id;
  if (selected && selected.id === c.id) button.className = "selected";
  const tool = document.createElement("strong");
  tool.textContent = c.tool.text;
  const target = document.createElement("div");
  const chars = [...c.targetShown.text];
  target.textContent = chars.length > 80 ? chars.slice(0, 80).join("") + "…" : c.targetShown.text;
  button.append(tool, target, ...flagChips([...new Set([...c.tool.flags, ...c.targetShown.flags])], false));
  button.addEventListener("click", () => select(c.id));
  li.append(button);
  return li;
}

function renderList() {
  $("calls").replaceChildren(...calls.map(listItem));
  $("empty").hidden = calls.length > 0;
  if (selected && !calls.some((c) => c.id === selected.id)) {
    selected = null;
    $("call").hidden = true;
  }
}

function select(id) {
  const c = calls.find((x) => x.id === id);
  if (!c) return;
  const changed = !selected || selected.id !== id || selected.planHash !== c.planHash;
  selected = c;
  $("call").hidden = false;
  $("call").dataset.id = c.id;
  const rev = $("reversibility");
  // A change of the server's rules: what it does (the solver's verdict, or that it is not known)
  // and old beside new, in place of a call's token and preview.
  const change = Boolean(c.change);
  rev.textContent = change ? "A change of the rules" : c.reversible ? "Reversible" : "Irreversible";
  rev.className = "badge " + (c.reversible ? "reversible" : "irreversible");
  $("c-change").hidden = !change;
  if (change) {
    shown("c-analysis", c.change.analysis, true);
    $("c-rows").replaceChildren(...c.change.rows.map((row) => diffRowNode(row)));
  } else {
    $("c-rows").replaceChildren();
  }
  shown("c-target", c.targetShown, true);
  shown("c-tool", c.tool);
  shown("c-action", c.action);
  shown("c-summary", c.summary);
  shown("c-agent", c.agent);
  shown("c-tenant", c.tenant);
  shown("c-server", c.server);
  shown("c-why", c.why);
  shown("c-details", c.details);
  const ttl = Math.round(c.tokenTtlMs / 1000);
  $("c-use").textContent = change
    ? "Applied once approved: in force on every replica within seconds"
    : (c.worksOnce ? "Works once" : "Works until it expires") + `, for ${ttl} s after approval`;
  $("c-approvals").textContent = `${c.approvedBy.length} of ${c.needed}` +
    (c.approvedBy.length ? ": " + c.approvedBy.map((s) => s.text).join(", ") : "");
  $("c-preview").replaceChildren(c.preview ? previewNode(c.preview) : document.createTextNode("none"));
  $("c-hash").textContent = c.planHash;
  $("typed").hidden = !c.typeTarget;
  if (changed) {
    $("typed-input").value = "";
    $("note").value = "";
    $("outcome").textContent = "";
    delete $("outcome").dataset.outcome;
    enabledAt = Date.now() + approveDelay;
  }
  for (const b of document.querySelectorAll("#calls button")) {
    b.className = Number(b.dataset.id) === id ? "selected" : "";
  }
  refreshApprove();
}

function refreshApprove() {
  const c = selected;
  const typedOk = !c || !c.typeTarget || $("typed-input").value === c.target;
  $("approve").disabled = busy || !c || c.approvedByMe || Date.now() < enabledAt || !typedOk;
  $("deny").disabled = busy || !c;
}

// --- the flows -----------------------------------------------------------------------------

async function refresh() {
  try {
    const answer = await call("GET", "/api/v1/requests");
    approveDelay = answer.approveDelayMs;
    calls = answer.calls;
    for (const c of calls) {
      const key = `${c.id}:${c.planHash}`;
      if (firstSeen.has(key)) c.seen = firstSeen.get(key);
      else firstSeen.set(key, c.seen);
    }
    $("signin").hidden = true;
    $("desk").hidden = false;
    $("who").hidden = false;
    $("who-name").textContent = answer.approver;
    renderList();
    if (selected) select(selected.id);
    else {
      const wanted = location.pathname.match(/^\/call\/(\d+)$/);
      if (wanted) select(Number(wanted[1]));
    }
    return true;
  } catch (e) {
    if (e instanceof Refused && (e.status === 401 || e.status === 403)) {
      $("desk").hidden = true;
      $("who").hidden = true;
      $("signin").hidden = false;
      if (e.status === 403) fail(e);
      return false;
    }
    fail(e);
    return true;
  }
}

async function signin() {
  say("");
  try {
    const begun = await call("POST", "/api/v1/signin/begin", {});
    const cred = await navigator.credentials.get(requestOptions(begun.options));
    await call("POST", "/api/v1/signin/finish", { credential: credentialJSON(cred) });
    await refresh();
  } catch (e) {
    fail(e);
  }
}

async function enroll(invite) {
  say("");
  try {
    const begun = await call("POST", "/api/v1/enroll/begin", { invite });
    const cred = await navigator.credentials.create(creationOptions(begun.options));
    const done = await call("POST", "/api/v1/enroll/finish", { invite, credential: credentialJSON(cred) });
    history.replaceState(null, "", "/");
    $("enroll").hidden = true;
    say("");
    $("signin").hidden = false;
    $("outcome").textContent = "";
    const note = document.createElement("p");
    note.id = "enrolled";
    note.textContent = `A passkey is enrolled for ${done.enrolled}. Sign in with it.`;
    $("signin").prepend(note);
  } catch (e) {
    fail(e);
  }
}

async function decide(verdict) {
  const c = selected;
  if (!c) return;
  say("");
  busy = true;
  delete $("outcome").dataset.outcome;
  refreshApprove();
  const typed = c.typeTarget ? $("typed-input").value : undefined;
  const note = verdict === "deny" ? $("note").value : undefined;
  try {
    const begun = await call("POST", "/api/v1/decide/begin", { request: c.id, verdict, typed });
    const cred = await navigator.credentials.get(requestOptions(begun.options));
    const done = await call("POST", "/api/v1/decide/finish", {
      request: c.id, verdict, typed, note, seen: c.seen,
      expiresAtMs: begun.expiresAtMs, credential: credentialJSON(cred),
    });
    $("outcome").textContent = done.outcome === "recorded"
      ? `Approved by you: ${done.approvals} of ${done.needed} approvals.`
      : done.outcome === "denied" ? "Denied." : "Approved.";
    $("outcome").dataset.outcome = done.outcome;
  } catch (e) {
    fail(e);
  } finally {
    busy = false;
    await refresh();
  }
}

function start() {
  $("signin-go").addEventListener("click", signin);
  $("signout").addEventListener("click", async () => {
    await call("POST", "/api/v1/signout", {}).catch(() => {});
    await refresh();
  });
  $("approve").addEventListener("click", () => decide("approve"));
  $("deny").addEventListener("click", () => decide("deny"));
  $("typed-input").addEventListener("input", refreshApprove);
  setInterval(refreshApprove, 100);
  // While signed in, the list follows the server's.
  setInterval(() => { if (!$("desk").hidden && !busy) refresh(); }, REFRESH_MS);
  if (location.pathname === "/invite" && location.hash.length > 1) {
    const invite = location.hash.slice(1);
    $("enroll").hidden = false;
    $("enroll-name").textContent = "this link's approver";
    $("enroll-go").addEventListener("click", () => enroll(invite));
    return;
  }
  refresh();
}

start();
